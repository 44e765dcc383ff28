#!/usr/bin/env bash
# The GPU device run (docs/cuda.md, "The device run"): one pass over the CUDA backend on a machine
# with a GPU, in at most $BUDGET seconds (8 minutes), ending with one short summary table.
#   gpu        the GPU, driver, compute mode and free memory (nvidia-smi)
#   libraries  every executable's shared libraries resolve (the bundle's lib/, the device's CUDA)
#   device     the gpu worker accepts --backend cuda (else: the runtime's reason, and stop)
#   cuda_kernels_test, cuda_worker_test, cuda_reference_test   under timeout; full
#              output in $OUT (cuda_reference_test reads the references in data/ beside this script)
#   memcheck, racecheck                        compute-sanitizer on cuda_kernels_test
#   model      the issue's 7B-shape ReLU model (thermocline synth on every core, in the background
#              while the tests run, at low priority), unless $MODEL exists
#   bench      gpu_decode_bench: hybrid vs CPU-only vs all-on-GPU decode tokens/s
# Every stage has a timeout cut to what is left of the budget (the benchmark's share is kept
# back from the sanitizers), so the summary always prints. The terminal gets one line per
# stage, the failing test cases' first lines and the summary; everything else goes to $OUT.
#
# It is the bundle's run.sh (scripts/gpu-bundle.sh copies it there: bin/ and lib/ beside it) and
# the second half of scripts/gpu-check.sh (which passes its build's bin/).
#
# Usage: run.sh [BIN_DIR]        (default: bin/ beside this script)
# Environment: OUT (logs; default a new directory under /tmp), BUDGET (480 s), MODEL (default
# $WORK_DIR/thermocline-synth-7b-relu-q4_0.gguf, WORK_DIR default /tmp: the 3.8 GB file stays
# out of $OUT), HOT_FRACTION (0.4: the share of a 7B model's FFN a consumer card holds beside
# everything else), VRAM_BUDGET (6G, an upper bound the plan is checked against: attention and
# the head stay in Q4_0 on the device, ~1.3 GiB on this shape, and 40% of the FFN is ~0.9 GiB),
# TOKENS (16), ROUNDS (2), SPARSITY (exact), THREADS (all cores).
# Exit status: 0 when every stage passed, 1 otherwise, 2 on a usage error.
set -uo pipefail  # no -e: a failing stage is recorded and the next one still runs

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bin=${1:-$here/bin}
if [[ ! -x $bin/thermocline ]]; then
  echo "run.sh: $bin/thermocline not found (give the directory of the built executables)" >&2
  exit 2
fi
bin=$(cd "$bin" && pwd)
budget=${BUDGET:-480}
if ! [[ $budget =~ ^[0-9]+$ ]] || (( budget < 60 )); then
  echo "run.sh: BUDGET must be a number of seconds >= 60, got '$budget'" >&2
  exit 2
fi
OUT=${OUT:-$(mktemp -d /tmp/thermocline-gpu-run.XXXXXX)}
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
work=${WORK_DIR:-/tmp}
model=${MODEL:-$work/thermocline-synth-7b-relu-q4_0.gguf}
hot=${HOT_FRACTION:-0.4}
vram=${VRAM_BUDGET:-6G}
tokens=${TOKENS:-16}
rounds=${ROUNDS:-2}
sparsity=${SPARSITY:-exact}
threads=${THREADS:-$(nproc)}
bench_reserve=150  # seconds kept for the benchmark (three loads of a 3.8 GB model, 2 x 16 tokens)

start=$(date +%s)
deadline=$(( start + budget ))
stamp() { echo "[run $(( $(date +%s) - start ))s] $*"; }

# The bundle's libraries first; cuBLAS and the CUDA runtime come from the device (see below).
if [[ -f $here/bundle.txt && -d $here/lib ]]; then
  export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# cuda_worker_test runs the worker executables from the directory it is told, not its build tree.
export THERMOCLINE_BIN_DIR=$bin
# The bundle carries llama.cpp's reference models for cuda_reference_test (scripts/gpu-bundle.sh).
if [[ -d $here/data/models && -z ${THERMOCLINE_SHARED_DATA_DIR:-} ]]; then
  export THERMOCLINE_SHARED_DATA_DIR=$here/data
fi

names=() results=() secs=() notes=()
row() { names+=("$1"); results+=("$2"); secs+=("$3"); notes+=("$4"); }

# Seconds a stage may take: its cap, cut to the budget left after `reserve`; < 5 means skip it.
allowance() {
  local cap=$1 reserve=$2 left
  left=$(( deadline - $(date +%s) - reserve ))
  (( left < cap )) && cap=$left
  echo "$cap"
}

# run_timed NAME CAP RESERVE LOG CMD...: runs CMD under timeout with its output in $OUT/LOG;
# sets rc (124: timed out; -1: not run, no time left) and took (seconds).
rc=0 took=0 limit=0
run_timed() {
  local name=$1 cap=$2 reserve=$3 log=$4 t0
  shift 4
  limit=$(allowance "$cap" "$reserve")
  if (( limit < 5 )); then
    rc=-1 took=0
    stamp "$name: skipped, no time left in the ${budget} s budget"
    return
  fi
  stamp "$name (timeout ${limit} s, output $OUT/$log)"
  t0=$(date +%s)
  timeout -k 10 "$limit" "$@" >"$OUT/$log" 2>&1
  rc=$?
  took=$(( $(date +%s) - t0 ))
  (( rc == 137 )) && rc=124  # killed after the grace: a timeout too
}

# A GoogleTest log: prints the failing cases (name, the failure's location and first line) to
# the terminal, at most 20, and sets note and verdict.
note='' verdict=''
gtest_verdict() {
  local log=$1 passed failed skipped
  passed=$(grep -m1 -oE '^\[  PASSED  \] [0-9]+' "$log" | grep -oE '[0-9]+$' || true)
  failed=$(grep -m1 -oE '^\[  FAILED  \] [0-9]+ tests?, listed below' "$log" | grep -oE '^\[  FAILED  \] [0-9]+' | grep -oE '[0-9]+$' || true)
  skipped=$(grep -m1 -oE '^\[  SKIPPED \] [0-9]+' "$log" | grep -oE '[0-9]+$' || true)
  passed=${passed:-0} failed=${failed:-0} skipped=${skipped:-0}
  awk '
    /^\[ RUN      \] / { name = $4; next }
    /: Failure$/ && name != "" && !(name in first) { first[name] = $0; want[name] = 1; next }
    name in want { first[name] = first[name] " | " $0; delete want[name]; next }
    /^\[  FAILED  \] [^ ]+(, where .*)? \([0-9]+ ms\)$/ { sub(/,$/, "", $4); failed[++n] = $4 }
    END {
      for (i = 1; i <= n && i <= 20; ++i) {
        line = (failed[i] in first) ? first[failed[i]] : "(no failure message)"
        printf "  FAILED %s: %s\n", failed[i], substr(line, 1, 240)
      }
      if (n > 20) printf "  ... and %d more (see the log)\n", n - 20
    }' "$log"
  note="$passed passed, $failed failed, $skipped skipped"
  if (( rc == 124 )); then
    verdict=timeout note="timed out after ${limit} s ($note so far; last started: $(grep -E '^\[ RUN      \] ' "$log" | tail -n1 | awk '{print $4}'))"
  elif (( rc != 0 )) && (( failed == 0 )); then
    verdict=FAIL note="exit $rc, no failure reported: crashed in $(grep -E '^\[ RUN      \] ' "$log" | tail -n1 | awk '{print $4}')? ($note)"
    tail -n 3 "$log" | sed 's/^/  | /'
  elif (( rc != 0 || failed > 0 )); then
    verdict=FAIL
  elif (( skipped > 0 )); then
    # A skip here means the test found no device: on the machine this script is for, a failure.
    verdict=FAIL note="$note: $(grep -m1 -oE 'no CUDA device[^]]*' "$log" | head -c 160)"
  else
    verdict=ok
  fi
}

# ---- gpu ----
if command -v nvidia-smi >/dev/null; then
  nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
  query=name,driver_version,compute_mode,memory.free,memory.total
  gpu=$(timeout 20 nvidia-smi --query-gpu=$query,compute_cap --format=csv,noheader 2>/dev/null ||
        timeout 20 nvidia-smi --query-gpu=$query --format=csv,noheader 2>&1)
  cuda=$(grep -oE 'CUDA Version: [0-9.]+' "$OUT/nvidia-smi.txt" | head -n1)
  echo "GPU: name, driver, compute mode, free, total[, compute capability]; ${cuda:-CUDA version unknown}"
  echo "$gpu" | sed 's/^/  /'
  row gpu ok 0 "$(echo "$gpu" | head -n1 | cut -c1-110)"
else
  echo "GPU: nvidia-smi not found"
  row gpu FAIL 0 "nvidia-smi not found"
fi

# ---- libraries ----
# The executables need the device's CUDA 13 runtime and cuBLAS (libcudart.so.13, libcublas.so.13,
# libcublasLt.so.13: not in the bundle). Their RUNPATH names /usr/local/cuda/lib; where that
# does not hold them, the usual places are searched and added to LD_LIBRARY_PATH.
missing_libs() {
  local exe
  for exe in "$bin"/*; do
    [[ -f $exe && -x $exe ]] || continue
    ldd "$exe" 2>&1 | awk '/not found/ {print $1}'
  done | sort -u | tr '\n' ' '
}
missing=$(missing_libs)
added=''
if [[ $missing == *libcu* ]]; then
  for d in "${CUDA_HOME:-/nonexistent}/lib64" "${CUDA_PATH:-/nonexistent}/lib64" \
           /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
           /usr/local/cuda-13*/lib64 /usr/local/cuda-13*/targets/x86_64-linux/lib \
           /usr/lib/x86_64-linux-gnu \
           $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null |
             xargs -n1 2>/dev/null | sed 's|$|/nvidia/cu13/lib|'); do
    if [[ -e $d/libcublas.so.13 || -e $d/libcudart.so.13 ]]; then
      export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
      added="$added $d"
    fi
  done
  missing=$(missing_libs)
fi
version=$("$bin/thermocline" --version 2>&1 | head -n1)
if [[ -n $missing ]]; then
  echo "libraries: not found: $missing"
  row libraries FAIL 0 "not found: $missing"
elif [[ $version != thermocline\ * ]]; then
  echo "libraries: thermocline --version says: $version"
  row libraries FAIL 0 "$(echo "$version" | cut -c1-110)"
else
  row libraries ok 0 "$version${added:+; CUDA from$added}"
fi

# ---- device ----
# The gpu worker checks --backend cuda before it attaches or opens the model: exit 2 with the
# runtime's reason means no usable device; past the check it fails to attach (exit 1).
probe=$("$bin/thermocline-gpu-worker" --backend cuda --instance "gpu-run-probe-$$" \
        --model /nonexistent.gguf --hot-fraction 1 2>&1)
probe_rc=$?
if (( probe_rc == 2 )); then
  # Its logfmt line (component=gpu_worker event=start_failed error="...") as "gpu_worker: ...".
  reason=$(echo "$probe" | sed -n 's/.* component=\([a-z_]*\) event=start_failed error="\(.*\)"$/\1: \2/p' | head -n1)
  [[ -n $reason ]] || reason=$(echo "$probe" | head -n1)
  echo "device: $reason"
  row device FAIL 0 "$(echo "$reason" | cut -c1-110)"
  device=no
else
  # What a gateway given no placement plans from (shared/driver/default_placement.h).
  mem=$(timeout 60 "$bin/thermocline-gpu-worker" --device-memory 2>&1 | head -n1)
  echo "device memory (thermocline-gpu-worker --device-memory): $mem" >"$OUT/device-memory.txt"
  free=$(echo "$mem" | grep -oE 'free_bytes=[0-9]+' | cut -d= -f2)
  row device ok 0 "the gpu worker accepts --backend cuda; --device-memory: ${free:-no} free bytes"
  device=yes
fi

# ---- model (background) ----
synth_pid=''
if [[ $device == yes ]]; then
  if [[ -f $model ]]; then
    row model ok 0 "reused $model"
  elif (( $(df -Pk "$(dirname "$model")" | awk 'NR == 2 {print $4}') < 5 * 1024 * 1024 )); then
    row model FAIL 0 "under 5 GiB free in $(dirname "$model") for the 3.8 GB model"
  elif synth_limit=$(allowance 300 "$bench_reserve"); (( synth_limit < 30 )); then
    row model skipped 0 "no time left in the budget"
  else
    stamp "model: synthesizing the 7B-shape ReLU model at $model in the background ($threads threads, timeout ${synth_limit} s)"
    synth_t0=$(date +%s)
    # Written under another name and renamed when complete: a run cut short leaves no file
    # that a later run would take for the model.
    (nice -n 19 timeout -k 10 "$synth_limit" "$bin/thermocline" synth --ffn-kind relu-gated \
       --dim 4096 --ffn 11008 --layers 32 --heads 32 --kv-heads 32 --vocab 32000 --context 512 \
       --type q4_0 --seed 1 --threads "$threads" -o "$model.partial" &&
     mv "$model.partial" "$model") >"$OUT/synth.log" 2>&1 &
    synth_pid=$!
  fi
fi

# ---- the GPU tests ----
gtest_stage() {
  local name=$1 cap=$2
  shift 2
  if [[ $device != yes ]]; then
    row "$name" skipped 0 "no usable CUDA device"
    return
  fi
  run_timed "$name" "$cap" "$bench_reserve" "$name.log" "$@" --gtest_color=no
  if (( rc == -1 )); then
    row "$name" skipped 0 "no time left in the budget"
    return
  fi
  gtest_verdict "$OUT/$name.log"
  row "$name" "$verdict" "$took" "$note"
}
gtest_stage cuda_kernels_test 90 "$bin/cuda_kernels_test"
gtest_stage cuda_worker_test 150 "$bin/cuda_worker_test"
gtest_stage cuda_reference_test 180 "$bin/cuda_reference_test"

# ---- compute-sanitizer ----
sanitizer=$(command -v compute-sanitizer || true)
for d in "${CUDA_HOME:-/nonexistent}" /usr/local/cuda; do
  [[ -z $sanitizer && -x $d/bin/compute-sanitizer ]] && sanitizer=$d/bin/compute-sanitizer
done
for tool in memcheck racecheck; do
  if [[ $device != yes ]]; then
    row "$tool" skipped 0 "no usable CUDA device"
    continue
  fi
  if [[ -z $sanitizer ]]; then
    row "$tool" skipped 0 "compute-sanitizer not found"
    continue
  fi
  run_timed "$tool" 100 "$bench_reserve" "$tool.log" "$sanitizer" --tool "$tool" \
    --error-exitcode 99 --print-limit 20 "$bin/cuda_kernels_test" --gtest_color=no --gtest_brief=1
  if (( rc == -1 )); then
    row "$tool" skipped 0 "no time left in the budget"
    continue
  fi
  summary=$(grep -m1 -E '^========= (ERROR|RACECHECK) SUMMARY' "$OUT/$tool.log" | sed 's/^========= //')
  if (( rc == 124 )); then
    row "$tool" timeout "$took" "timed out after ${limit} s"
  elif (( rc == 0 )) && [[ $summary =~ (^|[^0-9])0\ errors ]]; then
    row "$tool" ok "$took" "$summary"
  else
    # The sanitizer's first findings (one line each) to the terminal.
    grep -E '^========= ' "$OUT/$tool.log" | grep -vE 'COMPUTE-SANITIZER|SUMMARY|^========= +$|^=========     (at|by|Host Frame|Device Frame)' |
      head -n 6 | cut -c1-200 | sed 's/^========= /  /'
    row "$tool" FAIL "$took" "exit $rc; ${summary:-no summary line}"
  fi
done

# ---- model (wait) and benchmark ----
bench_table=''
if [[ -n $synth_pid ]]; then
  wait "$synth_pid"
  synth_rc=$?
  synth_took=$(( $(date +%s) - synth_t0 ))
  if (( synth_rc == 0 )) && [[ -f $model ]]; then
    row model ok "$synth_took" "synthesized $model ($(du -h "$model" | cut -f1)); ran beside the tests"
  elif (( synth_rc == 124 || synth_rc == 137 )); then
    row model timeout "$synth_took" "synth timed out after ${synth_limit} s"
  else
    row model FAIL "$synth_took" "exit $synth_rc: $(tail -n1 "$OUT/synth.log" | cut -c1-100)"
  fi
fi
if [[ $device != yes ]]; then
  row bench skipped 0 "no usable CUDA device"
elif [[ ! -f $model ]]; then
  row bench skipped 0 "no model"
else
  run_timed bench 300 5 gpu_decode_bench.txt "$bin/gpu_decode_bench" --model "$model" \
    --threads "$threads" --tokens "$tokens" --rounds "$rounds" --hot-fraction "$hot" \
    --vram-budget "$vram" --sparsity "$sparsity"
  if (( rc == -1 )); then
    row bench skipped 0 "no time left in the budget"
  elif (( rc == 0 )); then
    row bench ok "$took" "hot $hot, budget $vram, $tokens tokens x $rounds rounds, $threads threads"
    # The benchmark's own table: the lines after its blank line.
    bench_table=$(awk 'seen {print} /^$/ {seen = 1}' "$OUT/gpu_decode_bench.txt")
  elif (( rc == 124 )); then
    row bench timeout "$took" "timed out after ${limit} s: $(tail -n1 "$OUT/gpu_decode_bench.txt" | cut -c1-80)"
  else
    row bench FAIL "$took" "exit $rc: $(grep -m1 'gpu_decode_bench:' "$OUT/gpu_decode_bench.txt" | cut -c1-200)"
  fi
fi

# ---- summary ----
failures=0
echo
echo "== summary: $(( $(date +%s) - start )) s of the ${budget} s budget; full output in $OUT"
printf '%-18s %-8s %5s  %s\n' stage result secs notes
for i in "${!names[@]}"; do
  printf '%-18s %-8s %5s  %s\n' "${names[$i]}" "${results[$i]}" "${secs[$i]}" "${notes[$i]}"
  [[ ${results[$i]} == ok ]] || failures=$(( failures + 1 ))
done
if [[ -n $bench_table ]]; then
  echo "decode (gpu_decode_bench):"
  echo "$bench_table" | sed 's/^/  /'
fi
if (( failures == 0 )); then
  echo "overall: ok"
  exit 0
fi
echo "overall: FAIL ($failures of ${#names[@]} stages not ok)"
exit 1
