#include "shared/runtime/forward.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "shared/kernels/attention.h"
#include "shared/kernels/matmul.h"
#include "shared/runtime/ops.h"
#include "shared/util/fp16.h"

namespace thermocline {
namespace {

// One query head attending over positions [first, n_pos) of one slot: the scores, gemma2's soft
// cap when set, the softmax and the mix of the value rows (shared/kernels/attention.h).
// rows: scratch for 2 * (n_pos - first) row pointers.
void AttendHead(const KvCache& kv, int64_t layer, int64_t slot, int64_t first, int64_t n_pos,
                int64_t kv_offset, int64_t head_dim, float scale, float softcap, const float* q,
                float* scores, const uint8_t** rows, float* out) {
  const int64_t n = n_pos - first;
  const int64_t offset_bytes = kv_offset * (kv.type() == GgmlType::kF16 ? 2 : 4);
  const uint8_t** k_rows = rows;
  const uint8_t** v_rows = rows + n;
  for (int64_t t = first; t < n_pos; ++t) {
    k_rows[t - first] = kv.key(layer, slot, t) + offset_bytes;
    v_rows[t - first] = kv.value(layer, slot, t) + offset_bytes;
  }
  AttentionScores(kv.type(), q, k_rows, n, head_dim, scale, scores);
  if (softcap > 0.0f) SoftCap(scores, n, softcap);
  Softmax(scores, n);
  AttentionMix(kv.type(), scores, v_rows, n, head_dim, out);
}

}  // namespace

ForwardPass::ForwardPass(const Model& model, KvCache& kv, ThreadPool& pool, FfnExecutor* ffn,
                         LinearExecutor* linear)
    : model_(model), kv_(kv), pool_(pool), ffn_(ffn), linear_(linear) {
  if (ffn_ == nullptr) {
    own_ffn_ = std::make_unique<DenseFfn>(model, pool);
    own_ffn_->set_linear(linear);
    ffn_ = own_ffn_.get();
  }
  const ModelConfig& c = model.config();
  rope_.head_dim = c.head_dim;
  rope_.rope_dim = c.rope_dim;
  rope_.neox = c.arch != nullptr && c.arch->rope == RopeStyle::kNeox;
  rope_.freq_factors = model.rope_freqs().empty() ? nullptr : model.rope_freqs().data();
  const RopeScaling& rs = c.rope_scaling;
  if (rs.kind != RopeScaling::Kind::kNone) rope_.freq_scale = 1.0f / rs.factor;
  if (rs.kind == RopeScaling::Kind::kYarn) {
    rope_.ext_factor = rs.ext_factor;
    rope_.attn_factor = rs.attn_factor;
    RopeYarnCorrDims(c.rope_dim, rs.original_context, c.rope_freq_base, rs.beta_fast,
                     rs.beta_slow, &rope_.corr_low, &rope_.corr_high);
  }
}

void ForwardPass::Norm(const std::vector<float>& w, const std::vector<float>& b, const float* x,
                       int64_t n, float* out) const {
  const ModelConfig& c = model_.config();
  const bool layer_norm = c.arch != nullptr && c.arch->norm == NormKind::kLayer;
  for (int64_t e = 0; e < n; ++e) {
    if (layer_norm) {
      LayerNorm(x + e * c.dim, w.data(), b.empty() ? nullptr : b.data(), c.dim, c.rms_eps,
                out + e * c.dim);
    } else {
      RmsNorm(x + e * c.dim, w.data(), c.dim, c.rms_eps, out + e * c.dim);
    }
  }
}

absl::Status ForwardPass::Validate(std::span<const BatchEntry> batch) const {
  if (batch.empty()) return absl::InvalidArgumentError("forward: empty batch");
  std::vector<int64_t> length(kv_.n_slots());
  for (int64_t s = 0; s < kv_.n_slots(); ++s) length[s] = kv_.length(s);
  for (size_t i = 0; i < batch.size(); ++i) {
    const BatchEntry& e = batch[i];
    if (e.slot < 0 || e.slot >= kv_.n_slots()) {
      return absl::InvalidArgumentError(absl::StrCat("forward: entry ", i, ": slot ", e.slot,
                                                     " is not in [0, ", kv_.n_slots(), ")"));
    }
    if (e.token < 0 || e.token >= model_.config().vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("forward: entry ", i, ": token ", e.token,
                                                     " is not in [0, ",
                                                     model_.config().vocab_size, ")"));
    }
    if (e.position < 0 || e.position >= kv_.capacity()) {
      return absl::OutOfRangeError(absl::StrCat("forward: entry ", i, ": position ", e.position,
                                                " is outside the KV cache capacity ",
                                                kv_.capacity()));
    }
    if (e.position >= kv_.mapped(e.slot)) {
      return absl::OutOfRangeError(absl::StrCat("forward: entry ", i, ": position ", e.position,
                                                " of slot ", e.slot, " has no KV block (its "
                                                "table maps ", kv_.mapped(e.slot), " positions)"));
    }
    if (e.position > length[e.slot]) {
      return absl::InvalidArgumentError(absl::StrCat("forward: entry ", i, ": position ",
                                                     e.position, " skips ahead of slot ", e.slot,
                                                     " which holds ", length[e.slot],
                                                     " positions"));
    }
    length[e.slot] = e.position + 1;
  }
  return absl::OkStatus();
}

void ForwardPass::Attention(int64_t layer, std::span<const BatchEntry> batch) {
  const ModelConfig& c = model_.config();
  const int64_t n = static_cast<int64_t>(batch.size());
  const int64_t group = c.n_heads / c.n_kv_heads;
  const int64_t cap = kv_.capacity();
  const int64_t window = c.layers.empty() ? 0 : c.layers[layer].sliding_window;
  scores_.resize(pool_.size() * cap);
  kv_rows_.resize(pool_.size() * 2 * cap);
  const bool f16 = kv_.type() == GgmlType::kF16;
  // (entry, head) jobs are claimed one at a time, so jobs of entries at different positions
  // (different costs) balance, and a thread the machine does not schedule holds up none. Their
  // cost is the K and V rows they read; a step that reads little runs on this thread alone.
  const int64_t n_jobs = n * c.n_heads;
  int64_t kv_rows = 0;
  for (const BatchEntry& entry : batch) {
    const int64_t n_pos = entry.position + 1;
    kv_rows += window > 0 ? std::min<int64_t>(n_pos, window) : n_pos;
  }
  const int64_t bytes = kv_rows * c.n_heads * 2 * c.head_dim * (f16 ? 2 : 4);
  pool_.ForEachPieceBytes(n_jobs, bytes, [&](int tid, int64_t job) {
    float* scores = scores_.data() + tid * cap;
    const int64_t e = job / c.n_heads, h = job % c.n_heads;
    const BatchEntry& entry = batch[e];
    const float* q = q_.data() + e * c.q_dim + h * c.head_dim;
    float* out = att_.data() + e * c.q_dim + h * c.head_dim;
    const int64_t kv_offset = (h / group) * c.head_dim;
    const int64_t n_pos = entry.position + 1;
    // A sliding-window layer sees the last `window` positions, itself included.
    const int64_t first = window > 0 ? std::max<int64_t>(0, n_pos - window) : 0;
    AttendHead(kv_, layer, entry.slot, first, n_pos, kv_offset, c.head_dim, c.attn_scale,
               c.attn_softcap, q, scores, kv_rows_.data() + tid * 2 * cap, out);
  });
}

void ForwardPass::Project(int64_t layer, Projection p, const MatrixView& w, const float* x,
                          int64_t n, int64_t x_stride, float* y, int64_t y_stride) {
  if (linear_ != nullptr) {
    linear_->Apply(layer, p, w, /*transposed=*/false, x, n, x_stride, y, y_stride);
  } else {
    MatMul(w, x, n, x_stride, y, y_stride, pool_);
  }
}

void ForwardPass::QkvAndRope(int64_t layer, std::span<const BatchEntry> batch, const float* in) {
  const ModelConfig& c = model_.config();
  const LayerWeights& w = model_.layer(layer);
  const int64_t n = static_cast<int64_t>(batch.size());
  Project(layer, Projection::kQ, w.wq, in, n, c.dim, q_.data(), c.q_dim);
  Project(layer, Projection::kK, w.wk, in, n, c.dim, k_.data(), c.kv_dim);
  Project(layer, Projection::kV, w.wv, in, n, c.dim, v_.data(), c.kv_dim);
  AddRowBias(w.bq, n, q_.data());
  AddRowBias(w.bk, n, k_.data());
  AddRowBias(w.bv, n, v_.data());
  // q/k norms: over the whole projection (olmo2) or per head (qwen3, gemma3), before RoPE.
  auto qk_norm = [&](const std::vector<float>& nw, float* x, int64_t width) {
    if (nw.empty()) return;
    const int64_t span = static_cast<int64_t>(nw.size());
    for (int64_t e = 0; e < n; ++e) {
      for (int64_t off = 0; off < width; off += span) {
        RmsNorm(x + e * width + off, nw.data(), span, c.rms_eps, x + e * width + off);
      }
    }
  };
  qk_norm(w.q_norm, q_.data(), c.q_dim);
  qk_norm(w.k_norm, k_.data(), c.kv_dim);
  RopeParams rope = rope_;
  rope.base = c.layers.empty() ? c.rope_freq_base : c.layers[layer].rope_freq_base;
  const bool plain = !rope.neox && rope.freq_factors == nullptr && rope.freq_scale == 1.0f &&
                     rope.ext_factor == 0.0f && rope.attn_factor == 1.0f;
  for (int64_t e = 0; e < n; ++e) {
    const BatchEntry& entry = batch[e];
    float* q = q_.data() + e * c.q_dim;
    float* k = k_.data() + e * c.kv_dim;
    if (plain) {  // run.c's rope, kept as the reference path for llama2.c's models
      Rope(q, c.n_heads, c.head_dim, c.rope_dim, entry.position, rope.base);
      Rope(k, c.n_kv_heads, c.head_dim, c.rope_dim, entry.position, rope.base);
    } else {
      RopeExt(q, c.n_heads, rope, entry.position);
      RopeExt(k, c.n_kv_heads, rope, entry.position);
    }
    kv_.Store(layer, entry.slot, entry.position, k, v_.data() + e * c.kv_dim);
  }
}

absl::Status ForwardPass::Stopped(std::vector<float>& logits) {
  logits.clear();
  return absl::OkStatus();
}

absl::Status ForwardPass::Run(std::span<const BatchEntry> batch, std::vector<float>& logits) {
  if (absl::Status s = Validate(batch); !s.ok()) return s;
  const ModelConfig& c = model_.config();
  const ArchSpec* arch = c.arch;
  const bool parallel = arch != nullptr && arch->parallel_block;
  const int64_t n = static_cast<int64_t>(batch.size());
  const int64_t dim = c.dim;
  x_.resize(n * dim);
  xb_.resize(n * dim);
  q_.resize(n * c.q_dim);
  k_.resize(n * c.kv_dim);
  v_.resize(n * c.kv_dim);
  att_.resize(n * c.q_dim);
  proj_.resize(n * dim);
  ffn_out_.resize(n * dim);
  if (linear_ != nullptr) {
    // A slot with one entry in the batch is decoding; one with several is taking a prompt.
    absl::flat_hash_map<int32_t, int> per_slot;
    for (const BatchEntry& e : batch) ++per_slot[e.slot];
    decode_.resize(n);
    for (int64_t e = 0; e < n; ++e) decode_[e] = per_slot[batch[e].slot] == 1 ? 1 : 0;
    linear_->BeginBatch(decode_);
  }

  const float embed_scale =
      arch != nullptr && arch->embed_scale ? std::sqrt(static_cast<float>(dim)) : 1.0f;
  for (int64_t e = 0; e < n; ++e) {
    DequantizeMatrixRow(model_.token_embd(), batch[e].token, x_.data() + e * dim);
    if (embed_scale != 1.0f) {
      for (int64_t i = 0; i < dim; ++i) x_[e * dim + i] *= embed_scale;
    }
  }
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = model_.layer(l);
    // Attention reads the pre-norm of x, or x itself in blocks without one (olmo2).
    const float* attn_in = x_.data();
    if (!w.attn_norm.empty()) {
      Norm(w.attn_norm, w.attn_norm_b, x_.data(), n, xb_.data());
      attn_in = xb_.data();
    }
    QkvAndRope(l, batch, attn_in);
    Attention(l, batch);
    Project(l, Projection::kO, w.wo, att_.data(), n, c.q_dim, proj_.data(), dim);
    AddRowBias(w.bo, n, proj_.data());
    if (!w.post_attn_norm.empty()) {
      for (int64_t e = 0; e < n; ++e) {
        RmsNorm(proj_.data() + e * dim, w.post_attn_norm.data(), dim, c.rms_eps,
                proj_.data() + e * dim);
      }
    }
    if (parallel) {
      // x += ffn(n(x)) + attn(n(x)) from the one norm; the predictors read x (falcon).
      ffn_->Compute(l, attn_in, x_.data(), n, ffn_out_.data());
      for (int64_t i = 0; i < n * dim; ++i) x_[i] += ffn_out_[i] + proj_[i];
      if (layer_observer_ && !layer_observer_(l, x_.data(), n)) return Stopped(logits);
      continue;
    }
    for (int64_t i = 0; i < n * dim; ++i) x_[i] += proj_[i];
    // x is now ffn_inp, what PowerInfer's llama-family predictors read.
    const float* ffn_in = x_.data();
    if (!w.ffn_norm.empty()) {
      Norm(w.ffn_norm, w.ffn_norm_b, x_.data(), n, xb_.data());
      ffn_in = xb_.data();
    }
    ffn_->Compute(l, ffn_in, x_.data(), n, ffn_out_.data());
    if (!w.post_ffn_norm.empty()) {
      for (int64_t e = 0; e < n; ++e) {
        RmsNorm(ffn_out_.data() + e * dim, w.post_ffn_norm.data(), dim, c.rms_eps,
                ffn_out_.data() + e * dim);
      }
    }
    for (int64_t i = 0; i < n * dim; ++i) x_[i] += ffn_out_[i];
    if (layer_observer_ && !layer_observer_(l, x_.data(), n)) return Stopped(logits);
  }
  for (const BatchEntry& e : batch) kv_.set_length(e.slot, e.position + 1);

  // Only the rows that want logits go through the final norm and the (large) output head.
  int64_t n_out = 0;
  for (int64_t e = 0; e < n; ++e) {
    if (!batch[e].want_logits) continue;
    std::copy(x_.begin() + e * dim, x_.begin() + (e + 1) * dim, proj_.begin() + n_out * dim);
    ++n_out;
  }
  Norm(model_.output_norm(), model_.output_norm_b(), proj_.data(), n_out, xb_.data());
  logits.resize(n_out * c.vocab_size);
  if (n_out > 0) {
    MatMul(model_.output(), xb_.data(), n_out, dim, logits.data(), c.vocab_size, pool_);
    if (c.final_softcap > 0.0f) SoftCap(logits.data(), n_out * c.vocab_size, c.final_softcap);
  }
  return absl::OkStatus();
}

}  // namespace thermocline
