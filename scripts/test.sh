#!/usr/bin/env bash
# Runs every test: builds Release and runs ctest (unit + integration), then builds the
# sanitizer configuration and runs the tests labelled `asan` under AddressSanitizer + UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh Release build
(cd build && ctest --output-on-failure -j"$(nproc)" --timeout 600)
scripts/build.sh Asan build-asan -DTHERMOCLINE_CUDA=OFF
(cd build-asan && ctest --output-on-failure -j"$(nproc)" -L asan --timeout 900)
