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

struct LayerPartition {
  std::vector<int32_t> hot;         // ascending global neuron ids on the GPU side
  std::vector<int32_t> cold;        // ascending global ids on the CPU side
  std::vector<int32_t> cold_index;  // [ffn_dim]: position in `cold`, or -1 for a hot neuron

  int64_t n_cold() const { return static_cast<int64_t>(cold.size()); }
};

struct Partition {
  std::vector<LayerPartition> layers;

  // hot = the placement's gpu_bucket, cold = the rest; the placement must match `config`.
  static absl::StatusOr<Partition> FromPlacement(const Placement& placement,
                                                 const ModelConfig& config);
};

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
