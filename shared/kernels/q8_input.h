// The prepared Q8_0 / Q8_1 activations of the SIMD row kernels (matmul_avx2.cc and
// matmul_avx512.cc read the same layout). Included only by those files (AVX2 flags or more);
// PrepareFor's instantiations depend on a loader of the including file, so files compiled with
// different ISA flags share none.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "shared/gguf/ggml_type.h"
#include "shared/util/fp16.h"

namespace thermocline::matmul_internal {

// Prepared activations, per token: for each block 32 quantized values, the int32 lane bias and
// the per-lane activation scale (f32 of the fp16-rounded scale, see the loaders' kHighScale);
// for loaders with kHasMin (q4_1, q5_1) also 8 f32 lanes holding Q8_1's s = fp16(d * sum q) in
// lane 0 and zeros, which one FMA with the weight's broadcast m adds into the accumulator.
inline constexpr int64_t kBiasAt = 32;
inline constexpr int64_t kScaleAt = 64;
inline constexpr int64_t kSumAt = 96;
template <class L>
constexpr bool LoaderHasMin() {
  if constexpr (requires { L::kHasMin; }) {
    return L::kHasMin;
  } else {
    return false;
  }
}
template <class L>
constexpr int64_t kPreparedBytes = LoaderHasMin<L>() ? 128 : 96;

template <class L>
int64_t InputBytes(int64_t cols) {
  return cols / kQK * kPreparedBytes<L>;
}

// The layout for loader L (its kOffset, kHighScale, kHasMin), each block rounded by kQuantize:
// ggml's quantize_row_q8_0_ref, returning the 32 values in order, the fp16 scale and the f32
// scale before its rounding (which Q8_1's s uses).
template <class L, __m256i (*kQuantize)(const float* x, uint16_t* d_half, float* d_f32)>
void PrepareFor(const float* x, int64_t cols, uint8_t* out) {
  // Lane scales: the fp16-rounded activation scale, divided by kHighScale in the upper lanes
  // (exact: a power of two), and the bias that removes the weight offset, times kHighScale there.
  const __m256i bias_factor = _mm256_setr_epi32(
      -L::kOffset, -L::kOffset, -L::kOffset, -L::kOffset, -L::kOffset * L::kHighScale,
      -L::kOffset * L::kHighScale, -L::kOffset * L::kHighScale, -L::kOffset * L::kHighScale);
  const float inv_high = 1.0f / L::kHighScale;
  const __m256 d_factor = _mm256_setr_ps(1, 1, 1, 1, inv_high, inv_high, inv_high, inv_high);
  for (int64_t b = 0; b < cols / kQK; ++b) {
    uint8_t* blk = out + b * kPreparedBytes<L>;
    uint16_t dh;
    float d32;
    const __m256i q = kQuantize(x + b * kQK, &dh, &d32);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(blk), q);
    const __m256i lane_sums =
        _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), _mm256_set1_epi16(1));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(blk + kBiasAt),
                        _mm256_mullo_epi32(lane_sums, bias_factor));
    _mm256_storeu_ps(reinterpret_cast<float*>(blk + kScaleAt),
                     _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(dh)), d_factor));
    if constexpr (LoaderHasMin<L>()) {
      alignas(32) int32_t lanes[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), lane_sums);
      int32_t sum = 0;
      for (int32_t v : lanes) sum += v;
      const float s = _cvtsh_ss(Fp32ToFp16(static_cast<float>(sum) * d32));
      _mm256_storeu_ps(reinterpret_cast<float*>(blk + kSumAt),
                       _mm256_setr_ps(s, 0, 0, 0, 0, 0, 0, 0));
    }
  }
}

}  // namespace thermocline::matmul_internal
