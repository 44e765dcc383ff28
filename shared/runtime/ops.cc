#include "shared/runtime/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "shared/util/fp16.h"

namespace thermocline {

void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* out) {
  // Sixteen running sums, not one: a single float sum is a chain of n dependent adds (about 3 us
  // for a 2048-wide model, twice a layer, on the step's serial path), and without reassociation
  // the compiler cannot split it. Lane k sums x[i]^2 for i = k mod 16, in order; the lanes are
  // then added pairwise.
  constexpr int64_t kLanes = 16;
  float lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t k = 0; k < kLanes; ++k) lane[k] += x[i + k] * x[i + k];
  }
  for (int64_t k = 0; i < n; ++i, ++k) lane[k] += x[i] * x[i];
  for (int64_t width = kLanes / 2; width > 0; width /= 2) {
    for (int64_t k = 0; k < width; ++k) lane[k] += lane[k + width];
  }
  float ss = lane[0];
  ss /= static_cast<float>(n);
  ss += eps;
  ss = 1.0f / std::sqrt(ss);
  for (int64_t i = 0; i < n; ++i) out[i] = w[i] * (ss * x[i]);
}

void LayerNorm(const float* x, const float* w, const float* b, int64_t n, float eps, float* out) {
  float mean = 0.0f;
  for (int64_t i = 0; i < n; ++i) mean += x[i];
  mean /= static_cast<float>(n);
  float var = 0.0f;
  for (int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
  var /= static_cast<float>(n);
  const float scale = 1.0f / std::sqrt(var + eps);
  for (int64_t i = 0; i < n; ++i) {
    const float y = (x[i] - mean) * scale * w[i];
    out[i] = b != nullptr ? y + b[i] : y;
  }
}

void Rope(float* x, int64_t n_heads, int64_t head_dim, int64_t rope_dim, int64_t pos, float base) {
  for (int64_t i = 0; i < rope_dim; i += 2) {
    const float freq = 1.0f / std::pow(base, static_cast<float>(i) / static_cast<float>(rope_dim));
    const float val = static_cast<float>(pos) * freq;
    const float fcr = std::cos(val), fci = std::sin(val);
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + h * head_dim + i;
      const float v0 = v[0], v1 = v[1];
      v[0] = v0 * fcr - v1 * fci;
      v[1] = v0 * fci + v1 * fcr;
    }
  }
}

void RopeYarnCorrDims(int64_t rope_dim, int64_t original_context, float base, float beta_fast,
                      float beta_slow, float* low, float* high) {
  const float n_dims = static_cast<float>(rope_dim);
  auto corr_dim = [&](float n_rot) {
    return n_dims * std::log(static_cast<float>(original_context) / (n_rot * 2.0f * 3.14159265358979f)) /
           (2.0f * std::log(base));
  };
  *low = std::max(0.0f, std::floor(corr_dim(beta_fast)));
  *high = std::min(n_dims - 1.0f, std::ceil(corr_dim(beta_slow)));
}

void RopeAngles(const RopeParams& p, int64_t pos, float* cs) {
  for (int64_t i = 0; i < p.rope_dim; i += 2) {
    // The same theta as Rope (run.c's order), then llama.cpp's adjustments in its order.
    const float freq =
        1.0f / std::pow(p.base, static_cast<float>(i) / static_cast<float>(p.rope_dim));
    float theta_extrap = static_cast<float>(pos) * freq;
    if (p.freq_factors != nullptr) theta_extrap /= p.freq_factors[i / 2];
    float theta = p.freq_scale * theta_extrap;
    float mscale = p.attn_factor;
    if (p.ext_factor != 0.0f) {
      const float y =
          (static_cast<float>(i / 2) - p.corr_low) / std::max(0.001f, p.corr_high - p.corr_low);
      const float ramp = (1.0f - std::min(1.0f, std::max(0.0f, y))) * p.ext_factor;
      theta = theta * (1.0f - ramp) + theta_extrap * ramp;
      mscale *= 1.0f + 0.1f * std::log(1.0f / p.freq_scale);
    }
    cs[i] = std::cos(theta) * mscale;
    cs[i + 1] = std::sin(theta) * mscale;
  }
}

void ApplyRope(float* x, int64_t n_heads, const RopeParams& p, const float* cs) {
  // Head by head, the pairs in order: each loop is one pattern (NEOX's halves or NORM's
  // neighbours) over contiguous floats, which the compiler vectorizes; each value's arithmetic
  // is the same either way.
  const int64_t half = p.rope_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * p.head_dim;
    if (p.neox) {
      for (int64_t j = 0; j < half; ++j) {
        const float fcr = cs[2 * j], fci = cs[2 * j + 1];
        const float v0 = v[j], v1 = v[j + half];
        v[j] = v0 * fcr - v1 * fci;
        v[j + half] = v0 * fci + v1 * fcr;
      }
    } else {
      for (int64_t j = 0; j < half; ++j) {
        const float fcr = cs[2 * j], fci = cs[2 * j + 1];
        const float v0 = v[2 * j], v1 = v[2 * j + 1];
        v[2 * j] = v0 * fcr - v1 * fci;
        v[2 * j + 1] = v0 * fci + v1 * fcr;
      }
    }
  }
}

void RopeExt(float* x, int64_t n_heads, const RopeParams& p, int64_t pos) {
  std::vector<float> cs(p.rope_dim);
  RopeAngles(p, pos, cs.data());
  ApplyRope(x, n_heads, p, cs.data());
}

void Softmax(float* x, int64_t n) {
  float max_val = x[0];
  for (int64_t i = 1; i < n; ++i) max_val = x[i] > max_val ? x[i] : max_val;
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max_val);
    sum += x[i];
  }
  for (int64_t i = 0; i < n; ++i) x[i] /= sum;
}

void SoftCap(float* x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

namespace {

// ggml's table: the tanh GELU of every fp16 value, rounded to fp16.
const std::vector<uint16_t>& GeluTable() {
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t(1 << 16);
    for (uint32_t i = 0; i < t.size(); ++i) {
      const float x = Fp16ToFp32(static_cast<uint16_t>(i));
      const float y =
          0.5f * x * (1.0f + std::tanh(0.79788456080286535587989211986876f * x * (1.0f + 0.044715f * x * x)));
      t[i] = Fp32ToFp16(y);
    }
    return t;
  }();
  return table;
}

}  // namespace

float Gelu(float x) {
  if (x <= -10.0f) return 0.0f;
  if (x >= 10.0f) return x;
  return Fp16ToFp32(GeluTable()[Fp32ToFp16(x)]);
}

void GeluGlu(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) gate[i] = Gelu(gate[i]) * up[i];
}

namespace {

// All-ones when x > 0 (positive finite or +inf; not NaN, not +-0), else zero, from the bits: a
// float comparison under the condition of a select is one GCC will not if-convert (it may raise
// an invalid-operation flag), so the ReLU loops stayed scalar with an unpredictable branch per
// neuron, 1.5% of a dense ReLU decode step on its serial path. These integer masks vectorize.
inline uint32_t PositiveMask(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return 0u - static_cast<uint32_t>(b - 1u < 0x7f800000u);
}

// p where mask is all-ones, +0 where it is zero: the values `cond ? p : 0.0f` gives.
inline float Masked(float p, uint32_t mask) {
  uint32_t b;
  std::memcpy(&b, &p, sizeof b);
  b &= mask;
  std::memcpy(&p, &b, sizeof b);
  return p;
}

}  // namespace

void DreluGlu(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    gate[i] = Masked(gate[i] * up[i], PositiveMask(gate[i]) & PositiveMask(up[i]));
  }
}

void SwiGlu(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float v = gate[i];
    v *= 1.0f / (1.0f + std::exp(-v));
    gate[i] = v * up[i];
  }
}

void ReluGlu(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) gate[i] = Masked(gate[i] * up[i], PositiveMask(gate[i]));
}

}  // namespace thermocline
