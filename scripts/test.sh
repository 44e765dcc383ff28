#!/usr/bin/env bash
# Runs every test: builds Release and runs ctest (unit + integration), then builds the
# sanitizer configuration and runs the tests labelled `asan` under AddressSanitizer + UBSan,
# then builds the libFuzzer targets (clang) and runs each for a few seconds (scripts/fuzz.sh).
# The Release run includes the short soak (label soak, THERMOCLINE_SOAK_SECONDS, default 45).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh Release build
(cd build && ctest --output-on-failure -j"$(nproc)" --timeout 600)
scripts/build.sh Asan build-asan -DTHERMOCLINE_CUDA=OFF
(cd build-asan && ctest --output-on-failure -j"$(nproc)" -L asan --timeout 900)
scripts/fuzz.sh "${THERMOCLINE_FUZZ_SECONDS:-10}" build-fuzz
