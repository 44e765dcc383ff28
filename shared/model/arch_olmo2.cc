// olmo2: no pre-norms; RMSNorm over the whole q and k projections; RMSNorm of each sublayer's
// output before the residual add.
#include "shared/model/arch_specs.h"

namespace thermocline {

const ArchSpec kOlmo2Arch = {
    .name = "olmo2",
    .rope = RopeStyle::kNeox,
    .attn_norm = false,
    .ffn_norm = false,
    .post_attn_norm = true,
    .post_ffn_norm = true,
    .qk_norm = true,
    .default_eps = 1e-6f,
};

}  // namespace thermocline
