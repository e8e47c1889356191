#!/usr/bin/env bash
# Runs inside the lab guest (one boot): the ibverbs test binaries given as
# arguments, then with --perf perftest's ib_send_lat / ib_write_bw beside
# the same measurements through pollux-verbs, printed with their ratios.
#   tests/vm/lab run tests/vm/guest-verbs.sh [--perf PERF_BIN [--tool TOOL]] BIN...
# PERF_BIN: a (release) build of the test binary with the perf measurement;
# TOOL: pollux-verbs-perf built with --features ibverbs (optional).
set -u
[ "${LAB_IN_GUEST:-}" = 1 ] || { echo "run inside tests/vm/lab" >&2; exit 2; }
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
perf=0 perf_bin="" tool=""
[ "${1:-}" = --perf ] && { perf=1; perf_bin=${2:?perf binary}; shift 2; }
[ "${1:-}" = --tool ] && { tool=${2:?tool}; shift 2; }
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

echo "=== pollux-verbs, same sizes ($(basename "$perf_bin"), $(date +%T))"
out=$("$perf_bin" --ignored --exact perf_send_lat_and_write_bw --nocapture 2>&1) || { echo "$out"; rc=1; }
ours=$(grep -o 'POLLUX_PERF.*' <<<"$out" | tail -1)
plat=$(grep -o 'send_lat_avg_us=[0-9.]*' <<<"$ours" | cut -d= -f2)
pbw=$(grep -o 'write_bw_gbps=[0-9.]*' <<<"$ours" | cut -d= -f2)
tlat="" tbw=""
if [ -n "$tool" ] && [ -x "$tool" ]; then
  echo "=== pollux-verbs-perf --provider ibverbs ($(date +%T))"
  "$tool" server --provider ibverbs --device "$LAB_TARGET_DEV" --addr "$T:18800" >/tmp/pvp-srv.log 2>&1 & srv=$!
  sleep 1   # the client below retries if the server is not listening yet
  run_tool() {
    local i
    for i in 1 2 3; do
      timeout 120 "$tool" client --provider ibverbs --device "$LAB_HOST_DEV" --addr "$T:18800" --json "$@" && return 0
      sleep 1
    done
    return 1
  }
  run_tool --test send-lat --size 2 --iters 1000 >/tmp/pvp-lat.json || { echo "pollux-verbs-perf send-lat failed"; rc=1; }
  run_tool --test write-bw --size 65536 --iters 500 >/tmp/pvp-bw.json || { echo "pollux-verbs-perf write-bw failed"; rc=1; }
  kill "$srv" 2>/dev/null; wait "$srv" 2>/dev/null
  field() { python3 -c '
import json, re, sys
text = open(sys.argv[1]).read()
for m in re.finditer(r"\{[^{}]*\}", text):
    try: row = json.loads(m.group(0))
    except ValueError: continue
    v = row.get(sys.argv[2])
    if v is not None: print("%.3f" % (v / float(sys.argv[3]))); break
' "$@" 2>/dev/null; }
  tlat=$(field /tmp/pvp-lat.json lat_avg_us 2)         # round trip -> one way, as perftest
  tbw=$(field /tmp/pvp-bw.json bw_mb_s 125)            # MB/s -> Gb/s
fi
echo "=== results (TCG guest: compare ratios, not absolute values)"
printf '%-28s %12s %12s %8s %12s %8s\n' measurement perftest pollux-test ratio verbs-perf ratio
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", b / a; else print "n/a" }'; }
printf '%-28s %12s %12s %8s %12s %8s\n' "send lat 2B t_avg (us)" "${lat:-n/a}" "${plat:-n/a}" "$(ratio "${lat:-0}" "${plat:-0}")" \
  "${tlat:-n/a}" "$(ratio "${lat:-0}" "${tlat:-0}")"
printf '%-28s %12s %12s %8s %12s %8s\n' "write bw 64KiB (Gb/s)" "${bw:-n/a}" "${pbw:-n/a}" "$(ratio "${bw:-0}" "${pbw:-0}")" \
  "${tbw:-n/a}" "$(ratio "${bw:-0}" "${tbw:-0}")"
echo "ratio = pollux / perftest. pollux-test: one thread drives both sides (perftest: two processes)."
exit $rc
