#!/usr/bin/env bash
# The main job: our NVMe-oF target on a null bdev over the software RDMA
# provider and NVMe/TCP on 127.0.0.1 (core 0), pollux-perf against it from
# core 1, and a table of IOPS/host-CPU% per block size (512 B … 64 KiB):
# one column per RDMA host memory mode, then a `tcp` column (in-capsule
# writes on, no digests; TCP=0 leaves it out).
#
#   bash scripts/main-job.sh            # sweep, SECS=1 per cell
#   SECS=3 MODES=pool,register-always+inline bash scripts/main-job.sh
#   bash scripts/main-job.sh --single   # one 5 s randread 4 KiB run, JSON
#   BS=512 MEM=pool bash scripts/main-job.sh --single   # the issue-5 goals
#   WORKLOAD=randread bash scripts/main-job.sh          # read-only sweep
#   CALLGRIND=tgt  BS=512 MEM=pool bash scripts/main-job.sh --single
#   CALLGRIND=perf BS=512 MEM=pool bash scripts/main-job.sh --single
#   TRANSPORT=tcp BS=512 bash scripts/main-job.sh --single   # over NVMe/TCP
#   TRANSPORT=tcp CALLGRIND=tgt BS=512 bash scripts/main-job.sh --single
#   TGT_IDLE=hybrid TRANSPORT=tcp QD=1 bash scripts/main-job.sh --single  # pollux-tgt --idle
#
# CALLGRIND=tgt|perf runs that side under `valgrind --tool=callgrind` (the
# other side native), zeroes the counters once the run is warm
# (`callgrind_control -z`, CG_WARM seconds after the host starts, default
# 3), dumps them (`-d`) just before the host's run ends, and prints
# instructions per I/O: the profiled thread's total Ir over the calls of
# a function that runs once per I/O (the bdev completion on the target,
# the host's completion callback); the profile stays in CG_OUT (default
# /tmp/pollux-cg) for callgrind_annotate. Instruction counts do not
# depend on the machine's load; IOPS under valgrind mean nothing.
#
# It needs nothing but cargo. The target is `pollux-tgt` (the example
# config apps/config/tgt-null.toml with 512-byte blocks, core 0, its stats
# file giving the target's busy %), started, awaited ("ready") and stopped
# with SIGINT afterwards. SPAWN=1 instead runs the same target core and RDMA
# transport inside pollux-perf (`--spawn-target`) on its own reactor core.
set -euo pipefail
cd "$(dirname "$0")/.."

SECS=${SECS:-1}
QD=${QD:-128}
MODES=${MODES:-pool,register-always+inline,register-always+inline+local-inv}
BDEV=${BDEV:-null:size=1G,block=512}
WORKLOAD=${WORKLOAD:-randrw}
TCP=${TCP:-1}
TCP_PORT=${TCP_PORT:-4420}
TRANSPORT=${TRANSPORT:-soft}
TCP_TRID="trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:$TCP_PORT subnqn:nqn.2016-06.io.pollux:null0"
case "$TRANSPORT" in soft | tcp) ;; *) echo "main-job: TRANSPORT=soft or tcp" >&2; exit 2 ;; esac
TGT_CORE=0
HOST_CORE=1
if [ "$(nproc)" -lt 2 ]; then
    echo "main-job: one CPU only: target and host share core 0 (figures will be low)" >&2
    HOST_CORE=0
fi

cargo build --release --bin pollux-perf >&2
PERF=target/release/pollux-perf

if [ "${1:-}" = "--single" ]; then
    # BS, MEM (pool | register-always) and SECS_SINGLE pick the run.
    RUN=(-q "$QD" -o "${BS:-4096}" -w "${SINGLE_WORKLOAD:-randread}" -t "${SECS_SINGLE:-5}"
        --cores "$HOST_CORE" --json)
    if [ -n "${MEM:-}" ] && [ "$TRANSPORT" = soft ]; then
        RUN+=(--mem "$MEM")
    fi
else
    RUN=(--sweep --sweep-modes "$MODES" -q "$QD" -w "$WORKLOAD" -t "$SECS" --cores "$HOST_CORE")
fi

CG=${CALLGRIND:-}
TGT_CMD=(target/release/pollux-tgt)
PERF_CMD=("$PERF")
if [ -n "$CG" ]; then
    [ "${1:-}" = "--single" ] || { echo "main-job: CALLGRIND needs --single" >&2; exit 2; }
    [ -z "${SPAWN:-}" ] || { echo "main-job: CALLGRIND needs pollux-tgt (no SPAWN)" >&2; exit 2; }
    CG_OUT=${CG_OUT:-/tmp/pollux-cg}
    CG_WARM=${CG_WARM:-3}
    CG_SECS=${CG_SECS:-4}
    mkdir -p "$CG_OUT"
    rm -f "$CG_OUT/callgrind.$CG".*
    # CG_INSTR=1 keeps per-instruction counts (for an annotated disassembly).
    VG=(valgrind --tool=callgrind --separate-threads=yes --dump-instr="$([ -n "${CG_INSTR:-}" ] && echo yes || echo no)"
        --callgrind-out-file="$CG_OUT/callgrind.$CG.%p")
    case "$CG" in
    tgt) TGT_CMD=("${VG[@]}" "${TGT_CMD[@]}") ;;
    perf) PERF_CMD=("${VG[@]}" "${PERF_CMD[@]}") ;;
    *) echo "main-job: CALLGRIND=tgt or perf" >&2; exit 2 ;;
    esac
    # Long enough that the dump happens while the host still runs (a
    # host under valgrind also connects slowly).
    RUN=(-q "$QD" -o "${BS:-4096}" -w "${SINGLE_WORKLOAD:-randread}"
        -t "$((CG_WARM + CG_SECS + 4))" --cores "$HOST_CORE" --json)
    if [ -n "${MEM:-}" ] && [ "$TRANSPORT" = soft ]; then
        RUN+=(--mem "$MEM")
    fi
fi

# Instructions per I/O from a callgrind dump: the busiest thread's total
# over the calls of the once-per-I/O function PATTERN, and the reactor's
# loops per I/O (calls of Reactor::poll_once): a loop that finds nothing
# still costs instructions, so the figure rises when the profiled side is
# not saturated; compare figures at about the same loops per I/O.
cg_per_io() {
    local line
    line=$(python3 scripts/cg-calls.py "$@") || return 1
    PAT=$1 awk '{ pat = ENVIRON["PAT"]; per = $3 ? sprintf("%.0f", $2 / $3) : "nan"; lpi = $3 ? sprintf("%.3f", $4 / $3) : "nan"
        printf "callgrind %s: %.0f Ir, %.0f I/Os (%s), %s Ir per I/O, %s reactor loops per I/O\n", $1, $2, $3, pat, per, lpi }' <<<"$line"
}

# Zero the counters of the process under valgrind once warm, dump them
# before the host stops, print the per-I/O figure.
cg_window() {
    local pid=$1 pattern=$2
    sleep "$CG_WARM"
    callgrind_control -z "$pid" >/dev/null
    sleep "$CG_SECS"
    callgrind_control -d "$pid" >/dev/null
    sleep 1
    local dumps=()
    for f in "$CG_OUT/callgrind.$CG.$pid"*; do
        case "$f" in *.1 | *.1-[0-9]*) dumps+=("$f") ;; esac
    done
    cg_per_io "$pattern" "${dumps[@]}"
}
CG_TGT_FN='IoInbox as pollux_bdev::.*IoCompletion>::complete'
CG_PERF_FN='JobQueues>::reap::\{\{closure\}\}'

# The sweep tables of the RDMA run and the TCP run (pollux-perf --json),
# side by side: the RDMA modes, then a `tcp` column.
merge_sweeps() {
    python3 - "$@" <<'PY'
import json, sys
rdma = json.load(open(sys.argv[1]))
tcp = json.load(open(sys.argv[2]))
cols = [k for k in rdma[0] if k != "bs"]
def label(bs):
    return f"{bs // 1024}K" if bs >= 1024 and bs % 1024 == 0 else str(bs)
def cell(c):
    return "failed" if c is None else f"{c['iops']:.0f}/{c['cpu_pct']:.0f}%"
names = cols + ["tcp"]
w = max(16, max(len(n) for n in names))
print(f"{'bs':>8}" + "".join(f"  {n:>{w}}" for n in names))
for r, t in zip(rdma, tcp):
    tc = [v for k, v in t.items() if k != "bs"]
    cells = [cell(r[c]) for c in cols] + [cell(tc[0] if tc else None)]
    print(f"{label(r['bs']):>8}" + "".join(f"  {c:>{w}}" for c in cells))
PY
}

TGT_PID=
cleanup() {
    if [ -n "$TGT_PID" ] && kill -0 "$TGT_PID" 2>/dev/null; then
        kill -INT "$TGT_PID" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$TGT_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$TGT_PID" 2>/dev/null || true
        wait "$TGT_PID" 2>/dev/null || true
    fi
}
trap cleanup EXIT

if [ -f apps/src/bin/pollux-tgt.rs ] && [ -f apps/config/tgt-null.toml ] && [ -z "${SPAWN:-}" ]; then
    cargo build --release --bin pollux-tgt >&2
    WORK=$(mktemp -d)
    trap 'cleanup; rm -rf "$WORK"' EXIT
    # The example config, with 512-byte blocks so the sweep can start at 512 B.
    sed -e 's/block=4096/block=512/' -e "s/^cores = .*/cores = \"$TGT_CORE\"/" \
        apps/config/tgt-null.toml >"$WORK/tgt.toml"
    if [ "$TCP" = 1 ] || [ "$TRANSPORT" = tcp ]; then
        printf '\n[[listener]]\ntrtype = "tcp"\ntraddr = "127.0.0.1"\ntrsvcid = "%s"\n' \
            "$TCP_PORT" >>"$WORK/tgt.toml"
    fi
    "${TGT_CMD[@]}" -c "$WORK/tgt.toml" --stats-file "$WORK/stats.json" --idle "${TGT_IDLE:-busy}" \
        >"$WORK/tgt.log" 2>&1 &
    TGT_PID=$!
    for _ in $(seq 1200); do
        grep -q 'pollux-tgt: ready' "$WORK/tgt.log" 2>/dev/null && break
        kill -0 "$TGT_PID" 2>/dev/null || { cat "$WORK/tgt.log" >&2; exit 1; }
        sleep 0.1
    done
    grep -q 'pollux-tgt: ready' "$WORK/tgt.log" || { echo "main-job: pollux-tgt did not start" >&2; cat "$WORK/tgt.log" >&2; exit 1; }
    TRID=${POLLUX_TGT_TRID:-"trtype:soft traddr:@pollux-tgt subnqn:nqn.2016-06.io.pollux:null0"}
    if [ "$TRANSPORT" = tcp ]; then
        TRID=$TCP_TRID
    fi
    if [ -n "$CG" ]; then
        "${PERF_CMD[@]}" -r "$TRID" --target-stats "$WORK/stats.json" "${RUN[@]}" &
        PERF_PID=$!
        if [ "$CG" = tgt ]; then
            cg_window "$TGT_PID" "$CG_TGT_FN"
        else
            cg_window "$PERF_PID" "$CG_PERF_FN"
        fi
        wait "$PERF_PID"
    elif [ "${1:-}" != "--single" ] && [ "$TCP" = 1 ]; then
        # The RDMA sweep and the same sweep over TCP, one table.
        st=0
        "$PERF" -r "$TRID" --target-stats "$WORK/stats.json" "${RUN[@]}" --json \
            >"$WORK/rdma.json" || st=$?
        "$PERF" -r "$TCP_TRID" --target-stats "$WORK/stats.json" --sweep \
            --sweep-modes pool+inline -q "$QD" -w "$WORKLOAD" -t "$SECS" --cores "$HOST_CORE" \
            --json >"$WORK/tcp.json" || st=$?
        echo "IOPS/host CPU% per block size: soft RDMA per host memory mode, and NVMe/TCP" \
            "(-q $QD -w $WORKLOAD, $SECS s each)"
        merge_sweeps "$WORK/rdma.json" "$WORK/tcp.json"
        [ "$st" = 0 ] || exit "$st"
    else
        "$PERF" -r "$TRID" --target-stats "$WORK/stats.json" "${RUN[@]}"
    fi
    cleanup
    TGT_PID=
    echo "main-job: pollux-tgt stopped" >&2
else
    [ "$TRANSPORT" = soft ] || { echo "main-job: SPAWN serves soft RDMA only" >&2; exit 2; }
    "$PERF" --spawn-target "$BDEV" --target-cores "$TGT_CORE" "${RUN[@]}"
fi
