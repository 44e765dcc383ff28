#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine, with nothing to download: install the packages,
# build, synthesize a small model, start the service on it (thermocline-gateway, which spawns
# the gpu and cpu workers), stream one generation through it over gRPC, and stop it.
# Usage: scripts/demo.sh [PROMPT]      (THERMOCLINE_BUILD_DIR: build directory, default build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${THERMOCLINE_BUILD_DIR:-build}
bash scripts/setup.sh
bash scripts/build.sh Release "$build"
mkdir -p out
if [[ ! -f out/demo.gguf ]]; then
  "$build"/bin/thermocline synth -o out/demo.gguf --seed 1
fi

# Ports 0: the gateway picks free ones and prints them; a per-run instance name keeps the
# shared-memory segments of two demos apart.
gw_out=$(mktemp)
gw_pid=""
cleanup() {
  if [[ -n "$gw_pid" ]] && kill -0 "$gw_pid" 2>/dev/null; then
    kill -TERM "$gw_pid"      # the gateway stops its workers and removes its segments
    wait "$gw_pid" 2>/dev/null || true
  fi
  rm -f "$gw_out"
}
trap cleanup EXIT INT TERM
"$build"/bin/thermocline-gateway --model out/demo.gguf --hot-fraction 0.5 \
  --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --instance "demo-$$" \
  >"$gw_out" 2>out/gateway.log &
gw_pid=$!

# "listening grpc=127.0.0.1:PORT metrics=127.0.0.1:PORT" once both servers are bound.
for _ in $(seq 1 600); do
  grep -q '^listening ' "$gw_out" && break
  if ! kill -0 "$gw_pid" 2>/dev/null; then
    echo "demo: the gateway exited; its log (out/gateway.log):" >&2
    cat out/gateway.log >&2
    exit 1
  fi
  sleep 0.1
done
line=$(grep '^listening ' "$gw_out") || { echo "demo: the gateway did not start" >&2; exit 1; }
grpc=$(sed -n 's/.*grpc=\([^ ]*\).*/\1/p' <<<"$line")
metrics=$(sed -n 's/.*metrics=\([^ ]*\).*/\1/p' <<<"$line")
echo "demo: gateway on $grpc (metrics: http://$metrics/metrics, log: out/gateway.log)" >&2

# --wait-ready: the gateway answers UNAVAILABLE until the workers have loaded the model.
"$build"/bin/thermocline generate --server "$grpc" --wait-ready 120 \
  --prompt "${1:-Once upon a time}" --max-new-tokens 48 --temperature 0.8 --seed 42
