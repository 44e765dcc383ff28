// The transformer forward pass on the CPU for a batch of (slot, position, token) entries, for
// every architecture: it executes the layer program (layer_program.h) over the model description
// the loader resolved from the architecture's spec (arch.h):
// many positions of one sequence (prompt processing), one position of many sequences (decode),
// or a mix. Keys and values of every entry are stored before any entry attends, so an entry
// sees the earlier positions of its own slot, including those earlier in the same batch.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "shared/model/model.h"
#include "shared/runtime/ffn.h"
#include "shared/runtime/kv_cache.h"
#include "shared/runtime/linear.h"
#include "shared/runtime/ops.h"
#include "shared/util/thread_pool.h"

namespace thermocline {

struct BatchEntry {
  int32_t slot = 0;
  int32_t position = 0;
  int32_t token = 0;
  bool want_logits = false;
};

// decode[e] = 1 for the batch's decode entries, 0 for the others: a slot with one entry in the
// batch is decoding, one with several is taking a prompt (what TEAL makes input-sparse).
void DecodeRows(std::span<const BatchEntry> batch, std::vector<uint8_t>& decode);

class ForwardPass {
 public:
  // `ffn` defaults to a DenseFfn owned by the pass. `linear` (optional) computes q, k, v and o,
  // and the FFN's products too when the pass owns its DenseFfn (a caller's `ffn` does its own).
  ForwardPass(const Model& model, KvCache& kv, ThreadPool& pool, FfnExecutor* ffn = nullptr,
              LinearExecutor* linear = nullptr);

  // Runs one batch. Entry positions must continue their slot's sequence: a position may be at
  // most the slot's current length (equal appends; smaller rewinds and overwrites). On success
  // `logits` holds vocab_size floats for each entry with want_logits, in batch order.
  absl::Status Run(std::span<const BatchEntry> batch, std::vector<float>& logits);

  const Model& model() const { return model_; }
  KvCache& kv_cache() { return kv_; }
  ThreadPool& pool() { return pool_; }

  // Sees the residual stream after each layer ([n][dim], batch order), for calibration tools
  // that measure a block's output error. Returning false ends the batch there: Run returns OK
  // with no logits, the later layers' keys and values unwritten and the slots' lengths
  // unchanged (the caller reruns or resets them). Null: none.
  using LayerObserver = std::function<bool(int64_t layer, const float* x, int64_t n)>;
  void set_layer_observer(LayerObserver observer) { layer_observer_ = std::move(observer); }

  // Starts every batch at block `layer` with the residual stream `input(n)` returns ([n][dim],
  // batch order, read during the call) instead of the embeddings and the blocks before it: a
  // calibration tool that holds the dense stream measures one block without recomputing the
  // ones before. The earlier blocks' keys and values are not written, so a batch must not need
  // them (one call per window). Layer 0 or a null input: the whole model.
  using LayerInput = std::function<const float*(int64_t n)>;
  void set_start(int64_t layer, LayerInput input) {
    start_layer_ = input ? layer : 0;
    start_input_ = std::move(input);
  }

 private:
  class Ops;  // the layer program's operations (layer_program.h), in forward.cc

  absl::Status Validate(std::span<const BatchEntry> batch) const;
  void Attention(int64_t layer, std::span<const BatchEntry> batch);
  // W x for one of the layer's projections, through linear_ when set.
  void Project(int64_t layer, Projection p, const MatrixView& w, const float* x, int64_t n,
               int64_t x_stride, float* y, int64_t y_stride);

  const Model& model_;
  KvCache& kv_;
  ThreadPool& pool_;
  std::unique_ptr<DenseFfn> own_ffn_;
  FfnExecutor* ffn_;
  LinearExecutor* linear_;
  LayerObserver layer_observer_;
  int64_t start_layer_ = 0;
  LayerInput start_input_;
  std::vector<uint8_t> decode_;  // [n_entries] for linear_->BeginBatch
  // Scratch, [n_tokens][...]; kept between calls to avoid reallocating every step.
  std::vector<float> x_, xb_, q_, k_, v_, att_, proj_, ffn_out_, scores_;
  std::vector<const uint8_t*> kv_rows_;  // AttendHead's row pointers, 2 * capacity per thread
  RopeParams rope_;  // the model's RoPE; base and position set per layer and entry
  // Entry e's RoPE angles (RopeAngles) for `rope` at `position`, computed once per step and
  // base: a decode step's layers share them, and their sines and powers were a few percent of
  // a two-thread step's serial time, which the other thread waits through.
  const float* RopeAnglesFor(int64_t e, int64_t position, const RopeParams& rope);
  std::vector<float> rope_angles_;        // [entry][rope_dim]
  std::vector<int64_t> rope_angles_pos_;  // the position each entry's angles are for, or -1
  float rope_angles_base_ = 0.0f;
};

}  // namespace thermocline
