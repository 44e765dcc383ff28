// The CPU worker's compute: one Activation (h and each row's cold candidates) -> the partial
// FFN output of the cold neurons that pass the plan's filter, row by row with NeuronFfn over
// the compacted cold rows. Candidate ids arrive as global neuron ids from another process:
// they are checked to be cold (a hot id is an InvalidArgument, never an out-of-bounds read)
// and translated to compact row indices.
//
// TEAL (EnableTeal): an Activation's rows with cuts run TealFfnPart over the layer's cold
// neurons (sparsity/teal_ffn.h) from transposed copies of the compact gate and up rows; rows
// whose cuts are all 0 run as before.
//
// Mixture-of-experts layers arrive with the router's picks (the GPU worker routes once): each
// row computes the cold neurons of its chosen experts and sums them weighted by the router's
// weights, in pick order, so the GPU worker's hot sum plus this one is the layer's output.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "cpu_worker/cold_rows.h"
#include "shared/ipc/messages.h"
#include "shared/sparsity/neuron_ffn.h"
#include "shared/sparsity/partition.h"
#include "shared/sparsity/sparsity_mode.h"
#include "shared/sparsity/teal.h"
#include "shared/sparsity/teal_ffn.h"
#include "shared/util/thread_pool.h"

namespace thermocline::cpu_worker {

class ColdExecutor {
 public:
  // All references must outlive the executor.
  ColdExecutor(const ColdRows& rows, const Partition& partition, const SparsityPlan& plan,
               FfnActivation activation, ThreadPool& pool);

  // Builds the TEAL copies of every layer's cold gate and up rows for `plan` (calibrated cuts
  // over the FFN: --sparsity teal), so that Activations with cuts are accepted.
  absl::Status EnableTeal(const TealPlan& plan);
  int64_t teal_bytes() const;
  // mlock the copies EnableTeal made (--mlock, which locks the cold rows too).
  absl::Status LockTeal() const;

  // y[rows][dim] = the cold neurons' FFN output for the Activation's rows (the view is
  // already decoded, so shapes, order and ranges of the ids are checked; coldness is checked
  // here, before anything is computed).
  absl::Status Compute(const ipc::ActivationView& a, std::span<float> y);

  // Neurons that ran in the last Compute, and the candidates it considered, summed over rows
  // (and over the chosen experts in MoE layers).
  int64_t last_active() const { return last_active_; }
  int64_t last_candidates() const { return last_candidates_; }
  // Cold neurons of `layer` (0 for a layer out of range), the denominator of the cold
  // active-neuron ratio.
  int64_t ColdNeurons(int64_t layer) const;

 private:
  struct Lane {
    std::unique_ptr<ThreadPool> solo;  // runs this lane's kernels on its own thread
    NeuronFfn neurons;
    int64_t active = 0;
    int64_t candidates = 0;
    std::vector<float> expert_y;  // one expert's cold output, before its router weight
  };
  // Row r of an MoE layer's Activation into out[0..dim): the cold part of each chosen expert.
  void ComputeRoutedRow(const ipc::ActivationView& a, int64_t r, Lane& lane, ThreadPool& pool,
                        float* out);
  absl::Status ComputeRouted(const ipc::ActivationView& a, std::span<float> y);
  // An Activation with TEAL cuts: the rows with cuts by the layer's TealFfnPart, the others as
  // Compute runs them, one row at a time on the whole pool.
  absl::Status ComputeTeal(const ipc::ActivationView& a, std::span<float> y);

  const ColdRows& rows_;
  const Partition& partition_;
  const SparsityPlan& plan_;
  FfnActivation activation_;
  ThreadPool& pool_;
  std::vector<Lane> lanes_;
  std::vector<int32_t> all_;       // 0..max n_cold-1: the compact ids of "all cold"
  std::vector<int32_t> compact_;   // translated ids of every row
  std::vector<uint32_t> row_end_;  // into compact_
  int64_t last_active_ = 0;
  int64_t last_candidates_ = 0;
  std::vector<TealFfnPart> teal_;  // [n_layers] after EnableTeal (empty parts: no cold neurons)
};

}  // namespace thermocline::cpu_worker
