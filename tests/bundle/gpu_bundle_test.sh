#!/usr/bin/env bash
# The GPU device bundle is complete (scripts/gpu-bundle.sh, docs/cuda.md "The device bundle"):
# packed from this build, unpacked into an empty directory and run there with a cleared
# environment (env -i, PATH=/usr/bin:/bin, LD_LIBRARY_PATH the bundle's lib/ only):
#   - ldd resolves every library of every executable and packed library, each either inside the
#     bundle or one of an explicit list of base-system and device-CUDA libraries;
#   - the CUDA runtime and cuBLAS are not packed (they come from the device's CUDA 13);
#   - every executable starts (--version, --gtest_list_tests, or the benchmark's usage), and the
#     architecture references cuda_reference_test reads are packed (data/models/archs);
#   - thermocline synth makes a model from the bundle, generate runs it, in one process and
#     split over the bundle's two workers;
#   - on a machine without a usable CUDA device the GPU tests skip cleanly (exit 0, the reason)
#     and run.sh ends at once with the reason, the summary and exit status 1, synthesizing
#     nothing;
#   - the archive is under 64 MiB.
# Usage: gpu_bundle_test.sh SOURCE_DIR BUILD_DIR CUDA(ON|OFF). Exit 77 (skipped) when the build
# has no CUDA backend: there is nothing to bundle.
set -uo pipefail
src=${1:?source dir} build=${2:?build dir} cuda=${3:?ON or OFF}
if [[ $cuda != ON ]]; then
  echo "skipped: this build is CUDA OFF (THERMOCLINE_CUDA found no nvcc or was OFF), so it has no GPU executables to bundle"
  exit 77
fi
tmp=$(mktemp -d /tmp/thermocline-bundle-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
failures=0
bad() { echo "FAIL: $*"; failures=$(( failures + 1 )); }

if ! "$src/scripts/gpu-bundle.sh" --from-build "$build" --out "$tmp/out"; then
  echo "FAIL: scripts/gpu-bundle.sh --from-build $build failed"
  exit 1
fi
mkdir "$tmp/empty"
tar -xzf "$tmp/out/gpu-bundle.tar.gz" -C "$tmp/empty" || { echo "FAIL: cannot unpack the archive"; exit 1; }
b=$tmp/empty/gpu-bundle
clean=(env -i PATH=/usr/bin:/bin "LD_LIBRARY_PATH=$b/lib" "TMPDIR=$tmp")

exes=(thermocline thermocline-gpu-worker thermocline-cpu-worker cuda_kernels_test cuda_worker_test
      cuda_reference_test gpu_decode_bench)
for f in run.sh bundle.txt "${exes[@]/#/bin/}"; do
  [[ -f $b/$f ]] || bad "the bundle lacks $f"
done
[[ -x $b/run.sh ]] || bad "run.sh is not executable"
# cuda_reference_test's references travel with it when this machine has them.
if [[ -d ${THERMOCLINE_SHARED_DATA_DIR:-$src/../shared}/models/archs ]]; then
  [[ -f $b/data/models/archs/ids32.txt && -f $b/data/models/archs/gemma2.logits.f32 ]] ||
    bad "the bundle lacks llama.cpp's reference models (data/models/archs)"
  [[ -f $b/data/models/quants/ids32.txt && -f $b/data/models/quants/Q4_K_M.deqf32.logits.f32 ]] ||
    bad "the bundle lacks the quantized references (data/models/quants)"
fi
(( $(find "$b/lib" -type f | wc -l) > 0 )) || bad "lib/ is empty"

# What may resolve outside the bundle: the base system's C and C++ runtimes, and the CUDA
# driver, runtime and cuBLAS, which the device's CUDA 13 provides.
allowed_list=(libc.so.6 libm.so.6 libmvec.so.1 libstdc++.so.6 libgcc_s.so.1 ld-linux-x86-64.so.2
  libpthread.so.0 libdl.so.2 librt.so.1 libcuda.so.1 libcudart.so.13 libcublas.so.13
  libcublasLt.so.13)
allowed="${allowed_list[*]}"
checked=0
for f in "$b"/bin/* "$b"/lib/*; do
  out=$("${clean[@]}" ldd "$f" 2>&1) || { bad "ldd $(basename "$f"): $out"; continue; }
  while read -r soname arrow path _; do
    [[ $arrow == "=>" ]] || continue
    checked=$(( checked + 1 ))
    if [[ $path == not ]]; then
      bad "$(basename "$f") needs $soname: not found with LD_LIBRARY_PATH=<bundle>/lib"
    elif [[ $(readlink -f "$path") != "$b/lib/"* && " $allowed " != *" $soname "* ]]; then
      bad "$(basename "$f") loads $soname from $path, outside the bundle and not a base library"
    fi
  done <<<"$out"
done
(( checked > 50 )) || bad "ldd reported only $checked libraries: the check did not run"
for l in libcudart libcublas libcublasLt libcuda; do
  compgen -G "$b/lib/$l.so*" >/dev/null && bad "lib/ packs $l (it must come from the device's CUDA)"
done

# Every executable starts from the bundle.
for e in thermocline thermocline-gpu-worker thermocline-cpu-worker; do
  v=$("${clean[@]}" "$b/bin/$e" --version 2>&1)
  [[ $v =~ ^$e\ [0-9]+\.[0-9]+\.[0-9]+$ ]] || bad "$e --version printed '$v'"
done
for e in cuda_kernels_test cuda_worker_test cuda_reference_test; do
  v=$("${clean[@]}" "$b/bin/$e" --gtest_list_tests 2>&1)
  [[ $? == 0 && $v == *"."* ]] || bad "$e --gtest_list_tests: $v"
done
v=$("${clean[@]}" "$b/bin/gpu_decode_bench" 2>&1)
rc=$?
[[ $rc == 2 && $v == "usage: gpu_decode_bench"* ]] || bad "gpu_decode_bench without arguments: exit $rc, '$v'"

# A model made and run from the bundle (the tokenizer's ICU and PCRE2 come from lib/; --split
# starts the bundle's own workers, which sit beside thermocline).
model=$tmp/tiny.gguf
v=$("${clean[@]}" "$b/bin/thermocline" synth --dim 64 --ffn 128 --layers 2 --heads 4 \
      --kv-heads 2 --vocab 300 --context 64 -o "$model" 2>&1) || bad "synth from the bundle: $v"
[[ -s $model ]] || bad "synth from the bundle wrote no model"
v=$("${clean[@]}" "$b/bin/thermocline" generate --model "$model" --prompt ab -n 3 --temperature 0 2>&1) ||
  bad "generate from the bundle: $v"
v=$("${clean[@]}" "$b/bin/thermocline" generate --split --hot-fraction 0.5 --model "$model" \
      --prompt ab -n 3 --temperature 0 2>&1) || bad "generate --split from the bundle: $v"
[[ $v == *"split over instance"* ]] || bad "generate --split did not run split: $v"

# The GPU tests and run.sh on this machine. Whether a device is usable is the gpu worker's
# answer to --backend cuda, given before it opens anything (exit 2 with the reason: none).
probe=$("${clean[@]}" "$b/bin/thermocline-gpu-worker" --backend cuda --instance "bundle-probe-$$" \
          --model /nonexistent.gguf --hot-fraction 1 2>&1)
if [[ $? == 2 ]]; then
  echo "no usable CUDA device here ($probe): the GPU tests must skip"
  for e in cuda_kernels_test cuda_worker_test cuda_reference_test; do
    v=$("${clean[@]}" "THERMOCLINE_BIN_DIR=$b/bin" "THERMOCLINE_SHARED_DATA_DIR=$b/data" "$b/bin/$e" 2>&1)
    rc=$?
    [[ $rc == 0 ]] || bad "$e from the bundle: exit $rc: $(tail -n3 <<<"$v")"
    [[ $v == *"[  SKIPPED ]"* && $v == *"no CUDA device"* ]] || bad "$e did not skip with the reason: $(tail -n3 <<<"$v")"
    [[ $v == *"[  FAILED  ]"* ]] && bad "$e failed: $(grep -m3 FAILED <<<"$v")"
  done
  mkdir "$tmp/work"
  v=$("${clean[@]}" "OUT=$tmp/runout" "WORK_DIR=$tmp/work" timeout 120 "$b/run.sh" 2>&1)
  rc=$?
  [[ $rc == 1 ]] || bad "run.sh without a device: exit $rc (want 1)"
  [[ $v == *"== summary"* && $v == *"overall: FAIL"* ]] || bad "run.sh printed no summary: $v"
  grep -qE '^device +FAIL +0 +gpu_worker: --backend cuda: ' <<<"$v" || bad "run.sh's summary does not give the device's reason: $v"
  grep -qE '^libraries +ok ' <<<"$v" || bad "run.sh found libraries missing: $v"
  [[ -z $(ls -A "$tmp/work") ]] || bad "run.sh wrote into WORK_DIR without a device: $(ls "$tmp/work")"
  [[ -d $tmp/runout ]] || bad "run.sh did not create OUT"
else
  echo "a CUDA device is usable here: the GPU tests run for real (the ctest label gpu); run.sh is not started (8 minutes)"
fi

archive=$(stat -c %s "$tmp/out/gpu-bundle.tar.gz")
(( archive < 64 << 20 )) || bad "the archive is $archive bytes, not under 64 MiB"
echo "bundle: $(du -sb "$b" | cut -f1) bytes unpacked, archive $archive bytes; $checked library resolutions checked"
if (( failures > 0 )); then
  echo "$failures check(s) failed"
  exit 1
fi
echo "ok"
