#!/usr/bin/env bash
# CI entry: build pollux-verbs' ibverbs tests on this host, boot the VM lab
# once, run them against two soft-RoCE devices, exit non-zero on failure.
#   tests/vm/run-verbs-conformance.sh [--perf]
# --perf builds with --release and also runs perftest (ib_send_lat,
# ib_write_bw) beside the same measurements through pollux-verbs, same boot.
# Prerequisites: tests/vm/lab --setup-only (root, once per machine).
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 125
LAB=tests/vm/lab
PERF=0
[ "${1:-}" = --perf ] && PERF=1

"$LAB" --setup-only -q || exit $?
# Test binaries of the ibverbs suite (integration tests named *ibverbs*).
build() { tests/vm/build-verbs-tests.sh "$@"; }   # cargo args -> executables
mapfile -t bins < <(build) && [ ${#bins[@]} -gt 0 ] || exit 1
echo "test binaries: ${bins[*]}" >&2
if [ "$PERF" = 1 ]; then
  # Measure optimised code; the suite itself runs from the debug build (its
  # waits are bounded by polling rounds, sized for that).
  mapfile -t rel < <(build --release) && [ ${#rel[@]} -gt 0 ] || exit 1
  tool=()
  if cargo build --release -q -p pollux-apps --features ibverbs --bin pollux-verbs-perf; then
    tool=(--tool "$PWD/target/release/pollux-verbs-perf")
  else
    echo "pollux-verbs-perf did not build; perftest vs pollux-test only" >&2
  fi
  exec "$LAB" -t 480 run tests/vm/guest-verbs.sh --perf "${rel[0]}" "${tool[@]}" "${bins[@]}"
fi
exec "$LAB" -t 480 run tests/vm/guest-run-tests.sh "${bins[@]}"
