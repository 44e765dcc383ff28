// Elementwise pieces of the transformer forward pass. The llama pieces follow llama2.c's run.c
// (RoPE in its arithmetic order; RmsNorm's sum of squares in 16 running sums instead of one, a
// different rounding well inside the reference tests' bounds); the others follow ggml's
// definitions (llama.cpp's references).
#pragma once

#include <cstdint>

namespace thermocline {

// out[i] = w[i] * (x[i] / sqrt(mean(x^2) + eps)), the squares summed in 16 lanes (lane k takes
// i = k mod 16, in order) folded pairwise. out may alias x.
void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* out);

// out[i] = w[i] * (x[i] - mean) / sqrt(var + eps) + b[i] (ggml_norm, then weight and bias;
// b may be null). out may alias x.
void LayerNorm(const float* x, const float* w, const float* b, int64_t n, float eps, float* out);

// Rotates adjacent pairs (x[2j], x[2j+1]) of the first rope_dim dims of each of n_heads heads
// by pos * base^(-2j / rope_dim) (ggml's "NORM" rope, as in run.c). The forward pass rotates
// through RopeAngles and ApplyRope below, which equal it bit for bit; Rope stays as run.c's
// formula written out, the reference the host and CUDA tests compare against.
void Rope(float* x, int64_t n_heads, int64_t head_dim, int64_t rope_dim, int64_t pos, float base);

// RoPE with everything llama.cpp applies (ggml_rope_ext): NORM or NEOX pairing, per-frequency
// divisors (rope_freqs), linear scaling and YaRN. With no scaling and no divisors, NORM pairing
// is bit-identical to Rope above.
struct RopeParams {
  int64_t head_dim = 0;
  int64_t rope_dim = 0;
  float base = 10000.0f;
  bool neox = false;                     // pairs (j, j + rope_dim/2) instead of (2j, 2j+1)
  const float* freq_factors = nullptr;   // [rope_dim / 2] divisors of theta, or null
  float freq_scale = 1.0f;               // 1 / scaling factor
  float ext_factor = 0.0f;               // YaRN: > 0 mixes extrapolated theta in
  float attn_factor = 1.0f;
  float corr_low = 0.0f, corr_high = 0.0f;  // YaRN ramp, from RopeYarnCorrDims
};
void RopeExt(float* x, int64_t n_heads, const RopeParams& p, int64_t pos);

// RoPE in two steps, for callers that rotate many rows at one position (every layer of a decode
// step shares its angles unless the layers' bases differ): RopeAngles writes the rope_dim / 2
// (cos, sin) pairs, cs[2j] and cs[2j + 1], that RopeExt computes for pos; ApplyRope rotates with
// them. RopeExt(x, n, p, pos) is ApplyRope(x, n, p, RopeAngles(p, pos)) bit for bit, and so is
// Rope for plain parameters.
void RopeAngles(const RopeParams& p, int64_t pos, float* cs);
void ApplyRope(float* x, int64_t n_heads, const RopeParams& p, const float* cs);
// ggml_rope_yarn_corr_dims: the dimension range over which YaRN ramps from extrapolation to
// interpolation.
void RopeYarnCorrDims(int64_t rope_dim, int64_t original_context, float base, float beta_fast,
                      float beta_slow, float* low, float* high);

// In-place softmax over x[0..n).
void Softmax(float* x, int64_t n);

// x[i] = cap * tanh(x[i] / cap) (gemma2's soft-capping).
void SoftCap(float* x, int64_t n, float cap);

// GELU (tanh approximation) as ggml's CPU backend computes it: through a table of fp16 inputs
// to fp16 outputs for |x| < 10 (y = f16(gelu(f16(x)))), x itself above 10 and 0 below -10.
// llama.cpp's logits depend on that rounding (up to ~1e-3 on gemma2 vs the exact function).
float Gelu(float x);

// gate[i] = act(gate[i]) * up[i] with act = silu, relu or gelu; DreluGlu uses relu(up[i]).
void SwiGlu(float* gate, const float* up, int64_t n);
void ReluGlu(float* gate, const float* up, int64_t n);
void GeluGlu(float* gate, const float* up, int64_t n);
void DreluGlu(float* gate, const float* up, int64_t n);

}  // namespace thermocline
