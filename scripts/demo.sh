#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine, with nothing to download: install the packages,
# build, start the service (thermocline-gateway, which spawns the gpu and cpu workers) on a
# model, stream one generation through it over gRPC, and stop it.
# The model: $THERMOCLINE_MODEL if set; else the real stories260K from ../shared beside the
# checkout (or $THERMOCLINE_SHARED_DATA_DIR); else a synthetic model made here, whose text is
# random bytes (said in one line, so nobody takes it for a broken server).
# Usage: scripts/demo.sh [PROMPT]      (THERMOCLINE_BUILD_DIR: build directory, default build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${THERMOCLINE_BUILD_DIR:-build}
bash scripts/setup.sh
bash scripts/build.sh Release "$build"
mkdir -p out
shared=${THERMOCLINE_SHARED_DATA_DIR:-../shared}
if [[ -n "${THERMOCLINE_MODEL:-}" ]]; then
  model=$THERMOCLINE_MODEL
  [[ -r "$model" ]] || { echo "demo: THERMOCLINE_MODEL=$model is not a readable file" >&2; exit 1; }
elif [[ -r "$shared/models/stories260K/stories260K.gguf" ]]; then
  model=$shared/models/stories260K/stories260K.gguf
else
  model=out/demo.gguf
  if [[ ! -f "$model" ]]; then
    "$build"/bin/thermocline synth -o "$model" --seed 1
  fi
  echo "demo: no stories260K in $shared (see README.md, Reference data) and no THERMOCLINE_MODEL: serving a synthetic model with random weights, so its text is random bytes" >&2
fi
echo "demo: model $model" >&2

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
"$build"/bin/thermocline-gateway --model "$model" --hot-fraction 0.5 \
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
