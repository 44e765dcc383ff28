#include "shared/sparsity/predictor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "shared/gguf/quant.h"
#include "shared/sparsity/neuron_ffn.h"
#include "shared/sparsity/teal.h"
#include "shared/util/status_macros.h"

namespace thermocline {
namespace {

constexpr char kArchitecture[] = "thermocline.predictor";
constexpr char kThresholdKey[] = "powerinfer.sparse_threshold";
constexpr char kPrefix[] = "thermocline.predictor.";

std::string Key(const char* name) { return absl::StrCat(kPrefix, name); }

std::string Fc1Name(int64_t l) { return absl::StrCat("blk.", l, ".fc1.weight"); }
std::string Fc2Name(int64_t l) { return absl::StrCat("blk.", l, ".fc2.weight"); }

std::string ShapeString(const std::vector<int64_t>& ne) {
  return absl::StrCat("(", absl::StrJoin(ne, ", "), ")");
}

absl::Status Invalid(const GgufFile& f, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("predictors ", f.path(), ": ", what));
}

MatrixView View(GgmlType type, int64_t rows, int64_t cols, const uint8_t* data) {
  MatrixView m;
  m.type = type;
  m.rows = rows;
  m.cols = cols;
  m.data = data;
  m.row_bytes = RowBytes(type, cols);
  return m;
}

// A float array of exactly n finite values under `key`, or nullopt when the key is absent.
absl::StatusOr<std::optional<std::vector<float>>> OptionalFloatArray(const GgufFile& f,
                                                                     const std::string& key,
                                                                     int64_t n) {
  if (f.FindValue(key) == nullptr) return std::optional<std::vector<float>>();
  TC_ASSIGN_OR_RETURN(const GgufArray* a, f.GetArray(key));
  if (static_cast<int64_t>(a->items.size()) != n) {
    return Invalid(f, absl::StrCat(key, " has ", a->items.size(), " values, expected ", n,
                                   " (one per layer)"));
  }
  std::vector<float> out;
  out.reserve(n);
  for (size_t i = 0; i < a->items.size(); ++i) {
    std::optional<double> v = a->items[i].AsDouble();
    if (!v || !std::isfinite(*v) || std::abs(*v) > std::numeric_limits<float>::max()) {
      return Invalid(f, absl::StrCat(key, "[", i, "] is not a finite number"));
    }
    out.push_back(static_cast<float>(*v));
  }
  return std::optional<std::vector<float>>(std::move(out));
}

// The report keys of a Thermocline predictor file; an empty report when they are absent.
absl::StatusOr<PredictorReport> ReadReport(const GgufFile& f, int64_t n_layers) {
  PredictorReport r;
  if (f.FindValue(Key("training_tokens")) != nullptr) {
    TC_ASSIGN_OR_RETURN(r.training_tokens, f.GetInt(Key("training_tokens")));
    if (r.training_tokens < 0) return Invalid(f, Key("training_tokens") + " is negative");
  }
  if (f.FindValue(Key("recall_target")) != nullptr) {
    TC_ASSIGN_OR_RETURN(double t, f.GetDouble(Key("recall_target")));
    if (!(t >= 0 && t <= 1)) return Invalid(f, Key("recall_target") + " is not in [0, 1]");
    r.recall_target = static_cast<float>(t);
  }
  if (f.FindValue(Key("criterion")) != nullptr) {
    TC_ASSIGN_OR_RETURN(r.criterion, f.GetString(Key("criterion")));
  }
  const char* names[] = {"recall", "precision", "predicted_active", "true_active"};
  std::vector<std::vector<float>> arrays;
  for (const char* name : names) {
    TC_ASSIGN_OR_RETURN(std::optional<std::vector<float>> a,
                        OptionalFloatArray(f, Key(name), n_layers));
    if (!a) return r;  // reports are all or nothing; a partial one is ignored
    arrays.push_back(std::move(*a));
  }
  r.layers.resize(n_layers);
  for (int64_t l = 0; l < n_layers; ++l) {
    r.layers[l] = {arrays[0][l], arrays[1][l], arrays[2][l], arrays[3][l]};
  }
  return r;
}

// Scratch of the thread calling Predict: the hidden layer, the scores, and the kept hidden
// units' ids and values for fc2_t. Grows to the largest rank / ffn_dim seen and then never
// allocates again.
struct PredictScratch {
  std::vector<float> hidden;
  std::vector<float> scores;
  std::vector<int32_t> ids;
  std::vector<float> coeffs;
};
PredictScratch& ThreadScratch() {
  thread_local PredictScratch scratch;
  return scratch;
}

}  // namespace

PredictorSet::PredictorSet(const PredictorSet& other)
    : file_(other.file_),
      owned_(other.owned_),
      transposed_(other.transposed_),
      layers_(other.layers_),
      threshold_(other.threshold_),
      layer_thresholds_(other.layer_thresholds_),
      report_(other.report_) {
  RebindOwned();
}

PredictorSet& PredictorSet::operator=(const PredictorSet& other) {
  if (this == &other) return *this;
  file_ = other.file_;
  owned_ = other.owned_;
  transposed_ = other.transposed_;
  layers_ = other.layers_;
  threshold_ = other.threshold_;
  layer_thresholds_ = other.layer_thresholds_;
  report_ = other.report_;
  RebindOwned();
  return *this;
}

// Sets built in memory own two buffers per layer (fc1, fc2); file-backed sets own none.
void PredictorSet::RebindOwned() {
  if (owned_.size() != 2 * layers_.size()) return;
  for (size_t l = 0; l < layers_.size(); ++l) {
    layers_[l].fc1.data = owned_[2 * l].data();
    layers_[l].fc2.data = owned_[2 * l + 1].data();
  }
}

absl::Status PredictorSet::BuildTransposed() {
  transposed_.assign(layers_.size(), {});
  ThreadPool here(1);
  for (size_t l = 0; l < layers_.size(); ++l) {
    LayerPredictor& p = layers_[l];
    p.fc2_t = MatrixView();
    const GgmlType type = p.fc2.type;
    if (type != GgmlType::kF32 && type != GgmlType::kF16 && type != GgmlType::kBF16) continue;
    // Float elements are moved whole, so the values are fc2's bit for bit.
    const int64_t row_bytes = RowBytes(type, p.fc2.rows);
    const int64_t bytes = p.fc2.cols * row_bytes;
    auto buffer = std::make_shared<PageBuffer>(static_cast<size_t>(bytes));
    if (buffer->data() == nullptr && bytes > 0) {
      return absl::ResourceExhaustedError(absl::StrCat("predictor layer ", l, ": cannot allocate ",
                                                       bytes, " bytes for fc2's transposed copy"));
    }
    TC_RETURN_IF_ERROR(DownRows::TransposeInto(p.fc2, type, buffer->data(), row_bytes, here));
    p.fc2_t = View(type, p.fc2.cols, p.fc2.rows, buffer->data());
    transposed_[l] = std::move(buffer);
  }
  return absl::OkStatus();
}

std::string_view PredictorInputName(const ModelConfig& config) {
  const bool layer_input =
      config.arch != nullptr && config.arch->predictor_input == PredictorInput::kLayerInput;
  return layer_input ? "layer_input" : "ffn_inp";
}

absl::Status CheckPredictorInput(const GgufFile& f, const ModelConfig& config) {
  const std::string want(PredictorInputName(config));
  if (f.FindValue(Key("input")) != nullptr) {
    TC_ASSIGN_OR_RETURN(std::string got, f.GetString(Key("input")));
    if (got != want) {
      return Invalid(f, absl::StrCat(Key("input"), " = '", got, "' but a ", config.arch_name(),
                                     " model's predictors read '", want,
                                     "'; retrain them with `thermocline train-predictor`"));
    }
    return absl::OkStatus();
  }
  // PowerInfer's own files carry no thermocline key and were trained on its graph's input.
  // Thermocline files without the key predate the fix and were trained on ffn_norm(x).
  for (const auto& [key, value] : f.metadata()) {
    if (absl::StartsWith(key, kPrefix)) {
      return Invalid(f, absl::StrCat(
                            "was trained by an older Thermocline on ffn_norm(x), but the "
                            "predictors now read '", want,
                            "' as PowerInfer's do (docs/formats.md); retrain them with "
                            "`thermocline train-predictor`"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PredictorSet> PredictorSet::FromGguf(std::shared_ptr<const GgufFile> file,
                                                    const ModelConfig& config) {
  if (file == nullptr) return absl::InvalidArgumentError("predictors: no file");
  const GgufFile& f = *file;
  if (config.n_layers <= 0 || config.dim <= 0 || config.ffn_dim <= 0) {
    return Invalid(f, "the model config has no layers or an empty FFN");
  }
  // A predictor file records the model it was trained for; check it before the tensors so that
  // a file for another model is named as such rather than as a shape mismatch.
  struct Expect {
    const char* key;
    int64_t value;
  };
  for (const Expect& e : {Expect{"block_count", config.n_layers}, Expect{"model_dim", config.dim},
                          Expect{"model_ffn_dim", config.ffn_dim}}) {
    if (f.FindValue(Key(e.key)) == nullptr) continue;
    TC_ASSIGN_OR_RETURN(int64_t v, f.GetInt(Key(e.key)));
    if (v != e.value) {
      return Invalid(f, absl::StrCat(Key(e.key), " = ", v, " but the model has ", e.value,
                                     " (predictors trained for another model?)"));
    }
  }
  if (f.FindTensor(Fc1Name(config.n_layers)) != nullptr ||
      f.FindTensor(Fc2Name(config.n_layers)) != nullptr) {
    return Invalid(f, absl::StrCat("has a predictor for layer ", config.n_layers,
                                   " but the model has only ", config.n_layers, " layers"));
  }

  TC_RETURN_IF_ERROR(CheckPredictorInput(f, config));

  PredictorSet set;
  set.layers_.resize(config.n_layers);
  for (int64_t l = 0; l < config.n_layers; ++l) {
    const GgufTensorInfo* fc1 = f.FindTensor(Fc1Name(l));
    const GgufTensorInfo* fc2 = f.FindTensor(Fc2Name(l));
    if (fc1 == nullptr || fc2 == nullptr) {
      return Invalid(f, absl::StrCat("layer ", l, " has no predictor: tensor '",
                                     fc1 == nullptr ? Fc1Name(l) : Fc2Name(l), "' is missing"));
    }
    if (fc1->ne.size() != 2 || fc1->ne[0] != config.dim || fc1->ne[1] <= 0) {
      return Invalid(f, absl::StrCat("tensor '", Fc1Name(l), "' has shape ", ShapeString(fc1->ne),
                                     ", expected (", config.dim, ", rank) with rank > 0"));
    }
    const int64_t rank = fc1->ne[1];
    for (const GgufTensorInfo* t : {fc1, fc2}) {
      if (!IsWeightType(t->type)) {
        return Invalid(
            f, absl::StrCat("tensor '", t->name, "' has type ",
                            std::string(TypeTraits(t->type).name), ", which is not a weight type"));
      }
    }
    if (fc2->ne.size() != 2 || fc2->ne[0] != rank || fc2->ne[1] != config.ffn_dim) {
      return Invalid(
          f, absl::StrCat("tensor '", Fc2Name(l), "' has shape ", ShapeString(fc2->ne),
                          ", expected (", rank, ", ", config.ffn_dim, ") to match '", Fc1Name(l),
                          "' (rank ", rank, ") and the model's ", config.ffn_dim, " FFN neurons"));
    }
    LayerPredictor& p = set.layers_[l];
    p.rank = rank;
    p.fc1 = View(fc1->type, rank, config.dim, fc1->data);
    p.fc2 = View(fc2->type, config.ffn_dim, rank, fc2->data);
  }

  if (f.FindValue(kThresholdKey) != nullptr) {
    TC_ASSIGN_OR_RETURN(double t, f.GetDouble(kThresholdKey));
    if (!std::isfinite(t) || std::abs(t) > std::numeric_limits<float>::max()) {
      return Invalid(f, absl::StrCat(kThresholdKey, " = ", t, " is not a finite f32"));
    }
    set.threshold_ = static_cast<float>(t);
  }
  set.layer_thresholds_.assign(config.n_layers, set.threshold_);
  TC_ASSIGN_OR_RETURN(std::optional<std::vector<float>> per_layer,
                      OptionalFloatArray(f, Key("thresholds"), config.n_layers));
  if (per_layer) set.layer_thresholds_ = std::move(*per_layer);
  TC_ASSIGN_OR_RETURN(set.report_, ReadReport(f, config.n_layers));
  set.file_ = std::move(file);
  TC_RETURN_IF_ERROR(set.BuildTransposed());
  return set;
}

absl::StatusOr<PredictorSet> PredictorSet::Load(const std::string& path,
                                                const ModelConfig& config) {
  TC_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  return FromGguf(std::shared_ptr<const GgufFile>(std::move(file)), config);
}

absl::StatusOr<PredictorSet> PredictorSet::FromWeights(const std::vector<PredictorWeights>& layers,
                                                       const ModelConfig& config, GgmlType type,
                                                       float threshold) {
  if (static_cast<int64_t>(layers.size()) != config.n_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "predictors: ", layers.size(), " layers given, the model has ", config.n_layers));
  }
  if (!std::isfinite(threshold)) {
    return absl::InvalidArgumentError("predictors: the threshold is not finite");
  }
  if (!IsWeightType(type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("predictors: ", std::string(TypeTraits(type).name), " is not a weight type"));
  }
  const int64_t block = TypeTraits(type).block_size;
  if (config.dim % block != 0) {
    return absl::InvalidArgumentError(absl::StrCat("predictors: model dim ", config.dim,
                                                   " is not a multiple of ", block, " (needed by ",
                                                   std::string(TypeTraits(type).name), ")"));
  }
  PredictorSet set;
  set.layers_.resize(layers.size());
  set.owned_.resize(2 * layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    const PredictorWeights& w = layers[l];
    if (w.rank <= 0 || w.rank % block != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("predictors: layer ", l, " rank ", w.rank, " must be > 0",
                       block > 1 ? absl::StrCat(" and a multiple of ", block, " for ",
                                                std::string(TypeTraits(type).name))
                                 : ""));
    }
    if (static_cast<int64_t>(w.fc1.size()) != w.rank * config.dim ||
        static_cast<int64_t>(w.fc2.size()) != config.ffn_dim * w.rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          "predictors: layer ", l, " has ", w.fc1.size(), " fc1 and ", w.fc2.size(),
          " fc2 values, expected ", w.rank * config.dim, " and ", config.ffn_dim * w.rank));
    }
    auto convert = [&](const std::vector<float>& src, int64_t rows, int64_t cols,
                       std::vector<uint8_t>& dst, const char* name) -> absl::Status {
      const int64_t row_bytes = RowBytes(type, cols);
      dst.resize(rows * row_bytes);
      std::vector<float> check(cols);
      for (int64_t r = 0; r < rows; ++r) {
        QuantizeRow(type, src.data() + r * cols, dst.data() + r * row_bytes, cols);
        // A weight outside the type's range (f16 tops out at 65504) would silently become inf.
        DequantizeRow(type, dst.data() + r * row_bytes, check.data(), cols);
        for (int64_t c = 0; c < cols; ++c) {
          if (!std::isfinite(check[c])) {
            return absl::InvalidArgumentError(absl::StrCat(
                "predictors: layer ", l, " ", name, "[", r, "][", c, "] = ", src[r * cols + c],
                " is not finite as ", std::string(TypeTraits(type).name)));
          }
        }
      }
      return absl::OkStatus();
    };
    TC_RETURN_IF_ERROR(convert(w.fc1, w.rank, config.dim, set.owned_[2 * l], "fc1"));
    TC_RETURN_IF_ERROR(convert(w.fc2, config.ffn_dim, w.rank, set.owned_[2 * l + 1], "fc2"));
    LayerPredictor& p = set.layers_[l];
    p.rank = w.rank;
    p.fc1 = View(type, w.rank, config.dim, nullptr);
    p.fc2 = View(type, config.ffn_dim, w.rank, nullptr);
  }
  set.RebindOwned();
  set.set_threshold(threshold);
  TC_RETURN_IF_ERROR(set.BuildTransposed());
  return set;
}

absl::Status PredictorSet::set_layer_thresholds(std::vector<float> thresholds) {
  if (thresholds.size() != layers_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("predictors: ", thresholds.size(),
                                                   " thresholds for ", layers_.size(), " layers"));
  }
  for (size_t l = 0; l < thresholds.size(); ++l) {
    if (!std::isfinite(thresholds[l])) {
      return absl::InvalidArgumentError(
          absl::StrCat("predictors: the threshold of layer ", l, " is not finite"));
    }
  }
  layer_thresholds_ = std::move(thresholds);
  return absl::OkStatus();
}

bool PredictorSet::has_per_layer_thresholds() const {
  for (float t : layer_thresholds_) {
    if (t != threshold_) return true;
  }
  return false;
}

int64_t PredictorSet::bytes() const {
  int64_t total = 0;
  for (const LayerPredictor& p : layers_) {
    total += p.fc1.rows * p.fc1.row_bytes + p.fc2.rows * p.fc2.row_bytes;
  }
  return total;
}

int64_t PredictorSet::Scores(int64_t layer, const float* h, int64_t n_tokens, float* scores,
                             ThreadPool& pool) const {
  const LayerPredictor& p = layers_[layer];
  if (n_tokens <= 0) return 0;
  std::vector<float>& hidden = ThreadScratch().hidden;
  if (hidden.size() < static_cast<size_t>(n_tokens * p.rank)) hidden.resize(n_tokens * p.rank);
  MatMul(p.fc1, h, n_tokens, p.fc1.cols, hidden.data(), p.rank, pool);
  for (int64_t i = 0; i < n_tokens * p.rank; ++i) hidden[i] = std::max(hidden[i], 0.0f);
  const int64_t fc1_bytes = p.fc1.rows * p.fc1.row_bytes;
  if (n_tokens == 1 && p.fc2_t.data != nullptr) {
    // The zeros ReLU left add nothing and are skipped (cut 0): their rows are never read.
    PredictScratch& s = ThreadScratch();
    const int64_t rows =
        InputSparseMatVec(p.fc2_t, hidden.data(), 0.0f, s.ids, s.coeffs, scores, pool);
    return fc1_bytes + rows * p.fc2_t.row_bytes;
  }
  MatMul(p.fc2, hidden.data(), n_tokens, p.rank, scores, p.fc2.rows, pool);
  return fc1_bytes + p.fc2.rows * p.fc2.row_bytes;
}

int64_t PredictorSet::Predict(int64_t layer, const float* h, std::vector<int32_t>* active,
                              ThreadPool& pool) const {
  const LayerPredictor& p = layers_[layer];
  const int64_t n = p.fc2.rows;
  std::vector<float>& scores = ThreadScratch().scores;
  if (scores.size() < static_cast<size_t>(n)) scores.resize(n);
  const int64_t read = Scores(layer, h, 1, scores.data(), pool);
  const float t = layer_thresholds_[layer];
  // Without a branch: which scores pass is close to random, and a mispredicted branch per few
  // neurons cost about 7 us a layer (5504 neurons) on the step's serial path.
  active->resize(n);
  int32_t* out = active->data();
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    out[kept] = static_cast<int32_t>(i);
    kept += scores[i] >= t ? 1 : 0;
  }
  active->resize(kept);
  return read;
}

absl::Status WritePredictors(const PredictorSet& set, const ModelConfig& config,
                             const std::string& path) {
  if (set.n_layers() != config.n_layers) {
    return absl::InvalidArgumentError(absl::StrCat("write predictors ", path, ": the set has ",
                                                   set.n_layers(), " layers, the model ",
                                                   config.n_layers));
  }
  GgufWriter w;
  w.SetValue("general.architecture", GgufString(kArchitecture));
  w.SetValue(kThresholdKey, GgufF32(set.threshold()));
  w.SetValue(Key("block_count"), GgufU32(static_cast<uint32_t>(config.n_layers)));
  w.SetValue(Key("model_dim"), GgufU32(static_cast<uint32_t>(config.dim)));
  w.SetValue(Key("model_ffn_dim"), GgufU32(static_cast<uint32_t>(config.ffn_dim)));
  w.SetValue(Key("input"), GgufString(std::string(PredictorInputName(config))));
  std::vector<int32_t> ranks;
  for (int64_t l = 0; l < set.n_layers(); ++l) {
    ranks.push_back(static_cast<int32_t>(set.layer(l).rank));
  }
  w.SetValue(Key("ranks"), GgufI32Array(ranks));
  w.SetValue(Key("thresholds"), GgufF32Array(set.layer_thresholds()));
  const PredictorReport& r = set.report();
  if (!r.layers.empty()) {
    if (static_cast<int64_t>(r.layers.size()) != config.n_layers) {
      return absl::InvalidArgumentError(absl::StrCat("write predictors ", path, ": the report has ",
                                                     r.layers.size(), " layers, the model ",
                                                     config.n_layers));
    }
    w.SetValue(Key("training_tokens"), GgufU64(static_cast<uint64_t>(r.training_tokens)));
    w.SetValue(Key("recall_target"), GgufF32(r.recall_target));
    w.SetValue(Key("criterion"), GgufString(r.criterion));
    std::vector<float> recall, precision, predicted, truth;
    for (const PredictorLayerReport& lr : r.layers) {
      recall.push_back(lr.recall);
      precision.push_back(lr.precision);
      predicted.push_back(lr.predicted_active);
      truth.push_back(lr.true_active);
    }
    w.SetValue(Key("recall"), GgufF32Array(recall));
    w.SetValue(Key("precision"), GgufF32Array(precision));
    w.SetValue(Key("predicted_active"), GgufF32Array(predicted));
    w.SetValue(Key("true_active"), GgufF32Array(truth));
  }
  for (int64_t l = 0; l < set.n_layers(); ++l) {
    const LayerPredictor& p = set.layer(l);
    if (p.fc1.cols != config.dim || p.fc2.rows != config.ffn_dim) {
      return absl::InvalidArgumentError(absl::StrCat("write predictors ", path, ": layer ", l,
                                                     " does not match the model's shape"));
    }
    for (const auto& [name, m] : {std::pair{Fc1Name(l), p.fc1}, std::pair{Fc2Name(l), p.fc2}}) {
      TC_RETURN_IF_ERROR(w.AddTensorBytes(
          name, m.type, {m.cols, m.rows},
          std::string_view(reinterpret_cast<const char*>(m.data), m.rows * m.row_bytes)));
    }
  }
  return w.WriteFile(path);
}

}  // namespace thermocline
