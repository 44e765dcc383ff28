// falcon (Falcon-7B style, and PowerInfer's ReluFalcon): one LayerNorm feeds attention and a
// plain MLP in parallel; fused attn_qkv with multi-query attention. PowerInfer's predictors read
// the layer input itself (its build_falcon passes inpL).
#include "shared/model/arch_specs.h"

namespace thermocline {

const ArchSpec kFalconArch = {
    .name = "falcon",
    .norm = NormKind::kLayer,
    .rope = RopeStyle::kNeox,
    .activation = FfnActivation::kGelu,
    .gated_ffn = false,
    .parallel_block = true,
    .ffn_norm = false,
    .predictor_input = PredictorInput::kLayerInput,
    .eps_key = "attention.layer_norm_epsilon",
};

}  // namespace thermocline
