// A llama-architecture model read from GGUF: hyperparameters from metadata, weights as views
// into the mapped file, and the tokenizer.
//
// Every tensor the forward pass touches is checked for presence, type and shape at load time,
// so a file that loads can be run without further checks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shared/kernels/matmul.h"
#include "shared/model/gguf.h"
#include "shared/tokenizer/tokenizer.h"

namespace thermocline {

enum class FfnActivation {
  kSilu,  // SwiGLU: down(silu(gate x) * up x)
  kRelu,  // ReLU-gated (ReluLLaMA, ProSparse): down(relu(gate x) * up x)
};

struct LlamaConfig {
  int64_t dim = 0;
  int64_t ffn_dim = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;  // dim / n_heads
  int64_t kv_dim = 0;    // n_kv_heads * head_dim
  int64_t rope_dim = 0;  // leading dims of each head that RoPE rotates (llama.rope.dimension_count)
  int64_t context_length = 0;
  int64_t vocab_size = 0;
  float rms_eps = 1e-5f;
  float rope_freq_base = 10000.0f;
  FfnActivation activation = FfnActivation::kSilu;
};

struct LayerWeights {
  std::vector<float> attn_norm;  // [dim], converted to f32 at load
  MatrixView wq, wk, wv, wo;
  std::vector<float> ffn_norm;
  MatrixView gate, up;  // [ffn_dim][dim]: one row per neuron
  // Exactly one of these is set: down is [dim][ffn_dim] (llama.cpp's ffn_down); down_t is
  // [ffn_dim][dim] (PowerInfer's ffn_down_t: one row per neuron, for sparse axpy).
  MatrixView down;
  MatrixView down_t;
  bool has_down_t = false;
};

class LlamaModel {
 public:
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(const std::string& path);
  static absl::StatusOr<std::unique_ptr<LlamaModel>> FromGguf(std::unique_ptr<GgufFile> file);

  const LlamaConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  const GgufFile& file() const { return *file_; }

  const MatrixView& token_embd() const { return token_embd_; }
  const MatrixView& output() const { return output_; }  // == token_embd when tied
  bool output_tied() const { return output_tied_; }
  const std::vector<float>& output_norm() const { return output_norm_; }
  const LayerWeights& layer(int64_t l) const { return layers_[l]; }

  // The element type of the FFN matrices ("f32", "q4_0", ...) for reports.
  std::string weight_type_name() const;
  // Bytes of weights one decode step reads (all matrices, one embedding row).
  int64_t decode_bytes_per_token() const;

 private:
  LlamaModel() = default;
  absl::Status Init();

  std::unique_ptr<GgufFile> file_;
  LlamaConfig config_;
  Tokenizer tokenizer_;
  MatrixView token_embd_, output_;
  bool output_tied_ = false;
  std::vector<float> output_norm_;
  std::vector<LayerWeights> layers_;
};

}  // namespace thermocline
