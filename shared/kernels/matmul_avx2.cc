// AVX2/FMA/F16C kernels (compiled with -mavx2 -mfma -mf16c; called only after a run-time check).
//
// Each output (row, token) keeps one 8-lane f32 accumulator that walks the columns in order and
// is reduced with one fixed horizontal sum, whatever the tile shape around it. Tiles only decide
// which weight and activation loads are shared, so a batch of tokens gives bit-identical results
// to one GEMV per token.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "shared/gguf/quant.h"
#include "shared/kernels/column_steps.h"
#include "shared/kernels/matmul_kernels.h"
#include "shared/kernels/prefetch_weights.h"
#include "shared/kernels/q8_input.h"
#include "shared/kernels/simd_avx2.h"
#include "shared/util/fp16.h"

namespace thermocline::matmul_internal {
namespace {

inline void Prefetch(const uint8_t* p) { PrefetchWeights(p); }

using simd::HorizontalSum;

inline float LoadScale(const uint8_t* block) {
  uint16_t h;
  std::memcpy(&h, block, sizeof h);
  return _cvtsh_ss(h);
}

// ---- Float weights: a step is 8 columns. ----

// Copies len < 32 bytes (a ragged end: fewer than 8 columns) with fixed-size moves, overlapping
// where len is not a power of two. A memcpy of a run-time length is a libc call, and around a call
// every live accumulator is spilled and reloaded: for the f16 predictors' 257-column rows that
// was a quarter of the tile's time.
inline void CopyShort(void* dst, const void* src, size_t len) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  auto two = [&](auto word) {
    constexpr size_t k = sizeof(word);
    std::memcpy(&word, s, k);
    std::memcpy(d, &word, k);
    std::memcpy(&word, s + len - k, k);
    std::memcpy(d + len - k, &word, k);
  };
  if (len >= 16) {
    two(std::array<uint64_t, 2>{});
  } else if (len >= 8) {
    two(uint64_t{});
  } else if (len >= 4) {
    two(uint32_t{});
  } else if (len >= 2) {
    two(uint16_t{});
  } else if (len == 1) {
    d[0] = s[0];
  }
}

struct F32Load {
  static constexpr int kBytes = 4;
  static __m256 Load(const uint8_t* p) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  }
};
struct F16Load {
  static constexpr int kBytes = 2;
  static __m256 Load(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
};
struct Bf16Load {
  static constexpr int kBytes = 2;
  static __m256 Load(const uint8_t* p) {
    const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
  }
};

template <class L>
struct FloatKernel {
  // Tile shapes: 4 rows for GEMV, which the striped tiles of ForEachTile make 4 memory streams;
  // 4 x 3 for many tokens (12 accumulators + 3 activations + 1 weight = all 16 ymm registers;
  // measured ahead of 6 x 2, 3 x 4 and 2 x 5). Eight GEMV rows cover the FMA latency twice over
  // (in L2, one core, f16 at 2048 columns: 61 GB/s, against 44 with 4 and 23 with 2), but from
  // DRAM the 8 streams read slower than 4 (Zen 3, 2048 columns, one thread: f16 73-76% of the
  // read floor with 8 rows, 103-106% with 4; bf16 70% / 94-105%; f32 85-87% / 91-95%; two
  // threads f16 75-93% / 96-103%; at 5504 columns the same within noise).
  static constexpr int kGemvRows = 4;
  static constexpr int kRows = 4;
  static constexpr int kTokens = 3;
  // f16 / bf16 rows read faster with each stream prefetching a page ahead; f32 rows slower
  // (ForEachTile).
  static constexpr bool kPrefetchStripes = L::kBytes == 2;

  template <int R, int T>
  static void Tile(const uint8_t* const* rows, const uint8_t* const* next, int64_t cols,
                   const uint8_t* xb, int64_t x_stride, float* y, int64_t y_stride) {
    __m256 acc[R][T];
    for (int r = 0; r < R; ++r) {
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
    }
    const float* x[T];
    for (int t = 0; t < T; ++t) x[t] = reinterpret_cast<const float*>(xb + t * x_stride);
    auto step = [&](int64_t c) {
      __m256 xv[T];
      for (int t = 0; t < T; ++t) xv[t] = _mm256_loadu_ps(x[t] + c);
      for (int r = 0; r < R; ++r) {
        const __m256 w = L::Load(rows[r] + c * L::kBytes);
        for (int t = 0; t < T; ++t) acc[r][t] = _mm256_fmadd_ps(w, xv[t], acc[r][t]);
      }
    };
    const int64_t c = StepColumns<L::kBytes, 8, R>(next, cols, step);
    if (c < cols && cols >= 8) {
      // The ragged end: the row's last 8 columns loaded in place, its n new ones moved to lanes
      // 0..n-1 and the others zeroed, which is what the zero-padded copies below hold, without
      // their narrow stores (a wide load of them waits for the stores to retire instead of
      // being forwarded: the predictors' 257-column rows paid that once per row).
      const int64_t n = cols - c, back = cols - 8;
      const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
      const __m256i from = _mm256_add_epi32(lane, _mm256_set1_epi32(static_cast<int>(8 - n)));
      const __m256 keep =
          _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), lane));
      auto tail = [&](__m256 v) { return _mm256_and_ps(_mm256_permutevar8x32_ps(v, from), keep); };
      __m256 xv[T];
      for (int t = 0; t < T; ++t) xv[t] = tail(_mm256_loadu_ps(x[t] + back));
      for (int r = 0; r < R; ++r) {
        const __m256 w = tail(L::Load(rows[r] + back * L::kBytes));
        for (int t = 0; t < T; ++t) acc[r][t] = _mm256_fmadd_ps(w, xv[t], acc[r][t]);
      }
    } else if (c < cols) {
      // Fewer than 8 columns in all: zero-padded copies, so that they take the same vector path.
      const int64_t n = cols - c;
      alignas(32) float xt[T][8] = {};
      for (int t = 0; t < T; ++t) CopyShort(xt[t], x[t] + c, n * sizeof(float));
      for (int r = 0; r < R; ++r) {
        alignas(32) uint8_t wt[8 * L::kBytes] = {};
        CopyShort(wt, rows[r] + c * L::kBytes, n * L::kBytes);
        const __m256 w = L::Load(wt);
        for (int t = 0; t < T; ++t) {
          acc[r][t] = _mm256_fmadd_ps(w, _mm256_load_ps(xt[t]), acc[r][t]);
        }
      }
    }
    for (int t = 0; t < T; ++t) {
      for (int r = 0; r < R; ++r) y[t * y_stride + r] = HorizontalSum(acc[r][t]);
    }
  }

  template <int R>
  static void AxpyTile(const uint8_t* const* rows, const uint8_t* const* next, const float* coeffs,
                       int64_t cols, float* y) {
    __m256 cv[R];
    for (int r = 0; r < R; ++r) cv[r] = _mm256_set1_ps(coeffs[r]);
    auto step = [&](int64_t c) {
      __m256 yv = _mm256_loadu_ps(y + c);
      for (int r = 0; r < R; ++r) yv = _mm256_fmadd_ps(cv[r], L::Load(rows[r] + c * L::kBytes), yv);
      _mm256_storeu_ps(y + c, yv);
    };
    const int64_t c = StepColumns<L::kBytes, 8, R>(next, cols, step);
    if (c < cols) {
      const int64_t n = cols - c;
      alignas(32) float yt[8] = {};
      CopyShort(yt, y + c, n * sizeof(float));
      __m256 yv = _mm256_load_ps(yt);
      for (int r = 0; r < R; ++r) {
        alignas(32) uint8_t wt[8 * L::kBytes] = {};
        CopyShort(wt, rows[r] + c * L::kBytes, n * L::kBytes);
        yv = _mm256_fmadd_ps(cv[r], L::Load(wt), yv);
      }
      _mm256_store_ps(yt, yv);
      CopyShort(y + c, yt, n * sizeof(float));
    }
  }
};

// ---- Byte-level helpers of the quantized loaders and decoders. ----

inline void Store32(uint8_t* p, __m256i v) { _mm256_store_si256(reinterpret_cast<__m256i*>(p), v); }
inline __m256i Load32(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
// Bytes 0..15 of the result: the low nibbles of the 16 bytes at p; bytes 16..31: the high ones.
inline __m256i SplitNibbles16(const uint8_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i m = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}
// Byte j = 0x10 where bit j of the little-endian 32-bit word at p is set, else 0.
inline __m256i HighBits32(const uint8_t* p) {
  const __m256i spread = _mm256_shuffle_epi8(
      simd::Broadcast4(p), _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                            2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit),
                          _mm256_set1_epi8(0x10));
}
inline __m256i Iq4Lookup(__m256i idx) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues));
  return _mm256_shuffle_epi8(_mm256_set_m128i(t, t), idx);
}

// ---- Quantized weights against Q8_0 activations: a step is one 32-element block. ----
//
// The byte products run unsigned (weights) x signed (activations), which is what maddubs and
// VNNI's dpbusd take: Q4_0 nibbles are used as stored (0..15), Q8_0 weights offset by +128.
// The activations are prepared once per call (PrepareInput below) with, per block, a lane-wise
// integer bias (-offset times the activation sum of each 4-byte lane) that takes the offset
// back out, so every int32 lane holds exactly the sum of w * x over its four elements whichever
// engine formed it, and the f32 arithmetic after it is the same too: results are bit-identical
// across engines.

constexpr int64_t kQsOffset = 2;  // both block types start with their fp16 scale
constexpr int64_t kQ8Bytes = sizeof(BlockQ8_0);

inline __m256 BroadcastScale(const float* half_table, const uint8_t* block) {
  uint16_t h;
  std::memcpy(&h, block, sizeof h);
  return _mm256_broadcast_ss(half_table + h);
}

// Loaders turn a weight block into the unsigned operand. kOffset is what they add to the signed
// value; kHighScale multiplies the upper four lanes (elements 16..31), which the prepared input
// undoes exactly with a power-of-two factor in its lane scales. Widen gives the signed values
// as int32, elements 8k..8k+7 in out[k] (for AxpyRows); it widens straight from memory, which
// keeps the conversion off the shuffle port that register-to-register widening saturates.
//
// Q4_0, AVX2: low nibbles are elements 0..15, high nibbles 16..31; a 128-bit broadcast load and
// a per-lane variable shift (no cross-lane shuffle) put them in order.
struct Q4Shifted {
  static constexpr int64_t kBytes = sizeof(BlockQ4_0);
  static constexpr int kOffset = 8;
  static constexpr int kHighScale = 1;
  static __m256i Load(const uint8_t* b) {
    const __m256i both =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2)));
    const __m256i shifted = _mm256_srlv_epi32(both, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    return _mm256_and_si256(shifted, _mm256_set1_epi8(0x0F));
  }
  static void Widen(const uint8_t* b, __m256i out[4]) {
    // Bytes 0..7 hold elements 0..7 and 16..23, bytes 8..15 elements 8..15 and 24..31.
    const __m256i offset = _mm256_set1_epi32(kOffset), low = _mm256_set1_epi32(0x0F);
    for (int h = 0; h < 2; ++h) {
      const __m256i bytes =
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * h)));
      out[h] = _mm256_sub_epi32(_mm256_and_si256(bytes, low), offset);
      out[h + 2] = _mm256_sub_epi32(_mm256_srli_epi32(bytes, 4), offset);
    }
  }
};
// Q4_0 for VNNI: the high nibbles stay in place (16 x their value; dpbusd has no int16 step to
// overflow), saving the shift.
struct Q4Masked {
  static constexpr int64_t kBytes = sizeof(BlockQ4_0);
  static constexpr int kOffset = 8;
  static constexpr int kHighScale = 16;
  static __m256i Load(const uint8_t* b) {
    const __m256i both =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2)));
    return _mm256_and_si256(both, _mm256_setr_epi64x(0x0F0F0F0F0F0F0F0F, 0x0F0F0F0F0F0F0F0F,
                                                     static_cast<int64_t>(0xF0F0F0F0F0F0F0F0),
                                                     static_cast<int64_t>(0xF0F0F0F0F0F0F0F0)));
  }
  static void Widen(const uint8_t* b, __m256i out[4]) { Q4Shifted::Widen(b, out); }
};
// Q8_0 + 128 as unsigned bytes, for VNNI (maddubs would saturate at 255 * 127 * 2).
struct Q8Offset {
  static constexpr int64_t kBytes = sizeof(BlockQ8_0);
  static constexpr int kOffset = 128;
  static constexpr int kHighScale = 1;
  static __m256i Load(const uint8_t* b) {
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)),
                            _mm256_set1_epi8(static_cast<char>(0x80)));
  }
  static void Widen(const uint8_t* b, __m256i out[4]) {
    for (int k = 0; k < 4; ++k) {
      out[k] =
          _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * k)));
    }
  }
};
// Q8_0 as stored (signed), for the sign engine.
struct Q8Signed {
  static constexpr int64_t kBytes = sizeof(BlockQ8_0);
  static constexpr int kOffset = 0;
  static constexpr int kHighScale = 1;
  static __m256i Load(const uint8_t* b) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
  }
  static void Widen(const uint8_t* b, __m256i out[4]) { Q8Offset::Widen(b, out); }
};

// Q5_0, both engines: the five-bit value 0..31 as is (nibbles in element order as for Q4_0,
// bit 4 from qh), offset 16.
struct Q5_0Unsigned {
  static constexpr int64_t kBytes = 22;
  static constexpr int kOffset = 16;
  static constexpr int kHighScale = 1;
  static __m256i Load(const uint8_t* b) {
    return _mm256_or_si256(Q4Shifted::Load(b + 4), HighBits32(b + 2));
  }
};
// Q4_1 / Q5_1 (x = d * q + m), both engines: q unsigned as stored (0..15 / 0..31), no offset;
// the m * s_x term of each block comes from the Q8_1-style prepared input (kHasMin).
struct Q4_1Unsigned {
  static constexpr int64_t kBytes = 20;
  static constexpr int kOffset = 0;
  static constexpr int kHighScale = 1;
  static constexpr bool kHasMin = true;
  static __m256i Load(const uint8_t* b) { return Q4Shifted::Load(b + 2); }
};
struct Q5_1Unsigned {
  static constexpr int64_t kBytes = 24;
  static constexpr int kOffset = 0;
  static constexpr int kHighScale = 1;
  static constexpr bool kHasMin = true;
  static __m256i Load(const uint8_t* b) {
    return _mm256_or_si256(Q4Shifted::Load(b + 6), HighBits32(b + 4));
  }
};
// IQ4_NL: the table values (|v| <= 127), signed for the sign engine, + 128 for VNNI.
struct Iq4nlSigned {
  static constexpr int64_t kBytes = 18;
  static constexpr int kOffset = 0;
  static constexpr int kHighScale = 1;
  static __m256i Load(const uint8_t* b) { return Iq4Lookup(SplitNibbles16(b + 2)); }
};
struct Iq4nlOffset {
  static constexpr int64_t kBytes = 18;
  static constexpr int kOffset = 128;
  static constexpr int kHighScale = 1;
  static __m256i Load(const uint8_t* b) {
    return _mm256_xor_si256(Iq4nlSigned::Load(b), _mm256_set1_epi8(static_cast<char>(0x80)));
  }
};

// Engines: the int32 lanes of one block's dot product, starting from the bias.
// AVX-VNNI: one instruction (simd::DpbusdVex).
struct VnniEngine {
  static __m256i Dot(__m256i w_unsigned, __m256i x, __m256i bias) {
    return simd::DpbusdVex(bias, w_unsigned, x);
  }
};
// AVX2: unsigned x signed byte pairs to int16 (15 * 127 * 2 cannot saturate), then int32.
struct MaddubsEngine {
  static __m256i Dot(__m256i w_unsigned, __m256i x, __m256i bias) {
    const __m256i pairs = _mm256_maddubs_epi16(w_unsigned, x);
    return _mm256_add_epi32(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)), bias);
  }
};
// AVX2 for signed Q8_0 weights: the sign of x moves onto w so that |x| is the unsigned operand
// (|x| <= 127 and w >= -127 keep the int16 pairs from saturating); no offset, no bias.
struct SignEngine {
  static __m256i Dot(__m256i w_signed, __m256i x, __m256i) {
    const __m256i pairs =
        _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(w_signed, x));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
  }
};

template <class L, class E>
struct QuantKernel {
  using Loader = L;
  static constexpr int kGemvRows = 4;
  static constexpr int kRows = 4;
  static constexpr int kTokens = 2;
  static constexpr bool kPrefetchStripes = true;  // ForEachTile

  // About one prefetch per cache line of a row.
  static constexpr int64_t kBlocksPerPrefetch = 64 / L::kBytes;

  template <int R, int T>
  static void Tile(const uint8_t* const* rows, const uint8_t* const* next, int64_t cols,
                   const uint8_t* xb, int64_t x_stride, float* y, int64_t y_stride) {
    const float* half = HalfToFloatTable();
    __m256 acc[R][T];
    for (int r = 0; r < R; ++r) {
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < cols / kQK; ++b) {
      __m256i xq[T], xbias[T];
      __m256 xd[T];
      __m256 xs[T];
      for (int t = 0; t < T; ++t) {
        const uint8_t* xt = xb + t * x_stride + b * kPreparedBytes<L>;
        xq[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xt));
        xbias[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xt + kBiasAt));
        xd[t] = _mm256_loadu_ps(reinterpret_cast<const float*>(xt + kScaleAt));
        if constexpr (LoaderHasMin<L>()) {
          xs[t] = _mm256_loadu_ps(reinterpret_cast<const float*>(xt + kSumAt));
        }
      }
      if (next != nullptr && b % kBlocksPerPrefetch == 0) {
        for (int r = 0; r < R; ++r) Prefetch(next[r] + b * L::kBytes);
      }
      for (int r = 0; r < R; ++r) {
        const uint8_t* wb = rows[r] + b * L::kBytes;
        const __m256i wq = L::Load(wb);
        const __m256 wd = BroadcastScale(half, wb);
        for (int t = 0; t < T; ++t) {
          const __m256 p = _mm256_cvtepi32_ps(E::Dot(wq, xq[t], xbias[t]));
          acc[r][t] = _mm256_fmadd_ps(_mm256_mul_ps(wd, xd[t]), p, acc[r][t]);
          if constexpr (LoaderHasMin<L>()) {
            acc[r][t] = _mm256_fmadd_ps(BroadcastScale(half, wb + 2), xs[t], acc[r][t]);
          }
        }
      }
    }
    for (int t = 0; t < T; ++t) {
      for (int r = 0; r < R; ++r) y[t * y_stride + r] = HorizontalSum(acc[r][t]);
    }
  }

  template <int R>
  static void AxpyTile(const uint8_t* const* rows, const uint8_t* const* next, const float* coeffs,
                       int64_t cols, float* y) {
    const float* half = HalfToFloatTable();
    __m256 cv[R];
    for (int r = 0; r < R; ++r) cv[r] = _mm256_set1_ps(coeffs[r]);
    for (int64_t b = 0; b < cols / kQK; ++b) {
      if (next != nullptr && b % kBlocksPerPrefetch == 0) {
        for (int r = 0; r < R; ++r) Prefetch(next[r] + b * L::kBytes);
      }
      float* yb = y + b * kQK;
      __m256 yv[4];
      for (int k = 0; k < 4; ++k) yv[k] = _mm256_loadu_ps(yb + 8 * k);
      for (int r = 0; r < R; ++r) {
        const uint8_t* wb = rows[r] + b * L::kBytes;
        __m256i q[4];
        L::Widen(wb, q);
        const __m256 s = _mm256_mul_ps(cv[r], BroadcastScale(half, wb));
        for (int k = 0; k < 4; ++k) yv[k] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(q[k]), yv[k]);
      }
      for (int k = 0; k < 4; ++k) _mm256_storeu_ps(yb + 8 * k, yv[k]);
    }
  }
};

// ---- Block types decoded to f32: the axpy and dequantize of every block type but q8_0/q4_0. ----
//
// A decoder prepares each row's block once (Prepare: its scales in f32 and its quants unpacked to
// one byte per element with integer SIMD), then gives the f32 values of 32 columns at a time
// straight to registers (Group): axpy adds them into y with FloatKernel<F32Load>'s operation per
// row and element (y = fma(c, w, y), rows in order), so AxpyRows equals the f32 kernel on the
// dequantized rows bit for bit; dequantize stores them. The values are DequantizeRow's, with its
// float operations: d * sc, dmin * m in f32, then d * q, d * q + m or d * q - m per element. The
// products d * q are exact for every type here (an fp16 d, a scale of at most 6 bits and q of at
// most 7 fit f32's 24-bit significand; q6_K, whose scale has 8, adds nothing after its product),
// so whether the compiler contracts the product with the add or subtract into an FMA (GCC's C++
// default is -ffp-contract=fast) does not change a bit.

inline __m256 U8ToFloat(const uint8_t* p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline __m256 I8ToFloat(const int8_t* p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
// q4_K / q5_K: the 8 6-bit scales, then the 8 mins, of the 12 bytes ggml's get_scale_min_k4
// reads, unpacked on 32-bit words.
inline __m128i Q4KScaleMinBytes(const uint8_t* packed) {
  uint32_t u[4];
  std::memcpy(u, packed, 12);
  constexpr uint32_t k6 = 0x3f3f3f3f, k4 = 0x0f0f0f0f, k2 = 0x03030303;
  u[3] = ((u[2] >> 4) & k4) | (((u[1] >> 6) & k2) << 4);
  const uint32_t mins_low = u[1] & k6;
  u[1] = (u[2] & k4) | (((u[0] >> 6) & k2) << 4);
  u[2] = mins_low;
  u[0] &= k6;
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(u));
}
// iq4_xs: the 8 sub-block scales minus 32, as int32.
inline __m256i Iq4xsScales(const uint8_t* b) {
  uint32_t sl;
  std::memcpy(&sl, b + 4, 4);
  const __m128i lows =
      _mm_unpacklo_epi8(_mm_cvtsi32_si128(static_cast<int>(sl & 0x0F0F0F0F)),
                        _mm_cvtsi32_si128(static_cast<int>((sl >> 4) & 0x0F0F0F0F)));
  uint16_t sh;
  std::memcpy(&sh, b + 2, 2);
  const __m256i highs = _mm256_and_si256(
      _mm256_srlv_epi32(_mm256_set1_epi32(sh), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
      _mm256_set1_epi32(3));
  return _mm256_sub_epi32(_mm256_or_si256(_mm256_cvtepu8_epi32(lows), _mm256_slli_epi32(highs, 4)),
                          _mm256_set1_epi32(32));
}

// q4_1, q5_0, q5_1 (blocks of 32): x = d * q + m, or d * (q - 16) for q5_0.
template <bool kHasMin, bool kHasHigh>
struct LegacyDecode {
  static constexpr int kBlock = kQK;
  static constexpr int64_t kBytes = 2 + (kHasMin ? 2 : 0) + (kHasHigh ? 4 : 0) + 16;
  struct Row {
    float d, m;
    alignas(32) uint8_t q[kQK];  // q, or q - 16 as int8
  };
  static void Prepare(const uint8_t* b, const float* half, Row* row) {
    uint16_t h;
    std::memcpy(&h, b, 2);
    row->d = half[h];
    row->m = 0.0f;
    if (kHasMin) {
      std::memcpy(&h, b + 2, 2);
      row->m = half[h];
    }
    const int64_t qh_at = kHasMin ? 4 : 2;
    __m256i q = SplitNibbles16(b + qh_at + (kHasHigh ? 4 : 0));
    if (kHasHigh) q = _mm256_or_si256(q, HighBits32(b + qh_at));
    if (!kHasMin) q = _mm256_sub_epi8(q, _mm256_set1_epi8(kHasHigh ? 16 : 8));
    Store32(row->q, q);
  }
  static void Group(const uint8_t*, const Row& row, int, __m256 out[4]) {
    const __m256 d = _mm256_set1_ps(row.d);
    for (int k = 0; k < 4; ++k) {
      if (kHasMin) {
        out[k] = _mm256_add_ps(_mm256_mul_ps(d, U8ToFloat(row.q + 8 * k)), _mm256_set1_ps(row.m));
      } else {
        out[k] = _mm256_mul_ps(d, I8ToFloat(reinterpret_cast<const int8_t*>(row.q) + 8 * k));
      }
    }
  }
};

// iq4_nl (blocks of 32) and iq4_xs (8 sub-blocks of 32): x = d * value, d * (sc - 32) * value.
template <bool kXs>
struct Iq4Decode {
  static constexpr int kBlock = kXs ? kQK_K : kQK;
  static constexpr int64_t kBytes = kXs ? 136 : 18;
  struct Row {
    alignas(32) float dl[kXs ? 8 : 1];
    alignas(32) int8_t v[kBlock];
  };
  static void Prepare(const uint8_t* b, const float* half, Row* row) {
    uint16_t h;
    std::memcpy(&h, b, 2);
    if constexpr (kXs) {
      _mm256_store_ps(row->dl,
                      _mm256_mul_ps(_mm256_set1_ps(half[h]), _mm256_cvtepi32_ps(Iq4xsScales(b))));
      for (int s = 0; s < 8; ++s) {
        Store32(reinterpret_cast<uint8_t*>(row->v) + 32 * s,
                Iq4Lookup(SplitNibbles16(b + 8 + 16 * s)));
      }
    } else {
      row->dl[0] = half[h];
      Store32(reinterpret_cast<uint8_t*>(row->v), Iq4Lookup(SplitNibbles16(b + 2)));
    }
  }
  static void Group(const uint8_t*, const Row& row, int g, __m256 out[4]) {
    const __m256 dl = _mm256_set1_ps(row.dl[g]);
    for (int k = 0; k < 4; ++k) out[k] = _mm256_mul_ps(dl, I8ToFloat(row.v + 32 * g + 8 * k));
  }
};

// q4_K and q5_K: sub-block s of 32 has its own scale and min; x = (d * sc) * q - dmin * m.
template <bool kHigh>
struct Q45KDecode {
  static constexpr int kBlock = kQK_K;
  static constexpr int64_t kBytes = kHigh ? 176 : 144;
  struct Row {
    alignas(32) float dl[8], ml[8];
    alignas(32) uint8_t q[kQK_K];
  };
  static void Prepare(const uint8_t* b, const float* half, Row* row) {
    uint16_t h;
    std::memcpy(&h, b, 2);
    const float d = half[h];
    std::memcpy(&h, b + 2, 2);
    const float dmin = half[h];
    const __m128i sm = Q4KScaleMinBytes(b + 4);
    _mm256_store_ps(row->dl,
                    _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sm))));
    _mm256_store_ps(row->ml,
                    _mm256_mul_ps(_mm256_set1_ps(dmin),
                                  _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8)))));
    const uint8_t* qs = b + (kHigh ? 48 : 16);
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256i qh = _mm256_setzero_si256();
    if (kHigh) qh = Load32(b + 16);
    for (int g = 0; g < 4; ++g) {
      const __m256i v = Load32(qs + 32 * g);
      __m256i lo = _mm256_and_si256(v, low);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
      if (kHigh) {
        // Bit 2g of qh[l] is bit 4 of sub-block 2g, bit 2g + 1 that of sub-block 2g + 1.
        const __m256i b0 = _mm256_set1_epi8(static_cast<char>(1 << (2 * g)));
        const __m256i b1 = _mm256_set1_epi8(static_cast<char>(1 << (2 * g + 1)));
        const __m256i sixteen = _mm256_set1_epi8(0x10);
        lo = _mm256_or_si256(
            lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b0), b0), sixteen));
        hi = _mm256_or_si256(
            hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b1), b1), sixteen));
      }
      Store32(row->q + 64 * g, lo);
      Store32(row->q + 64 * g + 32, hi);
    }
  }
  static void Group(const uint8_t*, const Row& row, int s, __m256 out[4]) {
    const __m256 dl = _mm256_set1_ps(row.dl[s]), ml = _mm256_set1_ps(row.ml[s]);
    for (int k = 0; k < 4; ++k) {
      out[k] = _mm256_sub_ps(_mm256_mul_ps(dl, U8ToFloat(row.q + 32 * s + 8 * k)), ml);
    }
  }
};

// q6_K: halves of 128; x = (d * sc) * (q - 32), sub-blocks of 16.
struct Q6KDecode {
  static constexpr int kBlock = kQK_K;
  static constexpr int64_t kBytes = 210;
  struct Row {
    alignas(32) float dl[16];
    alignas(32) int8_t q[kQK_K];  // q - 32
  };
  static void Prepare(const uint8_t* b, const float* half, Row* row) {
    uint16_t h;
    std::memcpy(&h, b + 208, 2);
    const __m256 d = _mm256_set1_ps(half[h]);
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192));
    _mm256_store_ps(row->dl, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
    _mm256_store_ps(
        row->dl + 8,
        _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)))));
    const __m256i low = _mm256_set1_epi8(0x0F), three = _mm256_set1_epi8(3),
                  offset = _mm256_set1_epi8(32);
    for (int half_i = 0; half_i < 2; ++half_i) {
      const uint8_t* ql = b + 64 * half_i;
      const __m256i qh = Load32(b + 128 + 32 * half_i);
      const __m256i ql0 = Load32(ql), ql1 = Load32(ql + 32);
      const __m256i parts[4] = {_mm256_and_si256(ql0, low), _mm256_and_si256(ql1, low),
                                _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low),
                                _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low)};
      for (int s = 0; s < 4; ++s) {
        const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * s), three);
        const __m256i v =
            _mm256_sub_epi8(_mm256_or_si256(parts[s], _mm256_slli_epi16(hb, 4)), offset);
        Store32(reinterpret_cast<uint8_t*>(row->q) + 128 * half_i + 32 * s, v);
      }
    }
  }
  static void Group(const uint8_t*, const Row& row, int g, __m256 out[4]) {
    for (int k = 0; k < 4; ++k) {
      const int e = 32 * g + 8 * k;
      out[k] = _mm256_mul_ps(_mm256_set1_ps(row.dl[e / 16]), I8ToFloat(row.q + e));
    }
  }
};

// q2_K: x = (d * (sc & 15)) * q - dmin * (sc >> 4), sub-blocks of 16.
struct Q2KDecode {
  static constexpr int kBlock = kQK_K;
  static constexpr int64_t kBytes = 84;
  struct Row {
    alignas(32) float dl[16], ml[16];
    alignas(32) uint8_t q[kQK_K];
  };
  static void Prepare(const uint8_t* b, const float* half, Row* row) {
    uint16_t h;
    std::memcpy(&h, b + 80, 2);
    const __m256 d = _mm256_set1_ps(half[h]);
    std::memcpy(&h, b + 82, 2);
    const __m256 dmin = _mm256_set1_ps(half[h]);
    const __m256i three = _mm256_set1_epi8(3);
    for (int k = 0; k < 2; ++k) {
      const __m256i sc =
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 8 * k)));
      _mm256_store_ps(
          row->dl + 8 * k,
          _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(sc, _mm256_set1_epi32(0x0F)))));
      _mm256_store_ps(row->ml + 8 * k,
                      _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_srli_epi32(sc, 4))));
    }
    for (int half_i = 0; half_i < 2; ++half_i) {
      const __m256i v = Load32(b + 16 + 32 * half_i);
      for (int s = 0; s < 4; ++s) {
        Store32(row->q + 128 * half_i + 32 * s,
                _mm256_and_si256(_mm256_srli_epi16(v, 2 * s), three));
      }
    }
  }
  static void Group(const uint8_t*, const Row& row, int g, __m256 out[4]) {
    for (int k = 0; k < 4; ++k) {
      const int e = 32 * g + 8 * k;
      out[k] = _mm256_sub_ps(_mm256_mul_ps(_mm256_set1_ps(row.dl[e / 16]), U8ToFloat(row.q + e)),
                             _mm256_set1_ps(row.ml[e / 16]));
    }
  }
};

// q3_K: q = two low bits - (high bit of hmask ? 0 : 4); x = (d * sc) * q, sub-blocks of 16.
struct Q3KDecode {
  static constexpr int kBlock = kQK_K;
  static constexpr int64_t kBytes = 110;
  struct Row {
    alignas(32) float dl[16];
    alignas(32) int8_t q[kQK_K];
  };
  static void Prepare(const uint8_t* b, const float* half, Row* row) {
    uint16_t h;
    std::memcpy(&h, b + 108, 2);
    const float d = half[h];
    for (int g = 0; g < 16; ++g) row->dl[g] = d * static_cast<float>(Q3KScale(b + 96, g));
    const __m256i three = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    const __m256i hmask = Load32(b);
    for (int half_i = 0; half_i < 2; ++half_i) {
      const __m256i v = Load32(b + 32 + 32 * half_i);
      for (int s = 0; s < 4; ++s) {
        const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << (4 * half_i + s)));
        const __m256i missing =
            _mm256_andnot_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hmask, bit), bit), four);
        const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(v, 2 * s), three);
        Store32(reinterpret_cast<uint8_t*>(row->q) + 128 * half_i + 32 * s,
                _mm256_sub_epi8(lo, missing));
      }
    }
  }
  static void Group(const uint8_t*, const Row& row, int g, __m256 out[4]) {
    for (int k = 0; k < 4; ++k) {
      const int e = 32 * g + 8 * k;
      out[k] = _mm256_mul_ps(_mm256_set1_ps(row.dl[e / 16]), I8ToFloat(row.q + e));
    }
  }
};

template <class D>
struct BlockKernel {
  static constexpr int kBlock = D::kBlock;
  static constexpr int64_t kBytes = D::kBytes;

  static void PrefetchBlock(const uint8_t* const* next, int R, int64_t b) {
    for (int r = 0; r < R; ++r) {
      for (int64_t at = 0; at < kBytes; at += 64) Prefetch(next[r] + b * kBytes + at);
    }
  }

  template <int R>
  static void AxpyTile(const uint8_t* const* rows, const uint8_t* const* next, const float* coeffs,
                       int64_t cols, float* y) {
    const float* half = HalfToFloatTable();
    __m256 cv[R];
    for (int r = 0; r < R; ++r) cv[r] = _mm256_set1_ps(coeffs[r]);
    typename D::Row state[R];
    for (int64_t b = 0; b < cols / kBlock; ++b) {
      if (next != nullptr) PrefetchBlock(next, R, b);
      const uint8_t* wb[R];
      for (int r = 0; r < R; ++r) {
        wb[r] = rows[r] + b * kBytes;
        D::Prepare(wb[r], half, &state[r]);
      }
      float* yb = y + b * kBlock;
      for (int g = 0; g < kBlock / 32; ++g) {
        __m256 yv[4];
        for (int k = 0; k < 4; ++k) yv[k] = _mm256_loadu_ps(yb + 32 * g + 8 * k);
        for (int r = 0; r < R; ++r) {
          __m256 w[4];
          D::Group(wb[r], state[r], g, w);
          for (int k = 0; k < 4; ++k) yv[k] = _mm256_fmadd_ps(cv[r], w[k], yv[k]);
        }
        for (int k = 0; k < 4; ++k) _mm256_storeu_ps(yb + 32 * g + 8 * k, yv[k]);
      }
    }
  }

  static void Dequantize(const uint8_t* row, int64_t cols, float* out) {
    const float* half = HalfToFloatTable();
    typename D::Row state;
    for (int64_t b = 0; b < cols / kBlock; ++b) {
      D::Prepare(row + b * kBytes, half, &state);
      for (int g = 0; g < kBlock / 32; ++g) {
        __m256 w[4];
        D::Group(row + b * kBytes, state, g, w);
        for (int k = 0; k < 4; ++k) _mm256_storeu_ps(out + b * kBlock + 32 * g + 8 * k, w[k]);
      }
    }
  }
};

// ---- K-quant and IQ4_XS weights against Q8_K activations: a step is one 256-element block. ----
//
// As ggml's AVX2 vec_dot_<type>_q8_K: the weight quants are unpacked to bytes, maddubs forms
// the byte products in int16 pairs (unsigned weight x signed activation; no pair can saturate
// for these ranges), madd applies the int16 sub-block scales, and the block's int32 lanes are
// summed exactly. Per (row, token) and block, one 8-lane f32 accumulator then takes
// (d * xd) * I and, for types with mins, -(dmin * xd) * M, where M = sum of mins x bsums is
// also exact; the lanes are reduced once at the end. Tiles only share loads, so every (row,
// token) sees the same operations whatever the tile. Plain block_q8_K activations (PrepareQ8K).

constexpr int64_t kQ8KQs = 4;
constexpr int64_t kQ8KSums = 4 + kQK_K;

// Int16 lane k of a register holding the same 8 int16 in both halves, in every lane.
inline __m256i BroadcastPair(__m256i scales16, int k) {
  // scales16 holds 8 int16 in each 128-bit half (the same in both); pick lane k.
  return _mm256_shuffle_epi8(scales16,
                             _mm256_set1_epi16(static_cast<int16_t>(0x0100 + 0x0202 * k)));
}

// Unpackers: Prepare reads the per-block scales (once per row and block, shared by the tile's
// tokens), Dot returns the int32 lanes of I for one token. kHasMin types also give the 16
// int16 mins that madd with the 16 int16 bsums into the lanes of M.
struct KWeights {
  __m256i scales;  // int16 sub-block scales (layout per type)
  __m256i mins;    // int16 per 16 elements (kHasMin)
  float d, dmin;
};

// q4_K: 8 sub-blocks of 32, 6-bit scales and mins (ggml's get_scale_min_k4 packing, undone on
// 32-bit words: bytes 0..7 of `u` become the scales, 8..15 the mins).
inline void Q4KScalesMins(const uint8_t* packed, __m256i* scales, __m256i* mins) {
  const __m128i bytes = Q4KScaleMinBytes(packed);
  *scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(bytes));
  // Each min twice: it applies to both 16-element bsums of its sub-block.
  *mins = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(bytes, bytes));
}

template <bool kHigh>
struct Q45KInt {
  static constexpr int64_t kBytes = kHigh ? 176 : 144;
  static constexpr bool kHasMin = true;
  using W = KWeights;
  static void Prepare(const uint8_t* b, const float* half, W* w) {
    uint16_t h;
    std::memcpy(&h, b, 2);
    w->d = half[h];
    std::memcpy(&h, b + 2, 2);
    w->dmin = half[h];
    Q4KScalesMins(b + 4, &w->scales, &w->mins);
  }
  static __m256i Dot(const uint8_t* b, const W& w, const uint8_t* xq, __m256i) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    const uint8_t* qs = b + (kHigh ? 48 : 16);
    __m256i qh = _mm256_setzero_si256();
    if (kHigh) qh = Load32(b + 16);
    __m256i sum = _mm256_setzero_si256();
    for (int g = 0; g < 4; ++g) {
      const __m256i v = Load32(qs + 32 * g);
      __m256i lo = _mm256_and_si256(v, low);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
      if (kHigh) {
        // Bit 2g of qh[l] is bit 4 of sub-block 2g's element l, bit 2g + 1 that of 2g + 1.
        const __m256i bit = _mm256_set1_epi8(1);
        lo = _mm256_or_si256(
            lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), bit), 4));
        hi = _mm256_or_si256(
            hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g + 1), bit), 4));
      }
      const __m256i pl = _mm256_maddubs_epi16(lo, Load32(xq + 64 * g));
      const __m256i ph = _mm256_maddubs_epi16(hi, Load32(xq + 64 * g + 32));
      sum = _mm256_add_epi32(
          sum, _mm256_add_epi32(_mm256_madd_epi16(pl, BroadcastPair(w.scales, 2 * g)),
                                _mm256_madd_epi16(ph, BroadcastPair(w.scales, 2 * g + 1))));
    }
    return sum;
  }
};

// Types with 16 sub-blocks of 16: a 32-element group k (sub-blocks 2k, 2k + 1) needs scale 2k
// in its low 128 bits and 2k + 1 in its high ones. Prepare keeps sub-blocks 0..7 in both halves
// of `scales` and 8..15 in both halves of `scales_hi`; group k of a half picks its pair.
inline void SplitScales16(__m256i s16, __m256i* lo, __m256i* hi) {
  *lo = _mm256_permute4x64_epi64(s16, 0x44);
  *hi = _mm256_permute4x64_epi64(s16, 0xEE);
}
inline __m256i ScalePair(__m256i dup, int k) {
  const __m256i idx = _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(0x0302 + 0x0404 * k)),
                                       _mm_set1_epi16(static_cast<int16_t>(0x0100 + 0x0404 * k)));
  return _mm256_shuffle_epi8(dup, idx);
}

struct KWeights16 {
  __m256i scales, scales_hi;  // int16 scales of sub-blocks 0..7 / 8..15, in both halves
  __m256i scales16;           // all 16 int16 scales in order (the offset correction)
  __m256i mins;               // q2_K: the 16 int16 mins
  float d, dmin;
};

// q6_K: q + 32 in 0..63 as stored; I takes 32 * sum_g sc_g bsum_g back out (exact int32).
struct Q6KInt {
  static constexpr int64_t kBytes = 210;
  static constexpr bool kHasMin = false;
  using W = KWeights16;
  static void Prepare(const uint8_t* b, const float* half, W* w) {
    uint16_t h;
    std::memcpy(&h, b + 208, 2);
    w->d = half[h];
    w->dmin = 0.0f;
    w->scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)));
    SplitScales16(w->scales16, &w->scales, &w->scales_hi);
  }
  static __m256i Dot(const uint8_t* b, const W& w, const uint8_t* xq, __m256i bsums) {
    const __m256i low = _mm256_set1_epi8(0x0F), three = _mm256_set1_epi8(3);
    __m256i sum = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = Load32(b + 64 * h), ql1 = Load32(b + 64 * h + 32);
      const __m256i qh = Load32(b + 128 + 32 * h);
      const __m256i parts[4] = {_mm256_and_si256(ql0, low), _mm256_and_si256(ql1, low),
                                _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low),
                                _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low)};
      const __m256i& dup = h == 0 ? w.scales : w.scales_hi;
      for (int k = 0; k < 4; ++k) {
        const __m256i hb =
            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), three), 4);
        const __m256i q = _mm256_or_si256(parts[k], hb);
        const __m256i p = _mm256_maddubs_epi16(q, Load32(xq + 128 * h + 32 * k));
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, ScalePair(dup, k)));
      }
    }
    return _mm256_sub_epi32(sum, _mm256_slli_epi32(_mm256_madd_epi16(w.scales16, bsums), 5));
  }
};

// q2_K: 2-bit q, 4-bit scale and min per sub-block of 16.
struct Q2KInt {
  static constexpr int64_t kBytes = 84;
  static constexpr bool kHasMin = true;
  using W = KWeights16;
  static void Prepare(const uint8_t* b, const float* half, W* w) {
    uint16_t h;
    std::memcpy(&h, b + 80, 2);
    w->d = half[h];
    std::memcpy(&h, b + 82, 2);
    w->dmin = half[h];
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
    const __m128i low = _mm_set1_epi8(0x0F);
    w->scales16 = _mm256_cvtepu8_epi16(_mm_and_si128(sc, low));
    w->mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), low));
    SplitScales16(w->scales16, &w->scales, &w->scales_hi);
  }
  static __m256i Dot(const uint8_t* b, const W& w, const uint8_t* xq, __m256i) {
    const __m256i three = _mm256_set1_epi8(3);
    __m256i sum = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i v = Load32(b + 16 + 32 * h);
      const __m256i& dup = h == 0 ? w.scales : w.scales_hi;
      for (int k = 0; k < 4; ++k) {
        const __m256i q = _mm256_and_si256(_mm256_srli_epi16(v, 2 * k), three);
        const __m256i p = _mm256_maddubs_epi16(q, Load32(xq + 128 * h + 32 * k));
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, ScalePair(dup, k)));
      }
    }
    return sum;
  }
};

// q3_K: q + 4 = two low bits | high bit << 2, in 0..7; I takes 4 * sum_g sc_g bsum_g back out.
// The 16 signed 6-bit scales: low nibbles in bytes 0..7 (sub-blocks 0..7 low, 8..15 high
// nibble), two high bits of sub-block 4k + i in bits 2k of byte 8 + i.
struct Q3KInt {
  static constexpr int64_t kBytes = 110;
  static constexpr bool kHasMin = false;
  using W = KWeights16;
  static void Prepare(const uint8_t* b, const float* half, W* w) {
    uint16_t h;
    std::memcpy(&h, b + 108, 2);
    w->d = half[h];
    w->dmin = 0.0f;
    const uint8_t* sc = b + 96;
    const __m128i nib = _mm_set1_epi8(0x0F);
    const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc));
    const __m128i lows =
        _mm_unpacklo_epi64(_mm_and_si128(v, nib), _mm_and_si128(_mm_srli_epi16(v, 4), nib));
    uint32_t hb;
    std::memcpy(&hb, sc + 8, 4);
    const __m128i highs = _mm_and_si128(
        _mm_srlv_epi32(_mm_set1_epi32(static_cast<int>(hb)), _mm_setr_epi32(0, 2, 4, 6)),
        _mm_set1_epi8(3));
    const __m128i s8 =
        _mm_sub_epi8(_mm_or_si128(lows, _mm_slli_epi16(highs, 4)), _mm_set1_epi8(32));
    w->scales16 = _mm256_cvtepi8_epi16(s8);
    SplitScales16(w->scales16, &w->scales, &w->scales_hi);
  }
  static __m256i Dot(const uint8_t* b, const W& w, const uint8_t* xq, __m256i bsums) {
    const __m256i three = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    const __m256i hmask = Load32(b);
    __m256i sum = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i v = Load32(b + 32 + 32 * h);
      const __m256i& dup = h == 0 ? w.scales : w.scales_hi;
      for (int k = 0; k < 4; ++k) {
        const __m256i hi =
            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hmask, 4 * h + k), one), 2);
        const __m256i q = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 2 * k), three), hi);
        const __m256i p = _mm256_maddubs_epi16(q, Load32(xq + 128 * h + 32 * k));
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, ScalePair(dup, k)));
      }
    }
    return _mm256_sub_epi32(sum, _mm256_slli_epi32(_mm256_madd_epi16(w.scales16, bsums), 2));
  }
};

// iq4_xs: 8 sub-blocks of 32 whose 16 bytes hold elements 0..15 (low nibbles) and 16..31
// (high); values from the signed IQ4_NL table. Signed x signed goes through maddubs as
// |w| x (x with w's sign): |w|, |x| <= 127 keep the pairs from saturating.
struct Iq4xsInt {
  static constexpr int64_t kBytes = 136;
  static constexpr bool kHasMin = false;
  using W = KWeights;
  static void Prepare(const uint8_t* b, const float* half, W* w) {
    uint16_t h;
    std::memcpy(&h, b, 2);
    w->d = half[h];
    w->dmin = 0.0f;
    const __m256i s32 = Iq4xsScales(b);
    const __m128i s16 =
        _mm_packs_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
    w->scales = _mm256_broadcastsi128_si256(s16);
  }
  static __m256i Dot(const uint8_t* b, const W& w, const uint8_t* xq, __m256i) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256i sum = _mm256_setzero_si256();
    for (int k = 0; k < 4; ++k) {
      const __m256i v = Load32(b + 8 + 32 * k);  // sub-blocks 2k, 2k + 1
      const __m256i lo = Iq4Lookup(_mm256_and_si256(v, low));
      const __m256i hi = Iq4Lookup(_mm256_and_si256(_mm256_srli_epi16(v, 4), low));
      const __m256i qa = _mm256_permute2x128_si256(lo, hi, 0x20);
      const __m256i qb = _mm256_permute2x128_si256(lo, hi, 0x31);
      const __m256i xa = Load32(xq + 64 * k), xb = Load32(xq + 64 * k + 32);
      const __m256i pa = _mm256_maddubs_epi16(_mm256_sign_epi8(qa, qa), _mm256_sign_epi8(xa, qa));
      const __m256i pb = _mm256_maddubs_epi16(_mm256_sign_epi8(qb, qb), _mm256_sign_epi8(xb, qb));
      sum = _mm256_add_epi32(
          sum, _mm256_add_epi32(_mm256_madd_epi16(pa, BroadcastPair(w.scales, 2 * k)),
                                _mm256_madd_epi16(pb, BroadcastPair(w.scales, 2 * k + 1))));
    }
    return sum;
  }
};

template <class B>
struct KQuantKernel {
  static constexpr int kGemvRows = 4;
  static constexpr int kRows = 4;
  static constexpr int kTokens = 2;
  static constexpr bool kPrefetchStripes = true;  // ForEachTile

  template <int R, int T>
  static void Tile(const uint8_t* const* rows, const uint8_t* const* next, int64_t cols,
                   const uint8_t* xb, int64_t x_stride, float* y, int64_t y_stride) {
    const float* half = HalfToFloatTable();
    __m256 acc[R][T];
    for (int r = 0; r < R; ++r) {
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < cols / kQK_K; ++b) {
      if (next != nullptr) {
        for (int r = 0; r < R; ++r) {
          for (int64_t at = 0; at < B::kBytes; at += 64) Prefetch(next[r] + b * B::kBytes + at);
        }
      }
      const uint8_t* xq[T];
      __m256i bsums[T];
      __m256 xd[T];
      for (int t = 0; t < T; ++t) {
        const uint8_t* xt = xb + t * x_stride + b * kQ8KBlockBytes;
        xd[t] = _mm256_broadcast_ss(reinterpret_cast<const float*>(xt));
        xq[t] = xt + kQ8KQs;
        bsums[t] = Load32(xt + kQ8KSums);
      }
      for (int r = 0; r < R; ++r) {
        const uint8_t* wb = rows[r] + b * B::kBytes;
        typename B::W w;
        B::Prepare(wb, half, &w);
        const __m256 d = _mm256_set1_ps(w.d);
        for (int t = 0; t < T; ++t) {
          const __m256i isum = B::Dot(wb, w, xq[t], bsums[t]);
          acc[r][t] = _mm256_fmadd_ps(_mm256_mul_ps(d, xd[t]), _mm256_cvtepi32_ps(isum), acc[r][t]);
          if constexpr (B::kHasMin) {
            const __m256i msum = _mm256_madd_epi16(w.mins, bsums[t]);
            acc[r][t] = _mm256_fnmadd_ps(_mm256_mul_ps(_mm256_set1_ps(w.dmin), xd[t]),
                                         _mm256_cvtepi32_ps(msum), acc[r][t]);
          }
        }
      }
    }
    for (int t = 0; t < T; ++t) {
      for (int r = 0; r < R; ++r) y[t * y_stride + r] = HorizontalSum(acc[r][t]);
    }
  }
};

template <GgmlType kType>
void ReferenceDequantize(const uint8_t* row, int64_t cols, float* out) {
  DequantizeRow(kType, row, out, cols);
}

// roundf semantics (ties away from zero), which ggml's reference quantizer uses; the SIMD
// round instruction would round ties to even. p - trunc(p) is exact for |p| < 2^23.
inline __m256 RoundHalfAway(__m256 p) {
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  const __m256 t = _mm256_round_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256 frac = _mm256_andnot_ps(sign_mask, _mm256_sub_ps(p, t));
  const __m256 away = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
  const __m256 step = _mm256_or_ps(_mm256_and_ps(p, sign_mask), _mm256_set1_ps(1.0f));
  return _mm256_add_ps(t, _mm256_and_ps(away, step));
}

// One block of ggml's quantize_row_q8_0_ref: the 32 values in order and the fp16 scale (and the
// f32 scale before its rounding, which Q8_1's s uses).
inline __m256i QuantizeBlock(const float* x, uint16_t* d_half, float* d_f32 = nullptr) {
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  __m256 v[4];
  __m256 amax = _mm256_setzero_ps();
  for (int k = 0; k < 4; ++k) {
    v[k] = _mm256_loadu_ps(x + 8 * k);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_mask, v[k]));
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  const float d = _mm_cvtss_f32(m) / 127;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  *d_half = Fp32ToFp16(d);
  if (d_f32 != nullptr) *d_f32 = d;
  const __m256 idv = _mm256_set1_ps(id);
  __m256i q[4];
  for (int k = 0; k < 4; ++k) q[k] = _mm256_cvttps_epi32(RoundHalfAway(_mm256_mul_ps(v[k], idv)));
  // packs works within 128-bit lanes; the permute restores element order.
  const __m256i q8 =
      _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  return _mm256_permutevar8x32_epi32(q8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

void QuantizeQ8_0(const float* x, uint8_t* blocks, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    uint8_t* out = blocks + b * kQ8Bytes;
    uint16_t dh;
    const __m256i q = QuantizeBlock(x + b * kQK, &dh);
    std::memcpy(out, &dh, sizeof dh);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + kQsOffset), q);
  }
}

// ggml's quantize_row_q8_K_ref (QuantizeRowQ8_K) with the same float operations: the first
// value of largest magnitude sets iscale = -127 / max, each x * iscale is rounded by the same
// 1.5 * 2^23 addition as ggml's nearest_int, packs saturates the one possible 128 to 127 (its
// MIN), and d = 1 / iscale. bsums from sums of bytes offset by 128 (psadbw).
void PrepareQ8K(const float* x, int64_t cols, uint8_t* out) {
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const float* xb = x + b * kQK_K;
    uint8_t* blk = out + b * kQ8KBlockBytes;
    __m256 amax8 = _mm256_setzero_ps();
    for (int k = 0; k < kQK_K / 8; ++k) {
      amax8 = _mm256_max_ps(amax8, _mm256_andnot_ps(sign_mask, _mm256_loadu_ps(xb + 8 * k)));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax8), _mm256_extractf128_ps(amax8, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float amax = _mm_cvtss_f32(m);
    if (amax == 0.0f) {
      std::memset(blk, 0, kQ8KBlockBytes);
      continue;
    }
    const __m256 amaxv = _mm256_set1_ps(amax);
    float max = 0.0f;
    for (int k = 0; k < kQK_K / 8; ++k) {
      const __m256 v = _mm256_loadu_ps(xb + 8 * k);
      const int hit =
          _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign_mask, v), amaxv, _CMP_EQ_OQ));
      if (hit != 0) {
        max = xb[8 * k + __builtin_ctz(static_cast<unsigned>(hit))];
        break;
      }
    }
    const float iscale = -127.0f / max;
    const __m256 iv = _mm256_set1_ps(iscale);
    const __m256 magic = _mm256_set1_ps(12582912.0f);
    const __m256i mantissa = _mm256_set1_epi32(0x007fffff), bias = _mm256_set1_epi32(0x00400000);
    for (int g = 0; g < kQK_K / 32; ++g) {
      __m256i q[4];
      for (int k = 0; k < 4; ++k) {
        const __m256 r =
            _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(xb + 32 * g + 8 * k), iv), magic);
        q[k] = _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(r), mantissa), bias);
      }
      const __m256i q8 = _mm256_permutevar8x32_epi32(
          _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3])),
          _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(blk + kQ8KQs + 32 * g), q8);
      alignas(32) uint64_t sums[4];
      _mm256_store_si256(
          reinterpret_cast<__m256i*>(sums),
          _mm256_sad_epu8(_mm256_xor_si256(q8, _mm256_set1_epi8(static_cast<char>(0x80))),
                          _mm256_setzero_si256()));
      const int16_t pair[2] = {static_cast<int16_t>(sums[0] + sums[1] - 16 * 128),
                               static_cast<int16_t>(sums[2] + sums[3] - 16 * 128)};
      std::memcpy(blk + kQ8KSums + 4 * g, pair, sizeof pair);
    }
    const float d = 1.0f / iscale;
    std::memcpy(blk, &d, sizeof d);
  }
}

int64_t Q8KInputBytes(int64_t cols) { return cols / kQK_K * kQ8KBlockBytes; }

template <GgmlType kType, class K>
constexpr TypeEntry Float() {
  return {kType, {&TiledDotRows<K>, &TiledAxpyRows<K>, &ReferenceDequantize<kType>}};
}
template <GgmlType kType, class K>
constexpr TypeEntry Q8Input() {
  return {kType,
          {&TiledDotRows<K>, &TiledAxpyRows<K>, &ReferenceDequantize<kType>,
           &InputBytes<typename K::Loader>, &PrepareFor<typename K::Loader, &QuantizeBlock>}};
}
// Dot through the integer kernel against Q8_K activations; axpy and dequantize through the
// f32 decode (the sparse down_t path multiplies f32 coefficients into rows).
template <GgmlType kType, class B, class D>
constexpr TypeEntry Q8KInput() {
  using F = BlockKernel<D>;
  return {kType,
          {&TiledDotRows<KQuantKernel<B>>, &TiledAxpyRows<F>, &F::Dequantize, &Q8KInputBytes,
           &PrepareQ8K}};
}
// Dot through the Q8_0 integer kernel, axpy and dequantize through the f32 decode.
template <GgmlType kType, class K, class D>
constexpr TypeEntry Q8InputDecoded() {
  using F = BlockKernel<D>;
  return {kType,
          {&TiledDotRows<K>, &TiledAxpyRows<F>, &F::Dequantize, &InputBytes<typename K::Loader>,
           &PrepareFor<typename K::Loader, &QuantizeBlock>}};
}
template <bool kVnni>
constexpr KernelSet MakeKernelSet() {
  using T = GgmlType;
  using Q8 = std::conditional_t<kVnni, QuantKernel<Q8Offset, VnniEngine>,
                                QuantKernel<Q8Signed, SignEngine>>;
  using Q4 = std::conditional_t<kVnni, QuantKernel<Q4Masked, VnniEngine>,
                                QuantKernel<Q4Shifted, MaddubsEngine>>;
  using Q5_0 = QuantKernel<Q5_0Unsigned, std::conditional_t<kVnni, VnniEngine, MaddubsEngine>>;
  using Q4_1 = QuantKernel<Q4_1Unsigned, std::conditional_t<kVnni, VnniEngine, MaddubsEngine>>;
  using Q5_1 = QuantKernel<Q5_1Unsigned, std::conditional_t<kVnni, VnniEngine, MaddubsEngine>>;
  using Iq4nl = std::conditional_t<kVnni, QuantKernel<Iq4nlOffset, VnniEngine>,
                                   QuantKernel<Iq4nlSigned, SignEngine>>;
  constexpr TypeEntry kEntries[] = {
      Float<T::kF32, FloatKernel<F32Load>>(),
      Float<T::kF16, FloatKernel<F16Load>>(),
      Float<T::kBF16, FloatKernel<Bf16Load>>(),
      Q8Input<T::kQ8_0, Q8>(),
      Q8Input<T::kQ4_0, Q4>(),
      Q8InputDecoded<T::kQ4_1, Q4_1, LegacyDecode<true, false>>(),
      Q8InputDecoded<T::kQ5_0, Q5_0, LegacyDecode<false, true>>(),
      Q8InputDecoded<T::kQ5_1, Q5_1, LegacyDecode<true, true>>(),
      Q8InputDecoded<T::kIQ4_NL, Iq4nl, Iq4Decode<false>>(),
      Q8KInput<T::kQ2_K, Q2KInt, Q2KDecode>(),
      Q8KInput<T::kQ3_K, Q3KInt, Q3KDecode>(),
      Q8KInput<T::kQ4_K, Q45KInt<false>, Q45KDecode<false>>(),
      Q8KInput<T::kQ5_K, Q45KInt<true>, Q45KDecode<true>>(),
      Q8KInput<T::kQ6_K, Q6KInt, Q6KDecode>(),
      Q8KInput<T::kIQ4_XS, Iq4xsInt, Iq4Decode<true>>(),
  };
  // The interleaved Q4_K, Q5_K and Q6_K kernels form their exact sums with maddubs in both sets
  // (VNNI would give the same integers); the interleaved Q4_0, Q5_0, Q8_0, Q3_K and IQ4_XS ones
  // use vpdpbusd where the set has VNNI.
  return {kVnni ? "avx2+vnni" : "avx2", MakeTypeTable(kEntries), &QuantizeQ8_0,
          Interleaved8Table<kLegacyX8Avx2<GgmlType::kQ4_0, kVnni>,
                            kLegacyX8Avx2<GgmlType::kQ5_0, kVnni>,
                            kLegacyX8Avx2<GgmlType::kQ8_0, kVnni>, kQ3_Kx8Avx2<kVnni>, kQ4_Kx8Avx2,
                            kQ5_Kx8Avx2, kQ6_Kx8Avx2, kIq4_XSx8Avx2<kVnni>>(),
          IntAxpyTable(&IntAxpyQ4_0Avx2)};
}

constexpr KernelSet kAvx2 = MakeKernelSet<false>();
constexpr KernelSet kAvx2Vnni = MakeKernelSet<true>();

}  // namespace

const KernelSet& Avx2Kernels(bool vnni) { return vnni ? kAvx2Vnni : kAvx2; }

}  // namespace thermocline::matmul_internal
