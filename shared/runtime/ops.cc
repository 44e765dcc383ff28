#include "shared/runtime/ops.h"

#include <cmath>

namespace thermocline {

void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* out) {
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  ss /= static_cast<float>(n);
  ss += eps;
  ss = 1.0f / std::sqrt(ss);
  for (int64_t i = 0; i < n; ++i) out[i] = w[i] * (ss * x[i]);
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

void SwiGlu(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float v = gate[i];
    v *= 1.0f / (1.0f + std::exp(-v));
    gate[i] = v * up[i];
  }
}

void ReluGlu(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) gate[i] = gate[i] > 0.0f ? gate[i] * up[i] : 0.0f;
}

}  // namespace thermocline
