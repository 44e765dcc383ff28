#!/usr/bin/env bash
# Packs the CUDA executables into one folder that runs on the GPU device machine, which has CUDA
# 13, cmake, ninja and PyTorch but none of the build's Debian libraries (docs/cuda.md, "The
# device bundle"):
#   out/gpu-bundle/bin/      thermocline, thermocline-gpu-worker, thermocline-cpu-worker,
#                            cuda_kernels_test, cuda_worker_test, cuda_reference_test,
#                            gpu_decode_bench (stripped)
#   out/gpu-bundle/lib/      every shared library they load that a minimal base system lacks
#                            (found with ldd; not packed: glibc's, libstdc++, libgcc_s, and the
#                            CUDA runtime and cuBLAS, which come from the device's own CUDA 13)
#   out/gpu-bundle/data/models/archs/  llama.cpp's reference models and logits (../shared, or
#                            $THERMOCLINE_SHARED_DATA_DIR) for cuda_reference_test: archs/ and the
#                            files of quants/ it reads; absent when there is no such folder
#                            (the test then reports the missing data)
#   out/gpu-bundle/run.sh    the device run (scripts/gpu-run.sh; sets LD_LIBRARY_PATH itself)
#   out/gpu-bundle/bundle.txt  what was packed, from which commit and build, and what it needs
# and the same folder as out/gpu-bundle.tar.gz, the file to copy.
#
# Usage: scripts/gpu-bundle.sh [--from-build DIR] [--out DIR]
#   default     configures (once) and builds build-gpu-bundle with CUDA ON for architecture 90
#               (the device's H200; CUDA_ARCHITECTURES=... overrides, and must include 90): one
#               architecture keeps the three CUDA binaries ~0.5 MiB smaller each and the folder
#               under 64 MiB
#   --from-build DIR   packs DIR/bin of an existing CUDA build (its architectures must include
#               90) and builds nothing (tests/bundle/gpu_bundle_test.sh packs its build so)
#   --out DIR   where gpu-bundle/ and gpu-bundle.tar.gz go (default out/ in the repository)
# The archive must stay under 64 MiB (the limit on what travels to the device); the folder's and
# the archive's sizes are printed.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build='' out="$repo/out"
while (( $# > 0 )); do
  case $1 in
    --from-build) build=${2:?--from-build needs a build directory}; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-bundle: unknown argument '$1' (--from-build DIR, --out DIR)" >&2; exit 2 ;;
  esac
done
fail() { echo "gpu-bundle: $*" >&2; exit 1; }
stamp() { echo "[gpu-bundle] $*"; }
limit=$(( 64 << 20 ))
exes=(thermocline thermocline-gpu-worker thermocline-cpu-worker cuda_kernels_test cuda_worker_test
      cuda_reference_test gpu_decode_bench)

if [[ -z $build ]]; then
  build=$repo/build-gpu-bundle
  archs=${CUDA_ARCHITECTURES:-90}
  [[ ";$archs;" =~ \;90(-real|-virtual)?\; ]] || fail "CUDA_ARCHITECTURES='$archs' lacks 90 (the device is an H200, sm_90)"
  if [[ ! -f $build/CMakeCache.txt ]]; then
    launchers=()
    if command -v ccache >/dev/null; then
      launchers=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache
                 -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
    fi
    stamp "configure $build (CUDA ON, architectures $archs)"
    cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTHERMOCLINE_CUDA=ON \
      "-DCMAKE_CUDA_ARCHITECTURES=$archs" "${launchers[@]}" >/dev/null
  fi
  stamp "build ${exes[*]}"
  cmake --build "$build" -j"$(nproc)" --target "${exes[@]}"
fi
build=$(cd "$build" 2>/dev/null && pwd) || fail "no build directory $build"

missing=()
for e in "${exes[@]}"; do [[ -x $build/bin/$e ]] || missing+=("$e"); done
(( ${#missing[@]} == 0 )) ||
  fail "$build/bin lacks ${missing[*]} (a CUDA build, THERMOCLINE_CUDA ON, with these targets built)"
# The architectures are the kernels' compile flags (CMake does not cache its default list).
archs=$(cat "$build/build.ninja" "$build"/gpu_worker/CMakeFiles/*/flags.make 2>/dev/null |
        grep -oE 'arch=compute_[0-9]+,code=\[[^]]*\]' | sort -u |
        grep -oE 'sm_[0-9]+' | sort -u | tr '\n' ' ' || true)
[[ " $archs" == *" sm_90 "* ]] || fail "$build compiles the kernels for '${archs:-nothing}', not sm_90 (the device's H200)"

# The libraries a minimal system has (glibc, the C++ runtime) and those the device's CUDA
# provides; every other one ldd finds is packed. One pattern, matched against the soname.
system_re='^(linux-vdso|ld-linux-x86-64|libc|libm|libmvec|libpthread|libdl|librt|libstdc\+\+|libgcc_s)\.so'
cuda_re='^(libcuda|libcudart|libcublas|libcublasLt)\.so'

mkdir -p "$out"
out=$(cd "$out" && pwd)
stage=$(mktemp -d "$out/.gpu-bundle.XXXXXX")
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
declare -A packed=()
for e in "${exes[@]}"; do
  strip --strip-all -o "$stage/bin/$e" "$build/bin/$e"
  while read -r soname arrow path _; do
    [[ $arrow == "=>" ]] || continue  # the vdso and the loader itself
    [[ $soname =~ $system_re || $soname =~ $cuda_re ]] && continue
    [[ $path == not ]] && fail "$e needs $soname, which ldd does not find here"
    if [[ -z ${packed[$soname]:-} ]]; then
      cp -L "$path" "$stage/lib/$soname"
      chmod 0644 "$stage/lib/$soname"
      packed[$soname]=$(readlink -f "$path")
    fi
  done < <(ldd "$build/bin/$e")
done
data=${THERMOCLINE_SHARED_DATA_DIR:-$repo/../shared}
if [[ -d $data/models/archs ]]; then
  mkdir -p "$stage/data/models/quants"
  cp -r "$data/models/archs" "$stage/data/models/archs"
  # tests/gpu/cuda_reference_test.cc's list (the whole folder would not fit under 64 MiB).
  cp "$data/models/quants/ids32.txt" "$stage/data/models/quants/"
  for q in Q4_K_M pure-Q2_K pure-Q3_K pure-Q5_K pure-IQ4_NL pure-IQ4_XS; do
    cp "$data/models/quants/$q.gguf" "$data/models/quants/$q.deqf32.logits.f32" "$stage/data/models/quants/"
  done
fi
cp "$repo/scripts/gpu-run.sh" "$stage/run.sh"
chmod 0755 "$stage/run.sh"

# What the binaries need from the device: the newest glibc and libstdc++ symbol versions.
needs() {
  objdump -T "$stage"/bin/* "$stage"/lib/* 2>/dev/null | grep -oE "$1[0-9.]+" | sort -uV | tail -n1
}
commit=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null | head -c1)
nvcc=$(sed -n 's/^set(CMAKE_CUDA_COMPILER_VERSION "\(.*\)")$/\1/p' \
       "$build"/CMakeFiles/*/CMakeCUDACompiler.cmake 2>/dev/null | head -n1)
{
  echo "thermocline GPU device bundle (scripts/gpu-bundle.sh; docs/cuda.md, \"The device bundle\")"
  echo "commit: $commit${dirty:+ (with uncommitted changes)}"
  echo "version: $("$build/bin/thermocline" --version)"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) from $build ($(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$build/CMakeCache.txt"))"
  echo "nvcc: ${nvcc:-unknown version}"
  echo "kernels for: $archs"
  echo "needs from the device: glibc >= $(needs GLIBC_ | sed 's/GLIBC_//'), libstdc++ with $(needs GLIBCXX_), CUDA 13 (libcudart.so.13, libcublas.so.13, libcublasLt.so.13) and its driver"
  echo "run: ./run.sh   (environment: OUT, BUDGET, MODEL, HOT_FRACTION, VRAM_BUDGET, TOKENS, ROUNDS, SPARSITY, THREADS; see its header)"
  echo "by hand: LD_LIBRARY_PATH=\$PWD/lib bin/thermocline --help"
  if [[ -d $stage/data/models/archs ]]; then
    echo "data: models/archs from $(cd "$data" && pwd) (cuda_reference_test's references)"
  else
    echo "data: none ($data/models/archs not found; cuda_reference_test will report it missing)"
  fi
  echo "bin:"
  for e in "${exes[@]}"; do echo "  $e"; done
  echo "lib (from):"
  for s in $(printf '%s\n' "${!packed[@]}" | sort); do echo "  $s  ${packed[$s]}"; done
} >"$stage/bundle.txt"

rm -rf "$out/gpu-bundle"
mv "$stage" "$out/gpu-bundle"
trap - EXIT
chmod 0755 "$out/gpu-bundle"
tar -C "$out" -czf "$out/gpu-bundle.tar.gz.partial" gpu-bundle
mv "$out/gpu-bundle.tar.gz.partial" "$out/gpu-bundle.tar.gz"

folder=$(du -sb "$out/gpu-bundle" | cut -f1)
archive=$(stat -c %s "$out/gpu-bundle.tar.gz")
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
stamp "$out/gpu-bundle: ${#exes[@]} executables, ${#packed[@]} libraries, $(mib "$folder"); $out/gpu-bundle.tar.gz: $(mib "$archive")"
(( archive < limit )) || fail "the archive is $(mib "$archive"), over the 64 MiB that may travel to the device"
if (( folder >= limit )); then
  stamp "note: the folder is over 64 MiB (kernels for $archs); copy the archive, or build with CUDA_ARCHITECTURES=90"
fi
