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
#   digest   the same connect with --hdr-digest --data-digest and
#            --queue-size=16 (the target's log names the digests and the
#            queues' 16 entries; fio's QD 32 runs against the host's SQSIZE,
#            which the target enforces), fio verify at every size, disconnect
#   restart  connect with --reconnect-delay 1 --ctrl-loss-tmo 60, stop and
#            start pollux-tgt on the same address: the host reconnects by
#            itself, a fio verify passes, disconnect
#   knvmet   pollux-perf (our host) --verify against the kernel target
#            (nvmet-tcp via configfs, a tmpfs file, $T:4421), without and
#            with both digests
#   kcompare the kernel host (nvme connect -t tcp + fio) against both
#            targets doing the same work, connected side by side: pollux-tgt
#            ($T:4420, reactor pinned to vCPU 0, a 1 GiB null bdev of 512 B
#            blocks) and nvmet-tcp ($T:4421, a 1 GiB null_blk device of 512 B
#            blocks, irqmode=0, made through null_blk's configfs; the tmpfs
#            file of knvmet if null_blk is missing or
#            LAB_USER_TCP_KCMP_NULLB=0, said so in the output; its 4 KiB
#            blocks then drop the 512 B cell).
#            fio libaio direct=1 randread, 4 KiB QD 32, 512 B QD 32 and 4 KiB
#            QD 1, each 2 s after a 0.5 s ramp, on vCPU 1 (when the guest has
#            two; with one everything shares it, said so), 3 rounds per cell
#            that alternate the order (pollux first in odd rounds, nvmet
#            first in even ones), medians; pollux-tgt is stopped
#            (SIGSTOP, host keep-alive 60 s) while fio runs against nvmet, so
#            its busy-polling reactor takes no CPU from the kernel target.
#            Prints a line per run (target, block size, QD, IOPS, mean and
#            p99 latency, each vCPU's busy share; then NET_RX softirqs per
#            vCPU, ksoftirqd/0's CPU time, the packets each veth end sent
#            and, for pollux-tgt, how often its threads were preempted: the
#            kernel's receive work that competes with the reactor on vCPU
#            0), a median line per cell and
#            `kcompare: 4k pollux/knvmet = X.XX` (likewise 512 and 4k-qd1:
#            the ratio of the median IOPS; the same lines in the summary).
#            Receive packet steering is split as between two one-core
#            machines: what the host sends is received on vCPU 0 (the
#            target's: pollux-tgt's reactor, or nvmet-tcp's softirq and
#            io_work), what the target sends on vCPU 1 (the host's).
#            With the lab's default (every vCPU) the flow hash of each boot's
#            ports decided whether nvmet-tcp's work ran on one vCPU or on
#            both, which swung every ratio by 2-3x from boot to boot.
#            LAB_USER_TCP_KCMP_RPS=lab keeps the lab's masks, a hex mask
#            sets both ends (2: vCPU 1 only).
#            It fails only on functional errors (connect, fio, no I/O seen by
#            null_blk, teardown): under TCG the rates depend on the host's
#            load and on how QEMU schedules two vCPUs, so a ratio below 1.0
#            is reported prominently (also in the summary) and not failed;
#            the rates themselves are no performance figures.
# Prints one PASS/FAIL line per check and a summary; exits 1 on any failure
# (with the tails of the target log and of dmesg).
# Knobs: LAB_USER_TCP_SCALE (fio size multiplier, default 1),
# LAB_USER_TCP_RUNS (subset of "plain digest restart knvmet kcompare"),
# LAB_USER_TCP_KCMP_SECS (seconds per kcompare fio run, default 2),
# LAB_USER_TCP_KCMP_ROUNDS (kcompare rounds per cell, default 3),
# LAB_USER_TCP_KCMP_IDLE (pollux-tgt's --idle in kcompare: busy, the
# default, or adaptive[:US]), LAB_USER_TCP_KCMP_RPS (split, the default;
# lab; or a mask) and LAB_USER_TCP_KCMP_NULLB (above).
set -u
[ "${LAB_IN_GUEST:-}" = 1 ] || { echo "run inside tests/vm/lab" >&2; exit 2; }
TGT=${1:?usage: tcp-guest.sh PATH/TO/pollux-tgt PATH/TO/pollux-perf}
PERF=${2:?usage: tcp-guest.sh PATH/TO/pollux-tgt PATH/TO/pollux-perf}
for f in "$TGT" "$PERF"; do [ -x "$f" ] || { echo "FAIL: $f is not executable"; exit 1; }; done
T=$LAB_TARGET_ADDR H=$LAB_HOST_ADDR PORT=4420 KPORT=4421
NQN=nqn.2016-06.io.pollux:tcp0 KNQN=nqn.2016-06.io.pollux:ktcp
SCALE=${LAB_USER_TCP_SCALE:-1}
RUNS=${LAB_USER_TCP_RUNS:-plain digest restart knvmet kcompare}
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
  POLLUX_LOG=debug "$TGT" -c "${TCFG:-$W/tgt.toml}" --cores 0 ${TIDLE:+--idle "$TIDLE"} >>"$W/tgt.log" 2>&1 </dev/null &
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
  kill -CONT "$TPID" 2>/dev/null  # kcompare stops it while nvmet runs
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
# small_queues: the I/O queues of this connection asked for 16 entries
# (fio's QD 32 then runs into the host's own limit, never the target's:
# the target refuses a host past its SQSIZE)
small_queues() {
  local n; n=$(grep -cE 'connected qid [1-9][0-9]* \(16 entries\)' "$W/tgt.log")
  grep -E 'connected qid [0-9]+ \(' "$W/tgt.log" | tail -n 3
  echo "I/O queues of 16 entries: $n"
  [ "$n" -ge 1 ]
}
wait_live() {  # the host reconnects by itself after the restart
  for _ in $(seq 300); do
    find_dev && [ "$(cat /sys/class/nvme/$CTRL/state)" = live ] && { echo "state live ($CTRL)"; return 0; }
    sleep 0.2
  done
  echo "state $(cat /sys/class/nvme/*/state 2>/dev/null | tr '\n' ' ')"; return 1
}
# ---------------------------------------------------------- kernel target ---
knvmet_up() {  # knvmet_up [BLOCK DEVICE]: the namespace (default a 64 MiB file on a fresh tmpfs)
  local dev=${1:-}
  modprobe nvmet-tcp || return 1
  if [ -z "$dev" ]; then
    mkdir -p /tmp/knvmet && mount -t tmpfs -o size=80M tmpfs /tmp/knvmet || return 1
    truncate -s 64M /tmp/knvmet/img || return 1
  fi
  mkdir "$CFG/subsystems/$KNQN" || return 1
  echo 1 >"$CFG/subsystems/$KNQN/attr_allow_any_host"
  mkdir "$CFG/subsystems/$KNQN/namespaces/1"
  echo "${dev:-/tmp/knvmet/img}" >"$CFG/subsystems/$KNQN/namespaces/1/device_path"
  [ -n "$dev" ] || echo 1 >"$CFG/subsystems/$KNQN/namespaces/1/buffered_io" 2>/dev/null
  echo 1 >"$CFG/subsystems/$KNQN/namespaces/1/enable" || return 1
  mkdir "$CFG/ports/2"
  echo tcp >"$CFG/ports/2/addr_trtype"; echo ipv4 >"$CFG/ports/2/addr_adrfam"
  echo "$T" >"$CFG/ports/2/addr_traddr"; echo "$KPORT" >"$CFG/ports/2/addr_trsvcid"
  ln -s "$CFG/subsystems/$KNQN" "$CFG/ports/2/subsystems/$KNQN" || return 1
  echo "nvmet-tcp: $KNQN on $T:$KPORT (${dev:-/tmp/knvmet/img})"
}
knvmet_down() {
  rm -f "$CFG/ports/2/subsystems/$KNQN" 2>/dev/null
  rmdir "$CFG/ports/2" 2>/dev/null
  { echo 0 >"$CFG/subsystems/$KNQN/namespaces/1/enable"; } 2>/dev/null
  rmdir "$CFG/subsystems/$KNQN/namespaces/1" "$CFG/subsystems/$KNQN" 2>/dev/null
  mountpoint -q /tmp/knvmet && umount /tmp/knvmet
  [ ! -e "$CFG/subsystems/$KNQN" ]
}
perf_verify() {  # perf_verify BS QD [digest flags]
  local bs=$1 qd=$2; shift 2
  to "$PERF" -r "trtype:tcp adrfam:ipv4 traddr:$T trsvcid:$KPORT subnqn:$KNQN" --cores 0 \
    -q "$qd" -o "$bs" -w write --verify -t 3 "$@"
}
# ---------------------------------------------------------------- kcompare ---
KC_SECS=${LAB_USER_TCP_KCMP_SECS:-2} KC_ROUNDS=${LAB_USER_TCP_KCMP_ROUNDS:-3}
KC_IDLE=${LAB_USER_TCP_KCMP_IDLE:-busy} KC_RPS=${LAB_USER_TCP_KCMP_RPS:-split}
KC_KSOFT="" KC_CLK_TCK=100
KC_CELLS="4k:32 512:32 4k:1"       # BS:QD, in this order
NQN_NULL=nqn.2016-06.io.pollux:tcpnull KNQN_NULL=nqn.2016-06.io.pollux:ktcpnull
KC_NULLB="" KC_NULLB_MOD=0 KC_KDEV="" KC_PNS="" KC_KNS="" KC_CPU=""
KC_TSV=$W/kcompare.tsv
write_kcfg() {  # pollux-tgt for kcompare: the same transport, a null bdev
  sed -n '1,/^\[\[bdev\]\]/p' "$W/tgt.toml" | sed '$d' >"$W/tgt-kcmp.toml"
  cat >>"$W/tgt-kcmp.toml" <<EOF2
[[bdev]]
spec = "null:name=Null0,size=1G,block=512"

[[subsystem]]
nqn = "$NQN_NULL"
serial = "POLLUXTCPNULL"
model = "Pollux TCP kcompare"
allow_any_host = true
namespaces = [{ bdev = "Null0", nsid = 1 }]

[[listener]]
trtype = "tcp"
traddr = "$T"
trsvcid = "$PORT"
EOF2
  grep -q '^cores = "0"$' "$W/tgt-kcmp.toml" && grep -q '^\[transport.tcp\]' "$W/tgt-kcmp.toml"
}
# kc_nullb_up: a null_blk device for nvmet (1 GiB, 512 B blocks, irqmode 0:
# completed in the submitter's context, as the null bdev does), made through
# null_blk's configfs so the lab's /dev/nullb0 stays as it is; sets KC_KDEV
# (empty: no null_blk in this kernel, nvmet gets knvmet's tmpfs file)
kc_nullb_up() {
  local d=/sys/kernel/config/nullb/kcmp
  if [ "${LAB_USER_TCP_KCMP_NULLB:-1}" = 0 ]; then
    echo "NOTE: LAB_USER_TCP_KCMP_NULLB=0: nvmet-tcp serves a tmpfs file instead of null_blk"; return 0
  fi
  if [ ! -d /sys/kernel/config/nullb ]; then
    if modprobe null_blk nr_devices=0; then KC_NULLB_MOD=1
    else echo "NOTE: no null_blk module in kernel $(uname -r): nvmet-tcp serves a tmpfs file instead"; return 0; fi
  fi
  mkdir "$d" || return 1
  KC_NULLB=$d
  echo 1024 >"$d/size" && echo 512 >"$d/blocksize" && echo 0 >"$d/irqmode" &&
    echo 0 >"$d/memory_backed" && echo 1 >"$d/power" || return 1
  # since 5.19 the disk takes the configfs item's name; before, nullb<index>
  local n
  for _ in $(seq 50); do
    for n in kcmp "nullb$(cat "$d/index")"; do [ -b "/dev/$n" ] && { KC_KDEV=/dev/$n; break 2; }; done
    sleep 0.1
  done
  [ -n "$KC_KDEV" ] || { echo "no block device for $d (index $(cat "$d/index"))"; ls /sys/block; return 1; }
  echo "null_blk: $KC_KDEV, $(blockdev --getsize64 "$KC_KDEV") bytes, $(blockdev --getss "$KC_KDEV") B blocks, irqmode $(cat "$d/irqmode")"
}
kc_nullb_down() {
  if [ -n "$KC_NULLB" ]; then
    { echo 0 >"$KC_NULLB/power"; } 2>/dev/null
    rmdir "$KC_NULLB" || return 1
    KC_NULLB="" KC_KDEV=""
  fi
  if [ "$KC_NULLB_MOD" = 1 ]; then rmmod null_blk || return 1; KC_NULLB_MOD=0; fi
}
kc_up() {
  kc_nullb_up || return 1
  KNQN=$KNQN_NULL knvmet_up "$KC_KDEV"
}
kc_down() {
  KNQN=$KNQN_NULL knvmet_down || { echo "nvmet configfs left behind"; return 1; }
  kc_nullb_down || { echo "null_blk device left behind"; return 1; }
  echo "nvmet subsystem, port and null_blk device removed"
}
# kc_connect NQN PORT VAR: the kernel host, keep-alive 60 s (pollux-tgt is
# stopped for whole nvmet runs); the namespace name into VAR. A namespace
# of 4 KiB blocks (nvmet's tmpfs file) drops the 512 B cell.
kc_connect() {
  NQN=$1 PORT=$2 connect --keep-alive-tmo=60 || return 1
  printf -v "$3" %s "$NS"
  local ss; ss=$(blockdev --getss "/dev/$NS")
  echo "logical block size $ss B"
  case $ss in
    512) ;;
    4096) KC_CELLS=${KC_CELLS/512:32/}; echo "NOTE: 4 KiB blocks: no 512 B cell (cells: $KC_CELLS)" ;;
    *) echo "unexpected block size"; return 1 ;;
  esac
}
kc_disconnect() { NQN=$1 disconnect; }
# The samples around each run use shell builtins only: a process started in
# the guest costs tens of ms under TCG.
kc_cpu() {  # per vCPU "cpuN:BUSY:TOTAL " (jiffies)
  local c u n s i w q sq st _
  while read -r c u n s i w q sq st _; do
    [[ $c == cpu[0-9]* ]] && printf '%s:%d:%d ' "$c" $((u + n + s + q + sq)) $((u + n + s + i + w + q + sq + st))
  done </proc/stat
}
# kc_busy BEFORE AFTER: the busy share of each vCPU between two kc_cpu samples
kc_busy() {
  awk -v a="$1" -v b="$2" 'BEGIN{n=split(a,x," "); split(b,y," ");
    for(i=1;i<=n;i++){split(x[i],p,":"); split(y[i],q,":");
      printf "%s%s %d%%", (i>1?", ":""), p[1], (q[3]>p[3]?100*(q[2]-p[2])/(q[3]-p[3]):0)}}'
}
# kc_diag: NET_RX softirqs on cpu0 and cpu1, ksoftirqd/0's CPU time (ticks),
# pollux-tgt's involuntary context switches (all threads), packets sent by
# the target's and by the host's veth end
kc_diag() {
  local n=0 f k v a b rx="0 0" st=()
  for f in /proc/"$TPID"/task/*/status; do
    while read -r k v; do [ "$k" = nonvoluntary_ctxt_switches: ] && n=$((n + v)); done <"$f"
  done 2>/dev/null
  while read -r k a b _; do [ "$k" = NET_RX: ] && rx="$a ${b:-0}"; done </proc/softirqs
  [ -n "$KC_KSOFT" ] && read -r -a st <"/proc/$KC_KSOFT/stat"
  read -r a <"/sys/class/net/$LAB_TARGET_IF/statistics/tx_packets"
  read -r b <"/sys/class/net/$LAB_HOST_IF/statistics/tx_packets"
  echo "$rx $((${st[13]:-0} + ${st[14]:-0})) $n $a $b"
}
# kc_diag_delta BEFORE AFTER TARGET
kc_diag_delta() {
  set -- $1 $2 "$3"
  local tick=$((1000 / KC_CLK_TCK))
  printf 'NET_RX cpu0 +%d cpu1 +%d, ksoftirqd/0 %d ms' $(($7 - $1)) $(($8 - $2)) $((($9 - $3) * tick))
  printf ', packets target->host +%d host->target +%d' $((${11} - $5)) $((${12} - $6))
  [ "${13}" = pollux ] && printf ', pollux-tgt preempted %d' $((${10} - $4))
}
kc_nullb_ios() {
  local r=0
  [ -n "$KC_KDEV" ] && read -r r _ <"/sys/block/${KC_KDEV##*/}/stat"
  echo "$r"
}
# kc_fio TARGET BS QD ROUND: one randread run on TARGET's namespace, a line
# "TARGET BS QD ROUND IOPS LAT_US P99_US BUSY DIAG" into $KC_TSV
kc_fio() {
  local t=$1 bs=$2 qd=$3 r=$4 dev c0 c1 d0 d1 rc j n0 n1 line
  j=$W/kcompare-$t-$bs-q$qd-r$r.json
  if [ "$t" = pollux ]; then dev=$KC_PNS; else dev=$KC_KNS; kill -STOP "$TPID" || return 1; fi
  n0=$(kc_nullb_ios) c0=$(kc_cpu) d0=$(kc_diag)
  to fio --name="kc-$t" --filename="/dev/$dev" --ioengine=libaio --direct=1 --rw=randread \
    --bs="$bs" --iodepth="$qd" --time_based --runtime="$KC_SECS" --ramp_time=500ms \
    --norandommap --randrepeat=0 ${KC_CPU:+--cpus_allowed=$KC_CPU} \
    --output-format=json --output="$j"; rc=$?
  c1=$(kc_cpu) n1=$(kc_nullb_ios) d1=$(kc_diag)
  [ "$t" = pollux ] || kill -CONT "$TPID"
  cp "$j" "$OUTDIR/" 2>/dev/null
  [ $rc = 0 ] || { cat "$j"; echo "fio rc=$rc"; return 1; }
  line=$(jq -r '.jobs[0] | if .error != 0 then "error \(.error)" else
      "\(.read.iops|floor) \(.read.lat_ns.mean/1000*10|floor/10) \(.read.clat_ns.percentile["99.000000"]/1000*10|floor/10) \(.read.total_ios)" end' "$j") || return 1
  echo "fio: $line"
  case $line in error*|*" 0") echo "fio reported an error or no I/O done"; return 1 ;; esac
  if [ "$t" = knvmet ] && [ -n "$KC_KDEV" ] && [ "$n1" -le "$n0" ]; then
    echo "null_blk $KC_KDEV saw no reads ($n0 -> $n1)"; return 1
  fi
  set -- $line
  echo "$t $bs $qd $r $1 $2 $3 $(kc_busy "$c0" "$c1" | tr ' ' '~') $(kc_diag_delta "$d0" "$d1" "$t" | tr ' ' '~')" >>"$KC_TSV"
}
# kc_round BS QD ROUND: one run against each target; odd rounds start with
# pollux-tgt, even ones with nvmet
kc_round() {
  local t order="pollux knvmet"
  [ $(($3 % 2)) = 0 ] && order="knvmet pollux"
  for t in $order; do kc_fio "$t" "$1" "$2" "$3" || return 1; done
}
kc_show() {  # the round's lines of $KC_TSV
  awk -v bs="$1" -v qd="$2" -v r="$3" '$2 == bs && $3 == qd && $4 == r {
    gsub("~", " ", $8); gsub("~", " ", $9)
    printf "  kcompare: %-6s %4s QD%-2s round %s: %7d IOPS, lat mean %7.1f us, p99 %7.1f us (busy %s)\n      %s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9}' "$KC_TSV"
}
# kc_summary: per cell and target the median IOPS (each round's in brackets)
# and the median of the mean and p99 latencies; the pollux/knvmet ratios of
# the median IOPS, into RESULTS as INFO lines
kc_summary() {
  local cell bs qd t line ratio p k
  [ -s "$KC_TSV" ] || return 0
  echo
  echo "kcompare: kernel host + fio randread, pollux-tgt (null bdev, 512 B, --idle $KC_IDLE) vs nvmet-tcp (${KC_KDEV:-tmpfs file}), $KC_SECS s per run, medians of $KC_ROUNDS rounds"
  for cell in $KC_CELLS; do
    bs=${cell%:*} qd=${cell#*:}
    for t in pollux knvmet; do
      line=$(awk -v t="$t" -v bs="$bs" -v qd="$qd" '
        function med(a, n,   i, j, x) { for (i = 2; i <= n; i++) { x = a[i]; for (j = i - 1; j > 0 && a[j] > x; j--) a[j+1] = a[j]; a[j+1] = x }
                                    return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2 }
        $1 == t && $2 == bs && $3 == qd { n++; i[n] = $5; l[n] = $6; p[n] = $7; all = all (n > 1 ? "/" : "") $5 }
        END { if (n) printf "%d %.1f %.1f %s\n", med(i, n), med(l, n), med(p, n), all }' "$KC_TSV")
      [ -n "$line" ] || continue
      set -- $line
      printf -v "kc_$t" %s "$1"
      RESULTS+=("INFO  kcompare/$t-$bs-q$qd: $1 IOPS ($4), lat mean $2 us, p99 $3 us")
      printf 'kcompare: %-6s %4s QD%-2s median %7d IOPS (%s), lat mean %7.1f us, p99 %7.1f us\n' "$t" "$bs" "$qd" "$1" "$4" "$2" "$3"
    done
    p=${kc_pollux:-0} k=${kc_knvmet:-0}
    unset kc_pollux kc_knvmet
    [ "$p" -gt 0 ] && [ "$k" -gt 0 ] || continue
    ratio=$(awk -v p="$p" -v k="$k" 'BEGIN{printf "%.2f", p / k}')
    line="kcompare: $bs$([ "$qd" = 32 ] || echo "-qd$qd") pollux/knvmet = $ratio"
    awk -v r="$ratio" 'BEGIN{exit !(r < 1)}' && line+="  (below 1.0: reported, not failed; TCG timing)"
    RESULTS+=("INFO  $line")
    echo "$line"
  done
  cp "$KC_TSV" "$OUTDIR/" 2>/dev/null
}

kib() { echo $(( $1 * SCALE ))k; }
want() { [[ " $RUNS " == *" $1 "* ]]; }

finish() {
  stop_tgt quiet
  nvme disconnect -n "$NQN" >/dev/null 2>&1
  nvme disconnect -n "$KNQN_NULL" >/dev/null 2>&1
  nvme disconnect -n "$NQN_NULL" >/dev/null 2>&1
  knvmet_down
  kc_down >/dev/null 2>&1
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
  if check connect 60 connect --hdr-digest --data-digest --queue-size=16; then
    check digests 10 digests_on
    check queue-size-16 10 small_queues
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

RUN=kcompare
if want kcompare; then
  if [ "$(nproc)" -gt 1 ]; then KC_CPU=1; say "kcompare: pollux-tgt's reactor on vCPU 0, fio on vCPU 1 ($(nproc) vCPUs)"
  else say "kcompare: NOTE one vCPU: pollux-tgt's reactor, fio and the kernel target share it"; fi
  : >"$KC_TSV"
  KC_KSOFT=$(pgrep -x ksoftirqd/0 | head -1) KC_CLK_TCK=$(getconf CLK_TCK)
  kc_rps_old=()
  kc_masks=("$KC_RPS" "$KC_RPS")
  [ "$KC_RPS" = split ] && kc_masks=(1 2)
  [ "$KC_RPS" = split ] && [ "$(nproc)" -lt 2 ] && kc_masks=("" "")
  for i in "$LAB_TARGET_IF" "$LAB_HOST_IF"; do
    f=/sys/class/net/$i/queues/rx-0/rps_cpus
    kc_rps_old+=("$(cat "$f")")
    m=${kc_masks[${#kc_rps_old[@]} - 1]}
    [ -z "$m" ] || [ "$m" = lab ] || echo "$m" >"$f" || say "kcompare: rps_cpus=$m on $i refused"
  done
  say "kcompare: receive packet steering: rps_cpus $(cat "/sys/class/net/$LAB_TARGET_IF/queues/rx-0/rps_cpus") on $LAB_TARGET_IF, $(cat "/sys/class/net/$LAB_HOST_IF/queues/rx-0/rps_cpus") on $LAB_HOST_IF"
  if check config 10 write_kcfg && TCFG=$W/tgt-kcmp.toml TIDLE=$KC_IDLE start_tgt; then
    kc_ok=1
    check nvmet-null-up 60 kc_up && check connect-knvmet 60 kc_connect "$KNQN_NULL" "$KPORT" KC_KNS || kc_ok=0
    check connect-pollux 60 kc_connect "$NQN_NULL" "$PORT" KC_PNS || kc_ok=0
    if [ $kc_ok = 1 ]; then
      say "kcompare: pollux-tgt /dev/$KC_PNS, nvmet-tcp /dev/$KC_KNS (${KC_KDEV:-tmpfs file, NOT null_blk}), cells (BS:QD) $KC_CELLS"
      for cell in $KC_CELLS; do
        for r in $(seq "$KC_ROUNDS"); do
          check "${cell%:*}-q${cell#*:}-round$r" 60 kc_round "${cell%:*}" "${cell#*:}" "$r" || break 2
          kc_show "${cell%:*}" "${cell#*:}" "$r"
        done
      done
      kc_summary
    fi
    [ -z "$KC_KNS" ] || check disconnect-knvmet 60 kc_disconnect "$KNQN_NULL"
    [ -z "$KC_PNS" ] || check disconnect-pollux 60 kc_disconnect "$NQN_NULL"
    check teardown 60 kc_down
    stop_tgt
  fi
  echo "${kc_rps_old[0]}" >"/sys/class/net/$LAB_TARGET_IF/queues/rx-0/rps_cpus"
  echo "${kc_rps_old[1]}" >"/sys/class/net/$LAB_HOST_IF/queues/rx-0/rps_cpus"
fi
finish
