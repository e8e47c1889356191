#!/usr/bin/env bash
# Long connection-churn soak over the software RDMA provider: N cycles of
# connect -> verified I/O -> disconnect (clean, dropped, stalled keep-alive,
# SIGKILLed host, refused) against an NVMe-oF target process, and the same
# churn of iSER sessions. Prints each test's samples as CSV (cycle, the
# target's descriptors, mappings and RSS, ...) and fails, as the CI runs
# do, when one grows beyond its bound after the warm-up.
#
#   scripts/soak.sh [CYCLES] [nvmf|iser|both] [SAMPLE_EVERY]
#   scripts/soak.sh 100000 nvmf 500 > soak.csv
#
# Defaults: 10000 cycles, both, a sample every CYCLES/100 cycles (at least 50).
# SOAK_PROFILE=dev runs a debug build (default: release).
set -euo pipefail
cd "$(dirname "$0")/.."
cycles=${1:-10000}
which=${2:-both}
every=${3:-$(( cycles / 100 > 50 ? cycles / 100 : 50 ))}
case "$which" in nvmf | iser | both) ;; *)
  echo "usage: $0 [CYCLES] [nvmf|iser|both] [SAMPLE_EVERY]" >&2
  exit 2
  ;;
esac

run() {
  local test=$1 name=$2
  echo "# $test: $cycles cycles, a sample every $every" >&2
  POLLUX_SOAK_CYCLES=$cycles POLLUX_SOAK_SAMPLE_EVERY=$every \
    cargo test --profile "${SOAK_PROFILE:-release}" -q -p pollux-tests --test "$test" "$name" -- --exact --nocapture --test-threads 1 2>&1 |
    awk -v t="$test" '/^cycle,/ { print "test," $0; next } /^[0-9]+,/ { print t "," $0; next } /panicked|grew|soak:|iser churn:/ { print "# " $0 > "/dev/stderr" }'
  return "${PIPESTATUS[0]}"
}

status=0
if [[ $which == nvmf || $which == both ]]; then
  run churn soak_connect_io_disconnect_returns_everything || status=$?
fi
if [[ $which == iser || $which == both ]]; then
  run iser_churn iser_churn_returns_everything || status=$?
fi
exit "$status"
