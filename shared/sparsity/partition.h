// The hot/cold split of every layer's FFN neurons that the two workers of a split share: the
// GPU worker computes the hot neurons, the CPU worker the cold ones, and both derive the same
// split from the same flags (a placement file from `thermocline plan`, or a uniform hot
// fraction for tests), so neither has to tell the other which neuron lives where.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shared/model/model.h"
#include "shared/sparsity/placement.h"

namespace thermocline {

// In MoE layers the ids are the flat expert-neuron ids of placement.h (e * ffn_dim + i), so one
// expert's hot or cold neurons are one contiguous run of each list (ExpertSlice).
struct LayerPartition {
  std::vector<int32_t> hot;         // ascending global neuron ids on the GPU side
  std::vector<int32_t> cold;        // ascending global ids on the CPU side
  std::vector<int32_t> cold_index;  // [LayerNeurons]: position in `cold`, or -1 for a hot neuron

  int64_t n_cold() const { return static_cast<int64_t>(cold.size()); }
};

struct Partition {
  std::vector<LayerPartition> layers;

  // hot = the placement's gpu_bucket, cold = the rest; the placement must match `config`.
  static absl::StatusOr<Partition> FromPlacement(const Placement& placement,
                                                 const ModelConfig& config);
};

// The run of an ascending flat id list that belongs to `expert` (ids in [expert * per_expert,
// (expert + 1) * per_expert)).
std::span<const int32_t> ExpertSlice(std::span<const int32_t> ids, int64_t expert,
                                     int64_t per_expert);

// Splits ascending global ids into the hot ones and the cold ones (both stay ascending).
void SplitIds(const LayerPartition& layer, std::span<const int32_t> ids, std::vector<int32_t>* hot,
              std::vector<int32_t>* cold);

// The placement flags both workers take: `plan_path` (a .gpuidx file) or `hot_fraction` in
// [0, 1] (Placement::Uniform, hottest neurons first when `stats_path` names activation
// statistics, else the lowest ids). Exactly one of the two; errors name the flags.
struct PlacementFlags {
  std::string plan_path;
  std::optional<double> hot_fraction;
  std::string stats_path;
};
absl::StatusOr<Placement> PlacementFromFlags(const ModelConfig& config,
                                             const PlacementFlags& flags);

}  // namespace thermocline
