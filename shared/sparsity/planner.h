// `thermocline plan`: which FFN neurons go to the GPU under a VRAM budget.
//
// Everything dense is charged first, because the GPU worker owns it whatever the plan says:
// token embeddings, the output head (once when tied to the embeddings), every norm (as f32),
// every layer's attention weights, the predictors, the KV cache as the gateway allocates it
// (2 * n_layers * context * kv_dim * element bytes * (kv_slots + 1): its slots and its probe
// slot, in --kv-type; recorded in the plan, so that a gateway serving another KV cache refuses
// it), and a fixed scratch reserve for activations and
// kernel workspaces (kDefaultScratchBytes unless set). A budget that cannot hold all of that is
// refused with the number of bytes missing.
//
// The rest goes to FFN neurons by expected activations per byte: a neuron costs its gate row,
// its up row and its down row (ffn_down_t, or one column of ffn_down) in the model's own types,
// and is worth its activation frequency from the profile. A layer's GPU slice is either empty or
// at least --min-slice neurons, and grows in steps of kSliceAlign (32, a warp and a Q4_0/Q8_0
// block row) except that the last step may stop at ffn_dim. Within a layer neurons are taken
// hottest first, so a layer's candidate steps have non-increasing value per byte; across layers
// a greedy pass repeatedly takes the step with the most expected activations per byte that still
// fits, and drops a layer once its next step does not fit (the classic greedy for a knapsack of
// ordered items, exact whenever the budget ends on a step boundary).
//
// Mixture-of-experts layers: the router and the shared expert are dense (charged first, as
// "experts' dense part"); the routed experts' neurons are the layer's neurons (flat ids
// e * ffn_dim + i, placement.h), each worth its frequency times its expert's share of the
// tokens (the expected activations per token), so hot neurons of often-chosen experts go first.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shared/model/model.h"
#include "shared/sparsity/activation_stats.h"
#include "shared/sparsity/placement.h"

namespace thermocline {

inline constexpr int64_t kSliceAlign = 32;
inline constexpr int64_t kDefaultScratchBytes = int64_t{128} << 20;

// Parses a byte size: a non-negative number (decimals allowed) and an optional unit, B, KiB, MiB,
// GiB, TiB, or K, M, G, T (the same binary multiples), or KB, MB, GB, TB (powers of 1000); case
// and a space before the unit do not matter. "6GiB", "6G", "1.5 GiB", "4096". Errors name the
// text and what is wrong with it.
absl::StatusOr<int64_t> ParseByteSize(const std::string& text);
// "1.50 GiB", "12.0 MiB", "512 B": for reports.
std::string FormatBytes(int64_t bytes);

struct PlannerOptions {
  int64_t vram_budget = 0;  // bytes
  int64_t context = 0;      // KV cache positions to reserve; 0 = the model's context length
  // The KV cache as the gateway allocates it: --kv-slots sequences plus its probe slot, in
  // kv_type ("f32" or "f16"), recorded in the placement so that a gateway serving another
  // configuration refuses the plan.
  int32_t kv_slots = 4;
  std::string kv_type = "f32";
  int64_t min_slice = 32;   // a layer's GPU slice is 0 or at least this many neurons
  int64_t scratch_bytes = kDefaultScratchBytes;
  int64_t predictor_bytes = 0;  // charged with the dense part (PredictorBytes below)
};

// Bytes of every blk.N.fc1.weight / blk.N.fc2.weight in `file` (0 when it has none), with their
// shapes checked against `config`: what the GPU worker uploads for `predicted` mode.
absl::StatusOr<int64_t> PredictorBytes(const GgufFile& file, const ModelConfig& config);

struct DenseCharges {
  int64_t token_embd = 0;
  int64_t output = 0;  // 0 when tied to token_embd
  int64_t norms = 0;
  int64_t attention = 0;
  int64_t predictors = 0;
  int64_t kv_cache = 0;
  int64_t scratch = 0;
  int64_t moe_dense = 0;  // MoE layers: routers, shared experts and their gates
  int64_t total() const {
    return token_embd + output + norms + attention + predictors + kv_cache + scratch + moe_dense;
  }
};

struct LayerPlan {
  int64_t n_gpu = 0;
  int64_t bytes = 0;         // of the GPU neurons
  int64_t neuron_bytes = 0;  // gate + up + down row of one neuron
  double gpu_share = 0;      // of this layer's expected activations
  double activations = 0;    // this layer's expected activations per token (sum of frequencies;
                             // in MoE layers weighted by each expert's share of the tokens)
};

struct Plan {
  Placement placement;
  DenseCharges dense;
  std::vector<LayerPlan> layers;
  int64_t ffn_bytes = 0;      // all neurons of all layers
  int64_t gpu_ffn_bytes = 0;  // the placed ones
  int64_t context = 0;
  int64_t budget = 0;
};

// Dense charges alone (for reports and for the error when the budget is too small).
DenseCharges ChargeDense(const Model& model, const PlannerOptions& options);

// Places neurons as described above. `stats` must come from this model (shapes are checked).
absl::StatusOr<Plan> PlanPlacement(const Model& model, const ActivationStats& stats,
                                   const PlannerOptions& options);

// The report `thermocline plan` prints: dense charges, per-layer counts and bytes, the expected
// GPU share.
std::string FormatPlan(const Plan& plan, const ModelConfig& config);
// The report `thermocline plan --show` prints for any placement file.
std::string FormatPlacement(const Placement& placement);

}  // namespace thermocline
