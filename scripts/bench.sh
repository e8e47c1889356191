#!/usr/bin/env bash
# The whole table of docs/benchmarks.md in one run, side by side with the
# SPDK peer where it is built (../shared/peers/spdk/): each figure is the
# median of ROUNDS runs, the rounds interleaved (Pollux then SPDK for each
# cell, cell after cell) so that both see the same machine.
#
#   bash scripts/bench.sh               # 3 rounds of 5 s runs
#   ROUNDS=1 SECS=2 bash scripts/bench.sh
#   ONLY=bdev bash scripts/bench.sh     # bdev | copy | nvmf | tcp
#   ONLY="bdev copy" bash scripts/bench.sh   # several areas, in the table's order
#
# Run it on a quiet machine (nothing else on the cores it uses: 0 and 1).
# It prints a markdown table on stdout (progress on stderr); the raw JSON
# lines are kept in $BENCH_OUT (default /tmp/pollux-bench).
#
# Cells:
# - bdev: pollux-bdevperf null 4 KiB and 512 B randread, QD 128, core 0,
#   through the generic path (the default: a fresh request and a callback
#   per I/O, TSC timestamps at submit and completion, as SPDK's bdevperf)
#   and through the in-place path (--in-place); malloc 4 KiB randwrite.
#   Peer: SPDK bdevperf (run.sh bdevperf-null-4k, -512, -malloc-4k-randwrite).
# - copy: the streaming-copy reference of malloc randwrite
#   (apps/examples/memcpy.rs).
# - nvmf: NVMe-oF randread QD 128, target core 0, host core 1, null bdev,
#   soft provider, pool memory mode, 512 B and 4 KiB
#   (scripts/main-job.sh --single). Peer: SPDK nvmf_tgt + spdk_nvme_perf
#   over TCP (tcp-512, tcp-4k) and over vfio-user (vfiouser-512, -4k).
# - tcp: the same job over NVMe/TCP on 127.0.0.1 (TRANSPORT=tcp
#   scripts/main-job.sh --single), 512 B and 4 KiB. Peer: SPDK nvmf_tgt +
#   spdk_nvme_perf over TCP with uring sockets (tcp-512, tcp-4k): the same
#   work on both sides.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
SECS=${SECS:-5}
ONLY=${ONLY:-}
OUT=${BENCH_OUT:-/tmp/pollux-bench}
PEER=${SPDK_PEER:-../shared/peers/spdk}
SPDK_BIN=${SPDK_DIR:-/var/tmp/spdk-peer/spdk}/build/examples/bdevperf
mkdir -p "$OUT"
: >"$OUT/results.jsonl"

log() { echo "bench: $*" >&2; }

peer=0
if [ -x "$PEER/run.sh" ] && [ -x "$SPDK_BIN" ]; then
    peer=1
else
    log "SPDK peer not built ($PEER/run.sh, $SPDK_BIN): peer columns skipped;" \
        "build it with $PEER/build.sh (see $PEER/README.md)"
fi

cargo build --release -q -p pollux-apps --bin pollux-bdevperf --bin pollux-perf --bin pollux-tgt

# Hugepages for Pollux's DMA arenas before the first cell (the peer's
# run.sh reserves the same 1024 for SPDK; without this the first round's
# Pollux cells ran on 4 KiB pages). As root only; otherwise say so.
hp=/proc/sys/vm/nr_hugepages
if [ "$(cat "$hp" 2>/dev/null || echo 0)" -lt 1024 ]; then
    if [ -w "$hp" ]; then
        echo 1024 >"$hp"
    else
        log "fewer than 1024 hugepages and $hp is not writable: Pollux's arenas may use 4 KiB pages"
    fi
fi
B=target/release/pollux-bdevperf
want() { [ -z "$ONLY" ] || [[ " $ONLY " == *" $1 "* ]]; }

# record CELL SIDE JSON: keep one run's figure.
record() {
    python3 - "$1" "$2" "$3" >>"$OUT/results.jsonl" <<'PY'
import json, sys
cell, side, line = sys.argv[1:]
v = json.loads(line)
print(json.dumps({"cell": cell, "side": side, "iops": v.get("iops"),
                  "path": v.get("path"), "clock": v.get("clock")}))
PY
}

# The last JSON object a command printed.
last_json() { grep '^{' | tail -1; }

bdevperf() { # CELL ARGS...
    local cell=$1; shift
    local j
    j=$("$B" "$@" -q 128 -t "$SECS" --cores 0 --json | last_json)
    record "$cell" pollux "$j"
}
spdk() { # CELL TEST
    [ "$peer" = 1 ] || return 0
    local j
    j=$(bash "$PEER/run.sh" "$2" "$SECS" | last_json) || { log "peer $2 failed"; return 0; }
    record "$1" spdk "$j"
}
mainjob() { # CELL BS [TRANSPORT]
    local j
    j=$(TRANSPORT=${3:-soft} BS=$2 MEM=pool SECS_SINGLE=$SECS bash scripts/main-job.sh --single 2>/dev/null | last_json)
    record "$1" pollux "$j"
}

for r in $(seq "$ROUNDS"); do
    log "round $r of $ROUNDS"
    if want bdev; then
        bdevperf "null 4 KiB randread, generic" --bdev null:size=1G,block=4096 -o 4096 -w randread
        bdevperf "null 4 KiB randread, in-place" --bdev null:size=1G,block=4096 -o 4096 -w randread --in-place
        spdk "null 4 KiB randread, generic" bdevperf-null-4k
        bdevperf "null 512 B randread, generic" --bdev null:size=1G,block=512 -o 512 -w randread
        bdevperf "null 512 B randread, in-place" --bdev null:size=1G,block=512 -o 512 -w randread --in-place
        spdk "null 512 B randread, generic" bdevperf-null-512
        bdevperf "malloc 4 KiB randwrite, generic" --bdev malloc:size=1G,block=4096 -o 4096 -w randwrite
        bdevperf "malloc 4 KiB randwrite, in-place" --bdev malloc:size=1G,block=4096 -o 4096 -w randwrite --in-place
        spdk "malloc 4 KiB randwrite, generic" bdevperf-malloc-4k-randwrite
    fi
    if want copy; then
        # The example prints "<what>: <n> copies/s ..." per loop.
        cargo run --release -q -p pollux-apps --example memcpy "$SECS" 2>/dev/null |
            python3 -c '
import json, re, sys
for line in sys.stdin:
    m = re.search(r"([0-9.]+) copies/s", line)
    if m:
        name = line.split(":")[0].strip()
        print(json.dumps({"cell": "copy: " + name + " (copies/s)", "side": "pollux",
                          "iops": float(m.group(1))}))
' >>"$OUT/results.jsonl"
    fi
    if want nvmf; then
        mainjob "NVMe-oF 512 B randread (soft provider, pool)" 512
        spdk "NVMe-oF 512 B randread (soft provider, pool)" tcp-512
        mainjob "NVMe-oF 4 KiB randread (soft provider, pool)" 4096
        spdk "NVMe-oF 4 KiB randread (soft provider, pool)" tcp-4k
        if [ "$peer" = 1 ]; then
            j=$(bash "$PEER/run.sh" vfiouser-512 "$SECS" | last_json) && record "NVMe-oF 512 B randread (soft provider, pool)" spdk-vfio-user "$j"
            j=$(bash "$PEER/run.sh" vfiouser-4k "$SECS" | last_json) && record "NVMe-oF 4 KiB randread (soft provider, pool)" spdk-vfio-user "$j"
        fi
    fi
    if want tcp; then
        mainjob "NVMe/TCP 512 B randread (loopback)" 512 tcp
        spdk "NVMe/TCP 512 B randread (loopback)" tcp-512
        mainjob "NVMe/TCP 4 KiB randread (loopback)" 4096 tcp
        spdk "NVMe/TCP 4 KiB randread (loopback)" tcp-4k
    fi
done

python3 - "$OUT/results.jsonl" "$ROUNDS" <<'PY'
import json, statistics, sys
rows, order = {}, []
for line in open(sys.argv[1]):
    v = json.loads(line)
    if v.get("iops") is None:
        continue
    if v["cell"] not in rows:
        rows[v["cell"]] = {}
        order.append(v["cell"])
    rows[v["cell"]].setdefault(v["side"], []).append(v["iops"])
def med(xs):
    return statistics.median(xs) if xs else None
def fmt(x):
    return "-" if x is None else f"{x/1e6:.3f} M"
print(f"| cell | Pollux (median of {sys.argv[2]}) | SPDK | ratio | SPDK vfio-user | ratio |")
print("| --- | --- | --- | --- | --- | --- |")
for c in order:
    p = med(rows[c].get("pollux", []))
    s = med(rows[c].get("spdk", []))
    u = med(rows[c].get("spdk-vfio-user", []))
    rs = f"{p/s:.2f}" if p and s else "-"
    ru = f"{p/u:.2f}" if p and u else "-"
    runs = " / ".join(f"{x/1e6:.2f}" for x in rows[c].get("pollux", []))
    print(f"| {c} | {fmt(p)} ({runs}) | {fmt(s)} | {rs} | {fmt(u)} | {ru} |")
PY
