// qwen3moe (Qwen3-30B-A3B, ...): qwen3 attention; experts with renormalised top-k weights
// (norm_topk_prob), no shared expert.
#include "shared/model/arch_specs.h"
#include "shared/model/model.h"
#include "shared/util/status_macros.h"

namespace thermocline {
namespace {

absl::Status ReadQwen3Moe(const GgufFile& f, ModelConfig& c) {
  TC_ASSIGN_OR_RETURN(c.ffn_dim, ArchPositiveInt(f, c, "expert_feed_forward_length"));
  return absl::OkStatus();
}

}  // namespace

const ArchSpec kQwen3MoeArch = {
    .name = "qwen3moe",
    .rope = RopeStyle::kNeox,
    .qk_norm = true,
    .moe = true,
    .moe_weights_norm = true,
    .default_eps = 1e-6f,
    .read_extra = &ReadQwen3Moe,
};

}  // namespace thermocline
