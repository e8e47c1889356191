#!/usr/bin/env bash
# Long connection-churn soak: N cycles of connect -> verified I/O -> end
# (clean, dropped, stalled keep-alive, SIGKILLed host with I/O in flight,
# refused for an unknown subsystem or beyond the granted queues) against an
# NVMe-oF target process over the software RDMA provider (rdma) and over
# NVMe/TCP on loopback (tcp), and the same churn of iSER sessions (iser;
# also initiators that stop answering, dropped by the target's NOP-In ping,
# and connections refused beyond the connection limit).
# Prints each test's samples as CSV (cycle, the target's descriptors,
# mappings and RSS, ...) and fails, as the CI runs do, when one grows
# beyond its bound after the warm-up.
#
#   scripts/soak.sh [CYCLES] [rdma|tcp|iser|nvmf|all] [SAMPLE_EVERY]
#   scripts/soak.sh 100000 tcp 1000 > soak.csv
#
# nvmf is rdma and tcp. Defaults: 10000 cycles, all, a sample every
# CYCLES/100 cycles (at least 50).
# SOAK_PROFILE=dev runs a debug build (default: release).
set -euo pipefail
cd "$(dirname "$0")/.."
cycles=${1:-10000}
which=${2:-all}
every=${3:-$(( cycles / 100 > 50 ? cycles / 100 : 50 ))}
case "$which" in rdma | tcp | iser | nvmf | all) ;; *)
  echo "usage: $0 [CYCLES] [rdma|tcp|iser|nvmf|all] [SAMPLE_EVERY]" >&2
  exit 2
  ;;
esac

# run TEST NAME LABEL: build test binary TEST, copy it to a directory of
# this run's own (a rebuild during a long run would otherwise replace the
# executable the run re-executes for its target and host children), run
# test NAME from there.
run() {
  local test=$1 name=$2 label=$3 exe
  echo "# $label ($test): $cycles cycles, a sample every $every" >&2
  exe=$(cargo test --profile "${SOAK_PROFILE:-release}" -q -p pollux-tests --test "$test" --no-run \
    --message-format=json | python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])
' "$test") || return 1
  [[ -x $exe ]] || { echo "# no test binary for $test" >&2; return 1; }
  cp "$exe" "$work/$test" || return 1
  POLLUX_SOAK_CYCLES=$cycles POLLUX_SOAK_SAMPLE_EVERY=$every \
    "$work/$test" "$name" --exact --nocapture --test-threads 1 -q 2>&1 |
    csv "$label"
  return "${PIPESTATUS[0]}"
}

# csv LABEL: the samples from the test's output as CSV lines (LABEL first),
# its verdicts on stderr; line by line, so a long run shows its curve as it
# goes.
csv() {
  local line
  while IFS= read -r line; do
    case $line in
    cycle,*) echo "test,$line" ;;
    [0-9]*,*) echo "$1,$line" ;;
    *panicked*)
      echo "# $line" >&2
      # The panic's message is on the next line.
      IFS= read -r line && echo "# $line" >&2
      ;;
    *grew* | *soak:* | *"iser churn:"*) echo "# $line" >&2 ;;
    esac
  done
}

work=$(mktemp -d "${TMPDIR:-/tmp}/pollux-soak.XXXXXX")
trap 'rm -rf "$work"' EXIT
status=0
if [[ $which == rdma || $which == nvmf || $which == all ]]; then
  run churn soak_connect_io_disconnect_returns_everything rdma || status=$?
fi
if [[ $which == tcp || $which == nvmf || $which == all ]]; then
  run churn tcp_soak_connect_io_disconnect_returns_everything tcp || status=$?
fi
if [[ $which == iser || $which == all ]]; then
  run iser_churn iser_churn_returns_everything iser || status=$?
fi
exit "$status"
