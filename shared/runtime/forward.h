// The transformer forward pass on the CPU for a batch of (slot, position, token) entries, for
// every architecture: it executes the one layer description of model.h (norms, attention
// features, FFN form) that the loader resolved from the architecture's spec (arch.h):
// many positions of one sequence (prompt processing), one position of many sequences (decode),
// or a mix. Keys and values of every entry are stored before any entry attends, so an entry
// sees the earlier positions of its own slot, including those earlier in the same batch.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "shared/model/model.h"
#include "shared/runtime/ffn.h"
#include "shared/runtime/kv_cache.h"
#include "shared/runtime/ops.h"
#include "shared/util/thread_pool.h"

namespace thermocline {

struct BatchEntry {
  int32_t slot = 0;
  int32_t position = 0;
  int32_t token = 0;
  bool want_logits = false;
};

class ForwardPass {
 public:
  // `ffn` defaults to a DenseFfn owned by the pass.
  ForwardPass(const Model& model, KvCache& kv, ThreadPool& pool, FfnExecutor* ffn = nullptr);

  // Runs one batch. Entry positions must continue their slot's sequence: a position may be at
  // most the slot's current length (equal appends; smaller rewinds and overwrites). On success
  // `logits` holds vocab_size floats for each entry with want_logits, in batch order.
  absl::Status Run(std::span<const BatchEntry> batch, std::vector<float>& logits);

  const Model& model() const { return model_; }
  KvCache& kv_cache() { return kv_; }
  ThreadPool& pool() { return pool_; }

 private:
  absl::Status Validate(std::span<const BatchEntry> batch) const;
  void Attention(int64_t layer, std::span<const BatchEntry> batch);
  // The layer's pre-norm (RMS or LayerNorm per the architecture) of n rows of x into out.
  void Norm(const std::vector<float>& w, const std::vector<float>& b, const float* x, int64_t n,
            float* out) const;
  void QkvAndRope(int64_t layer, std::span<const BatchEntry> batch, const float* in);

  const Model& model_;
  KvCache& kv_;
  ThreadPool& pool_;
  std::unique_ptr<DenseFfn> own_ffn_;
  FfnExecutor* ffn_;
  // Scratch, [n_tokens][...]; kept between calls to avoid reallocating every step.
  std::vector<float> x_, xb_, q_, k_, v_, att_, proj_, ffn_out_, scores_;
  RopeParams rope_;  // the model's RoPE; base and position set per layer and entry
};

}  // namespace thermocline
