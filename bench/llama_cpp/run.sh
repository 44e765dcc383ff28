#!/usr/bin/env bash
# llama.cpp on this machine, for the same-machine comparisons of docs/performance.md:
# installs the prebuilt llama.cpp of the npm package node-llama-cpp (pinned; CPU builds for
# every x86-64 level, chosen at run time by ggml) into a cache folder outside the repository,
# then runs decode.mjs with the arguments given (--model M.gguf ... --threads 1,2 ...).
# Needs node >= 20 and npm (Debian: apt-get install nodejs npm). Not part of the tests.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
version=3.22.1
dir="${THERMOCLINE_LLAMA_CPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/thermocline/llama-cpp-$version}"
if [[ ! -d "$dir/node_modules/@node-llama-cpp/linux-x64" ]]; then
  echo "installing node-llama-cpp $version (prebuilt llama.cpp) into $dir" >&2
  mkdir -p "$dir"
  (cd "$dir" && { [[ -f package.json ]] || npm init -y >/dev/null; } &&
    npm install --no-audit --no-fund --ignore-scripts --omit=optional \
      "node-llama-cpp@$version" "@node-llama-cpp/linux-x64@$version" >&2)
fi
cp "$here/decode.mjs" "$dir/decode.mjs"
echo "llama_cpp_build $(cat "$dir"/node_modules/@node-llama-cpp/linux-x64/bins/*/_nlcBuildMetadata.json | tr -d '\n' | head -c 300)"
echo "load_average $(cut -d' ' -f1-3 /proc/loadavg)"
exec node "$dir/decode.mjs" "$@"
