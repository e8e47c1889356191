#!/usr/bin/env bash
# Build pollux-apps binaries with the ibverbs provider and copy them into a
# directory of the run's own. The build has a target directory of its own
# (target/ibverbs): a concurrent `cargo build` without the feature in
# target/ would otherwise replace the binaries between the build and the
# copy.
#
#   tests/vm/build-bins.sh OUT_DIR BIN [BIN...]
#
# Exit: 0 every BIN is in OUT_DIR and executable, 1 otherwise.
set -u -o pipefail
out=${1:?usage: build-bins.sh OUT_DIR BIN [BIN...]}; shift
(($#)) || { echo "build-bins.sh: no binary named" >&2; exit 1; }
echo "building $* (--release --features ibverbs)" >&2
args=()
for b in "$@"; do args+=(--bin "$b"); done
paths=$(CARGO_TARGET_DIR="${IBV_TARGET_DIR:-$(cd "$(dirname "$0")/../.." && pwd)/target/ibverbs}" cargo build --release -p pollux-apps --features ibverbs "${args[@]}" \
        --message-format=json-render-diagnostics | python3 -c '
import json, sys
names = set(sys.argv[1:])
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in names:
        print(m["executable"])
' "$@") || { echo "build failed" >&2; exit 1; }
for p in $paths; do cp "$p" "$out/" || exit 1; done
for b in "$@"; do
  [ -x "$out/$b" ] || { echo "build produced no $b" >&2; exit 1; }
done
