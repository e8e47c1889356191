#!/usr/bin/env bash
# Build pollux-verbs' ibverbs integration tests on this host and print their
# executables, one a line (extra arguments go to cargo, e.g. --release).
#
#   tests/vm/build-verbs-tests.sh [CARGO_ARG...]
#
# Exit: 0 with at least one executable printed, 1 otherwise.
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 1
echo "building pollux-verbs tests with --features ibverbs $*" >&2
bins=$(cargo test "$@" -p pollux-verbs --features ibverbs --tests --no-run \
  --message-format=json-render-diagnostics | python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "ibverbs" in m["target"]["name"]:
        print(m["executable"])
') || { echo "build failed" >&2; exit 1; }
[ -n "$bins" ] || { echo "no ibverbs test binary" >&2; exit 1; }
echo "$bins"
