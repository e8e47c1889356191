#!/usr/bin/env bash
# Runs inside the lab guest (tests/vm/lab run tests/vm/placement-guest.sh PERF TGT):
# pollux-tgt (ibverbs, rxe_tgt) on two cores serves one pollux-perf host
# (ibverbs, rxe_host) with an admin queue and two I/O queues; the queues
# must land on both target cores (stats file `connections_per_core`, the
# connect requests handed from the listener's core to the other one as
# detached rdma_cm ids) and a write-read-compare run must pass.
# Then the same for iSER (two sessions, two LUNs).
# Prints PASS/FAIL lines; exits 1 on any failure. Boot the lab with three
# CPUs (`-c 3`): the target's two busy-polling reactors and the host's must
# not share one (pollux-perf runs on CPU ${LAB_USER_PERF_CORE:-2}).
set -u
[ "${LAB_IN_GUEST:-}" = 1 ] || { echo "run inside tests/vm/lab" >&2; exit 2; }
PERF=${1:?usage: placement-guest.sh PERF TGT}
TGT=${2:?usage: placement-guest.sh PERF TGT}
T=$LAB_TARGET_ADDR PORT=4420 NQN=nqn.2016-06.io.pollux:placement
W=$(mktemp -d /tmp/pollux-placement.XXXXXX)
FAILED=0
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; FAILED=1; }
# start_tgt NAME: pollux-tgt with $W/NAME-tgt.toml (stats in
# $W/NAME-stats.json, log in $W/NAME-tgt.log), awaited; TPID is its pid.
start_tgt() {
  "$TGT" -c "$W/$1-tgt.toml" --stats-file "$W/$1-stats.json" >"$W/$1-tgt.log" 2>&1 </dev/null &
  TPID=$!
  for _ in $(seq 300); do
    grep -q 'pollux-tgt: ready' "$W/$1-tgt.log" && return 0
    kill -0 "$TPID" 2>/dev/null || break
    sleep 0.2
  done
  cat "$W/$1-tgt.log"; fail "$1: pollux-tgt did not start"; return 1
}
# watch_stats NAME KEY: record KEY (a per-core list) of $W/NAME-stats.json
# every 0.3 s into $W/NAME-per_core.log while the target runs; WPID.
watch_stats() {
  ( while kill -0 "$TPID" 2>/dev/null; do
      grep -o '"'"$2"'":\[[0-9, ]*\]' "$W/$1-stats.json"
      sleep 0.3
    done ) >"$W/$1-per_core.log" 2>&1 &
  WPID=$!
}
# stop_tgt NAME: SIGINT, and it must exit 0 within 20 s.
stop_tgt() {
  local trc
  kill -INT "$TPID" 2>/dev/null
  for _ in $(seq 100); do kill -0 "$TPID" 2>/dev/null || break; sleep 0.2; done
  kill -0 "$TPID" 2>/dev/null && { kill -KILL "$TPID"; fail "$1: pollux-tgt did not exit on SIGINT"; }
  wait "$TPID"; trc=$?
  grep -E 'handed|accepted|destroyed|stopped' "$W/$1-tgt.log" | tail -n 5
  if [ $trc = 0 ]; then pass "$1: pollux-tgt exited 0"; else fail "$1: pollux-tgt exit $trc"; tail -n 30 "$W/$1-tgt.log"; fi
}
# one CORES NAME [PIN]: serve with pollux-tgt on CORES (PIN=true: every
# queue on the listener's core), run the host, check.
one() {
cat >"$W/$2-tgt.toml" <<CFG
cores = "$1"
provider = "ibverbs"

[transport]
max_queue_depth = 128
max_io_size = "128k"
io_unit_size = "32k"
in_capsule_data_size = 8192
num_shared_buffers = 1024
max_srq_depth = 1024
device = "$LAB_TARGET_DEV"
pin_queues_to_listener_core = ${3:-false}

[[bdev]]
spec = "malloc:name=Malloc0,size=64M,block=512"

[[subsystem]]
nqn = "$NQN"
serial = "POLLUXPLACE0"
model = "Pollux placement"
allow_any_host = true
namespaces = [{ bdev = "Malloc0", nsid = 1 }]

[[listener]]
traddr = "$T"
trsvcid = "$PORT"
CFG
start_tgt "$2" || return
pass "$2: pollux-tgt ready on cores $1"
watch_stats "$2" connections_per_core
timeout -k 5 90 "$PERF" -r "trtype:rdma adrfam:ipv4 traddr:$T trsvcid:$PORT subnqn:$NQN" \
  --device "$LAB_HOST_DEV" --cores "${LAB_USER_PERF_CORE:-2}" --mem pool -P 2 -q 16 -o 8192 -w randrw -t 6 --verify \
  >"$W/$2-perf.log" 2>&1
rc=$?
tail -n 8 "$W/$2-perf.log"
if [ $rc = 0 ]; then pass "$2: pollux-perf -P 2 --verify (randrw 8 KiB)"; else fail "$2: pollux-perf rc=$rc"; fi
sleep 1
kill "$WPID" 2>/dev/null; wait "$WPID" 2>/dev/null
echo "connections_per_core samples: $(sort -u "$W/$2-per_core.log" | tr '\n' ' ')"
if [ "$1" = 1 ] || [ "${3:-false}" = true ]; then
  :  # the one-core baseline / everything pinned to the listener's core
elif grep -Eq '\[2, ?1\]|\[1, ?2\]' "$W/$2-per_core.log"; then
  pass "$2: admin + 2 I/O queues spread over both target cores"
else
  fail "$2: queues not spread over both cores"
fi
stop_tgt "$2"
}

# iser: the same for iSER: pollux-tgt's [iscsi] target on cores 0-1, two
# pollux-perf processes (one session each, each on its own LUN so that
# their --verify runs do not overlap) must land on both cores (stats file
# `iscsi_connections_per_core`).
iser() {
cat >"$W/iser-tgt.toml" <<CFG
cores = "0-1"
provider = "ibverbs"

[[bdev]]
spec = "malloc:name=Lun0,size=16M,block=512"

[[bdev]]
spec = "malloc:name=Lun1,size=16M,block=512"

[[iscsi.portal_group]]
tag = 1
listen = ["$T:3260"]

[[iscsi.target]]
name = "iqn.2016-06.io.pollux:placement"
luns = [{ lun = 0, bdev = "Lun0" }, { lun = 1, bdev = "Lun1" }]
allowed_initiators = []
portal_groups = [1]

[iscsi.options]
queue_depth = 32
max_io_bytes = "128k"
task_buffers = 128
max_srq_depth = 256
num_cqe = 2048
hugepages = "never"
CFG
start_tgt iser || return
pass "iser: pollux-tgt ready on cores 0-1"
watch_stats iser iscsi_connections_per_core
local lun pids=() rc
for lun in 0 1; do
  timeout -k 5 90 "$PERF" -r "trtype:iser traddr:$T trsvcid:3260 target:iqn.2016-06.io.pollux:placement lun:$lun" \
    --device "$LAB_HOST_DEV" --cores "${LAB_USER_PERF_CORE:-2}" -q 8 -o 8192 -w randrw -t 6 --verify \
    >"$W/iser-perf-$lun.log" 2>&1 &
  pids+=($!)
done
for lun in 0 1; do
  wait "${pids[$lun]}"; rc=$?
  tail -n 4 "$W/iser-perf-$lun.log"
  if [ $rc = 0 ]; then pass "iser: pollux-perf LUN $lun --verify (randrw 8 KiB)"; else fail "iser: pollux-perf LUN $lun rc=$rc"; fi
done
sleep 1
kill "$WPID" 2>/dev/null; wait "$WPID" 2>/dev/null
echo "iscsi_connections_per_core samples: $(sort -u "$W/iser-per_core.log" | tr '\n' ' ')"
if grep -Eq '\[1, ?1\]' "$W/iser-per_core.log"; then
  pass "iser: two sessions spread over both target cores"
else
  fail "iser: sessions not spread over both cores"
fi
stop_tgt iser
}

one 0-1 two-cores
one 0-1 two-cores-pinned true
one 1 one-core-baseline
iser
cp "$W"/*.log "$W"/*.toml "${LAB_OUT:-$W}/" 2>/dev/null
[ $FAILED = 0 ] && { echo "placement: ALL PASSED"; exit 0; }
echo "placement: FAILED"; exit 1
