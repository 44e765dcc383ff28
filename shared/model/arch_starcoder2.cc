// starcoder2: LayerNorm with bias everywhere, biases on every projection, a plain GELU MLP.
#include "shared/model/arch_specs.h"

namespace thermocline {

const ArchSpec kStarcoder2Arch = {
    .name = "starcoder2",
    .norm = NormKind::kLayer,
    .rope = RopeStyle::kNeox,
    .activation = FfnActivation::kGelu,
    .gated_ffn = false,
    .eps_key = "attention.layer_norm_epsilon",
};

}  // namespace thermocline
