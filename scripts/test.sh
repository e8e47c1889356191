#!/usr/bin/env bash
# The project's test command (README.md): unit, integration and fault tests
# over the software provider, then the interop checks with real verbs in the
# soft-RoCE VM (tests/vm). `--quick` skips the VM.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
[[ "${1:-}" == "--quick" ]] && quick=1

# SPDK's own JSON-RPC client for apps/tests/tgt_spdk_rpc.rs (pinned, into
# target/spdk-venv; does nothing when it is there already).
echo "=== SPDK JSON-RPC client (scripts/spdk-rpc-venv.sh)"
bash scripts/spdk-rpc-venv.sh

# Release optimisation without cross-crate LTO (the `test-release` profile in
# Cargo.toml, built in target/test-release): linking ~60 test binaries with
# thin LTO cost more than the rest of the build. --no-fail-fast: every test
# binary runs, so one failure does not hide another.
echo "=== cargo test --workspace --profile test-release --no-fail-fast"
cargo test --workspace --profile test-release --no-fail-fast

if ((quick)); then
  echo "=== VM interop skipped (--quick)"
  exit 0
fi
echo "=== VM interop (tests/vm)"
bash tests/vm/run-all.sh
