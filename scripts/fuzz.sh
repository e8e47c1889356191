#!/usr/bin/env bash
# Run every cargo-fuzz target of fuzz/ for N seconds each (default 20) and
# fail on the first crash (libFuzzer's artifact lands in fuzz/artifacts/).
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#
# cargo-fuzz wants a nightly compiler; on stable, RUSTC_BOOTSTRAP=1 unlocks
# the flags it passes (-Zsanitizer=address). Installs cargo-fuzz when it is
# missing. Each target starts from its checked-in seeds (fuzz/seeds/TARGET,
# read-only) and grows its own corpus in fuzz/corpus/TARGET (ignored by git).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs="${1:-20}"
shift || true
[[ "$secs" =~ ^[0-9]+$ ]] || { echo "usage: $0 [SECONDS] [TARGET...]" >&2; exit 2; }
export RUSTC_BOOTSTRAP=1
if ! cargo fuzz --version >/dev/null 2>&1; then
  # A debug build: it only drives cargo, and builds in two thirds the time.
  echo "=== installing cargo-fuzz 0.13.2"
  cargo install cargo-fuzz --version 0.13.2 --locked --debug
fi
targets=("$@")
if ((${#targets[@]} == 0)); then
  mapfile -t targets < <(cargo fuzz list)
fi
echo "=== cargo fuzz build (${targets[*]})"
cargo fuzz build
fail=()
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  seeds=()
  [[ -d "seeds/$t" ]] && seeds=("seeds/$t")
  echo "=== fuzz $t for ${secs}s"
  # -rss_limit_mb: the nvmf targets keep a live in-process target per thread.
  # The whole log goes to logs/TARGET.log; on a crash the panic and its
  # stack are printed here, so that a CI log alone says what broke.
  mkdir -p logs
  if ! cargo fuzz run "$t" "corpus/$t" "${seeds[@]}" -- \
      -max_total_time="$secs" -rss_limit_mb=4096 -print_final_stats=1 >"logs/$t.log" 2>&1; then
    fail+=("$t")
    echo "--- $t crashed; the failure (full log: fuzz/logs/$t.log):"
    grep -m1 -A40 -E "panicked at|==ERROR|SUMMARY:" "logs/$t.log" || tail -n 60 "logs/$t.log"
    grep -E "^Test unit written to|Reproduce with" -A2 "logs/$t.log" || true
  else
    tail -n 6 "logs/$t.log"
  fi
done
if ((${#fail[@]})); then
  echo "FUZZ FAILED: ${fail[*]} (see fuzz/artifacts/)" >&2
  exit 1
fi
echo "FUZZ OK: ${targets[*]} (${secs}s each)"
