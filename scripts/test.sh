#!/usr/bin/env bash
# Runs every test: builds Release and runs ctest (unit + integration), then builds the
# sanitizer configuration and runs the tests labelled `asan` under AddressSanitizer + UBSan,
# then builds the libFuzzer targets (clang) and runs each for a few seconds (scripts/fuzz.sh).
# The Release run includes the short soak (label soak, THERMOCLINE_SOAK_SECONDS, default 45).
set -euo pipefail
cd "$(dirname "$0")/.."
# Each ctest run ends with how many tests skipped and why (scripts/skip_summary.py): a skip
# is a test that proved nothing, so it is said, not buried in the log. Without ../shared the
# tests that need it skip (saying so); under CI they fail instead.
run_ctest() {  # NAME DIR ctest-args...
  local name=$1 dir=$2 rc=0
  shift 2
  (cd "$dir" && ctest --output-on-failure --output-junit ctest-results.xml "$@") || rc=$?
  /usr/bin/python3 scripts/skip_summary.py "$dir/ctest-results.xml" "$name" || true
  return "$rc"
}
scripts/build.sh Release build
run_ctest Release build -j"$(nproc)" --timeout 600
scripts/build.sh Asan build-asan -DTHERMOCLINE_CUDA=OFF
run_ctest ASan+UBSan build-asan -j"$(nproc)" -L asan --timeout 900
scripts/fuzz.sh "${THERMOCLINE_FUZZ_SECONDS:-10}" build-fuzz
