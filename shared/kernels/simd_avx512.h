// Inline AVX-512 helpers shared by the *_avx512.cc kernel files. Include only from files
// compiled with the AVX-512 flags.
#pragma once

#include <immintrin.h>

namespace thermocline::simd {

// AVX2's HorizontalSum (simd_avx2.h: halves of 128, then movehl, then movehdup) of both 256-bit
// halves of v at once, the same additions of the same lanes: *lo from lanes 0..7, *hi from
// 8..15. This is how a zmm holding two avx2 accumulators ends with avx2's bits.
inline void HalfSums(__m512 v, float* lo, float* hi) {
  __m512 s = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
  s = _mm512_add_ps(s, _mm512_shuffle_ps(s, s, _MM_SHUFFLE(3, 2, 3, 2)));
  s = _mm512_add_ps(s, _mm512_movehdup_ps(s));
  *lo = _mm512_cvtss_f32(s);
  *hi = _mm_cvtss_f32(_mm512_extractf32x4_ps(s, 2));
}

}  // namespace thermocline::simd
