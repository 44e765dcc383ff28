// Which FFN neurons of each layer live on the GPU: `thermocline plan` writes it, the GPU
// worker reads it. The format is PowerInfer's .gpuidx sidecar, so either engine reads the
// other's plans:
//   magic "PWRI" (version 3), general.architecture = "generic.gpu_index",
//   split.vram_capacity u64, llama-style block_count,
//   blk.N.gpu_idx    I32 [ffn_dim]   1 if neuron i is on the GPU, else 0
//   blk.N.gpu_bucket I32 [n_gpu]     the GPU neurons' ids, ascending
// plus our own keys (thermocline.plan.*) for the expected GPU share of activations.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shared/model/llama_model.h"
#include "shared/sparsity/activation_stats.h"

namespace thermocline {

struct LayerPlacement {
  std::vector<int32_t> gpu_bucket;  // ascending neuron ids placed on the GPU
  std::vector<uint8_t> on_gpu;      // [ffn_dim] 0/1
};

struct Placement {
  std::vector<LayerPlacement> layers;
  int64_t vram_capacity = 0;          // bytes the plan was made for
  double expected_gpu_share = 0;      // share of activations expected on the GPU (0 if unknown)

  // Every layer's neurons split by a fixed fraction, hottest first when stats are given, else
  // the lowest ids (for tests: --hot-fraction).
  static Placement Uniform(const LlamaConfig& config, double hot_fraction,
                           const ActivationStats* stats = nullptr);
};

absl::Status WritePlacement(const Placement& placement, const std::string& path);
absl::StatusOr<Placement> ReadPlacement(const std::string& path, const LlamaConfig& config);

}  // namespace thermocline
