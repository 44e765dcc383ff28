// Synthetic models of every architecture Thermocline runs (arch.h; llama by default): random
// weights of any size and type, a byte-level vocabulary, written as GGUF with exactly the keys
// and tensors llama.cpp's files of that architecture carry (the layout: synth_arch.h). For tests
// and benchmarks at sizes and in families no real model here has (the 1.3B F16 model is about
// 2.6 GB).
//
// Weights come from a counter-based generator keyed by (seed, tensor index, element index), so a
// file depends only on its options: the same bytes on every run and for any thread count.
//
// ReLU-gated models are shaped to sparsify like real ReLU LLMs (docs/synthetic-models.md): about
// `active_fraction` of a layer's neurons fire per token, neuron frequencies are heavily skewed,
// and which neurons fire depends on the token through a low-rank gate structure that a
// PowerInfer-style predictor can learn. The same weights can be written in PowerInfer's layout
// (PWRI magic, ffn_down_t, analytic fc1/fc2 predictors), so both engines run identical models.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shared/gguf/ggml_type.h"
#include "shared/gguf/gguf.h"

namespace thermocline {

// The FFN's activation, written as thermocline.ffn_activation. Each architecture takes its own
// or ReLU (the sparse variant, as ReluLLaMA and ReluFalcon are of theirs).
enum class SynthFfnKind {
  kArchDefault,  // the architecture's own (ArchSpec::activation)
  kSwiGlu,       // down(silu(gate x) * up x); "silu"
  kReluGated,    // down(relu(gate x) * up x), or down(relu(up x)) without a gate; "relu"
  kGelu,         // GELU, gated or not per the architecture; "gelu"
  kDrelu,        // down(relu(gate x) * relu(up x)) (bamboo); "drelu"
};

struct SynthOptions {
  std::string arch = "llama";  // general.architecture: one of KnownArchNames()
  int64_t dim = 256;
  int64_t ffn = 704;  // a multiple of 32, so the defaults work for every --type
  int64_t layers = 4;
  int64_t heads = 8;
  int64_t kv_heads = 4;
  int64_t vocab = 512;
  int64_t context = 512;
  int64_t head_dim = 0;  // 0: dim / heads, and no attention.key_length key
  // Mixture of experts (architectures with ArchSpec::moe). experts 0: none, or 4 where every
  // layer is MoE (qwen2moe, qwen3moe); experts_used 0: min(2, experts); expert_ffn 0: ffn (only
  // architectures with expert_feed_forward_length take another width; qwen2moe's shared expert
  // is ffn wide).
  int64_t experts = 0;
  int64_t experts_used = 0;
  int64_t expert_ffn = 0;
  // Architectures with sliding-window layers: the window; 0: min(4096, max(1, context / 2)).
  int64_t sliding_window = 0;
  GgmlType type = GgmlType::kF32;  // token embedding and matrices; norms are always F32
  SynthFfnKind ffn_kind = SynthFfnKind::kArchDefault;
  uint64_t seed = 1;
  // ReLU only (other activations ignore both): the share of a layer's FFN neurons that fire for a
  // typical token, in [0, 0.5]. 0 leaves every weight i.i.d. (about half the neurons fire, all
  // about equally often).
  double active_fraction = 0.1;
  // The spread of the neurons' firing thresholds (standard deviations of a token-to-token gate
  // fluctuation): 0 gives every neuron the same frequency; the default puts about half of all
  // activations on the 10% most frequent neurons. In [0, 4].
  double skew = 1.25;
  // A GGUF (a model or a vocabulary-only file such as llama.cpp's ggml-vocab-*.gguf) whose
  // tokenizer.* keys the model takes, with its vocabulary size (`vocab` is then ignored): every
  // tokenizer kind can be served end to end. "": the byte-level SentencePiece vocabulary.
  std::string tokenizer_from;
  std::string name = "thermocline-synth";
  int threads = 0;  // 0 = all cores; never changes the output
  // Called after each tensor is generated, with bytes done and total tensor bytes.
  std::function<void(int64_t done, int64_t total)> progress;
};

// Checks the shape options; the error names the flag (--dim, --heads, ...) and its value, and
// the architecture where it is what refuses the flag.
absl::Status ValidateSynthOptions(const SynthOptions& options);

// The ffn_kind an options struct resolves to (kArchDefault: the architecture's own), and the
// kinds the architecture takes, in the command's spelling ("swiglu", "relu-gated", "relu",
// "gelu", "drelu"): its own activation and ReLU.
SynthFfnKind ResolvedSynthFfnKind(const SynthOptions& options);
std::string SynthFfnKindName(std::string_view arch, SynthFfnKind kind);
std::vector<SynthFfnKind> SynthFfnKinds(std::string_view arch);

// The number of weights the llama.cpp-layout file holds (every tensor's elements).
int64_t SynthParameterCount(const SynthOptions& options);

// llama.cpp's tensor layout, or (--arch llama only) PowerInfer's: magic PWRI,
// blk.N.ffn_down_t.weight (one row per neuron, ggml ne = (dim, ffn)) instead of ffn_down, the
// analytic predictors blk.N.fc1.weight ne = (dim, rank) and blk.N.fc2.weight ne = (rank, ffn) in
// F16, and powerinfer.sparse_threshold = 0. The weights are the same values in both layouts;
// F32, F16 and BF16 files hold them bit for bit, Q8_0/Q4_0 quantize ffn_down_t along its own
// rows.
enum class SynthLayout { kLlamaCpp, kPowerInfer };

// The realistic ReLU construction, derived from the options (docs/synthetic-models.md). With
// x the residual stream and h = ffn_norm(x) the FFN input of layer l:
//   * coordinate k = persistent_dim of x is persistent_value for every token: the embeddings
//     set it and no block writes it (attn_output and ffn_down rows k are zero);
//   * ffn_norm[k] = gate_scale * residual_rms[l] / persistent_value, so h_k is about gate_scale;
//   * gate row i = a * c_i . B + b * e_i off coordinate k (B: basis_rank random directions per
//     layer, c_i the neuron's loadings, e_i i.i.d. noise, a^2 = explained, a^2 + b^2 = 1), and
//     gate[i][k] = -t_i / gate_scale, so the gate pre-activation is a token-dependent N(0, 1)
//     term minus t_i;
//   * t_i ~ N(threshold_mean, threshold_spread^2), so neuron i fires with probability
//     Phi(-t_i), and the mean over neurons is active_fraction.
// residual_rms[l] is the expected per-element RMS of x at layer l's FFN (see ResidualRms in
// synth.cc), which fixes the gate's scale relative to the stream it reads.
struct SynthSparsityDesign {
  bool enabled = false;  // ReLU-gated with active_fraction > 0
  int64_t persistent_dim = 0;
  float persistent_value = 1.0f;
  int64_t basis_rank = 0;
  double explained = 0;
  double threshold_mean = 0, threshold_spread = 0;
  double gate_scale = 0;
  std::vector<double> residual_rms;  // one per layer
  // The analytic predictor (PowerInfer layout): fc1 = [B; -B; e_k / gate_scale], fc2 row i =
  // [a c_i, -a c_i, -t_i + predictor_margin], so its score is the gate's low-rank part plus the
  // margin, which is chosen for predictor_recall on the model's own Gaussian statistics.
  double predictor_margin = 0;
  double predictor_recall = 0;  // expected recall at the margin
  int64_t predictor_rank() const { return 2 * basis_rank + 1; }
};

SynthSparsityDesign DesignSynthSparsity(const SynthOptions& options);

// Neuron i's threshold t_i in layer l (the design's distribution; neuron i of a token fires
// when its token-dependent N(0, 1) gate term exceeds t_i).
std::vector<float> SynthNeuronThresholds(const SynthOptions& options,
                                         const SynthSparsityDesign& design, int64_t layer);

// Role of a tensor, which decides how its weights are drawn. Each role has its own generator so
// that realistic activation statistics can later be given to one role without touching others.
enum class SynthRole {
  kTokenEmbedding,
  kNorm,     // every norm's weight but ffn_norm's (attn_norm, output_norm, q/k and post norms)
  kFfnNorm,  // the FFN's norm: ones, and the persistent coordinate's gain in shaped ReLU models
  kAttnQ,
  kAttnK,
  kAttnV,
  kAttnOutput,
  kFfnGate,
  kFfnUp,
  kFfnDown,
  kOutput,
  kBias,    // projection and LayerNorm biases: small, nonzero
  kFfnNormBias,  // the FFN's LayerNorm bias: as kBias; coordinate k's constant when shaped
  kRouter,  // ffn_gate_inp (the MoE router) and ffn_gate_inp_shexp
};

// Weights [begin, end) of a tensor with ggml shape (fan_in, rows...) in element order.
// `tensor_index` is the tensor's position in the file.
void SynthWeights(SynthRole role, uint64_t seed, uint64_t tensor_index, int64_t fan_in,
                  int64_t begin, int64_t end, float* out);

struct SynthVocab {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t>
      types;  // llama.cpp token types: 1 normal, 2 unknown, 3 control, 5 unused, 6 byte
};

// 0 <unk>, 1 <s>, 2 </s>, 3..258 <0x00>..<0xFF>, then common English pieces (spaces as U+2581,
// every piece's prefixes present so merges can build it, shorter and commoner pieces scored
// higher), then <unused_N>. vocab_size must be at least 259.
SynthVocab MakeSynthVocab(int64_t vocab_size);

// Metadata and tensors of the model, ready to write (fillers run while writing).
absl::StatusOr<GgufWriter> BuildSynthModel(const SynthOptions& options,
                                           SynthLayout layout = SynthLayout::kLlamaCpp);

// Validates, builds and writes the model to `path`.
absl::Status WriteSynthModel(const SynthOptions& options, const std::string& path,
                             SynthLayout layout = SynthLayout::kLlamaCpp);

}  // namespace thermocline
