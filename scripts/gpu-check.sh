#!/usr/bin/env bash
# One command on a GPU machine that has the build's Debian libraries (docs/cuda.md): configure
# with CUDA ON, build what the check needs, then run scripts/gpu-run.sh on the build's bin/ (the
# same runner as the device bundle's run.sh: the GPU, the GPU tests, compute-sanitizer, the
# 7B-shape model, the decode benchmark and a summary table, in at most 8 minutes). A machine
# without those libraries (the device machine: CUDA, cmake and PyTorch only) takes the bundle
# instead: scripts/gpu-bundle.sh here, out/gpu-bundle/run.sh there.
#
# Usage: scripts/gpu-check.sh [BUILD_DIR]     # default build-gpu
# Environment: as scripts/gpu-run.sh (OUT, BUDGET, HOT_FRACTION, VRAM_BUDGET, TOKENS, ROUNDS,
# SPARSITY, THREADS), with MODEL defaulting to $BUILD_DIR/synth-7b-relu-q4_0.gguf.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-gpu}
start=$(date +%s)
stamp() { echo "[gpu-check $(( $(date +%s) - start ))s] $*"; }

stamp "configure ($dir, CUDA ON)"
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTHERMOCLINE_CUDA=ON >/dev/null
stamp "build"
cmake --build "$dir" -j"$(nproc)" --target thermocline thermocline-gpu-worker \
  thermocline-cpu-worker cuda_kernels_test cuda_worker_test cuda_reference_test gpu_decode_bench

export MODEL=${MODEL:-$dir/synth-7b-relu-q4_0.gguf}
exec scripts/gpu-run.sh "$dir/bin"
