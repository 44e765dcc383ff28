// How `thermocline synth` lays out each architecture's file: the choices a real file makes that
// the architecture's spec (arch.h) leaves to the file, because the loader reads them from which
// tensors are present (fused or separate projections, biases, the q/k norm's size) or from
// optional keys (soft-caps, expert widths). Everything else (norm kind, which norms, the FFN's
// form, tied output, epsilon key, sliding layers) comes from the ArchSpec itself, so synth and
// the loader cannot disagree about it.
#pragma once

#include <span>
#include <string_view>

namespace thermocline {

struct ArchSpec;

struct SynthArchLayout {
  std::string_view arch;        // ArchSpec::name
  bool fused_qkv = false;       // one attn_qkv [q | k | v] (phi3, falcon)
  bool fused_gate_up = false;   // one ffn_up [gate | up] of 2 * ffn rows (phi3)
  bool qkv_bias = false;        // attn_{q,k,v}.bias (qwen2, qwen2moe, starcoder2)
  bool other_biases = false;    // attn_output.bias, ffn_up.bias, ffn_down.bias (starcoder2)
  bool qk_norm_whole = false;   // q/k norms over the whole projection (olmo2), not per head
  bool experts_only = false;    // every layer is MoE (qwen2moe, qwen3moe)
  bool expert_ffn_key = false;  // <arch>.expert_feed_forward_length sets the experts' width
  bool shared_expert = false;   // ffn_*_shexp and ffn_gate_inp_shexp (qwen2moe)
  float attn_softcap = 0.0f;    // <arch>.attn_logit_softcapping when > 0 (gemma2)
  float final_softcap = 0.0f;   // <arch>.final_logit_softcapping when > 0 (gemma2)
};

// The layout of every architecture FindArch knows, or null for an unknown name.
const SynthArchLayout* FindSynthArchLayout(std::string_view arch);
std::span<const SynthArchLayout> AllSynthArchLayouts();

}  // namespace thermocline
