#include "shared/model/synth_arch.h"

#include <array>

namespace thermocline {
namespace {

// The one table: each entry is what llama.cpp's converter writes for that family (its
// convert_hf_to_gguf.py and the loader's required tensors), so a synthetic file exercises the
// same code paths a real one does. synth_test checks that it covers every ArchSpec.
constexpr std::array<SynthArchLayout, 13> kLayouts = {{
    {.arch = "llama"},
    {.arch = "mistral"},
    {.arch = "bamboo"},
    {.arch = "qwen2", .qkv_bias = true},
    {.arch = "qwen2moe",
     .qkv_bias = true,
     .experts_only = true,
     .expert_ffn_key = true,
     .shared_expert = true},
    {.arch = "qwen3"},
    {.arch = "qwen3moe", .experts_only = true, .expert_ffn_key = true},
    {.arch = "olmo2", .qk_norm_whole = true},
    // Gemma 2's released configs cap attention scores at 50 and logits at 30.
    {.arch = "gemma2", .attn_softcap = 50.0f, .final_softcap = 30.0f},
    {.arch = "gemma3"},
    {.arch = "phi3", .fused_qkv = true, .fused_gate_up = true},
    {.arch = "starcoder2", .qkv_bias = true, .other_biases = true},
    {.arch = "falcon", .fused_qkv = true},
}};

}  // namespace

const SynthArchLayout* FindSynthArchLayout(std::string_view arch) {
  for (const SynthArchLayout& l : kLayouts) {
    if (l.arch == arch) return &l;
  }
  return nullptr;
}

std::span<const SynthArchLayout> AllSynthArchLayouts() { return kLayouts; }

}  // namespace thermocline
