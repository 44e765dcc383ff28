// qwen3: qwen2 without attention biases, with RMSNorm of q and k per head before RoPE.
#include "shared/model/arch_specs.h"

namespace thermocline {

const ArchSpec kQwen3Arch = {
    .name = "qwen3",
    .rope = RopeStyle::kNeox,
    .qk_norm = true,
    .default_eps = 1e-6f,
};

}  // namespace thermocline
