// gemma2: embeddings x sqrt(dim), always-tied output, post-attention and post-FFN norms,
// GELU-gated FFN, soft-capped attention scores and logits, a sliding window on even layers.
#include "shared/model/arch_specs.h"

#include <cmath>

#include "shared/model/model.h"
#include "shared/util/status_macros.h"

namespace thermocline {
namespace {

absl::Status ReadGemma2(const GgufFile& f, ModelConfig& c) {
  TC_ASSIGN_OR_RETURN(c.attn_softcap, ArchPositiveRealOr(f, c, "attn_logit_softcapping", 0.0f));
  TC_ASSIGN_OR_RETURN(c.final_softcap, ArchPositiveRealOr(f, c, "final_logit_softcapping", 0.0f));
  // Gemma 2 27B (46 layers) scales queries by 1/sqrt(dim / heads), the others by the head size
  // (llama.cpp's rule, from gemma_pytorch).
  if (c.n_layers == 46) c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.dim / c.n_heads));
  TC_RETURN_IF_ERROR(ArchPositiveInt(f, c, "attention.sliding_window").status());
  return absl::OkStatus();
}

}  // namespace

const ArchSpec kGemma2Arch = {
    .name = "gemma2",
    .rope = RopeStyle::kNeox,
    .activation = FfnActivation::kGelu,
    .post_attn_norm = true,
    .post_ffn_norm = true,
    .embed_scale = true,
    .output_always_tied = true,
    .sliding = SlidingLayers::kEven,
    .default_eps = 1e-6f,
    .read_extra = &ReadGemma2,
};

}  // namespace thermocline
