#!/usr/bin/env bash
# The iSER T10-PI table of docs/benchmarks.md: pollux-tgt on core 0 with a
# null LU formatted 512+8 with PI Type 1 (LUN 0) and a plain null LU
# (LUN 1), served over the software RDMA provider; pollux-perf on core 1
# sweeps block sizes 512 B .. 64 KiB with PI off, insert (PI on the wire
# only: the initiator's integrity MR generates it on writes and checks and
# strips it on reads) and dix (PI in host memory too: the job generates
# the tuples before each write and verifies them after each read, as the
# block layer does with write_generate=1 read_verify=1), random read and
# random write, QD 128.
#
#   bash scripts/bench-iser-pi.sh            # 2 s cells, tables on stdout
#   SECS=5 JSON=1 bash scripts/bench-iser-pi.sh
#
# Run it on a quiet machine (cores 0 and 1).
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${SECS:-2}
QD=${QD:-128}
JSON=${JSON:-}
cargo build --release -q -p pollux-apps --bin pollux-perf --bin pollux-tgt

source scripts/lib-tgt.sh
WORK=$TGT_WORK
NAME="@pollux-bench-iser-$$"

cat >"$WORK/tgt.toml" <<TOML
cores = "0"
provider = "soft"
[[bdev]]
spec = "null:name=NullPi0,size=1G,block=512,md=8,md_interleave=true,pi=1"
[[bdev]]
spec = "null:name=Null0,size=1G,block=512"
[[iscsi.portal_group]]
tag = 1
listen = ["$NAME"]
[[iscsi.target]]
name = "iqn.2016-06.io.pollux:disk0"
luns = [{ lun = 0, bdev = "NullPi0" }, { lun = 1, bdev = "Null0" }]
[iscsi.options]
queue_depth = $QD
max_io_bytes = "128k"
TOML
tgt_start "$WORK/tgt.toml"

R="trtype:iser traddr:$NAME target:iqn.2016-06.io.pollux:disk0"
for w in randread randwrite; do
    echo "## $w"
    target/release/pollux-perf -r "$R lun:0" --sweep --sweep-pi off,insert,dix \
        -q "$QD" -w "$w" -t "$SECS" --cores 1 ${JSON:+--json}
    echo "plain LU:"
    target/release/pollux-perf -r "$R lun:1" --sweep --sweep-pi off \
        -q "$QD" -w "$w" -t "$SECS" --cores 1 ${JSON:+--json}
done
