#!/usr/bin/env bash
# Configures and builds Thermocline. Usage: scripts/build.sh [BUILD_TYPE] [BUILD_DIR] [cmake args...]
# BUILD_TYPE: Release (default), RelWithDebInfo, Debug or Asan (AddressSanitizer + UBSan).
set -euo pipefail
cd "$(dirname "$0")/.."
type=${1:-Release}
dir=${2:-build}
shift $(( $# > 2 ? 2 : $# ))
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE="$type" "$@" >/dev/null
cmake --build "$dir" -j"$(nproc)"
