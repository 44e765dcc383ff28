// mistral: llama.cpp writes Mistral and Mixtral files as `llama`; some converters use `mistral`
// for the same block, so it reads the same way.
#include "shared/model/arch_specs.h"

namespace thermocline {

const ArchSpec kMistralArch = {
    .name = "mistral",
    .moe = true,
    .moe_weights_norm = true,
};

}  // namespace thermocline
