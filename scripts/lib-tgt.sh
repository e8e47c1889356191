# Sourced by the benchmark scripts: run a pollux-tgt for the length of the
# script and stop it cleanly whichever way the script ends.
#
#   source scripts/lib-tgt.sh
#   tgt_start CONFIG.toml       # waits for "pollux-tgt: ready" (10 s)
#
# TGT_BIN names the binary (default target/release/pollux-tgt).
#
# The target's log is $TGT_WORK/tgt.log; $TGT_WORK (a temporary directory
# for the script's own files too) is removed at exit.
TGT_WORK=$(mktemp -d /tmp/pollux-bench.XXXXXX)
TGT_PID=
tgt_stop() {
    if [ -n "$TGT_PID" ] && kill -0 "$TGT_PID" 2>/dev/null; then
        kill -INT "$TGT_PID" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$TGT_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$TGT_PID" 2>/dev/null || true
        wait "$TGT_PID" 2>/dev/null || true
    fi
    TGT_PID=
}
trap 'tgt_stop; rm -rf "$TGT_WORK"' EXIT
tgt_start() {
    "${TGT_BIN:-target/release/pollux-tgt}" -c "$1" >"$TGT_WORK/tgt.log" 2>&1 &
    TGT_PID=$!
    for _ in $(seq 100); do
        grep -q 'pollux-tgt: ready' "$TGT_WORK/tgt.log" 2>/dev/null && return 0
        kill -0 "$TGT_PID" 2>/dev/null || { cat "$TGT_WORK/tgt.log" >&2; return 1; }
        sleep 0.1
    done
    echo "pollux-tgt did not start in 10 s" >&2
    cat "$TGT_WORK/tgt.log" >&2
    return 1
}
