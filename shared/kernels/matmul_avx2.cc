// AVX2/FMA/F16C kernels (compiled with -mavx2 -mfma -mf16c; called only after a run-time check).
//
// Each output (row, token) keeps one 8-lane f32 accumulator that walks the columns in order and
// is reduced with one fixed horizontal sum, whatever the tile shape around it. Tiles only decide
// which weight and activation loads are shared, so a batch of tokens gives bit-identical results
// to one GEMV per token.
#include <immintrin.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <utility>

#include "shared/kernels/matmul_kernels.h"
#include "shared/util/fp16.h"

namespace thermocline::matmul_internal {
namespace {

using TileFn = void (*)(const uint8_t* const* rows, int64_t cols, const uint8_t* x,
                        int64_t x_stride, float* y, int64_t y_stride);

inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float LoadScale(const uint8_t* block) {
  uint16_t h;
  std::memcpy(&h, block, sizeof h);
  return _cvtsh_ss(h);
}

// ---- Float weights: a step is 8 columns. ----

struct F32Load {
  static constexpr int kBytes = 4;
  static __m256 Load(const uint8_t* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
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
  // Tile shapes: 8 rows for GEMV (8 independent FMA chains cover the FMA latency); 6 x 2 for
  // many tokens (12 accumulators + 2 activations + 1 weight = 15 of 16 ymm registers).
  static constexpr int kGemvRows = 8;
  static constexpr int kRows = 6;
  static constexpr int kTokens = 2;

  template <int R, int T>
  static void Tile(const uint8_t* const* rows, int64_t cols, const uint8_t* xb, int64_t x_stride,
                   float* y, int64_t y_stride) {
    __m256 acc[R][T];
    for (int r = 0; r < R; ++r) {
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
    }
    const float* x[T];
    for (int t = 0; t < T; ++t) x[t] = reinterpret_cast<const float*>(xb + t * x_stride);
    int64_t c = 0;
    for (; c + 8 <= cols; c += 8) {
      __m256 xv[T];
      for (int t = 0; t < T; ++t) xv[t] = _mm256_loadu_ps(x[t] + c);
      for (int r = 0; r < R; ++r) {
        const __m256 w = L::Load(rows[r] + c * L::kBytes);
        for (int t = 0; t < T; ++t) acc[r][t] = _mm256_fmadd_ps(w, xv[t], acc[r][t]);
      }
    }
    if (c < cols) {
      // The ragged end goes through zero-padded copies so it takes the same vector path.
      const int64_t n = cols - c;
      alignas(32) float xt[T][8] = {};
      for (int t = 0; t < T; ++t) std::memcpy(xt[t], x[t] + c, n * sizeof(float));
      for (int r = 0; r < R; ++r) {
        alignas(32) uint8_t wt[8 * L::kBytes] = {};
        std::memcpy(wt, rows[r] + c * L::kBytes, n * L::kBytes);
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
  static void AxpyTile(const uint8_t* const* rows, const float* coeffs, int64_t cols, float* y) {
    __m256 cv[R];
    for (int r = 0; r < R; ++r) cv[r] = _mm256_set1_ps(coeffs[r]);
    int64_t c = 0;
    for (; c + 8 <= cols; c += 8) {
      __m256 yv = _mm256_loadu_ps(y + c);
      for (int r = 0; r < R; ++r) yv = _mm256_fmadd_ps(cv[r], L::Load(rows[r] + c * L::kBytes), yv);
      _mm256_storeu_ps(y + c, yv);
    }
    if (c < cols) {
      const int64_t n = cols - c;
      alignas(32) float yt[8] = {};
      std::memcpy(yt, y + c, n * sizeof(float));
      __m256 yv = _mm256_load_ps(yt);
      for (int r = 0; r < R; ++r) {
        alignas(32) uint8_t wt[8 * L::kBytes] = {};
        std::memcpy(wt, rows[r] + c * L::kBytes, n * L::kBytes);
        yv = _mm256_fmadd_ps(cv[r], L::Load(wt), yv);
      }
      _mm256_store_ps(yt, yv);
      std::memcpy(y + c, yt, n * sizeof(float));
    }
  }
};

// ---- Quantized weights against Q8_0 activations: a step is one 32-element block. ----

constexpr int64_t kQsOffset = 2;  // both block types start with their fp16 scale
constexpr int64_t kQ8Bytes = sizeof(BlockQ8_0);

struct Q8Load {
  static constexpr int64_t kBytes = sizeof(BlockQ8_0);
  static __m256i Load(const uint8_t* b) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + kQsOffset));
  }
};
struct Q4Load {
  static constexpr int64_t kBytes = sizeof(BlockQ4_0);
  // Low nibbles are elements 0..15, high nibbles 16..31; values are stored offset by 8.
  static __m256i Load(const uint8_t* b) {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + kQsOffset));
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
    return _mm256_sub_epi8(_mm256_and_si256(both, _mm256_set1_epi8(0x0F)), _mm256_set1_epi8(8));
  }
};

// Sum of the 32 products of signed bytes, as 8 int32 lanes. maddubs wants unsigned x signed,
// so the sign of x moves onto w (|x| <= 127 and w >= -127 keep the int16 pairs from saturating).
inline __m256i DotBlock(__m256i w, __m256i x_abs, __m256i x) {
  const __m256i prod16 = _mm256_maddubs_epi16(x_abs, _mm256_sign_epi8(w, x));
  return _mm256_madd_epi16(prod16, _mm256_set1_epi16(1));
}

template <class L>
struct QuantKernel {
  static constexpr int kGemvRows = 4;
  static constexpr int kRows = 4;
  static constexpr int kTokens = 2;

  template <int R, int T>
  static void Tile(const uint8_t* const* rows, int64_t cols, const uint8_t* xb, int64_t x_stride,
                   float* y, int64_t y_stride) {
    __m256 acc[R][T];
    for (int r = 0; r < R; ++r) {
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
    }
    const int64_t nb = cols / kQK;
    for (int64_t b = 0; b < nb; ++b) {
      __m256i xq[T], xa[T];
      float xd[T];
      for (int t = 0; t < T; ++t) {
        const uint8_t* blk = xb + t * x_stride + b * kQ8Bytes;
        xq[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kQsOffset));
        xa[t] = _mm256_sign_epi8(xq[t], xq[t]);
        xd[t] = LoadScale(blk);
      }
      for (int r = 0; r < R; ++r) {
        const uint8_t* wb = rows[r] + b * L::kBytes;
        const __m256i wq = L::Load(wb);
        const float wd = LoadScale(wb);
        for (int t = 0; t < T; ++t) {
          const __m256 p = _mm256_cvtepi32_ps(DotBlock(wq, xa[t], xq[t]));
          acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(wd * xd[t]), p, acc[r][t]);
        }
      }
    }
    for (int t = 0; t < T; ++t) {
      for (int r = 0; r < R; ++r) y[t * y_stride + r] = HorizontalSum(acc[r][t]);
    }
  }

  template <int R>
  static void AxpyTile(const uint8_t* const* rows, const float* coeffs, int64_t cols, float* y) {
    const int64_t nb = cols / kQK;
    for (int64_t b = 0; b < nb; ++b) {
      float* yb = y + b * kQK;
      __m256 yv[4];
      for (int k = 0; k < 4; ++k) yv[k] = _mm256_loadu_ps(yb + 8 * k);
      for (int r = 0; r < R; ++r) {
        const uint8_t* wb = rows[r] + b * L::kBytes;
        const __m256i q = L::Load(wb);
        const __m256 s = _mm256_set1_ps(coeffs[r] * LoadScale(wb));
        const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
        const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
        for (int k = 0; k < 4; ++k) {
          const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k]));
          yv[k] = _mm256_fmadd_ps(s, f, yv[k]);
        }
      }
      for (int k = 0; k < 4; ++k) _mm256_storeu_ps(yb + 8 * k, yv[k]);
    }
  }
};

// ---- Drivers shared by all types. ----

template <class K, int kMaxR, int kMaxT, size_t... I>
constexpr std::array<TileFn, sizeof...(I)> MakeTileTable(std::index_sequence<I...>) {
  return {&K::template Tile<static_cast<int>(I) / kMaxT + 1, static_cast<int>(I) % kMaxT + 1>...};
}

template <class K, int kMaxR, int kMaxT>
void RunTiles(const RowSource& rows, int64_t n_rows, int64_t cols, const uint8_t* x,
              int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  static constexpr auto kTable =
      MakeTileTable<K, kMaxR, kMaxT>(std::make_index_sequence<kMaxR * kMaxT>());
  ForEachTile<kMaxR, kMaxT>(
      rows, n_rows, n_tokens, [&](const uint8_t* const* w, int nr, int nt, int64_t i0, int64_t t0) {
        kTable[(nr - 1) * kMaxT + (nt - 1)](w, cols, x + t0 * x_stride, x_stride,
                                            y + t0 * y_stride + i0, y_stride);
      });
}

template <class K>
void DotRows(const RowSource& rows, int64_t n_rows, int64_t cols, const uint8_t* x,
             int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  if (n_tokens == 1) {
    RunTiles<K, K::kGemvRows, 1>(rows, n_rows, cols, x, x_stride, 1, y, y_stride);
  } else {
    RunTiles<K, K::kRows, K::kTokens>(rows, n_rows, cols, x, x_stride, n_tokens, y, y_stride);
  }
}

template <class K>
void AxpyRows(const RowSource& rows, const float* coeffs, int64_t n_rows, int64_t cols,
              float* y) {
  // Four rows per pass over y keep y's loads and stores to a quarter of the FMAs.
  constexpr int kR = 4;
  int64_t i = 0;
  for (; i + kR <= n_rows; i += kR) {
    const uint8_t* w[kR] = {rows.row(i), rows.row(i + 1), rows.row(i + 2), rows.row(i + 3)};
    K::template AxpyTile<kR>(w, coeffs + i, cols, y);
  }
  for (; i < n_rows; ++i) {
    const uint8_t* w[1] = {rows.row(i)};
    K::template AxpyTile<1>(w, coeffs + i, cols, y);
  }
}

template <class K>
constexpr TypeKernels MakeKernels() {
  return {&DotRows<K>, &AxpyRows<K>};
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

void QuantizeQ8_0(const float* x, uint8_t* blocks, int64_t n) {
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* xb = x + b * kQK;
    uint8_t* out = blocks + b * kQ8Bytes;
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_ps(xb + 8 * k);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_mask, v[k]));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float d = _mm_cvtss_f32(m) / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = Fp32ToFp16(d);
    std::memcpy(out, &dh, sizeof dh);
    const __m256 idv = _mm256_set1_ps(id);
    __m256i q[4];
    for (int k = 0; k < 4; ++k) {
      q[k] = _mm256_cvttps_epi32(RoundHalfAway(_mm256_mul_ps(v[k], idv)));
    }
    // packs works within 128-bit lanes; the permute restores element order.
    const __m256i q16a = _mm256_packs_epi32(q[0], q[1]);
    const __m256i q16b = _mm256_packs_epi32(q[2], q[3]);
    const __m256i q8 = _mm256_packs_epi16(q16a, q16b);
    const __m256i ordered =
        _mm256_permutevar8x32_epi32(q8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + kQsOffset), ordered);
  }
}

constexpr KernelSet kAvx2 = {
    "avx2",
    MakeKernels<FloatKernel<F32Load>>(),
    MakeKernels<FloatKernel<F16Load>>(),
    MakeKernels<FloatKernel<Bf16Load>>(),
    MakeKernels<QuantKernel<Q8Load>>(),
    MakeKernels<QuantKernel<Q4Load>>(),
    &QuantizeQ8_0,
};

}  // namespace

const KernelSet& Avx2Kernels() { return kAvx2; }

}  // namespace thermocline::matmul_internal
