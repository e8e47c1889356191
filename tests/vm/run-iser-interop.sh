#!/usr/bin/env bash
# CI entry: iSER interop in one lab boot (tests/vm/lab, soft-RoCE):
#   a. Linux open-iscsi (ib_iser, iface transport iser) -> pollux-tgt
#      (ibverbs provider): SendTargets discovery, login, fio crc32c verify
#      at 512 B / 4 / 16 / 64 KiB on a plain LUN and on a PI LUN (target
#      generates/strips PI through the bdev layer), logout;
#   b. pollux-perf (our initiator, ibverbs) -> LIO isert (targetcli,
#      ramdisk): write + read back --verify;
#   c. T10-PI over iSER: kernel initiator/LIO on rxe -> SKIP with the
#      reason (no signature offload, evidence from dmesg/sysfs); our
#      initiator's software PI (--pi both) against pollux-tgt's PI LUN;
#   d. sg3-utils SCSI conformance (sg_inq, sg_write_same,
#      sg_compare_and_write, sg_verify, sg_persist, sg_opcodes,
#      sg_get_lba_status) through open-iscsi over iSER against pollux-tgt,
#      and against LIO as the reference in the same boot.
#   tests/vm/run-iser-interop.sh [lab options, e.g. --keep -v]
# Guest logs (target logs, dmesg) land in target/iser-interop/.
# Exit: 0 all passed, 1 a check failed, 124/125 lab timeout/failure.
# Prerequisites: tests/vm/lab --setup-only (root, once per machine).
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 125
LAB=tests/vm/lab
"$LAB" --setup-only -q || exit $?
out=target/iser-interop
rm -rf "$out" && mkdir -p "$out" || exit 125
tests/vm/build-bins.sh "$out" pollux-tgt pollux-perf || exit 1
t0=$SECONDS
"$LAB" -t 1500 --out "$out" "$@" run tests/vm/iser-guest.sh "$PWD/$out/pollux-tgt" "$PWD/$out/pollux-perf"
rc=$?
echo "iser-interop: exit $rc after $((SECONDS - t0)) s (boot included)" >&2
exit $rc
