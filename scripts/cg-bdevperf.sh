#!/usr/bin/env bash
# Instructions per I/O of pollux-bdevperf's generic and in-place paths,
# counted by callgrind (deterministic: independent of the machine's load,
# unlike IOPS, which mean nothing under valgrind).
#
#   bash scripts/cg-bdevperf.sh                       # null 4 KiB randread, QD 128
#   BDEV=malloc:size=1G,block=4096 W=randwrite bash scripts/cg-bdevperf.sh
#   BS=512 BDEV=null:size=1G,block=512 bash scripts/cg-bdevperf.sh
#
# Each path runs twice under callgrind, for T1 and T2 seconds (defaults 1
# and 3); the reactor thread's instructions and the completed I/Os of the
# two runs are subtracted, so set-up, calibration and teardown cancel and
# what is left is the steady state: the loop, the bdev layer, the backend,
# the job's callback and its two clock reads per I/O. valgrind runs with
# --fair-sched=yes: otherwise the spinning reactor thread can keep the main
# thread from ending the run, and its idle loops (a varying number) do not
# cancel out.
set -euo pipefail
cd "$(dirname "$0")/.."
BDEV=${BDEV:-null:size=1G,block=4096}
BS=${BS:-4096}
W=${W:-randread}
QD=${QD:-128}
T1=${T1:-1}
T2=${T2:-3}
OUT=${CG_OUT:-/tmp/pollux-cg-bdevperf}
BIN=${BIN:-target/release/pollux-bdevperf}
if [ -z "${NO_BUILD:-}" ]; then
    cargo build --release -q -p pollux-apps --bin pollux-bdevperf
fi
command -v valgrind >/dev/null || { echo "cg-bdevperf: valgrind not found" >&2; exit 2; }
mkdir -p "$OUT"

# The busiest thread's total Ir in the dumps of one run.
thread_ir() {
    python3 - "$@" <<'PY'
import sys
best = 0
for f in sys.argv[1:]:
    for line in open(f, errors="replace"):
        if line.startswith(("summary:", "totals:")):
            best = max(best, int(line.split()[1]))
print(best)
PY
}

run_one() { # path seconds -> "Ir ios"
    local path=$1 secs=$2 flag=()
    [ "$path" = in-place ] && flag=(--in-place)
    rm -f "$OUT/cg.$path.$secs".*
    local json
    json=$(valgrind --tool=callgrind --fair-sched=yes --separate-threads=yes --dump-instr=no \
        --callgrind-out-file="$OUT/cg.$path.$secs.%p" \
        "$BIN" --bdev "$BDEV" -q "$QD" -o "$BS" -w "$W" -t "$secs" --cores 0 \
        --json "${flag[@]}" 2>/dev/null)
    local ios
    ios=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["ios"])' "$json")
    echo "$(thread_ir "$OUT/cg.$path.$secs".*) $ios"
}

declare -A PER
for path in generic in-place; do
    read -r ir1 io1 < <(run_one "$path" "$T1")
    read -r ir2 io2 < <(run_one "$path" "$T2")
    per=$(python3 -c "import sys; a,b,c,d=map(int,sys.argv[1:]); print(f'{(b-a)/(d-c):.0f}')" \
        "$ir1" "$ir2" "$io1" "$io2")
    PER[$path]=$per
    echo "cg-bdevperf $BDEV -o $BS -w $W -q $QD, $path: $per instructions per I/O" \
        "($((ir2 - ir1)) Ir over $((io2 - io1)) I/Os)"
done
python3 -c "import sys; g,i=map(int,sys.argv[1:]); print(f'cg-bdevperf: generic / in-place = {g/i:.3f}')" \
    "${PER[generic]}" "${PER[in-place]}"
echo "profiles: $OUT (callgrind_annotate $OUT/cg.generic.$T2.<pid>-<thread>)"
