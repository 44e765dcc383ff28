// gemma3: gemma2's block without soft-capping, with per-head q/k RMSNorm; five sliding-window
// layers to one global layer, the sliding ones with RoPE base 10000 (llama.cpp's rule).
#include "shared/model/arch_specs.h"

#include <cmath>

#include "shared/model/model.h"
#include "shared/util/status_macros.h"

namespace thermocline {
namespace {

absl::Status ReadGemma3(const GgufFile& f, ModelConfig& c) {
  if (c.n_layers == 62) c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.dim / c.n_heads));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    if (c.layers[l].sliding_window > 0) c.layers[l].rope_freq_base = 10000.0f;
  }
  (void)f;
  return absl::OkStatus();
}

}  // namespace

const ArchSpec kGemma3Arch = {
    .name = "gemma3",
    .rope = RopeStyle::kNeox,
    .activation = FfnActivation::kGelu,
    .post_attn_norm = true,
    .post_ffn_norm = true,
    .qk_norm = true,
    .embed_scale = true,
    .output_always_tied = true,
    .sliding = SlidingLayers::kFiveOfSix,
    .default_eps = 1e-6f,
    .read_extra = &ReadGemma3,
};

}  // namespace thermocline
