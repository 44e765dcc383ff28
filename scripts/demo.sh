#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine, with nothing to download: install the packages,
# build, synthesize a small model, and generate text from it on the CPU.
# Usage: scripts/demo.sh [PROMPT]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh Release build
mkdir -p out
if [[ ! -f out/demo.gguf ]]; then
  build/bin/thermocline synth -o out/demo.gguf --seed 1
fi
build/bin/thermocline generate --model out/demo.gguf --prompt "${1:-Once upon a time}" \
  --max-new-tokens 48 --temperature 0.8 --seed 42
