#!/usr/bin/env bash
# CI entry: queue and session placement over pollux-tgt's poll groups on real
# verbs. Builds pollux-perf and pollux-tgt --release --features ibverbs and
# boots the lab with three vCPUs (the target's two busy-polling reactors and
# the host's must not share one) for tests/vm/placement-guest.sh: NVMe-oF
# queues spread over two target cores (and kept on the listener's core when
# pinned), then two iSER sessions spread over them, every run with --verify.
#   tests/vm/run-placement.sh [lab options, e.g. --keep -v]
# Guest logs land in target/placement/.
# Exit: 0 all passed, 1 a check failed, 124/125 lab timeout/failure.
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 125
LAB=tests/vm/lab
"$LAB" --setup-only -q || exit $?
out=target/placement
rm -rf "$out" && mkdir -p "$out" || exit 125
tests/vm/build-bins.sh "$out" pollux-perf pollux-tgt || exit 1
t0=$SECONDS
"$LAB" -c 3 -t 420 --out "$out" "$@" run tests/vm/placement-guest.sh "$PWD/$out/pollux-perf" "$PWD/$out/pollux-tgt"
rc=$?
echo "placement: exit $rc after $((SECONDS - t0)) s (boot included)" >&2
exit $rc
