#!/usr/bin/env bash
# Every interop check that needs real verbs, run in the soft-RoCE VM lab
# (tests/vm/lab) in one boot: tests/vm/all-guest.sh runs them one after
# another (verbs conformance, NVMe-oF/RDMA, NVMe/TCP, host, iSER, placement,
# soak). Called by scripts/test.sh; needs root to install the lab's packages
# the first time. Each check also has its own run-*.sh that boots for it
# alone. Output: target/vm/NAME/ per check.
#   tests/vm/run-all.sh [lab options, e.g. --keep -v]
# LAB_USER_VM_CHECKS="nvmf tcp" runs only those (names in all-guest.sh).
# Exit: 0 all passed, 1 a check failed, 124/125 lab timeout/failure.
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 125
LAB=tests/vm/lab
"$LAB" --setup-only || exit $?
out=target/vm
rm -rf "$out" && mkdir -p "$out/bin" || exit 125
mapfile -t verbs < <(tests/vm/build-verbs-tests.sh) && [ ${#verbs[@]} -gt 0 ] || exit 1
tests/vm/build-bins.sh "$out/bin" pollux-tgt pollux-perf || exit 1
tests/vm/make-pattern.sh "$out/bin/pattern.img" || { echo "pattern image failed" >&2; exit 125; }
t0=$SECONDS
# Each check has its own limit in all-guest.sh (6,420 s together); the
# lab's is their sum and a little more. The run as a whole took ~39 min
# under TCG on this machine kind (2026-12-07).
"$LAB" -c 3 -t 6600 --out "$out" "$@" run tests/vm/all-guest.sh "$PWD/$out/bin" "${verbs[@]}"
rc=$?
echo "vm: exit $rc after $((SECONDS - t0)) s (boot included)" >&2
exit $rc
