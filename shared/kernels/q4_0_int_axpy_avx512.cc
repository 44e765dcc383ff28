// The AVX-512 integer axpy over Q4_0 rows (IntAxpyRows; the operations matmul_kernels.h
// specifies, the same bits as q4_0_int_axpy.cc). Where the AVX2 kernel sums pairs of rows with
// maddubs into int16, this one sums quads of rows with VNNI's vpdpbusd straight into int32. Per
// group of 16 rows and chunk of 8 blocks:
// - the prepass (512-bit) reads every block's scale with two 64-byte loads per row and one word
//   permute (the 8 scales of a row sit 18 bytes apart, at word offsets 9k of the chunk's first
//   128 bytes), two rows per register with their elements alternating, so that the packed 8-bit
//   coefficients come out as (row 2j, row 2j+1) pairs per block and two more word permutes lay
//   them out as [block][16 rows]: each quad's coefficients are then one dword per lane;
// - the products (512-bit, one block per register) lay the four rows of a quad side by side
//   byte by byte: each row's 16 bytes are broadcast to the four 128-bit lanes and one masked
//   in-lane vpshufb drops its bytes into place, so that dword j holds byte j of the four rows
//   (columns j and j + 16). Each byte is then taken whole: vpdpbusd of the masked low nibbles
//   gives the low sums L (columns 0-15) and of the whole bytes F = L + 16 H, so the high sums
//   (columns 16-31) are (F - L) / 16, exact, without splitting the high nibbles. The block's
//   sums are two registers in column order, which go to y as they are.
//   Measured on Zen 5 (2026-12-06, docs/performance.md, "Zen 5, third session") against the
//   previous 256-bit products (two blocks per register, two unpack stages, cross-lane permutes
//   on the way out): with the rows in L2, 19.5-20.5 -> 23.0-24.4 GB/s on the gate/up shape and
//   21.0-22.1 -> 24.3-25.9 on q/k/v/o; TEAL at 50% on the 1.3B Q4_0 model +9-10% tok/s at one
//   thread. The 256-bit form had been chosen on Zen 4, whose 512-bit shuffles take twice a
//   256-bit one's time (a 512-bit form with cross-lane inserts there: 19.4 GB/s against 20.6);
//   this form has not been measured on Zen 4.
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
// accumulator to another register and back once per use.
inline void Dpbusd(__m512i& acc, __m512i u, __m512i s) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
}

// The products' byte placement: byte 4t + i of lane l takes byte 4l + t of its lane, where
// every lane holds the same 16 bytes of one row; row i of the quad writes only the bytes
// i, i + 4, ... (kQuadRow0 << i), so four masked shuffles build dword j = byte j of rows 0-3.
struct ShuffleTable {
  alignas(64) uint8_t place[64];
  constexpr ShuffleTable() : place{} {
    for (int l = 0; l < 4; ++l) {
      for (int t = 0; t < 4; ++t) {
        for (int i = 0; i < 4; ++i) place[16 * l + 4 * t + i] = static_cast<uint8_t>(4 * l + t);
      }
    }
  }
};
constexpr ShuffleTable kShuffle;
constexpr __mmask64 kQuadRow0 = 0x1111111111111111ull;

}  // namespace

void IntAxpyQ4_0Avx512(const RowSource& rows, const float* coeffs, int64_t n_rows, int64_t cols,
                       float* y) {
  const int64_t nb = cols / kQK;
  if (nb == 0) return;
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const __m512i place = _mm512_load_si512(kShuffle.place);
  for (int64_t g0 = 0; g0 < n_rows; g0 += kIntAxpyGroupRows) {
    IntAxpyGroup group(rows, g0, n_rows);
    const int n = group.n;
    const uint8_t* const* r = group.r;
    const int nq = (n + 3) / 4;
    for (int64_t b0 = 0; b0 < nb; b0 += 8) {
      Chunk c;
      Prepare(r, coeffs + g0, n, b0, nb, c);
      group.FetchNext(std::min(nb, b0 + 8) * kBlockBytes, nb * kBlockBytes);
      // Block k's coefficients of quad p: dword 4k + p of c.q ([block][16 rows]), read as bytes
      // (an int32_t pointer into __m512i storage would break aliasing rules).
      const uint8_t* coef = reinterpret_cast<const uint8_t*>(c.q);
      // Quad p's rows, block b, as the products take them (dword j: byte j of each row).
      auto interleave = [&](int p, int64_t b) {
        const uint8_t* q0 = r[4 * p] + b * kBlockBytes + kQsAt;
        __m512i x = _mm512_maskz_shuffle_epi8(
            kQuadRow0,
            _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q0))), place);
        for (int i = 1; i < 4; ++i) {
          const uint8_t* qi = r[4 * p + i] + b * kBlockBytes + kQsAt;
          x = _mm512_mask_shuffle_epi8(
              x, kQuadRow0 << i,
              _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qi))), place);
        }
        return x;
      };
      auto finish = [&](int64_t b, __m512i lo, __m512i full) {
        const int k = static_cast<int>(b - b0);
        const __m512i hi = _mm512_srai_epi32(_mm512_sub_epi32(full, lo), 4);
        const __m512 s = _mm512_set1_ps(c.s[k]);
        const __m512i corr = _mm512_set1_epi32(c.corr[k]);
        float* yb = y + b * kQK;
        _mm512_storeu_ps(yb, _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(_mm512_sub_epi32(lo, corr)),
                                             _mm512_loadu_ps(yb)));
        _mm512_storeu_ps(yb + 16, _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(_mm512_sub_epi32(hi, corr)),
                                                  _mm512_loadu_ps(yb + 16)));
      };
      auto cvec = [&](int64_t b, int p) {
        const int k = static_cast<int>(b - b0);
        int32_t quad_coefs;
        std::memcpy(&quad_coefs, coef + 4 * (4 * k + p), sizeof quad_coefs);
        return _mm512_set1_epi32(quad_coefs);
      };
      const int64_t bend = std::min(nb, b0 + 8);
      int64_t b = b0;
      if (nq == 4) {
        // Full groups, two blocks at a time: two independent chains of vpdpbusd (in the
        // measurement above 23.0 -> 24.4 GB/s against one block at a time).
        for (; b + 2 <= bend; b += 2) {
          __m512i lo0 = _mm512_setzero_si512(), f0 = lo0, lo1 = lo0, f1 = lo0;
#pragma GCC unroll 4
          for (int p = 0; p < 4; ++p) {
            const __m512i x0 = interleave(p, b), x1 = interleave(p, b + 1);
            const __m512i c0 = cvec(b, p), c1 = cvec(b + 1, p);
            Dpbusd(lo0, _mm512_and_si512(x0, nibble), c0);
            Dpbusd(f0, x0, c0);
            Dpbusd(lo1, _mm512_and_si512(x1, nibble), c1);
            Dpbusd(f1, x1, c1);
          }
          finish(b, lo0, f0);
          finish(b + 1, lo1, f1);
        }
      }
      for (; b < bend; ++b) {
        __m512i lo = _mm512_setzero_si512(), full = lo;
        for (int p = 0; p < nq; ++p) {
          const __m512i x = interleave(p, b);
          const __m512i cv = cvec(b, p);
          Dpbusd(lo, _mm512_and_si512(x, nibble), cv);
          Dpbusd(full, x, cv);
        }
        finish(b, lo, full);
      }
    }
  }
}

}  // namespace thermocline::matmul_internal
