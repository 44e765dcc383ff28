// phi3 (Phi-3 / 3.5 mini and medium): fused attn_qkv and fused [gate|up] ffn_up (both read as
// views by the loader), NeoX RoPE, a sliding window on every layer when the file sets one.
#include "shared/model/arch_specs.h"

namespace thermocline {

const ArchSpec kPhi3Arch = {
    .name = "phi3",
    .rope = RopeStyle::kNeox,
    .sliding = SlidingLayers::kAll,
};

}  // namespace thermocline
