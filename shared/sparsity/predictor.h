// Per-layer activation predictors in PowerInfer's form: a low-rank ReLU MLP without bias,
//   score = fc2 . relu(fc1 . h),   fc1: [rank][dim] (ggml ne = (dim, rank)),
//                                  fc2: [ffn_dim][rank] (ggml ne = (rank, ffn_dim)),
// and neuron i is predicted active when score_i >= powerinfer.sparse_threshold (default 0).
// Tensors blk.N.fc1.weight / blk.N.fc2.weight, read from a PowerInfer model file or from a
// predictor file written by `thermocline train-predictor` (the same names and orientation, so
// either engine loads the other's).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shared/kernels/matmul.h"
#include "shared/model/gguf.h"
#include "shared/model/llama_model.h"
#include "shared/util/thread_pool.h"

namespace thermocline {

struct LayerPredictor {
  int64_t rank = 0;
  MatrixView fc1;  // rows = rank, cols = dim
  MatrixView fc2;  // rows = ffn_dim, cols = rank
};

class PredictorSet {
 public:
  // Reads every blk.N.fc1/fc2 pair of `file` (which must outlive the set unless the set copies)
  // and powerinfer.sparse_threshold; checks shapes against `config`. A layer without a
  // predictor is an error naming it.
  static absl::StatusOr<PredictorSet> FromGguf(std::shared_ptr<const GgufFile> file,
                                               const LlamaConfig& config);
  static absl::StatusOr<PredictorSet> Load(const std::string& path, const LlamaConfig& config);

  float threshold() const { return threshold_; }
  void set_threshold(float t) { threshold_ = t; }
  int64_t n_layers() const { return static_cast<int64_t>(layers_.size()); }
  const LayerPredictor& layer(int64_t l) const { return layers_[l]; }
  // Bytes of all predictor weights (the planner charges them to the GPU).
  int64_t bytes() const;

  // Ascending ids of the neurons predicted active for one token's FFN input h [dim].
  void Predict(int64_t layer, const float* h, std::vector<int32_t>* active, ThreadPool& pool) const;

 private:
  std::shared_ptr<const GgufFile> file_;
  std::vector<std::vector<uint8_t>> owned_;  // storage for predictors built in memory
  std::vector<LayerPredictor> layers_;
  float threshold_ = 0.0f;
  friend class PredictorTrainer;
};

}  // namespace thermocline
