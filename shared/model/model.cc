#include "shared/model/model.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "shared/gguf/interleaved8.h"
#include "shared/gguf/quant.h"
#include "shared/util/env_switches.h"
#include "shared/util/status_macros.h"

namespace thermocline {
namespace {

std::string ShapeString(const std::vector<int64_t>& ne) {
  return absl::StrCat("(", absl::StrJoin(ne, ", "), ")");
}

// Reads one file's hyperparameters and tensors for one architecture, remembering which tensors
// it used so that the rest can be refused.
class Loader {
 public:
  Loader(const GgufFile& f, const ArchSpec& arch) : f_(f), arch_(arch) {}

  absl::Status Invalid(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat("model ", f_.path(), ": ", what));
  }
  std::string Key(std::string_view suffix) const {
    return absl::StrCat(std::string(arch_.name), ".", std::string(suffix));
  }
  bool Has(std::string_view suffix) const { return f_.FindValue(Key(suffix)) != nullptr; }

  // A required integer hyperparameter in 1..2^31.
  absl::StatusOr<int64_t> PositiveInt(std::string_view suffix) const {
    const std::string key = Key(suffix);
    TC_ASSIGN_OR_RETURN(int64_t v, f_.GetInt(key));
    if (v <= 0 || v > (int64_t{1} << 31)) {
      return Invalid(absl::StrCat(key, " = ", v, " is out of range (must be in 1..2^31)"));
    }
    return v;
  }
  absl::StatusOr<int64_t> PositiveIntOr(std::string_view suffix, int64_t fallback) const {
    if (!Has(suffix)) return fallback;
    return PositiveInt(suffix);
  }
  // An optional real hyperparameter that must lie in (lo, hi).
  absl::StatusOr<float> RealOr(std::string_view suffix, float fallback, double lo, double hi) const {
    if (!Has(suffix)) return fallback;
    const std::string key = Key(suffix);
    TC_ASSIGN_OR_RETURN(double v, f_.GetDouble(key));
    if (!(v > lo && v < hi)) {
      return Invalid(absl::StrCat(key, " = ", v, " is out of range (", lo, ", ", hi, ")"));
    }
    return static_cast<float>(v);
  }

  bool HasTensor(const std::string& name) const { return f_.FindTensor(name) != nullptr; }

  absl::StatusOr<const GgufTensorInfo*> Tensor(const std::string& name,
                                               const std::vector<int64_t>& ne) {
    const GgufTensorInfo* t = f_.FindTensor(name);
    if (t == nullptr) return Invalid(absl::StrCat("tensor '", name, "' is missing"));
    if (t->ne != ne) {
      return Invalid(absl::StrCat("tensor '", name, "' has shape ", ShapeString(t->ne),
                                  ", expected ", ShapeString(ne)));
    }
    used_.insert(name);
    return t;
  }

  // A weight matrix with ggml shape (cols, rows).
  absl::StatusOr<MatrixView> Matrix(const std::string& name, int64_t cols, int64_t rows) {
    TC_ASSIGN_OR_RETURN(const GgufTensorInfo* t, Tensor(name, {cols, rows}));
    return View(name, *t, cols, rows, 0);
  }
  // Expert e of a 3-D tensor with ggml shape (cols, rows, n_experts).
  absl::StatusOr<std::vector<MatrixView>> Experts(const std::string& name, int64_t cols,
                                                  int64_t rows, int64_t n_experts) {
    TC_ASSIGN_OR_RETURN(const GgufTensorInfo* t, Tensor(name, {cols, rows, n_experts}));
    std::vector<MatrixView> out;
    for (int64_t e = 0; e < n_experts; ++e) {
      TC_ASSIGN_OR_RETURN(MatrixView m, View(name, *t, cols, rows, e));
      out.push_back(m);
    }
    return out;
  }

  // A 1-D vector of any type, converted to f32 (norms and biases are tiny; f32 keeps the
  // kernels simple). Non-finite values are refused: one NaN here poisons every token.
  absl::StatusOr<std::vector<float>> Vector(const std::string& name, int64_t n) {
    TC_ASSIGN_OR_RETURN(const GgufTensorInfo* t, Tensor(name, {n}));
    if (!HasDequantizer(t->type)) {
      return Invalid(absl::StrCat("tensor '", name, "' has type ",
                                  std::string(TypeTraits(t->type).name), ", which cannot be read"));
    }
    if (n % TypeTraits(t->type).block_size != 0) {
      return Invalid(absl::StrCat("tensor '", name, "' of type ", std::string(TypeTraits(t->type).name),
                                  " cannot hold ", n, " elements"));
    }
    std::vector<float> out(n);
    DequantizeRow(t->type, t->data, out.data(), n);
    for (float v : out) {
      if (!std::isfinite(v)) return Invalid(absl::StrCat("tensor '", name, "' has a non-finite value"));
    }
    return out;
  }
  // The same when the file has the tensor; empty otherwise.
  absl::StatusOr<std::vector<float>> OptionalVector(const std::string& name, int64_t n) {
    if (!HasTensor(name)) return std::vector<float>();
    return Vector(name, n);
  }

  // Every tensor of the file that no part of the model uses, for the refusal message.
  std::vector<std::string> Unused() const {
    std::vector<std::string> out;
    for (const GgufTensorInfo& t : f_.tensors()) {
      if (used_.count(t.name) != 0 || IsSidecar(t.name)) continue;
      out.push_back(t.name);
    }
    return out;
  }

 private:
  absl::StatusOr<MatrixView> View(const std::string& name, const GgufTensorInfo& t, int64_t cols,
                                  int64_t rows, int64_t index) const {
    if (!IsWeightType(t.type)) {
      return Invalid(absl::StrCat("tensor '", name, "' has type ", std::string(TypeTraits(t.type).name),
                                  ", which is not a weight type (no kernels; weight types: ",
                                  WeightTypeNames(), ")"));
    }
    MatrixView m;
    m.type = t.type;
    m.rows = rows;
    m.cols = cols;
    m.row_bytes = RowBytes(t.type, cols);
    m.data = t.data + index * rows * m.row_bytes;
    return m;
  }
  // Tensors other modules read from the model file: PowerInfer's predictors (sparsity/).
  static bool IsSidecar(const std::string& name) {
    return absl::StartsWith(name, "blk.") &&
           (absl::EndsWith(name, ".fc1.weight") || absl::EndsWith(name, ".fc2.weight"));
  }

  const GgufFile& f_;
  const ArchSpec& arch_;
  std::set<std::string> used_;
};

absl::Status ReadHyperparameters(Loader& ld, const GgufFile& f, const ArchSpec& a,
                                 ModelConfig& c) {
  TC_ASSIGN_OR_RETURN(c.dim, ld.PositiveInt("embedding_length"));
  TC_ASSIGN_OR_RETURN(c.n_layers, ld.PositiveInt("block_count"));
  TC_ASSIGN_OR_RETURN(c.n_heads, ld.PositiveInt("attention.head_count"));
  TC_ASSIGN_OR_RETURN(c.n_kv_heads, ld.PositiveIntOr("attention.head_count_kv", c.n_heads));
  TC_ASSIGN_OR_RETURN(c.context_length, ld.PositiveInt("context_length"));
  if (ld.Has("feed_forward_length")) {
    TC_ASSIGN_OR_RETURN(c.ffn_dim, ld.PositiveInt("feed_forward_length"));
  }
  if (c.n_heads % c.n_kv_heads != 0) {
    return ld.Invalid(absl::StrCat(ld.Key("attention.head_count"), " ", c.n_heads,
                                   " is not a multiple of ", ld.Key("attention.head_count_kv"),
                                   " ", c.n_kv_heads));
  }
  if (ld.Has("attention.key_length")) {
    TC_ASSIGN_OR_RETURN(c.head_dim, ld.PositiveInt("attention.key_length"));
  } else {
    if (c.dim % c.n_heads != 0) {
      return ld.Invalid(absl::StrCat(ld.Key("embedding_length"), " ", c.dim,
                                     " is not a multiple of ", ld.Key("attention.head_count"), " ",
                                     c.n_heads, " (and no ", ld.Key("attention.key_length"),
                                     " says the head size)"));
    }
    c.head_dim = c.dim / c.n_heads;
  }
  TC_ASSIGN_OR_RETURN(int64_t value_length, ld.PositiveIntOr("attention.value_length", c.head_dim));
  if (value_length != c.head_dim) {
    return ld.Invalid(absl::StrCat(ld.Key("attention.value_length"), " ", value_length,
                                   " differs from the key length ", c.head_dim,
                                   "; heads with different key and value sizes are not supported"));
  }
  c.q_dim = c.n_heads * c.head_dim;
  c.kv_dim = c.n_kv_heads * c.head_dim;
  TC_ASSIGN_OR_RETURN(c.rope_dim, ld.PositiveIntOr("rope.dimension_count", c.head_dim));
  if (c.rope_dim > c.head_dim || c.rope_dim % 2 != 0) {
    return ld.Invalid(absl::StrCat(ld.Key("rope.dimension_count"), " ", c.rope_dim,
                                   " must be even and at most the head size ", c.head_dim));
  }
  TC_ASSIGN_OR_RETURN(c.rms_eps, ld.RealOr(a.eps_key, a.default_eps, 0, 1));
  TC_ASSIGN_OR_RETURN(c.rope_freq_base, ld.RealOr("rope.freq_base", 10000.0f, 1, 1e30));
  c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));

  // RoPE scaling: linear divides positions; YaRN mixes interpolated and extrapolated theta.
  std::string scaling = "none";
  if (ld.Has("rope.scaling.type")) {
    TC_ASSIGN_OR_RETURN(scaling, f.GetString(ld.Key("rope.scaling.type")));
  }
  RopeScaling& rs = c.rope_scaling;
  TC_ASSIGN_OR_RETURN(rs.factor, ld.RealOr("rope.scaling.factor", 1.0f, 0, 1e6));
  if (!ld.Has("rope.scaling.factor")) {
    TC_ASSIGN_OR_RETURN(rs.factor, ld.RealOr("rope.scale_linear", 1.0f, 0, 1e6));
  }
  if (scaling == "none") {
    rs.kind = rs.factor != 1.0f ? RopeScaling::Kind::kLinear : RopeScaling::Kind::kNone;
  } else if (scaling == "linear") {
    rs.kind = RopeScaling::Kind::kLinear;
  } else if (scaling == "yarn") {
    rs.kind = RopeScaling::Kind::kYarn;
  } else {
    return ld.Invalid(absl::StrCat(ld.Key("rope.scaling.type"), " '", scaling,
                                   "' is not one of: none, linear, yarn"));
  }
  TC_ASSIGN_OR_RETURN(rs.original_context,
                      ld.PositiveIntOr("rope.scaling.original_context_length", c.context_length));
  TC_ASSIGN_OR_RETURN(rs.ext_factor, ld.RealOr("rope.scaling.yarn_ext_factor", 1.0f, -1e-9, 1e6));
  TC_ASSIGN_OR_RETURN(rs.attn_factor, ld.RealOr("rope.scaling.attn_factor", 1.0f, 0, 1e6));
  TC_ASSIGN_OR_RETURN(rs.beta_fast, ld.RealOr("rope.scaling.yarn_beta_fast", 32.0f, 0, 1e6));
  TC_ASSIGN_OR_RETURN(rs.beta_slow, ld.RealOr("rope.scaling.yarn_beta_slow", 1.0f, 0, 1e6));

  // Experts: the llama arch turns into Mixtral when the key is there.
  if (ld.Has("expert_count")) {
    TC_ASSIGN_OR_RETURN(c.n_experts, ld.PositiveInt("expert_count"));
  }
  if (c.n_experts > 0) {
    if (!a.moe) {
      return ld.Invalid(absl::StrCat(ld.Key("expert_count"), " is set, but the ", std::string(a.name),
                                     " architecture has no experts"));
    }
    TC_ASSIGN_OR_RETURN(c.n_experts_used, ld.PositiveInt("expert_used_count"));
    if (c.n_experts_used > c.n_experts) {
      return ld.Invalid(absl::StrCat(ld.Key("expert_used_count"), " ", c.n_experts_used,
                                     " exceeds ", ld.Key("expert_count"), " ", c.n_experts));
    }
    c.expert_weights_norm = a.moe_weights_norm;
  }

  c.layers.assign(c.n_layers, LayerConfig{});
  for (LayerConfig& lc : c.layers) {
    lc.rope_freq_base = c.rope_freq_base;
    lc.moe = c.n_experts > 0;
  }
  if (a.sliding != SlidingLayers::kNone && ld.Has("attention.sliding_window")) {
    TC_ASSIGN_OR_RETURN(int64_t window, ld.PositiveInt("attention.sliding_window"));
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const bool sliding = a.sliding == SlidingLayers::kAll ||
                           (a.sliding == SlidingLayers::kEven && l % 2 == 0) ||
                           (a.sliding == SlidingLayers::kFiveOfSix && (l + 1) % 6 != 0);
      if (sliding) c.layers[l].sliding_window = window;
    }
  }

  // PowerInfer's files are ReLU models by construction (dReLU for Bamboo); ours say so explicitly.
  c.activation = a.activation;
  if (f.is_powerinfer() && a.activation != FfnActivation::kDrelu) c.activation = FfnActivation::kRelu;
  if (f.FindValue("thermocline.ffn_activation") != nullptr) {
    TC_ASSIGN_OR_RETURN(std::string act, f.GetString("thermocline.ffn_activation"));
    if (act == "silu") {
      c.activation = FfnActivation::kSilu;
    } else if (act == "relu") {
      c.activation = FfnActivation::kRelu;
    } else if (act == "gelu") {
      c.activation = FfnActivation::kGelu;
    } else if (act == "drelu") {
      c.activation = FfnActivation::kDrelu;
    } else {
      return ld.Invalid(absl::StrCat("thermocline.ffn_activation '", act,
                                     "' is not one of: silu, relu, gelu, drelu"));
    }
  }
  if (a.read_extra != nullptr) TC_RETURN_IF_ERROR(a.read_extra(f, c));
  if (c.ffn_dim <= 0) {
    return ld.Invalid(absl::StrCat(ld.Key("feed_forward_length"), " is missing"));
  }
  return absl::OkStatus();
}

// A norm's weight, and its bias for LayerNorm.
absl::Status ReadNorm(Loader& ld, const ArchSpec& a, const std::string& name, int64_t n,
                      std::vector<float>& w, std::vector<float>* b) {
  TC_ASSIGN_OR_RETURN(w, ld.Vector(name + ".weight", n));
  if (a.norm == NormKind::kLayer && b != nullptr) {
    TC_ASSIGN_OR_RETURN(*b, ld.Vector(name + ".bias", n));
  }
  return absl::OkStatus();
}

absl::Status ReadAttention(Loader& ld, const ArchSpec& a, const ModelConfig& c,
                           const std::string& p, LayerWeights& w) {
  const int64_t qkv_rows = c.q_dim + 2 * c.kv_dim;
  if (ld.HasTensor(p + "attn_qkv.weight")) {
    TC_ASSIGN_OR_RETURN(MatrixView qkv, ld.Matrix(p + "attn_qkv.weight", c.dim, qkv_rows));
    w.wq = qkv.RowRange(0, c.q_dim);
    w.wk = qkv.RowRange(c.q_dim, c.kv_dim);
    w.wv = qkv.RowRange(c.q_dim + c.kv_dim, c.kv_dim);
    TC_ASSIGN_OR_RETURN(std::vector<float> b, ld.OptionalVector(p + "attn_qkv.bias", qkv_rows));
    if (!b.empty()) {
      w.bq.assign(b.begin(), b.begin() + c.q_dim);
      w.bk.assign(b.begin() + c.q_dim, b.begin() + c.q_dim + c.kv_dim);
      w.bv.assign(b.begin() + c.q_dim + c.kv_dim, b.end());
    }
  } else {
    TC_ASSIGN_OR_RETURN(w.wq, ld.Matrix(p + "attn_q.weight", c.dim, c.q_dim));
    TC_ASSIGN_OR_RETURN(w.wk, ld.Matrix(p + "attn_k.weight", c.dim, c.kv_dim));
    TC_ASSIGN_OR_RETURN(w.wv, ld.Matrix(p + "attn_v.weight", c.dim, c.kv_dim));
    if (a.qkv_bias_required) {
      TC_ASSIGN_OR_RETURN(w.bq, ld.Vector(p + "attn_q.bias", c.q_dim));
      TC_ASSIGN_OR_RETURN(w.bk, ld.Vector(p + "attn_k.bias", c.kv_dim));
      TC_ASSIGN_OR_RETURN(w.bv, ld.Vector(p + "attn_v.bias", c.kv_dim));
    } else {
      TC_ASSIGN_OR_RETURN(w.bq, ld.OptionalVector(p + "attn_q.bias", c.q_dim));
      TC_ASSIGN_OR_RETURN(w.bk, ld.OptionalVector(p + "attn_k.bias", c.kv_dim));
      TC_ASSIGN_OR_RETURN(w.bv, ld.OptionalVector(p + "attn_v.bias", c.kv_dim));
    }
  }
  TC_ASSIGN_OR_RETURN(w.wo, ld.Matrix(p + "attn_output.weight", c.q_dim, c.dim));
  TC_ASSIGN_OR_RETURN(w.bo, ld.OptionalVector(p + "attn_output.bias", c.dim));
  if (a.qk_norm) {
    // Over the whole projection (olmo2) or per head (qwen3, gemma3): the stored size says which.
    for (auto [name, n, out] : {std::tuple{"attn_q_norm.weight", c.q_dim, &w.q_norm},
                                std::tuple{"attn_k_norm.weight", c.kv_dim, &w.k_norm}}) {
      const std::string full = p + name;
      absl::StatusOr<std::vector<float>> v = ld.Vector(full, n);
      if (!v.ok()) v = ld.Vector(full, c.head_dim);
      if (!v.ok()) {
        return ld.Invalid(absl::StrCat("tensor '", full, "' must hold ", n,
                                       " (whole projection) or ", c.head_dim,
                                       " (per head) values: ", v.status().message()));
      }
      *out = *std::move(v);
    }
  }
  if (a.post_attn_norm) {
    TC_ASSIGN_OR_RETURN(w.post_attn_norm, ld.Vector(p + "post_attention_norm.weight", c.dim));
  }
  return absl::OkStatus();
}

absl::Status ReadFfn(Loader& ld, const ArchSpec& a, const ModelConfig& c, const std::string& p,
                     int64_t layer, LayerWeights& w) {
  const int64_t nf = c.ffn_dim;
  if (c.layers[layer].moe) {
    TC_ASSIGN_OR_RETURN(w.router, ld.Matrix(p + "ffn_gate_inp.weight", c.dim, c.n_experts));
    TC_ASSIGN_OR_RETURN(std::vector<MatrixView> gates,
                        ld.Experts(p + "ffn_gate_exps.weight", c.dim, nf, c.n_experts));
    TC_ASSIGN_OR_RETURN(std::vector<MatrixView> ups,
                        ld.Experts(p + "ffn_up_exps.weight", c.dim, nf, c.n_experts));
    TC_ASSIGN_OR_RETURN(std::vector<MatrixView> downs,
                        ld.Experts(p + "ffn_down_exps.weight", nf, c.dim, c.n_experts));
    for (int64_t e = 0; e < c.n_experts; ++e) w.experts.push_back({gates[e], ups[e], downs[e]});
    if (c.shared_expert_ffn_dim > 0) {
      const int64_t ns = c.shared_expert_ffn_dim;
      TC_ASSIGN_OR_RETURN(w.shared.gate, ld.Matrix(p + "ffn_gate_shexp.weight", c.dim, ns));
      TC_ASSIGN_OR_RETURN(w.shared.up, ld.Matrix(p + "ffn_up_shexp.weight", c.dim, ns));
      TC_ASSIGN_OR_RETURN(w.shared.down, ld.Matrix(p + "ffn_down_shexp.weight", ns, c.dim));
      TC_ASSIGN_OR_RETURN(w.shared_gate, ld.Vector(p + "ffn_gate_inp_shexp.weight", c.dim));
    }
  } else {
    if (!a.gated_ffn) {
      TC_ASSIGN_OR_RETURN(w.up, ld.Matrix(p + "ffn_up.weight", c.dim, nf));
    } else if (ld.HasTensor(p + "ffn_gate.weight")) {
      TC_ASSIGN_OR_RETURN(w.gate, ld.Matrix(p + "ffn_gate.weight", c.dim, nf));
      TC_ASSIGN_OR_RETURN(w.up, ld.Matrix(p + "ffn_up.weight", c.dim, nf));
    } else {
      // Fused [gate | up] in one ffn_up of 2 * ffn_dim rows (phi3).
      TC_ASSIGN_OR_RETURN(MatrixView fused, ld.Matrix(p + "ffn_up.weight", c.dim, 2 * nf));
      w.gate = fused.RowRange(0, nf);
      w.up = fused.RowRange(nf, nf);
    }
    TC_ASSIGN_OR_RETURN(w.up_b, ld.OptionalVector(p + "ffn_up.bias", nf));
    if (ld.HasTensor(p + "ffn_down_t.weight")) {
      TC_ASSIGN_OR_RETURN(w.down_t, ld.Matrix(p + "ffn_down_t.weight", c.dim, nf));
      w.has_down_t = true;
    } else {
      TC_ASSIGN_OR_RETURN(w.down, ld.Matrix(p + "ffn_down.weight", nf, c.dim));
    }
    TC_ASSIGN_OR_RETURN(w.down_b, ld.OptionalVector(p + "ffn_down.bias", c.dim));
  }
  if (a.post_ffn_norm) {
    TC_ASSIGN_OR_RETURN(w.post_ffn_norm, ld.Vector(p + "post_ffw_norm.weight", c.dim));
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// The spec of the file's general.architecture, or an error listing the known ones.
absl::StatusOr<const ArchSpec*> ArchOf(const GgufFile& f) {
  TC_ASSIGN_OR_RETURN(std::string name, f.GetString("general.architecture"));
  const ArchSpec* arch = FindArch(name);
  if (arch == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("model ", f.path(), ": general.architecture '",
                                                   name, "' is not one of: ", KnownArchNames()));
  }
  return arch;
}

}  // namespace

absl::StatusOr<ModelDescription> ReadModelDescription(const std::string& path) {
  TC_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::OpenHeader(path));
  const GgufFile& f = *file;
  TC_ASSIGN_OR_RETURN(const ArchSpec* arch, ArchOf(f));
  Loader ld(f, *arch);
  ModelDescription d;
  d.config.arch = arch;
  TC_RETURN_IF_ERROR(ReadHyperparameters(ld, f, *arch, d.config));
  TC_ASSIGN_OR_RETURN(d.tokenizer, Tokenizer::FromGguf(f));
  d.config.vocab_size = d.tokenizer.vocab_size();
  return d;
}

absl::StatusOr<TensorCheck> TensorCheckFromName(std::string_view name) {
  if (name == "auto") return TensorCheck::kAuto;
  if (name == "on") return TensorCheck::kOn;
  if (name == "off") return TensorCheck::kOff;
  return absl::InvalidArgumentError(
      absl::StrCat("--check-tensors '", std::string(name), "': expected auto, on or off"));
}

namespace {

// The first non-finite element of any matrix (ne[1] > 1) of `f`, as an error naming it.
absl::Status CheckMatricesFinite(const GgufFile& f) {
  std::vector<float> row;
  for (const GgufTensorInfo& t : f.tensors()) {
    if (t.ne.size() < 2 || !HasDequantizer(t.type) || t.ne[0] <= 0) continue;
    const int64_t cols = t.ne[0];
    const int64_t rows = t.n_elements / cols;
    const int64_t row_bytes = RowBytes(t.type, cols);
    row.resize(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      DequantizeRow(t.type, t.data + r * row_bytes, row.data(), cols);
      for (int64_t c = 0; c < cols; ++c) {
        if (std::isfinite(row[c])) continue;
        std::string layer;
        if (int64_t l = -1; std::sscanf(t.name.c_str(), "blk.%" SCNd64 ".", &l) == 1) {
          layer = absl::StrCat(" (layer ", l, ")");
        }
        return absl::InvalidArgumentError(absl::StrCat(
            f.path(), ": tensor '", t.name, "'", layer, " holds ", std::isnan(row[c]) ? "NaN" : "infinity",
            " at row ", r, ", column ", c,
            ": the weights are corrupt (found by the load-time tensor check, --check-tensors)"));
      }
    }
  }
  return absl::OkStatus();
}

// THERMOCLINE_REPACK: unset or "1" interleaves the dense-only matrices of the types with an
// interleaved layout (interleaved8.h) at load, "0" keeps the file's layout alone (for A/B runs).
absl::StatusOr<bool> RepackFromEnvironment() { return ReadEnvSwitch(EnvSwitch::kRepack); }

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& path, TensorCheck check) {
  TC_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  const bool all = check == TensorCheck::kOn ||
                   (check == TensorCheck::kAuto &&
                    file->file_size() <= static_cast<uint64_t>(kTensorCheckAutoBytes));
  TC_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, FromGguf(std::move(file)));
  if (all) TC_RETURN_IF_ERROR(CheckMatricesFinite(model->file()));
  return model;
}

absl::StatusOr<std::unique_ptr<Model>> Model::FromGguf(std::unique_ptr<GgufFile> file) {
  std::unique_ptr<Model> model(new Model());
  model->file_ = std::move(file);
  TC_RETURN_IF_ERROR(model->Init());
  return model;
}

absl::Status Model::Init() {
  const GgufFile& f = *file_;
  TC_ASSIGN_OR_RETURN(const ArchSpec* arch, ArchOf(f));
  const ArchSpec& a = *arch;
  Loader ld(f, a);
  ModelConfig& c = config_;
  c.arch = arch;
  TC_RETURN_IF_ERROR(ReadHyperparameters(ld, f, a, c));

  TC_ASSIGN_OR_RETURN(tokenizer_, Tokenizer::FromGguf(f));
  c.vocab_size = tokenizer_.vocab_size();

  TC_ASSIGN_OR_RETURN(token_embd_, ld.Matrix("token_embd.weight", c.dim, c.vocab_size));
  TC_RETURN_IF_ERROR(ReadNorm(ld, a, "output_norm", c.dim, output_norm_, &output_norm_b_));
  if (!a.output_always_tied && ld.HasTensor("output.weight")) {
    TC_ASSIGN_OR_RETURN(output_, ld.Matrix("output.weight", c.dim, c.vocab_size));
  } else {
    output_ = token_embd_;
    output_tied_ = true;
  }
  if (ld.HasTensor("rope_freqs.weight")) {
    TC_ASSIGN_OR_RETURN(rope_freqs_, ld.Vector("rope_freqs.weight", c.rope_dim / 2));
    for (float v : rope_freqs_) {
      if (!(v > 0)) return ld.Invalid("tensor 'rope_freqs.weight' holds a value that is not > 0");
    }
  }
  layers_.resize(c.n_layers);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerWeights& w = layers_[l];
    const std::string p = absl::StrCat("blk.", l, ".");
    if (a.attn_norm) {
      TC_RETURN_IF_ERROR(ReadNorm(ld, a, p + "attn_norm", c.dim, w.attn_norm, &w.attn_norm_b));
    }
    TC_RETURN_IF_ERROR(ReadAttention(ld, a, c, p, w));
    if (a.ffn_norm && !a.parallel_block) {
      TC_RETURN_IF_ERROR(ReadNorm(ld, a, p + "ffn_norm", c.dim, w.ffn_norm, &w.ffn_norm_b));
    }
    TC_RETURN_IF_ERROR(ReadFfn(ld, a, c, p, l, w));
  }
  if (std::vector<std::string> unused = ld.Unused(); !unused.empty()) {
    const size_t shown = std::min<size_t>(unused.size(), 5);
    return ld.Invalid(absl::StrCat(
        unused.size(), " tensor(s) that a ", std::string(a.name), " model of ", c.n_layers,
        " blocks does not use (does the metadata match the tensors?): ",
        absl::StrJoin(unused.begin(), unused.begin() + shown, ", "),
        unused.size() > shown ? ", ..." : ""));
  }
  TC_ASSIGN_OR_RETURN(const bool repack, RepackFromEnvironment());
  if (repack) InterleaveDenseMatrices();
  return absl::OkStatus();
}

void Model::Interleave(MatrixView& m) {
  if (!HasInterleaved8Layout(m.type) || m.rows == 0 || m.cols == 0 || m.interleaved != nullptr) {
    return;
  }
  uint8_t* buf = interleaved_.Allocate(static_cast<size_t>(Interleaved8Bytes(m.type, m.rows, m.cols)));
  if (buf == nullptr) return;  // no memory for the copy: the row layout serves as it is
  Interleave8(m.type, m.data, m.row_bytes, m.rows, m.cols, buf);
  m.interleaved = buf;
}

void Model::InterleaveDenseMatrices() {
  // Only matrices no path ever reads by single rows: attention's projections are multiplied
  // whole (TEAL's input-sparse products read columns of the row layout, which stays), and the
  // output head unless it is the embedding table. The FFN is gathered by neuron in the sparse
  // modes, which the model does not know at load: InterleaveDenseFfn, on request.
  for (LayerWeights& w : layers_) {
    Interleave(w.wq);
    Interleave(w.wk);
    Interleave(w.wv);
    Interleave(w.wo);
  }
  if (!output_tied_) Interleave(output_);
}

absl::Status Model::InterleaveDenseFfn() {
  TC_ASSIGN_OR_RETURN(const bool repack, RepackFromEnvironment());
  if (!repack) return absl::OkStatus();
  for (LayerWeights& w : layers_) {
    if (!w.experts.empty()) continue;
    Interleave(w.gate);
    Interleave(w.up);
    if (!w.has_down_t) Interleave(w.down);
  }
  return absl::OkStatus();
}

int64_t Model::interleaved_bytes() const {
  return static_cast<int64_t>(interleaved_.allocated_bytes());
}

std::string Model::weight_type_name() const {
  const LayerWeights& w = layers_[0];
  const MatrixView& m = !w.experts.empty() ? w.experts[0].up : w.up;
  return std::string(TypeTraits(m.type).name);
}

int64_t Model::decode_bytes_per_token() const {
  auto bytes = [](const MatrixView& m) { return m.rows * m.row_bytes; };
  auto ffn = [&](const FfnWeights& f) { return bytes(f.gate) + bytes(f.up) + bytes(f.down); };
  int64_t total = token_embd_.row_bytes + bytes(output_);
  for (const LayerWeights& w : layers_) {
    total += bytes(w.wq) + bytes(w.wk) + bytes(w.wv) + bytes(w.wo);
    if (!w.experts.empty()) {
      total += bytes(w.router) + config_.n_experts_used * ffn(w.experts[0]) + ffn(w.shared);
    } else {
      total += bytes(w.gate) + bytes(w.up) + (w.has_down_t ? bytes(w.down_t) : bytes(w.down));
    }
  }
  return total;
}

}  // namespace thermocline
