#!/usr/bin/env bash
# Installs every Debian package Thermocline needs to build, test and run. Non-interactive and
# idempotent: packages already present are not touched, and nothing is downloaded when all are.
# This is the only install path (CI runs it too).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libabsl-dev
  libboost-program-options-dev libboost-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libnuma-dev
  # BPE pre-tokenizer regexes (shared/tokenizer/pretokenizer.cc): PCRE2 with Unicode properties;
  # WordPiece's Unicode data (shared/tokenizer/wordpiece.cc): ICU.
  libpcre2-dev libicu-dev
  # gRPC API and gateway (proto/, gateway/): protoc + grpc_cpp_plugin, gRPC++ with reflection,
  # sd_notify for systemd readiness and the watchdog.
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libsystemd-dev
  # Metrics (gateway/metrics.cc): prometheus-cpp core for the registry and text format, and
  # cpp-httplib (header-only) to serve /metrics.
  prometheus-cpp-dev libcpp-httplib-dev
  # Deployment and security (deploy/, gateway/security.cc, docs/operations.md): OpenSSL for the
  # TLS flags' PEM checks, the openssl CLI for the tests' certificates, systemd-analyze for the
  # unit test, clang (libFuzzer) for the fuzz targets.
  libssl-dev openssl systemd clang
  # The Python client test (tests/e2e/python/): gRPC and protobuf for /usr/bin/python3; the
  # message classes come from protobuf-compiler above (3.21, as python3-protobuf).
  python3-grpcio python3-protobuf
  # HTTP/2 by hand for the slow-reader test (tests/e2e/python/slow_reader_test.py): a client
  # that announces a zero flow-control window, which no gRPC library lets a caller do.
  python3-h2
  # JSON Schema validation of structured outputs (tests/e2e/python/structured_output_test.py):
  # the test's reference for "the output holds what the schema says".
  python3-jsonschema
  # nlohmann/json (header-only): chat templates' values (shared/chat/) and the tests reading the
  # reference data's JSON indexes (tests/unit/dequant_reference_test.cc). ICU: Unicode case
  # mapping in chat templates (and WordPiece, above). Python's Jinja2: the reference the
  # template tests compare against (tests/helpers/).
  nlohmann-json3-dev python3-jinja2
  # Line editing and history for `thermocline chat` on a terminal (libedit's readline API).
  libedit-dev
  # The HTTP API's tests (tests/e2e/node/): curl -N reads the event stream and checks TLS.
  curl
  # ss reads the HTTP listener's backlog (tests/e2e/python/slow_reader_test.py).
  iproute2
)
# The official openai Node client (tests/e2e/node/openai_client_test.mjs) runs on Node.js and
# npm; a machine that already has both (from any source) keeps them, otherwise Debian's (Debian
# 12 ships Node.js 18; the pinned openai 5.23.2 names 20 or later as supported, and has been run
# here on 20).
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  PACKAGES+=(nodejs npm)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#PACKAGES[@]} packages already installed"
else
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# npm packages: exactly the versions of the committed lock file, into the test's own folder
# (git-ignored); skipped when what is installed already matches the lock.
node_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/e2e/node"
if node -e '
  const lock = require(process.argv[1] + "/package-lock.json").packages;
  for (const [p, v] of Object.entries(lock)) {
    if (!p) continue;
    if (require(process.argv[1] + "/" + p + "/package.json").version !== v.version) process.exit(1);
  }' "$node_dir" 2>/dev/null; then
  echo "setup: npm packages of tests/e2e/node already installed"
else
  echo "setup: npm ci in tests/e2e/node"
  npm ci --prefix "$node_dir" --no-audit --no-fund
fi
echo "setup: done"
