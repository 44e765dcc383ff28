// The GPU side of a split FFN on CPU threads (the host backend's FfnExecutor): per layer it
// picks the cold candidates of every row, sends them with h through the ColdLink, computes the
// hot neurons while the CPU worker computes the cold ones, then adds the cold partial sums.
//
// Which neurons run is the single-process SparseFfn's choice restricted to each side (the same
// predictor pick, the same SparsityPlan::FilterFor), so the split computes the same neurons;
// each neuron's product is bit-identical to the dense pass (neuron_ffn.h), and only the order
// of the down sum differs (y_hot + y_cold instead of one running sum). Layers that are dense
// and wholly hot run DenseFfn, bit-identical to the single-process engine.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu_worker/backend.h"
#include "shared/model/llama_model.h"
#include "shared/runtime/ffn.h"
#include "shared/sparsity/neuron_ffn.h"
#include "shared/sparsity/partition.h"
#include "shared/sparsity/sparsity_mode.h"
#include "shared/util/thread_pool.h"

namespace thermocline::gpu_worker {

class SplitFfn final : public FfnExecutor {
 public:
  static absl::StatusOr<std::unique_ptr<SplitFfn>> Create(const LlamaModel& model,
                                                          SparsityPlan plan, Partition partition,
                                                          ThreadPool& pool);

  // Every layer of the next forward pass uses `link`. FfnExecutor::Compute cannot fail, so the
  // first error of a step is kept here (later layers then skip their FFN: the step is lost
  // anyway) and EndStep returns it.
  void BeginStep(ColdLink* link);
  absl::Status EndStep();

  void Compute(int64_t layer, const float* h, int64_t n_tokens, float* out) override;

 private:
  SplitFfn(const LlamaModel& model, SparsityPlan plan, Partition partition, ThreadPool& pool);
  // Fills hot_ids_/hot_end_ and cold_ids_/cold_end_ with each row's predicted neurons.
  void PredictRows(int64_t layer, const float* h, int64_t n_tokens);

  const LlamaModel& model_;
  SparsityPlan plan_;
  Partition partition_;
  ThreadPool& pool_;
  DenseFfn dense_;
  std::vector<DownRows> down_rows_;     // [n_layers]; built for layers with hot neuron work
  std::vector<NeuronWeights> weights_;  // [n_layers]
  NeuronFfn neurons_;
  ColdLink* link_ = nullptr;
  absl::Status status_;
  std::vector<int32_t> predicted_, hot_tmp_, cold_tmp_;
  std::vector<int32_t> hot_ids_, cold_ids_;
  std::vector<uint32_t> hot_end_, cold_end_;
  std::vector<float> y_cold_;
};

}  // namespace thermocline::gpu_worker
