#include "shared/sparsity/placement.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "shared/gguf/gguf.h"
#include "shared/util/status_macros.h"

namespace thermocline {
namespace {

constexpr char kArch[] = "generic.gpu_index";
constexpr char kBlockCountKey[] = "generic.gpu_index.block_count";
constexpr char kVramKey[] = "split.vram_capacity";
constexpr char kShareKey[] = "thermocline.plan.expected_gpu_share";
constexpr char kKvSlotsKey[] = "thermocline.plan.kv_slots";
constexpr char kKvContextKey[] = "thermocline.plan.kv_context";
constexpr char kKvTypeKey[] = "thermocline.plan.kv_type";
constexpr char kFfnBytesKey[] = "thermocline.plan.ffn_bytes";

absl::Status Invalid(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
}

// " (expert e, neuron j)" for flat id i of an MoE layer with `per_expert` neurons per expert
// (0: not an MoE layer, or not known without a model).
std::string ExpertOf(int64_t i, int64_t per_expert) {
  if (per_expert <= 0) return "";
  return absl::StrCat(" (expert ", i / per_expert, ", neuron ", i % per_expert, ")");
}

// Checks one layer: on_gpu holds 0/1, bucket is ascending, in range and equal to the 1s.
absl::Status ValidateLayer(const LayerPlacement& p, const std::string& where,
                           int64_t per_expert = 0) {
  const int64_t n = static_cast<int64_t>(p.on_gpu.size());
  int64_t ones = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (p.on_gpu[i] > 1) {
      return Invalid(where, absl::StrCat("gpu_idx[", i, "]", ExpertOf(i, per_expert), " = ",
                                         p.on_gpu[i], " is not 0 or 1"));
    }
    ones += p.on_gpu[i];
  }
  for (size_t k = 0; k < p.gpu_bucket.size(); ++k) {
    const int32_t id = p.gpu_bucket[k];
    if (id < 0 || id >= n) {
      return Invalid(
          where, absl::StrCat("gpu_bucket[", k, "] = ", id, " is not a neuron id in [0, ", n, ")"));
    }
    if (k > 0 && id <= p.gpu_bucket[k - 1]) {
      return Invalid(where, absl::StrCat("gpu_bucket is not strictly ascending at [", k,
                                         "]: ", p.gpu_bucket[k - 1], " then ", id,
                                         ExpertOf(id, per_expert)));
    }
    if (p.on_gpu[id] != 1) {
      return Invalid(where, absl::StrCat("gpu_bucket[", k, "] = ", id, ExpertOf(id, per_expert),
                                         " but gpu_idx[", id, "] is 0"));
    }
  }
  if (static_cast<int64_t>(p.gpu_bucket.size()) != ones) {
    return Invalid(where, absl::StrCat("gpu_idx marks ", ones, " neurons but gpu_bucket lists ",
                                       p.gpu_bucket.size()));
  }
  return absl::OkStatus();
}

// A 1-D I32 tensor; `n` < 0 accepts any length.
absl::StatusOr<std::vector<int32_t>> ReadI32Vector(const GgufFile& f, const std::string& where,
                                                   const std::string& name, int64_t n) {
  const GgufTensorInfo* t = f.FindTensor(name);
  if (t == nullptr) return Invalid(where, absl::StrCat("tensor '", name, "' is missing"));
  if (t->type != GgmlType::kI32) {
    return Invalid(where, absl::StrCat("tensor '", name, "' has type ",
                                       std::string(TypeTraits(t->type).name), ", expected i32"));
  }
  if (t->ne.size() != 1 || (n >= 0 && t->ne[0] != n)) {
    return Invalid(where,
                   absl::StrCat("tensor '", name, "' has shape (", absl::StrJoin(t->ne, ", "),
                                "), expected (", n >= 0 ? absl::StrCat(n) : "n", ")"));
  }
  std::vector<int32_t> out(t->ne[0]);
  if (!out.empty()) std::memcpy(out.data(), t->data, out.size() * sizeof(int32_t));
  return out;
}

absl::StatusOr<Placement> Read(const std::string& path, const ModelConfig* config) {
  const std::string where = absl::StrCat("placement ", path);
  absl::StatusOr<std::unique_ptr<GgufFile>> file_or =
      OpenGgufOfArchitecture(path, kArch, "placement", "a PowerInfer .gpuidx or `thermocline plan` output");
  if (!file_or.ok()) return file_or.status();
  const GgufFile& f = **file_or;
  std::string count_key = kBlockCountKey;
  if (f.FindValue(count_key) == nullptr) count_key = "llama.block_count";
  if (f.FindValue(count_key) == nullptr) {
    return Invalid(
        where, absl::StrCat("no block count (neither ", kBlockCountKey, " nor llama.block_count)"));
  }
  absl::StatusOr<int64_t> n_layers = f.GetInt(count_key);
  if (!n_layers.ok()) return Invalid(where, std::string(n_layers.status().message()));
  if (*n_layers < 1 || *n_layers > 65536) {
    return Invalid(where, absl::StrCat(count_key, " = ", *n_layers, " is out of range"));
  }
  if (config != nullptr && *n_layers != config->n_layers) {
    return Invalid(where, absl::StrCat(count_key, " = ", *n_layers, " but the model has ",
                                       config->n_layers, " layers"));
  }
  Placement p;
  if (f.FindValue(kVramKey) != nullptr) {
    absl::StatusOr<int64_t> v = f.GetInt(kVramKey);
    if (!v.ok()) return Invalid(where, std::string(v.status().message()));
    if (*v < 0) return Invalid(where, absl::StrCat(kVramKey, " = ", *v, " is negative"));
    p.vram_capacity = *v;
  }
  if (f.FindValue(kShareKey) != nullptr) {
    absl::StatusOr<double> v = f.GetDouble(kShareKey);
    if (!v.ok()) return Invalid(where, std::string(v.status().message()));
    if (!(*v >= 0 && *v <= 1)) {
      return Invalid(where, absl::StrCat(kShareKey, " = ", *v, " is not in [0, 1]"));
    }
    p.expected_gpu_share = *v;
  }
  if (f.FindValue(kFfnBytesKey) != nullptr) {
    absl::StatusOr<int64_t> v = f.GetInt(kFfnBytesKey);
    if (!v.ok()) return Invalid(where, std::string(v.status().message()));
    if (*v < 0) return Invalid(where, absl::StrCat(kFfnBytesKey, " = ", *v, " is negative"));
    p.gpu_ffn_bytes = *v;
  }
  if (f.FindValue(kKvSlotsKey) != nullptr) {
    absl::StatusOr<int64_t> slots = f.GetInt(kKvSlotsKey);
    absl::StatusOr<int64_t> context = f.GetInt(kKvContextKey);
    absl::StatusOr<std::string> type = f.GetString(kKvTypeKey);
    if (!slots.ok()) return Invalid(where, std::string(slots.status().message()));
    if (!context.ok()) return Invalid(where, std::string(context.status().message()));
    if (!type.ok()) return Invalid(where, std::string(type.status().message()));
    if (*slots < 1 || *slots > 65536 || *context < 1 || *context > (int64_t{1} << 31) - 1 ||
        (*type != "f32" && *type != "f16")) {
      return Invalid(where, absl::StrCat("KV configuration ", *slots, " slots x ", *context,
                                         " positions (", *type, ") is not valid"));
    }
    p.kv_slots = static_cast<int32_t>(*slots);
    p.kv_context = static_cast<int32_t>(*context);
    p.kv_type = *type;
  }
  p.layers.resize(*n_layers);
  for (int64_t l = 0; l < *n_layers; ++l) {
    const std::string prefix = absl::StrCat("blk.", l, ".");
    const bool moe = config != nullptr && LayerNeurons(*config, l) != config->ffn_dim;
    TC_ASSIGN_OR_RETURN(
        std::vector<int32_t> idx,
        ReadI32Vector(f, where, prefix + "gpu_idx", config != nullptr ? LayerNeurons(*config, l) : -1));
    if (idx.empty()) return Invalid(where, absl::StrCat("tensor '", prefix, "gpu_idx' is empty"));
    TC_ASSIGN_OR_RETURN(std::vector<int32_t> bucket,
                        ReadI32Vector(f, where, prefix + "gpu_bucket", -1));
    LayerPlacement& lp = p.layers[l];
    lp.on_gpu.resize(idx.size());
    for (size_t i = 0; i < idx.size(); ++i) {
      if (idx[i] != 0 && idx[i] != 1) {
        return Invalid(where, absl::StrCat("layer ", l, ": gpu_idx[", i, "]",
                                           ExpertOf(i, moe ? config->ffn_dim : 0), " = ", idx[i],
                                           " is not 0 or 1"));
      }
      lp.on_gpu[i] = static_cast<uint8_t>(idx[i]);
    }
    lp.gpu_bucket = std::move(bucket);
    TC_RETURN_IF_ERROR(
        ValidateLayer(lp, absl::StrCat(where, ": layer ", l), moe ? config->ffn_dim : 0));
  }
  return p;
}

}  // namespace

int64_t Placement::n_gpu_neurons() const {
  int64_t n = 0;
  for (const LayerPlacement& l : layers) n += static_cast<int64_t>(l.gpu_bucket.size());
  return n;
}

int64_t LayerNeurons(const ModelConfig& config, int64_t layer) {
  const bool moe = layer < static_cast<int64_t>(config.layers.size()) && config.layers[layer].moe;
  return moe ? config.n_experts * config.ffn_dim : config.ffn_dim;
}

Placement Placement::Uniform(const ModelConfig& config, double hot_fraction,
                             const ActivationStats* stats) {
  const double fraction = std::clamp(std::isfinite(hot_fraction) ? hot_fraction : 0.0, 0.0, 1.0);
  // The fraction applies to each group of ffn_dim neurons: the FFN, or one expert.
  const int64_t nf = config.ffn_dim;
  const int64_t n_hot = std::llround(fraction * static_cast<double>(nf));
  bool use_stats = stats != nullptr && stats->ffn_dim == nf &&
                   static_cast<int64_t>(stats->layers.size()) == config.n_layers;
  for (int64_t l = 0; use_stats && l < config.n_layers; ++l) {
    use_stats = static_cast<int64_t>(stats->layers[l].frequency.size()) == LayerNeurons(config, l);
  }
  Placement p;
  p.layers.resize(config.n_layers);
  double placed = 0, total = 0;
  std::vector<int32_t> order(nf);
  for (int64_t l = 0; l < config.n_layers; ++l) {
    const int64_t n = LayerNeurons(config, l);
    LayerPlacement& lp = p.layers[l];
    lp.on_gpu.assign(n, 0);
    for (int64_t base = 0; base < n; base += nf) {
      std::iota(order.begin(), order.end(), static_cast<int32_t>(base));
      if (use_stats) {
        const std::vector<float>& freq = stats->layers[l].frequency;
        std::stable_sort(order.begin(), order.end(),
                         [&](int32_t a, int32_t b) { return freq[a] > freq[b]; });
        for (int64_t i = 0; i < nf; ++i) {
          total += freq[base + i];
          if (i < n_hot) placed += freq[order[i]];
        }
      }
      lp.gpu_bucket.insert(lp.gpu_bucket.end(), order.begin(), order.begin() + n_hot);
    }
    std::sort(lp.gpu_bucket.begin(), lp.gpu_bucket.end());
    for (int32_t id : lp.gpu_bucket) lp.on_gpu[id] = 1;
  }
  if (use_stats) p.expected_gpu_share = total > 0 ? placed / total : (n_hot == nf ? 1.0 : 0.0);
  return p;
}

absl::Status ValidatePlacement(const Placement& placement) {
  if (placement.layers.empty()) return absl::InvalidArgumentError("placement: no layers");
  if (placement.vram_capacity < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement: vram_capacity ", placement.vram_capacity, " is negative"));
  }
  if (!(placement.expected_gpu_share >= 0 && placement.expected_gpu_share <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "placement: expected_gpu_share ", placement.expected_gpu_share, " is not in [0, 1]"));
  }
  for (size_t l = 0; l < placement.layers.size(); ++l) {
    const LayerPlacement& lp = placement.layers[l];
    if (lp.on_gpu.empty() || lp.on_gpu.size() > static_cast<size_t>(INT32_MAX)) {
      return absl::InvalidArgumentError(
          absl::StrCat("placement: layer ", l, " has ", lp.on_gpu.size(), " neurons"));
    }
    TC_RETURN_IF_ERROR(ValidateLayer(lp, absl::StrCat("placement: layer ", l)));
  }
  return absl::OkStatus();
}

absl::Status WritePlacement(const Placement& placement, const std::string& path) {
  TC_RETURN_IF_ERROR(ValidatePlacement(placement));
  GgufWriter w;
  w.set_powerinfer_magic(true);
  // Key order as PowerInfer's export_split writes them.
  w.SetValue("general.architecture", GgufString(kArch));
  w.SetValue(kBlockCountKey, GgufU32(static_cast<uint32_t>(placement.layers.size())));
  w.SetValue(kVramKey, GgufU64(static_cast<uint64_t>(placement.vram_capacity)));
  w.SetValue(kShareKey, GgufF32(static_cast<float>(placement.expected_gpu_share)));
  if (placement.gpu_ffn_bytes > 0) {
    w.SetValue(kFfnBytesKey, GgufU64(static_cast<uint64_t>(placement.gpu_ffn_bytes)));
  }
  if (placement.kv_slots > 0) {
    w.SetValue(kKvSlotsKey, GgufU32(static_cast<uint32_t>(placement.kv_slots)));
    w.SetValue(kKvContextKey, GgufU32(static_cast<uint32_t>(placement.kv_context)));
    w.SetValue(kKvTypeKey, GgufString(placement.kv_type));
  }
  for (size_t l = 0; l < placement.layers.size(); ++l) {
    const LayerPlacement& lp = placement.layers[l];
    const std::string prefix = absl::StrCat("blk.", l, ".");
    std::vector<int32_t> idx(lp.on_gpu.begin(), lp.on_gpu.end());
    TC_RETURN_IF_ERROR(w.AddTensorBytes(
        prefix + "gpu_idx", GgmlType::kI32, {static_cast<int64_t>(idx.size())},
        std::string_view(reinterpret_cast<const char*>(idx.data()), idx.size() * sizeof(int32_t))));
    TC_RETURN_IF_ERROR(w.AddTensorBytes(
        prefix + "gpu_bucket", GgmlType::kI32, {static_cast<int64_t>(lp.gpu_bucket.size())},
        std::string_view(reinterpret_cast<const char*>(lp.gpu_bucket.data()),
                         lp.gpu_bucket.size() * sizeof(int32_t))));
  }
  return w.WriteFile(path);
}

absl::StatusOr<Placement> ReadPlacement(const std::string& path, const ModelConfig& config) {
  return Read(path, &config);
}

absl::StatusOr<Placement> ReadPlacement(const std::string& path) { return Read(path, nullptr); }

}  // namespace thermocline
