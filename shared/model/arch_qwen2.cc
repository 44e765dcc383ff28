// qwen2 (Qwen 1.5 / 2 / 2.5): llama with required q/k/v biases and NeoX RoPE.
#include "shared/model/arch_specs.h"

namespace thermocline {

const ArchSpec kQwen2Arch = {
    .name = "qwen2",
    .rope = RopeStyle::kNeox,
    .qkv_bias_required = true,
    .default_eps = 1e-6f,
};

}  // namespace thermocline
