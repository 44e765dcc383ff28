#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, tests/fuzz/) in build-fuzz and runs each for a while.
# Usage: scripts/fuzz.sh [SECONDS per target, default 10] [BUILD_DIR, default build-fuzz]
# Seeds are made at run time (nothing binary is committed): the gguf fuzzer starts from the
# team's small models, the tokenizer fuzzer from corpus text and id lists, the validation
# fuzzer from serialized requests written by `validate_fuzzer`'s own seed list below, the chat
# template fuzzer from the published templates in ../shared/chat-templates and a few below.
# A crash leaves its input as BUILD_DIR/fuzz-out/<target>/crash-*; rerun one input with
# `BUILD_DIR/bin/<target> FILE`. Longer runs: docs/operations.md, "Fuzzing".
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
dir=${2:-build-fuzz}
shared=$(cd .. && pwd)/shared
CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DTHERMOCLINE_FUZZ=ON >/dev/null
cmake --build "$dir" -j"$(nproc)"
model=$shared/models/stories260K/stories260K.gguf
[[ -f $model ]] || { echo "fuzz: $model is missing"; exit 1; }
export THERMOCLINE_FUZZ_MODEL=$model
out=$dir/fuzz-out
bin=$(cd "$dir" && pwd)/bin
rm -rf "$out"
mkdir -p "$out"/{gguf,tokenizer,validate,chat_template}-seeds

# gguf: real small models (truncated to 64 KiB: the header, metadata and tensor table are at
# the front, and short seeds keep the mutations on them).
i=0
for m in "$shared"/models/*/*.gguf; do
  [[ -f $m ]] || continue
  head -c 65536 "$m" >"$out/gguf-seeds/model$i"
  i=$((i + 1))
  ((i < 8)) || break
done
# tokenizer: mode byte 0 (text) and 1 (ids) before the payload.
printf '\x00Once upon a time, there was a little girl.' >"$out/tokenizer-seeds/text"
printf '\x02caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x98\x80 tab\tnew\nline' >"$out/tokenizer-seeds/utf8"
printf '\x01\x01\x00\x00\x00\x10\x01\x00\x00\xff\xff\xff\xff\x03\x00\x00\x00' \
  >"$out/tokenizer-seeds/ids"
# validate: protobuf wire bytes of a few GenerateRequests (field 1 text, 3 max_new_tokens ...)
# are produced by the fuzzer itself from an empty seed plus these hand-made ones.
# Regression seeds: inputs that once found a bug (the reader now handles them).
printf 'GGUF\x03\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xef\xef\xef\xef\x00' \
  >"$out/gguf-seeds/no-tensors-no-padding"
printf '\x0a\x10Once upon a time\x18\x10' >"$out/validate-seeds/text16"
printf '\x0a\x00' >"$out/validate-seeds/empty-text"

# chat_template: real templates, plus small ones covering what they do not (macros with
# defaults, namespaces, filters with arguments, whitespace control, loop controls, errors).
for f in "$shared"/chat-templates/*.jinja; do
  [[ -f $f ]] && cp "$f" "$out/chat_template-seeds/$(basename "$f")"
done
printf '%s' '{%- macro f(a, b=2) -%}{{ a ~ b }}{%- endmacro -%}{% set ns = namespace(n=0) %}{% for m in messages if m.content %}{% set ns.n = ns.n + 1 %}{{ f(loop.index, b=m.role|upper) }}{% if loop.last %}{% break %}{% endif %}{% endfor %}{{ ns.n }}' \
  >"$out/chat_template-seeds/macro-namespace"
printf '%s' '{{ tools|map(attribute="function")|selectattr("name", "equalto", "get_weather")|list|tojson(indent=2) }}{{ messages[1:]|length }}{{ "a b"|replace(" ", "-")|indent(2, first=true) }}{% filter trim %} x {% endfilter %}{{ raise_exception("stop") if not messages }}' \
  >"$out/chat_template-seeds/filters"
printf '%s' '  {%+ if true -%} a {%- endif +%}
{# c #}{% raw %}{{ x }}{% endraw %}{{ "\u00e9"[::-1] ~ 1.5e3 ~ (1, 2) }}{% for k, v in {"a": [1]}|items %}{{ k }}{{ v|first }}{% else %}none{% endfor %}' \
  >"$out/chat_template-seeds/whitespace"

for t in gguf tokenizer validate chat_template; do
  mkdir -p "$out/$t"
  echo "fuzz: $t for ${secs}s"
  # A fixed seed (THERMOCLINE_FUZZ_SEED, default 1) makes a short CI run repeat the same inputs:
  # a finding is reproducible and a passing commit stays passing; longer runs pass other seeds.
  (cd "$out/$t" && "$bin/${t}_fuzzer" -seed="${THERMOCLINE_FUZZ_SEED:-1}" \
      -max_total_time="$secs" -max_len=65536 \
      -rss_limit_mb=4096 -print_final_stats=1 "../$t-seeds" >"../$t.log" 2>&1) || {
    tail -50 "$out/$t.log"
    echo "fuzz: $t FAILED (see $out/$t.log and $out/$t/crash-*)"
    exit 1
  }
  grep -E '^stat::number_of_executed_units|^stat::new_units_added' "$out/$t.log" | tr '\n' ' '
  echo
done
echo "fuzz: all targets ran ${secs}s without a finding"
