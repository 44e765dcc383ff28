// The AVX-512 integer axpy over Q4_0 rows (IntAxpyRows; the operations matmul_kernels.h
// specifies, the same bits as q4_0_int_axpy.cc). Where the AVX2 kernel sums pairs of rows with
// maddubs into int16, this one sums quads of rows with VNNI's vpdpbusd straight into int32. Per
// group of 16 rows and chunk of 8 blocks:
// - the prepass (512-bit) reads every block's scale with two 64-byte loads per row and one word
//   permute (the 8 scales of a row sit 18 bytes apart, at word offsets 9k of the chunk's first
//   128 bytes), two rows per register with their elements alternating, so that the packed 8-bit
//   coefficients come out as (row 2j, row 2j+1) pairs per block and two more word permutes lay
//   them out as [block][16 rows]: each quad's coefficients are then one dword per lane;
// - the products (256-bit, two blocks per register, one per 128-bit lane) interleave the bytes
//   of four rows (two unpack stages) and take each byte whole: vpdpbusd of the masked low
//   nibbles gives the low sums L and of the whole bytes F = L + 16 H, so the high sums are
//   (F - L) / 16, exact, without splitting the high nibbles; each lane's sums then go to y in
//   column order. 256-bit because on Zen 4 a 512-bit shuffle or insert takes twice a 256-bit
//   one's time and the products are mostly shuffles: measured in L1, 512-bit products 19.4
//   GB/s, 256-bit 20.6, the AVX2 kernel 17.6 (docs/performance.md, "IntAxpyRows").
#include <immintrin.h>

#include <algorithm>
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
static_assert(kG == 16, "the prepass holds a group as 8 pairs of rows, the products as 4 quads");
static_assert(kBlockBytes == 18 && kQsAt == 2, "the scale permute reads words 9k");

// One chunk of 8 blocks: per block its scale s and correction 8 * sum_i q_i (read back one at a
// time by the final adds), and the coefficient bytes as [block][row] for blocks 0-3 and 4-7.
struct Chunk {
  alignas(32) float s[8];
  alignas(32) int32_t corr[8];
  __m512i q[2];
};

// vpermt2w indices. scale[o]: word 2k + o takes word 9k of the chunk's first 128 bytes (block
// k's scale; k >= 4 from the second load), for rows 2j (o = 0) and 2j + 1 (o = 1). by_block[h]:
// word j of lane k takes pair j's word for block 4h + k (pair j's 8 words at 8j..8j+7).
struct PermuteTables {
  alignas(64) uint16_t scale[2][32];
  alignas(64) uint16_t by_block[2][32];
  constexpr PermuteTables() : scale{}, by_block{} {
    for (int o = 0; o < 2; ++o) {
      for (int k = 0; k < 8; ++k) scale[o][2 * k + o] = static_cast<uint16_t>(9 * k);
    }
    for (int h = 0; h < 2; ++h) {
      for (int k = 0; k < 4; ++k) {
        for (int j = 0; j < 8; ++j)
          by_block[h][8 * k + j] = static_cast<uint16_t>(8 * j + 4 * h + k);
      }
    }
  }
};
constexpr PermuteTables kTables;

inline __m512i Table(const uint16_t (&t)[32]) { return _mm512_load_si512(t); }

// The prepass of blocks [b0, b0 + 8) of a group of n rows (blocks past nb count as zeros).
void Prepare(const uint8_t* const* rows, const float* coeffs, int n, int64_t b0, int64_t nb,
             Chunk& c) {
  const __m512i even_idx = Table(kTables.scale[0]), odd_idx = Table(kTables.scale[1]);
  const bool full = b0 + 8 <= nb;
  __m512 a[kG / 2];
  __m512 amax = _mm512_setzero_ps();
  for (int j = 0; j < kG / 2; ++j) {
    const int r0 = 2 * j, r1 = 2 * j + 1;
    if (r0 >= n) {
      a[j] = _mm512_setzero_ps();
      continue;
    }
    // Element 2k + o: block k of row 2j + o.
    const __m512 coeff = _mm512_mask_blend_ps(0xAAAA, _mm512_set1_ps(coeffs[r0]),
                                              _mm512_set1_ps(r1 < n ? coeffs[r1] : 0.0f));
    __m256i d;
    if (full) {
      const uint8_t* p0 = rows[r0] + b0 * kBlockBytes;
      __m512i w =
          _mm512_permutex2var_epi16(_mm512_loadu_si512(p0), even_idx, _mm512_loadu_si512(p0 + 64));
      if (r1 < n) {
        const uint8_t* p1 = rows[r1] + b0 * kBlockBytes;
        w = _mm512_mask_blend_epi16(0xAAAAAAAA, w,
                                    _mm512_permutex2var_epi16(_mm512_loadu_si512(p1), odd_idx,
                                                              _mm512_loadu_si512(p1 + 64)));
      } else {
        w = _mm512_maskz_mov_epi16(0x55555555, w);
      }
      d = _mm512_castsi512_si256(w);
    } else {
      alignas(32) uint16_t h[16] = {};
      for (int o = 0; o < 2; ++o) {
        if (2 * j + o >= n) continue;
        for (int64_t k = 0; b0 + k < nb; ++k) {
          std::memcpy(&h[2 * k + o], rows[2 * j + o] + (b0 + k) * kBlockBytes, 2);
        }
      }
      d = _mm256_load_si256(reinterpret_cast<const __m256i*>(h));
    }
    a[j] = _mm512_mul_ps(coeff, _mm512_cvtph_ps(d));
    // max(|a|, m): a NaN |a| leaves m (matmul_kernels.h), so the order of rows does not matter.
    amax = _mm512_max_ps(_mm512_abs_ps(a[j]), amax);
  }
  // Both elements of block k get the maximum over its even and odd rows.
  amax = _mm512_max_ps(amax, _mm512_permute_ps(amax, 0xB1));
  const __m512 s = _mm512_div_ps(amax, _mm512_set1_ps(127.0f));
  const __mmask16 usable = _mm512_cmp_ps_mask(s, _mm512_set1_ps(kIntAxpyMinScale), _CMP_GE_OQ);
  const __m512 id = _mm512_maskz_div_ps(usable, _mm512_set1_ps(1.0f), s);
  // Element 2k holds block k's s (and, below, its correction): gathered to element k.
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0);
  _mm256_store_ps(c.s, _mm512_castps512_ps256(_mm512_permutexvar_ps(even, s)));
  __m512i corr = _mm512_setzero_si512();
  __m128i packed[kG / 2];
  for (int j = 0; j < kG / 2; ++j) {
    const __m512 v = _mm512_mul_ps(a[j], id);
    const __m512i q = _mm512_maskz_cvtps_epi32(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v);
    corr = _mm512_add_epi32(corr, q);
    // Bytes 2k, 2k + 1: block k's coefficients of rows 2j, 2j + 1 (a word per block).
    packed[j] = _mm512_cvtepi32_epi8(q);
  }
  // Each block's sum over both parities, times 8.
  corr = _mm512_add_epi32(corr, _mm512_shuffle_epi32(corr, _MM_PERM_CDAB));
  _mm256_store_si256(
      reinterpret_cast<__m256i*>(c.corr),
      _mm512_castsi512_si256(_mm512_slli_epi32(_mm512_permutexvar_epi32(even, corr), 3)));
  // Pairs 0-3 and 4-7, then word j of block k (k < 4 from the first permute) = pair j's word k.
  const __m512i lo = _mm512_inserti32x4(
      _mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(packed[0]), packed[1], 1),
                         packed[2], 2),
      packed[3], 3);
  const __m512i hi = _mm512_inserti32x4(
      _mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(packed[4]), packed[5], 1),
                         packed[6], 2),
      packed[7], 3);
  c.q[0] = _mm512_permutex2var_epi16(lo, Table(kTables.by_block[0]), hi);
  c.q[1] = _mm512_permutex2var_epi16(lo, Table(kTables.by_block[1]), hi);
}

// acc += the sums of four products u8 x s8, in place: through the intrinsic GCC 12 copies each
// accumulator to another register and back once per use (16 extra moves per quad).
inline void Dpbusd(__m256i& acc, __m256i u, __m256i s) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
}

}  // namespace

void IntAxpyQ4_0Avx512(const RowSource& rows, const float* coeffs, int64_t n_rows, int64_t cols,
                       float* y) {
  const int64_t nb = cols / kQK;
  if (nb == 0) return;
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  for (int64_t g0 = 0; g0 < n_rows; g0 += kIntAxpyGroupRows) {
    IntAxpyGroup group(rows, g0, n_rows);
    const int n = group.n;
    const uint8_t* const* r = group.r;
    const int nq = (n + 3) / 4;
    for (int64_t b0 = 0; b0 < nb; b0 += 8) {
      Chunk c;
      Prepare(r, coeffs + g0, n, b0, nb, c);
      group.FetchNext(std::min(nb, b0 + 8) * kBlockBytes, nb * kBlockBytes);
      // Two blocks per 256-bit register (lane k: block b + k).
      const uint8_t* qbytes = reinterpret_cast<const uint8_t*>(c.q);
      for (int64_t b = b0; b < std::min(nb, b0 + 8); b += 2) {
        const bool two = b + 1 < nb;
        __m256i l0 = _mm256_setzero_si256(), l1 = l0, l2 = l0, l3 = l0;
        __m256i f0 = l0, f1 = l0, f2 = l0, f3 = l0;
        // Lane k: the 16 coefficients of block b + k.
        const __m256i coef =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qbytes + 16 * (b - b0)));
        auto quad = [&](int p, __m256i x) {
          __m256i w[4];
          for (int i = 0; i < 4; ++i) {
            const uint8_t* qs = r[4 * p + i] + b * kBlockBytes + kQsAt;
            const __m128i first = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
            w[i] = two ? _mm256_inserti128_si256(
                             _mm256_castsi128_si256(first),
                             _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + kBlockBytes)), 1)
                       : _mm256_zextsi128_si256(first);
          }
          const __m256i lo01 = _mm256_unpacklo_epi8(w[0], w[1]),
                        hi01 = _mm256_unpackhi_epi8(w[0], w[1]);
          const __m256i lo23 = _mm256_unpacklo_epi8(w[2], w[3]),
                        hi23 = _mm256_unpackhi_epi8(w[2], w[3]);
          // Dword t of lane k in qm: byte 4m + t of block b + k in the four rows.
          const __m256i q0 = _mm256_unpacklo_epi16(lo01, lo23),
                        q1 = _mm256_unpackhi_epi16(lo01, lo23);
          const __m256i q2 = _mm256_unpacklo_epi16(hi01, hi23),
                        q3 = _mm256_unpackhi_epi16(hi01, hi23);
          Dpbusd(l0, _mm256_and_si256(q0, nibble), x);
          Dpbusd(l1, _mm256_and_si256(q1, nibble), x);
          Dpbusd(l2, _mm256_and_si256(q2, nibble), x);
          Dpbusd(l3, _mm256_and_si256(q3, nibble), x);
          Dpbusd(f0, q0, x);
          Dpbusd(f1, q1, x);
          Dpbusd(f2, q2, x);
          Dpbusd(f3, q3, x);
        };
        // Dword p of each lane: quad p's four coefficients of that lane's block.
        quad(0, _mm256_shuffle_epi32(coef, 0x00));
        if (nq > 1) quad(1, _mm256_shuffle_epi32(coef, 0x55));
        if (nq > 2) quad(2, _mm256_shuffle_epi32(coef, 0xAA));
        if (nq > 3) quad(3, _mm256_shuffle_epi32(coef, 0xFF));
        // Lane k of sums[m]: columns 4m..4m+3 of block b + k (m < 4: low nibbles, columns
        // 0-15; m >= 4: high nibbles, columns 16-31).
        const __m256i sums[8] = {l0,
                                 l1,
                                 l2,
                                 l3,
                                 _mm256_srai_epi32(_mm256_sub_epi32(f0, l0), 4),
                                 _mm256_srai_epi32(_mm256_sub_epi32(f1, l1), 4),
                                 _mm256_srai_epi32(_mm256_sub_epi32(f2, l2), 4),
                                 _mm256_srai_epi32(_mm256_sub_epi32(f3, l3), 4)};
        for (int k = 0; k < (two ? 2 : 1); ++k) {
          const __m256 s = _mm256_set1_ps(c.s[b - b0 + k]);
          const __m256i corr = _mm256_set1_epi32(c.corr[b - b0 + k]);
          float* yb = y + (b + k) * kQK;
          for (int e = 0; e < 4; ++e) {
            // Columns 8e..8e+7: lane k of sums[2e] and sums[2e + 1].
            const __m256i lanes =
                k == 0 ? _mm256_permute2x128_si256(sums[2 * e], sums[2 * e + 1], 0x20)
                       : _mm256_permute2x128_si256(sums[2 * e], sums[2 * e + 1], 0x31);
            const __m256i sum = _mm256_sub_epi32(lanes, corr);
            _mm256_storeu_ps(yb + 8 * e, _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(sum),
                                                         _mm256_loadu_ps(yb + 8 * e)));
          }
        }
      }
    }
  }
}

}  // namespace thermocline::matmul_internal
