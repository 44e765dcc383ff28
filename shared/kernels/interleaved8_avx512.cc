// The avx512 family's slots of the 8-row interleaved layouts: AVX-512 dot products (Q4_0's, Q4_K's
// and Q5_K's through AMX tiles with many tokens, where the CPU and OS allow), the AVX2 preparations
// (they write the activations' layout bytes, the same in both families).
#include "shared/gguf/ggml_type.h"
#include "shared/kernels/matmul_kernels.h"
#include "shared/util/cpu_features.h"

namespace thermocline::matmul_internal {

void FillInterleavedAvx512(KernelSet& set) {
  auto fill = [&](GgmlType type, const TypeKernels& avx2, decltype(TypeKernels::dot) dot) {
    TypeKernels k = avx2;
    k.dot = dot;
    set.interleaved8[static_cast<size_t>(type)] = k;
  };
  const bool amx = AmxInt8Usable();
  fill(GgmlType::kQ4_0, kLegacyX8Avx2<GgmlType::kQ4_0>,
       amx ? &DotQ4_0x8Amx : &DotLegacyX8Avx512<GgmlType::kQ4_0>);
  fill(GgmlType::kQ5_0, kLegacyX8Avx2<GgmlType::kQ5_0>, &DotLegacyX8Avx512<GgmlType::kQ5_0>);
  fill(GgmlType::kQ8_0, kLegacyX8Avx2<GgmlType::kQ8_0>, &DotLegacyX8Avx512<GgmlType::kQ8_0>);
  fill(GgmlType::kQ4_K, kQ4_Kx8Avx2, amx ? &DotQ4_Kx8Amx : &DotQ4_Kx8Avx512);
  fill(GgmlType::kQ5_K, kQ5_Kx8Avx2, amx ? &DotQ5_Kx8Amx : &DotQ5_Kx8Avx512);
  fill(GgmlType::kQ6_K, kQ6_Kx8Avx2, &DotQ6_Kx8Avx512);
}

}  // namespace thermocline::matmul_internal
