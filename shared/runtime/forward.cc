#include "shared/runtime/forward.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "shared/runtime/ops.h"
#include "shared/util/fp16.h"

namespace thermocline {
namespace {

// Loads element i of a cached key/value row stored as T (float or fp16 bits).
inline float LoadKv(const float* p, int64_t i) { return p[i]; }
inline float LoadKv(const uint16_t* p, int64_t i) { return Fp16ToFp32(p[i]); }

// One query head attending over positions [0, n_pos) of one slot: scores in run.c's order.
template <typename T>
void AttendHead(const KvCache& kv, int64_t layer, int64_t slot, int64_t n_pos, int64_t kv_offset,
                int64_t head_dim, const float* q, float* scores, float* out) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  for (int64_t t = 0; t < n_pos; ++t) {
    const T* k = reinterpret_cast<const T*>(kv.key(layer, slot, t)) + kv_offset;
    float s = 0.0f;
    for (int64_t i = 0; i < head_dim; ++i) s += q[i] * LoadKv(k, i);
    scores[t] = s * scale;
  }
  Softmax(scores, n_pos);
  std::memset(out, 0, head_dim * sizeof(float));
  for (int64_t t = 0; t < n_pos; ++t) {
    const T* v = reinterpret_cast<const T*>(kv.value(layer, slot, t)) + kv_offset;
    const float a = scores[t];
    for (int64_t i = 0; i < head_dim; ++i) out[i] += a * LoadKv(v, i);
  }
}

}  // namespace

ForwardPass::ForwardPass(const LlamaModel& model, KvCache& kv, ThreadPool& pool, FfnExecutor* ffn)
    : model_(model), kv_(kv), pool_(pool), ffn_(ffn) {
  if (ffn_ == nullptr) {
    own_ffn_ = std::make_unique<DenseFfn>(model, pool);
    ffn_ = own_ffn_.get();
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
  const LlamaConfig& c = model_.config();
  const int64_t n = static_cast<int64_t>(batch.size());
  const int64_t group = c.n_heads / c.n_kv_heads;
  const int64_t cap = kv_.capacity();
  scores_.resize(pool_.size() * cap);
  const bool f16 = kv_.type() == GgmlType::kF16;
  pool_.Run([&](int tid, int nth) {
    float* scores = scores_.data() + tid * cap;
    for (int64_t job = tid; job < n * c.n_heads; job += nth) {
      const int64_t e = job / c.n_heads, h = job % c.n_heads;
      const BatchEntry& entry = batch[e];
      const float* q = q_.data() + e * c.dim + h * c.head_dim;
      float* out = att_.data() + e * c.dim + h * c.head_dim;
      const int64_t kv_offset = (h / group) * c.head_dim;
      if (f16) {
        AttendHead<uint16_t>(kv_, layer, entry.slot, entry.position + 1, kv_offset, c.head_dim,
                             q, scores, out);
      } else {
        AttendHead<float>(kv_, layer, entry.slot, entry.position + 1, kv_offset, c.head_dim, q,
                          scores, out);
      }
    }
  });
}

absl::Status ForwardPass::Run(std::span<const BatchEntry> batch, std::vector<float>& logits) {
  if (absl::Status s = Validate(batch); !s.ok()) return s;
  const LlamaConfig& c = model_.config();
  const int64_t n = static_cast<int64_t>(batch.size());
  const int64_t dim = c.dim, kvd = c.kv_dim;
  x_.resize(n * dim);
  xb_.resize(n * dim);
  q_.resize(n * dim);
  k_.resize(n * kvd);
  v_.resize(n * kvd);
  att_.resize(n * dim);
  proj_.resize(n * dim);

  for (int64_t e = 0; e < n; ++e) {
    DequantizeMatrixRow(model_.token_embd(), batch[e].token, x_.data() + e * dim);
  }
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = model_.layer(l);
    for (int64_t e = 0; e < n; ++e) {
      RmsNorm(x_.data() + e * dim, w.attn_norm.data(), dim, c.rms_eps, xb_.data() + e * dim);
    }
    MatMul(w.wq, xb_.data(), n, dim, q_.data(), dim, pool_);
    MatMul(w.wk, xb_.data(), n, dim, k_.data(), kvd, pool_);
    MatMul(w.wv, xb_.data(), n, dim, v_.data(), kvd, pool_);
    for (int64_t e = 0; e < n; ++e) {
      const BatchEntry& entry = batch[e];
      Rope(q_.data() + e * dim, c.n_heads, c.head_dim, c.rope_dim, entry.position,
           c.rope_freq_base);
      Rope(k_.data() + e * kvd, c.n_kv_heads, c.head_dim, c.rope_dim, entry.position,
           c.rope_freq_base);
      kv_.Store(l, entry.slot, entry.position, k_.data() + e * kvd, v_.data() + e * kvd);
    }
    Attention(l, batch);
    MatMul(w.wo, att_.data(), n, dim, proj_.data(), dim, pool_);
    for (int64_t i = 0; i < n * dim; ++i) x_[i] += proj_[i];
    for (int64_t e = 0; e < n; ++e) {
      RmsNorm(x_.data() + e * dim, w.ffn_norm.data(), dim, c.rms_eps, xb_.data() + e * dim);
    }
    ffn_->Compute(l, xb_.data(), n, proj_.data());
    for (int64_t i = 0; i < n * dim; ++i) x_[i] += proj_[i];
  }
  for (const BatchEntry& e : batch) kv_.set_length(e.slot, e.position + 1);

  // Only the rows that want logits go through the final norm and the (large) output head.
  int64_t n_out = 0;
  for (int64_t e = 0; e < n; ++e) {
    if (!batch[e].want_logits) continue;
    RmsNorm(x_.data() + e * dim, model_.output_norm().data(), dim, c.rms_eps,
            xb_.data() + n_out * dim);
    ++n_out;
  }
  logits.resize(n_out * c.vocab_size);
  if (n_out > 0) {
    MatMul(model_.output(), xb_.data(), n_out, dim, logits.data(), c.vocab_size, pool_);
  }
  return absl::OkStatus();
}

}  // namespace thermocline
