#!/usr/bin/env bash
# Runs inside the lab guest (tests/vm/lab run tests/vm/host-guest.sh PERF TGT PATTERN):
# pollux-perf (our NVMe-oF RDMA host, ibverbs provider, rxe_host,
# $LAB_HOST_ADDR) against
#   1. the Linux kernel target (nvmet + nvmet-rdma via configfs on
#      $LAB_TARGET_ADDR:4420, rxe_tgt) with two subsystems:
#        knull  null_blk ($LAB_NULLB or /dev/nullb0; reads zeros, drops writes)
#        kfile  a 64 MiB file on a fresh tmpfs, filled with PATTERN (the
#               generation-0 pattern of pollux-perf --verify) before export
#      checks: a read of the known data (-w read --verify: read-only compare),
#      write-then-read --verify at 4 KiB QD 32 and 128 KiB QD 8 in
#      register-always + remote invalidation, register-always + local
#      invalidation and pool; a plain randread/randwrite on null_blk; the
#      target saw the I/O (null_blk's block stats, rxe_tgt's packet counters);
#   2. our own pollux-tgt (ibverbs, malloc bdev) with --verify.
# register-always runs fast-register each I/O through type-2 memory windows
# (the ibverbs provider's RegMr). Prints PASS/FAIL per check and a summary;
# exits 1 on any failure (with the tails of the logs and of dmesg).
# Knobs: LAB_USER_HOST_SECS (seconds per pollux-perf run, default 2);
#   LAB_HOST_ONLY=ptgt runs only the pollux-tgt checks (no nvmet);
#   LAB_HOST_PTGT_REPEAT=N runs ptgt-verify-4k-q32-ra-rinv N times (default 3).
set -u
[ "${LAB_IN_GUEST:-}" = 1 ] || { echo "run inside tests/vm/lab" >&2; exit 2; }
PERF=${1:?usage: host-guest.sh PERF TGT PATTERN}
TGT=${2:?usage: host-guest.sh PERF TGT PATTERN}
PATTERN=${3:?usage: host-guest.sh PERF TGT PATTERN}
for f in "$PERF" "$TGT"; do [ -x "$f" ] || { echo "FAIL: $f is not executable"; exit 1; }; done
[ -s "$PATTERN" ] || { echo "FAIL: no pattern file $PATTERN"; exit 1; }
T=$LAB_TARGET_ADDR H=$LAB_HOST_ADDR PORT=4420
CFG=/sys/kernel/config/nvmet
KNULL=nqn.2016-06.io.pollux:knull KFILE=nqn.2016-06.io.pollux:kfile
PNQN=nqn.2016-06.io.pollux:ptgt
SECS=${LAB_USER_HOST_SECS:-2}
ONLY=${LAB_HOST_ONLY:-}
PTGT_REPEAT=${LAB_HOST_PTGT_REPEAT:-3}
NULLB=${LAB_NULLB:-/dev/nullb0}
W=$(mktemp -d /tmp/pollux-host.XXXXXX)
OUTDIR=${LAB_OUT:-$W}
T_ALL=$SECONDS
RESULTS=() FAILED=0 TPID=""
DMESG0=$(dmesg | wc -l)

say()  { echo "[$(date +%T)] $*"; }
pass() { RESULTS+=("PASS  $1 ($2 s)${3:+ $3}"); say "PASS $1 ($2 s)${3:+ $3}"; }
fail() { RESULTS+=("FAIL  $1 ($2 s)${3:+: $3}"); FAILED=1; say "FAIL $1 ($2 s)${3:+: $3}"; }
to() { timeout -k 5 60 "$@"; }
# check NAME CMD...: CMD's output to $W/NAME.log; PASS/FAIL with its last line.
check() {
  local name=$1 t0=$SECONDS rc; shift
  "$@" >"$W/$name.log" 2>&1; rc=$?
  local last  # pollux-perf's table: total IOPS MiB/s avg min p50 p99 p99.9 max busy errors
  last=$(awk '$1 == "total" {printf "IOPS %s, %s MiB/s, avg %.0f us, errors+miscompares %s", $2, $3, $4, $11}' "$W/$name.log")
  if [ $rc = 0 ]; then pass "$name" $((SECONDS - t0)) "${last:+| $last}"; return 0; fi
  fail "$name" $((SECONDS - t0)) "rc=$rc"
  tail -n 20 "$W/$name.log" | sed 's/^/    | /'
  return 1
}
trid() { echo "trtype:rdma adrfam:ipv4 traddr:$T trsvcid:$PORT subnqn:$1"; }
# perf NQN MEM RINV QD SIZE WORKLOAD [extra]: one short pollux-perf run.
perf() {
  local nqn=$1 mem=$2 rinv=$3 qd=$4 bs=$5 w=$6; shift 6
  POLLUX_LOG=${PERF_LOG:-warn} to "$PERF" -r "$(trid "$nqn")" --device "$LAB_HOST_DEV" --cores 0 --mem "$mem" \
    --remote-invalidation "$rinv" -q "$qd" -o "$bs" -w "$w" -t "$SECS" "$@"
}
# env_debug CMD...: CMD with pollux-perf logging at debug (a timed-out
# command's slot state, queue failures)
env_debug() { PERF_LOG=debug "$@"; }
# perf_watch CMD...: CMD in the background; if it still runs 15 s past its
# planned length, print what the verbs objects and pollux-tgt look like
# (hang evidence) before the timeout kills it.
perf_watch() {
  "$@" & local p=$! i
  if [ -n "${LAB_HOST_SNAP:-}" ]; then
    sleep 1; echo "--- snapshot 1 s in: threads, rxe qps, pollux-tgt stats"
    top -b -H -n 1 | head -n 20; rdma res show qp 2>&1 | head -20
    head -c 2000 "$W/ptgt.stats.json" 2>&1; echo
  fi
  local t_end=$((SECONDS + SECS + 15))
  while [ $SECONDS -lt $t_end ] && kill -0 $p 2>/dev/null; do sleep 0.2; done
  if kill -0 $p 2>/dev/null; then
    echo "--- still running after $((SECS + 15)) s: rdma res (qp, mr, cq), ptgt stats, dmesg tail"
    rdma res show qp 2>&1; rdma -d res show mr 2>&1 | head -40; rdma res show cq 2>&1
    rdma statistic show link 2>&1
    cat "$W/ptgt.stats.json" 2>&1 | head -c 3000; echo
    dmesg | tail -n 15
    rdma res show cm_id 2>&1
    local t pp
    for pp in $(pgrep -x pollux-perf) $TPID; do
      for t in /proc/$pp/task/*; do
        echo "task $t $(cat $t/comm) state $(awk '{print $3}' $t/stat) wchan $(cat $t/wchan)"
        cat $t/stack 2>/dev/null | head -12
      done
    done
  fi
  wait $p; local rc=$?
  if [ -n "${LAB_HOST_SNAP:-}" ]; then
    echo "--- rxe counters after the run"; rdma statistic show link 2>&1
  fi
  return $rc
}
# rxe_retries: the host device's retransmission counters (timeouts,
# sequence NAKs, RNR NAKs received).
rxe_retries() {
  rdma statistic show link "$LAB_HOST_DEV/1" |
    grep -oE '(completer_retry_err|rcvd_seq_err|rcvd_rnr_err) [0-9]+' | tr '\n' ' '
}
rxe_rcvd() { rdma statistic show link "$LAB_TARGET_DEV/1" | grep -oE 'rcvd_pkts [0-9]+' | awk '{print $2}'; }
nullb_ios() { awk '{print $1 + $5}' "/sys/block/${NULLB##*/}/stat"; }

# ------------------------------------------------------ kernel nvmet target ---
kernel_target() {
  modprobe -a nvmet nvmet-rdma || return 1
  [ -b "$NULLB" ] || modprobe null_blk nr_devices=1 gb=1
  [ -b "$NULLB" ] || { echo "no null_blk device $NULLB"; return 1; }
  # A real tmpfs: the guest's /tmp overlay reports i_blkbits=0, which nvmet
  # turns into a 1-byte LBA format.
  mkdir -p /run/pollux-host && { mountpoint -q /run/pollux-host || mount -t tmpfs -o size=100M tmpfs /run/pollux-host; } || return 1
  dd if="$PATTERN" of=/run/pollux-host/kfile.img bs=1M conv=fsync status=none || return 1
  cmp "$PATTERN" /run/pollux-host/kfile.img || return 1
  local nqn dev
  for nqn in $KNULL $KFILE; do
    if [ "$nqn" = "$KNULL" ]; then dev=$NULLB; else dev=/run/pollux-host/kfile.img; fi
    mkdir "$CFG/subsystems/$nqn" || return 1
    echo 1 >"$CFG/subsystems/$nqn/attr_allow_any_host"
    mkdir "$CFG/subsystems/$nqn/namespaces/1" || return 1
    echo -n "$dev" >"$CFG/subsystems/$nqn/namespaces/1/device_path" || return 1
    [ "$nqn" = "$KFILE" ] && echo 1 >"$CFG/subsystems/$nqn/namespaces/1/buffered_io"
    echo 1 >"$CFG/subsystems/$nqn/namespaces/1/enable" || return 1
  done
  mkdir "$CFG/ports/1" || return 1
  echo rdma >"$CFG/ports/1/addr_trtype"; echo ipv4 >"$CFG/ports/1/addr_adrfam"
  echo "$T" >"$CFG/ports/1/addr_traddr"; echo "$PORT" >"$CFG/ports/1/addr_trsvcid"
  [ -e "$CFG/ports/1/param_inline_data_size" ] && echo "param_inline_data_size=$(cat "$CFG/ports/1/param_inline_data_size")"
  for nqn in $KNULL $KFILE; do
    ln -s "$CFG/subsystems/$nqn" "$CFG/ports/1/subsystems/$nqn" || return 1
  done
  echo "nvmet: $KNULL ($NULLB), $KFILE (tmpfs file, $(stat -c %s /run/pollux-host/kfile.img) bytes) on rdma $T:$PORT"
}
kernel_teardown() {
  [ -d "$CFG/ports/1" ] || [ -d "$CFG/subsystems/$KNULL" ] || [ -d "$CFG/subsystems/$KFILE" ] || return 0
  local nqn
  for nqn in $KNULL $KFILE; do rm -f "$CFG/ports/1/subsystems/$nqn"; done
  rmdir "$CFG/ports/1" 2>/dev/null
  for nqn in $KNULL $KFILE; do
    [ -d "$CFG/subsystems/$nqn" ] || continue
    echo 0 >"$CFG/subsystems/$nqn/namespaces/1/enable" 2>/dev/null
    rmdir "$CFG/subsystems/$nqn/namespaces/1" "$CFG/subsystems/$nqn" 2>/dev/null
  done
  umount /run/pollux-host 2>/dev/null
  return 0
}
# io_seen WHAT BEFORE AFTER: the target side counted I/O.
io_seen() { echo "$1: $2 -> $3"; [ "$3" -gt "$2" ]; }

# ------------------------------------------------------------- pollux-tgt ---
start_tgt() {
  cat >"$W/ptgt.toml" <<EOF
cores = "1"
provider = "ibverbs"

[transport]
max_queue_depth = 128
max_io_size = "128k"
io_unit_size = "32k"
in_capsule_data_size = 8192
num_shared_buffers = 1024
max_srq_depth = 1024
device = "$LAB_TARGET_DEV"

[[bdev]]
spec = "malloc:name=Malloc0,size=64M,block=512"

[[subsystem]]
nqn = "$PNQN"
serial = "POLLUXHOST0"
model = "Pollux host interop"
allow_any_host = true
namespaces = [{ bdev = "Malloc0", nsid = 1 }]

[[listener]]
traddr = "$T"
trsvcid = "$PORT"
EOF
  # debug: queue teardown reasons (failed work requests, bad capsules) land in ptgt.log
  POLLUX_LOG=debug "$TGT" -c "$W/ptgt.toml" --stats-file "$W/ptgt.stats.json" >"$W/ptgt.log" 2>&1 </dev/null &
  TPID=$!
  for _ in $(seq 300); do
    grep -q 'pollux-tgt: ready' "$W/ptgt.log" && return 0
    kill -0 "$TPID" 2>/dev/null || break
    sleep 0.2
  done
  cat "$W/ptgt.log"; return 1
}
stop_tgt() {
  [ -n "$TPID" ] || return 0
  kill -INT "$TPID" 2>/dev/null
  for _ in $(seq 100); do kill -0 "$TPID" 2>/dev/null || break; sleep 0.2; done
  kill -0 "$TPID" 2>/dev/null && { kill -KILL "$TPID"; echo "pollux-tgt did not exit on SIGINT"; }
  wait "$TPID"; local rc=$?
  TPID=""
  cp "$W/ptgt.log" "$OUTDIR/" 2>/dev/null
  return $rc
}

finish() {
  stop_tgt >/dev/null 2>&1
  kernel_teardown
  cp "$W"/*.log "$OUTDIR/" 2>/dev/null
  echo
  echo "================ pollux-perf NVMe-oF/RDMA host interop summary ================"
  printf '%s\n' "${RESULTS[@]}"
  local np nf
  np=$(printf '%s\n' "${RESULTS[@]}" | grep -c '^PASS')
  nf=$(printf '%s\n' "${RESULTS[@]}" | grep -c '^FAIL')
  echo "total: $np passed, $nf failed, $((SECONDS - T_ALL)) s (kernel $(uname -r))"
  if [ "$FAILED" != 0 ] || [ "$nf" != 0 ]; then
    echo "--- dmesg since the start (tail)"; dmesg | tail -n +"$((DMESG0 + 1))" | tail -n 60
    echo "host-interop: FAILED"; exit 1
  fi
  echo "host-interop: ALL PASSED"; exit 0
}
trap 'fail interrupted 0; finish' INT TERM

# ------------------------------------------------------------------ checks ---
say "pollux-perf $PERF vs nvmet-rdma and pollux-tgt, ${SECS} s per run"
if [ "$ONLY" != ptgt ] && check knl-target kernel_target; then
  # Known data first (before any write): read-only compare with the
  # generation-0 pattern the file was filled with.
  check kfile-read-known-4k-q16-pool perf $KFILE pool on 16 4096 read --verify
  check kfile-read-known-128k-q8-pool perf $KFILE pool on 8 131072 randread --verify
  check kfile-read-known-4k-q16-ra-rinv perf $KFILE register-always on 16 4096 randread --verify
  r0=$(rxe_rcvd)
  for mode in "register-always on" "register-always off" "pool on"; do
    set -- $mode
    tag=$([ "$1" = pool ] && echo pool || { [ "$2" = on ] && echo ra-rinv || echo ra-linv; })
    check "kfile-verify-4k-q32-$tag" perf $KFILE "$1" "$2" 32 4096 write --verify
    check "kfile-verify-128k-q8-$tag" perf $KFILE "$1" "$2" 8 131072 randwrite --verify
  done
  r1=$(rxe_rcvd)
  check kfile-target-saw-io io_seen "rxe_tgt rcvd_pkts" "${r0:-0}" "${r1:-0}"
  n0=$(nullb_ios)
  check knull-randread-4k-q32-ra-rinv perf $KNULL register-always on 32 4096 randread
  check knull-randwrite-128k-q8-ra-linv perf $KNULL register-always off 8 131072 randwrite
  check knull-randrw-4k-q16-pool perf $KNULL pool on 16 4096 randrw
  n1=$(nullb_ios)
  check knull-target-saw-io io_seen "${NULLB##*/} reads+writes" "${n0:-0}" "${n1:-0}"
fi
kernel_teardown

if check ptgt-start start_tgt; then
  # Register-always binds a memory window per I/O; rxe replays binds when
  # it retransmits (see FastRegMode::MemoryWindow), which pollux-perf
  # works around. The host's rxe retry counters show whether this boot's
  # runs met retransmissions at all.
  rt0=$(rxe_retries)
  for i in $(seq "$PTGT_REPEAT"); do
    n=ptgt-verify-4k-q32-ra-rinv; [ "$PTGT_REPEAT" = 1 ] || n=$n-$i
    check "$n" perf_watch env_debug perf $PNQN register-always on 32 4096 write --verify
  done
  say "host rxe retransmission counters over the remote-invalidation runs: $rt0 -> $(rxe_retries)"
  check ptgt-verify-128k-q8-ra-linv perf $PNQN register-always off 8 131072 randwrite --verify
  check ptgt-verify-4k-q16-pool perf $PNQN pool on 16 4096 randwrite --verify
  check ptgt-verify-128k-q8-pool perf $PNQN pool on 8 131072 write --verify
  check ptgt-stop stop_tgt
fi
finish
