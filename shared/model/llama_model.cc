#include "shared/model/llama_model.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "shared/model/quant.h"
#include "shared/util/status_macros.h"

namespace thermocline {
namespace {

absl::Status Invalid(const GgufFile& f, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("model ", f.path(), ": ", what));
}

std::string ShapeString(const std::vector<int64_t>& ne) {
  return absl::StrCat("(", absl::StrJoin(ne, ", "), ")");
}

// Reads a required positive integer hyperparameter.
absl::StatusOr<int64_t> PositiveInt(const GgufFile& f, const std::string& key) {
  TC_ASSIGN_OR_RETURN(int64_t v, f.GetInt(key));
  if (v <= 0 || v > (int64_t{1} << 31)) {
    return Invalid(f, absl::StrCat(key, " = ", v, " is out of range (must be in 1..2^31)"));
  }
  return v;
}

absl::StatusOr<const GgufTensorInfo*> Tensor(const GgufFile& f, const std::string& name,
                                             const std::vector<int64_t>& ne) {
  const GgufTensorInfo* t = f.FindTensor(name);
  if (t == nullptr) return Invalid(f, absl::StrCat("tensor '", name, "' is missing"));
  if (t->ne != ne) {
    return Invalid(f, absl::StrCat("tensor '", name, "' has shape ", ShapeString(t->ne),
                                   ", expected ", ShapeString(ne)));
  }
  return t;
}

// A weight matrix with ggml shape (cols, rows).
absl::StatusOr<MatrixView> Matrix(const GgufFile& f, const std::string& name, int64_t cols,
                                  int64_t rows) {
  TC_ASSIGN_OR_RETURN(const GgufTensorInfo* t, Tensor(f, name, {cols, rows}));
  if (!IsWeightType(t->type)) {
    return Invalid(f, absl::StrCat("tensor '", name, "' has type ", std::string(TypeTraits(t->type).name),
                                   ", which is not a weight type (no kernels; weight types: ",
                                   WeightTypeNames(), ")"));
  }
  MatrixView m;
  m.type = t->type;
  m.rows = rows;
  m.cols = cols;
  m.data = t->data;
  m.row_bytes = RowBytes(t->type, cols);
  return m;
}

// A 1-D vector of any type, converted to f32 (norm weights are tiny; f32 keeps kernels simple).
absl::StatusOr<std::vector<float>> Vector(const GgufFile& f, const std::string& name, int64_t n) {
  TC_ASSIGN_OR_RETURN(const GgufTensorInfo* t, Tensor(f, name, {n}));
  if (!HasDequantizer(t->type)) {
    return Invalid(f, absl::StrCat("tensor '", name, "' has type ",
                                   std::string(TypeTraits(t->type).name),
                                   ", which cannot be read"));
  }
  std::vector<float> out(n);
  DequantizeRow(t->type, t->data, out.data(), n);
  for (float v : out) {
    if (!std::isfinite(v)) return Invalid(f, absl::StrCat("tensor '", name, "' has a non-finite value"));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const std::string& path) {
  TC_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  return FromGguf(std::move(file));
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::FromGguf(std::unique_ptr<GgufFile> file) {
  std::unique_ptr<LlamaModel> model(new LlamaModel());
  model->file_ = std::move(file);
  TC_RETURN_IF_ERROR(model->Init());
  return model;
}

absl::Status LlamaModel::Init() {
  const GgufFile& f = *file_;
  TC_ASSIGN_OR_RETURN(std::string arch, f.GetString("general.architecture"));
  if (arch != "llama") {
    return Invalid(f, absl::StrCat("general.architecture is '", arch, "'; only 'llama' is supported"));
  }
  LlamaConfig& c = config_;
  TC_ASSIGN_OR_RETURN(c.dim, PositiveInt(f, "llama.embedding_length"));
  TC_ASSIGN_OR_RETURN(c.ffn_dim, PositiveInt(f, "llama.feed_forward_length"));
  TC_ASSIGN_OR_RETURN(c.n_layers, PositiveInt(f, "llama.block_count"));
  TC_ASSIGN_OR_RETURN(c.n_heads, PositiveInt(f, "llama.attention.head_count"));
  c.n_kv_heads = c.n_heads;
  if (f.FindValue("llama.attention.head_count_kv") != nullptr) {
    TC_ASSIGN_OR_RETURN(c.n_kv_heads, PositiveInt(f, "llama.attention.head_count_kv"));
  }
  TC_ASSIGN_OR_RETURN(c.context_length, PositiveInt(f, "llama.context_length"));
  if (c.dim % c.n_heads != 0) {
    return Invalid(f, absl::StrCat("llama.embedding_length ", c.dim,
                                   " is not a multiple of llama.attention.head_count ", c.n_heads));
  }
  if (c.n_heads % c.n_kv_heads != 0) {
    return Invalid(f, absl::StrCat("llama.attention.head_count ", c.n_heads,
                                   " is not a multiple of llama.attention.head_count_kv ",
                                   c.n_kv_heads));
  }
  c.head_dim = c.dim / c.n_heads;
  c.kv_dim = c.n_kv_heads * c.head_dim;
  c.rope_dim = c.head_dim;
  if (f.FindValue("llama.rope.dimension_count") != nullptr) {
    TC_ASSIGN_OR_RETURN(c.rope_dim, PositiveInt(f, "llama.rope.dimension_count"));
  }
  if (c.rope_dim > c.head_dim || c.rope_dim % 2 != 0) {
    return Invalid(f, absl::StrCat("llama.rope.dimension_count ", c.rope_dim,
                                   " must be even and at most the head size ", c.head_dim));
  }
  if (f.FindValue("llama.attention.layer_norm_rms_epsilon") != nullptr) {
    TC_ASSIGN_OR_RETURN(double eps, f.GetDouble("llama.attention.layer_norm_rms_epsilon"));
    if (!(eps > 0 && eps < 1)) {
      return Invalid(f, absl::StrCat("llama.attention.layer_norm_rms_epsilon ", eps,
                                     " is out of range (0, 1)"));
    }
    c.rms_eps = static_cast<float>(eps);
  }
  if (f.FindValue("llama.rope.freq_base") != nullptr) {
    TC_ASSIGN_OR_RETURN(double base, f.GetDouble("llama.rope.freq_base"));
    if (!(base > 1 && std::isfinite(base))) {
      return Invalid(f, absl::StrCat("llama.rope.freq_base ", base, " must be > 1"));
    }
    c.rope_freq_base = static_cast<float>(base);
  }
  // PowerInfer's files are ReLU models by construction; ours say so explicitly.
  c.activation = f.is_powerinfer() ? FfnActivation::kRelu : FfnActivation::kSilu;
  if (f.FindValue("thermocline.ffn_activation") != nullptr) {
    TC_ASSIGN_OR_RETURN(std::string act, f.GetString("thermocline.ffn_activation"));
    if (act == "silu") {
      c.activation = FfnActivation::kSilu;
    } else if (act == "relu") {
      c.activation = FfnActivation::kRelu;
    } else {
      return Invalid(f, absl::StrCat("thermocline.ffn_activation '", act,
                                     "' is not one of: silu, relu"));
    }
  }

  TC_ASSIGN_OR_RETURN(tokenizer_, Tokenizer::FromGguf(f));
  c.vocab_size = tokenizer_.vocab_size();

  TC_ASSIGN_OR_RETURN(token_embd_, Matrix(f, "token_embd.weight", c.dim, c.vocab_size));
  TC_ASSIGN_OR_RETURN(output_norm_, Vector(f, "output_norm.weight", c.dim));
  if (f.FindTensor("output.weight") != nullptr) {
    TC_ASSIGN_OR_RETURN(output_, Matrix(f, "output.weight", c.dim, c.vocab_size));
  } else {
    output_ = token_embd_;
    output_tied_ = true;
  }
  layers_.resize(c.n_layers);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerWeights& w = layers_[l];
    const std::string p = absl::StrCat("blk.", l, ".");
    TC_ASSIGN_OR_RETURN(w.attn_norm, Vector(f, p + "attn_norm.weight", c.dim));
    TC_ASSIGN_OR_RETURN(w.wq, Matrix(f, p + "attn_q.weight", c.dim, c.dim));
    TC_ASSIGN_OR_RETURN(w.wk, Matrix(f, p + "attn_k.weight", c.dim, c.kv_dim));
    TC_ASSIGN_OR_RETURN(w.wv, Matrix(f, p + "attn_v.weight", c.dim, c.kv_dim));
    TC_ASSIGN_OR_RETURN(w.wo, Matrix(f, p + "attn_output.weight", c.dim, c.dim));
    TC_ASSIGN_OR_RETURN(w.ffn_norm, Vector(f, p + "ffn_norm.weight", c.dim));
    TC_ASSIGN_OR_RETURN(w.gate, Matrix(f, p + "ffn_gate.weight", c.dim, c.ffn_dim));
    TC_ASSIGN_OR_RETURN(w.up, Matrix(f, p + "ffn_up.weight", c.dim, c.ffn_dim));
    if (f.FindTensor(p + "ffn_down_t.weight") != nullptr) {
      TC_ASSIGN_OR_RETURN(w.down_t, Matrix(f, p + "ffn_down_t.weight", c.dim, c.ffn_dim));
      w.has_down_t = true;
    } else {
      TC_ASSIGN_OR_RETURN(w.down, Matrix(f, p + "ffn_down.weight", c.ffn_dim, c.dim));
    }
  }
  return absl::OkStatus();
}

std::string LlamaModel::weight_type_name() const {
  return std::string(TypeTraits(layers_[0].gate.type).name);
}

int64_t LlamaModel::decode_bytes_per_token() const {
  auto bytes = [](const MatrixView& m) { return m.rows * m.row_bytes; };
  int64_t total = token_embd_.row_bytes + bytes(output_);
  for (const LayerWeights& w : layers_) {
    total += bytes(w.wq) + bytes(w.wk) + bytes(w.wv) + bytes(w.wo) + bytes(w.gate) + bytes(w.up) +
             (w.has_down_t ? bytes(w.down_t) : bytes(w.down));
  }
  return total;
}

}  // namespace thermocline
