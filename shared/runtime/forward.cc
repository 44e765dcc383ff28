#include "shared/runtime/forward.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "shared/kernels/attention.h"
#include "shared/kernels/matmul.h"
#include "shared/runtime/layer_program.h"
#include "shared/runtime/ops.h"
#include "shared/util/fp16.h"
#include "shared/util/status_macros.h"

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
  rope_ = ModelRope(model);
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

const float* ForwardPass::RopeAnglesFor(int64_t e, int64_t position, const RopeParams& rope) {
  // Everything but the base is the model's (rope_), so (base, position) names the angles.
  const size_t width = static_cast<size_t>(rope.rope_dim);
  if (rope.base != rope_angles_base_) {
    rope_angles_base_ = rope.base;
    std::fill(rope_angles_pos_.begin(), rope_angles_pos_.end(), -1);
  }
  if (rope_angles_pos_.size() <= static_cast<size_t>(e)) {
    rope_angles_pos_.resize(e + 1, -1);
    rope_angles_.resize((e + 1) * width);
  }
  float* cs = rope_angles_.data() + e * width;
  if (rope_angles_pos_[e] != position) {
    RopeAngles(rope, position, cs);
    rope_angles_pos_[e] = position;
  }
  return cs;
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

// The CPU's operations of the layer program (layer_program.h) over the pass's buffers.
class ForwardPass::Ops {
 public:
  Ops(ForwardPass& p, std::span<const BatchEntry> batch, std::vector<float>& logits)
      : p_(p),
        c_(p.model_.config()),
        batch_(batch),
        n_(static_cast<int64_t>(batch.size())),
        logits_(logits) {}

  absl::Status Embed(float scale) {
    const int64_t dim = c_.dim;
    for (int64_t e = 0; e < n_; ++e) {
      float* x = p_.x_.data() + e * dim;
      DequantizeMatrixRow(p_.model_.token_embd(), batch_[e].token, x);
      if (scale != 1.0f) {
        for (int64_t i = 0; i < dim; ++i) x[i] *= scale;
      }
    }
    return absl::OkStatus();
  }

  absl::Status Norm(int64_t l, NormWeights which, NormKind kind, Act in, Act out) {
    const LayerWeights& w = p_.model_.layer(l);
    const std::vector<float>* nw = &w.attn_norm;
    const std::vector<float>* nb = &w.attn_norm_b;
    switch (which) {
      case NormWeights::kAttn:
        break;
      case NormWeights::kFfn:
        nw = &w.ffn_norm;
        nb = &w.ffn_norm_b;
        break;
      case NormWeights::kPostAttn:
        nw = &w.post_attn_norm;
        nb = nullptr;
        break;
      case NormWeights::kPostFfn:
        nw = &w.post_ffn_norm;
        nb = nullptr;
        break;
      case NormWeights::kQ:
      case NormWeights::kK:
        return absl::InternalError("forward: a q/k norm is a HeadNorm");
    }
    NormRows(kind, *nw, nb, Buf(in), n_, Buf(out));
    return absl::OkStatus();
  }

  absl::Status Project(int64_t l, Projection p, Act in, Act out) {
    const LayerWeights& w = p_.model_.layer(l);
    const MatrixView* m = p == Projection::kQ   ? &w.wq
                          : p == Projection::kK ? &w.wk
                          : p == Projection::kV ? &w.wv
                                                : &w.wo;
    p_.Project(l, p, *m, Buf(in), n_, Width(in), Buf(out), Width(out));
    return absl::OkStatus();
  }

  // One region and one rounding of the input for all three (MatMulMany), or the linear
  // executor's (TEAL's) products of the one input.
  absl::Status ProjectQkv(int64_t l, Act in) {
    const LayerWeights& w = p_.model_.layer(l);
    const LinearExecutor::Output outs[] = {{Projection::kQ, &w.wq, Buf(Act::kQ), Width(Act::kQ)},
                                           {Projection::kK, &w.wk, Buf(Act::kK), Width(Act::kK)},
                                           {Projection::kV, &w.wv, Buf(Act::kV), Width(Act::kV)}};
    Products(p_.linear_, l, outs, Buf(in), n_, Width(in), p_.pool_);
    return absl::OkStatus();
  }

  absl::Status AddBias(int64_t l, Projection p, Act a) {
    const LayerWeights& w = p_.model_.layer(l);
    const std::vector<float>& b = p == Projection::kQ   ? w.bq
                                  : p == Projection::kK ? w.bk
                                  : p == Projection::kV ? w.bv
                                                        : w.bo;
    AddRowBias(b, n_, Buf(a));
    return absl::OkStatus();
  }

  absl::Status HeadNorm(int64_t l, NormWeights which, Act a) {
    const LayerWeights& w = p_.model_.layer(l);
    const std::vector<float>& nw = which == NormWeights::kQ ? w.q_norm : w.k_norm;
    const int64_t width = Width(a), span = static_cast<int64_t>(nw.size());
    float* x = Buf(a);
    for (int64_t e = 0; e < n_; ++e) {
      for (int64_t off = 0; off < width; off += span) {
        RmsNorm(x + e * width + off, nw.data(), span, c_.rms_eps, x + e * width + off);
      }
    }
    return absl::OkStatus();
  }

  absl::Status RopeAndStore(int64_t l) {
    RopeParams rope = p_.rope_;
    rope.base = LayerRopeBase(c_, l);
    for (int64_t e = 0; e < n_; ++e) {
      const BatchEntry& entry = batch_[e];
      float* q = p_.q_.data() + e * c_.q_dim;
      float* k = p_.k_.data() + e * c_.kv_dim;
      // With plain parameters this is run.c's Rope, bit for bit (ops.h).
      const float* cs = p_.RopeAnglesFor(e, entry.position, rope);
      ApplyRope(q, c_.n_heads, rope, cs);
      ApplyRope(k, c_.n_kv_heads, rope, cs);
      p_.kv_.Store(l, entry.slot, entry.position, k, p_.v_.data() + e * c_.kv_dim);
    }
    return absl::OkStatus();
  }

  absl::Status Attend(int64_t l, Act out) {
    if (out != Act::kAtt) return absl::InternalError("forward: attention writes kAtt");
    p_.Attention(l, batch_);
    return absl::OkStatus();
  }

  absl::Status Ffn(int64_t l, Act in, Act predictor_in, Act out) {
    p_.ffn_->Compute(l, Buf(in), Buf(predictor_in), n_, Buf(out));
    return absl::OkStatus();
  }

  absl::Status AddResidual(Act a) {
    float* x = p_.x_.data();
    const float* y = Buf(a);
    for (int64_t i = 0; i < n_ * c_.dim; ++i) x[i] += y[i];
    return absl::OkStatus();
  }
  absl::Status AddResidual(Act a, Act b) {
    float* x = p_.x_.data();
    const float* y = Buf(a);
    const float* z = Buf(b);
    for (int64_t i = 0; i < n_ * c_.dim; ++i) x[i] += y[i] + z[i];
    return absl::OkStatus();
  }

  absl::StatusOr<bool> LayerDone(int64_t l) {
    return !p_.layer_observer_ || p_.layer_observer_(l, p_.x_.data(), n_);
  }

  // Only the rows that want logits go through the final norm and the (large) output head.
  absl::Status Head(NormKind kind, float final_softcap) {
    const int64_t dim = c_.dim;
    int64_t n_out = 0;
    for (int64_t e = 0; e < n_; ++e) {
      if (!batch_[e].want_logits) continue;
      std::copy(p_.x_.begin() + e * dim, p_.x_.begin() + (e + 1) * dim,
                p_.proj_.begin() + n_out * dim);
      ++n_out;
    }
    NormRows(kind, p_.model_.output_norm(), &p_.model_.output_norm_b(), p_.proj_.data(), n_out,
             p_.xb_.data());
    logits_.resize(n_out * c_.vocab_size);
    if (n_out > 0) {
      MatMul(p_.model_.output(), p_.xb_.data(), n_out, dim, logits_.data(), c_.vocab_size,
             p_.pool_);
      if (final_softcap > 0.0f) SoftCap(logits_.data(), n_out * c_.vocab_size, final_softcap);
    }
    return absl::OkStatus();
  }

 private:
  float* Buf(Act a) {
    switch (a) {
      case Act::kX:
        return p_.x_.data();
      case Act::kNormed:
        return p_.xb_.data();
      case Act::kQ:
        return p_.q_.data();
      case Act::kK:
        return p_.k_.data();
      case Act::kV:
        return p_.v_.data();
      case Act::kAtt:
        return p_.att_.data();
      case Act::kAttnOut:
        return p_.proj_.data();
      case Act::kFfnOut:
        return p_.ffn_out_.data();
    }
    return nullptr;
  }
  int64_t Width(Act a) const { return ActWidth(c_, a); }
  // n rows of x normed into out; b (LayerNorm's bias) may be null or empty.
  void NormRows(NormKind kind, const std::vector<float>& w, const std::vector<float>* b,
                const float* x, int64_t n, float* out) const {
    const float* bias = b == nullptr || b->empty() ? nullptr : b->data();
    for (int64_t e = 0; e < n; ++e) {
      if (kind == NormKind::kLayer) {
        LayerNorm(x + e * c_.dim, w.data(), bias, c_.dim, c_.rms_eps, out + e * c_.dim);
      } else {
        RmsNorm(x + e * c_.dim, w.data(), c_.dim, c_.rms_eps, out + e * c_.dim);
      }
    }
  }

  ForwardPass& p_;
  const ModelConfig& c_;
  std::span<const BatchEntry> batch_;
  const int64_t n_;
  std::vector<float>& logits_;
};

void DecodeRows(std::span<const BatchEntry> batch, std::vector<uint8_t>& decode) {
  absl::flat_hash_map<int32_t, int> per_slot;
  for (const BatchEntry& e : batch) ++per_slot[e.slot];
  decode.resize(batch.size());
  for (size_t e = 0; e < batch.size(); ++e) decode[e] = per_slot[batch[e].slot] == 1 ? 1 : 0;
}

absl::Status ForwardPass::Run(std::span<const BatchEntry> batch, std::vector<float>& logits) {
  if (absl::Status s = Validate(batch); !s.ok()) return s;
  const ModelConfig& c = model_.config();
  const int64_t n = static_cast<int64_t>(batch.size());
  x_.resize(n * c.dim);
  xb_.resize(n * c.dim);
  q_.resize(n * c.q_dim);
  k_.resize(n * c.kv_dim);
  v_.resize(n * c.kv_dim);
  att_.resize(n * c.q_dim);
  proj_.resize(n * c.dim);
  ffn_out_.resize(n * c.dim);
  if (linear_ != nullptr) {
    DecodeRows(batch, decode_);
    linear_->BeginBatch(decode_);
  }
  if (start_layer_ < 0 || start_layer_ > c.n_layers) {
    return absl::InvalidArgumentError(absl::StrCat("forward: cannot start at block ", start_layer_,
                                                   " of a model with ", c.n_layers, " blocks"));
  }
  if (start_layer_ > 0) {
    const float* in = start_input_(n);
    if (in == nullptr) return absl::InvalidArgumentError("forward: no input for the start block");
    std::copy_n(in, n * c.dim, x_.data());
  }
  Ops ops(*this, batch, logits);
  TC_ASSIGN_OR_RETURN(const bool complete, RunModel(model_, ops, start_layer_));
  if (!complete) {
    // The layer observer ended the batch: no logits, the slots' lengths unchanged.
    logits.clear();
    return absl::OkStatus();
  }
  for (const BatchEntry& e : batch) kv_.set_length(e.slot, e.position + 1);
  return absl::OkStatus();
}

}  // namespace thermocline
