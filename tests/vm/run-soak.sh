#!/usr/bin/env bash
# Connection churn with real verbs. Builds pollux-perf and
# pollux-tgt --release --features ibverbs and boots the lab with two vCPUs
# for tests/vm/soak-guest.sh: a small count of hosts that connect, verify
# and go (cleanly, SIGKILLed, keep-alives stopped, refused) while the
# target's descriptors and mappings must not grow.
#   tests/vm/run-soak.sh [lab options, e.g. --keep -v]
# POLLUX_SOAK_VM_CYCLES sets the count (default 24). Guest logs land in
# target/soak-vm/.
# Exit: 0 all passed, 1 a check failed, 124/125 lab timeout/failure.
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 125
LAB=tests/vm/lab
"$LAB" --setup-only -q || exit $?
out=target/soak-vm
rm -rf "$out" && mkdir -p "$out" || exit 125
tests/vm/build-bins.sh "$out" pollux-perf pollux-tgt || exit 1
t0=$SECONDS
"$LAB" -c 2 -t 900 --out "$out" "$@" run tests/vm/soak-guest.sh "$PWD/$out/pollux-perf" "$PWD/$out/pollux-tgt"
rc=$?
echo "soak: exit $rc after $((SECONDS - t0)) s (boot included)" >&2
exit $rc
