// The GPU side of a split FFN on CPU threads (the host backend's FfnExecutor): per layer it
// picks the cold candidates of every row, sends them with h through the ColdLink, computes the
// hot neurons while the CPU worker computes the cold ones, then adds the cold partial sums.
//
// Which neurons run is the single-process SparseFfn's choice restricted to each side (the same
// predictor pick, the same SparsityPlan::FilterFor), so the split computes the same neurons;
// each neuron's product is bit-identical to the dense pass (neuron_ffn.h), and only the order
// of the down sum differs (y_hot + y_cold instead of one running sum). Layers that are dense
// and wholly hot run DenseFfn, bit-identical to the single-process engine.
//
// TEAL (`teal_ffn`: a calibrated plan over the FFN too): each decode row of a layer other than
// MoE sends the CPU worker its gate, up and down cuts with h, and both sides run TealFfnPart
// over their neurons (teal_ffn.h); prompt rows (cuts 0) run as without TEAL, as TealLinear
// leaves them dense in one process.
//
// Mixture-of-experts layers: the router runs here, once (this side owns h); the picks and
// their weights travel with h to the CPU worker. Each side computes its part of every chosen
// expert and sums the parts weighted by the router's weights, so y_hot + y_cold is the dense
// sum reassociated. The shared expert (qwen2moe) stays whole here: every token uses it, so by
// PowerInfer's criterion all of its neurons are hot.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu_worker/backend.h"
#include "shared/ipc/worker_metrics.h"
#include "shared/model/model.h"
#include "shared/runtime/ffn.h"
#include "shared/sparsity/neuron_ffn.h"
#include "shared/sparsity/partition.h"
#include "shared/sparsity/sparsity_mode.h"
#include "shared/sparsity/teal.h"
#include "shared/sparsity/teal_ffn.h"
#include "shared/util/thread_pool.h"

namespace thermocline::gpu_worker {

class SplitFfn final : public FfnExecutor {
 public:
  // `teal_ffn`: TEAL over the FFN's inputs (a plan of calibrated cuts, TealPlan::kCuts, with
  // ffn set; the FFN plan must then be dense), or nullopt.
  static absl::StatusOr<std::unique_ptr<SplitFfn>> Create(
      const Model& model, SparsityPlan plan, Partition partition, ThreadPool& pool,
      const std::optional<TealPlan>& teal_ffn = std::nullopt);

  // Every layer of the next forward pass uses `link`; decode[r] != 0 marks the batch's decode
  // rows (DecodeRows, forward.h), which TEAL makes input-sparse (empty: none). FfnExecutor::Compute
  // cannot fail, so the first error of a step is kept here (later layers then skip their FFN:
  // the step is lost anyway) and EndStep returns it.
  void BeginStep(ColdLink* link, std::span<const uint8_t> decode = {});
  absl::Status EndStep();
  // Whether TEAL covers the FFN (Create's teal_ffn): only then does BeginStep need decode rows.
  bool teal_ffn() const { return teal_.has_value(); }
  // Reports per layer to `metrics` (null: nowhere): the time since the previous layer's FFN
  // ended (attention + hot FFN + the wait for the cold partial), the hot neurons that ran, the
  // wait for the cold partial, and every kRecallEvery-th step in predicted layers the
  // predictor's recall on the hot neurons against the exact active set.
  void SetMetrics(ipc::WorkerMetricsWriter* metrics) { metrics_ = metrics; }
  static constexpr uint64_t kRecallEvery = 16;

  using FfnExecutor::Compute;
  void Compute(int64_t layer, const float* h, const float* predictor_input, int64_t n_tokens,
               float* out) override;

 private:
  SplitFfn(const Model& model, SparsityPlan plan, Partition partition, ThreadPool& pool);
  // Fills hot_ids_/hot_end_ and cold_ids_/cold_end_ with each row's predicted neurons.
  void ComputeLayer(int64_t layer, const float* h, const float* predictor_input,
                    int64_t n_tokens, float* out);
  void PredictRows(int64_t layer, const float* predictor_input, int64_t n_tokens);
  // Recall of the predictor's hot pick for row t (hot_ids_ of that row) against the hot
  // neurons that are truly active: act(gate . h) > 0 on ReLU models, or passing the layer's
  // magnitude cut. Rows of layers with neither definition are not sampled.
  void SampleRecall(int64_t layer, const float* h, int64_t t, NeuronFilter filter);
  // The hot part of an MoE layer, with its cold request sent first.
  void ComputeMoe(int64_t layer, const float* h, int64_t n_tokens, float* out);
  // The layer's cold request for every cold neuron of the rows of h.
  ColdRequest RequestFor(int64_t layer, const float* h, int64_t n_tokens) const;
  // Sends the layer's cold request; false (with status_ set) when it could not.
  bool SendCold(const ColdRequest& request);
  // Adds the cold partial of `layer` (when `sent`) and the down bias to out.
  void MergeCold(int64_t layer, int64_t n_tokens, bool sent, float* out);
  // Fills row_cuts_ with each row's TEAL cuts in `layer`; false when no row has any (the layer
  // then runs as without TEAL).
  bool TealCuts(int64_t layer, int64_t n_tokens);
  // A layer with TEAL rows: cold request with the cuts, hot rows by TealFfnPart (others as
  // without TEAL), then the merge.
  void ComputeTeal(int64_t layer, const float* h, const float* predictor_input, int64_t n_tokens,
                   float* out);

  const Model& model_;
  SparsityPlan plan_;
  Partition partition_;
  ThreadPool& pool_;
  DenseFfn dense_;
  std::vector<DownRows> down_rows_;     // [n_layers]; built for layers with hot neuron work
  std::vector<NeuronWeights> weights_;  // [n_layers]
  NeuronFfn neurons_;
  // MoE layers that split: every expert's neuron-major weights (down rows built for the experts
  // with hot neurons), each expert's hot neurons as expert-local ids, and the shared expert.
  struct MoeLayer {
    std::vector<NeuronWeights> experts;
    std::vector<DownRows> downs;
    std::vector<std::vector<int32_t>> hot;  // [expert]
    NeuronWeights shared;
    DownRows shared_down;
  };
  std::vector<MoeLayer> moe_;  // [n_layers]; empty entries for the other layers
  std::vector<float> probs_, pick_w_, expert_y_;
  std::vector<int32_t> picks_, shared_ids_;
  ColdLink* link_ = nullptr;
  absl::Status status_;
  std::vector<int32_t> predicted_, hot_tmp_, cold_tmp_;
  std::vector<int32_t> hot_ids_, cold_ids_;
  std::vector<uint32_t> hot_end_, cold_end_;
  std::vector<float> y_cold_;
  ipc::WorkerMetricsWriter* metrics_ = nullptr;
  int64_t mark_ns_ = 0;     // end of the previous layer's FFN, or the step's start
  uint64_t steps_ = 0;      // steps begun, for the recall sampling period
  std::vector<float> recall_gate_;
  std::vector<uint8_t> picked_;  // [ffn_dim] scratch: picked by the predictor in this row
  std::optional<TealPlan> teal_;
  std::vector<TealFfnPart> teal_parts_;  // [n_layers]; the hot neurons' part (TEAL only)
  std::span<const uint8_t> decode_;
  std::vector<float> row_cuts_;  // [rows][ipc kCutsPerRow]: gate, up, down
};

}  // namespace thermocline::gpu_worker
