#!/usr/bin/env bash
# Two commits side by side: builds each in its own worktree (under
# ${AB_DIR:-/var/tmp/pollux-ab}) and runs the same main-job command in
# both, alternately, ROUNDS times, printing one line per run. Used for
# before/after figures of one change (docs/benchmarks.md says which).
#
#   bash scripts/ab-commits.sh c21ba4c HEAD -- TRANSPORT=tcp BS=65536 SECS_SINGLE=3
#   ROUNDS=1 bash scripts/ab-commits.sh c21ba4c HEAD -- TRANSPORT=tcp CALLGRIND=tgt BS=4096
#
# The words after `--` are environment settings for
# `bash scripts/main-job.sh --single`; each line shows the commit, the
# IOPS, the host's busy % and the target's busy % (or the callgrind line).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 3 ] && [ "$3" = "--" ] || {
    echo "usage: ab-commits.sh REV_A REV_B -- VAR=VALUE..." >&2
    exit 2
}
A=$(git rev-parse --short "$1")
B=$(git rev-parse --short "$2")
shift 3
ROUNDS=${ROUNDS:-4}
DIR=${AB_DIR:-/var/tmp/pollux-ab}
mkdir -p "$DIR"
for rev in "$A" "$B"; do
    if [ ! -d "$DIR/$rev" ]; then
        git worktree add --detach "$DIR/$rev" "$rev" >/dev/null
    fi
    (cd "$DIR/$rev" && cargo build --release --bin pollux-tgt --bin pollux-perf >&2)
done
for round in $(seq 1 "$ROUNDS"); do
    for rev in "$A" "$B"; do
        out=$(cd "$DIR/$rev" && env "$@" bash scripts/main-job.sh --single 2>&1) || true
        line=$(grep -m1 '^callgrind' <<<"$out" | sed 's/.*Ir, //' || true)
        if [ -z "$line" ]; then
            line=$(grep -m1 '"iops"' <<<"$out" | python3 -c '
import json, sys
j = json.loads(sys.stdin.read())
host = j["cores"][0]["busy_pct"]
tgt = j.get("target_busy_pct") or 0
print("%.0f IOPS, host %.0f%%, target %.0f%%" % (j["iops"], host, tgt))' ||
                echo "run failed")
        fi
        echo "round $round $rev: $line"
    done
done
