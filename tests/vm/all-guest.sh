#!/usr/bin/env bash
# Runs inside the lab guest (tests/vm/lab -c 3 run tests/vm/all-guest.sh
# BIN_DIR [VERBS_TEST...]), called by tests/vm/run-all.sh: every interop
# check of tests/vm in one boot, one after another, each with the time limit
# and the output directory ($LAB_OUT/NAME) it has when run on its own.
# BIN_DIR holds pollux-tgt and pollux-perf (built with --features ibverbs)
# and pattern.img (tests/vm/make-pattern.sh); VERBS_TEST are pollux-verbs'
# ibverbs test binaries.
#   verbs      tests/vm/guest-run-tests.sh VERBS_TEST...   (480 s)
#   nvmf       tests/vm/nvmf-guest.sh                      (1500 s)
#   tcp        tests/vm/tcp-guest.sh                       (1200 s)
#   host       tests/vm/host-guest.sh                      (420 s)
#   iser       tests/vm/iser-guest.sh                      (1500 s)
#   placement  tests/vm/placement-guest.sh (needs 3 vCPUs) (420 s)
#   soak       tests/vm/soak-guest.sh                      (900 s)
# LAB_USER_VM_CHECKS="nvmf tcp" runs only the named ones. Between checks the
# kernel log is saved to the finished check's directory and cleared (checks
# read it for their own errors), and anything a check left behind is
# reported and removed: pollux processes, NVMe controllers, iSCSI sessions,
# nvmet ports. Prints each check's status and time, then a summary; exits 1
# when any check failed or left something behind.
set -u
[ "${LAB_IN_GUEST:-}" = 1 ] || { echo "run inside tests/vm/lab" >&2; exit 2; }
B=${1:?usage: all-guest.sh BIN_DIR [VERBS_TEST...]}; shift
VERBS=("$@")
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT_OUT=$LAB_OUT
WANT=" ${LAB_USER_VM_CHECKS:-verbs nvmf tcp host iser placement soak} "
SUMMARY=() FAILED=0

# leftovers NAME: report and remove what check NAME left behind; 1 if any.
leftovers() {
  local left="" p
  # By process name: command lines (this script's own) name the binaries.
  p=$( { pgrep -x pollux-tgt; pgrep -x pollux-perf; pgrep conformance_ibv; } | tr '\n' ' ')
  if [ -n "$p" ]; then left+=" processes($p)"; kill -KILL $p 2>/dev/null; sleep 1; fi
  if ls /sys/class/nvme-fabrics/ctl/ 2>/dev/null | grep -q '^nvme'; then
    left+=" nvme-controllers"; nvme disconnect-all >/dev/null 2>&1
  fi
  if iscsiadm -m session >/dev/null 2>&1; then
    left+=" iscsi-sessions"; iscsiadm -m node --logoutall=all >/dev/null 2>&1
  fi
  local c=/sys/kernel/config/nvmet
  if [ -n "$(ls "$c/ports" 2>/dev/null)" ]; then
    left+=" nvmet-ports"
    rm -f "$c"/ports/*/subsystems/* 2>/dev/null
    rmdir "$c"/ports/* "$c"/subsystems/*/namespaces/* "$c"/subsystems/* 2>/dev/null
  fi
  [ -z "$left" ] && return 0
  echo "=== $1 left behind:$left"
  return 1
}

# check NAME LIMIT SCRIPT ARG...: run one check in $ROOT_OUT/NAME.
check() {
  local name=$1 limit=$2 t0 rc status
  shift 2
  [[ $WANT == *" $name "* ]] || return 0
  mkdir -p "$ROOT_OUT/$name"
  dmesg -C
  echo "=== $name ($(date +%T), limit $limit s)"
  t0=$SECONDS
  LAB_OUT=$ROOT_OUT/$name timeout -k 10 "$limit" bash "$@"
  rc=$?
  dmesg >"$ROOT_OUT/$name/dmesg.log"
  case $rc in 0) status=PASS ;; 124|137) status="TIMEOUT ($limit s)" ;; *) status="FAIL (exit $rc)" ;; esac
  leftovers "$name" || { [ $rc = 0 ] && status="FAIL (left state behind)"; rc=1; }
  ((rc == 0)) || FAILED=1
  SUMMARY+=("$(printf '%-10s %-26s %5d s' "$name" "$status" $((SECONDS - t0)))")
  echo "=== $name: $status after $((SECONDS - t0)) s"
}

if ((${#VERBS[@]})); then
  check verbs 480 "$HERE/guest-run-tests.sh" "${VERBS[@]}"
elif [[ $WANT == *" verbs "* ]]; then
  SUMMARY+=("verbs      FAIL (no test binary)"); FAILED=1
fi
check nvmf 1500 "$HERE/nvmf-guest.sh" "$B/pollux-tgt"
check tcp 1200 "$HERE/tcp-guest.sh" "$B/pollux-tgt" "$B/pollux-perf"
check host 420 "$HERE/host-guest.sh" "$B/pollux-perf" "$B/pollux-tgt" "$B/pattern.img"
check iser 1500 "$HERE/iser-guest.sh" "$B/pollux-tgt" "$B/pollux-perf"
if [ "$(nproc)" -ge 3 ]; then
  check placement 420 "$HERE/placement-guest.sh" "$B/pollux-perf" "$B/pollux-tgt"
elif [[ $WANT == *" placement "* ]]; then
  SUMMARY+=("placement  FAIL (needs 3 vCPUs, has $(nproc))"); FAILED=1
fi
check soak 900 "$HERE/soak-guest.sh" "$B/pollux-perf" "$B/pollux-tgt"

echo "=== summary"
printf '%s\n' "${SUMMARY[@]}"
exit $FAILED
