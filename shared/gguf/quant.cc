#include "shared/gguf/quant.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "shared/util/fp16.h"

namespace thermocline {

namespace {

// ggml casts these floats straight to int8; for finite inputs the value is always in range, but
// NaN/Inf inputs (or a subnormal scale whose inverse overflows) would make the cast undefined
// behaviour. Clamping keeps every in-range result bit-identical and defines the rest.
inline int8_t SaturateToInt8(float x) {
  if (!(x >= -128.0f)) return x != x ? 0 : -128;  // NaN -> 0
  if (x > 127.0f) return 127;
  return static_cast<int8_t>(x);
}

// Blocks are addressed through byte pointers with memcpy'd scales: a file with general.alignment
// 1 may place a block at an odd address, where a BlockQ8_0* dereference would be misaligned.
constexpr int64_t kQ8Bytes = sizeof(BlockQ8_0);
constexpr int64_t kQ4Bytes = sizeof(BlockQ4_0);
constexpr int64_t kQsOffset = offsetof(BlockQ8_0, qs);
static_assert(offsetof(BlockQ4_0, qs) == kQsOffset);

inline float LoadScale(const uint8_t* block) {
  uint16_t h;
  std::memcpy(&h, block, sizeof h);
  return Fp16ToFp32(h);
}
inline void StoreScale(uint8_t* block, float d) {
  const uint16_t h = Fp32ToFp16(d);
  std::memcpy(block, &h, sizeof h);
}

void QuantizeRowQ8_0(const float* x, uint8_t* y, int64_t n) {
  const int64_t nb = n / kQK;
  for (int64_t i = 0; i < nb; ++i) {
    const float* xb = x + i * kQK;
    uint8_t* yb = y + i * kQ8Bytes;
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) {
      const float a = std::fabs(xb[j]);
      amax = amax > a ? amax : a;  // ggml's MAX(), including its NaN behaviour
    }
    const float d = amax / ((1 << 7) - 1);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    StoreScale(yb, d);
    for (int j = 0; j < kQK; ++j) {
      yb[kQsOffset + j] = static_cast<uint8_t>(SaturateToInt8(std::roundf(xb[j] * id)));
    }
  }
}

// ggml's index for a legacy block value: its (value + bias) truncated toward zero, capped at
// kMax (ggml's MIN(kMax, (int8_t)...) or (uint8_t) cast). For finite inputs the argument lies in
// [0, kMax + 1), so this is ggml's result bit for bit; NaN and infinities (undefined behaviour
// in ggml's casts) are pinned to 0 and kMax instead of spilling into the neighbouring nibble.
template <int kMax>
inline uint8_t LegacyIndex(float v) {
  if (!(v >= 0.0f)) return 0;  // NaN or -inf
  if (v >= static_cast<float>(kMax)) return kMax;
  return static_cast<uint8_t>(v);
}

// The 32-element legacy blocks (layouts in ggml_type.h), with ggml's reference quantizers, which
// llama-quantize runs for them when there is no importance matrix (quantize_row_q4_0_ref,
// q4_1, q5_0, q5_1). Without a min (q4_0, q5_0) the signed value of largest magnitude maps to
// the most negative index (-8 / -16 steps of d = max / -8 or -16), so the full range is used on
// the side where it matters most; with a min (q4_1, q5_1) d = (max - min) / 15 or 31 and the
// index is (x - min) / d rounded half up. d and min are stored as fp16 but the indices are
// computed with the f32 d, as ggml does. Element j < 16 is the low nibble of qs[j], j >= 16 the
// high nibble of qs[j - 16]; the 5-bit types put bit 4 of element j in bit j of qh.
template <bool kHasMin, bool kHasHigh>
void QuantizeRowLegacy(const float* x, uint8_t* y, int64_t n) {
  constexpr int kMaxIndex = kHasHigh ? 31 : 15;
  constexpr int64_t kQhAt = kHasMin ? 4 : 2;
  constexpr int64_t kQsAt = kQhAt + (kHasHigh ? 4 : 0);
  constexpr int64_t kBlockBytes = kQsAt + kQK / 2;
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float* xb = x + i * kQK;
    uint8_t* yb = y + i * kBlockBytes;
    uint8_t q[kQK];
    if constexpr (kHasMin) {
      float min = std::numeric_limits<float>::max();
      float max = -std::numeric_limits<float>::max();
      for (int j = 0; j < kQK; ++j) {
        if (xb[j] < min) min = xb[j];
        if (xb[j] > max) max = xb[j];
      }
      const float d = (max - min) / kMaxIndex;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      StoreScale(yb, d);
      StoreScale(yb + 2, min);
      for (int j = 0; j < kQK; ++j) q[j] = LegacyIndex<kMaxIndex>((xb[j] - min) * id + 0.5f);
    } else {
      float amax = 0.0f;
      float max = 0.0f;
      for (int j = 0; j < kQK; ++j) {
        if (amax < std::fabs(xb[j])) {
          amax = std::fabs(xb[j]);
          max = xb[j];
        }
      }
      constexpr float kHalf = (kMaxIndex + 1) / 2;
      const float d = max / -kHalf;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      StoreScale(yb, d);
      for (int j = 0; j < kQK; ++j) q[j] = LegacyIndex<kMaxIndex>(xb[j] * id + (kHalf + 0.5f));
    }
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      yb[kQsAt + j] = static_cast<uint8_t>((q[j] & 0x0F) | ((q[j + kQK / 2] & 0x0F) << 4));
      qh |= static_cast<uint32_t>(q[j] >> 4) << j;
      qh |= static_cast<uint32_t>(q[j + kQK / 2] >> 4) << (j + kQK / 2);
    }
    if constexpr (kHasHigh) std::memcpy(yb + kQhAt, &qh, sizeof qh);
  }
}

// ---- Q6_K quantization: ggml's quantize_row_q6_K_ref (no importance weights). ----

// ggml's nearest_int: adding 1.5 * 2^23 leaves round(x) (ties to even) in the low mantissa bits.
inline int NearestInt(float f) {
  const float v = f + 12582912.0f;
  int32_t i;
  std::memcpy(&i, &v, sizeof i);
  return (i & 0x007fffff) - 0x00400000;
}

constexpr float kGroupMaxEps = 1e-15f;

// ggml's make_qx_quants for rmse_type 1 (weights x^2): the symmetric scale of n values on levels
// [-nmax, nmax), searched over 18 perturbations of nmax / max; L receives level + nmax. Every
// float operation in ggml's order (this file is compiled without FMA, as ggml's ISO C is).
float MakeQxQuants(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  auto level = [nmax](float v) { return std::max(-nmax, std::min(nmax - 1, NearestInt(v))); };
  float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = level(iscale * x[i]);
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * static_cast<float>(l);
    suml2 += w * static_cast<float>(l) * static_cast<float>(l);
  }
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(is)) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = level(iscale * x[i]);
      const float w = x[i] * x[i];
      sumlx += w * x[i] * static_cast<float>(l);
      suml2 += w * static_cast<float>(l) * static_cast<float>(l);
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(nmax + level(iscale * x[i]));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

void QuantizeRowQ6_K(const float* x, uint8_t* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    uint8_t* b = y + i * 210;
    int8_t L[kQK_K];
    float scales[16];
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < 16; ++ib) {
      const float scale = MakeQxQuants(16, 32, x + 16 * ib, L + 16 * ib);
      scales[ib] = scale;
      if (std::fabs(scale) > max_abs_scale) {
        max_abs_scale = std::fabs(scale);
        max_scale = scale;
      }
    }
    std::memset(b, 0, 210);
    if (max_abs_scale < kGroupMaxEps) continue;  // d = +0 (bytes 00 00)
    const float iscale = -128.0f / max_scale;
    StoreScale(b + 208, 1 / iscale);
    int8_t* sc = reinterpret_cast<int8_t*>(b + 192);
    for (int ib = 0; ib < 16; ++ib) {
      sc[ib] = static_cast<int8_t>(std::min(127, NearestInt(iscale * scales[ib])));
    }
    const float d_all = LoadScale(b + 208);
    for (int j = 0; j < 16; ++j) {
      const float d = d_all * static_cast<float>(sc[j]);
      if (d == 0.0f) continue;
      for (int k = 0; k < 16; ++k) {
        const int l = std::max(-32, std::min(31, NearestInt(x[16 * j + k] / d)));
        L[16 * j + k] = static_cast<int8_t>(l + 32);
      }
    }
    uint8_t* ql = b;
    uint8_t* qh = b + 128;
    for (int h = 0; h < 2; ++h) {
      const int8_t* Lh = L + 128 * h;
      for (int l = 0; l < 32; ++l) {
        ql[64 * h + l] = static_cast<uint8_t>((Lh[l] & 0xF) | ((Lh[l + 64] & 0xF) << 4));
        ql[64 * h + l + 32] = static_cast<uint8_t>((Lh[l + 32] & 0xF) | ((Lh[l + 96] & 0xF) << 4));
        qh[32 * h + l] = static_cast<uint8_t>((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) |
                                              ((Lh[l + 64] >> 4) << 4) | ((Lh[l + 96] >> 4) << 6));
      }
    }
  }
}

// ---- Q4_K and Q5_K quantization: ggml's quantize_row_q4_K_ref / q5_K_ref (no importance
// weights). ----

// ggml's make_qkx2_quants: the scale and min of n values on levels [0, nmax],
// starting from (max - min) / nmax and trying nstep + 1 other level spacings, each refit by
// weighted least squares; L receives the levels, *the_min the (positive) offset.
float MakeQkx2Quants(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                     float* the_min, uint8_t* Laux, float rmin, float rdelta, int nstep,
                     bool use_mad = false) {
  auto error = [use_mad](float diff) { return use_mad ? std::fabs(diff) : diff * diff; };
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.0f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = NearestInt(iscale * (x[i] - min));
    L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    const float diff = scale * L[i] + min - x[i];
    best_error += weights[i] * error(diff);
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * static_cast<float>(is) + static_cast<float>(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(0, std::min(nmax, NearestInt(iscale * (x[i] - min))));
      Laux[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      sum_l += w * static_cast<float>(l);
      sum_l2 += w * static_cast<float>(l) * static_cast<float>(l);
      sum_xl += w * static_cast<float>(l) * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        const float diff = this_scale * Laux[i] + this_min - x[i];
        cur_error += weights[i] * error(diff);
      }
      if (cur_error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = Laux[i];
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// kHigh: Q5_K (levels 0..31, bit 4 in qh; ggml's search parameters for 5 bits).
template <bool kHigh>
void QuantizeRowQ45_K(const float* x, uint8_t* y, int64_t n) {
  constexpr int kMax = kHigh ? 31 : 15;
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    uint8_t* b = y + i * (kHigh ? 176 : 144);
    uint8_t L[kQK_K], Laux[32];
    float weights[32], mins[8], scales[8];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
      float sum_x2 = 0;
      for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
      const float av_x = std::sqrt(sum_x2 / 32);
      for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
      scales[j] = MakeQkx2Quants(32, kMax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux,
                                 kHigh ? -0.5f : -1.0f, 0.1f, kHigh ? 15 : 20);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    uint8_t* sc = b + 4;
    std::memset(sc, 0, 12);
    for (int j = 0; j < 8; ++j) {
      // ggml stores nearest_int into a uint8_t before the MIN: keep that wrap-around.
      const uint8_t ls =
          std::min<uint8_t>(63, static_cast<uint8_t>(NearestInt(inv_scale * scales[j])));
      const uint8_t lm = std::min<uint8_t>(63, static_cast<uint8_t>(NearestInt(inv_min * mins[j])));
      if (j < 4) {
        sc[j] = ls;
        sc[j + 4] = lm;
      } else {
        sc[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
        sc[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
        sc[j] |= static_cast<uint8_t>((lm >> 4) << 6);
      }
    }
    StoreScale(b, max_scale / 63.0f);
    StoreScale(b + 2, max_min / 63.0f);
    const float d_all = LoadScale(b), dmin_all = LoadScale(b + 2);
    for (int j = 0; j < 8; ++j) {
      int s, m;
      Q4KScaleMin(sc, j, &s, &m);
      const float d = d_all * static_cast<float>(s);
      if (d == 0.0f) continue;
      const float dm = dmin_all * static_cast<float>(m);
      for (int k = 0; k < 32; ++k) {
        const int l = NearestInt((x[32 * j + k] + dm) / d);
        L[32 * j + k] = static_cast<uint8_t>(std::max(0, std::min(kMax, l)));
      }
    }
    uint8_t* qh = b + 16;
    uint8_t* q = b + (kHigh ? 48 : 16);
    if (kHigh) std::memset(qh, 0, 32);
    for (int g = 0; g < 4; ++g, q += 32) {
      for (int l = 0; l < 32; ++l) {
        int l1 = L[64 * g + l], l2 = L[64 * g + l + 32];
        if (kHigh) {
          if (l1 > 15) {
            l1 -= 16;
            qh[l] |= static_cast<uint8_t>(1 << (2 * g));
          }
          if (l2 > 15) {
            l2 -= 16;
            qh[l] |= static_cast<uint8_t>(2 << (2 * g));
          }
        }
        q[l] = static_cast<uint8_t>(l1 | (l2 << 4));
      }
    }
  }
}

// ---- Q2_K and Q3_K quantization: ggml's quantize_row_q2_K_ref / q3_K_ref. ----

// Four 2-bit levels per byte: element j + 32s of each half of 128 in bits 2s of byte j.
void PackTwoBitPlanes(const uint8_t* L, uint8_t* qs) {
  for (int j = 0; j < kQK_K; j += 128) {
    for (int l = 0; l < 32; ++l) {
      qs[j / 4 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) |
                                           (L[j + l + 96] << 6));
    }
  }
}

void QuantizeRowQ2_K(const float* x, uint8_t* y, int64_t n) {
  constexpr float kQ4Scale = 15.0f;
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    uint8_t* b = y + i * 84;
    uint8_t* sc = b;
    uint8_t L[kQK_K], Laux[16];
    float weights[16], mins[16], scales[16];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
      scales[j] = MakeQkx2Quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f,
                                 0.1f, 15, /*use_mad=*/true);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    if (max_scale > 0) {
      const float iscale = kQ4Scale / max_scale;
      for (int j = 0; j < 16; ++j) sc[j] = static_cast<uint8_t>(NearestInt(iscale * scales[j]));
      StoreScale(b + 80, max_scale / kQ4Scale);
    } else {
      for (int j = 0; j < 16; ++j) sc[j] = 0;
      StoreScale(b + 80, 0.0f);
    }
    if (max_min > 0) {
      const float iscale = kQ4Scale / max_min;
      for (int j = 0; j < 16; ++j) {
        sc[j] = static_cast<uint8_t>(sc[j] | (NearestInt(iscale * mins[j]) << 4));
      }
      StoreScale(b + 82, max_min / kQ4Scale);
    } else {
      StoreScale(b + 82, 0.0f);
    }
    const float d_all = LoadScale(b + 80), dmin_all = LoadScale(b + 82);
    for (int j = 0; j < 16; ++j) {
      const float d = d_all * static_cast<float>(sc[j] & 0xF);
      if (d == 0.0f) continue;
      const float dm = dmin_all * static_cast<float>(sc[j] >> 4);
      for (int k = 0; k < 16; ++k) {
        const int l = NearestInt((x[16 * j + k] + dm) / d);
        L[16 * j + k] = static_cast<uint8_t>(std::max(0, std::min(3, l)));
      }
    }
    PackTwoBitPlanes(L, b + 16);
  }
}

// ggml's make_q3_quants with RMSE refinement: symmetric levels [-nmax, nmax), weights x^2, up
// to five passes moving single levels while that improves the fit; L receives level + nmax.
float MakeQ3Quants(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  const float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::max(-nmax, std::min(nmax - 1, NearestInt(iscale * x[i])));
    L[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * static_cast<float>(l);
    suml2 += w * static_cast<float>(l) * static_cast<float>(l);
  }
  for (int itry = 0; itry < 5; ++itry) {
    int n_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * static_cast<float>(L[i]);
      if (slx > 0) {
        float sl2 = suml2 - w * static_cast<float>(L[i]) * static_cast<float>(L[i]);
        const int new_l = std::max(-nmax, std::min(nmax - 1, NearestInt(x[i] * sl2 / slx)));
        if (new_l != L[i]) {
          slx += w * x[i] * static_cast<float>(new_l);
          sl2 += w * static_cast<float>(new_l) * static_cast<float>(new_l);
          if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = static_cast<int8_t>(new_l);
            sumlx = slx;
            suml2 = sl2;
            ++n_changed;
          }
        }
      }
    }
    if (n_changed == 0) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

void QuantizeRowQ3_K(const float* x, uint8_t* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    uint8_t* b = y + i * 110;
    uint8_t* hmask = b;
    uint8_t* sc = b + 96;
    int8_t L[kQK_K];
    float scales[16];
    float max_scale = 0, amax = 0;
    for (int j = 0; j < 16; ++j) {
      scales[j] = MakeQ3Quants(16, 4, x + 16 * j, L + 16 * j);
      const float scale = std::fabs(scales[j]);
      if (scale > amax) {
        amax = scale;
        max_scale = scales[j];
      }
    }
    std::memset(sc, 0, 12);
    if (max_scale != 0.0f) {
      const float iscale = -32.0f / max_scale;
      for (int j = 0; j < 16; ++j) {
        int l = std::max(-32, std::min(31, static_cast<int>(static_cast<int8_t>(
                                               NearestInt(iscale * scales[j]))))) +
                32;
        if (j < 8) {
          sc[j] = static_cast<uint8_t>(l & 0xF);
        } else {
          sc[j - 8] = static_cast<uint8_t>(sc[j - 8] | ((l & 0xF) << 4));
        }
        l >>= 4;
        sc[j % 4 + 8] = static_cast<uint8_t>(sc[j % 4 + 8] | (l << (2 * (j / 4))));
      }
      StoreScale(b + 108, 1 / iscale);
    } else {
      StoreScale(b + 108, 0.0f);
    }
    const float d_all = LoadScale(b + 108);
    for (int j = 0; j < 16; ++j) {
      const float d = d_all * static_cast<float>(Q3KScale(sc, j));
      if (d == 0.0f) continue;
      for (int k = 0; k < 16; ++k) {
        const int l = std::max(-4, std::min(3, NearestInt(x[16 * j + k] / d)));
        L[16 * j + k] = static_cast<int8_t>(l + 4);
      }
    }
    std::memset(hmask, 0, 32);
    int m = 0;
    uint8_t hm = 1;
    uint8_t low[kQK_K];
    for (int j = 0; j < kQK_K; ++j) {
      int l = L[j];
      if (l > 3) {
        hmask[m] |= hm;
        l -= 4;
      }
      low[j] = static_cast<uint8_t>(l);
      if (++m == 32) {
        m = 0;
        hm = static_cast<uint8_t>(hm << 1);
      }
    }
    PackTwoBitPlanes(low, b + 32);
  }
}

// ---- IQ4_NL and IQ4_XS quantization: ggml's quantize_row_iq4_nl_impl without importance
// weights (weights x^2, seven trial scales either side). ----

// ggml's best_index_int8: the index of the table value nearest x (ties to the upper one).
int BestIndexIq4(float x) {
  const int8_t* val = kIq4nlValues;
  if (x <= val[0]) return 0;
  if (x >= val[15]) return 15;
  int ml = 0, mu = 15;
  while (mu - ml > 1) {
    const int mav = (ml + mu) / 2;
    if (x < val[mav]) {
      mu = mav;
    } else {
      ml = mav;
    }
  }
  return x - val[mu - 1] < val[mu] - x ? mu - 1 : mu;
}

// One super-block of `super` values in sub-blocks of 32 (IQ4_NL: super = 32, one scale kept
// as fp16 `d`; IQ4_XS: super = 256, 6-bit sub-block scales). Fills L (table indices) and
// returns the sub-block scales' data through d / scales_l / scales_h.
void QuantizeIq4(const float* x, int super, uint8_t* d_out, uint8_t* q4, uint16_t* scales_h,
                 uint8_t* scales_l) {
  constexpr int kTry = 7;
  const int8_t* values = kIq4nlValues;
  uint8_t L[kQK_K];
  float scales[kQK_K / 32];
  float weight[32];
  std::memset(q4, 0, static_cast<size_t>(super / 2));
  StoreScale(d_out, 0.0f);
  float max_scale = 0, amax_scale = 0;
  for (int ib = 0; ib < super / 32; ++ib) {
    const float* xb = x + 32 * ib;
    uint8_t* Lb = L + 32 * ib;
    for (int j = 0; j < 32; ++j) weight[j] = xb[j] * xb[j];
    float amax = 0, max = 0;
    for (int j = 0; j < 32; ++j) {
      const float ax = std::fabs(xb[j]);
      if (ax > amax) {
        amax = ax;
        max = xb[j];
      }
    }
    if (amax < kGroupMaxEps) {
      scales[ib] = 0;
      continue;
    }
    float d = -max / values[0];
    float id = 1 / d;
    float sumqx = 0, sumq2 = 0;
    for (int j = 0; j < 32; ++j) {
      const int l = BestIndexIq4(id * xb[j]);
      Lb[j] = static_cast<uint8_t>(l);
      const float q = values[l];
      const float w = weight[j];
      sumqx += w * q * xb[j];
      sumq2 += w * q * q;
    }
    d = sumqx / sumq2;
    float best = d * sumqx;
    for (int itry = -kTry; itry <= kTry; ++itry) {
      id = static_cast<float>(itry + values[0]) / max;
      sumqx = sumq2 = 0;
      for (int j = 0; j < 32; ++j) {
        const float q = values[BestIndexIq4(id * xb[j])];
        const float w = weight[j];
        sumqx += w * q * xb[j];
        sumq2 += w * q * q;
      }
      if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
        d = sumqx / sumq2;
        best = d * sumqx;
      }
    }
    scales[ib] = d;
    if (std::fabs(d) > amax_scale) {
      amax_scale = std::fabs(d);
      max_scale = d;
    }
  }
  if (super > 32) {
    *scales_h = 0;
    const float d = -max_scale / 32;
    StoreScale(d_out, d);
    const float id = d != 0.0f ? 1 / d : 0.0f;
    for (int ib = 0; ib < super / 32; ++ib) {
      int l = std::max(-32, std::min(31, NearestInt(id * scales[ib])));
      const float dl = d * static_cast<float>(l);
      const float idl = dl != 0.0f ? 1 / dl : 0.0f;
      for (int j = 0; j < 32; ++j)
        L[32 * ib + j] = static_cast<uint8_t>(BestIndexIq4(idl * x[32 * ib + j]));
      l += 32;
      const uint8_t l_l = static_cast<uint8_t>(l & 0xF), l_h = static_cast<uint8_t>(l >> 4);
      if (ib % 2 == 0) {
        scales_l[ib / 2] = l_l;
      } else {
        scales_l[ib / 2] = static_cast<uint8_t>(scales_l[ib / 2] | (l_l << 4));
      }
      *scales_h = static_cast<uint16_t>(*scales_h | (l_h << (2 * (ib % 8))));
    }
  } else {
    StoreScale(d_out, scales[0]);
    const float id = scales[0] != 0.0f ? 1 / scales[0] : 0.0f;
    for (int j = 0; j < super; ++j) L[j] = static_cast<uint8_t>(BestIndexIq4(id * x[j]));
  }
  for (int i = 0; i < super / 32; ++i) {
    for (int j = 0; j < 16; ++j) {
      q4[16 * i + j] = static_cast<uint8_t>(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
    }
  }
}

void QuantizeRowIQ4_NL(const float* x, uint8_t* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i) {
    uint8_t* b = y + i * 18;
    uint16_t unused_h;
    uint8_t unused_l[1];
    QuantizeIq4(x + i * kQK, kQK, b, b + 2, &unused_h, unused_l);
  }
}

void QuantizeRowIQ4_XS(const float* x, uint8_t* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    uint8_t* b = y + i * 136;
    uint16_t scales_h = 0;
    QuantizeIq4(x + i * kQK_K, kQK_K, b, b + 8, &scales_h, b + 4);
    std::memcpy(b + 2, &scales_h, 2);
  }
}

void DequantizeRowQ8_0(const uint8_t* x, float* y, int64_t n) {
  const int64_t nb = n / kQK;
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* xb = x + i * kQ8Bytes;
    const float d = LoadScale(xb);
    for (int j = 0; j < kQK; ++j) {
      y[i * kQK + j] = static_cast<int8_t>(xb[kQsOffset + j]) * d;
    }
  }
}

void DequantizeRowQ4_0(const uint8_t* x, float* y, int64_t n) {
  const int64_t nb = n / kQK;
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* xb = x + i * kQ4Bytes;
    const float d = LoadScale(xb);
    for (int j = 0; j < kQK / 2; ++j) {
      const uint8_t q = xb[kQsOffset + j];
      y[i * kQK + j] = ((q & 0x0F) - 8) * d;
      y[i * kQK + j + kQK / 2] = ((q >> 4) - 8) * d;
    }
  }
}

// ---- The other block types (layouts in ggml_type.h). Every float operation is the one ggml's
// dequantize_row_* and gguf-py's numpy dequantizers perform, in the same order and without
// fused multiply-adds (this file is compiled for baseline x86-64), so the values are
// bit-identical to theirs.

inline uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Q4_1, Q5_0, Q5_1: element j < 16 is the low nibble of qs[j], j >= 16 the high nibble of
// qs[j - 16]; Q5 adds bit j of qh as bit 4.
template <bool kHasMin, bool kHasHigh>
void DequantizeRowLegacy(const uint8_t* x, float* y, int64_t n) {
  const int64_t qs_at = 2 + (kHasMin ? 2 : 0) + (kHasHigh ? 4 : 0);
  const int64_t block_bytes = qs_at + kQK / 2;
  for (int64_t i = 0; i < n / kQK; ++i) {
    const uint8_t* b = x + i * block_bytes;
    const float d = LoadScale(b);
    const float m = kHasMin ? LoadScale(b + 2) : 0.0f;
    const uint32_t qh = kHasHigh ? LoadU32(b + 2 + (kHasMin ? 2 : 0)) : 0;
    for (int j = 0; j < kQK; ++j) {
      const uint8_t byte = b[qs_at + j % 16];
      int q = j < 16 ? (byte & 0x0F) : (byte >> 4);
      if (kHasHigh) q |= static_cast<int>((qh >> j) & 1) << 4;
      float v;
      if (kHasMin) {
        v = d * static_cast<float>(q) + m;
      } else {
        v = d * static_cast<float>(q - (kHasHigh ? 16 : 8));
      }
      y[i * kQK + j] = v;
    }
  }
}

void DequantizeRowQ2_K(const uint8_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const uint8_t* b = x + i * 84;
    const uint8_t* scales = b;
    const uint8_t* qs = b + 16;
    const float d = LoadScale(b + 80), dmin = LoadScale(b + 82);
    float* out = y + i * kQK_K;
    for (int e = 0; e < kQK_K; ++e) {
      const int h = e / 128, s = (e % 128) / 32, l = e % 32;
      const int q = (qs[32 * h + l] >> (2 * s)) & 3;
      const uint8_t sc = scales[e / 16];
      const float dl = d * static_cast<float>(sc & 0x0F);
      const float ml = dmin * static_cast<float>(sc >> 4);
      out[e] = dl * static_cast<float>(q) - ml;
    }
  }
}

void DequantizeRowQ3_K(const uint8_t* x, float* y, int64_t n);

}  // namespace

// Q3_K's 16 six-bit scales: low four bits from bytes 0..7 (low nibbles first), the top two
// from bytes 8..11 (sub-block j uses bits 2 (j / 4) of byte 8 + j % 4).
int Q3KScale(const uint8_t* sc, int j) {
  const int low = j < 8 ? (sc[j] & 0x0F) : (sc[j - 8] >> 4);
  const int high = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | (high << 4)) - 32;
}

namespace {

void DequantizeRowQ3_K(const uint8_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const uint8_t* b = x + i * 110;
    const uint8_t* hmask = b;
    const uint8_t* qs = b + 32;
    const uint8_t* scales = b + 96;
    const float d = LoadScale(b + 108);
    float* out = y + i * kQK_K;
    for (int e = 0; e < kQK_K; ++e) {
      const int h = e / 128, s = (e % 128) / 32, l = e % 32;
      const int low = (qs[32 * h + l] >> (2 * s)) & 3;
      const int q = low - (((hmask[l] >> (e / 32)) & 1) ? 0 : 4);
      const float dl = d * static_cast<float>(Q3KScale(scales, e / 16));
      out[e] = dl * static_cast<float>(q);
    }
  }
}

}  // namespace

void Q4KScaleMin(const uint8_t* scales, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = scales[j] & 0x3F;
    *m = scales[j + 4] & 0x3F;
  } else {
    *sc = (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4);
    *m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
  }
}

int Iq4xsScale(const uint8_t* block, int j) {
  const uint16_t scales_h = static_cast<uint16_t>(block[2] | (block[3] << 8));
  const int low = (block[4 + j / 2] >> (4 * (j % 2))) & 0x0F;
  const int high = (scales_h >> (2 * j)) & 3;
  return (low | (high << 4)) - 32;
}

namespace {

// Q4_K and Q5_K (kHigh: qh adds bit 4).
template <bool kHigh>
void DequantizeRowQ45_K(const uint8_t* x, float* y, int64_t n) {
  const int64_t block_bytes = kHigh ? 176 : 144;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const uint8_t* b = x + i * block_bytes;
    const float d = LoadScale(b), dmin = LoadScale(b + 2);
    const uint8_t* scales = b + 4;
    const uint8_t* qh = b + 16;
    const uint8_t* qs = b + (kHigh ? 48 : 16);
    float* out = y + i * kQK_K;
    for (int sub = 0; sub < 8; ++sub) {
      int sc, m;
      Q4KScaleMin(scales, sub, &sc, &m);
      const float d1 = d * static_cast<float>(sc);
      const float m1 = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) {
        const int e = 32 * sub + l;
        int q = (qs[32 * (sub / 2) + l] >> (4 * (sub % 2))) & 0x0F;
        if (kHigh) q |= ((qh[l] >> sub) & 1) << 4;
        out[e] = d1 * static_cast<float>(q) - m1;
      }
    }
  }
}

void DequantizeRowQ6_K(const uint8_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const uint8_t* b = x + i * 210;
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
    const float d = LoadScale(b + 208);
    float* out = y + i * kQK_K;
    for (int e = 0; e < kQK_K; ++e) {
      const int h = e / 128, r = e % 128;
      const int low = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0F;
      const int high = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
      const int q = (low | (high << 4)) - 32;
      const float dl = d * static_cast<float>(scales[e / 16]);
      out[e] = dl * static_cast<float>(q);
    }
  }
}

void DequantizeRowQ8_K(const uint8_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const uint8_t* b = x + i * kQ8KBlockBytes;
    float d;
    std::memcpy(&d, b, sizeof d);
    for (int j = 0; j < kQK_K; ++j) {
      y[i * kQK_K + j] = d * static_cast<float>(static_cast<int8_t>(b[4 + j]));
    }
  }
}

}  // namespace

void QuantizeRowQ8_1(const float* x, uint8_t* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float* xb = x + i * kQK;
    uint8_t* yb = y + i * kQ8_1BlockBytes;
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) {
      const float a = std::fabs(xb[j]);
      amax = amax > a ? amax : a;  // ggml's MAX(), as in QuantizeRowQ8_0
    }
    const float d = amax / ((1 << 7) - 1);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int j = 0; j < kQK; ++j) {
      const int8_t q = SaturateToInt8(std::roundf(xb[j] * id));
      yb[4 + j] = static_cast<uint8_t>(q);
      sum += q;
    }
    StoreScale(yb, d);
    StoreScale(yb + 2, static_cast<float>(sum) * d);
  }
}

void QuantizeRowQ8_K(const float* x, uint8_t* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* xb = x + i * kQK_K;
    uint8_t* b = y + i * kQ8KBlockBytes;
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < kQK_K; ++j) {
      const float a = std::fabs(xb[j]);
      if (a > amax) {
        amax = a;
        max = xb[j];
      }
    }
    int8_t q[kQK_K] = {};
    float d = 0.0f;
    if (amax != 0.0f) {
      const float iscale = -127.0f / max;
      for (int j = 0; j < kQK_K; ++j) {
        q[j] = static_cast<int8_t>(std::min(127, NearestInt(iscale * xb[j])));
      }
      d = 1.0f / iscale;
    }
    std::memcpy(b, &d, sizeof d);
    std::memcpy(b + 4, q, kQK_K);
    for (int g = 0; g < kQK_K / 16; ++g) {
      int16_t sum = 0;
      for (int k = 0; k < 16; ++k) sum = static_cast<int16_t>(sum + q[16 * g + k]);
      std::memcpy(b + 4 + kQK_K + 2 * g, &sum, sizeof sum);
    }
  }
}

namespace {

void DequantizeRowIQ4_NL(const uint8_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i) {
    const uint8_t* b = x + i * 18;
    const float d = LoadScale(b);
    for (int j = 0; j < kQK / 2; ++j) {
      y[i * kQK + j] = d * static_cast<float>(kIq4nlValues[b[2 + j] & 0x0F]);
      y[i * kQK + j + 16] = d * static_cast<float>(kIq4nlValues[b[2 + j] >> 4]);
    }
  }
}

void DequantizeRowIQ4_XS(const uint8_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const uint8_t* b = x + i * 136;
    const float d = LoadScale(b);
    const uint8_t* qs = b + 8;
    for (int sub = 0; sub < 8; ++sub) {
      const float dl = d * static_cast<float>(Iq4xsScale(b, sub));
      float* out = y + i * kQK_K + 32 * sub;
      for (int j = 0; j < 16; ++j) {
        out[j] = dl * static_cast<float>(kIq4nlValues[qs[16 * sub + j] & 0x0F]);
        out[j + 16] = dl * static_cast<float>(kIq4nlValues[qs[16 * sub + j] >> 4]);
      }
    }
  }
}

// Rounds to nearest (ties to even) and saturates; NaN becomes 0, so any float row converts.
int32_t FloatToI32(float x) {
  if (std::isnan(x)) return 0;
  if (x >= 2147483647.0f) return std::numeric_limits<int32_t>::max();
  if (x <= -2147483648.0f) return std::numeric_limits<int32_t>::min();
  return static_cast<int32_t>(std::nearbyint(x));
}

void DequantizeRowF32(const uint8_t* x, float* y, int64_t n) {
  std::memcpy(y, x, static_cast<size_t>(n) * sizeof(float));
}
void QuantizeRowF32(const float* x, uint8_t* y, int64_t n) {
  std::memcpy(y, x, static_cast<size_t>(n) * sizeof(float));
}

// 16-bit floats and int32, element by element through the scalar conversions.
template <typename T, float (*ToFloat)(T)>
void DequantizeRowScalar(const uint8_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, x + sizeof(T) * i, sizeof(T));
    y[i] = ToFloat(v);
  }
}
template <typename T, T (*FromFloat)(float)>
void QuantizeRowScalar(const float* x, uint8_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T v = FromFloat(x[i]);
    std::memcpy(y + sizeof(T) * i, &v, sizeof(T));
  }
}
float I32ToFloat(int32_t v) { return static_cast<float>(v); }

// Every type's row conversions, one row per type; nullptr where a direction does not exist
// (Q8_K is an activation type: llama.cpp never stores weights in it, so it has no quantizer here).
struct RowCodec {
  GgmlType type;
  void (*dequantize)(const uint8_t* x, float* y, int64_t n);
  void (*quantize)(const float* x, uint8_t* y, int64_t n);
};
constexpr RowCodec kRowCodecs[] = {
    {GgmlType::kF32, DequantizeRowF32, QuantizeRowF32},
    {GgmlType::kF16, DequantizeRowScalar<uint16_t, Fp16ToFp32>,
     QuantizeRowScalar<uint16_t, Fp32ToFp16>},
    {GgmlType::kBF16, DequantizeRowScalar<uint16_t, Bf16ToFp32>,
     QuantizeRowScalar<uint16_t, Fp32ToBf16>},
    {GgmlType::kQ8_0, DequantizeRowQ8_0, QuantizeRowQ8_0},
    {GgmlType::kQ4_0, DequantizeRowQ4_0, QuantizeRowLegacy<false, false>},
    {GgmlType::kQ4_1, DequantizeRowLegacy<true, false>, QuantizeRowLegacy<true, false>},
    {GgmlType::kQ5_0, DequantizeRowLegacy<false, true>, QuantizeRowLegacy<false, true>},
    {GgmlType::kQ5_1, DequantizeRowLegacy<true, true>, QuantizeRowLegacy<true, true>},
    {GgmlType::kQ2_K, DequantizeRowQ2_K, QuantizeRowQ2_K},
    {GgmlType::kQ3_K, DequantizeRowQ3_K, QuantizeRowQ3_K},
    {GgmlType::kQ4_K, DequantizeRowQ45_K<false>, QuantizeRowQ45_K<false>},
    {GgmlType::kQ5_K, DequantizeRowQ45_K<true>, QuantizeRowQ45_K<true>},
    {GgmlType::kQ6_K, DequantizeRowQ6_K, QuantizeRowQ6_K},
    {GgmlType::kQ8_K, DequantizeRowQ8_K, nullptr},
    {GgmlType::kIQ4_NL, DequantizeRowIQ4_NL, QuantizeRowIQ4_NL},
    {GgmlType::kIQ4_XS, DequantizeRowIQ4_XS, QuantizeRowIQ4_XS},
    {GgmlType::kI32, DequantizeRowScalar<int32_t, I32ToFloat>,
     QuantizeRowScalar<int32_t, FloatToI32>},
};

const RowCodec* FindRowCodec(GgmlType type) {
  for (const RowCodec& c : kRowCodecs) {
    if (c.type == type) return &c;
  }
  return nullptr;
}

}  // namespace

bool HasDequantizer(GgmlType type) {
  const RowCodec* c = FindRowCodec(type);
  return c != nullptr && c->dequantize != nullptr;
}

bool HasQuantizer(GgmlType type) {
  const RowCodec* c = FindRowCodec(type);
  return c != nullptr && c->quantize != nullptr;
}

void DequantizeRow(GgmlType type, const void* src, float* dst, int64_t n) {
  if (n <= 0) return;  // empty rows may come with null pointers, which memcpy must not see
  const RowCodec* c = FindRowCodec(type);
  // Callers check HasDequantizer first; reaching here is a programming error.
  if (c == nullptr || c->dequantize == nullptr) std::abort();
  // Byte-wise loads inside: tensor data in a mapped file is only guaranteed the file's alignment.
  c->dequantize(static_cast<const uint8_t*>(src), dst, n);
}

void QuantizeRow(GgmlType type, const float* src, void* dst, int64_t n) {
  if (n <= 0) return;
  const RowCodec* c = FindRowCodec(type);
  // Callers check HasQuantizer first; reaching here is a programming error.
  if (c == nullptr || c->quantize == nullptr) std::abort();
  c->quantize(src, static_cast<uint8_t*>(dst), n);
}

}  // namespace thermocline
