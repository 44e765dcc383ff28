// llama: the reference block (RMSNorm, RoPE on adjacent pairs, SwiGLU). Covers Llama 1-3.x
// (rope_freqs, linear and YaRN scaling, key_length), ReluLLaMA / ProSparse (PowerInfer files)
// and Mixtral-style experts when <arch>.expert_count is set.
#include "shared/model/arch_specs.h"

namespace thermocline {

const ArchSpec kLlamaArch = {
    .name = "llama",
    .moe = true,
    .moe_weights_norm = true,
};

}  // namespace thermocline
