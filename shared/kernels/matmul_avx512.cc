// AVX-512 row kernels for the float types and the types with Q8_0 / Q8_1 activations (compiled
// with the AVX-512 flags of *_avx512.cc; reached only after the run-time check).
//
// Bit for bit the avx2 family (matmul_avx2.cc): every (row, token) keeps the AVX2 kernel's
// 8-lane f32 accumulator with the same operations in the same order, and one zmm holds two of
// them, rows 2p and 2p + 1 of a tile side by side (weights of the two rows in the two 256-bit
// halves, the token's activations broadcast to both). Each half ends with AVX2's horizontal sum.
// Half the f32 and integer instructions per row, none of the arithmetic changed. Column-wise
// kernels (axpy, dequantize) do each element's operations at 16 wide.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>

#include "shared/gguf/quant.h"
#include "shared/kernels/column_steps.h"
#include "shared/kernels/matmul_kernels.h"
#include "shared/kernels/prefetch_weights.h"
#include "shared/kernels/q8_input.h"
#include "shared/kernels/simd_avx512.h"
#include "shared/util/fp16.h"

namespace thermocline::matmul_internal {
namespace {

inline void Prefetch(const uint8_t* p) { PrefetchWeights(p); }

// Writes the tile's outputs: pair p holds rows 2p and 2p + 1 (the latter only if it exists).
template <int R, int T>
inline void StorePairs(const __m512 (&acc)[(R + 1) / 2][T], float* y, int64_t y_stride) {
  for (int t = 0; t < T; ++t) {
    for (int p = 0; p < (R + 1) / 2; ++p) {
      float lo, hi;
      simd::HalfSums(acc[p][t], &lo, &hi);
      y[t * y_stride + 2 * p] = lo;
      if (2 * p + 1 < R) y[t * y_stride + 2 * p + 1] = hi;
    }
  }
}

// The rows of each pair; an odd last row is paired with itself (its high half is dropped).
template <int R>
inline void PairRows(const uint8_t* const* rows, const uint8_t** a, const uint8_t** b) {
  for (int p = 0; p < (R + 1) / 2; ++p) {
    a[p] = rows[2 * p];
    b[p] = rows[std::min(2 * p + 1, R - 1)];
  }
}

inline __m128i Load16(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}
inline __m256i Load32(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
inline __mmask16 FirstN16(int64_t n) { return static_cast<__mmask16>((1u << n) - 1); }

// ---- Float weights: a dot step is 8 columns of two rows, an axpy step 16 columns. ----

struct F32Load {
  static constexpr int kBytes = 4;
  // Pair: 8 columns of row a in the low half, of row b in the high one; PairPartial the columns
  // in mask m, zero elsewhere (a ragged end); Row: 16 columns of one row, zero outside m.
  static __m512 Pair(const uint8_t* a, const uint8_t* b) {
    return _mm512_insertf32x8(
        _mm512_castps256_ps512(_mm256_loadu_ps(reinterpret_cast<const float*>(a))),
        _mm256_loadu_ps(reinterpret_cast<const float*>(b)), 1);
  }
  static __m512 PairPartial(const uint8_t* a, const uint8_t* b, __mmask8 m) {
    return _mm512_insertf32x8(
        _mm512_castps256_ps512(_mm256_maskz_loadu_ps(m, reinterpret_cast<const float*>(a))),
        _mm256_maskz_loadu_ps(m, reinterpret_cast<const float*>(b)), 1);
  }
  static __m512 Row(const uint8_t* p, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(p));
  }
};
struct F16Load {
  static constexpr int kBytes = 2;
  static __m512 Pair(const uint8_t* a, const uint8_t* b) {
    return _mm512_cvtph_ps(
        _mm256_inserti128_si256(_mm256_castsi128_si256(Load16(a)), Load16(b), 1));
  }
  static __m512 PairPartial(const uint8_t* a, const uint8_t* b, __mmask8 m) {
    return _mm512_cvtph_ps(_mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_maskz_loadu_epi16(m, a)), _mm_maskz_loadu_epi16(m, b), 1));
  }
  static __m512 Row(const uint8_t* p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
  }
};
struct Bf16Load {
  static constexpr int kBytes = 2;
  static __m512 Widen(__m256i v) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
  }
  static __m512 Pair(const uint8_t* a, const uint8_t* b) {
    return Widen(_mm256_inserti128_si256(_mm256_castsi128_si256(Load16(a)), Load16(b), 1));
  }
  static __m512 PairPartial(const uint8_t* a, const uint8_t* b, __mmask8 m) {
    return Widen(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_maskz_loadu_epi16(m, a)),
                                         _mm_maskz_loadu_epi16(m, b), 1));
  }
  static __m512 Row(const uint8_t* p, __mmask16 m) { return Widen(_mm256_maskz_loadu_epi16(m, p)); }
};

template <class L>
struct FloatKernel {
  // Tile shapes: 4 rows (2 pairs) for GEMV, 4 memory streams per thread as in AVX2's float
  // kernel (from DRAM, Zen 4, one thread, f16 at 4096 columns: 74-79% of the read floor with 8
  // rows, 86-98% with 4; bf16 76-81% / 83-94%; two threads f16 76-85% / 93-97%; relu1b3-f16
  // decode, one thread, 0.76 -> 0.91-0.93 of its floor); 8 rows x 6 tokens for many tokens (24
  // accumulators, 6 activations, a weight pair: 31 of the 32 zmm; on one core, 64 tokens of
  // 4096 columns in L2, ahead of 8 x 4, 8 x 7, 12 x 4 and 16 x 3).
  static constexpr int kGemvRows = 4;
  static constexpr int kRows = 8;
  static constexpr int kTokens = 6;
  // As AVX2's: f16 / bf16 rows read faster with each stream prefetching a page ahead
  // (ForEachTile).
  static constexpr bool kPrefetchStripes = L::kBytes == 2;

  template <int R, int T>
  static void Tile(const uint8_t* const* rows, const uint8_t* const* next, int64_t cols,
                   const uint8_t* xb, int64_t x_stride, float* y, int64_t y_stride) {
    constexpr int P = (R + 1) / 2;
    const uint8_t* a[P];
    const uint8_t* b[P];
    PairRows<R>(rows, a, b);
    __m512 acc[P][T];
    for (int p = 0; p < P; ++p) {
      for (int t = 0; t < T; ++t) acc[p][t] = _mm512_setzero_ps();
    }
    const float* x[T];
    for (int t = 0; t < T; ++t) x[t] = reinterpret_cast<const float*>(xb + t * x_stride);
    auto step = [&](int64_t c) {
      __m512 xv[T];
      for (int t = 0; t < T; ++t) xv[t] = _mm512_broadcast_f32x8(_mm256_loadu_ps(x[t] + c));
      for (int p = 0; p < P; ++p) {
        const __m512 w = L::Pair(a[p] + c * L::kBytes, b[p] + c * L::kBytes);
        for (int t = 0; t < T; ++t) acc[p][t] = _mm512_fmadd_ps(w, xv[t], acc[p][t]);
      }
    };
    const int64_t c = StepColumns<L::kBytes, 8, R>(next, cols, step);
    if (c < cols) {
      // Zero past the end, as AVX2's zero-padded copies: the same fma(0, 0, acc) in those lanes.
      const __mmask8 m = static_cast<__mmask8>((1u << (cols - c)) - 1);
      for (int p = 0; p < P; ++p) {
        const __m512 w = L::PairPartial(a[p] + c * L::kBytes, b[p] + c * L::kBytes, m);
        for (int t = 0; t < T; ++t) {
          const __m512 xv = _mm512_broadcast_f32x8(_mm256_maskz_loadu_ps(m, x[t] + c));
          acc[p][t] = _mm512_fmadd_ps(w, xv, acc[p][t]);
        }
      }
    }
    StorePairs<R, T>(acc, y, y_stride);
  }

  // Per element the AVX2 sequence y = fma(coeff_r, w_r, y) over the rows in order.
  template <int R>
  static void AxpyTile(const uint8_t* const* rows, const uint8_t* const* next, const float* coeffs,
                       int64_t cols, float* y) {
    __m512 cv[R];
    for (int r = 0; r < R; ++r) cv[r] = _mm512_set1_ps(coeffs[r]);
    auto step = [&](int64_t c, __mmask16 m) {
      __m512 yv = _mm512_maskz_loadu_ps(m, y + c);
      for (int r = 0; r < R; ++r)
        yv = _mm512_fmadd_ps(cv[r], L::Row(rows[r] + c * L::kBytes, m), yv);
      _mm512_mask_storeu_ps(y + c, m, yv);
    };
    const int64_t c =
        StepColumns<L::kBytes, 16, R>(next, cols, [&](int64_t at) { step(at, 0xFFFF); });
    if (c < cols) step(c, FirstN16(cols - c));
  }

  static void Dequantize(const uint8_t* row, int64_t cols, float* out) {
    int64_t c = 0;
    for (; c + 16 <= cols; c += 16) _mm512_storeu_ps(out + c, L::Row(row + c * L::kBytes, 0xFFFF));
    if (c < cols) {
      const __mmask16 m = FirstN16(cols - c);
      _mm512_mask_storeu_ps(out + c, m, L::Row(row + c * L::kBytes, m));
    }
  }
};

// ---- Quantized weights against Q8_0 activations: a step is one 32-element block. ----
//
// As AVX2's VNNI kernels: unsigned weight bytes (the signed value + kOffset) times the signed
// activations through vpdpbusd, started from a prepared lane-wise bias that takes the offset back
// out, so every int32 lane is exactly AVX2's; Q4_0 and Q4_1 keep their high nibbles in place
// (16 x their value, kHighScale), which the prepared lane scales undo exactly (a power of two).
// The f32 arithmetic per lane is AVX2's: acc = fma(wd * xd, float(isum), acc), and for the
// types with a min acc = fma(m, s_x, acc).

constexpr int64_t kQsOffset = 2;  // the block types with one fp16 scale start with it

// The activations: AVX2's prepared layout (q8_input.h), each part broadcast to both halves of a
// zmm as it is read.

// Lanes 0..7: the f32 of the fp16 at a; 8..15: that at b.
inline __m512 PairScale(const float* half, const uint8_t* a, const uint8_t* b) {
  uint16_t ha, hb;
  std::memcpy(&ha, a, sizeof ha);
  std::memcpy(&hb, b, sizeof hb);
  return _mm512_mask_broadcastss_ps(_mm512_set1_ps(half[ha]), 0xFF00, _mm_load_ss(half + hb));
}

// The 16 bytes at a in both 128-bit lanes of the low half, those at b in both of the high half.
inline __m512i PairBroadcast16(const uint8_t* a, const uint8_t* b) {
  return _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(Load16(a)), 0xFF00, Load16(b));
}
// Nibbles of 16 bytes as 32 values in element order (low nibbles 0..15, high 16..31), row a's in
// the low half, row b's in the high half.
inline __m512i NibblesPair(const uint8_t* a, const uint8_t* b) {
  const __m512i shifted =
      _mm512_srlv_epi64(PairBroadcast16(a, b), _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
  return _mm512_and_si512(shifted, _mm512_set1_epi8(0x0F));
}
// The nibbles left in place: low ones in the first 16 bytes of each half, high ones (16 x their
// value) in the second.
inline __m512i MaskedNibblesPair(const uint8_t* a, const uint8_t* b) {
  const int64_t lo = 0x0F0F0F0F0F0F0F0F, hi = static_cast<int64_t>(0xF0F0F0F0F0F0F0F0);
  return _mm512_and_si512(PairBroadcast16(a, b), _mm512_set_epi64(hi, hi, lo, lo, hi, hi, lo, lo));
}
// + 16 in byte j of each half where bit j of the 32-bit word at a (low half) or b is set.
inline __m512i AddHighBitsPair(__m512i q, const uint8_t* a, const uint8_t* b) {
  uint32_t qa, qb;
  std::memcpy(&qa, a, 4);
  std::memcpy(&qb, b, 4);
  const __mmask64 k = _cvtu64_mask64(qa | static_cast<uint64_t>(qb) << 32);
  return _mm512_mask_add_epi8(q, k, q, _mm512_set1_epi8(0x10));
}

// Loaders turn the blocks at a and b into the unsigned operand of both rows. kOffset is what they
// add to the signed value, kHighScale what multiplies elements 16..31 (as AVX2's loaders).
// Widen (q8_0, q4_0: the types whose axpy runs on the integers, as AVX2's) gives the signed
// values as int32, elements 0..15 in out[0], 16..31 in out[1].
//
// Q8_0 + 128 as unsigned bytes.
struct Q8Offset {
  static constexpr int64_t kBytes = sizeof(BlockQ8_0);
  static constexpr int kOffset = 128;
  static constexpr int kHighScale = 1;
  static constexpr bool kHasMin = false;
  static __m512i Load(const uint8_t* a, const uint8_t* b) {
    const __m512i both =
        _mm512_inserti64x4(_mm512_castsi256_si512(Load32(a + kQsOffset)), Load32(b + kQsOffset), 1);
    return _mm512_xor_si512(both, _mm512_set1_epi8(static_cast<char>(0x80)));
  }
  static void Widen(const uint8_t* b, __m512i out[2]) {
    out[0] = _mm512_cvtepi8_epi32(Load16(b + kQsOffset));
    out[1] = _mm512_cvtepi8_epi32(Load16(b + kQsOffset + 16));
  }
};
// q4_0, q4_1, q5_0, q5_1 ([d, (m), (qh), qs[16]]): the nibbles as stored; the four-bit types
// keep their high nibbles in place (16 x their value, kHighScale), the five-bit ones move them
// down and add bit 4 from qh. q4_0 is offset 8, q5_0 16, the types with a min m (x = d * q + m,
// m * s_x from the prepared input) take q unsigned as stored.
template <bool kMin, bool kHigh>
struct LegacyLoad {
  static constexpr int64_t kQhAt = kMin ? 4 : 2;
  static constexpr int64_t kQsAt = kQhAt + (kHigh ? 4 : 0);
  static constexpr int64_t kBytes = kQsAt + 16;
  static constexpr int kOffset = kMin ? 0 : (kHigh ? 16 : 8);
  static constexpr int kHighScale = kHigh ? 1 : 16;
  static constexpr bool kHasMin = kMin;
  static __m512i Load(const uint8_t* a, const uint8_t* b) {
    if constexpr (kHigh) {
      return AddHighBitsPair(NibblesPair(a + kQsAt, b + kQsAt), a + kQhAt, b + kQhAt);
    } else {
      return MaskedNibblesPair(a + kQsAt, b + kQsAt);
    }
  }
  // q4_0's (the only one whose axpy runs on the integers).
  static void Widen(const uint8_t* b, __m512i out[2]) {
    static_assert(!kMin && !kHigh);
    const __m512i bytes = _mm512_cvtepu8_epi32(Load16(b + kQsAt));
    const __m512i offset = _mm512_set1_epi32(kOffset);
    out[0] = _mm512_sub_epi32(_mm512_and_si512(bytes, _mm512_set1_epi32(0x0F)), offset);
    out[1] = _mm512_sub_epi32(_mm512_srli_epi32(bytes, 4), offset);
  }
  // The same values as f32 (elements 0..15, 16..31), for the axpy, whose zmm ops all queue on
  // two ports: vpermps reads only the low four bits of each index lane, so a 16-entry table of
  // q - 8 replaces the mask, the subtract and the conversion (the values are exact either way).
  static void WidenFloat(const uint8_t* b, __m512 out[2]) {
    static_assert(!kMin && !kHigh);
    const __m512 values = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    const __m512i bytes = _mm512_cvtepu8_epi32(Load16(b + kQsAt));
    out[0] = _mm512_permutexvar_ps(bytes, values);
    out[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), values);
  }
};
// IQ4_NL: the table values + 128 (|v| <= 127), looked up in a table offset in advance.
struct Iq4nlOffset {
  static constexpr int64_t kBytes = 18;
  static constexpr int kOffset = 128;
  static constexpr int kHighScale = 1;
  static constexpr bool kHasMin = false;
  static __m512i Load(const uint8_t* a, const uint8_t* b) {
    const __m512i table = _mm512_xor_si512(
        _mm512_broadcast_i32x4(Load16(reinterpret_cast<const uint8_t*>(kIq4nlValues))),
        _mm512_set1_epi8(static_cast<char>(0x80)));
    return _mm512_shuffle_epi8(table, NibblesPair(a + kQsOffset, b + kQsOffset));
  }
};

template <class L>
struct QuantKernel {
  using Loader = L;
  // Tile shapes: 8 rows (4 pairs) for GEMV; 8 rows x 4 tokens for many (16 accumulators and
  // each token's three activation registers; measured as 8 x 3, 12 x 2 and 16 x 3 lose, 8 x 5
  // and 8 x 6 are within the noise of it).
  static constexpr int kGemvRows = 8;
  static constexpr int kRows = 8;
  static constexpr int kTokens = 4;
  // Axpy tiles (TiledAxpyRows) of 8 rows: eight scattered rows streaming at once, one pass over
  // y per eight. Measured on AMD Zen 5 (axpy_bench, five alternations against 4 rows): Q8_0
  // rows 1.1-1.5x at one thread, 1.1-1.3x at two; Q4_0 within the noise. The float rows and the
  // K-quants' f32 decode gained nothing (f16 lost in L2) and keep 4 (docs/performance.md, "On AMD
  // Zen 5").
  static constexpr int kAxpyRows = 8;

  // About one prefetch per cache line of a row.
  static constexpr int64_t kBlocksPerPrefetch = 64 / L::kBytes;

  template <int R, int T>
  static void Tile(const uint8_t* const* rows, const uint8_t* const* next, int64_t cols,
                   const uint8_t* xb, int64_t x_stride, float* y, int64_t y_stride) {
    constexpr int P = (R + 1) / 2;
    const float* half = HalfToFloatTable();
    const uint8_t* ra[P];
    const uint8_t* rb[P];
    PairRows<R>(rows, ra, rb);
    __m512 acc[P][T];
    for (int p = 0; p < P; ++p) {
      for (int t = 0; t < T; ++t) acc[p][t] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < cols / kQK; ++b) {
      __m512i xq[T], xbias[T];
      __m512 xd[T], xs[T];
      for (int t = 0; t < T; ++t) {
        const uint8_t* xt = xb + t * x_stride + b * kPreparedBytes<L>;
        xq[t] = _mm512_broadcast_i64x4(Load32(xt));
        xbias[t] = _mm512_broadcast_i64x4(Load32(xt + kBiasAt));
        xd[t] =
            _mm512_broadcast_f32x8(_mm256_loadu_ps(reinterpret_cast<const float*>(xt + kScaleAt)));
        if constexpr (L::kHasMin) {
          xs[t] =
              _mm512_broadcast_f32x8(_mm256_loadu_ps(reinterpret_cast<const float*>(xt + kSumAt)));
        }
      }
      if (next != nullptr && b % kBlocksPerPrefetch == 0) {
        for (int r = 0; r < R; ++r) Prefetch(next[r] + b * L::kBytes);
      }
      for (int p = 0; p < P; ++p) {
        const uint8_t* wa = ra[p] + b * L::kBytes;
        const uint8_t* wb = rb[p] + b * L::kBytes;
        const __m512i wq = L::Load(wa, wb);
        const __m512 wd = PairScale(half, wa, wb);
        __m512 wm = _mm512_setzero_ps();
        if constexpr (L::kHasMin) wm = PairScale(half, wa + 2, wb + 2);
        for (int t = 0; t < T; ++t) {
          const __m512 s = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(xbias[t], wq, xq[t]));
          acc[p][t] = _mm512_fmadd_ps(_mm512_mul_ps(wd, xd[t]), s, acc[p][t]);
          if constexpr (L::kHasMin) acc[p][t] = _mm512_fmadd_ps(wm, xs[t], acc[p][t]);
        }
      }
    }
    StorePairs<R, T>(acc, y, y_stride);
  }

  // AVX2's QuantKernel::AxpyTile per element: s = c * d, y = fma(s, float(q), y), rows in order.
  template <int R>
  static void AxpyTile(const uint8_t* const* rows, const uint8_t* const* next, const float* coeffs,
                       int64_t cols, float* y) {
    const float* half = HalfToFloatTable();
    __m512 cv[R];
    for (int r = 0; r < R; ++r) cv[r] = _mm512_set1_ps(coeffs[r]);
    for (int64_t b = 0; b < cols / kQK; ++b) {
      if (next != nullptr && b % kBlocksPerPrefetch == 0) {
        for (int r = 0; r < R; ++r) Prefetch(next[r] + b * L::kBytes);
      }
      float* yb = y + b * kQK;
      __m512 yv[2] = {_mm512_loadu_ps(yb), _mm512_loadu_ps(yb + 16)};
      for (int r = 0; r < R; ++r) {
        const uint8_t* wb = rows[r] + b * L::kBytes;
        __m512 qf[2];
        if constexpr (requires { L::WidenFloat(wb, qf); }) {
          L::WidenFloat(wb, qf);
        } else {
          __m512i q[2];
          L::Widen(wb, q);
          for (int k = 0; k < 2; ++k) qf[k] = _mm512_cvtepi32_ps(q[k]);
        }
        uint16_t h;
        std::memcpy(&h, wb, sizeof h);
        const __m512 s = _mm512_mul_ps(cv[r], _mm512_set1_ps(half[h]));
        for (int k = 0; k < 2; ++k) yv[k] = _mm512_fmadd_ps(s, qf[k], yv[k]);
      }
      _mm512_storeu_ps(yb, yv[0]);
      _mm512_storeu_ps(yb + 16, yv[1]);
    }
  }

  // DequantizeRow's ((int) q) * d per element.
  static void Dequantize(const uint8_t* row, int64_t cols, float* out) {
    const float* half = HalfToFloatTable();
    for (int64_t b = 0; b < cols / kQK; ++b) {
      const uint8_t* wb = row + b * L::kBytes;
      __m512i q[2];
      L::Widen(wb, q);
      uint16_t h;
      std::memcpy(&h, wb, sizeof h);
      const __m512 d = _mm512_set1_ps(half[h]);
      for (int k = 0; k < 2; ++k) {
        _mm512_storeu_ps(out + b * kQK + 16 * k, _mm512_mul_ps(_mm512_cvtepi32_ps(q[k]), d));
      }
    }
  }
};

// ---- Block types decoded to f32: axpy and dequantize of q4_1, q5_0, q5_1 and iq4_nl. ----
//
// Each block decodes to DequantizeRow's f32 values, 16 elements per zmm, and axpy adds them as the
// f32 kernel adds a row: bit for bit AVX2's BlockKernel. A block's q takes 16 or 32 values, so
// DequantizeRow's value of each (d * q, d * q + m, d * (q - 16), d * table value) is computed once
// per block into a table that vpermps (low 4 index bits) or vpermt2ps (low 5) reads, instead of
// a convert and a mul (and add) per element. d * q is exact (an fp16 times at most 7 bits), so
// whether the compiler contracts it with the add (GCC's C++ default is -ffp-contract=fast)
// changes no bit.

inline __m512 Iota16(float base) {
  return _mm512_add_ps(_mm512_set1_ps(base),
                       _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
}

// q4_1, q5_0, q5_1: x = d * q + m, or d * (q - 16) for q5_0.
template <bool kHasMin, bool kHasHigh>
struct LegacyDecode {
  using Layout = LegacyLoad<kHasMin, kHasHigh>;
  static constexpr int64_t kBytes = Layout::kBytes;
  static __m512 Values(__m512 d, __m512 m, float base) {
    if (kHasMin) return _mm512_add_ps(_mm512_mul_ps(d, Iota16(base)), m);
    return _mm512_mul_ps(d, Iota16(base - 16));
  }
  static void Decode(const uint8_t* b, const float* half, __m512 out[2]) {
    uint16_t h;
    std::memcpy(&h, b, 2);
    const __m512 d = _mm512_set1_ps(half[h]);
    __m512 m = _mm512_setzero_ps();
    if (kHasMin) {
      std::memcpy(&h, b + 2, 2);
      m = _mm512_set1_ps(half[h]);
    }
    // Elements 0..15 in the low nibbles of the dwords, 16..31 in the high ones.
    const __m512i u = _mm512_cvtepu8_epi32(Load16(b + Layout::kQsAt));
    const __m512i hi = _mm512_srli_epi32(u, 4);
    const __m512 t0 = Values(d, m, 0);
    if constexpr (kHasHigh) {
      // Bit 4 of each index from qh: bit l for element l.
      uint32_t qh;
      std::memcpy(&qh, b + Layout::kQhAt, 4);
      const __m512i bit4 = _mm512_set1_epi32(0x10);
      const __m512i lo_idx =
          _mm512_ternarylogic_epi32(u, _mm512_maskz_mov_epi32(static_cast<__mmask16>(qh), bit4),
                                    _mm512_set1_epi32(0x0F), 0xE4);  // bits 0..3 of u, 4 of qh
      const __m512i hi_idx = _mm512_mask_or_epi32(hi, static_cast<__mmask16>(qh >> 16), hi, bit4);
      const __m512 t1 = Values(d, m, 16);
      out[0] = _mm512_permutex2var_ps(t0, lo_idx, t1);
      out[1] = _mm512_permutex2var_ps(t0, hi_idx, t1);
    } else {
      out[0] = _mm512_permutexvar_ps(u, t0);
      out[1] = _mm512_permutexvar_ps(hi, t0);
    }
  }
};

struct Iq4nlDecode {
  static constexpr int64_t kBytes = 18;
  static void Decode(const uint8_t* b, const float* half, __m512 out[2]) {
    uint16_t h;
    std::memcpy(&h, b, 2);
    const __m512 t = _mm512_mul_ps(_mm512_set1_ps(half[h]),
                                   _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                       Load16(reinterpret_cast<const uint8_t*>(kIq4nlValues)))));
    const __m512i u = _mm512_cvtepu8_epi32(Load16(b + 2));
    out[0] = _mm512_permutexvar_ps(u, t);
    out[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(u, 4), t);
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
    for (int64_t b = 0; b < cols / kQK; ++b) {
      if (next != nullptr) {
        for (int r = 0; r < R; ++r) Prefetch(next[r] + b * kBytes);
      }
      float* yb = y + b * kQK;
      __m512 yv[2] = {_mm512_loadu_ps(yb), _mm512_loadu_ps(yb + 16)};
      for (int r = 0; r < R; ++r) {
        __m512 w[2];
        D::Decode(rows[r] + b * kBytes, half, w);
        for (int k = 0; k < 2; ++k) yv[k] = _mm512_fmadd_ps(cv[r], w[k], yv[k]);
      }
      _mm512_storeu_ps(yb, yv[0]);
      _mm512_storeu_ps(yb + 16, yv[1]);
    }
  }

  static void Dequantize(const uint8_t* row, int64_t cols, float* out) {
    const float* half = HalfToFloatTable();
    for (int64_t b = 0; b < cols / kQK; ++b) {
      __m512 w[2];
      D::Decode(row + b * kBytes, half, w);
      _mm512_storeu_ps(out + b * kQK, w[0]);
      _mm512_storeu_ps(out + b * kQK + 16, w[1]);
    }
  }
};

// ---- Activations: ggml's quantize_row_q8_0_ref, 16 values per zmm. ----

// roundf semantics (ties away from zero); p - trunc(p) is exact for |p| < 2^23.
inline __m512 RoundHalfAway(__m512 p) {
  const __m512 t = _mm512_roundscale_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __mmask16 away =
      _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(p, t)), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
  const __m512 step = _mm512_or_ps(_mm512_and_ps(p, _mm512_set1_ps(-0.0f)), _mm512_set1_ps(1.0f));
  return _mm512_mask_add_ps(t, away, t, step);
}

// One block: the 32 values in order and the fp16 scale (and the f32 scale before its rounding,
// which Q8_1's s uses).
inline __m256i QuantizeBlock(const float* x, uint16_t* d_half, float* d_f32 = nullptr) {
  const __m512 v[2] = {_mm512_loadu_ps(x), _mm512_loadu_ps(x + 16)};
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_abs_ps(v[1])));
  const float d = amax / 127;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  *d_half = Fp32ToFp16(d);
  if (d_f32 != nullptr) *d_f32 = d;
  const __m512 idv = _mm512_set1_ps(id);
  __m128i q[2];
  for (int k = 0; k < 2; ++k) {
    q[k] = _mm512_cvtsepi32_epi8(_mm512_cvttps_epi32(RoundHalfAway(_mm512_mul_ps(v[k], idv))));
  }
  return _mm256_set_m128i(q[1], q[0]);
}

void QuantizeQ8_0(const float* x, uint8_t* blocks, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    uint8_t* out = blocks + b * sizeof(BlockQ8_0);
    uint16_t dh;
    const __m256i q = QuantizeBlock(x + b * kQK, &dh);
    std::memcpy(out, &dh, sizeof dh);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + kQsOffset), q);
  }
}

template <class K>
constexpr TypeKernels Float() {
  return {&TiledDotRows<K>, &TiledAxpyRows<K>, &K::Dequantize};
}
template <class K>
constexpr TypeKernels Q8Input() {
  return {&TiledDotRows<K>, &TiledAxpyRows<K>, &K::Dequantize, &InputBytes<typename K::Loader>,
          &PrepareFor<typename K::Loader, &QuantizeBlock>};
}
// Dot through the integer kernel, axpy and dequantize through the f32 decode.
template <class K, class D>
constexpr TypeKernels Q8InputDecoded() {
  using F = BlockKernel<D>;
  return {&TiledDotRows<K>, &TiledAxpyRows<F>, &F::Dequantize, &InputBytes<typename K::Loader>,
          &PrepareFor<typename K::Loader, &QuantizeBlock>};
}

}  // namespace

void FillRowAvx512(KernelSet& set) {
  using T = GgmlType;
  auto slot = [&](T type) -> TypeKernels& { return set.by_type[static_cast<size_t>(type)]; };
  slot(T::kF32) = Float<FloatKernel<F32Load>>();
  slot(T::kF16) = Float<FloatKernel<F16Load>>();
  slot(T::kBF16) = Float<FloatKernel<Bf16Load>>();
  slot(T::kQ8_0) = Q8Input<QuantKernel<Q8Offset>>();
  slot(T::kQ4_0) = Q8Input<QuantKernel<LegacyLoad<false, false>>>();
  slot(T::kQ4_1) =
      Q8InputDecoded<QuantKernel<LegacyLoad<true, false>>, LegacyDecode<true, false>>();
  slot(T::kQ5_0) =
      Q8InputDecoded<QuantKernel<LegacyLoad<false, true>>, LegacyDecode<false, true>>();
  slot(T::kQ5_1) = Q8InputDecoded<QuantKernel<LegacyLoad<true, true>>, LegacyDecode<true, true>>();
  slot(T::kIQ4_NL) = Q8InputDecoded<QuantKernel<Iq4nlOffset>, Iq4nlDecode>();
  set.quantize_q8_0 = &QuantizeQ8_0;
}

}  // namespace thermocline::matmul_internal
