#!/usr/bin/env bash
# CI entry: build pollux-verbs' ibverbs tests on this host, boot the VM lab
# once, run them against two soft-RoCE devices, exit non-zero on failure.
#   tests/vm/run-verbs-conformance.sh [--perf]
# --perf also runs perftest (ib_write_bw, ib_send_lat) in the same boot.
# Prerequisites: tests/vm/lab --setup-only (root, once per machine).
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 125
LAB=tests/vm/lab
PERF=0
[ "${1:-}" = --perf ] && PERF=1

"$LAB" --setup-only -q || exit $?
echo "building pollux-verbs tests with --features ibverbs" >&2
json=$(cargo test -p pollux-verbs --features ibverbs --tests --no-run --message-format=json-render-diagnostics) \
  || { echo "build failed" >&2; exit 1; }
# Test binaries of the ibverbs suite (integration tests named *ibverbs*).
mapfile -t bins < <(python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "ibverbs" in m["target"]["name"]:
        print(m["executable"])
' <<<"$json")
[ ${#bins[@]} -gt 0 ] || { echo "no ibverbs test binary found" >&2; exit 1; }
echo "test binaries: ${bins[*]}" >&2
if [ "$PERF" = 1 ]; then
  exec "$LAB" -t 420 run tests/vm/guest-verbs.sh --perf "${bins[@]}"
fi
exec "$LAB" -t 480 run tests/vm/guest-run-tests.sh "${bins[@]}"
