#!/usr/bin/env bash
# Runs inside the lab guest (one boot): the ibverbs test binaries given as
# arguments, then with --perf perftest's ib_send_lat / ib_write_bw beside
# the same measurements through pollux-verbs, printed with their ratios.
#   tests/vm/lab run tests/vm/guest-verbs.sh [--perf] BIN...
set -u
[ "${LAB_IN_GUEST:-}" = 1 ] || { echo "run inside tests/vm/lab" >&2; exit 2; }
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
perf=0
[ "${1:-}" = --perf ] && { perf=1; shift; }
bash "$HERE/guest-run-tests.sh" "$@"; rc=$?
[ "$perf" = 1 ] || exit $rc

T=$LAB_TARGET_ADDR
echo "=== perftest ib_send_lat -R, 2 bytes x 1000 ($(date +%T))"
timeout 120 ib_send_lat -R -d "$LAB_TARGET_DEV" -n 1000 >/tmp/lat-srv.log 2>&1 & srv=$!
sleep 2   # perftest's server has no readiness signal; the client retries below
for _ in 1 2 3; do timeout 110 ib_send_lat -R -d "$LAB_HOST_DEV" -n 1000 "$T" >/tmp/lat.log 2>&1 && break; sleep 2; done
wait $srv
lat=$(awk '$1 == 2 && NF >= 6 {print $6}' /tmp/lat.log)   # t_avg [usec]
echo "=== perftest ib_write_bw -R, 64 KiB x 500 ($(date +%T))"
timeout 120 ib_write_bw -R -d "$LAB_TARGET_DEV" -n 500 --report_gbits >/tmp/bw-srv.log 2>&1 & srv=$!
sleep 2
for _ in 1 2 3; do timeout 110 ib_write_bw -R -d "$LAB_HOST_DEV" -n 500 --report_gbits "$T" >/tmp/bw.log 2>&1 && break; sleep 2; done
wait $srv
bw=$(awk '$1 == 65536 && NF >= 4 {print $4}' /tmp/bw.log)  # BW average [Gb/sec]

ours=""
for bin in "$@"; do
  out=$("$bin" --ignored --exact perf_send_lat_and_write_bw --nocapture 2>&1) || { echo "$out"; rc=1; }
  ours=$(grep -o 'POLLUX_PERF.*' <<<"$out" | tail -1)
  [ -n "$ours" ] && break
done
plat=$(grep -o 'send_lat_avg_us=[0-9.]*' <<<"$ours" | cut -d= -f2)
pbw=$(grep -o 'write_bw_gbps=[0-9.]*' <<<"$ours" | cut -d= -f2)
echo "=== results (TCG guest: compare ratios, not absolute values)"
printf '%-28s %12s %12s %8s\n' measurement perftest pollux ratio
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", b / a; else print "n/a" }'; }
printf '%-28s %12s %12s %8s\n' "send lat 2B t_avg (us)" "${lat:-n/a}" "${plat:-n/a}" "$(ratio "${lat:-0}" "${plat:-0}")"
printf '%-28s %12s %12s %8s\n' "write bw 64KiB (Gb/s)" "${bw:-n/a}" "${pbw:-n/a}" "$(ratio "${bw:-0}" "${pbw:-0}")"
if command -v pollux-verbs-perf >/dev/null || [ -x target/release/pollux-verbs-perf ]; then
  echo "(pollux-verbs-perf exists; not wired here yet)"
fi
exit $rc
