// A transformer read from GGUF: the architecture's description (arch.h) resolved into one
// ModelConfig (hyperparameters and per-layer flags) and LayerWeights (views into the mapped
// file), plus the tokenizer.
//
// Every tensor the forward pass touches is checked for presence, type and shape at load time,
// and every tensor of the file must be one the architecture uses, so a file that loads can be
// run without further checks and a file that disagrees with its metadata does not load.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shared/model/arch.h"
#include "shared/gguf/gguf.h"
#include "shared/gguf/matrix_view.h"
#include "shared/tokenizer/tokenizer.h"
#include "shared/util/page_arena.h"

namespace thermocline {

// RoPE frequency scaling (`<arch>.rope.scaling.*`), as llama.cpp applies it.
struct RopeScaling {
  enum class Kind { kNone, kLinear, kYarn };
  Kind kind = Kind::kNone;
  float factor = 1.0f;             // positions are divided by it (freq_scale = 1 / factor)
  int64_t original_context = 0;    // YaRN's n_ctx_orig
  float ext_factor = 1.0f;         // YaRN ramp mix (llama.cpp's default for yarn)
  float attn_factor = 1.0f;
  float beta_fast = 32.0f, beta_slow = 1.0f;
};

// What differs between the layers of one model.
struct LayerConfig {
  int64_t sliding_window = 0;  // 0: attends to every earlier position; else to the last n
  float rope_freq_base = 10000.0f;
  bool moe = false;
};

struct ModelConfig {
  const ArchSpec* arch = nullptr;  // null only in configs tests build by hand
  int64_t dim = 0;
  int64_t ffn_dim = 0;  // neurons per FFN (per expert in MoE layers)
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;  // attention.key_length (default dim / n_heads)
  int64_t q_dim = 0;     // n_heads * head_dim
  int64_t kv_dim = 0;    // n_kv_heads * head_dim
  int64_t rope_dim = 0;  // leading dims of each head that RoPE rotates (rope.dimension_count)
  int64_t context_length = 0;
  int64_t vocab_size = 0;
  float rms_eps = 1e-5f;  // the norm epsilon (RMSNorm or LayerNorm, per the architecture)
  float rope_freq_base = 10000.0f;
  RopeScaling rope_scaling;
  FfnActivation activation = FfnActivation::kSilu;
  float attn_scale = 0.0f;     // scores = scale * q.k; set to 1/sqrt(head_dim) by the loader
  float attn_softcap = 0.0f;   // > 0: scores = cap * tanh(scores / cap) (gemma2)
  float final_softcap = 0.0f;  // > 0: logits = cap * tanh(logits / cap)
  // Mixture of experts: n_experts > 0 in MoE layers' models.
  int64_t n_experts = 0;
  int64_t n_experts_used = 0;
  int64_t shared_expert_ffn_dim = 0;  // 0: no shared expert
  bool expert_weights_norm = true;
  std::vector<LayerConfig> layers;

  bool moe() const { return n_experts > 0; }
  bool gated_ffn() const { return arch == nullptr || arch->gated_ffn; }
  std::string arch_name() const { return arch == nullptr ? "llama" : std::string(arch->name); }
};

// One expert's FFN (or the dense FFN): gate is empty for non-gated FFNs.
struct FfnWeights {
  MatrixView gate, up;  // [ffn_dim][dim]: one row per neuron
  MatrixView down;      // [dim][ffn_dim] (llama.cpp's ffn_down)
};

struct LayerWeights {
  // Norms are tiny and converted to f32 at load; an empty vector means "absent".
  std::vector<float> attn_norm, attn_norm_b;
  MatrixView wq, wk, wv, wo;  // views into attn_qkv when the file stores it fused
  std::vector<float> bq, bk, bv, bo;
  std::vector<float> q_norm, k_norm;  // [q_dim]/[kv_dim] (whole projection) or [head_dim]
  std::vector<float> post_attn_norm;
  std::vector<float> ffn_norm, ffn_norm_b;
  // The dense FFN: gate empty for non-gated FFNs; views into a fused ffn_up ([gate|up], phi3).
  MatrixView gate, up;  // [ffn_dim][dim]: one row per neuron
  std::vector<float> up_b;
  // Exactly one of these is set: down is [dim][ffn_dim] (llama.cpp's ffn_down); down_t is
  // [ffn_dim][dim] (PowerInfer's ffn_down_t: one row per neuron, for sparse axpy).
  MatrixView down;
  MatrixView down_t;
  bool has_down_t = false;
  std::vector<float> down_b;
  std::vector<float> post_ffn_norm;
  // MoE layers: router [n_experts][dim] (ffn_gate_inp), each expert's FFN, and the optional
  // shared expert scaled by sigmoid(shared_gate . h).
  MatrixView router;
  std::vector<FfnWeights> experts;
  FfnWeights shared;
  std::vector<float> shared_gate;
};

// What a model is, without its weights: hyperparameters and tokenizer from the file's header
// alone (GgufFile::OpenHeader: nothing mapped), for the gateway, which tokenizes and sizes
// requests but never computes. Errors are those Model::Load gives for the same keys; the
// tensors are not checked (the workers, which load them, do).
struct ModelDescription {
  ModelConfig config;
  Tokenizer tokenizer;
};
absl::StatusOr<ModelDescription> ReadModelDescription(const std::string& path);

// Whether Load scans the weight matrices for NaN and infinity (norms, biases and every other
// vector are always checked as they are read). A non-finite weight poisons every token whose
// activations touch it, so it is refused at load, naming the tensor, its layer and the element,
// rather than served as garbage.
enum class TensorCheck {
  kAuto,  // every matrix when the file is at most kTensorCheckAutoBytes, else vectors only
  kOn,    // every matrix, whatever the size (seconds per GiB)
  kOff,   // vectors only
};
inline constexpr int64_t kTensorCheckAutoBytes = int64_t{2} << 30;
// "auto", "on", "off"; InvalidArgument naming the allowed ones otherwise.
absl::StatusOr<TensorCheck> TensorCheckFromName(std::string_view name);

class Model {
 public:
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& path,
                                                     TensorCheck check = TensorCheck::kAuto);
  static absl::StatusOr<std::unique_ptr<Model>> FromGguf(std::unique_ptr<GgufFile> file);

  const ModelConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  const GgufFile& file() const { return *file_; }

  const MatrixView& token_embd() const { return token_embd_; }
  const MatrixView& output() const { return output_; }  // == token_embd when tied
  bool output_tied() const { return output_tied_; }
  const std::vector<float>& output_norm() const { return output_norm_; }
  const std::vector<float>& output_norm_b() const { return output_norm_b_; }
  // Per-frequency divisors of RoPE's theta (rope_freqs.weight, Llama 3.1); empty: none.
  const std::vector<float>& rope_freqs() const { return rope_freqs_; }
  const LayerWeights& layer(int64_t l) const { return layers_[l]; }

  // The element type of the FFN matrices ("f32", "q4_0", ...) for reports.
  std::string weight_type_name() const;
  // Bytes of weights one decode step reads (all matrices, one embedding row; in MoE layers the
  // router and n_experts_used experts).
  int64_t decode_bytes_per_token() const;
  // Bytes of the interleaved copies made at load (MatrixView::interleaved; THERMOCLINE_REPACK).
  int64_t interleaved_bytes() const;
  // Interleaves the dense FFN's matrices of the types with an interleaved layout too (gate, up,
  // down of non-MoE layers; never down_t), for a caller that multiplies the FFN whole: the
  // `dense` sparsity mode without TEAL on the FFN. The row layout stays, so anything built later that gathers
  // rows still works (the copy's memory is then wasted). Nothing happens with
  // THERMOCLINE_REPACK=0; an invalid value is an error, as at load.
  absl::Status InterleaveDenseFfn();

 private:
  Model() = default;
  absl::Status Init();
  void InterleaveDenseMatrices();
  void Interleave(MatrixView& m);  // adds m's interleaved copy (interleaved8.h), once

  std::unique_ptr<GgufFile> file_;
  ModelConfig config_;
  Tokenizer tokenizer_;
  MatrixView token_embd_, output_;
  bool output_tied_ = false;
  std::vector<float> output_norm_, output_norm_b_, rope_freqs_;
  std::vector<LayerWeights> layers_;
  // Owned interleaved copies (separate memory: the file stays mapped read-only and clean), on
  // huge pages where the kernel gives them: decode streams them whole every token.
  PageArena interleaved_;
};

}  // namespace thermocline
