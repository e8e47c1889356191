#!/usr/bin/env bash
# Runs inside the lab guest (tests/vm/lab run tests/vm/tcp-guest.sh TGT PERF):
# NVMe/TCP between the lab's two addresses ($LAB_TARGET_ADDR, target side;
# $LAB_HOST_ADDR, host side; the lab's policy routes carry the traffic over
# the veth pair).
#   plain    pollux-tgt (TCP listener $T:4420, malloc bdev) and the kernel
#            host without digests: nvme discover (trtype tcp), connect,
#            id-ctrl/id-ns, fio crc32c verify 512 B / 4 KiB / 16 KiB /
#            128 KiB randwrite QD 32 (then a read-only verify pass),
#            mkfs.ext4 + mount + a file written and read back + umount +
#            fsck, disconnect
#   digest   the same connect with --hdr-digest --data-digest (the target's
#            log names the digests), fio verify at every size, disconnect
#   restart  connect with --reconnect-delay 1 --ctrl-loss-tmo 60, stop and
#            start pollux-tgt on the same address: the host reconnects by
#            itself, a fio verify passes, disconnect
#   knvmet   pollux-perf (our host) --verify against the kernel target
#            (nvmet-tcp via configfs, a tmpfs file, $T:4421), without and
#            with both digests
# Prints one PASS/FAIL line per check and a summary; exits 1 on any failure
# (with the tails of the target log and of dmesg).
# Knobs: LAB_USER_TCP_SCALE (fio size multiplier, default 1),
# LAB_USER_TCP_RUNS (subset of "plain digest restart knvmet").
set -u
[ "${LAB_IN_GUEST:-}" = 1 ] || { echo "run inside tests/vm/lab" >&2; exit 2; }
TGT=${1:?usage: tcp-guest.sh PATH/TO/pollux-tgt PATH/TO/pollux-perf}
PERF=${2:?usage: tcp-guest.sh PATH/TO/pollux-tgt PATH/TO/pollux-perf}
for f in "$TGT" "$PERF"; do [ -x "$f" ] || { echo "FAIL: $f is not executable"; exit 1; }; done
T=$LAB_TARGET_ADDR H=$LAB_HOST_ADDR PORT=4420 KPORT=4421
NQN=nqn.2016-06.io.pollux:tcp0 KNQN=nqn.2016-06.io.pollux:ktcp
SCALE=${LAB_USER_TCP_SCALE:-1}
RUNS=${LAB_USER_TCP_RUNS:-plain digest restart knvmet}
W=$(mktemp -d /tmp/pollux-tcp.XXXXXX)
OUTDIR=${LAB_OUT:-$W}
CFG=/sys/kernel/config/nvmet
T_ALL=$SECONDS
RESULTS=() FAILED=0 TPID="" RUN=""

say()  { echo "[$(date +%T)] $*"; }
pass() { RESULTS+=("PASS  $RUN/$1 ($2 s)"); say "PASS $RUN/$1 ($2 s)"; }
fail() { RESULTS+=("FAIL  $RUN/$1${3:+: $3}"); FAILED=1; say "FAIL $RUN/$1 ($2 s)${3:+: $3}"; }
LIM=60
to() { timeout -k 5 "$LIM" "$@"; }
# check NAME LIMIT CMD...: CMD's output to $W/RUN-NAME.log, external
# commands in it bounded by LIMIT (through `to`)
check() {
  local name=$1 t0=$SECONDS rc; LIM=$2; shift 2
  "$@" >"$W/$RUN-$name.log" 2>&1; rc=$?
  grep -hE '^ +(write|read): IOPS=' "$W/$RUN-$name.log" | sed 's/^ */  fio: /'
  if [ $rc = 0 ]; then pass "$name" $((SECONDS - t0)); return 0; fi
  fail "$name" $((SECONDS - t0)) "rc=$rc"
  tail -n 25 "$W/$RUN-$name.log" | sed 's/^/    | /'
  tgt_tail 30
  return 1
}

# ------------------------------------------------------------------ target ---
write_cfg() {
  cat >"$W/tgt.toml" <<EOF2
cores = "0"
provider = "soft"

[transport]
max_queue_depth = 128
max_io_size = "128k"
io_unit_size = "32k"
in_capsule_data_size = 8192
num_shared_buffers = 1024

[transport.tcp]
in_capsule_data_size = 8192
c2h_success = true
digest = "allow"

[[bdev]]
spec = "malloc:name=Malloc0,size=64M,block=512"

[[bdev]]
spec = "malloc:name=PiT1,size=16M,block=512,md=8,md_interleave=true,pi=1"

[[subsystem]]
nqn = "$NQN"
serial = "POLLUXTCP0"
model = "Pollux TCP interop"
allow_any_host = true
namespaces = [{ bdev = "Malloc0", nsid = 1 }, { bdev = "PiT1", nsid = 2 }]

[[listener]]
trtype = "tcp"
traddr = "$T"
trsvcid = "$PORT"
EOF2
}
start_tgt() {
  local t0=$SECONDS
  POLLUX_LOG=debug "$TGT" -c "$W/tgt.toml" --cores 0 >>"$W/tgt.log" 2>&1 </dev/null &
  TPID=$!
  for _ in $(seq 300); do
    [ "$(grep -c 'pollux-tgt: ready' "$W/tgt.log")" -gt "${READY:-0}" ] &&
      { READY=$(grep -c 'pollux-tgt: ready' "$W/tgt.log"); pass tgt-ready $((SECONDS - t0)); return 0; }
    kill -0 "$TPID" 2>/dev/null || break
    sleep 0.2
  done
  fail tgt-ready $((SECONDS - t0)) "no 'ready' in 60 s"; tail -n 30 "$W/tgt.log" | sed 's/^/    | /'
  stop_tgt quiet; return 1
}
# tgt_tail N: the target's panics, if any, and the last N lines of its log
# (shown where a check fails: the log goes on past it)
tgt_tail() {
  [ -s "$W/tgt.log" ] || return 0
  grep -n -A3 'panicked' "$W/tgt.log" | head -n 20 | sed 's/^/    tgt! /'
  tail -n "$1" "$W/tgt.log" | sed 's/^/    tgt| /'
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
      if [ $rc = 0 ]; then pass tgt-stop $((SECONDS - t0)); else fail tgt-stop $((SECONDS - t0)) "exit $rc"; tgt_tail 30; fi
    fi
  fi
  cp "$W/tgt.log" "$OUTDIR/" 2>/dev/null
  TPID=""
}

# -------------------------------------------------------------------- host ---
CTRL="" NS=""
discover() {
  local log; log=$(to nvme discover -t tcp -a "$T" -s "$PORT" -w "$H" -o json) || return 1
  echo "$log"
  grep -q "\"subnqn\" *: *\"$NQN\"" <<<"$log" || { echo "discovery log lacks $NQN"; return 1; }
  grep -q '"trtype" *: *"tcp"' <<<"$log" || { echo "discovery log: trtype not tcp"; return 1; }
  grep -q '"adrfam" *: *"ipv4"' <<<"$log" || { echo "discovery log: adrfam not ipv4"; return 1; }
  grep -q "\"traddr\" *: *\"$T\"" <<<"$log" || { echo "discovery log: traddr not $T"; return 1; }
  grep -q "\"trsvcid\" *: *\"$PORT\"" <<<"$log" || { echo "discovery log: trsvcid not $PORT"; return 1; }
  grep -qE '"sectype" *: *"none"' <<<"$log" || echo "(no sectype field in this nvme-cli's JSON)"
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
  to nvme connect -t tcp -n "$NQN" -a "$T" -s "$PORT" -w "$H" "$@" || return 1
  for _ in $(seq 150); do find_dev && break; sleep 0.2; done
  [ -n "$NS" ] || { echo "no live controller/namespace for $NQN"; ls /sys/class/nvme /sys/block; return 1; }
  echo "controller /dev/$CTRL ($(cat /sys/class/nvme/$CTRL/transport) $(cat /sys/class/nvme/$CTRL/address)), namespace /dev/$NS, $(blockdev --getsize64 /dev/$NS) bytes"
  [ "$(cat /sys/class/nvme/$CTRL/transport)" = tcp ] || { echo "transport is not tcp"; return 1; }
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
  local sn ioccsz
  sn=$(awk -F: '$1 ~ /^sn /{gsub(/ /,"",$2); print $2}' "$W/id-ctrl.txt")
  [ "$sn" = POLLUXTCP0 ] || { echo "id-ctrl sn '$sn'"; return 1; }
  grep -qE '^subnqn +: '"$NQN"'$' "$W/id-ctrl.txt" || { echo "id-ctrl subnqn"; return 1; }
  ioccsz=$(awk -F: '$1 ~ /^ioccsz /{print $2+0}' "$W/id-ctrl.txt")
  [ "$ioccsz" = $(( (64 + 8192) / 16 )) ] || { echo "IOCCSZ $ioccsz"; return 1; }
}
id_ns() {
  to nvme id-ns "/dev/$NS" >"$W/id-ns.txt" || return 1
  cat "$W/id-ns.txt"
  local nsze; nsze=$(awk -F: '$1 ~ /^nsze /{print $2}' "$W/id-ns.txt" | tr -d ' ')
  [ $((nsze)) = $((64 * 2048)) ] || { echo "nsze $nsze != 131072 (64 MiB of 512 B)"; return 1; }
}
# fio_verify BS SIZE: random writes with crc32c headers read back and
# checked, then a read-only verify pass over the same blocks; QD 32
fio_verify() {
  local bs=$1 size=$2; shift 2
  local common=(--filename="/dev/$NS" --ioengine=libaio --direct=1 --rw=randwrite --bs="$bs"
                --iodepth=32 --size="$size" --verify=crc32c --randrepeat=1 --randseed=4242
                --verify_fatal=1 --verify_state_save=0 --group_reporting "$@")
  to fio --name="w$bs" "${common[@]}" --do_verify=1 || return 1
  to fio --name="r$bs" "${common[@]}" --verify_only=1 || return 1
}
# pi_ns: NSID 2 is formatted 512+8 with PI Type 1. nvme-tcp carries no
# metadata, so the kernel host uses it with PRACT (the target generates the
# tuples on writes, checks and strips them on reads): the format as
# `nvme id-ns -H` shows it, the full size, and fio's verify of the data.
pi_ns() {
  local pn=${NS%n*}n2 size
  for _ in $(seq 50); do [ -b "/dev/$pn" ] && break; sleep 0.2; done
  [ -b "/dev/$pn" ] || { echo "no /dev/$pn"; ls /sys/block; return 1; }
  to nvme id-ns "/dev/$pn" -H >"$W/id-ns-pi.txt" || return 1
  grep -E '^(flbas|mc|dpc|dps) ' "$W/id-ns-pi.txt"
  grep -qE 'LBA Format +0 : Metadata Size: 8 +bytes - Data Size: 512 bytes.*in use' "$W/id-ns-pi.txt" \
    || { echo "LBA format 0 is not 512+8 in use"; return 1; }
  grep -qE '^dps +: 0x1\b' "$W/id-ns-pi.txt" || { echo "dps is not Type 1"; return 1; }
  size=$(blockdev --getsize64 "/dev/$pn")
  echo "/dev/$pn: $size bytes"
  [ "$size" = $((16 * 1024 * 1024)) ] || { echo "PI namespace size $size"; return 1; }
  NS=$pn fio_verify 4k "$(kib 1024)" || return 1
  NS=$pn fio_verify 64k "$(kib 2048)"
}
fio_all() {
  check fio-512 240 fio_verify 512 "$(kib 512)"
  check fio-4k 240 fio_verify 4k "$(kib 2048)"
  check fio-16k 240 fio_verify 16k "$(kib 4096)"
  check fio-128k 240 fio_verify 128k "$(kib 8192)"
}
filesystem() {
  local m=$W/mnt
  mkdir -p "$m"
  to mkfs.ext4 -q -F "/dev/$NS" || return 1
  to mount "/dev/$NS" "$m" || return 1
  to dd if=/dev/urandom of="$W/blob" bs=1M count=8 status=none || { umount "$m"; return 1; }
  to cp "$W/blob" "$m/blob" && sync
  local a b; a=$(sha256sum <"$W/blob") b=$(sha256sum <"$m/blob")
  to umount "$m" || return 1
  echo "sha256 written $a, read $b"
  [ "$a" = "$b" ] || { echo "file differs"; return 1; }
  to fsck.ext4 -f -n "/dev/$NS"
}
# digests_on: every queue of this connection negotiated both digests (the
# target logs each ICReq it grants at debug level)
digests_on() {
  local n; n=$(grep -c 'ICReq granted: header digest true, data digest true' "$W/tgt.log")
  grep 'ICReq granted' "$W/tgt.log" | tail -n 3
  echo "queues granted both digests: $n"
  [ "$n" -ge 2 ]
}
wait_live() {  # the host reconnects by itself after the restart
  for _ in $(seq 300); do
    find_dev && [ "$(cat /sys/class/nvme/$CTRL/state)" = live ] && { echo "state live ($CTRL)"; return 0; }
    sleep 0.2
  done
  echo "state $(cat /sys/class/nvme/*/state 2>/dev/null | tr '\n' ' ')"; return 1
}
# ---------------------------------------------------------- kernel target ---
knvmet_up() {
  modprobe nvmet-tcp || return 1
  mkdir -p /tmp/knvmet && mount -t tmpfs -o size=80M tmpfs /tmp/knvmet || return 1
  truncate -s 64M /tmp/knvmet/img || return 1
  mkdir "$CFG/subsystems/$KNQN" || return 1
  echo 1 >"$CFG/subsystems/$KNQN/attr_allow_any_host"
  mkdir "$CFG/subsystems/$KNQN/namespaces/1"
  echo /tmp/knvmet/img >"$CFG/subsystems/$KNQN/namespaces/1/device_path"
  echo 1 >"$CFG/subsystems/$KNQN/namespaces/1/buffered_io" 2>/dev/null
  echo 1 >"$CFG/subsystems/$KNQN/namespaces/1/enable" || return 1
  mkdir "$CFG/ports/2"
  echo tcp >"$CFG/ports/2/addr_trtype"; echo ipv4 >"$CFG/ports/2/addr_adrfam"
  echo "$T" >"$CFG/ports/2/addr_traddr"; echo "$KPORT" >"$CFG/ports/2/addr_trsvcid"
  ln -s "$CFG/subsystems/$KNQN" "$CFG/ports/2/subsystems/$KNQN" || return 1
  echo "nvmet-tcp: $KNQN on $T:$KPORT"
}
knvmet_down() {
  rm -f "$CFG/ports/2/subsystems/$KNQN" 2>/dev/null
  rmdir "$CFG/ports/2" 2>/dev/null
  { echo 0 >"$CFG/subsystems/$KNQN/namespaces/1/enable"; } 2>/dev/null
  rmdir "$CFG/subsystems/$KNQN/namespaces/1" "$CFG/subsystems/$KNQN" 2>/dev/null
  umount /tmp/knvmet 2>/dev/null
}
perf_verify() {  # perf_verify BS QD [digest flags]
  local bs=$1 qd=$2; shift 2
  to "$PERF" -r "trtype:tcp adrfam:ipv4 traddr:$T trsvcid:$KPORT subnqn:$KNQN" --cores 0 \
    -q "$qd" -o "$bs" -w write --verify -t 3 "$@"
}
kib() { echo $(( $1 * SCALE ))k; }
want() { [[ " $RUNS " == *" $1 "* ]]; }

finish() {
  stop_tgt quiet
  nvme disconnect -n "$NQN" >/dev/null 2>&1
  knvmet_down
  dmesg >"$OUTDIR/dmesg.log" 2>/dev/null
  echo
  echo "=================== pollux-tgt NVMe/TCP interop summary ==================="
  printf '%s\n' "${RESULTS[@]}"
  local np nf
  np=$(printf '%s\n' "${RESULTS[@]}" | grep -c '^PASS')
  nf=$(printf '%s\n' "${RESULTS[@]}" | grep -c '^FAIL')
  echo "total: $np passed, $nf failed, $((SECONDS - T_ALL)) s (kernel $(uname -r), $LAB_ACCEL)"
  if [ "$FAILED" != 0 ]; then
    echo "--- pollux-tgt log (tail)"; tail -n 40 "$W/tgt.log"
    echo "--- dmesg (nvme lines, tail; all of it in \$LAB_OUT/dmesg.log)"
    dmesg | grep -iE 'nvme' | tail -n 60
    echo "tcp-interop: FAILED"; exit 1
  fi
  echo "tcp-interop: ALL PASSED"; exit 0
}

# ------------------------------------------------------------------ checks ---
mkdir -p /etc/nvme && { [ -s /etc/nvme/hostnqn ] || nvme gen-hostnqn >/etc/nvme/hostnqn; }
modprobe nvme-tcp || say "modprobe nvme-tcp failed"
say "pollux-tgt $TGT, pollux-perf $PERF, kernel $(uname -r), work dir $W"
write_cfg

RUN=plain
if want plain && start_tgt; then
  check discover 60 discover
  if check connect 60 connect; then
    check id-ctrl 30 id_ctrl
    check id-ns 30 id_ns
    fio_all
    check pi-namespace 300 pi_ns
    check ext4 240 filesystem
    check disconnect 60 disconnect
  fi
  stop_tgt
fi

RUN=digest
if want digest && start_tgt; then
  if check connect 60 connect --hdr-digest --data-digest; then
    check digests 10 digests_on
    fio_all
    check disconnect 60 disconnect
  fi
  stop_tgt
fi

RUN=restart
if want restart && start_tgt; then
  if check connect 60 connect --reconnect-delay=1 --ctrl-loss-tmo=60; then
    check fio-4k-before 240 fio_verify 4k "$(kib 1024)"
    stop_tgt
    start_tgt
    check reconnected 90 wait_live
    check fio-4k-after 240 fio_verify 4k "$(kib 1024)"
    check disconnect 60 disconnect
  fi
  stop_tgt
fi

RUN=knvmet
if want knvmet; then
  if check nvmet-tcp-up 60 knvmet_up; then
    check perf-verify-4k-q32 60 perf_verify 4096 32
    check perf-verify-128k-q8 60 perf_verify 128k 8
    check perf-verify-4k-q32-digests 60 perf_verify 4096 32 --hdr-digest --data-digest
    check perf-verify-64k-q8-digests 60 perf_verify 64k 8 --hdr-digest --data-digest
  fi
  knvmet_down
fi
finish
