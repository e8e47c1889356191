#!/usr/bin/env bash
# CI entry: NVMe-oF/RDMA interop of pollux-tgt (ibverbs provider on soft-RoCE)
# with the Linux kernel host (nvme-cli, nvme_rdma, fio) in one lab boot.
#   tests/vm/run-nvmf-interop.sh [lab options, e.g. --keep -v]
# Builds pollux-tgt --release --features ibverbs here, then runs
# tests/vm/nvmf-guest.sh in the guest (see that script for the checks).
# Guest logs (target logs, stats) land in target/nvmf-interop/.
# Exit: 0 all passed, 1 a check failed, 124/125 lab timeout/failure.
# Prerequisites: tests/vm/lab --setup-only (root, once per machine).
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 125
LAB=tests/vm/lab
"$LAB" --setup-only -q || exit $?
out=target/nvmf-interop
rm -rf "$out" && mkdir -p "$out" || exit 125
tests/vm/build-bins.sh "$out" pollux-tgt || exit 1
t0=$SECONDS
"$LAB" -t 1500 --out "$out" "$@" run tests/vm/nvmf-guest.sh "$PWD/$out/pollux-tgt"
rc=$?
echo "nvmf-interop: exit $rc after $((SECONDS - t0)) s (boot included)" >&2
exit $rc
