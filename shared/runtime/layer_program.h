// The transformer, written once: the sequence of operations of a whole step (embedding, every
// layer, the output head), with every architecture's choices (which norms a block has and where,
// biases, q/k norms, parallel or sequential attention and FFN, what the predictors read) taken
// from the model description (model.h) here and nowhere else. Each executor supplies the
// operations on its own buffers: the CPU forward pass (forward.cc, which the single-process
// engine, the split host backend and the offline tools run) and the cuda backend
// (gpu_worker/cuda/cuda_backend.cc). An executor decides how, never whether or in which order.
//
// An executor E provides (every call returns absl::Status unless said):
//   Embed(float scale)                          x = token embeddings * scale
//   Norm(layer, NormWeights which, NormKind kind, Act in, Act out)   in place when in == out
//   Project(layer, Projection p, Act in, Act out)   out = W_p in  (o)
//   ProjectQkv(layer, Act in)                   kQ, kK, kV = W_q in, W_k in, W_v in
//   AddBias(layer, Projection p, Act a)         a += b_p (called only when the layer has b_p)
//   HeadNorm(layer, NormWeights which, Act a)   RMSNorm of every span of |w| values of a
//   RopeAndStore(layer)                         RoPE on q and k, then k and v into the KV cache
//   Attend(layer, Act out)                      every query head over its slot's positions
//   Ffn(layer, Act in, Act predictor_in, Act out)   the FFN (dense, sparse or split)
//   AddResidual(Act a) / AddResidual(Act a, Act b)  x += a  /  x += a + b (one rounding of a+b)
//   absl::StatusOr<bool> LayerDone(layer)       false: stop the step here (calibration tools)
//   Head(NormKind kind, float final_softcap)    output norm and head for the rows that want logits
#pragma once

#include <cmath>
#include <concepts>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shared/model/arch.h"
#include "shared/model/model.h"
#include "shared/runtime/linear.h"
#include "shared/runtime/ops.h"
#include "shared/util/status_macros.h"

namespace thermocline {

// The activations of a step, [n rows][width] each; every executor maps them onto its buffers.
enum class Act {
  kX,        // the residual stream [dim]
  kNormed,   // the current pre-norm's output [dim] (attention's, then the FFN's)
  kQ,        // [q_dim]
  kK,        // [kv_dim]
  kV,        // [kv_dim]
  kAtt,      // the attention heads' outputs, before o [q_dim]
  kAttnOut,  // o's output (with its bias and post-norm) [dim]
  kFfnOut,   // the FFN's output (with its post-norm) [dim]
};

// Values per row of an activation.
inline int64_t ActWidth(const ModelConfig& c, Act a) {
  switch (a) {
    case Act::kQ:
    case Act::kAtt:
      return c.q_dim;
    case Act::kK:
    case Act::kV:
      return c.kv_dim;
    default:
      return c.dim;
  }
}

// Which of a layer's norm vectors (model.h LayerWeights) an operation uses.
enum class NormWeights { kAttn, kFfn, kPostAttn, kPostFfn, kQ, kK };

// What an executor provides (the list at the top of this file), so that one lacking an
// operation is named by the compiler at its RunModel call.
template <class E>
concept LayerExecutor = requires(E e, int64_t l, NormWeights w, NormKind k, Act a, Projection p,
                                 float f) {
  { e.Embed(f) } -> std::same_as<absl::Status>;
  { e.Norm(l, w, k, a, a) } -> std::same_as<absl::Status>;
  { e.Project(l, p, a, a) } -> std::same_as<absl::Status>;
  { e.ProjectQkv(l, a) } -> std::same_as<absl::Status>;
  { e.AddBias(l, p, a) } -> std::same_as<absl::Status>;
  { e.HeadNorm(l, w, a) } -> std::same_as<absl::Status>;
  { e.RopeAndStore(l) } -> std::same_as<absl::Status>;
  { e.Attend(l, a) } -> std::same_as<absl::Status>;
  { e.Ffn(l, a, a, a) } -> std::same_as<absl::Status>;
  { e.AddResidual(a) } -> std::same_as<absl::Status>;
  { e.AddResidual(a, a) } -> std::same_as<absl::Status>;
  { e.LayerDone(l) } -> std::same_as<absl::StatusOr<bool>>;
  { e.Head(k, f) } -> std::same_as<absl::Status>;
};

// The norm of the block's pre-norms and the output norm (post-norms and q/k norms are RMSNorm).
inline NormKind PreNormKind(const ModelConfig& c) {
  return c.arch != nullptr ? c.arch->norm : NormKind::kRms;
}

inline float EmbeddingScale(const ModelConfig& c) {
  return c.arch != nullptr && c.arch->embed_scale ? std::sqrt(static_cast<float>(c.dim)) : 1.0f;
}

// The model's RoPE (ops.h RopeExt's parameters; base and position are set per layer and entry).
// freq_factors points into the model (rope_freqs.weight), so a device executor substitutes its
// own copy.
inline RopeParams ModelRope(const Model& model) {
  const ModelConfig& c = model.config();
  RopeParams rope;
  rope.head_dim = c.head_dim;
  rope.rope_dim = c.rope_dim;
  rope.neox = c.arch != nullptr && c.arch->rope == RopeStyle::kNeox;
  rope.freq_factors = model.rope_freqs().empty() ? nullptr : model.rope_freqs().data();
  const RopeScaling& rs = c.rope_scaling;
  if (rs.kind != RopeScaling::Kind::kNone) rope.freq_scale = 1.0f / rs.factor;
  if (rs.kind == RopeScaling::Kind::kYarn) {
    rope.ext_factor = rs.ext_factor;
    rope.attn_factor = rs.attn_factor;
    RopeYarnCorrDims(c.rope_dim, rs.original_context, c.rope_freq_base, rs.beta_fast, rs.beta_slow,
                     &rope.corr_low, &rope.corr_high);
  }
  return rope;
}

// The RoPE base of layer l (gemma3's local layers have their own).
inline float LayerRopeBase(const ModelConfig& c, int64_t l) {
  return c.layers.empty() ? c.rope_freq_base : c.layers[l].rope_freq_base;
}

// One block.
template <LayerExecutor E>
absl::Status RunLayer(const ModelConfig& c, const LayerWeights& w, int64_t l, E& e) {
  const NormKind pre = PreNormKind(c);
  // Attention reads the pre-norm of x, or x itself in blocks without one (olmo2).
  Act attn_in = Act::kX;
  if (!w.attn_norm.empty()) {
    TC_RETURN_IF_ERROR(e.Norm(l, NormWeights::kAttn, pre, Act::kX, Act::kNormed));
    attn_in = Act::kNormed;
  }
  TC_RETURN_IF_ERROR(e.ProjectQkv(l, attn_in));
  if (!w.bq.empty()) TC_RETURN_IF_ERROR(e.AddBias(l, Projection::kQ, Act::kQ));
  if (!w.bk.empty()) TC_RETURN_IF_ERROR(e.AddBias(l, Projection::kK, Act::kK));
  if (!w.bv.empty()) TC_RETURN_IF_ERROR(e.AddBias(l, Projection::kV, Act::kV));
  // q/k norms: over the whole projection (olmo2) or per head (qwen3, gemma3), before RoPE.
  if (!w.q_norm.empty()) TC_RETURN_IF_ERROR(e.HeadNorm(l, NormWeights::kQ, Act::kQ));
  if (!w.k_norm.empty()) TC_RETURN_IF_ERROR(e.HeadNorm(l, NormWeights::kK, Act::kK));
  // Every entry's keys are stored before any entry attends, so an entry sees the earlier
  // positions of its own slot, including those earlier in the same batch.
  TC_RETURN_IF_ERROR(e.RopeAndStore(l));
  TC_RETURN_IF_ERROR(e.Attend(l, Act::kAtt));
  TC_RETURN_IF_ERROR(e.Project(l, Projection::kO, Act::kAtt, Act::kAttnOut));
  if (!w.bo.empty()) TC_RETURN_IF_ERROR(e.AddBias(l, Projection::kO, Act::kAttnOut));
  if (!w.post_attn_norm.empty()) {
    TC_RETURN_IF_ERROR(
        e.Norm(l, NormWeights::kPostAttn, NormKind::kRms, Act::kAttnOut, Act::kAttnOut));
  }
  if (c.arch != nullptr && c.arch->parallel_block) {
    // x += ffn(n(x)) + attn(n(x)) from the one norm; the predictors read the layer's input x
    // (falcon: PredictorInput::kLayerInput).
    TC_RETURN_IF_ERROR(e.Ffn(l, attn_in, Act::kX, Act::kFfnOut));
    return e.AddResidual(Act::kFfnOut, Act::kAttnOut);
  }
  TC_RETURN_IF_ERROR(e.AddResidual(Act::kAttnOut));
  // x is now ffn_inp, what PowerInfer's llama-family predictors read (kFfnInput).
  Act ffn_in = Act::kX;
  if (!w.ffn_norm.empty()) {
    TC_RETURN_IF_ERROR(e.Norm(l, NormWeights::kFfn, pre, Act::kX, Act::kNormed));
    ffn_in = Act::kNormed;
  }
  TC_RETURN_IF_ERROR(e.Ffn(l, ffn_in, Act::kX, Act::kFfnOut));
  if (!w.post_ffn_norm.empty()) {
    TC_RETURN_IF_ERROR(
        e.Norm(l, NormWeights::kPostFfn, NormKind::kRms, Act::kFfnOut, Act::kFfnOut));
  }
  return e.AddResidual(Act::kFfnOut);
}

// A whole step, or its blocks from `first_layer` on when the executor's residual stream already
// holds that block's input (calibration, docs/sparsity.md). Returns false when the executor's
// LayerDone stopped it before the head.
template <LayerExecutor E>
absl::StatusOr<bool> RunModel(const Model& model, E& e, int64_t first_layer = 0) {
  const ModelConfig& c = model.config();
  if (first_layer == 0) TC_RETURN_IF_ERROR(e.Embed(EmbeddingScale(c)));
  for (int64_t l = first_layer; l < c.n_layers; ++l) {
    TC_RETURN_IF_ERROR(RunLayer(c, model.layer(l), l, e));
    TC_ASSIGN_OR_RETURN(const bool go_on, e.LayerDone(l));
    if (!go_on) return false;
  }
  TC_RETURN_IF_ERROR(e.Head(PreNormKind(c), c.final_softcap));
  return true;
}

}  // namespace thermocline
