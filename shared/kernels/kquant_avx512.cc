// AVX-512 kernels for the K-quants and IQ4_XS in the row layout, against Q8_K activations
// (compiled with the *_avx512.cc flags; reached only after the run-time check).
//
// They give matmul_avx2.cc's bits. There, each (row, token) keeps one 8-lane f32 accumulator
// that takes, per super-block, (d * xd) * I and for types with mins -(dmin * xd) * M, where
// the int32 lanes of I and M are exact block sums, and it is reduced once by a fixed
// horizontal sum. Here one zmm holds two of those accumulators: row a of a pair in the low 256
// bits, row b in the high, the token's quants broadcast to both halves. Every int32 lane is
// formed from the same byte products and scales as AVX2's lane (maddubs for the byte pairs,
// then vpdpwssd, which is madd and add in one exact step), so the f32 lanes see the same
// operations in the same order, and each half ends with AVX2's horizontal sum. A pair whose
// row b is missing (an odd tile) repeats row a and drops the high half.
//
// axpy and dequantize decode each block to the exact f32 values of DequantizeRow straight to
// registers, and add rows into y with one FMA per row and element in row order, as AVX2 does 8
// at a time (see the decoders below).

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>

#include "shared/gguf/quant.h"
#include "shared/kernels/matmul_kernels.h"
#include "shared/kernels/prefetch_weights.h"
#include "shared/kernels/simd_avx512.h"

namespace thermocline::matmul_internal {
namespace {

constexpr int64_t kQ8KQs = 4;
constexpr int64_t kQ8KSums = 4 + kQK_K;

// Block `blk` of each of the R rows.
template <int64_t kBytes>
inline void PrefetchBlock(const uint8_t* const* rows, int R, int64_t blk) {
  for (int r = 0; r < R; ++r) {
    for (int64_t at = 0; at < kBytes; at += 64) {
      PrefetchWeights(rows[r] + blk * kBytes + at);
    }
  }
}

inline uint16_t LoadHalf(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return h;
}
inline __m128i Load16(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}
inline __m256i Load32(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
// Bytes at..at+31 of row a's block in the low half, of row b's in the high (a broadcast load
// and a masked one: no shuffle).
inline __m512i LoadPair(const uint8_t* a, const uint8_t* b, int64_t at) {
  return _mm512_mask_broadcast_i64x4(_mm512_broadcast_i64x4(Load32(a + at)), 0xF0, Load32(b + at));
}
// The token's 32 quants at p in both halves.
inline __m512i Broadcast32(const uint8_t* p) { return _mm512_broadcast_i64x4(Load32(p)); }
inline __m512 PairScale(float a, float b) {
  return _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(a), _mm512_set1_ps(b));
}
// v shifted left by s bits (right by -s) in 16-bit lanes; s is a constant after unrolling.
inline __m512i Shift16(__m512i v, int s) {
  if (s > 0) return _mm512_slli_epi16(v, static_cast<unsigned>(s));
  if (s < 0) return _mm512_srli_epi16(v, static_cast<unsigned>(-s));
  return v;
}
// a | (b & c), one ternary-logic instruction.
inline __m512i OrMasked(__m512i a, __m512i b, __m512i c) {
  return _mm512_ternarylogic_epi32(a, b, c, 0xF8);
}

using simd::HalfSums;

// ---- Dot products: the int32 lanes of I for two rows and T tokens. ----
//
// Scale vectors hold int16 scales per 128-bit quarter: quarters 0 and 1 for row a, 2 and 3 for
// row b. Types with 8 sub-blocks of 32 keep row a's 8 scales in quarters 0 and 1 and row b's in
// 2 and 3, and sub-block k takes lane k everywhere (AVX2's BroadcastPair). Types with 16
// sub-blocks of 16 keep 8 of them the same way per half of the block, and the 32-element
// group k takes lane 2k in quarters 0 and 2, 2k + 1 in 1 and 3 (AVX2's ScalePair).
inline __m512i BroadcastPair(__m512i scales, int k) {
  return _mm512_shuffle_epi8(scales, _mm512_set1_epi16(static_cast<int16_t>(0x0100 + 0x0202 * k)));
}
inline __m512i ScalePair(__m512i dup, int k) {
  const __m256i idx = _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(0x0302 + 0x0404 * k)),
                                       _mm_set1_epi16(static_cast<int16_t>(0x0100 + 0x0404 * k)));
  return _mm512_shuffle_epi8(dup, _mm512_broadcast_i64x4(idx));
}

// One maddubs of weights q (unsigned) and a token's quants x (signed) into acc with scales sc.
inline __m512i AddProducts(__m512i acc, __m512i q, __m512i x, __m512i sc) {
  return _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(q, x), sc);
}

// What Dot reads of a token's block: its quants as stored, unless a type rearranges them once
// per block for all its pairs (its own X and LoadX).
struct PlainX {
  using X = const uint8_t*;
  static void LoadX(const uint8_t* xq, X* x) { *x = xq; }
};

struct PairWeights {
  __m512i scales, scales_hi;  // int16 scales as above (scales_hi: 16-sub-block types, 8..15)
  __m512i mins;               // int16 mins that madd with the bsums into M (kHasMin)
  __m512i bias;               // int16 factors that madd with the bsums into an offset of I
  __m512 d, dmin;             // per half
};

// From 32 int16 scales (row a's 16, then row b's): sub-blocks 0..7 and 8..15 of each row, each
// set in both quarters of its row's half; and the factors -offset * sc that madd with the bsums
// into the term that takes the weights' offset back out of I (zero without one).
inline void SetScales16(__m512i s16, int16_t offset, PairWeights* w) {
  w->scales = _mm512_shuffle_i64x2(s16, s16, _MM_SHUFFLE(2, 2, 0, 0));
  w->scales_hi = _mm512_shuffle_i64x2(s16, s16, _MM_SHUFFLE(3, 3, 1, 1));
  w->bias = _mm512_mullo_epi16(s16, _mm512_set1_epi16(static_cast<int16_t>(-offset)));
}

// Types with 16 sub-blocks of 16: the T tokens' lanes of I, from the offset term (w.bias) and
// group k (32 elements, sub-blocks 2k, 2k + 1) of each half h of the block, whose quants
// quants(h, k) gives.
template <int T, class Quants>
inline void Groups16(const PairWeights& w, const uint8_t* const* xq, const __m512i* bsums,
                     __m512i* isum, Quants&& quants) {
  for (int t = 0; t < T; ++t) isum[t] = _mm512_madd_epi16(w.bias, bsums[t]);
  for (int h = 0; h < 2; ++h) {
    const __m512i& dup = h == 0 ? w.scales : w.scales_hi;
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m512i q = quants(h, k);
      const __m512i sc = ScalePair(dup, k);
      for (int t = 0; t < T; ++t) {
        isum[t] = AddProducts(isum[t], q, Broadcast32(xq[t] + 128 * h + 32 * k), sc);
      }
    }
  }
}

// q4_K / q5_K: 8 sub-blocks of 32 with 6-bit scales and mins (ggml's get_scale_min_k4), unpacked
// on the 32-bit words u0..u2 of both rows at once: bytes 0..7 of each row's 128 bits (row a's
// low, row b's high) become the scales, 8..15 the mins.
inline __m256i Q4KScaleMinBytes(const uint8_t* a, const uint8_t* b) {
  // 16 bytes from offset 4 (the 12 packed bytes and 4 beyond, still in the block).
  const __m256i raw =
      _mm256_inserti128_si256(_mm256_castsi128_si256(Load16(a + 4)), Load16(b + 4), 1);
  // Words (u0 & k6, (u2 & k4) | (u0 bits 6-7 -> 4-5), u1 & k6, (u2 >> 4 & k4) | (u1 bits 6-7
  // -> 4-5)) per row.
  const __m256i x = _mm256_shuffle_epi32(raw, _MM_SHUFFLE(2, 1, 2, 0));
  const __m256i y = _mm256_shuffle_epi32(raw, _MM_SHUFFLE(1, 1, 0, 0));
  const __m256i low =
      _mm256_and_si256(_mm256_srlv_epi32(x, _mm256_setr_epi32(0, 0, 0, 4, 0, 0, 0, 4)),
                       _mm256_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f,
                                         0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
  const __m256i high = _mm256_and_si256(
      _mm256_srli_epi32(y, 2),
      _mm256_setr_epi32(0, 0x30303030, 0, 0x30303030, 0, 0x30303030, 0, 0x30303030));
  return _mm256_or_si256(low, high);
}

template <bool kHigh>
struct Q45KInt : PlainX {
  static constexpr int64_t kBytes = kHigh ? 176 : 144;
  static constexpr bool kHasMin = true;
  static void Prepare(const uint8_t* a, const uint8_t* b, const float* half, PairWeights* w) {
    w->d = PairScale(half[LoadHalf(a)], half[LoadHalf(b)]);
    w->dmin = PairScale(half[LoadHalf(a + 2)], half[LoadHalf(b + 2)]);
    const __m256i bytes = Q4KScaleMinBytes(a, b);
    const __m512i s16 = _mm512_cvtepu8_epi16(bytes);  // quarters: sc a, mins a, sc b, mins b
    w->scales = _mm512_shuffle_i64x2(s16, s16, _MM_SHUFFLE(2, 2, 0, 0));
    // Each min twice: it applies to both 16-element bsums of its sub-block.
    w->mins = _mm512_cvtepu8_epi16(_mm256_unpackhi_epi8(bytes, bytes));
  }
  template <int T>
  static void Dot(const uint8_t* a, const uint8_t* b, const PairWeights& w,
                  const uint8_t* const* xq, const __m512i*, __m512i* isum) {
    const __m512i low = _mm512_set1_epi8(0x0F), bit4 = _mm512_set1_epi8(0x10);
    constexpr int64_t kQs = kHigh ? 48 : 16;
    __m512i qh = _mm512_setzero_si512();
    if (kHigh) qh = LoadPair(a, b, 16);
    for (int t = 0; t < T; ++t) isum[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      const __m512i v = LoadPair(a, b, kQs + 32 * g);
      __m512i lo = _mm512_and_si512(v, low);
      __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      if (kHigh) {
        // Bit 2g of qh[l] is bit 4 of sub-block 2g's element l, bit 2g + 1 that of 2g + 1.
        lo = OrMasked(lo, Shift16(qh, 4 - 2 * g), bit4);
        hi = OrMasked(hi, Shift16(qh, 3 - 2 * g), bit4);
      }
      const __m512i sl = BroadcastPair(w.scales, 2 * g), sh = BroadcastPair(w.scales, 2 * g + 1);
      for (int t = 0; t < T; ++t) {
        isum[t] = AddProducts(isum[t], lo, Broadcast32(xq[t] + 64 * g), sl);
        isum[t] = AddProducts(isum[t], hi, Broadcast32(xq[t] + 64 * g + 32), sh);
      }
    }
  }
};

// q6_K: q + 32 in 0..63 as stored; I takes 32 * sum_g sc_g bsum_g back out (exact int32, here
// as one vpdpwssd with -32 * sc).
struct Q6KInt : PlainX {
  static constexpr int64_t kBytes = 210;
  static constexpr bool kHasMin = false;
  static void Prepare(const uint8_t* a, const uint8_t* b, const float* half, PairWeights* w) {
    w->d = PairScale(half[LoadHalf(a + 208)], half[LoadHalf(b + 208)]);
    const __m512i s16 = _mm512_cvtepi8_epi16(
        _mm256_inserti128_si256(_mm256_castsi128_si256(Load16(a + 192)), Load16(b + 192), 1));
    SetScales16(s16, 32, w);
  }
  template <int T>
  static void Dot(const uint8_t* a, const uint8_t* b, const PairWeights& w,
                  const uint8_t* const* xq, const __m512i* bsums, __m512i* isum) {
    const __m512i low = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30);
    Groups16<T>(w, xq, bsums, isum, [&](int h, int k) {
      // Group k of half h: nibble k / 2 of ql[64h + 32 (k % 2) + l], and bits 2k, 2k + 1 of
      // qh[32h + l] as bits 4, 5.
      const __m512i ql = LoadPair(a, b, 64 * h + 32 * (k % 2));
      const __m512i nibble = k < 2 ? ql : _mm512_srli_epi16(ql, 4);
      return OrMasked(_mm512_and_si512(nibble, low),
                      Shift16(LoadPair(a, b, 128 + 32 * h), 4 - 2 * k), bits45);
    });
  }
};

// q2_K: 2-bit q, 4-bit scale and min per sub-block of 16 (no offset: its bias is zero).
struct Q2KInt : PlainX {
  static constexpr int64_t kBytes = 84;
  static constexpr bool kHasMin = true;
  static void Prepare(const uint8_t* a, const uint8_t* b, const float* half, PairWeights* w) {
    w->d = PairScale(half[LoadHalf(a + 80)], half[LoadHalf(b + 80)]);
    w->dmin = PairScale(half[LoadHalf(a + 82)], half[LoadHalf(b + 82)]);
    const __m256i sc = _mm256_inserti128_si256(_mm256_castsi128_si256(Load16(a)), Load16(b), 1);
    const __m256i low = _mm256_set1_epi8(0x0F);
    SetScales16(_mm512_cvtepu8_epi16(_mm256_and_si256(sc, low)), 0, w);
    w->mins = _mm512_cvtepu8_epi16(_mm256_and_si256(_mm256_srli_epi16(sc, 4), low));
  }
  template <int T>
  static void Dot(const uint8_t* a, const uint8_t* b, const PairWeights& w,
                  const uint8_t* const* xq, const __m512i* bsums, __m512i* isum) {
    const __m512i three = _mm512_set1_epi8(3);
    Groups16<T>(w, xq, bsums, isum, [&](int h, int k) {
      return _mm512_and_si512(_mm512_srli_epi16(LoadPair(a, b, 16 + 32 * h), 2 * k), three);
    });
  }
};

// q3_K: q + 4 = two low bits | high bit << 2, in 0..7; I takes 4 * sum_g sc_g bsum_g back out.
// The 16 signed 6-bit scales: low nibbles in bytes 0..7 (sub-blocks 0..7 low, 8..15 high
// nibble), two high bits of sub-block 4k + i in bits 2k of byte 8 + i; both rows in one ymm.
struct Q3KInt : PlainX {
  static constexpr int64_t kBytes = 110;
  static constexpr bool kHasMin = false;
  static void Prepare(const uint8_t* a, const uint8_t* b, const float* half, PairWeights* w) {
    w->d = PairScale(half[LoadHalf(a + 108)], half[LoadHalf(b + 108)]);
    const __m256i v = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a + 96))),
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 96)), 1);
    const __m256i nib = _mm256_set1_epi8(0x0F);
    const __m256i lows = _mm256_unpacklo_epi64(_mm256_and_si256(v, nib),
                                               _mm256_and_si256(_mm256_srli_epi16(v, 4), nib));
    uint32_t ha, hb;
    std::memcpy(&ha, a + 104, 4);
    std::memcpy(&hb, b + 104, 4);
    const __m256i highs = _mm256_and_si256(
        _mm256_srlv_epi32(
            _mm256_setr_epi32(static_cast<int>(ha), static_cast<int>(ha), static_cast<int>(ha),
                              static_cast<int>(ha), static_cast<int>(hb), static_cast<int>(hb),
                              static_cast<int>(hb), static_cast<int>(hb)),
            _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6)),
        _mm256_set1_epi8(3));
    const __m512i s16 = _mm512_cvtepi8_epi16(
        _mm256_sub_epi8(_mm256_or_si256(lows, _mm256_slli_epi16(highs, 4)), _mm256_set1_epi8(32)));
    SetScales16(s16, 4, w);
  }
  template <int T>
  static void Dot(const uint8_t* a, const uint8_t* b, const PairWeights& w,
                  const uint8_t* const* xq, const __m512i* bsums, __m512i* isum) {
    const __m512i three = _mm512_set1_epi8(3), bit2 = _mm512_set1_epi8(4);
    const __m512i hmask = LoadPair(a, b, 0);
    Groups16<T>(w, xq, bsums, isum, [&](int h, int k) {
      // Bit 4h + k of hmask[l] is bit 2 of element l of the group.
      const __m512i v = LoadPair(a, b, 32 + 32 * h);
      return OrMasked(_mm512_and_si512(_mm512_srli_epi16(v, 2 * k), three),
                      Shift16(hmask, 2 - (4 * h + k)), bit2);
    });
  }
};

// iq4_xs: 8 sub-blocks of 32 whose 16 bytes hold elements 0..15 (low nibbles) and 16..31
// (high); values from the signed IQ4_NL table. AVX2 forms each sub-block's products as
// |w| x (x with w's sign) and lane j of its sum covers elements 4j..4j+3 of every sub-block
// (j < 4: low nibbles; j >= 4: high nibbles 16 + 4(j - 4)..), under the sub-block's scale.
// Here the 32 bytes of sub-blocks 2k, 2k + 1 are used as loaded: their low nibbles meet the
// token's elements 0..15 of both sub-blocks (X::lo), the high nibbles elements 16..31 (X::hi),
// with scale 2k in quarters 0 and 2 and 2k + 1 in 1 and 3. Then a half's low-nibble lanes
// 0..3 and 4..7 both belong to AVX2's lanes 0..3, its high-nibble lanes to 4..7: adding the
// quarters pairwise gives AVX2's lanes exactly (int32). |w| comes from a table of magnitudes,
// the sign from the index (the table's first 8 values are the negative ones), which picks x or
// -x.
struct Iq4xsInt {
  static constexpr int64_t kBytes = 136;
  static constexpr bool kHasMin = false;
  struct X {
    __m512i lo[4], lo_neg[4], hi[4], hi_neg[4];
  };
  static void LoadX(const uint8_t* xq, X* x) {
    for (int k = 0; k < 4; ++k) {
      const __m512i v = _mm512_loadu_si512(xq + 64 * k);
      x->lo[k] = _mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(2, 0, 2, 0));
      x->hi[k] = _mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(3, 1, 3, 1));
      x->lo_neg[k] = _mm512_sub_epi8(_mm512_setzero_si512(), x->lo[k]);
      x->hi_neg[k] = _mm512_sub_epi8(_mm512_setzero_si512(), x->hi[k]);
    }
  }
  // Scale j of a row: (nibble j of scales_l) | (bits 2j, 2j + 1 of scales_h) << 4, minus 32,
  // formed in the int16 lane that uses it (lanes 0..15 row a, 16..31 row b; j = lane % 8) from
  // the words d, scales_h, scales_l low, scales_l high of each row.
  static void Prepare(const uint8_t* a, const uint8_t* b, const float* half, PairWeights* w) {
    alignas(64) static constexpr int16_t kNibbleWord[32] = {2, 2, 2, 2, 3, 3, 3, 3, 2, 2, 2,
                                                            2, 3, 3, 3, 3, 6, 6, 6, 6, 7, 7,
                                                            7, 7, 6, 6, 6, 6, 7, 7, 7, 7};
    alignas(64) static constexpr int16_t kNibbleShift[32] = {0,  4,  8, 12, 0,  4,  8, 12, 0,  4, 8,
                                                             12, 0,  4, 8,  12, 0,  4, 8,  12, 0, 4,
                                                             8,  12, 0, 4,  8,  12, 0, 4,  8,  12};
    alignas(64) static constexpr int16_t kHighWord[32] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                                          1, 1, 1, 1, 1, 5, 5, 5, 5, 5, 5,
                                                          5, 5, 5, 5, 5, 5, 5, 5, 5, 5};
    alignas(64) static constexpr int16_t kHighShift[32] = {
        0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4, 6, 8, 10, 12, 14,
        0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4, 6, 8, 10, 12, 14};
    w->d = PairScale(half[LoadHalf(a)], half[LoadHalf(b)]);
    const __m512i words = _mm512_castsi128_si512(_mm_castpd_si128(
        _mm_loadh_pd(_mm_castsi128_pd(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a))),
                     reinterpret_cast<const double*>(b))));
    const __m512i nib = _mm512_and_si512(
        _mm512_srlv_epi16(_mm512_permutexvar_epi16(_mm512_load_si512(kNibbleWord), words),
                          _mm512_load_si512(kNibbleShift)),
        _mm512_set1_epi16(0x0F));
    const __m512i high = _mm512_and_si512(
        _mm512_srlv_epi16(_mm512_permutexvar_epi16(_mm512_load_si512(kHighWord), words),
                          _mm512_load_si512(kHighShift)),
        _mm512_set1_epi16(3));
    w->scales =
        _mm512_sub_epi16(_mm512_or_si512(nib, _mm512_slli_epi16(high, 4)), _mm512_set1_epi16(32));
  }
  template <int T>
  static void Dot(const uint8_t* a, const uint8_t* b, const PairWeights& w, const X* xs,
                  const __m512i*, __m512i* isum) {
    const __m512i magnitudes = _mm512_broadcast_i32x4(
        _mm_abs_epi8(Load16(reinterpret_cast<const uint8_t*>(kIq4nlValues))));
    const __m512i low = _mm512_set1_epi8(0x0F), bit3 = _mm512_set1_epi8(0x08);
    __m512i lo_sum[T], hi_sum[T];
    for (int t = 0; t < T; ++t) lo_sum[t] = hi_sum[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m512i v = LoadPair(a, b, 8 + 32 * k);
      const __m512i q_lo = _mm512_shuffle_epi8(magnitudes, _mm512_and_si512(v, low));
      const __m512i q_hi =
          _mm512_shuffle_epi8(magnitudes, _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
      const __mmask64 lo_negative = _mm512_testn_epi8_mask(v, bit3);
      const __mmask64 hi_positive = _mm512_movepi8_mask(v);
      const __m512i sc = ScalePair(w.scales, k);
      for (int t = 0; t < T; ++t) {
        const X& x = xs[t];
        lo_sum[t] = AddProducts(lo_sum[t], q_lo,
                                _mm512_mask_blend_epi8(lo_negative, x.lo[k], x.lo_neg[k]), sc);
        hi_sum[t] = AddProducts(hi_sum[t], q_hi,
                                _mm512_mask_blend_epi8(hi_positive, x.hi_neg[k], x.hi[k]), sc);
      }
    }
    // Per half: (lo quarter 0 + lo quarter 1, hi quarter 0 + hi quarter 1).
    const __m512i first = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i second = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    for (int t = 0; t < T; ++t) {
      isum[t] = _mm512_add_epi32(_mm512_permutex2var_epi64(lo_sum[t], first, hi_sum[t]),
                                 _mm512_permutex2var_epi64(lo_sum[t], second, hi_sum[t]));
    }
  }
};

// Tile shapes, measured (scratch in-L2 runs, avx2 and avx512 interleaved, 4096 columns): GEMV 4
// rows (2 pairs, four read streams, as AVX2's K-quant kernel; on Sapphire Rapids 8 rows read
// faster from DRAM, paired ratio 80-85% against 75-79%, but on Zen 4, one thread, 4096
// columns, 8 rows reach 46-57% of the read floor and 4 rows 60-78%: q6_K 47% -> 75-78%, q5_K
// 53-54% -> 63-65%, q4_K 56-57% -> 60-62%, in-L2 rate 2-6% lower; the legacy types' QuantKernel
// stays at 8, where 4 rows read slower on Zen 4 too); many tokens one pair x 6 tokens (each
// unpacked pair meets 6 tokens: GEMM 2.2-2.3x avx2 for q4_K/q6_K, against 1.8-2.0x at 4 x 4 and
// 1.6x at 4 x 2). In a GEMV whose rows are slices
// (next == nullptr), each row's block kAhead blocks on is prefetched too: paired ratio 87-89%
// against 81-83% without (q4_K, q5_K, q6_K at 1 and 2 threads).
template <class B>
struct KQuantKernel {
  static constexpr int kGemvRows = 4;
  static constexpr int kRows = 2;
  static constexpr int kTokens = 6;
  // As AVX2's: each stream prefetches a page ahead (ForEachTile).
  static constexpr bool kPrefetchStripes = true;
  static constexpr int64_t kAhead = 4;

  template <int R, int T>
  static void Tile(const uint8_t* const* rows, const uint8_t* const* next, int64_t cols,
                   const uint8_t* xb, int64_t x_stride, float* y, int64_t y_stride) {
    constexpr int P = (R + 1) / 2;
    const float* half = HalfToFloatTable();
    __m512 acc[P][T];
    for (int p = 0; p < P; ++p) {
      for (int t = 0; t < T; ++t) acc[p][t] = _mm512_setzero_ps();
    }
    const int64_t n_blocks = cols / kQK_K;
    for (int64_t blk = 0; blk < n_blocks; ++blk) {
      if (next != nullptr) {
        PrefetchBlock<B::kBytes>(next, R, blk);
      } else if (T == 1 && blk + kAhead < n_blocks) {
        PrefetchBlock<B::kBytes>(rows, R, blk + kAhead);
      }
      typename B::X xq[T];
      __m512i bsums[T];
      __m512 xd[T];
      for (int t = 0; t < T; ++t) {
        const uint8_t* xt = xb + t * x_stride + blk * kQ8KBlockBytes;
        xd[t] = _mm512_set1_ps(*reinterpret_cast<const float*>(xt));
        B::LoadX(xt + kQ8KQs, &xq[t]);
        bsums[t] = Broadcast32(xt + kQ8KSums);
      }
      for (int p = 0; p < P; ++p) {
        const uint8_t* a = rows[2 * p] + blk * B::kBytes;
        const uint8_t* b = rows[std::min(2 * p + 1, R - 1)] + blk * B::kBytes;
        PairWeights w;
        B::Prepare(a, b, half, &w);
        __m512i isum[T];
        B::template Dot<T>(a, b, w, xq, bsums, isum);
        for (int t = 0; t < T; ++t) {
          acc[p][t] =
              _mm512_fmadd_ps(_mm512_mul_ps(w.d, xd[t]), _mm512_cvtepi32_ps(isum[t]), acc[p][t]);
          if constexpr (B::kHasMin) {
            const __m512i msum = _mm512_madd_epi16(w.mins, bsums[t]);
            acc[p][t] =
                _mm512_fnmadd_ps(_mm512_mul_ps(w.dmin, xd[t]), _mm512_cvtepi32_ps(msum), acc[p][t]);
          }
        }
      }
    }
    for (int t = 0; t < T; ++t) {
      for (int p = 0; p < P; ++p) {
        float sa, sb;
        HalfSums(acc[p][t], &sa, &sb);
        y[t * y_stride + 2 * p] = sa;
        if (2 * p + 1 < R) y[t * y_stride + 2 * p + 1] = sb;
      }
    }
  }
};

// ---- axpy and dequantize: each block's DequantizeRow values, 64 columns a step. ----
//
// A decoder prepares each row's block once (Prepare: its sub-block scales in f32 and, for some
// types, the quants unpacked to a byte per element), then gives the f32 values of 64 columns at
// a time straight to registers (Group): axpy adds them into y with one FMA per row and element,
// rows in order, as AVX2 does 8 at a time; dequantize stores them. The values are DequantizeRow's:
// d * sc and dmin * m in f32, then (d * sc) * q and its - dmin * m per element. (d * sc) * q is
// exact for these types (an fp16 d, a scale of at most 6 bits and q of at most 7 fit f32's 24-bit
// significand), so whether the compiler contracts it with the subtraction into an FMA (GCC's
// C++ default is -ffp-contract=fast) does not change a bit (q6_K has no subtraction). Where q takes
// only 16 or 32 values (q4_K, q5_K, iq4_xs) those values are computed per sub-block into a table
// that vpermps (low 4 index bits) or vpermt2ps (low 5) reads: the same values, for a mul and a sub
// per possible value instead of a convert, a mul and a sub per element.

// 16 bytes at p, zero-extended to int32.
inline __m512i WidenU8(const uint8_t* p) { return _mm512_cvtepu8_epi32(Load16(p)); }
// d * q (and - m), the reference's separate roundings.
inline void StoreScaled(float* out, float d, __m512i q) {
  _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(q)));
}
inline void StoreScaledMinus(float* out, float d, __m512i q, float m) {
  _mm512_storeu_ps(out, _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(q)),
                                      _mm512_set1_ps(m)));
}

inline __m512 Iota16(float base) {
  return _mm512_add_ps(_mm512_set1_ps(base),
                       _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
}

// q4_K and q5_K: sub-block s of 32 has its own scale and min; x = (d * sc) * q - dmin * m.
// Sub-block 2g is the low nibbles of qs[32g..32g + 31], 2g + 1 the high ones (and for q5_K bits
// 2g, 2g + 1 of qh[0..31] their bit 4).
template <bool kHigh>
struct Q45KDecode {
  static constexpr int64_t kBytes = kHigh ? 176 : 144;
  struct Row {
    alignas(64) float dm[16];  // d * sc of sub-block s in lane s, dmin * m in lane 8 + s
    // q5_K: q of each element in its low five bits (the bits above are not read).
    alignas(64) uint8_t q[kHigh ? kQK_K : 1];
  };
  static void Prepare(const uint8_t* b, const float* half, Row* row) {
    const __m512 dd = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(half[LoadHalf(b)]),
                                           _mm512_set1_ps(half[LoadHalf(b + 2)]));
    const __m128i sm = _mm256_castsi256_si128(Q4KScaleMinBytes(b, b));
    _mm512_store_ps(row->dm, _mm512_mul_ps(dd, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sm))));
    if constexpr (kHigh) {
      // Per 64 elements: the low nibbles in the low half, the high ones in the high half, bit 4
      // from qh rotated into place within each byte (bits 2g and 2g + 1 to bit 4).
      const __m512i qh = _mm512_broadcast_i64x4(Load32(b + 16));
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) {
        const __m512i nib = _mm512_srlv_epi64(_mm512_broadcast_i64x4(Load32(b + 48 + 32 * g)),
                                              _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0));
        const int64_t lo = (4 - 2 * g) & 63, hi = (3 - 2 * g) & 63;
        const __m512i bit4 =
            _mm512_rolv_epi64(qh, _mm512_set_epi64(hi, hi, hi, hi, lo, lo, lo, lo));
        // Bits 0..3 from nib, 4..7 from bit4.
        _mm512_store_si512(row->q + 64 * g,
                           _mm512_ternarylogic_epi32(nib, bit4, _mm512_set1_epi8(0x0F), 0xE4));
      }
    }
  }
  static void Group(const uint8_t* b, const Row& row, int g, __m512 out[4]) {
    if constexpr (kHigh) {
      for (int k = 0; k < 4; ++k) {
        const int s = 2 * g + k / 2;
        const __m512 dl = _mm512_set1_ps(row.dm[s]), ml = _mm512_set1_ps(row.dm[8 + s]);
        const __m512 t0 = _mm512_sub_ps(_mm512_mul_ps(dl, Iota16(0)), ml);
        const __m512 t1 = _mm512_sub_ps(_mm512_mul_ps(dl, Iota16(16)), ml);
        out[k] = _mm512_permutex2var_ps(t0, WidenU8(row.q + 64 * g + 16 * k), t1);
      }
    } else {
      __m512 t[2];
      for (int j = 0; j < 2; ++j) {
        const int s = 2 * g + j;
        t[j] = _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(row.dm[s]), Iota16(0)),
                             _mm512_set1_ps(row.dm[8 + s]));
      }
      const __m512i u0 = WidenU8(b + 16 + 32 * g), u1 = WidenU8(b + 32 + 32 * g);
      out[0] = _mm512_permutexvar_ps(u0, t[0]);
      out[1] = _mm512_permutexvar_ps(u1, t[0]);
      out[2] = _mm512_permutexvar_ps(_mm512_srli_epi32(u0, 4), t[1]);
      out[3] = _mm512_permutexvar_ps(_mm512_srli_epi32(u1, 4), t[1]);
    }
  }
};

// q6_K: halves of 128; x = (d * sc) * (q - 32), sub-blocks of 16. Element 32s + l of half h is
// nibble s / 2 of ql[64h + 32 (s % 2) + l] with bits 2s, 2s + 1 of qh[32h + l] as bits 4, 5.
struct Q6KDecode {
  static constexpr int64_t kBytes = 210;
  struct Row {
    alignas(64) float dl[16];     // d * sc per sub-block
    alignas(64) int8_t q[kQK_K];  // q - 32
  };
  static void Prepare(const uint8_t* b, const float* half, Row* row) {
    const __m512 d = _mm512_set1_ps(half[LoadHalf(b + 208)]);
    _mm512_store_ps(row->dl,
                    _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(Load16(b + 192)))));
    const __m512i low = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30),
                  offset = _mm512_set1_epi8(32);
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = _mm512_loadu_si512(b + 64 * h);  // s = 0, 2 | s = 1, 3
      const __m512i qh = _mm512_broadcast_i64x4(Load32(b + 128 + 32 * h));
      const __m512i nib[2] = {_mm512_and_si512(ql, low),
                              _mm512_and_si512(_mm512_srli_epi16(ql, 4), low)};
      for (int j = 0; j < 2; ++j) {
        // Sub-blocks 2j (low half), 2j + 1 (high half): qh shifted right by 4j, 4j + 2.
        const __m512i hb = _mm512_slli_epi16(
            _mm512_srlv_epi64(qh, _mm512_set_epi64(4 * j + 2, 4 * j + 2, 4 * j + 2, 4 * j + 2,
                                                   4 * j, 4 * j, 4 * j, 4 * j)),
            4);
        _mm512_store_si512(row->q + 128 * h + 64 * j,
                           _mm512_sub_epi8(OrMasked(nib[j], hb, bits45), offset));
      }
    }
  }
  static void Group(const uint8_t*, const Row& row, int g, __m512 out[4]) {
    for (int k = 0; k < 4; ++k) {
      const int e = 64 * g + 16 * k;
      out[k] = _mm512_mul_ps(_mm512_set1_ps(row.dl[e / 16]),
                             _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                 Load16(reinterpret_cast<const uint8_t*>(row.q) + e))));
    }
  }
};

// q2_K: x = (d * (sc & 15)) * q - dmin * (sc >> 4), sub-blocks of 16.
struct Q2KDecode {
  static constexpr int kBlock = kQK_K;
  static constexpr int64_t kBytes = 84;
  static void Decode(const uint8_t* b, float* out) {
    const float* half = HalfToFloatTable();
    const float d = half[LoadHalf(b + 80)], dmin = half[LoadHalf(b + 82)];
    const __m512i three = _mm512_set1_epi32(3);
    for (int h = 0; h < 2; ++h) {
      for (int c = 0; c < 32; c += 16) {
        const __m512i v = WidenU8(b + 16 + 32 * h + c);
        for (int s = 0; s < 4; ++s) {
          const int e = 128 * h + 32 * s + c;
          const uint8_t sc = b[e / 16];
          StoreScaledMinus(out + e, d * static_cast<float>(sc & 0x0F),
                           _mm512_and_si512(_mm512_srli_epi32(v, 2 * s), three),
                           dmin * static_cast<float>(sc >> 4));
        }
      }
    }
  }
};

// q3_K: q = two low bits - (high bit of hmask ? 0 : 4); x = (d * sc) * q, sub-blocks of 16.
struct Q3KDecode {
  static constexpr int kBlock = kQK_K;
  static constexpr int64_t kBytes = 110;
  static void Decode(const uint8_t* b, float* out) {
    const float d = HalfToFloatTable()[LoadHalf(b + 108)];
    const __m512i three = _mm512_set1_epi32(3), one = _mm512_set1_epi32(1),
                  four = _mm512_set1_epi32(4);
    for (int c = 0; c < 32; c += 16) {
      const __m512i hmask = WidenU8(b + c);
      for (int h = 0; h < 2; ++h) {
        const __m512i v = WidenU8(b + 32 + 32 * h + c);
        for (int s = 0; s < 4; ++s) {
          const __m512i present =
              _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hmask, 4 * h + s), one), 2);
          const __m512i q = _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(v, 2 * s), three),
                                             _mm512_andnot_si512(present, four));
          const int e = 128 * h + 32 * s + c;
          StoreScaled(out + e, d * static_cast<float>(Q3KScale(b + 96, e / 16)), q);
        }
      }
    }
  }
};

// iq4_xs: x = (d * (sc - 32)) * value, sub-blocks of 32: the low nibbles of 16 bytes, then the
// high ones, index the IQ4_NL values.
struct Iq4xsDecode {
  static constexpr int64_t kBytes = 136;
  struct Row {
    alignas(32) float dl[8];  // d * (sc - 32) per sub-block
  };
  static void Prepare(const uint8_t* b, const float* half, Row* row) {
    uint32_t sl;
    std::memcpy(&sl, b + 4, 4);
    const __m256i low =
        _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(sl)),
                                           _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                         _mm256_set1_epi32(0x0F));
    const __m256i high =
        _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(LoadHalf(b + 2)),
                                           _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                         _mm256_set1_epi32(3));
    const __m256i sc =
        _mm256_sub_epi32(_mm256_or_si256(low, _mm256_slli_epi32(high, 4)), _mm256_set1_epi32(32));
    _mm256_store_ps(row->dl,
                    _mm256_mul_ps(_mm256_set1_ps(half[LoadHalf(b)]), _mm256_cvtepi32_ps(sc)));
  }
  static void Group(const uint8_t* b, const Row& row, int g, __m512 out[4]) {
    const __m512 values = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(Load16(reinterpret_cast<const uint8_t*>(kIq4nlValues))));
    for (int j = 0; j < 2; ++j) {
      const int s = 2 * g + j;
      const __m512 t = _mm512_mul_ps(_mm512_set1_ps(row.dl[s]), values);
      const __m512i u = WidenU8(b + 8 + 16 * s);
      out[2 * j] = _mm512_permutexvar_ps(u, t);
      out[2 * j + 1] = _mm512_permutexvar_ps(_mm512_srli_epi32(u, 4), t);
    }
  }
};

// q2_K and q3_K (outside the sparse FFN's types): the whole block decoded into the row's state.
template <class D>
struct Buffered {
  static constexpr int64_t kBytes = D::kBytes;
  struct Row {
    alignas(64) float w[kQK_K];
  };
  static void Prepare(const uint8_t* b, const float*, Row* row) { D::Decode(b, row->w); }
  static void Group(const uint8_t*, const Row& row, int g, __m512 out[4]) {
    for (int k = 0; k < 4; ++k) out[k] = _mm512_load_ps(row.w + 64 * g + 16 * k);
  }
};

template <class D>
struct BlockKernel {
  static constexpr int64_t kBytes = D::kBytes;

  template <int R>
  static void AxpyTile(const uint8_t* const* rows, const uint8_t* const* next, const float* coeffs,
                       int64_t cols, float* y) {
    const float* half = HalfToFloatTable();
    __m512 cv[R];
    for (int r = 0; r < R; ++r) cv[r] = _mm512_set1_ps(coeffs[r]);
    typename D::Row state[R];
    for (int64_t blk = 0; blk < cols / kQK_K; ++blk) {
      if (next != nullptr) PrefetchBlock<kBytes>(next, R, blk);
      const uint8_t* b[R];
      for (int r = 0; r < R; ++r) {
        b[r] = rows[r] + blk * kBytes;
        D::Prepare(b[r], half, &state[r]);
      }
      float* yb = y + blk * kQK_K;
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) {
        __m512 yv[4];
        for (int k = 0; k < 4; ++k) yv[k] = _mm512_loadu_ps(yb + 64 * g + 16 * k);
        for (int r = 0; r < R; ++r) {
          __m512 w[4];
          D::Group(b[r], state[r], g, w);
          for (int k = 0; k < 4; ++k) yv[k] = _mm512_fmadd_ps(cv[r], w[k], yv[k]);
        }
        for (int k = 0; k < 4; ++k) _mm512_storeu_ps(yb + 64 * g + 16 * k, yv[k]);
      }
    }
  }

  static void Dequantize(const uint8_t* row, int64_t cols, float* out) {
    const float* half = HalfToFloatTable();
    typename D::Row state;
    for (int64_t blk = 0; blk < cols / kQK_K; ++blk) {
      const uint8_t* b = row + blk * kBytes;
      D::Prepare(b, half, &state);
      for (int g = 0; g < 4; ++g) {
        __m512 w[4];
        D::Group(b, state, g, w);
        for (int k = 0; k < 4; ++k) _mm512_storeu_ps(out + blk * kQK_K + 64 * g + 16 * k, w[k]);
      }
    }
  }
};

// ---- Q8_K activations: ggml's quantize_row_q8_K_ref (QuantizeRowQ8_K), 16 values a step. ----
//
// The same float operations as the reference: the first value of largest magnitude sets
// iscale = -127 / max, each x * iscale is rounded by the 1.5 * 2^23 addition of ggml's
// nearest_int, the signed saturating narrow caps the one possible 128 at 127, d = 1 / iscale;
// the bsums are exact sums of the stored quants.
int64_t Q8KInputBytes(int64_t cols) { return cols / kQK_K * kQ8KBlockBytes; }

void PrepareQ8K(const float* x, int64_t cols, uint8_t* out) {
  const __m512 magic = _mm512_set1_ps(12582912.0f);
  const __m512i mantissa = _mm512_set1_epi32(0x007fffff), bias = _mm512_set1_epi32(0x00400000);
  for (int64_t blk = 0; blk < cols / kQK_K; ++blk) {
    const float* xb = x + blk * kQK_K;
    uint8_t* o = out + blk * kQ8KBlockBytes;
    __m512 amax16 = _mm512_setzero_ps();
    for (int k = 0; k < kQK_K / 16; ++k) {
      amax16 = _mm512_max_ps(amax16, _mm512_abs_ps(_mm512_loadu_ps(xb + 16 * k)));
    }
    const float amax = _mm512_reduce_max_ps(amax16);
    if (amax == 0.0f) {
      std::memset(o, 0, kQ8KBlockBytes);
      continue;
    }
    float max = 0.0f;
    for (int k = 0; k < kQK_K / 16; ++k) {
      const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(xb + 16 * k)),
                                               _mm512_set1_ps(amax), _CMP_EQ_OQ);
      if (hit != 0) {
        max = xb[16 * k + __builtin_ctz(static_cast<unsigned>(hit))];
        break;
      }
    }
    const float iscale = -127.0f / max;
    const __m512 iv = _mm512_set1_ps(iscale);
    int16_t sums[kQK_K / 16];
    for (int k = 0; k < kQK_K / 16; ++k) {
      const __m512 r = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(xb + 16 * k), iv), magic);
      const __m512i q = _mm512_sub_epi32(_mm512_and_si512(_mm512_castps_si512(r), mantissa), bias);
      const __m128i q8 = _mm512_cvtsepi32_epi8(q);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + kQ8KQs + 16 * k), q8);
      sums[k] = static_cast<int16_t>(_mm512_reduce_add_epi32(_mm512_cvtepi8_epi32(q8)));
    }
    std::memcpy(o + kQ8KSums, sums, sizeof sums);
    const float d = 1.0f / iscale;
    std::memcpy(o, &d, sizeof d);
  }
}

template <GgmlType kType, class B, class D>
void Fill(KernelSet& set) {
  using F = BlockKernel<D>;
  set.by_type[static_cast<size_t>(kType)] = {&TiledDotRows<KQuantKernel<B>>, &TiledAxpyRows<F>,
                                             &F::Dequantize, &Q8KInputBytes, &PrepareQ8K};
}

}  // namespace

void FillKQuantAvx512(KernelSet& set) {
  using T = GgmlType;
  Fill<T::kQ2_K, Q2KInt, Buffered<Q2KDecode>>(set);
  Fill<T::kQ3_K, Q3KInt, Buffered<Q3KDecode>>(set);
  Fill<T::kQ4_K, Q45KInt<false>, Q45KDecode<false>>(set);
  Fill<T::kQ5_K, Q45KInt<true>, Q45KDecode<true>>(set);
  Fill<T::kQ6_K, Q6KInt, Q6KDecode>(set);
  Fill<T::kIQ4_XS, Iq4xsInt, Iq4xsDecode>(set);
}

}  // namespace thermocline::matmul_internal
