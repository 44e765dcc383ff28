// Per-layer activation predictors in PowerInfer's form: a low-rank ReLU MLP without bias,
//   score = fc2 . relu(fc1 . h),   fc1: [rank][dim] (ggml ne = (dim, rank)),
//                                  fc2: [ffn_dim][rank] (ggml ne = (rank, ffn_dim)),
// and neuron i is predicted active when score_i >= powerinfer.sparse_threshold (default 0).
// Tensors blk.N.fc1.weight / blk.N.fc2.weight, read from a PowerInfer model file or from a
// predictor file written by `thermocline train-predictor` (the same names and orientation, so
// either engine loads the other's).
//
// Thermocline's predictor files add thermocline.predictor.* keys (see WritePredictors). One of
// them, thermocline.predictor.thresholds (f32[block_count]), holds a decision threshold per
// layer; when present it overrides powerinfer.sparse_threshold for that layer. The trainer
// avoids needing it whenever it can, by folding each layer's threshold into fc2's scale so
// that the single global threshold PowerInfer reads is exact for every layer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shared/gguf/gguf.h"
#include "shared/kernels/matmul.h"
#include "shared/model/model.h"
#include "shared/util/page_arena.h"
#include "shared/util/thread_pool.h"

namespace thermocline {

struct LayerPredictor {
  int64_t rank = 0;
  MatrixView fc1;  // rows = rank, cols = dim
  MatrixView fc2;  // rows = ffn_dim, cols = rank
  // fc2 transposed (rows = rank, cols = ffn_dim), built at load for float types (F32, F16,
  // BF16); data is null otherwise. One token's scores read only the rows of the hidden units
  // that ReLU left nonzero (about half), as long contiguous runs, where fc2's own rows are
  // rank-long (514 bytes at rank 257) and every one is read.
  MatrixView fc2_t;
};

// One layer's predictor in f32, row-major, as the trainer produces it.
struct PredictorWeights {
  int64_t rank = 0;
  std::vector<float> fc1;  // [rank][dim]
  std::vector<float> fc2;  // [ffn_dim][rank]
};

// What `train-predictor` measured on one layer's held-out tokens, at the stored threshold.
struct PredictorLayerReport {
  float recall = 0;            // true actives predicted / true actives
  float precision = 0;         // true actives predicted / predicted
  float predicted_active = 0;  // share of (token, neuron) pairs predicted active
  float true_active = 0;       // share of (token, neuron) pairs truly active
};

// Stored as thermocline.predictor.* keys; empty for files that lack them (PowerInfer's).
struct PredictorReport {
  int64_t training_tokens = 0;  // tokens whose samples trained the predictors
  float recall_target = 0;
  std::string criterion;                     // "relu" or "magnitude" (see activation_stats.h)
  std::vector<PredictorLayerReport> layers;  // empty, or one per layer
};

class PredictorSet {
 public:
  PredictorSet() = default;
  // Copies rebind the weight views to the copy's own storage.
  PredictorSet(const PredictorSet& other);
  PredictorSet& operator=(const PredictorSet& other);
  PredictorSet(PredictorSet&&) noexcept = default;
  PredictorSet& operator=(PredictorSet&&) noexcept = default;

  // Reads every blk.N.fc1/fc2 pair of `file` (which must outlive the set unless the set copies)
  // and powerinfer.sparse_threshold; checks shapes against `config`. A layer without a
  // predictor is an error naming it.
  static absl::StatusOr<PredictorSet> FromGguf(std::shared_ptr<const GgufFile> file,
                                               const ModelConfig& config);
  static absl::StatusOr<PredictorSet> Load(const std::string& path, const ModelConfig& config);
  // A set over f32 weights held in memory, stored as `type` (F32, F16 or BF16; Q8_0/Q4_0 when
  // dim and every rank are multiples of 32). One entry per layer of `config`.
  static absl::StatusOr<PredictorSet> FromWeights(const std::vector<PredictorWeights>& layers,
                                                  const ModelConfig& config, GgmlType type,
                                                  float threshold = 0.0f);

  // The global threshold (powerinfer.sparse_threshold).
  float threshold() const { return threshold_; }
  // Sets the global threshold and every layer's threshold to t.
  void set_threshold(float t) {
    threshold_ = t;
    layer_thresholds_.assign(layers_.size(), t);
  }
  // The threshold Predict applies to layer l.
  float layer_threshold(int64_t l) const { return layer_thresholds_[l]; }
  const std::vector<float>& layer_thresholds() const { return layer_thresholds_; }
  // One finite value per layer; the global threshold is left as it is.
  absl::Status set_layer_thresholds(std::vector<float> thresholds);
  // True when some layer's threshold differs from the global one (a file written from this set
  // then needs thermocline.predictor.thresholds; PowerInfer would apply the global one).
  bool has_per_layer_thresholds() const;

  int64_t n_layers() const { return static_cast<int64_t>(layers_.size()); }
  const LayerPredictor& layer(int64_t l) const { return layers_[l]; }
  // Bytes of all predictor weights (the planner charges them to the GPU).
  int64_t bytes() const;

  const PredictorReport& report() const { return report_; }
  void set_report(PredictorReport report) { report_ = std::move(report); }

  // Ascending ids of the neurons predicted active for one token's FFN input h [dim]: those
  // whose score >= layer_threshold(layer). Allocates nothing but `active`'s growth; safe to call
  // from several threads at once (each with its own pool).
  // Returns the bytes of predictor weights it read (fc1 whole; fc2 whole or, through fc2_t,
  // the rows of nonzero hidden units).
  int64_t Predict(int64_t layer, const float* h, std::vector<int32_t>* active,
                  ThreadPool& pool) const;

  // scores[t][0..ffn_dim) = fc2 . relu(fc1 . h[t]) for t < n_tokens (h: [n_tokens][dim]), the
  // values Predict compares with the threshold. One token goes through fc2_t where there is
  // one, a batch through fc2 (one pass over it for all tokens): the two sum in different
  // orders, so a batch's scores can differ from single tokens' in the last bits. Returns the
  // bytes of predictor weights read.
  int64_t Scores(int64_t layer, const float* h, int64_t n_tokens, float* scores,
                 ThreadPool& pool) const;

 private:
  void RebindOwned();
  // Builds transposed_ and every float layer's fc2_t from fc2.
  absl::Status BuildTransposed();

  std::shared_ptr<const GgufFile> file_;
  std::vector<std::vector<uint8_t>> owned_;       // storage for predictors built in memory
  // fc2_t of each layer, or null: never written once built, so copies of the set share them.
  // Huge pages (util/page_arena.h) because a token reads its kept rows all over the copy.
  std::vector<std::shared_ptr<const PageBuffer>> transposed_;
  std::vector<LayerPredictor> layers_;
  float threshold_ = 0.0f;
  std::vector<float> layer_thresholds_;
  PredictorReport report_;
  friend class PredictorTrainer;
};

// Writes a predictor file: blk.N.fc1.weight / blk.N.fc2.weight in the set's storage type,
// powerinfer.sparse_threshold, and
//   general.architecture                       str    "thermocline.predictor"
//   thermocline.predictor.block_count          u32    layers (checked against the model on load)
//   thermocline.predictor.model_dim / model_ffn_dim   u32
//   thermocline.predictor.ranks                i32[]  per layer
//   thermocline.predictor.thresholds           f32[]  per layer decision thresholds
// and, when the set carries a report: thermocline.predictor.training_tokens (u64),
// recall_target (f32), criterion (str), and recall / precision / predicted_active /
// true_active (f32[] per layer, measured on held-out tokens).
// What a model's predictors read, as stored in thermocline.predictor.input: "ffn_inp" (the
// residual stream before ffn_norm, PowerInfer's input for the llama family) or "layer_input"
// (the layer's input, PowerInfer's falcon). Files without the key are PowerInfer's (accepted) or
// older Thermocline files trained on ffn_norm(x) (refused with a message to retrain).
std::string_view PredictorInputName(const ModelConfig& config);
absl::Status CheckPredictorInput(const GgufFile& file, const ModelConfig& config);

absl::Status WritePredictors(const PredictorSet& set, const ModelConfig& config,
                             const std::string& path);

}  // namespace thermocline
