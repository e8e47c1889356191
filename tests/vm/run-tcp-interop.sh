#!/usr/bin/env bash
# CI entry: NVMe/TCP interop of pollux-tgt with the Linux kernel host
# (nvme-cli + nvme_tcp, fio) and of pollux-perf with the kernel target
# (nvmet-tcp), in one lab boot.
#   tests/vm/run-tcp-interop.sh [lab options, e.g. --keep -v]
# Builds pollux-tgt and pollux-perf --release here (tests/vm/build-bins.sh),
# then runs tests/vm/tcp-guest.sh in the guest (see that script for the
# checks). Guest logs (target logs, dmesg) land in target/tcp-interop/.
# Exit: 0 all passed, 1 a check failed, 124/125 lab timeout/failure.
# Prerequisites: tests/vm/lab --setup-only (root, once per machine).
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 125
LAB=tests/vm/lab
"$LAB" --setup-only -q || exit $?
out=target/tcp-interop
rm -rf "$out" && mkdir -p "$out" || exit 125
tests/vm/build-bins.sh "$out" pollux-tgt pollux-perf || exit 1
t0=$SECONDS
"$LAB" -t 1200 --out "$out" "$@" run tests/vm/tcp-guest.sh "$PWD/$out/pollux-tgt" "$PWD/$out/pollux-perf"
rc=$?
echo "tcp-interop: exit $rc after $((SECONDS - t0)) s (boot included)" >&2
exit $rc
