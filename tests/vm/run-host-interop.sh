#!/usr/bin/env bash
# CI entry: NVMe-oF/RDMA interop of pollux-perf (our host, ibverbs provider on
# soft-RoCE) with the Linux kernel target (nvmet-rdma via configfs: null_blk
# and a tmpfs file holding known data) and with our own pollux-tgt, in one
# lab boot.
#   tests/vm/run-host-interop.sh [lab options, e.g. --keep -v]
# Builds pollux-perf and pollux-tgt --release --features ibverbs here, writes
# the known-data image (32 MiB of pollux-perf's generation-0 verify pattern),
# then runs tests/vm/host-guest.sh in the guest (see it for the checks).
# Guest logs land in target/host-interop/.
# Exit: 0 all passed, 1 a check failed, 124/125 lab timeout/failure.
# Prerequisites: tests/vm/lab --setup-only (root, once per machine).
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 125
LAB=tests/vm/lab
"$LAB" --setup-only -q || exit $?
out=target/host-interop
rm -rf "$out" && mkdir -p "$out" || exit 125
tests/vm/build-bins.sh "$out" pollux-perf pollux-tgt || exit 1
# Every 8-byte little-endian word holds its byte offset XOR
# 0xA5A5_0000_0000_5A5A (pollux_apps::workload::known_pattern).
tests/vm/make-pattern.sh "$out/pattern.img" || { echo "pattern image failed" >&2; exit 125; }
t0=$SECONDS
"$LAB" -t 420 --out "$out" "$@" run tests/vm/host-guest.sh \
  "$PWD/$out/pollux-perf" "$PWD/$out/pollux-tgt" "$PWD/$out/pattern.img"
rc=$?
echo "host-interop: exit $rc after $((SECONDS - t0)) s (boot included)" >&2
exit $rc
