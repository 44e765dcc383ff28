// Which FFN neurons of each layer live on the GPU: `thermocline plan` writes it, the GPU
// worker reads it. The format is PowerInfer's .gpuidx sidecar, so either engine reads the
// other's plans:
//   magic "PWRI" (version 3), general.architecture = "generic.gpu_index",
//   split.vram_capacity u64, generic.gpu_index.block_count u32 (what gguf-py's add_block_count
//   writes for that architecture; llama.block_count is accepted on read),
//   blk.N.gpu_idx    I32 [ffn_dim]   1 if neuron i is on the GPU, else 0
//   blk.N.gpu_bucket I32 [n_gpu]     the GPU neurons' ids, ascending
// In mixture-of-experts layers (no PowerInfer equivalent) the layer's neurons are every expert's,
// numbered e * ffn_dim + i for neuron i of expert e (LayerNeurons), so gpu_idx has
// n_experts * ffn_dim entries and the bucket lists those ids; each expert is split on its own.
// plus our own keys (thermocline.plan.*) for the expected GPU share of activations. PowerInfer's
// ggml numbers I32 as 18 (today's 26); the PWRI magic makes the GGUF reader and writer use its
// numbering (see ggml_type.h), so PowerInfer reads our files and we read its.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shared/model/model.h"
#include "shared/sparsity/activation_stats.h"

namespace thermocline {

// Neurons a layer places: ffn_dim, or n_experts * ffn_dim in an MoE layer (ids e * ffn_dim + i).
int64_t LayerNeurons(const ModelConfig& config, int64_t layer);

struct LayerPlacement {
  std::vector<int32_t> gpu_bucket;  // ascending neuron ids placed on the GPU
  std::vector<uint8_t> on_gpu;      // [LayerNeurons] 0/1
};

struct Placement {
  std::vector<LayerPlacement> layers;
  int64_t vram_capacity = 0;      // bytes the plan was made for
  double expected_gpu_share = 0;  // share of activations expected on the GPU (0 if unknown)
  int64_t gpu_ffn_bytes = 0;      // bytes of the GPU neurons' gate/up/down rows (0 if unknown)
  // The KV cache the plan charged for: the gateway's --kv-slots, positions per slot and
  // element type ("f32" / "f16"). A gateway serving another configuration would hold a
  // different amount of VRAM than planned, so it refuses the plan. kv_slots 0: not recorded
  // (PowerInfer's plans, older ones).
  int32_t kv_slots = 0;
  int32_t kv_context = 0;
  std::string kv_type;

  int64_t n_gpu_neurons() const;

  // Every layer's neurons split by a fixed fraction, hottest first when stats are given, else
  // the lowest ids (for tests: --hot-fraction). In MoE layers each expert gets the fraction of
  // its own neurons.
  static Placement Uniform(const ModelConfig& config, double hot_fraction,
                           const ActivationStats* stats = nullptr);
};

// Checks what a file must satisfy (bucket ascending, in range and equal to the on_gpu set).
absl::Status ValidatePlacement(const Placement& placement);
absl::Status WritePlacement(const Placement& placement, const std::string& path);
// Validates the file and its shapes against `config` (layers, LayerNeurons); errors in MoE
// layers name the expert and its neuron.
absl::StatusOr<Placement> ReadPlacement(const std::string& path, const ModelConfig& config);
// The same without a model: shapes come from the file (for `thermocline plan --show`).
absl::StatusOr<Placement> ReadPlacement(const std::string& path);

}  // namespace thermocline
