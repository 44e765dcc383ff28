// Launchers of the CUDA backend's own kernels (kernels.cu). This header is plain C++17 with POD
// arguments so that kernels.cu needs no Abseil and the .cc files that call it need no nvcc; each
// launcher only enqueues on `stream` and returns the launch's cudaError_t (the caller turns it
// into a Status naming the kernel, cuda_check.h).
//
// Conventions: matrices are row-major; "rows" are batch entries; half values travel as their
// IEEE bits in uint16_t (the .cu file reinterprets them as __half).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace thermocline::gpu_worker::cuda {

// out[r][i] = w[i] * (x[src][i] / sqrt(mean(x[src]^2) + eps)), src = row_map ? row_map[r] : r;
// out_half (optional) receives the same values as fp16 for the next cuBLAS product.
cudaError_t LaunchRmsNorm(const float* x, const float* w, const int32_t* row_map, int64_t rows,
                          int64_t n, float eps, float* out, uint16_t* out_half,
                          cudaStream_t stream);

// LayerNorm as ops.h: out[r][i] = w[i] * (x[src][i] - mean) / sqrt(var + eps) + b[i] (b may be
// null), src = row_map ? row_map[r] : r; out_half as LaunchRmsNorm's. In place when out == x.
cudaError_t LaunchLayerNorm(const float* x, const float* w, const float* b, const int32_t* row_map,
                            int64_t rows, int64_t n, float eps, float* out, uint16_t* out_half,
                            cudaStream_t stream);

// y[r][i] += b[i] for r < rows, i < n.
cudaError_t LaunchAddBias(float* y, const float* b, int64_t rows, int64_t n, cudaStream_t stream);

// out[i] = fp16(relu ? max(x[i], 0) : x[i]) for i < n.
cudaError_t LaunchToHalf(const float* x, int64_t n, bool relu, uint16_t* out, cudaStream_t stream);

// RoPE as ops.h's RopeExt (llama.cpp's adjustments: frequency factors, linear and YaRN scaling;
// pairs adjacent or NeoX-style), with the same float operations in the same order.
struct RopeDesc {
  int64_t head_dim = 0, rope_dim = 0;
  bool neox = false;
  float base = 10000.0f;
  float freq_scale = 1.0f;
  float ext_factor = 0.0f;
  float attn_factor = 1.0f;
  float corr_low = 0.0f, corr_high = 0.0f;
  const float* freq_factors = nullptr;  // device, rope_dim / 2 values, or null
};
// Rotates the first rope_dim dims of each head of row r (x + r * row_stride) at positions[r].
cudaError_t LaunchRopeExt(float* x, int64_t rows, int64_t row_stride, int64_t n_heads,
                          const RopeDesc& rope, const int32_t* positions, cudaStream_t stream);
// The unscaled adjacent-pair RoPE of ops.h's Rope (LaunchRopeExt with the defaults).
cudaError_t LaunchRope(float* x, int64_t rows, int64_t row_stride, int64_t n_heads,
                       int64_t head_dim, int64_t rope_dim, const int32_t* positions, float base,
                       cudaStream_t stream);

// The device KV cache: per layer, slot and position one kv_dim row of keys (values), f32 or
// fp16, laid out as shared/runtime/kv_cache.h's host cache.
struct KvDesc {
  void* k = nullptr;
  void* v = nullptr;
  bool f16 = false;
  int64_t n_slots = 0, capacity = 0, kv_dim = 0;
};

// Stores row r of k and v ([rows][kv_dim]) at (layer, slots[r], positions[r]).
cudaError_t LaunchKvStore(const KvDesc& kv, int64_t layer, const float* k, const float* v,
                          const int32_t* slots, const int32_t* positions, int64_t rows,
                          cudaStream_t stream);

// Attention with grouped-query heads: row r's query heads q[r][h * head_dim ..] attend over
// positions [first, positions[r]] of slot slots[r] (kv head h / (n_heads / n_kv_heads)), first
// = 0, or positions[r] + 1 - window when window > 0 (sliding-window layers). Scores are
// (q . k) * scale, then softcap * tanh(s / softcap) when softcap > 0 (gemma2), then softmax.
// scores: scratch of rows * n_heads * kv.capacity floats. out: [rows][n_heads * head_dim].
struct AttentionDesc {
  int64_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float scale = 1.0f;
  float softcap = 0.0f;
  int64_t window = 0;
};
cudaError_t LaunchAttention(const KvDesc& kv, int64_t layer, const float* q, const int32_t* slots,
                            const int32_t* positions, int64_t rows, const AttentionDesc& att,
                            float* scores, float* out, cudaStream_t stream);

// The predictor's decision for each row: neuron i is predicted active when
// scores[r][i] >= threshold. Active hot neurons (hot_slot[i] >= 0) go to
// hot_idx[r * ffn + ..] as their compact hot index, active cold ones to cold_ids[r * ffn + ..]
// as global ids, ascending (the CPU worker requires ascending ids); counts per row.
cudaError_t LaunchPredictSelect(const float* scores, int64_t rows, int64_t ffn, float threshold,
                                const int32_t* hot_slot, int32_t* hot_idx, int32_t* hot_count,
                                int32_t* cold_ids, int32_t* cold_count, cudaStream_t stream);

// Packs the per-row cold lists (row r at cold_ids + r * stride) into packed[] back to back and
// writes row_end[r] = the end of row r's list (ColdRequest's layout).
cudaError_t LaunchPackCold(const int32_t* cold_ids, const int32_t* cold_count, int64_t rows,
                           int64_t stride, int32_t* packed, uint32_t* row_end,
                           cudaStream_t stream);

// Storage of weight rows on the device: fp16 (F32/F16/BF16 models, or hot gate and up rows of
// two different types) or the model's own blocks (block_decode.h decodes them).
enum class WeightFormat : int {
  kF16 = 0,
  kQ8_0,
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ2_K,
  kQ3_K,
  kQ4_K,
  kQ5_K,
  kQ6_K,
  kIQ4_NL,
  kIQ4_XS,
};

// The activation of the hot FFN: arch.h's FfnActivation by the same numbers (cuda_backend.cc
// asserts it); GELU through ggml's fp16 rounding, as ops.h's Gelu.
enum class HotAct : int { kSilu = 0, kRelu = 1, kGelu = 2, kDrelu = 3 };

// The sparse hot FFN of one layer for `rows` rows (neuron_ffn.h's arithmetic):
//   candidates of row r: idx[r * idx_stride + k] for k < count(r), compact hot row numbers,
//   count(r) = counts ? counts[r] : fixed_count (at most max_count);
//   gated: g = gate_k . h_r; a = act(g); u = up_k . h_r + up_b[k]; c = a * u (dReLU: a * relu(u));
//   not gated (gate null): g = up_k . h_r + up_b[k]; c = a = act(g);
//   filter (0 none, 1 a > 0, 2 |a| >= cut); c dropped when coeff_cut > 0 and |c| < coeff_cut;
//   with row_cut set, (cut, coeff_cut) are row_cut[2n], row_cut[2n + 1] for hot row n instead
//   (MoE under threshold: each expert's own cuts, and 0 / 0 for the shared expert's rows);
//   then c *= scale[r * idx_stride + k] when scale is set (MoE: the router's weight of the
//   candidate's expert, or the shared expert's gate);
//   y[r] = sum_k c_k down_k (y is overwritten). up_b may be null (no bias).
// coeff: scratch of rows * max_count floats. stats[0] += neurons that passed the filter,
// stats[1] += candidates (for the worker's metrics); stats may be null.
struct HotFfnArgs {
  WeightFormat weights = WeightFormat::kF16;  // gate and up rows
  WeightFormat down_weights = WeightFormat::kF16;
  const uint8_t* gate = nullptr;  // null: an FFN without a gate
  const uint8_t* up = nullptr;
  const uint8_t* down = nullptr;  // one row per neuron (ffn_down_t)
  const float* up_b = nullptr;    // [n_hot], compact like the rows, or null
  int64_t row_bytes = 0;          // of a gate or up row
  int64_t down_row_bytes = 0;
  int64_t dim = 0;  // a multiple of the types' block sizes (32, or 256 for K-quants and IQ4_XS)
  HotAct act = HotAct::kSilu;
  int filter = 0;
  float cut = 0.0f;
  float coeff_cut = 0.0f;
  const float* row_cut = nullptr;  // [n_hot][2], or null: cut and coeff_cut for every row
  const int32_t* idx = nullptr;
  int64_t idx_stride = 0;
  const float* scale = nullptr;  // laid out as idx, or null
  const int32_t* counts = nullptr;
  int32_t fixed_count = 0;
  int64_t max_count = 0;
  const float* h = nullptr;
  int64_t rows = 0;
  float* coeff = nullptr;
  uint32_t* stats = nullptr;
  float* y = nullptr;
};
cudaError_t LaunchHotFfn(const HotFfnArgs& args, cudaStream_t stream);

// A dense matrix in the model's own blocks (format != kF16; rows of row_bytes):
// y[t * ldy + r] = sum_c W[r][c] x[t * cols + c] for r < rows, t < n, with f32 x: decode-sized
// products (one warp per row, every token per warp, so a row is read from memory once).
cudaError_t LaunchBlockGemv(WeightFormat format, const uint8_t* w, int64_t row_bytes, int64_t rows,
                            int64_t cols, const float* x, int64_t n, float* y, int64_t ldy,
                            cudaStream_t stream);
// The same rows as fp16, out[r * cols + c] = fp16(W[r][c]) for r < rows, for prompt-sized
// products through cuBLAS.
cudaError_t LaunchBlockToHalf(WeightFormat format, const uint8_t* w, int64_t row_bytes,
                              int64_t rows, int64_t cols, uint16_t* out, cudaStream_t stream);

// x[i] += y_hot[i] + y_cold[i] (y_cold may be null: x[i] += y_hot[i]) for i < n: the residual
// adds of the layer program, and the cold partial's add to the hot one.
cudaError_t LaunchMerge(float* x, const float* y_hot, const float* y_cold, int64_t n,
                        cudaStream_t stream);

}  // namespace thermocline::gpu_worker::cuda
