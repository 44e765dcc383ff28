#include "shared/sparsity/partition.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "shared/sparsity/activation_stats.h"
#include "shared/util/status_macros.h"

namespace thermocline {

absl::StatusOr<Partition> Partition::FromPlacement(const Placement& placement,
                                                   const ModelConfig& config) {
  TC_RETURN_IF_ERROR(ValidatePlacement(placement));
  if (static_cast<int64_t>(placement.layers.size()) != config.n_layers) {
    return absl::InvalidArgumentError(absl::StrCat("placement has ", placement.layers.size(),
                                                   " layers, the model ", config.n_layers));
  }
  Partition p;
  p.layers.resize(config.n_layers);
  for (int64_t l = 0; l < config.n_layers; ++l) {
    const LayerPlacement& lp = placement.layers[l];
    const int64_t n = LayerNeurons(config, l);
    if (static_cast<int64_t>(lp.on_gpu.size()) != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "placement layer ", l, " has ", lp.on_gpu.size(), " neurons, the model ", n,
          n != config.ffn_dim
              ? absl::StrCat(" (", config.n_experts, " experts x ", config.ffn_dim, ")")
              : ""));
    }
    LayerPartition& out = p.layers[l];
    out.cold_index.assign(n, -1);
    for (int32_t i = 0; i < n; ++i) {
      if (lp.on_gpu[i] != 0) {
        out.hot.push_back(i);
      } else {
        out.cold_index[i] = static_cast<int32_t>(out.cold.size());
        out.cold.push_back(i);
      }
    }
  }
  return p;
}

std::span<const int32_t> ExpertSlice(std::span<const int32_t> ids, int64_t expert,
                                     int64_t per_expert) {
  const auto begin = std::lower_bound(ids.begin(), ids.end(), expert * per_expert);
  const auto end = std::lower_bound(begin, ids.end(), (expert + 1) * per_expert);
  return ids.subspan(static_cast<size_t>(begin - ids.begin()), static_cast<size_t>(end - begin));
}

void SplitIds(const LayerPartition& layer, std::span<const int32_t> ids, std::vector<int32_t>* hot,
              std::vector<int32_t>* cold) {
  hot->clear();
  cold->clear();
  for (int32_t id : ids) (layer.cold_index[id] < 0 ? hot : cold)->push_back(id);
}

absl::StatusOr<Placement> PlacementFromFlags(const ModelConfig& config,
                                             const PlacementFlags& flags) {
  const bool has_plan = !flags.plan_path.empty();
  if (has_plan == flags.hot_fraction.has_value()) {
    return absl::InvalidArgumentError(
        has_plan ? "give either --plan or --hot-fraction, not both"
                 : "no placement: give --plan PLAN.gguf (from `thermocline plan`) or "
                   "--hot-fraction F");
  }
  if (has_plan) return ReadPlacement(flags.plan_path, config);
  const double f = *flags.hot_fraction;
  if (!std::isfinite(f) || f < 0 || f > 1) {
    return absl::InvalidArgumentError(absl::StrCat("--hot-fraction ", f, " is not in [0, 1]"));
  }
  if (flags.stats_path.empty()) return Placement::Uniform(config, f);
  TC_ASSIGN_OR_RETURN(ActivationStats stats, ReadActivationStats(flags.stats_path, &config));
  return Placement::Uniform(config, f, &stats);
}

}  // namespace thermocline
