// AVX2 dot product of Q4_K (and Q5_K) weights in the 8-row interleaved layouts
// (shared/gguf/q4_kx8.h) against the activations of PrepareQ4_Kx8Avx2 (layout in
// matmul_kernels.h). Q5_K adds to each nibble register its fifth bits (a shift and a mask from
// the qh chunk) and sums 4 byte products in int16 before a madd instead of 8.
//
// Why. The row kernel (KQuantKernel<Q45KInt<false>> in matmul_avx2.cc) spends, per row and
// 256-column super-block (144 bytes), ~60 vector operations: the scalar-word unpack of the 6-bit
// scales and mins and their widening, 4 loads and 12 masks/shifts for the nibbles, 8 maddubs, 8
// scale shuffles and 8 madd, the int32 adds, the mins' madd, two conversions, two multiplies and
// two FMAs, and a horizontal sum per row at the end. Here a group of 8 rows shares all but the
// byte products: per super-block (1184 bytes) 32 loads and 96 masks/shifts give the nibble
// registers, 64 maddubs against 4-byte activation broadcasts (loads, not shuffles) are summed
// per sub-block in int16 (at most 8 x 2 x 15 x 127 = 30480, exact), 8 madd apply the scales
// (already bytes: one widening and two byte shuffles per sub-block pair, shared by the tile's
// tokens), 4 madd meet the mins with the activation's sub-block sums, and two conversions, two
// multiplies and two FMAs finish 8 rows at once; no horizontal sum. About 33 operations per
// row-super-block instead of 60. Up to 4 tokens share the nibble and scale work in GEMM tiles.
//
// Arithmetic. Per row the sums I and M of a super-block are exact int32 (|I| <= 8 x 63 x 32 x
// 15 x 127 < 2^25, |M| <= 8 x 63 x 32 x 127 < 2^21) and are added as DotQ4_Kx8Portable adds
// them: bit-identical to it. The row kernel keeps 8 partial lanes per row and sums them at the
// end, so the two differ by rounding only (the bound is derived in tests/unit/kquant_x8_test.cc).
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "shared/gguf/q4_kx8.h"
#include "shared/gguf/quant.h"
#include "shared/kernels/matmul_kernels.h"
#include "shared/kernels/prefetch_weights.h"
#include "shared/kernels/simd_avx2.h"

namespace thermocline::matmul_internal {
namespace {

using simd::Broadcast4;
using simd::Load32;

// A group's super-blocks are one sequential stream, which the hardware prefetcher alone does not
// keep far enough ahead at one thread: prefetching two super-blocks (2368 bytes) ahead took a
// 1-thread DRAM GEMV from 14-15 to 18 GB/s (a 64 MiB matrix on the development VM; a 4-block
// distance was no better; the hint is PrefetchWeights'). Past a group's end it reaches into the
// next group, which is the next to be read; past the matrix it is a harmless hint.
constexpr int64_t kPrefetchAhead = 2 * kQ4_Kx8BlockBytes;

// 16 bytes of a scale or min pair (row r's two at 2r, 2r + 1) as int16: lane r holds
// (first, second) of row r.
inline __m256i WidenPair(const uint8_t* p) {
  return _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Bit `bit` of every byte of v moved to bit 4 (the fifth quant bit of Q5_K), other bits zero.
// A 16-bit shift by at most 4 keeps each byte's own bit there.
template <int kBit>
inline __m256i BitTo4(__m256i v) {
  const __m256i mask = _mm256_set1_epi8(0x10);
  if constexpr (kBit < 4) return _mm256_and_si256(_mm256_slli_epi16(v, 4 - kBit), mask);
  if constexpr (kBit == 4) return _mm256_and_si256(v, mask);
  if constexpr (kBit > 4) return _mm256_and_si256(_mm256_srli_epi16(v, kBit - 4), mask);
}

// y[t * y_stride + i] for the group's 8 rows i and T tokens; kHigh: Q5_K.
template <bool kHigh, int T>
void GroupTile(const uint8_t* group, int64_t n_blocks, const uint8_t* x, int64_t x_stride,
               float* y, int64_t y_stride) {
  constexpr int64_t kBlock = kHigh ? kQ5_Kx8BlockBytes : kQ4_Kx8BlockBytes;
  constexpr int64_t kQs = kHigh ? kQ5_Kx8QsAt : kQ4_Kx8QsAt;
  // Byte-product pairs summed in int16 before a madd: at most 8 x 2 x 15 x 127 = 30480 for 4-bit
  // quants, 4 x 2 x 31 x 127 = 31496 for 5-bit ones: exact.
  constexpr int kSumsPerMadd = kHigh ? 4 : 8;
  const __m256i low = _mm256_set1_epi8(0x0F);
  // From a widened pair (lane r: int16 s0, s1), the int16 pairs (s0, s0) and (s1, s1) that madd
  // multiplies a sub-block's int16 pair sums by.
  const __m256i first = _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 0, 1,
                                         0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13);
  const __m256i second = _mm256_setr_epi8(2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15,
                                          2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15);
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint8_t* wb = group + b * kBlock;
    for (int64_t at = 0; at < kBlock; at += 64) {
      PrefetchWeights(wb + kPrefetchAhead + at);
    }
    const uint8_t* xb[T];
    for (int t = 0; t < T; ++t) xb[t] = x + t * x_stride + b * kQ4_Kx8InputBlockBytes;
    __m256i isum[T];
    for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
    // Sub-blocks 2G (low nibbles) and 2G + 1 (high nibbles); G a template parameter so that
    // Q5_K's bit shifts are immediates.
    auto sub_block_pair = [&]<int G>() {
      const __m256i sc = WidenPair(wb + kQ4_Kx8ScalesAt + 16 * G);
      const __m256i sc_lo = _mm256_shuffle_epi8(sc, first);
      const __m256i sc_hi = _mm256_shuffle_epi8(sc, second);
      for (int k0 = 0; k0 < 8; k0 += kSumsPerMadd) {
        __m256i s_lo[T], s_hi[T];
        for (int t = 0; t < T; ++t) s_lo[t] = s_hi[t] = _mm256_setzero_si256();
        for (int k = k0; k < k0 + kSumsPerMadd; ++k) {
          const __m256i v = Load32(wb + kQs + 32 * (8 * G + k));
          __m256i lo = _mm256_and_si256(v, low);
          __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
          if constexpr (kHigh) {
            const __m256i qh = Load32(wb + kQ5_Kx8QhAt + 32 * k);
            lo = _mm256_or_si256(lo, BitTo4<2 * G>(qh));
            hi = _mm256_or_si256(hi, BitTo4<2 * G + 1>(qh));
          }
          for (int t = 0; t < T; ++t) {
            const uint8_t* xq = xb[t] + 64 * G + 4 * k;
            const __m256i pl = _mm256_maddubs_epi16(lo, Broadcast4(xq));
            const __m256i ph = _mm256_maddubs_epi16(hi, Broadcast4(xq + 32));
            s_lo[t] = _mm256_add_epi16(s_lo[t], pl);
            s_hi[t] = _mm256_add_epi16(s_hi[t], ph);
          }
        }
        for (int t = 0; t < T; ++t) {
          const __m256i part = _mm256_add_epi32(_mm256_madd_epi16(s_lo[t], sc_lo),
                                                _mm256_madd_epi16(s_hi[t], sc_hi));
          isum[t] = _mm256_add_epi32(isum[t], part);
        }
      }
    };
    sub_block_pair.template operator()<0>();
    sub_block_pair.template operator()<1>();
    sub_block_pair.template operator()<2>();
    sub_block_pair.template operator()<3>();
    __m256i mins[4];
    for (int p = 0; p < 4; ++p) mins[p] = WidenPair(wb + kQ4_Kx8MinsAt + 16 * p);
    const __m256 d =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + kQ4_Kx8DAt)));
    const __m256 dmin =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + kQ4_Kx8DminAt)));
    for (int t = 0; t < T; ++t) {
      const uint8_t* xs = xb[t] + kQ4_Kx8InputSumsAt;
      __m256i msum = _mm256_madd_epi16(mins[0], Broadcast4(xs));
      for (int p = 1; p < 4; ++p) {
        msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mins[p], Broadcast4(xs + 4 * p)));
      }
      const __m256 xd =
          _mm256_broadcast_ss(reinterpret_cast<const float*>(xb[t] + kQ4_Kx8InputDAt));
      acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(d, xd), _mm256_cvtepi32_ps(isum[t]), acc[t]);
      acc[t] = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, xd), _mm256_cvtepi32_ps(msum), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) _mm256_storeu_ps(y + t * y_stride, acc[t]);
}

template <bool kHigh>
constexpr GroupTileFn kGroupTiles[] = {&GroupTile<kHigh, 1>, &GroupTile<kHigh, 2>,
                                       &GroupTile<kHigh, 3>, &GroupTile<kHigh, 4>};

template <bool kHigh>
void Dot(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
         int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  RunGroupTiles(kGroupTiles<kHigh>, groups, n_groups, cols / kQK_K, x, x_stride, n_tokens, y,
                y_stride);
}

}  // namespace

void PrepareQ4_Kx8Avx2(const float* x, int64_t cols, uint8_t* out) {
  // The row kernels' vectorized Q8_K rounding (bit-identical to QuantizeRowQ8_K): at decode the
  // preparation is a visible share of a small matrix's time, as for Q4_0 (legacy_x8_avx2.cc).
  thread_local std::vector<uint8_t> q;
  q.resize(cols / kQK_K * kQ8KBlockBytes);
  Avx2Kernels(false).by_type[static_cast<size_t>(GgmlType::kQ4_K)].prepare_input(x, cols,
                                                                                q.data());
  PackQ4_Kx8Input(q.data(), cols / kQK_K, out);
}

void DotQ4_Kx8Avx2(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                   int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  Dot<false>(groups, n_groups, cols, x, x_stride, n_tokens, y, y_stride);
}

void DotQ5_Kx8Avx2(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                   int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  Dot<true>(groups, n_groups, cols, x, x_stride, n_tokens, y, y_stride);
}

}  // namespace thermocline::matmul_internal
