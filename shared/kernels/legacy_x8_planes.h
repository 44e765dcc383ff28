// The eight 32-byte planes (legacy_x8.h) of one block of two groups as unsigned bytes q_w + o,
// for the AVX-512 and AMX kernels of the Q4_0, Q5_0 and Q8_0 interleaved layouts
// (legacy_x8_avx512.cc, legacy_x8_amx.cc). Include only from those files.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "shared/gguf/legacy_x8.h"
#include "shared/kernels/interleaved8_avx512.h"

namespace thermocline::matmul_internal::avx512 {
// In an unnamed namespace: the including files are compiled with different ISA flags, and an
// inline function they shared could be linked from either.
namespace {

// The eight planes (legacy_x8.h) of one block of groups a (low half) and b (high half) as
// unsigned q_w + o.
template <GgmlType kType>
inline void UnpackLegacyPlanes(const uint8_t* wa, const uint8_t* wb, __m512i (&u)[8]) {
  using F = LegacyX8Format<kType>;
  if constexpr (kType == GgmlType::kQ8_0) {
    const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int p = 0; p < 8; ++p) {
      const int64_t at = F::kChunksAt + 32 * p;
      u[p] = _mm512_xor_si512(avx512::Load2x32(wa + at, wb + at), sign);
    }
  } else {
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int c = 0; c < 4; ++c) {
      const int64_t at = F::kChunksAt + 32 * c;
      const __m512i v = avx512::Load2x32(wa + at, wb + at);
      u[2 * c] = _mm512_and_si512(v, low);
      u[2 * c + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    }
    if constexpr (kType == GgmlType::kQ5_0) {
      // Plane p's fifth bits are at bit 8j + p of each row's word: moved to bit 4 of byte j and
      // or-ed in with one ternary logic (u | (bits & 0x10)).
      const __m512i qh = avx512::Load2x32(wa + F::kQhAt, wb + F::kQhAt);
      const __m512i bit4 = _mm512_set1_epi8(0x10);
      for (int p = 0; p < 8; ++p) {
        const __m512i bits = p < 4    ? _mm512_slli_epi32(qh, 4 - p)
                             : p == 4 ? qh
                                      : _mm512_srli_epi32(qh, p - 4);
        u[p] = _mm512_ternarylogic_epi32(u[p], bits, bit4, 0xF8);
      }
    }
  }
}

}  // namespace
}  // namespace thermocline::matmul_internal::avx512
