// The architecture layer: what distinguishes one transformer family from another, as data.
//
// Every architecture is one ArchSpec: which norms a block has and where, how RoPE pairs its
// dimensions, the FFN's form and activation, which keys and tensors llama.cpp's files carry for
// it. The loader (model.cc) reads any of them into one ModelConfig + LayerWeights, and the
// forward pass (runtime/forward.cc) executes that one description for every architecture; no
// code anywhere else branches on the architecture's name. docs/architectures.md explains how to
// add one.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace thermocline {

class GgufFile;
struct ModelConfig;

enum class FfnActivation {
  kSilu,  // SwiGLU: down(silu(gate x) * up x)
  kRelu,  // ReLU-gated (ReluLLaMA, ProSparse) or plain ReLU MLP (ReluFalcon)
  kGelu,  // GELU (tanh form, through ggml's fp16 table: ops.h Gelu)
  kDrelu,  // dReLU (PowerInfer's Bamboo, TurboSparse): down(relu(gate x) * relu(up x))
};

// ReLU-family activations: a neuron whose gate pre-activation is <= 0 contributes exactly 0,
// so `exact` sparsity applies and predictors are trained on "gate > 0".
inline bool IsReluFamily(FfnActivation a) {
  return a == FfnActivation::kRelu || a == FfnActivation::kDrelu;
}
const char* ActivationName(FfnActivation a);  // "silu", "relu", "gelu", "drelu"

enum class NormKind {
  kRms,    // w * x / sqrt(mean(x^2) + eps)
  kLayer,  // w * (x - mean) / sqrt(var + eps) + b (LayerNorm, weight and bias)
};

enum class RopeStyle {
  kNorm,  // rotates adjacent pairs (x[2j], x[2j+1]) (llama, run.c)
  kNeox,  // rotates (x[j], x[j + rope_dim/2]) (GPT-NeoX; qwen2, gemma2, phi3, falcon, ...)
};

// Which layers attend through a sliding window (`<arch>.attention.sliding_window`).
enum class SlidingLayers {
  kNone,
  kAll,        // phi3
  kEven,       // layers 0, 2, 4, ... (gemma2)
  kFiveOfSix,  // every layer but 5, 11, 17, ... (gemma3)
};

// What the PowerInfer predictors of a layer read (docs/formats.md): the tensor PowerInfer's own
// graph builder passes to its sparse FFN as the predictor input.
enum class PredictorInput {
  kFfnInput,    // ffn_inp: the residual stream after attention, before ffn_norm (llama family)
  kLayerInput,  // the layer's input before its norm (parallel blocks: falcon)
};

struct ArchSpec {
  std::string_view name;  // general.architecture, and the prefix of its hyperparameter keys
  NormKind norm = NormKind::kRms;
  RopeStyle rope = RopeStyle::kNorm;
  FfnActivation activation = FfnActivation::kSilu;
  bool gated_ffn = true;        // down(act(gate x) * up x); else down(act(up x))
  bool parallel_block = false;  // x += attn(n(x)) + ffn(n(x)) from one norm (falcon)
  bool attn_norm = true;        // a norm before attention (olmo2: none)
  bool ffn_norm = true;         // a norm before the FFN (olmo2 and parallel blocks: none)
  bool post_attn_norm = false;  // RMSNorm of the attention output before the residual add
  bool post_ffn_norm = false;   // RMSNorm of the FFN output before the residual add
  bool qk_norm = false;         // attn_q_norm / attn_k_norm (whole projection or per head)
  bool embed_scale = false;     // embeddings multiplied by sqrt(dim) (gemma)
  bool output_always_tied = false;  // no output.weight ever (gemma)
  bool qkv_bias_required = false;   // attn_{q,k,v}.bias must be present (qwen2)
  SlidingLayers sliding = SlidingLayers::kNone;
  bool moe = false;             // expert_count / ffn_*_exps (the llama arch: when the key is set)
  bool moe_weights_norm = true;  // top-k routing weights renormalised to sum 1 (Mixtral)
  PredictorInput predictor_input = PredictorInput::kFfnInput;
  // The epsilon key after "<arch>.": RMSNorm and LayerNorm use different names.
  std::string_view eps_key = "attention.layer_norm_rms_epsilon";
  float default_eps = 1e-5f;
  // Hyperparameters the architecture reads beyond the common ones (softcaps, expert widths, ...),
  // run after the common keys are in `config`; null: none.
  absl::Status (*read_extra)(const GgufFile& file, ModelConfig& config) = nullptr;
};

// The spec of `general.architecture` = name, or null.
const ArchSpec* FindArch(std::string_view name);
// Every architecture Thermocline runs, for messages and `synth --arch`.
std::span<const ArchSpec* const> AllArchs();
std::string KnownArchNames();  // "llama, qwen2, ..."

}  // namespace thermocline
