#!/usr/bin/env bash
# Where the CPU goes per I/O over NVMe/TCP on loopback, target and host,
# Pollux and the SPDK peer doing the same work: target on core 0, host on
# core 1, null bdev, randread QD 128, one connection.
#
#   bash scripts/tcp-cpu.sh                     # Pollux and SPDK, 512 B and 4 KiB
#   SIDES=pollux BSS=512 ROUNDS=3 bash scripts/tcp-cpu.sh
#   TREE=/var/tmp/pollux-ab/afb0165 SIDES=pollux bash scripts/tcp-cpu.sh
#   BASE_TREE=/var/tmp/pollux-ab/afb0165 SIDES="base pollux spdk" ROUNDS=3 bash scripts/tcp-cpu.sh
#
# Each run lasts SECS (default 12) seconds. WARM seconds after the host
# starts, two windows follow:
# - CPU window (WIN seconds, nothing attached): utime and stime of the
#   target and host processes from /proc/PID/stat, per I/O. Both sides
#   busy-poll, so user time includes empty polls; kernel time includes the
#   loopback softirq work (the TCP receive of the peer's socket) that the
#   sending side runs in its system calls.
# - Syscall window (WIN seconds): `perf stat` counts of the syscall
#   tracepoints per process (read/readv/recvfrom/recvmsg, write/writev/
#   sendto/sendmsg, io_uring_enter, accept4, epoll waits; reads and
#   accepts that failed with EAGAIN separately), per I/O.
# I/Os per window are the run's IOPS (the host's report) times the window,
# so the figures are per I/O whatever the machine's load.
#
# TREE is the Pollux tree to run (default this one; its
# scripts/main-job.sh and build), side `base` runs BASE_TREE the same way
# (before/after figures of a change, interleaved); the SPDK peer is
# ../shared/peers/spdk (SPDK_PEER). Pollux's runs also record the
# reactors' busy shares that pollux-perf reports. One JSON line per run goes to $OUT/runs.jsonl (default
# /tmp/pollux-tcp-cpu), then a markdown table of the medians on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
HERE=$(pwd)
TREE=${TREE:-$HERE}
SIDES=${SIDES:-pollux spdk}
BSS=${BSS:-512 4096}
ROUNDS=${ROUNDS:-1}
SECS=${SECS:-12}
WARM=${WARM:-3}
WIN=${WIN:-3}
OUT=${OUT:-/tmp/pollux-tcp-cpu}
PEER=${SPDK_PEER:-$HERE/../shared/peers/spdk}
PORT=${TCP_PORT:-4431}
mkdir -p "$OUT"
: >"$OUT/runs.jsonl"
log() { echo "tcp-cpu: $*" >&2; }
[ -x /usr/bin/perf ] || command -v perf >/dev/null || { log "needs perf"; exit 2; }
TICK=$(getconf CLK_TCK)

SC_EVENTS=(
    syscalls:sys_enter_read syscalls:sys_enter_readv syscalls:sys_enter_recvfrom
    syscalls:sys_enter_recvmsg syscalls:sys_enter_write syscalls:sys_enter_writev
    syscalls:sys_enter_sendto syscalls:sys_enter_sendmsg syscalls:sys_enter_io_uring_enter
    syscalls:sys_enter_accept4 syscalls:sys_enter_epoll_wait syscalls:sys_enter_epoll_pwait
    raw_syscalls:sys_enter
)

# A descendant of PARENT whose executable is NAME.
child_named() { # PARENT NAME
    local p pid
    for p in $(pgrep -P "$1" || true); do
        if [ "$(basename "$(readlink /proc/"$p"/exe 2>/dev/null)")" = "$2" ]; then
            echo "$p"
            return
        fi
        pid=$(child_named "$p" "$2")
        if [ -n "$pid" ]; then
            echo "$pid"
            return
        fi
    done
    return 0
}

# utime and stime (clock ticks) of PID, all threads.
cpu_ticks() { awk '{print $14, $15}' "/proc/$1/stat"; }

# Syscall counts of PID over WIN seconds as "event=count" lines, the
# failed (EAGAIN) reads and accepts included.
sc_counts() { # PID FILE
    local ev=() e
    for e in "${SC_EVENTS[@]}"; do ev+=(-e "$e"); done
    perf stat -x, "${ev[@]}" \
        -e syscalls:sys_exit_read --filter 'ret == -11' \
        -e syscalls:sys_exit_readv --filter 'ret == -11' \
        -e syscalls:sys_exit_recvfrom --filter 'ret == -11' \
        -e syscalls:sys_exit_recvmsg --filter 'ret == -11' \
        -e syscalls:sys_exit_accept4 --filter 'ret == -11' \
        -p "$1" -- sleep "$WIN" 2>"$2.raw" >/dev/null || true
    awk -F, 'BEGIN{n=0} {ev=$3; if (ev ~ /sys_exit_/) { sub(/sys_exit_/, "eagain_", ev) }
        sub(/^.*:/, "", ev); sub(/sys_enter_/, "", ev); if ($1 ~ /^[0-9]+$/) print ev "=" $1}' \
        "$2.raw" >"$2"
}

# Runs one side in the background, measures both windows, waits for it,
# records one JSON line.
measure() { # SIDE BS
    local side=$1 bs=$2 log=$OUT/$1-$2.log runner tname hname tpid="" hpid="" i
    if [ "$side" = pollux ] || [ "$side" = base ]; then
        local tree=$TREE
        [ "$side" = pollux ] || tree=${BASE_TREE:?BASE_TREE names the tree of side base}
        (cd "$tree" && TRANSPORT=tcp TCP_PORT=$PORT BS=$bs SECS_SINGLE=$SECS \
            exec bash scripts/main-job.sh --single) >"$log" 2>"$log.err" &
        runner=$!
        tname=pollux-tgt hname=pollux-perf
    else
        local t=tcp-512
        [ "$bs" = 512 ] || t=tcp-4k
        bash "$PEER/run.sh" "$t" "$SECS" >"$log" 2>"$log.err" &
        runner=$!
        tname=nvmf_tgt hname=spdk_nvme_perf
    fi
    for i in $(seq 600); do
        [ -n "$tpid" ] || tpid=$(child_named "$runner" "$tname")
        [ -n "$hpid" ] || hpid=$(child_named "$runner" "$hname")
        [ -n "$tpid" ] && [ -n "$hpid" ] && break
        kill -0 "$runner" 2>/dev/null || break
        sleep 0.1
    done
    if [ -z "$tpid" ] || [ -z "$hpid" ]; then
        log "$side $bs: no target/host process (see $log.err)"
        wait "$runner" || true
        return 0
    fi
    sleep "$WARM"
    local t0 h0 t1 h1 w0 w1
    w0=$(date +%s.%N)
    t0=$(cpu_ticks "$tpid")
    h0=$(cpu_ticks "$hpid")
    sleep "$WIN"
    t1=$(cpu_ticks "$tpid")
    h1=$(cpu_ticks "$hpid")
    w1=$(date +%s.%N)
    sc_counts "$tpid" "$OUT/sc-tgt" &
    local sct=$!
    sc_counts "$hpid" "$OUT/sc-host"
    wait "$sct" || true
    wait "$runner" || { log "$side $bs: run failed (see $log.err)"; return 0; }
    python3 - "$side" "$bs" "$log" "$TICK" "$w0" "$w1" "$WIN" "$t0" "$t1" "$h0" "$h1" \
        "$OUT/sc-tgt" "$OUT/sc-host" >>"$OUT/runs.jsonl" <<'PY'
import json, sys
side, bs, logf, tick, w0, w1, win = sys.argv[1:8]
t0, t1, h0, h1 = (list(map(int, a.split())) for a in sys.argv[8:12])
tick, cpu_win, sc_win = float(tick), float(w1) - float(w0), float(win)
iops, busy = None, {}
for line in open(logf):
    line = line.strip()
    if line.startswith("{"):
        v = json.loads(line)
        iops = v.get("iops", iops)
        # pollux-perf: the reactors' busy shares (SPDK reports none).
        if v.get("target_busy_pct") is not None:
            busy["tgt_busy_pct"] = v["target_busy_pct"]
        if v.get("cores"):
            busy["host_busy_pct"] = v["cores"][0].get("busy_pct")
if not iops:
    sys.exit(0)
def ns(a, b, i):
    return (b[i] - a[i]) / tick * 1e9 / (iops * cpu_win)
def counts(f):
    out = {}
    for line in open(f):
        k, v = line.strip().split("=")
        out[k] = out.get(k, 0) + int(v) / (iops * sc_win)
    return out
print(json.dumps({
    "side": side, "bs": int(bs), "iops": iops,
    "tgt_user_ns": ns(t0, t1, 0), "tgt_sys_ns": ns(t0, t1, 1),
    "host_user_ns": ns(h0, h1, 0), "host_sys_ns": ns(h0, h1, 1),
    "tgt_sc": counts(sys.argv[12]), "host_sc": counts(sys.argv[13]), **busy,
}))
PY
    log "$side $bs: $(tail -1 "$OUT/runs.jsonl")"
}

if [ -z "${NO_BUILD:-}" ]; then
    for t in "$TREE" ${BASE_TREE:+"$BASE_TREE"}; do
        (cd "$t" && cargo build --release -q --bin pollux-tgt --bin pollux-perf)
    done
fi
for r in $(seq "$ROUNDS"); do
    for bs in $BSS; do
        for side in $SIDES; do
            log "round $r: $side $bs B"
            measure "$side" "$bs"
        done
    done
done

python3 - "$OUT/runs.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
groups = {}
for r in runs:
    groups.setdefault((r["bs"], r["side"]), []).append(r)
def med(xs):
    return statistics.median(xs) if xs else 0.0
def sc(rs, who, *names):
    return med([sum(r[who].get(n, 0.0) for n in names) for r in rs])
def busy(rs):
    t = [r["tgt_busy_pct"] for r in rs if r.get("tgt_busy_pct") is not None]
    h = [r["host_busy_pct"] for r in rs if r.get("host_busy_pct") is not None]
    return f"{med(t):.0f} / {med(h):.0f}" if t and h else "-"
rd = ("read", "readv", "recvfrom", "recvmsg")
wr = ("write", "writev", "sendto", "sendmsg")
print("| block | side | runs | IOPS | target user ns | target kernel ns | host user ns | host kernel ns "
      "| target syscalls: recv (EAGAIN) / send / io_uring_enter / other "
      "| host syscalls: recv (EAGAIN) / send / io_uring_enter / other | busy % target / host |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for (bs, side) in sorted(groups):
    rs = groups[(bs, side)]
    def cell(who):
        recv = sc(rs, who, *rd)
        eagain = sc(rs, who, "eagain_read", "eagain_readv", "eagain_recvfrom", "eagain_recvmsg")
        send = sc(rs, who, *wr)
        ring = sc(rs, who, "io_uring_enter")
        total = sc(rs, who, "sys_enter")
        other = max(total - recv - send - ring, 0.0)
        return f"{recv:.3f} ({eagain:.3f}) / {send:.3f} / {ring:.3f} / {other:.3f}"
    label = "512 B" if bs == 512 else f"{bs // 1024} KiB"
    print(f"| {label} | {side} | {len(rs)} | {med([r['iops'] for r in rs]) / 1e6:.2f} M "
          f"| {med([r['tgt_user_ns'] for r in rs]):.0f} | {med([r['tgt_sys_ns'] for r in rs]):.0f} "
          f"| {med([r['host_user_ns'] for r in rs]):.0f} | {med([r['host_sys_ns'] for r in rs]):.0f} "
          f"| {cell('tgt_sc')} | {cell('host_sc')} | {busy(rs)} |")
PY
