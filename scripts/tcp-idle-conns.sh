#!/usr/bin/env bash
# What idle NVMe/TCP connections cost the busy one on the same core:
# pollux-tgt on core 0 (null bdev, 512 B blocks, busy polling), pollux-perf
# on core 1 (one connection, randread, QD 128, 512 B), with 0 and with IDLE
# other connections open to the target that sent their ICReq and nothing
# since (a Python client on core 1, asleep while the host runs).
#
#   bash scripts/tcp-idle-conns.sh                      # this tree, IDLE=64
#   TGTS="/tmp/pollux-tgt-before target/release/pollux-tgt" bash scripts/tcp-idle-conns.sh
#   CG=1 bash scripts/tcp-idle-conns.sh                 # instructions per idle loop
#
# Every target binary in TGTS (default this tree's) runs ROUNDS (5) rounds
# of SECS (3) seconds per connection count, interleaved; prints each run and
# the median IOPS per binary and count. NO_BUILD=1 skips the build.
# CG=1 instead runs each target under callgrind with the IDLE connections
# and no host, zeroes the counters once they are up, and after CG_SECS (10)
# seconds prints the reactor thread's instructions per reactor loop (user
# space only: a failing `read` is kernel time and does not show).
set -euo pipefail
cd "$(dirname "$0")/.."
IDLE=${IDLE:-64}
ROUNDS=${ROUNDS:-5}
SECS=${SECS:-3}
PORT=${TCP_PORT:-4437}
TGTS=${TGTS:-target/release/pollux-tgt}
PERF=target/release/pollux-perf
NQN=nqn.2016-06.io.pollux:idle
if [ -z "${NO_BUILD:-}" ]; then
    cargo build --release -q -p pollux-apps --bin pollux-tgt --bin pollux-perf
fi
source scripts/lib-tgt.sh
W=$TGT_WORK
IPID=""
# lib-tgt.sh's cleanup, and the idle client's.
trap '[ -z "$IPID" ] || kill "$IPID" 2>/dev/null || true; tgt_stop; rm -rf "$W"' EXIT

cat >"$W/tgt.toml" <<EOF
cores = "0"
provider = "soft"

[[bdev]]
spec = "null:name=Null0,size=1G,block=512"

[[subsystem]]
nqn = "$NQN"
serial = "POLLUXIDLE"
allow_any_host = true
namespaces = [{ bdev = "Null0", nsid = 1 }]

[[listener]]
trtype = "tcp"
traddr = "127.0.0.1"
trsvcid = "$PORT"
EOF

# idle.py N: N connections that send an ICReq, read the ICResp, then sleep.
cat >"$W/idle.py" <<'EOF'
import socket, struct, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
conns = []
for _ in range(n):
    s = socket.create_connection(("127.0.0.1", port))
    # ICReq: common header (type 0, hlen 128, plen 128), PFV 0, no digests.
    s.sendall(struct.pack("<BBBBIHBBI", 0, 0, 128, 0, 128, 0, 0, 0, 0) + bytes(112))
    got = b""
    while len(got) < 128:
        d = s.recv(128 - len(got))
        if not d:
            sys.exit("the target closed an idle connection")
        got += d
    conns.append(s)
print("up", flush=True)
time.sleep(3600)
EOF

# run TGT N: one run; its IOPS into RUN_IOPS (not printed: run in a
# subshell, the EXIT trap would not see the processes it starts)
run() {
    local tgt=$1 n=$2
    TGT_BIN=$tgt tgt_start "$W/tgt.toml"
    if [ "$n" -gt 0 ]; then
        taskset -c 1 python3 "$W/idle.py" "$PORT" "$n" >"$W/idle.out" &
        IPID=$!
        for _ in $(seq 100); do grep -q up "$W/idle.out" && break; sleep 0.1; done
        grep -q up "$W/idle.out" || { echo "idle connections did not come up" >&2; exit 1; }
    fi
    RUN_IOPS=$("$PERF" -r "trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:$PORT subnqn:$NQN" \
        -q 128 -o 512 -w randread -t "$SECS" --cores 1 | awk '/^total/{print $2}')
    [ -n "$RUN_IOPS" ] || { echo "pollux-perf reported no total" >&2; exit 1; }
    [ -z "$IPID" ] || { kill "$IPID"; wait "$IPID" 2>/dev/null || true; IPID=""; }
    kill -INT "$TGT_PID"
    wait "$TGT_PID" || { echo "pollux-tgt exited with an error" >&2; cat "$W/tgt.log" >&2; exit 1; }
    TGT_PID=""
}

# cg_loop TGT: instructions per reactor loop of an idle target with IDLE
# idle connections (callgrind; counters zeroed once the connections are up).
cg_loop() {
    local tgt=$1 vg
    rm -f "$W"/cg.*
    valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$W/cg.%p" \
        "$tgt" -c "$W/tgt.toml" >"$W/tgt.log" 2>&1 &
    vg=$!
    for _ in $(seq 600); do grep -q 'pollux-tgt: ready' "$W/tgt.log" && break; sleep 0.1; done
    taskset -c 1 python3 "$W/idle.py" "$PORT" "$IDLE" >"$W/idle.out" &
    IPID=$!
    for _ in $(seq 600); do grep -q up "$W/idle.out" && break; sleep 0.1; done
    sleep 2
    callgrind_control -z "$vg" >/dev/null 2>&1
    sleep "${CG_SECS:-10}"
    callgrind_control -d "$vg" >/dev/null 2>&1
    kill "$IPID"; wait "$IPID" 2>/dev/null || true; IPID=""
    kill -INT "$vg"; wait "$vg" || true
    python3 scripts/cg-calls.py 'Reactor::poll_once$' "$W"/cg.*.1-* |
        awk -v t="$tgt" '$4 > 0 { printf "| `%s` | %.0f |\n", t, $2 / $4; ok = 1 }
            END { if (!ok) { print "no reactor loops in the dump" > "/dev/stderr"; exit 1 } }'
}

if [ -n "${CG:-}" ]; then
    command -v valgrind >/dev/null || { echo "CG=1 needs valgrind" >&2; exit 2; }
    echo "| pollux-tgt | instructions per reactor loop, $IDLE idle connections |"
    echo "| --- | --- |"
    for tgt in $TGTS; do cg_loop "$tgt"; done
    exit 0
fi

: >"$W/runs"
for r in $(seq "$ROUNDS"); do
    for tgt in $TGTS; do
        for n in 0 "$IDLE"; do
            run "$tgt" "$n"
            echo "round $r  $tgt  idle $n: $RUN_IOPS IOPS"
            echo "$tgt $n $RUN_IOPS" >>"$W/runs"
        done
    done
done
echo
echo "| pollux-tgt | 0 idle connections | $IDLE idle connections | cost |"
echo "| --- | --- | --- | --- |"
for tgt in $TGTS; do
    python3 - "$W/runs" "$tgt" "$IDLE" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
tgt, idle = sys.argv[2], sys.argv[3]
m = {n: statistics.median(int(r[2]) for r in rows if r[0] == tgt and r[1] == n) for n in ("0", idle)}
print(f"| `{tgt}` | {m['0'] / 1e6:.2f} M | {m[idle] / 1e6:.2f} M | {m['0'] / m[idle]:.2f}x |")
EOF
done
