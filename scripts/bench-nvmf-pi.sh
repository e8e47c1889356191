#!/usr/bin/env bash
# The NVMe-oF T10-PI table of docs/benchmarks.md: pollux-tgt on core 0 over
# the software RDMA provider with two subsystems, a null namespace
# formatted 512+8 with PI Type 1 and a plain null 512 one; pollux-perf on
# core 1, QD 128, random read and random write, block sizes 512 B .. 64 KiB,
# with PI off (PRACT: the target generates, checks and strips; the wire
# and the host see data only), insert (the host generates the tuples on
# writes and checks and strips them on reads; the target checks them too)
# and dix (the host's memory holds the tuples after the data: the job
# generates them before writes and verifies them after reads, as the block
# layer does; the host interleaves and separates them, checking them, and
# the target checks them). insert and dix run twice: through the soft
# provider's signature offload (an integrity MR per I/O, the default) and
# with --pi-engine software (a wire buffer per I/O slot).
#
#   bash scripts/bench-nvmf-pi.sh            # 2 s cells, markdown on stdout
#   SECS=5 SIZES="512 4096" bash scripts/bench-nvmf-pi.sh
#
# Run it on a quiet machine (cores 0 and 1).
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${SECS:-2}
QD=${QD:-128}
SIZES=${SIZES:-512 1024 2048 4096 8192 16384 32768 65536}
cargo build --release -q -p pollux-apps --bin pollux-perf --bin pollux-tgt

source scripts/lib-tgt.sh
WORK=$TGT_WORK
NAME="@pollux-bench-nvmf-pi-$$"

cat >"$WORK/tgt.toml" <<TOML
cores = "0"
provider = "soft"
[transport]
max_queue_depth = $QD
max_io_size = "128k"
io_unit_size = "32k"
in_capsule_data_size = 4096
num_shared_buffers = 1024
[[bdev]]
spec = "null:name=NullPi0,size=1G,block=512,md=8,md_interleave=true,pi=1"
[[bdev]]
spec = "null:name=Null0,size=1G,block=512"
[[subsystem]]
nqn = "nqn.2016-06.io.pollux:pi0"
allow_any_host = true
namespaces = [{ bdev = "NullPi0", nsid = 1 }]
[[subsystem]]
nqn = "nqn.2016-06.io.pollux:plain0"
allow_any_host = true
namespaces = [{ bdev = "Null0", nsid = 1 }]
[[listener]]
traddr = "$NAME"
TOML
tgt_start "$WORK/tgt.toml"

: >"$WORK/cells.jsonl"
for w in randread randwrite; do
    for bs in $SIZES; do
        for col in plain off insert dix insert-sw dix-sw; do
            engine=auto
            case $col in
                plain) sub=plain0 pi=off ;;
                *-sw) sub=pi0 pi=${col%-sw} engine=software ;;
                *) sub=pi0 pi=$col ;;
            esac
            out=$(target/release/pollux-perf -r "trtype:soft traddr:$NAME subnqn:nqn.2016-06.io.pollux:$sub" \
                --pi "$pi" --pi-engine "$engine" -q "$QD" -o "$bs" -w "$w" -t "$SECS" --cores 1 --json \
                2>>"$WORK/perf.err" | grep '^{' | tail -1) || true
            echo "bench-nvmf-pi: $w $bs $col: ${out:0:80}" >&2
            python3 - "$w" "$bs" "$col" "$out" >>"$WORK/cells.jsonl" <<'PY'
import json, sys
w, bs, col, line = sys.argv[1:]
try:
    v = json.loads(line)
    cell = {"iops": v["iops"], "cpu": v["cores"][0]["busy_pct"], "errors": v.get("errors", 0)}
except Exception:
    cell = None
print(json.dumps({"w": w, "bs": int(bs), "col": col, "cell": cell}))
PY
        done
    done
done
python3 - "$WORK/cells.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
cols = ["plain", "off", "insert", "dix"]
def si(x):
    return f"{x/1e6:.2f} M" if x >= 1e6 else (f"{x/1e3:.0f} k" if x >= 1e4 else f"{x/1e3:.1f} k")
def label(bs):
    return f"{bs // 1024} KiB" if bs >= 1024 else f"{bs} B"
for w in ("randread", "randwrite"):
    print(f"\n{w}, IOPS / host CPU % (cost = IOPS(off) / IOPS(mode) on the PI namespace):\n")
    print("| bs | plain namespace | PI `off` (PRACT) | PI `insert` | PI `dix` | `insert`, software | `dix`, software | cost `insert` | cost `dix` |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    by = {}
    for r in rows:
        if r["w"] == w:
            by.setdefault(r["bs"], {})[r["col"]] = r["cell"]
    for bs in sorted(by):
        c = by[bs]
        def cell(k):
            v = c.get(k)
            if not v:
                return "failed"
            bad = " (errors)" if v["errors"] else ""
            return f"{si(v['iops'])} / {v['cpu']:.0f} %{bad}"
        def cost(k):
            a, b = c.get("off"), c.get(k)
            return f"{a['iops'] / b['iops']:.2f}" if a and b and b["iops"] else "-"
        print(f"| {label(bs)} | {cell('plain')} | {cell('off')} | {cell('insert')} | {cell('dix')} "
              f"| {cell('insert-sw')} | {cell('dix-sw')} | {cost('insert')} | {cost('dix')} |")
PY
