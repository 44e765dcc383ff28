#!/usr/bin/env bash
# scripts/gpu-run.sh (the device bundle's run.sh) on stand-ins for the GPU machine's programs,
# so that its logic is checked here, without a GPU: stub executables (the tests print GoogleTest
# output with one failing case, compute-sanitizer reports a clean memcheck and a racecheck
# hazard, nvidia-smi and the benchmark print what the real ones print) and then the summary it
# makes of them: each stage's row, the failing case's first lines on the terminal and the
# passing ones not, the benchmark's table, the logs in $OUT, exit status 1. Then without a
# device (the gpu worker refuses --backend cuda): the reason, every GPU stage skipped, nothing
# run. Usage: gpu_run_test.sh SOURCE_DIR
set -uo pipefail
src=${1:?source dir}
tmp=$(mktemp -d /tmp/thermocline-gpu-run-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
failures=0
bad() { echo "FAIL: $*"; failures=$(( failures + 1 )); }
stub() {  # NAME BODY: an executable shell script
  printf '#!/bin/sh\n%s\n' "$2" >"$3/$1"
  chmod +x "$3/$1"
}
mkdir -p "$tmp/bin" "$tmp/path" "$tmp/out" "$tmp/work"
bin=$tmp/bin path=$tmp/path

stub thermocline 'case $1 in --version) echo "thermocline 9.9.9" ;; *) echo "unexpected: $*" >&2; exit 3 ;; esac' "$bin"
# Past its device check it fails to attach: exit 1 (STUB_NO_DEVICE: the check's exit 2).
# (its lines as the real worker writes them: logfmt, shared/util/logfmt.h)
stub thermocline-gpu-worker '[ -n "$STUB_NO_DEVICE" ] && { echo "ts=2026-01-01T00:00:00.000000Z level=error component=gpu_worker event=start_failed error=\"--backend cuda: no usable CUDA device: stub reason\"" >&2; exit 2; }
echo "ts=2026-01-01T00:00:00.000000Z level=error component=gpu_worker event=attach_failed instance=x error=NOT_FOUND" >&2; exit 1' "$bin"
stub thermocline-cpu-worker 'exit 0' "$bin"
stub cuda_kernels_test 'cat <<END
[==========] Running 2 tests from 1 test suite.
[ RUN      ] Kernels.RmsNormPasses
[       OK ] Kernels.RmsNormPasses (1 ms)
[ RUN      ] Kernels.AttentionFails
tests/gpu/cuda_kernels_test.cc:120: Failure
The difference between got and want is 0.5, which exceeds 1e-3
  detail line that stays in the log
[  FAILED  ] Kernels.AttentionFails (2 ms)
[==========] 2 tests from 1 test suite ran. (3 ms total)
[  PASSED  ] 1 test.
[  FAILED  ] 1 test, listed below:
[  FAILED  ] Kernels.AttentionFails

 1 FAILED TEST
END
exit 1' "$bin"
stub cuda_worker_test '[ "$THERMOCLINE_BIN_DIR" = "'"$bin"'" ] || { echo "THERMOCLINE_BIN_DIR=$THERMOCLINE_BIN_DIR"; exit 5; }
cat <<END
[==========] Running 3 tests from 1 test suite.
[ RUN      ] Worker.A
[       OK ] Worker.A (1 ms)
[==========] 3 tests from 1 test suite ran. (3 ms total)
[  PASSED  ] 3 tests.
END' "$bin"
stub cuda_reference_test 'cat <<END
[==========] Running 2 tests from 1 test suite.
[ RUN      ] Archs.Gemma2
[       OK ] Archs.Gemma2 (1 ms)
[ RUN      ] Archs.Falcon
[       OK ] Archs.Falcon (1 ms)
[==========] 2 tests from 1 test suite ran. (2 ms total)
[  PASSED  ] 2 tests.
END' "$bin"
stub gpu_decode_bench 'echo "args: $*"
case "$*" in *"--hot-fraction 0.4 --vram-budget 6G --sparsity exact"*) ;; *) exit 4 ;; esac
cat <<END
hybrid ready in 1.0 s

config     hot frac  median ms/tok      tok/s  vs cpu-only  same tokens
cpu            0.00         100.00      10.00       1.000x          yes
hybrid         0.40          50.00      20.00       2.000x          yes
END' "$bin"
stub nvidia-smi 'case "$*" in *--query-gpu*) echo "NVIDIA H200, 580.00, Default, 140000 MiB, 143771 MiB, 9.0" ;; *) echo "| NVIDIA-SMI 580.00   Driver Version: 580.00   CUDA Version: 13.0 |" ;; esac' "$path"
stub compute-sanitizer 'case "$2" in
  memcheck) echo "========= COMPUTE-SANITIZER"; echo "========= ERROR SUMMARY: 0 errors" ;;
  racecheck) echo "========= COMPUTE-SANITIZER"
    echo "========= Error: Race reported between Write access at kernel_x+0x10 and Read access at kernel_x+0x20"
    echo "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"; exit 99 ;;
esac' "$path"
touch "$tmp/model.gguf"

run() {  # the runner with the stubs first on PATH; output in $v, status in $rc
  v=$(env PATH="$path:/usr/bin:/bin" OUT="$tmp/out" WORK_DIR="$tmp/work" MODEL="$tmp/model.gguf" \
        "$@" timeout 120 bash "$src/scripts/gpu-run.sh" "$bin" 2>&1)
  rc=$?
}
expect() {  # REGEX WHY: a line of the output matches
  grep -qE "$1" <<<"$v" || bad "$2 (wanted /$1/)"
}

run
[[ $rc == 1 ]] || bad "exit $rc with a failing test (want 1)"
expect '^GPU: .*CUDA Version: 13.0' "the GPU line names the CUDA version"
expect '^gpu +ok +0 +NVIDIA H200, 580.00, Default, 140000 MiB' "gpu row"
expect '^libraries +ok +0 +thermocline 9.9.9' "libraries row"
expect '^device +ok ' "device row"
expect '^model +ok +0 +reused ' "model row"
expect '^  FAILED Kernels.AttentionFails: tests/gpu/cuda_kernels_test.cc:120: Failure \| The difference between got and want is 0.5' "the failing case's first lines on the terminal"
expect '^cuda_kernels_test +FAIL +[0-9]+ +1 passed, 1 failed, 0 skipped$' "kernel test row"
expect '^cuda_worker_test +ok +[0-9]+ +3 passed, 0 failed, 0 skipped$' "worker test row (THERMOCLINE_BIN_DIR given)"
expect '^cuda_reference_test +ok +[0-9]+ +2 passed, 0 failed, 0 skipped$' "reference test row"
expect '^memcheck +ok +[0-9]+ +ERROR SUMMARY: 0 errors$' "memcheck row"
expect '^  Error: Race reported between Write access' "the racecheck finding on the terminal"
expect '^racecheck +FAIL +[0-9]+ +exit 99; RACECHECK SUMMARY: 1 hazard' "racecheck row"
expect '^bench +ok +[0-9]+ +hot 0.4, budget 6G, 16 tokens x 2 rounds' "bench row"
expect '^decode \(gpu_decode_bench\):$' "the benchmark's table follows the summary"
expect '^  hybrid +0.40 +50.00 +20.00 +2.000x' "the benchmark's rows"
expect '^overall: FAIL \(2 of 10 stages not ok\)$' "overall line, last"
[[ $(tail -n1 <<<"$v") == "overall: FAIL (2 of 10 stages not ok)" ]] || bad "the overall line is not last"
grep -q 'RmsNormPasses\|detail line that stays' <<<"$v" && bad "passing cases or later failure lines reached the terminal"
for f in cuda_kernels_test.log cuda_worker_test.log cuda_reference_test.log memcheck.log racecheck.log gpu_decode_bench.txt nvidia-smi.txt; do
  [[ -s $tmp/out/$f ]] || bad "no $f in OUT"
done
grep -q 'detail line that stays' "$tmp/out/cuda_kernels_test.log" || bad "the full test output is not in OUT"
[[ $failures == 0 ]] || echo "--- output of the first run:"$'\n'"$v"

rm -rf "$tmp/out"/*
run STUB_NO_DEVICE=1
[[ $rc == 1 ]] || bad "exit $rc without a device (want 1)"
expect '^device +FAIL +0 +gpu_worker: --backend cuda: no usable CUDA device: stub reason$' "device row gives the reason"
for s in cuda_kernels_test cuda_worker_test cuda_reference_test memcheck racecheck bench; do
  expect "^$s +skipped +0 +no usable CUDA device$" "$s skipped without a device"
done
[[ -e $tmp/out/cuda_kernels_test.log ]] && bad "a GPU test ran without a device"

# A usage error: no executables where it is pointed.
v=$(bash "$src/scripts/gpu-run.sh" "$tmp/nowhere" 2>&1)
rc=$?
[[ $rc == 2 && $v == *"thermocline not found"* ]] || bad "a wrong BIN_DIR: exit $rc, '$v'"

if (( failures > 0 )); then
  echo "$failures check(s) failed"
  exit 1
fi
echo ok
