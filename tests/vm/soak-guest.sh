#!/usr/bin/env bash
# Runs inside the lab guest (tests/vm/lab run tests/vm/soak-guest.sh PERF TGT):
# connection churn with real verbs (rxe) at a small count. pollux-tgt
# (ibverbs, rxe_tgt) serves a malloc namespace; CYCLES (default 24,
# POLLUX_SOAK_VM_CYCLES) pollux-perf runs (ibverbs, rxe_host) connect, write
# and read back (--verify) and go: cleanly, SIGKILLed with I/O in flight,
# SIGSTOPped (no more keep-alives: the target's KATO of 2 s ends the
# controller; a queue stopped before its Fabrics Connect has no controller
# and is ended by the target's connect timeout of 5 s) then killed, or
# refused (an unknown subsystem). After a
# warm-up of WARMUP cycles and at the end, once the stats file says no
# connection is left, the target's descriptors and mappings are sampled:
# the end may exceed the warm-up by at most FD_SLACK / MAPS_SLACK.
# Prints the samples as CSV and PASS/FAIL lines; exits 1 on any failure.
set -u
[ "${LAB_IN_GUEST:-}" = 1 ] || { echo "run inside tests/vm/lab" >&2; exit 2; }
PERF=${1:?usage: soak-guest.sh PERF TGT}
TGT=${2:?usage: soak-guest.sh PERF TGT}
CYCLES=${POLLUX_SOAK_VM_CYCLES:-24}
WARMUP=6 FD_SLACK=4 MAPS_SLACK=8
T=$LAB_TARGET_ADDR PORT=4420 NQN=nqn.2016-06.io.pollux:soak
W=$(mktemp -d /tmp/pollux-soak.XXXXXX)
FAILED=0
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; FAILED=1; }
cat >"$W/tgt.toml" <<CFG
cores = "0"
provider = "ibverbs"

[transport]
max_queue_depth = 64
num_shared_buffers = 256
max_srq_depth = 512
num_cqe = 8192
max_qpairs = 16
max_qpairs_per_core = 16
device = "$LAB_TARGET_DEV"
hugepages = "never"
connect_timeout_ms = 5000

[[bdev]]
spec = "malloc:name=Malloc0,size=32M,block=512"

[[subsystem]]
nqn = "$NQN"
serial = "POLLUXSOAK01"
model = "Pollux soak"
allow_any_host = true
namespaces = [{ bdev = "Malloc0", nsid = 1 }]

[[listener]]
traddr = "$T"
trsvcid = "$PORT"
CFG
"$TGT" -c "$W/tgt.toml" --stats-file "$W/stats.json" >"$W/tgt.log" 2>&1 </dev/null &
TPID=$!
for _ in $(seq 300); do
  grep -q 'pollux-tgt: ready' "$W/tgt.log" && break
  kill -0 "$TPID" 2>/dev/null || break
  sleep 0.2
done
grep -q 'pollux-tgt: ready' "$W/tgt.log" || { cat "$W/tgt.log"; echo "FAIL pollux-tgt did not start"; exit 1; }
pass "pollux-tgt ready"
R="trtype:rdma adrfam:ipv4 traddr:$T trsvcid:$PORT"
ARGS=(--device "$LAB_HOST_DEV" --cores "${LAB_USER_PERF_CORE:-1}" --mem pool -P 2 -q 8 -o 8192 -w randrw --verify)
perf() { # perf SUBNQN EXTRA...: pollux-perf on the host device, 2 I/O queues, --verify (90 s at most)
  local nqn=$1; shift
  timeout -k 5 90 "$PERF" -r "$R subnqn:$nqn" "${ARGS[@]}" "$@"
}
perf_bg() { # perf_bg LOG EXTRA...: pollux-perf in the background (P: its own pid, to signal)
  local log=$1; shift
  "$PERF" -r "$R subnqn:$NQN" "${ARGS[@]}" "$@" >"$log" 2>&1 &
  P=$!
}
# idle: wait (60 s at most) until the stats file counts no connection.
idle() {
  for _ in $(seq 300); do
    grep -q '"connections": *0[,}]' "$W/stats.json" && return 0
    sleep 0.2
  done
  fail "connections left after 60 s: $(grep -o '"connections": *[0-9]*' "$W/stats.json")"
  return 1
}
sample() { echo "$1,$(ls /proc/$TPID/fd | wc -l),$(wc -l <"/proc/$TPID/maps"),$(awk '/VmRSS/{print $2}' "/proc/$TPID/status")"; }
echo "cycle,tgt_fds,tgt_maps,tgt_rss_kib"
declare -a tally=(0 0 0 0)
for n in $(seq 1 "$CYCLES"); do
  case $((n % 6)) in
    2) # SIGKILLed with I/O in flight (idle first: the wait below must
       # see this host's connections, not the last cycle's)
      idle || true
      perf_bg "$W/perf-$n.log" -t 30
      for _ in $(seq 100); do grep -q '"connections": *[1-9]' "$W/stats.json" && break; sleep 0.1; done
      sleep 1
      kill -KILL "$P"; wait "$P" 2>/dev/null
      tally[1]=$((tally[1] + 1)) ;;
    4) # stops sending keep-alives: the target's KATO ends it
      idle || true
      perf_bg "$W/perf-$n.log" -t 30 --kato 2
      for _ in $(seq 100); do grep -q '"connections": *[1-9]' "$W/stats.json" && break; sleep 0.1; done
      sleep 1
      kill -STOP "$P"
      idle || true
      kill -KILL "$P"; kill -CONT "$P" 2>/dev/null; wait "$P" 2>/dev/null
      tally[2]=$((tally[2] + 1)) ;;
    5) # refused: no such subsystem
      if perf nqn.2016-06.io.pollux:no-such -t 1 >"$W/perf-$n.log" 2>&1; then
        fail "cycle $n: a connect to an unknown subsystem succeeded"
      fi
      tally[3]=$((tally[3] + 1)) ;;
    *) # clean
      if ! perf "$NQN" -t 1 >"$W/perf-$n.log" 2>&1; then
        tail -n 5 "$W/perf-$n.log"; fail "cycle $n: pollux-perf --verify failed"
      fi
      tally[0]=$((tally[0] + 1)) ;;
  esac
  if [ "$n" = "$WARMUP" ]; then
    idle
    s=$(sample "$n"); echo "$s"; WARM=$s
  fi
done
idle
END=$(sample "$CYCLES"); echo "$END"
echo "cycles: ${tally[0]} clean, ${tally[1]} killed, ${tally[2]} keep-alive stopped, ${tally[3]} refused"
IFS=, read -r _ wf wm _ <<<"$WARM"
IFS=, read -r _ ef em _ <<<"$END"
if [ "$ef" -le $((wf + FD_SLACK)) ] && [ "$em" -le $((wm + MAPS_SLACK)) ]; then
  pass "target descriptors $wf -> $ef, mappings $wm -> $em after $CYCLES cycles"
else
  fail "target grew: descriptors $wf -> $ef, mappings $wm -> $em after $CYCLES cycles"
fi
grep -o '"keep_alive_timeouts": *[0-9]*' "$W/stats.json"
grep -o '"connect_timeouts": *[0-9]*' "$W/stats.json"
if grep -q '"keep_alive_timeouts": *[1-9]' "$W/stats.json"; then
  pass "the target ended stalled hosts by keep-alive timeout"
else
  fail "no keep-alive timeout counted"
fi
# The next host is served normally.
if perf "$NQN" -t 2 >"$W/perf-last.log" 2>&1; then
  pass "the next host is served (--verify)"
else
  tail -n 5 "$W/perf-last.log"; fail "the next host failed"
fi
kill -INT "$TPID"
for _ in $(seq 100); do kill -0 "$TPID" 2>/dev/null || break; sleep 0.2; done
kill -0 "$TPID" 2>/dev/null && { kill -KILL "$TPID"; fail "pollux-tgt did not exit on SIGINT"; }
wait "$TPID"; trc=$?
[ $trc = 0 ] && pass "pollux-tgt exited 0" || fail "pollux-tgt exit $trc"
[ -n "${LAB_OUT:-}" ] && cp "$W"/*.log "$W"/stats.json "$LAB_OUT/" 2>/dev/null
exit $FAILED
