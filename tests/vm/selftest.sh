#!/usr/bin/env bash
# Lab self-test, run inside the guest: tests/vm/lab run tests/vm/selftest.sh
# Both rxe ports are ACTIVE, an rping from rxe_host to rxe_tgt succeeds and
# the rxe packet counters show that the traffic crossed the veth pair.
set -u
[ "${LAB_IN_GUEST:-}" = 1 ] || { echo "run inside the lab: tests/vm/lab run $0" >&2; exit 2; }

sent() { rdma statistic show link "$1/1" | grep -oE 'sent_pkts [0-9]+' | awk '{print $2}'; }

ibv_devices
for d in "$LAB_TARGET_DEV" "$LAB_HOST_DEV"; do
  ibv_devinfo -d "$d" | grep -q PORT_ACTIVE || { echo "FAIL: $d port not active"; exit 1; }
done
before_h=$(sent "$LAB_HOST_DEV") before_t=$(sent "$LAB_TARGET_DEV")

timeout 60 rping -s -a "$LAB_TARGET_ADDR" -C 3 -v >/tmp/rping-server.log 2>&1 &
server=$!
# The server needs a moment to listen; retry the client instead of sleeping long.
for try in 1 2 3 4 5; do
  timeout 30 rping -c -a "$LAB_TARGET_ADDR" -I "$LAB_HOST_ADDR" -C 3 -v && { client=0; break; }
  client=$?
  sleep 1
done
wait "$server"; srv=$?
cat /tmp/rping-server.log
echo "rping: client rc=$client (try $try), server rc=$srv"

after_h=$(sent "$LAB_HOST_DEV") after_t=$(sent "$LAB_TARGET_DEV")
echo "rxe_host sent $((after_h - before_h)) packets, rxe_tgt sent $((after_t - before_t)) packets"
if [ "$client" = 0 ] && [ "$srv" = 0 ] && [ $((after_h - before_h)) -gt 0 ] && [ $((after_t - before_t)) -gt 0 ]; then
  echo "selftest: PASSED"
else
  echo "selftest: FAILED"; exit 1
fi
