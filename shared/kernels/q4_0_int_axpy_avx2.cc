// The AVX2 integer axpy over Q4_0 rows (IntAxpyRows; the operations matmul_kernels.h specifies,
// in q4_0_int_axpy.cc's order). Per group of 16 rows and chunk of 8 blocks, a prepass reads
// every block's scale (the scales of one row sit 18 bytes apart), forms the 8-bit coefficients
// q_i of each block and lays them out by pairs of rows; the products then take the group two
// rows at a time: the nibbles of both rows, interleaved byte by byte, times the pair's
// coefficients (maddubs) give one int16 per column, eight pairs summed in int16 (bounded, see
// kIntAxpyGroupRows), widened and scaled into y once per group. About a third of the f32
// decode's operations per weight; measured 1.35x its rate in L2 (docs/performance.md,
// "IntAxpyRows"), the prepass 40% of the time.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "shared/gguf/ggml_type.h"
#include "shared/kernels/int_axpy_groups.h"
#include "shared/kernels/matmul_kernels.h"
#include "shared/util/fp16.h"

namespace thermocline::matmul_internal {
namespace {

constexpr int64_t kBlockBytes = sizeof(BlockQ4_0);
constexpr int64_t kQsAt = offsetof(BlockQ4_0, qs);
constexpr int kG = static_cast<int>(kIntAxpyGroupRows);

// One chunk of 8 blocks of a group: the block scales s, their corrections 8 * sum q_i, and the
// coefficients as bytes [pair][16]: q_2p and q_2p+1 of block 2k, then of block 2k+1, k < 4.
struct Chunk {
  alignas(32) float s[8];
  alignas(32) int32_t corr[8];
  alignas(16) uint8_t q[kG / 2][16];
};

// Controls moving bytes 0-1 of lane 0 and bytes 2-3 of lane 1 to word k of their lane.
struct ScaleControls {
  alignas(32) int8_t bytes[4][32];
  constexpr ScaleControls() : bytes{} {
    for (int k = 0; k < 4; ++k) {
      for (int j = 0; j < 32; ++j) bytes[k][j] = -1;
      bytes[k][2 * k] = 0;
      bytes[k][2 * k + 1] = 1;
      bytes[k][16 + 2 * k] = 2;
      bytes[k][16 + 2 * k + 1] = 3;
    }
  }
};
constexpr ScaleControls kScaleControls;

inline __m128i EightScales(const uint8_t* p) {
  __m256i v = _mm256_setzero_si256();
  for (int k = 0; k < 4; ++k) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * k * kBlockBytes));
    const __m256i ctrl =
        _mm256_load_si256(reinterpret_cast<const __m256i*>(kScaleControls.bytes[k]));
    v = _mm256_or_si256(v, _mm256_shuffle_epi8(w, ctrl));
  }
  // Words: d0 d2 d4 d6 | d1 d3 d5 d7.
  const __m128i x = _mm256_castsi256_si128(_mm256_permute4x64_epi64(v, 0x08));
  return _mm_unpacklo_epi16(x, _mm_srli_si128(x, 8));
}

// The prepass of blocks [b, b + 8) of a group (those past nb count as zeros): a_i, their
// maximum, s, and the coefficient bytes with their correction.
void Prepare(const uint8_t* const* rows, const float* coeffs, int n, int64_t b, int64_t nb,
             Chunk& c) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  // Per lane: q_2p, q_2p+1 of blocks 0, 1, then of blocks 2, 3 (after the packs below).
  const __m256i pairs = _mm256_setr_epi8(0, 4, 1, 5, 2, 6, 3, 7, -1, -1, -1, -1, -1, -1, -1, -1, 0,
                                         4, 1, 5, 2, 6, 3, 7, -1, -1, -1, -1, -1, -1, -1, -1);
  __m256 a[kG];
  __m256 amax = _mm256_setzero_ps();
  for (int i = 0; i < n; ++i) {
    if (b + 8 <= nb) {
      a[i] = _mm256_mul_ps(_mm256_set1_ps(coeffs[i]),
                           _mm256_cvtph_ps(EightScales(rows[i] + b * kBlockBytes)));
    } else {
      alignas(32) float t[8];
      for (int64_t k = 0; k < 8; ++k) {
        uint16_t d = 0;
        if (b + k < nb) std::memcpy(&d, rows[i] + (b + k) * kBlockBytes, sizeof d);
        t[k] = b + k < nb ? coeffs[i] * Fp16ToFp32(d) : 0.0f;
      }
      a[i] = _mm256_load_ps(t);
    }
    // max(|a|, m) is |a| > m ? |a| : m: a NaN |a| leaves m (matmul_kernels.h).
    amax = _mm256_max_ps(_mm256_andnot_ps(sign, a[i]), amax);
  }
  const __m256 s = _mm256_div_ps(amax, _mm256_set1_ps(127.0f));
  const __m256 id = _mm256_and_ps(_mm256_cmp_ps(s, _mm256_set1_ps(kIntAxpyMinScale), _CMP_GE_OQ),
                                  _mm256_div_ps(_mm256_set1_ps(1.0f), s));
  _mm256_store_ps(c.s, s);
  auto quantize = [&](__m256 v) {
    v = _mm256_mul_ps(v, id);
    return _mm256_cvtps_epi32(_mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q)));
  };
  __m256i corr = _mm256_setzero_si256();
  for (int p = 0; p < (n + 1) / 2; ++p) {
    const __m256i q0 = quantize(a[2 * p]);
    const __m256i q1 = 2 * p + 1 < n ? quantize(a[2 * p + 1]) : _mm256_setzero_si256();
    corr = _mm256_add_epi32(corr, _mm256_add_epi32(q0, q1));
    const __m256i w16 = _mm256_packs_epi32(q0, q1);  // per lane: q0 of 4 blocks, q1 of 4
    const __m256i w8 = _mm256_shuffle_epi8(_mm256_packs_epi16(w16, w16), pairs);
    _mm_store_si128(reinterpret_cast<__m128i*>(c.q[p]),
                    _mm256_castsi256_si128(_mm256_permute4x64_epi64(w8, 0x08)));
  }
  _mm256_store_si256(reinterpret_cast<__m256i*>(c.corr), _mm256_slli_epi32(corr, 3));
}

}  // namespace

void IntAxpyQ4_0Avx2(const RowSource& rows, const float* coeffs, int64_t n_rows, int64_t cols,
                     float* y) {
  const int64_t nb = cols / kQK;
  if (nb == 0) return;
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  // Lane 0: the pair's coefficients of the first block (bytes 0, 1), lane 1: of the second.
  const __m256i spread = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2,
                                          3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
  for (int64_t g0 = 0; g0 < n_rows; g0 += kIntAxpyGroupRows) {
    IntAxpyGroup group(rows, g0, n_rows);
    const int n = group.n;
    const uint8_t* const* r = group.r;
    const int np = (n + 1) / 2;
    // Chunks of 8 blocks: the prepass of a chunk reads its 16 x 144 bytes into L1 for the
    // products right after it.
    for (int64_t b0 = 0; b0 < nb; b0 += 8) {
      Chunk c;
      Prepare(r, coeffs + g0, n, b0, nb, c);
      group.FetchNext(std::min(nb, b0 + 8) * kBlockBytes, nb * kBlockBytes);
      for (int64_t b = b0; b < std::min(nb, b0 + 8); b += 2) {
        const bool two = b + 1 < nb;
        __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                          _mm256_setzero_si256()};
        for (int p = 0; p < np; ++p) {
          __m256i w[2];
          for (int k = 0; k < 2; ++k) {
            const uint8_t* qs = r[2 * p + k] + b * kBlockBytes + kQsAt;
            const __m128i first = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
            w[k] = two ? _mm256_inserti128_si256(
                             _mm256_castsi128_si256(first),
                             _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + kBlockBytes)), 1)
                       : _mm256_zextsi128_si256(first);
          }
          int32_t q4;
          std::memcpy(&q4, c.q[p] + (b - b0) * 2, sizeof q4);
          const __m256i x = _mm256_shuffle_epi8(_mm256_set1_epi32(q4), spread);
          // The two rows' bytes interleaved (bytes 0-7, 8-15 of each block), then split into
          // nibbles: a 16-bit shift brings each high byte's low nibble into its low byte's top.
          const __m256i pl = _mm256_unpacklo_epi8(w[0], w[1]);
          const __m256i ph = _mm256_unpackhi_epi8(w[0], w[1]);
          auto add = [&](__m256i& sum, __m256i pairs) {
            sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(_mm256_and_si256(pairs, nibble), x));
          };
          add(acc[0], pl);
          add(acc[1], ph);
          add(acc[2], _mm256_srli_epi16(pl, 4));
          add(acc[3], _mm256_srli_epi16(ph, 4));
        }
        // acc[k] holds columns 8k..8k+7 of block b in lane 0 and of block b + 1 in lane 1.
        for (int h = 0; h < (two ? 2 : 1); ++h) {
          const __m256 s = _mm256_set1_ps(c.s[b - b0 + h]);
          const __m256i corr = _mm256_set1_epi32(c.corr[b - b0 + h]);
          float* yb = y + (b + h) * kQK;
          for (int k = 0; k < 4; ++k) {
            const __m128i half =
                h == 0 ? _mm256_castsi256_si128(acc[k]) : _mm256_extracti128_si256(acc[k], 1);
            const __m256i sum = _mm256_sub_epi32(_mm256_cvtepi16_epi32(half), corr);
            _mm256_storeu_ps(yb + 8 * k, _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(sum),
                                                         _mm256_loadu_ps(yb + 8 * k)));
          }
        }
      }
    }
  }
}

}  // namespace thermocline::matmul_internal
