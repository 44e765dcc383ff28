// bamboo (PowerInfer's Bamboo-7B): the llama block with dReLU, relu(gate x) * relu(up x), read
// from PowerInfer's files (ffn_down_t, fc1/fc2 predictors fed ffn_inp, as for llama).
#include "shared/model/arch_specs.h"

namespace thermocline {

const ArchSpec kBambooArch = {
    .name = "bamboo",
    .activation = FfnActivation::kDrelu,
};

}  // namespace thermocline
