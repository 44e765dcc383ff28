#!/usr/bin/env bash
# One command on a fresh GPU machine, no network needed (docs/cuda.md): configure with CUDA ON,
# build what the check needs, run the GPU tests (label gpu; a skip counts as a failure here,
# since this script exists to run them on a device), synthesize the issue's 7B-shape ReLU model
# when it is absent, run bench/gpu_decode_bench (hybrid vs CPU-only vs all-on-GPU decode) and
# print a short table. Budget: under 8 minutes on a 16-core machine with one GPU.
#
# Usage: scripts/gpu-check.sh [BUILD_DIR]
# Environment: MODEL (default $BUILD_DIR/synth-7b-relu-q4_0.gguf), HOT_FRACTION (0.4),
# VRAM_BUDGET (6G: attention, head and KV in fp16 take ~4.6 GiB on this shape, leaving room
# for ~40% of the Q4_0 FFN neurons and not for all of them), TOKENS (16), ROUNDS (2),
# SPARSITY (exact).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-gpu}
model=${MODEL:-$dir/synth-7b-relu-q4_0.gguf}
hot=${HOT_FRACTION:-0.4}
budget=${VRAM_BUDGET:-6G}
tokens=${TOKENS:-16}
rounds=${ROUNDS:-2}
sparsity=${SPARSITY:-exact}
jobs=$(nproc)
start=$(date +%s)
stamp() { echo "[gpu-check $(( $(date +%s) - start ))s] $*"; }

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

stamp "configure ($dir, CUDA ON)"
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTHERMOCLINE_CUDA=ON >/dev/null
stamp "build"
cmake --build "$dir" -j"$jobs" --target thermocline thermocline-gpu-worker thermocline-cpu-worker \
  cuda_kernels_test cuda_worker_test gpu_decode_bench

stamp "GPU tests (ctest -L gpu)"
log=$(mktemp)
if ! (cd "$dir" && ctest -L '^gpu$' -j4 --output-on-failure --timeout 300) | tee "$log"; then
  stamp "GPU tests FAILED"
  exit 1
fi
if grep -q "(Skipped)" "$log"; then
  grep -m1 -A2 "no CUDA device" "$dir"/Testing/Temporary/LastTest.log || true
  stamp "GPU tests were SKIPPED: this machine has no usable CUDA device"
  exit 1
fi

if [[ ! -f "$model" ]]; then
  stamp "synthesizing the 7B-shape ReLU model at $model"
  "$dir"/bin/thermocline synth --ffn-kind relu-gated --dim 4096 --ffn 11008 --layers 32 \
    --heads 32 --kv-heads 32 --vocab 32000 --context 512 --type q4_0 --seed 1 -o "$model"
fi

stamp "decode benchmark: hybrid (hot $hot, budget $budget) vs CPU-only vs all-on-GPU"
"$dir"/bin/gpu_decode_bench --model "$model" --threads "$jobs" --tokens "$tokens" \
  --rounds "$rounds" --hot-fraction "$hot" --vram-budget "$budget" --sparsity "$sparsity" \
  | tee "$dir/gpu_decode_bench.txt"
stamp "done"
