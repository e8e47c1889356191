#!/usr/bin/env bash
# Runs inside the lab guest: each argument is a test binary built on the host;
# runs them one after another (one boot for all) and fails if any fails.
# Extra arguments for the binaries come from $LAB_USER_TEST_ARGS.
set -u
[ "${LAB_IN_GUEST:-}" = 1 ] || { echo "run inside tests/vm/lab" >&2; exit 2; }
rc=0
for bin in "$@"; do
  echo "=== $(basename "$bin") ($(date +%T))"
  # shellcheck disable=SC2086
  "$bin" --test-threads=1 ${LAB_USER_TEST_ARGS:-} || { echo "=== FAILED: $(basename "$bin")"; rc=1; }
done
exit $rc
