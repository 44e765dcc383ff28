// qwen2moe (Qwen1.5-MoE, Qwen2-MoE): qwen2 attention; experts whose top-k weights are used as
// the softmax gives them (not renormalised) plus a shared expert gated by sigmoid(w . x).
#include "shared/model/arch_specs.h"
#include "shared/model/model.h"
#include "shared/util/status_macros.h"

namespace thermocline {
namespace {

absl::Status ReadQwen2Moe(const GgufFile& f, ModelConfig& c) {
  TC_ASSIGN_OR_RETURN(c.ffn_dim, ArchPositiveInt(f, c, "expert_feed_forward_length"));
  if (f.FindValue("qwen2moe.expert_shared_feed_forward_length") != nullptr) {
    TC_ASSIGN_OR_RETURN(c.shared_expert_ffn_dim,
                        ArchPositiveInt(f, c, "expert_shared_feed_forward_length"));
  }
  return absl::OkStatus();
}

}  // namespace

const ArchSpec kQwen2MoeArch = {
    .name = "qwen2moe",
    .rope = RopeStyle::kNeox,
    .qkv_bias_required = true,
    .moe = true,
    .moe_weights_norm = false,
    .default_eps = 1e-6f,
    .read_extra = &ReadQwen2Moe,
};

}  // namespace thermocline
