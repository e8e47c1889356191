#!/usr/bin/env bash
# Installs SPDK's own JSON-RPC client (the PyPI package `spdk`: spdk-rpc,
# rpc.py's library, spdk-cli, and configshell-fb for spdk-cli) at a pinned version into a virtual
# environment under target/, for the tests that drive pollux-tgt with it
# (apps/tests/tgt_spdk_rpc.rs; they skip, saying why, without it).
#
#   scripts/spdk-rpc-venv.sh        -> target/spdk-venv/bin/spdk-rpc
#
# Idempotent: does nothing when that version is installed already.
set -euo pipefail
cd "$(dirname "$0")/.."
version="25.9"
# spdk-cli needs configshell-fb, which the spdk package does not pull in.
configshell="2.0.3"
venv="target/spdk-venv"
if [[ -x "$venv/bin/spdk-rpc" ]] && "$venv/bin/python3" -m pip show spdk 2>/dev/null | grep -qx "Version: $version" \
  && "$venv/bin/python3" -m pip show configshell-fb 2>/dev/null | grep -qx "Version: $configshell"; then
  echo "spdk $version already in $venv"
  exit 0
fi
if ! python3 -m venv --help >/dev/null 2>&1; then
  echo "python3 with the venv module is needed (apt-get install python3-venv)" >&2
  exit 1
fi
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/python3" -m pip install --quiet --disable-pip-version-check "spdk==$version" "configshell-fb==$configshell"
echo "spdk $version installed: $venv/bin/spdk-rpc"
