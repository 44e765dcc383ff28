// Inline AVX2 helpers shared by the *_avx2.cc kernel files: the one order in which an 8-lane
// accumulator is reduced (the *_avx512.cc files reproduce it, simd_avx512.h, to give the same
// bits). Include only from files compiled with AVX2 enabled.
#pragma once

#include <immintrin.h>

namespace thermocline::simd {

// (lanes 0-3 + 4-7), then (0-1 + 2-3), then (0 + 1).
inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace thermocline::simd
