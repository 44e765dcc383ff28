// The avx512 family's slots of the 8-row interleaved layouts: AVX-512 dot products (those of
// Q4_0, Q5_0, Q8_0, Q4_K and Q5_K through AMX tiles with many tokens, where the CPU and OS
// allow), the AVX2 preparations (they write the activations' layout bytes, the same in both
// families).
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
  auto legacy = [&]<GgmlType kType>() {
    fill(kType, kLegacyX8Avx2<kType>, amx ? &DotLegacyX8Amx<kType> : &DotLegacyX8Avx512<kType>);
  };
  legacy.template operator()<GgmlType::kQ4_0>();
  legacy.template operator()<GgmlType::kQ5_0>();
  legacy.template operator()<GgmlType::kQ8_0>();
  fill(GgmlType::kQ3_K, kQ3_Kx8Avx2<>, &DotQ3_Kx8Avx512);
  fill(GgmlType::kQ4_K, kQ4_Kx8Avx2, amx ? &DotQ4_Kx8Amx : &DotQ4_Kx8Avx512);
  fill(GgmlType::kQ5_K, kQ5_Kx8Avx2, amx ? &DotQ5_Kx8Amx : &DotQ5_Kx8Avx512);
  fill(GgmlType::kQ6_K, kQ6_Kx8Avx2, &DotQ6_Kx8Avx512);
  fill(GgmlType::kIQ4_XS, kIq4_XSx8Avx2<>, &DotIq4_XSx8Avx512);
}

}  // namespace thermocline::matmul_internal
