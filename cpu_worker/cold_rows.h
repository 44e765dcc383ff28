// The cold neurons' FFN rows, compacted: for every layer, the gate, up and down_t rows of its
// cold neurons only, as [n_cold][dim] matrices in the model's row formats, in one block of
// memory on the CPU worker's NUMA node. Compact row k belongs to global neuron
// partition.layers[l].cold[k]. In layers other than MoE ones the rows are laid out as neuron
// bundles (sparsity/neuron_bundle.h): each cold neuron's [gate | up | down_t] side by side in
// predicted layers, [up | down_t] with the gate as its own matrix elsewhere, read through
// strided views with the same bits; the same bytes as three matrices, give or take alignment.
// The hot rows are never copied (the model file is mapped, and only the cold pages of it are
// read). In mixture-of-experts layers each expert has its own
// compact rows: expert e's compact row k is its neuron ExpertSlice(cold, e)[k] - e * ffn_dim.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "cpu_worker/numa.h"
#include "shared/model/model.h"
#include "shared/sparsity/neuron_bundle.h"
#include "shared/sparsity/neuron_ffn.h"
#include "shared/sparsity/partition.h"
#include "shared/sparsity/sparsity_mode.h"
#include "shared/util/thread_pool.h"

namespace thermocline::cpu_worker {

class ColdRows {
 public:
  // Copies the cold rows of every layer into memory on `node` (nullopt: ordinary memory).
  // Models without ffn_down_t get their down rows from DownRows (a transposed copy of one
  // layer's ffn_down at a time, dropped once its cold rows are copied).
  // `plan` says which layers gather their gate by candidate (predicted: the gate joins the
  // bundle); nullptr: none. `bundles` false keeps three compact matrices per layer.
  static absl::StatusOr<ColdRows> Build(const Model& model, const Partition& partition,
                                        std::optional<int> node, ThreadPool& pool,
                                        const SparsityPlan* plan = nullptr,
                                        bool bundles = NeuronBundle::WantedFromEnvironment());

  // Layer l's cold neurons as NeuronWeights over compact rows (0 rows when it has none, and
  // in MoE layers).
  const NeuronWeights& layer(int64_t l) const { return layers_[l]; }
  // MoE layer l's experts (empty for other layers): expert e's cold neurons, compact.
  const std::vector<NeuronWeights>& experts(int64_t l) const { return experts_[l]; }
  int64_t n_layers() const { return static_cast<int64_t>(layers_.size()); }
  int64_t bytes() const { return static_cast<int64_t>(memory_.size()); }
  NodeMemory& memory() { return memory_; }

 private:
  NodeMemory memory_;
  std::vector<NeuronWeights> layers_;
  std::vector<std::vector<NeuronWeights>> experts_;  // [n_layers][n_experts in MoE layers]
  std::vector<std::vector<float>> up_b_;  // per layer, the cold neurons' up biases (or none)
};

}  // namespace thermocline::cpu_worker
