#!/usr/bin/env bash
# Runs inside the lab guest (tests/vm/lab run tests/vm/nvmf-guest.sh TGT_BIN):
# pollux-tgt (ibverbs provider, rxe_tgt, $LAB_TARGET_ADDR:4420, malloc bdev)
# against the Linux kernel NVMe-oF RDMA host (nvme-cli + nvme_rdma, rxe_host,
# $LAB_HOST_ADDR). Four target runs in one boot:
#   base     discover, connect, id-ctrl/id-ns, fio crc32c verify at 512 B,
#            4 KiB, 16 KiB, 128 KiB (randwrite+verify, then a randread verify
#            pass over the same blocks), QD 32; disconnect, reconnect, disconnect
#   inline16 in_capsule_data_size = 16384: IOCCSZ, 16 KiB writes in-capsule
#   nosrq    no_srq = true: short fio
#   kaaer    keep-alive and asynchronous events: connect with
#            --keep-alive-tmo=5, Keep Alives counted in the stats file over
#            > 2 periods; a namespace added to the config + SIGHUP reaches the
#            connected host as an AEN (the new namespace shows up without a
#            reconnect); the host silent > KATO (netem loss 100%): the target
#            tears the controller down (keep_alive_timeouts), the host
#            reconnects once its traffic flows again and a fio verify passes;
#            the target runs --idle adaptive:0 (LAB_USER_NVMF_IDLE overrides)
#            and must sleep while the host is connected and idle
#   The base run also checks conformance as nvme-cli and the block layer see
#   it: id-ctrl VER 1.4 and the fields 1.4 needs (CNTRLTYPE, CTRATT, OAES,
#   LPA, VWC), id-ns NSFEAT bit 4 with NPWG/NPWA/NPDG/NPDA/NOWS, the
#   discovery entry's TREQ decoded by nvme-cli, `nvme effects-log`, `nvme
#   smart-log` counters moving with I/O, `blkdiscard`, and ext4 on the
#   namespace with `fstrim` (Dataset Management with Linux's 4 KiB buffer).
#   stalls   the same fio mix (randrw 4k-128k, QD 16, STALL_SECS s) against
#            the kernel target (nvmet-rdma, a 64 MiB ramdisk, port 4421) and
#            against pollux-tgt variants: stalls (host error recoveries) per
#            1,000 I/Os each, with the rxe counters and the kernel's
#            `rxe_reg_fast_mr ... not free` lines (a measurement: printed)
# Prints one PASS/FAIL line per check and a summary; exits 1 on any failure
# (with the tails of the target log and of dmesg).
# Knobs (env, via --env or LAB_USER_*): LAB_USER_NVMF_SCALE (size multiplier
# for fio, default 1), LAB_USER_NVMF_IDLE (pollux-tgt --idle, default busy),
# LAB_USER_NVMF_RUNS (subset of "base inline16 nosrq kaaer stalls"),
# LAB_USER_NVMF_STALL_SECS (fio seconds per stall measurement, default 20),
# LAB_USER_NVMF_STALL_VARIANTS (subset of "nvmet busy norps nice noinv
# adaptive", default "nvmet busy norps": the kernel target; pollux-tgt as
# configured; the same with receive packet steering off on both veth ends,
# which the lab turns on; at nice 19, below the kernel's softirq threads;
# without SEND_WITH_INVALIDATE; --idle adaptive: the RDMA poll group holds
# its reactor awake while its queues have work in flight, so under fio the
# target polls as in busy mode).
set -u
[ "${LAB_IN_GUEST:-}" = 1 ] || { echo "run inside tests/vm/lab" >&2; exit 2; }
TGT=${1:?usage: nvmf-guest.sh PATH/TO/pollux-tgt}
[ -x "$TGT" ] || { echo "FAIL: $TGT is not executable"; exit 1; }
T=$LAB_TARGET_ADDR H=$LAB_HOST_ADDR PORT=4420
NQN=nqn.2016-06.io.pollux:interop0
SCALE=${LAB_USER_NVMF_SCALE:-1}
IDLE=${LAB_USER_NVMF_IDLE:-busy}
RUNS=${LAB_USER_NVMF_RUNS:-base inline16 nosrq pi kaaer stalls}
STALL_SECS=${LAB_USER_NVMF_STALL_SECS:-20}
STALL_VARIANTS=${LAB_USER_NVMF_STALL_VARIANTS:-nvmet busy norps}
W=$(mktemp -d /tmp/pollux-nvmf.XXXXXX)
OUTDIR=${LAB_OUT:-$W}
T_ALL=$SECONDS
RESULTS=() FAILED=0 TPID="" RUN=""
NS1='{ bdev = "Malloc0", nsid = 1 }' NSLIST=""

say()  { echo "[$(date +%T)] $*"; }
pass() { RESULTS+=("PASS  $RUN/$1 ($2 s)"); say "PASS $RUN/$1 ($2 s)"; }
fail() { RESULTS+=("FAIL  $RUN/$1${3:+: $3}"); FAILED=1; say "FAIL $RUN/$1 ($2 s)${3:+: $3}"; }
# check NAME LIMIT CMD...: runs CMD (a function, in this shell) with output to
# $W/RUN-NAME.log; every external command in it runs under `to`, bounded by LIMIT.
LIM=60
to() { timeout -k 5 "$LIM" "$@"; }
# rxe error/retry counters of both ports and the kernel's packet drops, as
# NAME=VALUE words (only the non-zero ones)
counters() {
  local d
  for d in "$LAB_TARGET_DEV" "$LAB_HOST_DEV"; do
    rdma statistic show link "$d/1" 2>/dev/null | tr ' ' '\n' | paste -d= - - |
      grep -E '^(duplicate_request|out_of_seq_request|rcvd_rnr_err|send_rnr_err|rcvd_seq_err|retry_exceeded_err|retry_rnr_exceeded_err|completer_retry_err|send_err|link_downed)=' |
      grep -v '=0$' | sed "s/^/${d#rxe_}./"
  done
  local a b r=0
  while read -r a b _; do r=$((r + 0x$b)); done </proc/net/softnet_stat
  [ "$r" = 0 ] || echo "softnet_dropped=$r"
}
check() {
  local name=$1 t0=$SECONDS rc c0 c1; LIM=$2; shift 2
  c0=$(counters | tr '\n' ' ')
  "$@" >"$W/$RUN-$name.log" 2>&1; rc=$?
  c1=$(counters | tr '\n' ' ')
  [ "$c0" = "$c1" ] || say "  counters: $c1 (before: ${c0:-none})"
  grep -hE '^ +(write|read): IOPS=|^ +(clat|lat) \((u|m)sec\): min' "$W/$RUN-$name.log" | sed 's/^ */  fio: /'
  if [ $rc = 0 ]; then pass "$name" $((SECONDS - t0)); return 0; fi
  fail "$name" $((SECONDS - t0)) "rc=$rc"
  tail -n 25 "$W/$RUN-$name.log" | sed 's/^/    | /'
  return 1
}

# ------------------------------------------------------------------ target ---
start_tgt() {  # start_tgt RUN IN_CAPSULE NO_SRQ [EXTRA_TRANSPORT_LINE] (IDLE from $RUN_IDLE or $IDLE)
  RUN=$1
  cat >"$W/$RUN.toml" <<EOF
cores = "0"
provider = "ibverbs"

[transport]
max_queue_depth = 128
max_io_size = "128k"
io_unit_size = "32k"
in_capsule_data_size = $2
num_shared_buffers = 1024
max_srq_depth = 1024
no_srq = $3
device = "$LAB_TARGET_DEV"
${4:-}

[[bdev]]
spec = "malloc:name=Malloc0,size=64M,block=512"

[[bdev]]
spec = "malloc:name=Malloc1,size=16M,block=512"

${EXTRA_BDEVS:-}

[[subsystem]]
nqn = "$NQN"
serial = "POLLUXINTEROP0"
model = "Pollux interop"
allow_any_host = true
namespaces = [${NSLIST:-$NS1}]

[[listener]]
traddr = "$T"
trsvcid = "$PORT"
EOF
  local t0=$SECONDS
  nice -n "${RUN_NICE:-0}" "$TGT" -c "$W/$RUN.toml" --cores 0 --idle "${RUN_IDLE:-$IDLE}" --stats-file "$W/$RUN.stats.json" \
    >"$W/$RUN.tgt.log" 2>&1 </dev/null &
  TPID=$!
  for _ in $(seq 300); do
    grep -q 'pollux-tgt: ready' "$W/$RUN.tgt.log" && { pass tgt-ready $((SECONDS - t0)); return 0; }
    kill -0 "$TPID" 2>/dev/null || break
    sleep 0.2
  done
  fail tgt-ready $((SECONDS - t0)) "no 'ready' in 60 s"; sed 's/^/    | /' "$W/$RUN.tgt.log"
  stop_tgt quiet; return 1
}
stop_tgt() {
  [ -n "$TPID" ] || return 0
  local t0=$SECONDS rc
  kill -INT "$TPID" 2>/dev/null
  for _ in $(seq 100); do kill -0 "$TPID" 2>/dev/null || break; sleep 0.2; done
  if kill -0 "$TPID" 2>/dev/null; then
    kill -KILL "$TPID"; wait "$TPID" 2>/dev/null
    [ "${1:-}" = quiet ] || fail tgt-stop $((SECONDS - t0)) "did not exit in 20 s after SIGINT"
  else
    wait "$TPID"; rc=$?
    if [ "${1:-}" != quiet ]; then
      if [ $rc = 0 ]; then pass tgt-stop $((SECONDS - t0)); else fail tgt-stop $((SECONDS - t0)) "exit $rc"; fi
    fi
  fi
  cp "$W/$RUN.tgt.log" "$W/$RUN.stats.json" "$OUTDIR/" 2>/dev/null
  TPID=""
}

# -------------------------------------------------------------------- host ---
CTRL="" NS=""
discover() {
  to nvme discover -t rdma -a "$T" -s "$PORT" -w "$H" || return 1
  local log; log=$(to nvme discover -t rdma -a "$T" -s "$PORT" -w "$H" -o json) || return 1
  echo "$log"
  grep -q "\"subnqn\" *: *\"$NQN\"" <<<"$log" || { echo "discovery log lacks $NQN"; return 1; }
  grep -q '"trtype" *: *"rdma"' <<<"$log" || { echo "discovery log: trtype not rdma"; return 1; }
  grep -q "\"traddr\" *: *\"$T\"" <<<"$log" || { echo "discovery log: traddr not $T"; return 1; }
  grep -q "\"trsvcid\" *: *\"$PORT\"" <<<"$log" || { echo "discovery log: trsvcid not $PORT"; return 1; }
  # TREQ as nvme-cli decodes it (4: "not specified, sq flow control disable
  # supported", the Linux target's default; 6 would print "unrecognized")
  local treq; treq=$(grep -o '"treq" *: *"[^"]*"' <<<"$log" | sort -u)
  echo "treq: $treq"
  [ -n "$treq" ] && ! grep -qi unrecognized <<<"$treq" || { echo "TREQ not decoded by nvme-cli"; return 1; }
  grep -q 'sq flow control disable supported' <<<"$treq" || { echo "TREQ lacks SQ flow control disable"; return 1; }
}
find_dev() {  # sets CTRL (nvmeX) and NS (block device name)
  local c s
  CTRL="" NS=""
  for c in /sys/class/nvme/nvme*; do
    [ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$NQN" ] && [ "$(cat "$c/state" 2>/dev/null)" = live ] && CTRL=${c##*/}
  done
  [ -n "$CTRL" ] || return 1
  for s in /sys/class/nvme-subsystem/nvme-subsys* /sys/class/nvme/"$CTRL"; do
    [ "$(cat "$s/subsysnqn" 2>/dev/null)" = "$NQN" ] || continue
    NS=$(ls "$s" | grep -E '^nvme[0-9]+n[0-9]+$' | head -1)
    [ -n "$NS" ] && [ -b "/dev/$NS" ] && return 0
  done
  return 1
}
connect() {  # connect [nvme connect options]
  to nvme connect -t rdma -n "$NQN" -a "$T" -s "$PORT" -w "$H" "$@" || return 1
  for _ in $(seq 150); do find_dev && break; sleep 0.2; done
  [ -n "$NS" ] || { echo "no live controller/namespace for $NQN"; ls /sys/class/nvme /sys/block; return 1; }
  echo "controller /dev/$CTRL ($(cat /sys/class/nvme/$CTRL/transport) $(cat /sys/class/nvme/$CTRL/address)), namespace /dev/$NS, $(blockdev --getsize64 /dev/$NS) bytes"
}
disconnect() {
  to nvme disconnect -n "$NQN" || return 1
  for _ in $(seq 100); do
    grep -qx "$NQN" /sys/class/nvme/nvme*/subsysnqn 2>/dev/null || return 0
    sleep 0.2
  done
  echo "controller still present after disconnect"; return 1
}
id_ctrl() {
  to nvme id-ctrl "/dev/$CTRL" >"$W/id-ctrl.txt" || return 1
  cat "$W/id-ctrl.txt"
  local sn cntlid ioccsz iorcsz
  sn=$(awk -F: '$1 ~ /^sn /{gsub(/ /,"",$2); print $2}' "$W/id-ctrl.txt")
  [ "$sn" = POLLUXINTEROP0 ] || { echo "id-ctrl sn '$sn'"; return 1; }
  grep -qE '^subnqn +: '"$NQN"'$' "$W/id-ctrl.txt" || { echo "id-ctrl subnqn"; return 1; }
  cntlid=$(cat /sys/class/nvme/$CTRL/cntlid)
  ioccsz=$(awk -F: '$1 ~ /^ioccsz /{print $2+0}' "$W/id-ctrl.txt")
  iorcsz=$(awk -F: '$1 ~ /^iorcsz /{print $2+0}' "$W/id-ctrl.txt")
  echo "cntlid=$cntlid ioccsz=$ioccsz iorcsz=$iorcsz"
  [ "$iorcsz" = 1 ] || { echo "IORCSZ $iorcsz != 1"; return 1; }
  [ -z "${WANT_IOCCSZ:-}" ] || [ "$ioccsz" = "$WANT_IOCCSZ" ] || { echo "IOCCSZ $ioccsz != $WANT_IOCCSZ"; return 1; }
}
id_ns() {
  to nvme id-ns "/dev/$NS" >"$W/id-ns.txt" || return 1
  cat "$W/id-ns.txt"
  local nsze; nsze=$(awk -F: '$1 ~ /^nsze /{print $2}' "$W/id-ns.txt" | tr -d ' ')
  [ $((nsze)) = $((64 * 2048)) ] || { echo "nsze $nsze != 131072 (64 MiB of 512 B)"; return 1; }
  grep -qE '^lbaf +0 +: ms:0 +lbads:9 .*in use' "$W/id-ns.txt" || { echo "lbaf 0 not 512 B in use"; return 1; }
}
# fio_verify BS SIZE [extra fio args]: random writes with crc32c headers,
# read back and checked (do_verify), then a read-only verify pass over the
# same random block sequence (verify_only), QD 32 both.
fio_verify() {
  local bs=$1 size=$2; shift 2
  local common=(--filename="/dev/$NS" --ioengine=libaio --direct=1 --rw=randwrite --bs="$bs"
                --iodepth=32 --size="$size" --verify=crc32c --randrepeat=1 --randseed=4242
                --verify_fatal=1 --verify_state_save=0 --group_reporting "$@")
  to fio --name="w$bs" "${common[@]}" --do_verify=1 || return 1
  to fio --name="r$bs" "${common[@]}" --verify_only=1 || return 1
}
# fio_timed BS SECS: randread, QD 32, no verify (throughput only)
fio_timed() {
  to fio --name="rr$1" --filename="/dev/$NS" --ioengine=libaio --direct=1 --rw=randread --bs="$1" \
      --iodepth=32 --time_based --runtime="$2" --size=64M
}
# pkts_per_write BS N: N random writes of BS (no verify, QD 32); prints the
# packets rxe_tgt sent per write. An RDMA READ costs the target one more
# packet per write (the READ request) than in-capsule data does. Only those
# writes may run in the window: udev probes the device (blkid reads) after
# every close of a writer, and the read data the target sends (RDMA WRITEs,
# one packet per KiB) would count too, more or less of it by timing (seen:
# 54 and 105 reads in one window; 656 and 1110 per 100 in-capsule writes).
# Holding udev's event queue is not enough: udevd itself re-reads the
# partition table (BLKRRPART, 6 reads here) on the close. So udev settles
# first, udevd is stopped (SIGSTOP) during the window, and a window in which
# the block layer still completed a read, or rxe retransmitted (duplicate
# requests and their ACKs, seen: 66 in one window), is measured again.
pkt() { rdma statistic show link "$LAB_TARGET_DEV/1" | grep -oE 'sent_pkts [0-9]+' | awk '{print $2}'; }
# blk_io: reads and writes completed on the NVMe block devices (namespace
# heads and their paths; the guest has no other NVMe disk)
blk_io() { cat /sys/block/nvme*/stat 2>/dev/null | awk '{r += $1; w += $5} END {print r + 0, w + 0}'; }
pkts_per_write() {
  local p0 p1 r0 w0 r1 w1 rc try pids c0 c1
  for try in 1 2 3; do
    sleep 1
    udevadm settle -t 60 || echo "udevadm settle: timed out"
    pids=$(pidof systemd-udevd udevd) || echo "no udevd"
    [ -z "$pids" ] || kill -STOP $pids
    c0=$(counters | tr '\n' ' '); read -r r0 w0 < <(blk_io); p0=$(pkt)
    to fio --name="pw$1" --filename="/dev/$NS" --ioengine=libaio --direct=1 --rw=randwrite --bs="$1" \
       --iodepth=32 --number_ios="$2" --size=64M >/dev/null; rc=$?
    p1=$(pkt); read -r r1 w1 < <(blk_io); c1=$(counters | tr '\n' ' ')
    [ -z "$pids" ] || kill -CONT $pids
    [ $rc = 0 ] || return 1
    echo "try $try: rxe_tgt sent $((p1 - p0)) packets; block layer: $((r1 - r0)) reads, $((w1 - w0)) writes"
    [ "$c0" = "$c1" ] || echo "  rxe retransmitted: $c1 (before: ${c0:-none})"
    [ $((r1 - r0)) = 0 ] && [ "$c0" = "$c1" ] && break
  done
  [ $((r1 - r0)) = 0 ] && [ "$c0" = "$c1" ] ||
    { echo "reads or retransmissions in every window: the count is not the writes' alone"; return 1; }
  echo "$(( (p1 - p0) * 100 / $2 ))" >"$W/ppw"
  echo "rxe_tgt sent $((p1 - p0)) packets for $2 writes of $1: $(cat "$W/ppw") per 100 writes"
}
# no_nvme_errors DMESG_LINES COUNTERS: dmesg since line DMESG_LINES has no nvme
# error/timeout/reset line. Tolerated (a WARN line, status 0): I/O timeouts
# that the host recovered by reconnecting while the rxe retransmission
# counters moved (COUNTERS: their value at the run's start) and every fio
# verify passed: after a retransmission Debian 6.1 rxe carries out the
# host's already executed REG_MRs again (`rxe_reg_fast_mr ... not free`),
# which stalls the queue (a kernel bug on the host side; see
# tests/vm/README.md, "rxe replays local operations"). When the replayed
# REG_MR fails outright the host's queue is flushed instead of timing out
# (`SEND for CQE ... failed with status WR flushed`). Either pattern is
# tolerated only with the kernel's own evidence of the replay in the same
# run: the `rxe_reg_fast_mr: mr->lkey = ... not free` line. Without it a
# timeout or a flush fails the run.
no_nvme_errors() {
  local new; new=$(dmesg | tail -n +"$(( $1 + 1 ))" | grep -iE 'nvme.*(error|reset|reconnect|timeout|failed|abort)|rdma.*err' )
  [ -z "$new" ] && return 0
  echo "$new" | head -n 40
  dmesg | tail -n +"$(( $1 + 1 ))" | grep -E 'rdma_rxe|Successfully reconnected'
  if ! dmesg | tail -n +"$(( $1 + 1 ))" | grep -q 'rxe_reg_fast_mr: mr->lkey = .* not free'; then
    echo "nvme errors without the kernel's rxe_reg_fast_mr replay line: not tolerated"
    return 1
  fi
  local flushed='|(SEND|RECV|MEMREG|LOCAL_INV) for CQE 0x[0-9a-f]+ failed with status WR flushed'
  if [ "$(counters | tr '\n' ' ')" != "$2" ] && ! grep -qE '^FAIL  '"$RUN"'/fio' <(printf '%s\n' "${RESULTS[@]}") &&
     dmesg | tail -n +"$(( $1 + 1 ))" | grep -q 'Successfully reconnected' &&
     ! grep -viE 'I/O [0-9]+ QID [0-9]+ timeout|starting error recovery|Reconnecting in|Successfully reconnected|I/O Error \(sct 0x3 / sc 0x71\)|I/O error, dev|path - requeuing'"$flushed" <<<"$new" | grep -q .; then
    RESULTS+=("WARN  $RUN/no-nvme-errors: I/O timeout or flush + reconnect after rxe retransmissions replayed the host's REG_MR (tolerated, see README)")
    say "WARN $RUN: I/O timeout or flush recovered by reconnect after rxe retransmissions (tolerated)"
    return 0
  fi
  return 1
}
# tstat NAME: a counter of the running target's stats file
# (sed, not python: an interpreter start costs seconds under TCG)
tstat() { local v; v=$(sed -nE 's/.*"'"$1"'":([0-9]+).*/\1/p' "$W/$RUN.stats.json"); echo "${v:--1}"; }
# keep_alives: Keep Alive commands reach the target every KATO/2 or faster
# (and, on a target in a sleeping idle mode, its reactor sleeps between
# them: the host idle but connected, with AERs outstanding, lets the RDMA
# poll group arm its CQ; the 100 ms tick wakes it about ten times a second)
tsleeps() { local v; v=$(sed -nE 's/.*"sleeps":\[([0-9]+).*/\1/p' "$W/$RUN.stats.json"); echo "${v:--1}"; }
tcpu() { awk '{print $14 + $15}' "/proc/$TPID/stat" 2>/dev/null || echo 0; }  # user+sys ticks
keep_alives() {
  local a b s0 s1 c0 c1; a=$(tstat keep_alives); s0=$(tsleeps); c0=$(tcpu)
  sleep 11
  b=$(tstat keep_alives); s1=$(tsleeps); c1=$(tcpu)
  echo "keep_alives: $a -> $b in 11 s (kato 5 s); reactor sleeps $s0 -> $s1 (--idle ${RUN_IDLE:-$IDLE});" \
    "pollux-tgt CPU $(( (c1 - c0) * 100 / ($(getconf CLK_TCK) * 11) )) % of a vCPU"
  [ "$a" -ge 0 ] && [ $((b - a)) -ge 2 ] || return 1
  case ${RUN_IDLE:-$IDLE} in
    busy) ;;
    *) [ "$s0" -ge 0 ] && [ $((s1 - s0)) -ge 20 ] || { echo "the idle target did not sleep"; return 1; } ;;
  esac
}
# ns_event: add namespace 2 to the config, SIGHUP; the host sees it through
# an asynchronous event (no reconnect: same controller, same cntlid)
ns_event() {
  local cntlid ev0 n
  cntlid=$(cat /sys/class/nvme/$CTRL/cntlid); ev0=$(tstat async_events)
  NSLIST='{ bdev = "Malloc0", nsid = 1 }, { bdev = "Malloc1", nsid = 2 }'
  sed -i "s/^namespaces = .*/namespaces = [$NSLIST]/" "$W/$RUN.toml"
  grep '^namespaces' "$W/$RUN.toml"
  kill -HUP "$TPID" || return 1
  for _ in $(seq 100); do grep -q 'pollux-tgt: reloaded' "$W/$RUN.tgt.log" && break; sleep 0.2; done
  grep 'pollux-tgt: reload' "$W/$RUN.tgt.log" || { echo "no reload line"; return 1; }
  for _ in $(seq 100); do
    n=$(ls /sys/class/nvme/$CTRL /sys/class/nvme-subsystem/*/ 2>/dev/null | grep -cE '^nvme[0-9]+(c[0-9]+)?n2$')
    [ "$n" -gt 0 ] && break; sleep 0.2
  done
  to nvme list-ns "/dev/$CTRL"
  echo "namespace 2 nodes: $n; async_events: $ev0 -> $(tstat async_events); cntlid $cntlid -> $(cat /sys/class/nvme/$CTRL/cntlid), state $(cat /sys/class/nvme/$CTRL/state)"
  [ "$n" -gt 0 ] || { echo "namespace 2 did not appear"; return 1; }
  [ "$(tstat async_events)" -gt "$ev0" ] || { echo "no event counted"; return 1; }
  [ "$(cat /sys/class/nvme/$CTRL/cntlid)" = "$cntlid" ] || { echo "the host reconnected"; return 1; }
  dmesg | grep -iE 'nvme.*(rescan|namespace|changed)' | tail -n 5
}
# kato_expiry: the host goes silent for 9 s (> KATO 5 s: netem drops all it
# sends; an administrative link down would also flush the lab's policy
# routes and disturb the rxe ports): the target tears the controller down;
# the host reconnects once its traffic flows again
kato_expiry() {
  local t0 c0; t0=$(tstat keep_alive_timeouts); c0=$(cat /sys/class/nvme/$CTRL/cntlid)
  modprobe sch_netem 2>/dev/null
  tc qdisc add dev "$LAB_HOST_IF" root netem loss 100% || return 1
  sleep 9
  echo "keep_alive_timeouts while the host was silent: $t0 -> $(tstat keep_alive_timeouts), host state $(cat /sys/class/nvme/$CTRL/state)"
  tc qdisc del dev "$LAB_HOST_IF" root || return 1
  [ "$(tstat keep_alive_timeouts)" -gt "$t0" ] || { echo "the target did not time the controller out"; return 1; }
  for _ in $(seq 300); do [ "$(cat /sys/class/nvme/$CTRL/state 2>/dev/null)" = live ] && break; sleep 0.2; done
  echo "host state $(cat /sys/class/nvme/$CTRL/state), cntlid $c0 -> $(cat /sys/class/nvme/$CTRL/cntlid)"
  dmesg | grep -iE 'nvme.*(keep-alive|reconnect|reset)' | tail -n 6
  [ "$(cat /sys/class/nvme/$CTRL/state)" = live ]
}
# le FILE OFFSET BYTES: the unsigned little-endian integer at OFFSET
le() { od -An -t u"$3" -j "$2" -N "$3" "$1" | tr -d ' \n'; }
# id_dump CMD DEV FIELDS: `nvme CMD DEV` raw into $W/CMD.bin, and the
# lines of FIELDS (a regex) as nvme-cli decodes them (-H)
id_dump() {
  to nvme "$1" "$2" -o binary >"$W/$1.bin" || return 1
  to nvme "$1" "$2" -H >"$W/$1-H.txt" || return 1
  grep -iE "$3" "$W/$1-H.txt"
}
# id_conformance: Identify Controller/Namespace fields of NVMe 1.4, read
# raw (nvme-cli -o binary) and as nvme-cli decodes them (-H)
id_conformance() {
  id_dump id-ctrl "/dev/$CTRL" '^(ver|cntrltype|ctratt|oaes|lpa|vwc|sgls|mdts) ' || return 1
  local ver ct ctratt oaes lpa vwc
  ver=$(le "$W/id-ctrl.bin" 80 4) ct=$(le "$W/id-ctrl.bin" 111 1) ctratt=$(le "$W/id-ctrl.bin" 96 4)
  oaes=$(le "$W/id-ctrl.bin" 92 4) lpa=$(le "$W/id-ctrl.bin" 261 1) vwc=$(le "$W/id-ctrl.bin" 525 1)
  printf 'VER %#x CNTRLTYPE %d CTRATT %#x OAES %#x LPA %#x VWC %#x\n' "$ver" "$ct" "$ctratt" "$oaes" "$lpa" "$vwc"
  [ "$ver" = $((0x10400)) ] || { echo "VER is not 1.4.0"; return 1; }
  [ "$ct" = 1 ] || { echo "CNTRLTYPE $ct != 1 (I/O controller)"; return 1; }
  [ $((ctratt & 1)) = 1 ] || { echo "CTRATT lacks the 128-bit host id"; return 1; }
  [ $((oaes & 0x100)) != 0 ] || { echo "OAES lacks namespace attribute notices"; return 1; }
  [ $((lpa & 2)) = 2 ] || { echo "LPA lacks the effects log"; return 1; }
  [ "$vwc" = 5 ] || { echo "VWC $vwc != 5"; return 1; }
  id_dump id-ns "/dev/$NS" '^(nsfeat|npwg|npwa|npdg|npda|nows) |Optimal|NPWG' || return 1
  local nsfeat npwg npwa npdg npda nows
  nsfeat=$(le "$W/id-ns.bin" 24 1) npwg=$(le "$W/id-ns.bin" 64 2) npwa=$(le "$W/id-ns.bin" 66 2)
  npdg=$(le "$W/id-ns.bin" 68 2) npda=$(le "$W/id-ns.bin" 70 2) nows=$(le "$W/id-ns.bin" 72 2)
  echo "NSFEAT $nsfeat NPWG $npwg NPWA $npwa NPDG $npdg NPDA $npda NOWS $nows"
  [ $((nsfeat & 16)) = 16 ] || { echo "NSFEAT bit 4 clear"; return 1; }
  [ "$npwg $npwa $npdg $npda $nows" = "7 7 7 7 255" ] || { echo "optimal-I/O hints not 4 KiB / 128 KiB"; return 1; }
  # the kernel took NOWS as the optimal I/O size ((NOWS + 1) * 512)
  local opt; opt=$(cat "/sys/block/$NS/queue/optimal_io_size")
  echo "block layer: optimal_io_size $opt, physical_block_size $(cat "/sys/block/$NS/queue/physical_block_size")"
  [ "$opt" = 131072 ] || { echo "optimal_io_size $opt != 131072"; return 1; }
}
# effects_log: `nvme effects-log` works; Write and DSM change block content
# (--csi=0: without it Debian's nvme-cli 2.4 reads CAP from a PCI BAR, finds
# none on a fabrics controller and prints nothing, with status 0, or 1 for
# -o binary, against any target)
effects_log() {
  to nvme effects-log "/dev/$CTRL" --csi=0 >"$W/effects.txt" || return 1
  cat "$W/effects.txt"
  grep -q . "$W/effects.txt" || { echo "empty effects log output"; return 1; }
  to nvme effects-log "/dev/$CTRL" --csi=0 -o binary >"$W/effects.bin" || return 1
  local sz; sz=$(stat -c %s "$W/effects.bin")
  if [ "$sz" -lt 4096 ]; then echo "binary effects log of $sz bytes"; return 1; fi
  local idn w r dsm cre
  idn=$(le "$W/effects.bin" $((4 * 6)) 4) cre=$(le "$W/effects.bin" $((4 * 1)) 4)
  w=$(le "$W/effects.bin" $((1024 + 4 * 1)) 4) r=$(le "$W/effects.bin" $((1024 + 4 * 2)) 4)
  dsm=$(le "$W/effects.bin" $((1024 + 4 * 9)) 4)
  echo "admin Identify $idn, Create I/O SQ $cre; I/O Write $w, Read $r, DSM $dsm"
  [ "$idn $cre $w $r $dsm" = "1 0 3 1 3" ] || { echo "unexpected effects"; return 1; }
}
# smart_moves: the SMART / Health counters follow host I/O (4 MiB written
# and read back in 128 KiB commands: at least 8 data units and 32 commands
# each way; data units are thousands of 512 B units, rounded up)
smart_moves() {
  to nvme smart-log "/dev/$CTRL" -o binary >"$W/smart0.bin" || return 1
  to fio --name=smartw --filename="/dev/$NS" --ioengine=libaio --direct=1 --rw=write --bs=128k \
     --size=4M --iodepth=8 >/dev/null || return 1
  to fio --name=smartr --filename="/dev/$NS" --ioengine=libaio --direct=1 --rw=read --bs=128k \
     --size=4M --iodepth=8 >/dev/null || return 1
  to nvme smart-log "/dev/$CTRL" -o binary >"$W/smart1.bin" || return 1
  to nvme smart-log "/dev/$CTRL"
  local f o v a b
  for f in "temperature 1 2" "data_units_read 32 8" "data_units_written 48 8" "host_reads 64 8" \
           "host_writes 80 8" "busy_minutes 96 8" "power_on_hours 128 8" "unsafe_shutdowns 144 8"; do
    set -- $f
    a=$(le "$W/smart0.bin" "$2" "$3") b=$(le "$W/smart1.bin" "$2" "$3")
    echo "$1: $a -> $b"
    eval "S_$1=\$((b - a)) T_$1=\$b"
  done
  [ "$S_data_units_written" -ge 8 ] && [ "$S_data_units_read" -ge 8 ] || { echo "data units did not move"; return 1; }
  [ "$S_host_writes" -ge 32 ] && [ "$S_host_reads" -ge 32 ] || { echo "host commands did not move"; return 1; }
  [ "$T_temperature" -gt 200 ] || { echo "temperature $T_temperature K"; return 1; }
}
# discard_fs: Linux discards (Dataset Management, one range in a 4 KiB
# buffer) through blkdiscard, mkfs.ext4 and fstrim on a mounted ext4
discard_fs() {
  echo "discard_max_bytes $(cat "/sys/block/$NS/queue/discard_max_bytes"), granularity $(cat "/sys/block/$NS/queue/discard_granularity")"
  to blkdiscard -v "/dev/$NS" || return 1
  to mkfs.ext4 -q -F "/dev/$NS" || return 1
  local m=$W/mnt; mkdir -p "$m"
  to mount "/dev/$NS" "$m" || return 1
  to dd if=/dev/urandom of="$m/f" bs=1M count=8 conv=fsync status=none; rm -f "$m/f"; sync
  local out rc; out=$(to fstrim -v "$m"); rc=$?
  echo "fstrim: $out (rc $rc)"
  to umount "$m" || return 1
  [ $rc = 0 ] || return 1
  to fsck.ext4 -n -f "/dev/$NS"
}

# ------------------------------------------------------- stall measurement ---
# The kernel target as the reference: nvmet-rdma on port 4421 serving a
# 64 MiB ramdisk (brd; null_blk of 1 GiB if brd is missing).
KNQN=nqn.2016-06.io.pollux:nvmet-ref KPORT=4421 CFG=/sys/kernel/config/nvmet
nvmet_up() {
  modprobe -a nvmet nvmet-rdma || return 1
  local dev=/dev/ram0
  [ -b $dev ] || modprobe brd rd_nr=1 rd_size=65536 2>/dev/null
  if ! [ -b $dev ]; then dev=/dev/nullb0; [ -b $dev ] || modprobe null_blk nr_devices=1 gb=1; fi
  [ -b $dev ] || { echo "no ramdisk"; return 1; }
  mkdir "$CFG/subsystems/$KNQN" || return 1
  echo 1 >"$CFG/subsystems/$KNQN/attr_allow_any_host"
  mkdir "$CFG/subsystems/$KNQN/namespaces/1" || return 1
  echo -n $dev >"$CFG/subsystems/$KNQN/namespaces/1/device_path" || return 1
  echo 1 >"$CFG/subsystems/$KNQN/namespaces/1/enable" || return 1
  mkdir "$CFG/ports/2" || return 1
  echo rdma >"$CFG/ports/2/addr_trtype"; echo ipv4 >"$CFG/ports/2/addr_adrfam"
  echo "$T" >"$CFG/ports/2/addr_traddr"; echo "$KPORT" >"$CFG/ports/2/addr_trsvcid"
  ln -s "$CFG/subsystems/$KNQN" "$CFG/ports/2/subsystems/$KNQN" || return 1
  echo "nvmet: $KNQN ($dev, $(blockdev --getsize64 $dev) bytes) on rdma $T:$KPORT"
}
nvmet_down() {
  rm -f "$CFG/ports/2/subsystems/$KNQN"; rmdir "$CFG/ports/2" 2>/dev/null
  echo 0 >"$CFG/subsystems/$KNQN/namespaces/1/enable" 2>/dev/null
  rmdir "$CFG/subsystems/$KNQN/namespaces/1" "$CFG/subsystems/$KNQN" 2>/dev/null
  return 0
}
STALLS=()
# counter_delta BEFORE AFTER: the counters (NAME=VALUE words) that moved, as
# NAME+DELTA
counter_delta() {
  local w x n v b out=""
  for w in $2; do
    n=${w%%=*} v=${w#*=} b=0
    for x in $1; do [ "${x%%=*}" = "$n" ] && b=${x#*=}; done
    [ "$v" != "$b" ] && out+="$n+$((v - b)) "
  done
  echo "${out:-none}"
}
# stall_measure LABEL NQN PORT: fio randrw 4k-128k QD 16 for STALL_SECS s;
# counts the host's error recoveries (each a 30 s I/O timeout or a flushed
# queue, then a reconnect) per 1,000 I/Os, and the kernel's REG_MR replay
# lines, in dmesg since the connect
stall_measure() {
  local label=$1 NQN=$2 port=$3 d0 c0 c1 ios rec tmo regmr fl
  d0=$(dmesg | wc -l) c0=$(counters | tr '\n' ' ')
  to nvme connect -t rdma -n "$NQN" -a "$T" -s "$port" -w "$H" --reconnect-delay=2 --ctrl-loss-tmo=120 || return 1
  for _ in $(seq 150); do find_dev && break; sleep 0.2; done
  [ -n "$NS" ] || { echo "no namespace for $NQN"; return 1; }
  LIM=$((STALL_SECS + 200))
  to fio --name="stall-$label" --filename="/dev/$NS" --ioengine=libaio --direct=1 --rw=randrw \
     --bsrange=4k-128k --iodepth=16 --time_based --runtime="$STALL_SECS" --size=64M \
     --group_reporting >"$W/stall-$label.fio" 2>&1
  local rc=$?
  LIM=60
  grep -E 'IOPS=|issued rwts' "$W/stall-$label.fio"
  if [ "$label" = nvmet ]; then
    echo "--- reference: nvmet's effects log and SMART log"
    to nvme effects-log "/dev/$CTRL" --csi=0 | head -n 30; to nvme smart-log "/dev/$CTRL"
  fi
  to nvme disconnect -n "$NQN"
  c1=$(counters | tr '\n' ' ')
  ios=$(grep -oE 'issued rwts: total=[0-9]+,[0-9]+' "$W/stall-$label.fio" | sed -E 's/.*=([0-9]+),([0-9]+)/\1 + \2/' | head -1)
  ios=$((${ios:-0}))
  local new; new=$(dmesg | tail -n +"$((d0 + 1))")
  rec=$(grep -c 'starting error recovery' <<<"$new") tmo=$(grep -cE 'I/O [0-9]+ QID [0-9]+ timeout' <<<"$new")
  regmr=$(grep -c 'rxe_reg_fast_mr: mr->lkey = .* not free' <<<"$new") fl=$(grep -c 'WR flushed' <<<"$new")
  local per; per=$(awk -v r="$rec" -v n="$ios" 'BEGIN { if (n > 0) printf "%.2f", r * 1000 / n; else print "n/a" }')
  STALLS+=("$(printf '%-12s %6d I/Os  %3d stalls  %6s per 1,000 I/Os  (%d I/O timeouts, %d flushed WRs, %d rxe_reg_fast_mr not free; rxe counters moved: %s)' \
    "$label" "$ios" "$rec" "$per" "$tmo" "$fl" "$regmr" "$(counter_delta "$c0" "$c1")")")
  say "  stalls $label: ${STALLS[-1]}"
  [ "$c0" = "$c1" ] || echo "rxe counters before: ${c0:-none}"
  [ $rc = 0 ] && [ "$ios" -gt 0 ]
}
# rps_off / rps_on: receive packet steering off and back on for both veth
# ends (the lab turns it on: see tests/vm/lab). Off, each packet rxe sends is
# queued on the backlog of the CPU that sent it, and a host QP whose packets
# leave from two CPUs can be reordered.
rps_set() {
  local d
  for d in "$LAB_TARGET_IF" "$LAB_HOST_IF"; do echo "$1" >"/sys/class/net/$d/queues/rx-0/rps_cpus"; done
  echo "rps_cpus=$1 on $LAB_TARGET_IF and $LAB_HOST_IF"
}
rps_off() { RPS_SAVED=$(cat "/sys/class/net/$LAB_TARGET_IF/queues/rx-0/rps_cpus"); rps_set 0; }
rps_on() { rps_set "${RPS_SAVED:-0}"; }
stall_runs() {
  local v
  for v in $STALL_VARIANTS; do
    case $v in
      nvmet)
        RUN=stalls-nvmet
        if check nvmet-up 60 nvmet_up; then
          check measure 400 stall_measure nvmet "$KNQN" "$KPORT"
        fi
        nvmet_down ;;
      busy|nice|adaptive|noinv|norps)
        local idle=$IDLE extra="" nice=0
        [ $v = adaptive ] && idle=adaptive
        [ $v = nice ] && nice=19
        [ $v = noinv ] && extra="send_with_invalidate = false"
        if RUN_NICE=$nice RUN_IDLE=$idle start_tgt "stalls-$v" 4096 false "$extra"; then
          if [ $v = busy ] && ! want base && check connect 60 connect; then
            # (a run without `base` still checks the effects log once)
            check effects-log 30 effects_log
            check disconnect 60 disconnect
          fi
          [ $v = norps ] && rps_off
          check measure 400 stall_measure "pollux-$v" "$NQN" "$PORT"
          [ $v = norps ] && rps_on
          stop_tgt
        fi ;;
    esac
  done
}
kib() { echo $(( $1 * SCALE ))k; }
want() { [[ " $RUNS " == *" $1 "* ]]; }

finish() {
  stop_tgt quiet
  dmesg >"$OUTDIR/dmesg.log" 2>/dev/null
  cp "$W"/*.log "$W"/*.fio "$OUTDIR/" 2>/dev/null
  nvme disconnect -n "$NQN" >/dev/null 2>&1
  echo
  echo "=================== pollux-tgt NVMe-oF/RDMA interop summary ==================="
  printf '%s\n' "${RESULTS[@]}"
  local np nf
  np=$(printf '%s\n' "${RESULTS[@]}" | grep -c '^PASS')
  nf=$(printf '%s\n' "${RESULTS[@]}" | grep -c '^FAIL')
  if [ ${#STALLS[@]} -gt 0 ]; then
    echo "--- stalls per 1,000 I/Os (fio randrw 4k-128k, QD 16, ${STALL_SECS} s each; pollux-busy is the default)"
    printf '%s\n' "${STALLS[@]}"
  fi
  echo "total: $np passed, $nf failed, $((SECONDS - T_ALL)) s (kernel $(uname -r), $LAB_ACCEL)"
  if [ "$FAILED" != 0 ]; then
    echo "--- pollux-tgt logs (tail)"; for f in "$W"/*.tgt.log; do echo "# $f"; tail -n 30 "$f"; done
    echo "--- dmesg (nvme/rdma lines, tail; all of it in \$LAB_OUT/dmesg.log)"
    dmesg | grep -iE 'nvme|rdma|rxe|infiniband' | tail -n 60
    echo "nvmf-interop: FAILED"; exit 1
  fi
  echo "nvmf-interop: ALL PASSED"; exit 0
}

# ------------------------------------------------------------------ checks ---
[ -s /etc/nvme/hostnqn ] || { echo "FAIL: /etc/nvme/hostnqn missing (tests/vm/lab guest_state makes it)"; exit 1; }
# rxe sends over the veth pair through the per-CPU backlog (netif_rx), which
# drops above net.core.netdev_max_backlog (1000): a 128 KiB write is 128 READ
# response packets, QD 32 bursts ~4000. Drops make rxe retransmit, and in
# 6.1 a retransmission replays the host's fast registrations, which can
# stall its queue until the host's 30 s I/O timeout (seen in this lab). A
# deeper backlog keeps the link (nearly) lossless.
sysctl -qw net.core.netdev_max_backlog=100000 || echo "WARNING: cannot raise netdev_max_backlog"
say "pollux-tgt $TGT, kernel $(uname -r), modules failed: '${LAB_MODULES_FAILED:-}', work dir $W"
D0=$(dmesg | wc -l) C0=$(counters | tr '\n' ' ')

# 1. base run: default in-capsule size (4 KiB), SRQ
if want base && start_tgt base 4096 false; then
  check discover 60 discover
  if check connect 60 connect; then
    WANT_IOCCSZ=$(( (64 + 4096) / 16 )) check id-ctrl 30 id_ctrl
    check id-ns 30 id_ns
    check id-conformance 60 id_conformance
    check effects-log 30 effects_log
    check fio-512 240 fio_verify 512 "$(kib 512)"
    check fio-4k 240 fio_verify 4k "$(kib 2048)"
    check fio-16k 240 fio_verify 16k "$(kib 4096)"
    check fio-128k 240 fio_verify 128k "$(kib 8192)"
    check fio-randread-4k-3s 60 fio_timed 4k 3
    check smart-log-moves 120 smart_moves
    check discard-ext4-fstrim 240 discard_fs
    check pkts-16k-write 120 pkts_per_write 16k 256 && PPW_READ=$(cat "$W/ppw")
    check disconnect 60 disconnect
    if check reconnect 60 connect; then
      check fio-4k-after-reconnect 240 fio_verify 4k "$(kib 1024)"
      check disconnect-2 60 disconnect
    fi
  fi
  check no-nvme-errors 10 no_nvme_errors "$D0" "$C0"
  stop_tgt
fi

# 2. 16 KiB in-capsule data
D0=$(dmesg | wc -l) C0=$(counters | tr '\n' ' ')
if want inline16 && start_tgt inline16 16384 false; then
  if check connect 60 connect; then
    WANT_IOCCSZ=$(( (64 + 16384) / 16 )) check id-ctrl 30 id_ctrl
    check fio-16k 240 fio_verify 16k "$(kib 4096)"
    check fio-8k 240 fio_verify 8k "$(kib 1024)"
    # proof that the Linux host sent the 16 KiB writes in-capsule: fewer
    # target packets per write than in the base run (RDMA READ there). A
    # clean window counts 3 packets per READ write (READ request, ACK of
    # the command, response) and 2 per in-capsule one: at least half of
    # the writes must have saved their READ request.
    if check pkts-16k-write 120 pkts_per_write 16k 256; then
      PPW_INLINE=$(cat "$W/ppw")
      inline_used() { echo "per 100 writes: base (RDMA READ) ${PPW_READ:-?}, in-capsule $PPW_INLINE"
                      [ -n "${PPW_READ:-}" ] && [ $((PPW_READ - PPW_INLINE)) -ge 50 ]; }
      check inline-16k-used 5 inline_used
      sed 's/^/  /' "$W/$RUN-inline-16k-used.log"
    fi
    check disconnect 60 disconnect
  fi
  check no-nvme-errors 10 no_nvme_errors "$D0" "$C0"
  stop_tgt
fi

# 3. SRQ off
D0=$(dmesg | wc -l) C0=$(counters | tr '\n' ' ')
if want nosrq && start_tgt nosrq 4096 true; then
  if check connect 60 connect; then
    check fio-4k 240 fio_verify 4k "$(kib 1024)"
    check fio-128k 240 fio_verify 128k "$(kib 4096)"
    check disconnect 60 disconnect
  fi
  check no-nvme-errors 10 no_nvme_errors "$D0" "$C0"
  stop_tgt
fi
# 3b. T10 PI: NSID 1 is formatted 512+8 with PI Type 1, NSID 2 512+8
#     without PI. rxe has no signature offload, so the kernel host does not
#     put PI on the wire: it sends PRACT (the target generates the tuples
#     on writes, checks and strips them on reads, as PRCHK asks) and fio's
#     verify proves the data. A metadata namespace without PI cannot be
#     used by a fabrics host without integrity offload: the kernel shows it
#     with capacity 0, as against its own target.
id_ns_pi() {
  to nvme id-ns "/dev/$NS" -H >"$W/id-ns-pi.txt" || return 1
  cat "$W/id-ns-pi.txt"
  local v
  for v in "flbas.*: 0x10" "mc .*: 0x1" "dpc .*: 0x11" "dps .*: 0x1"; do
    grep -qE "^$v\b" "$W/id-ns-pi.txt" || { echo "id-ns -H lacks '$v'"; return 1; }
  done
  grep -qE 'LBA Format +0 : Metadata Size: 8 +bytes - Data Size: 512 bytes.*in use' "$W/id-ns-pi.txt" \
    || { echo "LBA format 0 is not 512+8 in use"; return 1; }
  local size; size=$(blockdev --getsize64 "/dev/$NS")
  echo "/dev/$NS: $size bytes"
  [ "$size" = $((16 * 1024 * 1024)) ] || { echo "PI namespace size $size"; return 1; }
}
md_only_unusable() {
  local md=${NS%n*}n2 size
  for _ in $(seq 50); do [ -b "/dev/$md" ] && break; sleep 0.2; done
  [ -b "/dev/$md" ] || { echo "no /dev/$md"; ls /sys/block; return 1; }
  to nvme id-ns "/dev/$md" | grep -E '^(flbas|mc|dps|lbaf +0) ' || return 1
  size=$(blockdev --getsize64 "/dev/$md")
  echo "/dev/$md (metadata, no PI): $size bytes"
  [ "$size" = 0 ]
}
D0=$(dmesg | wc -l) C0=$(counters | tr '\n' ' ')
if want pi && EXTRA_BDEVS='[[bdev]]
spec = "malloc:name=PiT1,size=16M,block=512,md=8,md_interleave=true,pi=1"
[[bdev]]
spec = "malloc:name=Md8,size=16M,block=512,md=8,md_interleave=true"' \
   NSLIST='{ bdev = "PiT1", nsid = 1 }, { bdev = "Md8", nsid = 2 }' start_tgt pi 4096 false; then
  if check connect 60 connect; then
    check id-ns-pi 30 id_ns_pi
    check md-only-capacity-0 30 md_only_unusable
    check fio-pi-512 240 fio_verify 512 "$(kib 512)"
    check fio-pi-4k 240 fio_verify 4k "$(kib 2048)"
    check fio-pi-128k 240 fio_verify 128k "$(kib 4096)"
    check disconnect 60 disconnect
  fi
  check no-nvme-errors 10 no_nvme_errors "$D0" "$C0"
  stop_tgt
fi

# 4. keep-alive and asynchronous events (reconnects on purpose: no
#    no-nvme-errors check here), on a target that sleeps when idle
#    (--idle adaptive:0 unless LAB_USER_NVMF_IDLE names a mode): the
#    listener wakes it for the connect, the armed CQ for each command, its
#    100 ms tick for the AEN and the keep-alive deadline
KA_IDLE=${LAB_USER_NVMF_IDLE:-adaptive:0}
if want kaaer && RUN_IDLE=$KA_IDLE start_tgt kaaer 4096 false; then
  RUN_IDLE=$KA_IDLE
  if check connect 60 connect --keep-alive-tmo=5 --reconnect-delay=2 --ctrl-loss-tmo=60; then
    check keep-alives 30 keep_alives
    check ns-added-aen 40 ns_event
    check kato-expiry 60 kato_expiry && find_dev
    check fio-4k-after-kato 120 fio_verify 4k "$(kib 512)"
    check disconnect 60 disconnect
  fi
  stop_tgt
  RUN_IDLE=""
fi
# 5. stalls per 1,000 I/Os, kernel target and pollux-tgt (measurement; the
#    host's recoveries are expected here, no no-nvme-errors check)
want stalls && stall_runs
finish
