// Inline AVX2 helpers shared by the *_avx2.cc kernel files: the one order in which an 8-lane
// accumulator is reduced (the *_avx512.cc files reproduce it, simd_avx512.h, to give the same
// bits), and the loads of the interleaved layouts' kernels. Include only from files compiled with
// AVX2 enabled.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace thermocline::simd {

// (lanes 0-3 + 4-7), then (0-1 + 2-3), then (0 + 1).
inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 4 bytes at p in every 32-bit lane, as one broadcasting load. Written as a memcpy and
// _mm256_set1_epi32, GCC 12 emitted a scalar load, a vmovd to a vector register and a
// vpbroadcastd from it: two extra vector-pipe uops per call, 16 per block in the interleaved
// kernels (Zen 3: the Q4_0 group kernel ran at 20 GB/s in L2 with it).
inline __m256i Broadcast4(const uint8_t* p) {
  return _mm256_castps_si256(_mm256_broadcast_ss(reinterpret_cast<const float*>(p)));
}

inline __m256i Load32(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// The end of a super-block in the interleaved kernels whose rows each form one exact int32 I per
// super-block (Q3_K, Q6_K, IQ4_XS): acc[t] = fma(fl(d * xd_t), fl(I_t), acc[t]) for the group's 8
// fp16 d at d8, token t's Q8_K block at xb[t].
template <int T>
inline void AddSuperBlock(__m256 (&acc)[T], const uint8_t* d8, const uint8_t* const (&xb)[T],
                          const __m256i (&isum)[T]) {
  const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d8)));
  for (int t = 0; t < T; ++t) {
    const __m256 xd = _mm256_broadcast_ss(reinterpret_cast<const float*>(xb[t]));
    acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(d, xd), _mm256_cvtepi32_ps(isum[t]), acc[t]);
  }
}

// AVX-VNNI's vpdpbusd: acc + the sums of 4 unsigned x signed byte products per 32-bit lane.
// Inline asm rather than the intrinsic keeps the *_avx2.cc files buildable with plain -mavx2;
// callers reach it only after a run-time check for avxvnni.
inline __m256i DpbusdVex(__m256i acc, __m256i u, __m256i s) {
  asm("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(s));
  return acc;
}

}  // namespace thermocline::simd
