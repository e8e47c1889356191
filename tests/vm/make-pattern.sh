#!/usr/bin/env bash
# Write the 32 MiB generation-0 pattern of `pollux-perf --verify` to FILE:
# each 8-byte word holds its byte offset XOR 0xA5A5_0000_0000_5A5A. The
# host interop check exports it through the kernel target and reads it back.
#
#   tests/vm/make-pattern.sh FILE
set -u -o pipefail
python3 - "${1:?usage: make-pattern.sh FILE}" <<'PY'
import struct, sys
K, MIB = 0xA5A5_0000_0000_5A5A, 1 << 20
with open(sys.argv[1], "wb") as f:
    for m in range(32):
        base = m * MIB
        f.write(struct.pack("<%dQ" % (MIB // 8), *[(base + i * 8) ^ K for i in range(MIB // 8)]))
PY
