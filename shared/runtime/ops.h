// Elementwise pieces of the transformer forward pass, in the arithmetic order of llama2.c's
// run.c so that fp32 results match the reference logits closely.
#pragma once

#include <cstdint>

namespace thermocline {

// out[i] = w[i] * (x[i] / sqrt(mean(x^2) + eps)).
void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* out);

// Rotates adjacent pairs (x[2j], x[2j+1]) of the first rope_dim dims of each of n_heads heads
// by pos * base^(-2j / rope_dim) (ggml's "NORM" rope, as in run.c).
void Rope(float* x, int64_t n_heads, int64_t head_dim, int64_t rope_dim, int64_t pos, float base);

// In-place softmax over x[0..n).
void Softmax(float* x, int64_t n);

// gate[i] = act(gate[i]) * up[i] with act = silu or relu.
void SwiGlu(float* gate, const float* up, int64_t n);
void ReluGlu(float* gate, const float* up, int64_t n);

}  // namespace thermocline
