#!/usr/bin/env bash
# Every interop check that needs real verbs, run in the soft-RoCE VM lab
# (tests/vm/lab). Called by scripts/test.sh; needs root to install the lab's
# packages the first time. Each check boots the guest once.
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 125
status=0
run() {
  echo "--- $*"
  "$@"
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "FAILED ($rc): $*"
    status=1
  fi
}
tests/vm/lab --setup-only || exit $?
run tests/vm/run-verbs-conformance.sh
run tests/vm/run-nvmf-interop.sh
run tests/vm/run-tcp-interop.sh
run tests/vm/run-host-interop.sh
run tests/vm/run-iser-interop.sh
run tests/vm/run-placement.sh
run tests/vm/run-soak.sh
exit $status
