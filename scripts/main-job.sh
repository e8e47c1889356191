#!/usr/bin/env bash
# The main job: our NVMe-oF target on a null bdev over the software RDMA
# provider (core 0), pollux-perf against it from core 1, and a table of
# IOPS/host-CPU% per block size (512 B … 64 KiB) and host memory mode.
#
#   bash scripts/main-job.sh            # sweep, SECS=1 per cell
#   SECS=3 MODES=pool,register-always+inline bash scripts/main-job.sh
#   bash scripts/main-job.sh --single   # one 5 s randread 4 KiB run, JSON
#   BS=512 MEM=pool bash scripts/main-job.sh --single   # the issue-5 goals
#   WORKLOAD=randread bash scripts/main-job.sh          # read-only sweep
#
# It needs nothing but cargo. The target is `pollux-tgt` (the example
# config apps/config/tgt-null.toml with 512-byte blocks, core 0, its stats
# file giving the target's busy %), started, awaited ("ready") and stopped
# with SIGINT afterwards. SPAWN=1 instead runs the same target core and RDMA
# transport inside pollux-perf (`--spawn-target`) on its own reactor core.
set -euo pipefail
cd "$(dirname "$0")/.."

SECS=${SECS:-1}
QD=${QD:-128}
MODES=${MODES:-pool,register-always+inline,register-always+inline+local-inv}
BDEV=${BDEV:-null:size=1G,block=512}
WORKLOAD=${WORKLOAD:-randrw}
TGT_CORE=0
HOST_CORE=1
if [ "$(nproc)" -lt 2 ]; then
    echo "main-job: one CPU only: target and host share core 0 (figures will be low)" >&2
    HOST_CORE=0
fi

cargo build --release --bin pollux-perf >&2
PERF=target/release/pollux-perf

if [ "${1:-}" = "--single" ]; then
    # BS, MEM (pool | register-always) and SECS_SINGLE pick the run.
    RUN=(-q "$QD" -o "${BS:-4096}" -w "${SINGLE_WORKLOAD:-randread}" -t "${SECS_SINGLE:-5}"
        --cores "$HOST_CORE" --json)
    if [ -n "${MEM:-}" ]; then
        RUN+=(--mem "$MEM")
    fi
else
    RUN=(--sweep --sweep-modes "$MODES" -q "$QD" -w "$WORKLOAD" -t "$SECS" --cores "$HOST_CORE")
fi

TGT_PID=
cleanup() {
    if [ -n "$TGT_PID" ] && kill -0 "$TGT_PID" 2>/dev/null; then
        kill -INT "$TGT_PID" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$TGT_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$TGT_PID" 2>/dev/null || true
        wait "$TGT_PID" 2>/dev/null || true
    fi
}
trap cleanup EXIT

if [ -f apps/src/bin/pollux-tgt.rs ] && [ -f apps/config/tgt-null.toml ] && [ -z "${SPAWN:-}" ]; then
    cargo build --release --bin pollux-tgt >&2
    WORK=$(mktemp -d)
    trap 'cleanup; rm -rf "$WORK"' EXIT
    # The example config, with 512-byte blocks so the sweep can start at 512 B.
    sed -e 's/block=4096/block=512/' -e "s/^cores = .*/cores = \"$TGT_CORE\"/" \
        apps/config/tgt-null.toml >"$WORK/tgt.toml"
    target/release/pollux-tgt -c "$WORK/tgt.toml" --stats-file "$WORK/stats.json" >"$WORK/tgt.log" 2>&1 &
    TGT_PID=$!
    for _ in $(seq 300); do
        grep -q 'pollux-tgt: ready' "$WORK/tgt.log" 2>/dev/null && break
        kill -0 "$TGT_PID" 2>/dev/null || { cat "$WORK/tgt.log" >&2; exit 1; }
        sleep 0.1
    done
    grep -q 'pollux-tgt: ready' "$WORK/tgt.log" || { echo "main-job: pollux-tgt did not start" >&2; cat "$WORK/tgt.log" >&2; exit 1; }
    TRID=${POLLUX_TGT_TRID:-"trtype:soft traddr:@pollux-tgt subnqn:nqn.2016-06.io.pollux:null0"}
    "$PERF" -r "$TRID" --target-stats "$WORK/stats.json" "${RUN[@]}"
    cleanup
    TGT_PID=
    echo "main-job: pollux-tgt stopped" >&2
else
    "$PERF" --spawn-target "$BDEV" --target-cores "$TGT_CORE" "${RUN[@]}"
fi
