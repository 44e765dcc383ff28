#include "shared/sparsity/activation_stats.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "shared/gguf/gguf.h"
#include "shared/sparsity/placement.h"
#include "shared/sparsity/profile_fields.h"
#include "shared/util/status_macros.h"

namespace thermocline {
namespace {

constexpr char kArch[] = "thermocline.stats";
constexpr float kTargetTolerance = 1e-4f;

absl::Status Invalid(const std::string& where, const std::string& what) {
  return ProfileFieldError(where, what);
}

std::string TargetList(const std::vector<float>& targets) {
  return targets.empty() ? "none" : absl::StrJoin(targets, ", ");
}

// One check for both directions, so a file we write is always one we accept.
absl::Status Validate(const ActivationStats& s, const std::string& where) {
  if (s.criterion != "relu" && s.criterion != "magnitude") {
    return Invalid(where,
                   absl::StrCat("criterion '", s.criterion, "' is not one of: relu, magnitude"));
  }
  if (s.tokens <= 0) return Invalid(where, absl::StrCat("tokens = ", s.tokens, " must be > 0"));
  if (s.dim <= 0 || s.ffn_dim <= 0) {
    return Invalid(where, absl::StrCat("model dims ", s.dim, " x ", s.ffn_dim, " must be > 0"));
  }
  if (s.layers.empty()) return Invalid(where, "no layers");
  for (size_t i = 0; i < s.targets.size(); ++i) {
    const float t = s.targets[i];
    if (!(t > 0.0f && t < 1.0f)) {
      return Invalid(where, absl::StrCat("target ", i, " = ", t, " is not in (0, 1)"));
    }
    if (i > 0 && !(t > s.targets[i - 1])) {
      return Invalid(where,
                     absl::StrCat("targets are not strictly ascending: ", TargetList(s.targets)));
    }
  }
  if (!(s.frequency_target > 0.0f && s.frequency_target < 1.0f)) {
    return Invalid(where,
                   absl::StrCat("frequency_target ", s.frequency_target, " is not in (0, 1)"));
  }
  if (s.criterion == "magnitude") {
    bool found = false;
    for (float t : s.targets) found |= std::fabs(t - s.frequency_target) <= kTargetTolerance;
    if (!found) {
      return Invalid(where,
                     absl::StrCat("frequency_target ", s.frequency_target,
                                  " is not one of the targets (", TargetList(s.targets), ")"));
    }
  }
  const bool has_hist = !s.layers[0].histogram.empty();
  const bool has_coeff = !s.layers[0].coeff_cuts.empty();
  if (has_hist) {
    if (s.hist_bins_per_octave <= 0 || !std::isfinite(s.hist_log2_min)) {
      return Invalid(where,
                     absl::StrCat("histogram bin edges (log2 min ", s.hist_log2_min,
                                  ", bins per octave ", s.hist_bins_per_octave, ") are invalid"));
    }
  }
  if (s.n_experts < 0 || s.n_experts > 65536) {
    return Invalid(where, absl::StrCat("expert_count ", s.n_experts, " is out of range"));
  }
  for (size_t l = 0; l < s.layers.size(); ++l) {
    const LayerActivationStats& layer = s.layers[l];
    const std::string lw = absl::StrCat("layer ", l);
    if (layer.experts != 0 && layer.experts != s.n_experts) {
      return Invalid(where, absl::StrCat(lw, ": ", layer.experts, " experts, the file's expert_count is ",
                                         s.n_experts));
    }
    // Dense layers are one group of ffn_dim neurons; MoE layers one group per expert.
    const int64_t groups = layer.experts > 0 ? layer.experts : 1;
    auto group_name = [&](int64_t g) {
      return layer.experts > 0 ? absl::StrCat(lw, " expert ", g) : lw;
    };
    if (static_cast<int64_t>(layer.frequency.size()) != groups * s.ffn_dim) {
      return Invalid(where, absl::StrCat(lw, ": ", layer.frequency.size(),
                                         " frequencies, expected ", groups * s.ffn_dim));
    }
    for (size_t i = 0; i < layer.frequency.size(); ++i) {
      const float f = layer.frequency[i];
      if (!(f >= 0.0f && f <= 1.0f)) {
        return Invalid(where, absl::StrCat(group_name(static_cast<int64_t>(i) / s.ffn_dim),
                                           ": frequency of neuron ", i % s.ffn_dim, " = ", f,
                                           " is not in [0, 1]"));
      }
    }
    if (static_cast<int64_t>(layer.expert_share.size()) != layer.experts) {
      return Invalid(where, absl::StrCat(lw, ": ", layer.expert_share.size(),
                                         " expert shares for ", layer.experts, " experts"));
    }
    for (size_t e = 0; e < layer.expert_share.size(); ++e) {
      const float x = layer.expert_share[e];
      if (!(x >= 0.0f && x <= 1.0f)) {
        return Invalid(where, absl::StrCat(group_name(static_cast<int64_t>(e)), ": share ", x,
                                           " of the tokens is not in [0, 1]"));
      }
    }
    const size_t n_targets = s.targets.size();
    auto check_cuts = [&](const std::vector<float>& cuts, const char* what) -> absl::Status {
      if (cuts.size() != static_cast<size_t>(groups) * n_targets) {
        return Invalid(where, absl::StrCat(lw, ": ", cuts.size(), " ", what, "s for ", n_targets,
                                           " targets", layer.experts > 0
                                                           ? absl::StrCat(" x ", groups, " experts")
                                                           : ""));
      }
      for (int64_t g = 0; g < groups; ++g) {
        const float* group = cuts.data() + g * n_targets;
        for (size_t i = 0; i < n_targets; ++i) {
          const float c = group[i];
          if (!std::isfinite(c) || c < 0.0f) {
            return Invalid(where, absl::StrCat(group_name(g), ": ", what, " ", i, " = ", c,
                                               " is not a finite value >= 0"));
          }
          // A higher target sparsity can never need a lower cut.
          if (i > 0 && c < group[i - 1]) {
            return Invalid(where, absl::StrCat(group_name(g), ": ", what,
                                               "s are not ascending with the targets: ",
                                               absl::StrJoin(group, group + n_targets, ", ")));
          }
        }
      }
      return absl::OkStatus();
    };
    TC_RETURN_IF_ERROR(check_cuts(layer.cuts, "cut"));
    if (layer.coeff_cuts.empty() != !has_coeff) {
      return Invalid(where, absl::StrCat(lw, ": coefficient cuts present in some layers only"));
    }
    if (has_coeff) TC_RETURN_IF_ERROR(check_cuts(layer.coeff_cuts, "coefficient cut"));
    if (layer.histogram.empty() != !has_hist ||
        (has_hist && layer.histogram.size() != s.layers[0].histogram.size())) {
      return Invalid(where, absl::StrCat(lw, ": histogram has ", layer.histogram.size(),
                                         " bins, layer 0 has ", s.layers[0].histogram.size()));
    }
    for (float h : layer.histogram) {
      if (!(h >= 0.0f && h <= 1.0f)) {
        return Invalid(where, absl::StrCat(lw, ": histogram share ", h, " is not in [0, 1]"));
      }
    }
  }
  return absl::OkStatus();
}


absl::StatusOr<float> ReadFloat(const GgufFile& f, const std::string& where,
                                const std::string& key) {
  absl::StatusOr<double> v = f.GetDouble(key);
  if (!v.ok()) return Invalid(where, std::string(v.status().message()));
  return static_cast<float>(*v);
}

}  // namespace

namespace {

// Index of `target` in the stats' targets, or NotFound listing them.
absl::StatusOr<size_t> TargetIndex(const ActivationStats& s, float target) {
  for (size_t i = 0; i < s.targets.size(); ++i) {
    if (std::fabs(s.targets[i] - target) <= kTargetTolerance) return i;
  }
  return absl::NotFoundError(absl::StrCat("activation stats: no cut for target sparsity ", target,
                                          "; the profile has targets: ", TargetList(s.targets)));
}

// Position of (layer, expert, target) in the layer's cut vectors.
absl::StatusOr<size_t> CutIndex(const ActivationStats& s, int64_t layer, float target,
                                int64_t expert) {
  if (layer < 0 || layer >= static_cast<int64_t>(s.layers.size())) {
    return absl::InvalidArgumentError(absl::StrCat("activation stats: layer ", layer,
                                                   " is out of range [0, ", s.layers.size(), ")"));
  }
  const int64_t experts = s.layers[layer].experts;
  if (experts > 0 ? (expert < 0 || expert >= experts) : expert >= 0) {
    return absl::InvalidArgumentError(
        experts > 0 ? absl::StrCat("activation stats: layer ", layer, " has cuts for ", experts,
                                   " experts, not for expert ", expert)
                    : absl::StrCat("activation stats: layer ", layer,
                                   " has no experts (asked for expert ", expert, ")"));
  }
  TC_ASSIGN_OR_RETURN(size_t i, TargetIndex(s, target));
  return static_cast<size_t>(std::max<int64_t>(expert, 0)) * s.targets.size() + i;
}

}  // namespace

absl::StatusOr<float> ActivationStats::CutFor(int64_t layer, float target, int64_t expert) const {
  TC_ASSIGN_OR_RETURN(size_t i, CutIndex(*this, layer, target, expert));
  if (i >= layers[layer].cuts.size()) {
    return absl::InternalError("activation stats: cuts do not match the targets");
  }
  return layers[layer].cuts[i];
}

absl::StatusOr<float> ActivationStats::CoeffCutFor(int64_t layer, float target,
                                                   int64_t expert) const {
  TC_ASSIGN_OR_RETURN(size_t i, CutIndex(*this, layer, target, expert));
  if (layers[layer].coeff_cuts.empty()) {
    return absl::FailedPreconditionError(
        "activation stats: no coefficient cuts (|act(gate) * up|); the file comes from an older "
        "`thermocline profile`: profile the model again");
  }
  if (i >= layers[layer].coeff_cuts.size()) {
    return absl::InternalError("activation stats: coefficient cuts do not match the targets");
  }
  return layers[layer].coeff_cuts[i];
}

absl::Status WriteActivationStats(const ActivationStats& stats, const std::string& path) {
  TC_RETURN_IF_ERROR(Validate(stats, absl::StrCat("activation stats for ", path)));
  GgufWriter w;
  w.SetValue("general.architecture", GgufString(kArch));
  w.SetValue("thermocline.stats.tokens", GgufU64(static_cast<uint64_t>(stats.tokens)));
  w.SetValue("thermocline.stats.criterion", GgufString(stats.criterion));
  w.SetValue("thermocline.stats.targets", GgufF32Array(stats.targets));
  w.SetValue("thermocline.stats.frequency_target", GgufF32(stats.frequency_target));
  w.SetValue("thermocline.stats.model_dim", GgufU32(static_cast<uint32_t>(stats.dim)));
  w.SetValue("thermocline.stats.model_ffn_dim", GgufU32(static_cast<uint32_t>(stats.ffn_dim)));
  w.SetValue("thermocline.stats.block_count", GgufU32(static_cast<uint32_t>(stats.layers.size())));
  if (stats.n_experts > 0) {
    w.SetValue("thermocline.stats.expert_count", GgufU32(static_cast<uint32_t>(stats.n_experts)));
  }
  const bool has_hist = !stats.layers[0].histogram.empty();
  if (has_hist) {
    w.SetValue("thermocline.stats.hist_log2_min", GgufF32(stats.hist_log2_min));
    w.SetValue("thermocline.stats.hist_bins_per_octave",
               GgufU32(static_cast<uint32_t>(stats.hist_bins_per_octave)));
  }
  for (size_t l = 0; l < stats.layers.size(); ++l) {
    const LayerActivationStats& layer = stats.layers[l];
    const std::string p = absl::StrCat("blk.", l, ".");
    TC_RETURN_IF_ERROR(w.AddTensorBytes(p + "act_freq", GgmlType::kF32,
                                        {static_cast<int64_t>(layer.frequency.size())},
                                        F32Bytes(layer.frequency)));
    if (!stats.targets.empty()) {
      TC_RETURN_IF_ERROR(w.AddTensorBytes(p + "act_cuts", GgmlType::kF32,
                                          {static_cast<int64_t>(layer.cuts.size())},
                                          F32Bytes(layer.cuts)));
      if (!layer.coeff_cuts.empty()) {
        TC_RETURN_IF_ERROR(w.AddTensorBytes(p + "coef_cuts", GgmlType::kF32,
                                            {static_cast<int64_t>(layer.coeff_cuts.size())},
                                            F32Bytes(layer.coeff_cuts)));
      }
    }
    if (!layer.expert_share.empty()) {
      TC_RETURN_IF_ERROR(w.AddTensorBytes(p + "expert_share", GgmlType::kF32,
                                          {static_cast<int64_t>(layer.expert_share.size())},
                                          F32Bytes(layer.expert_share)));
    }
    if (has_hist) {
      TC_RETURN_IF_ERROR(w.AddTensorBytes(p + "act_hist", GgmlType::kF32,
                                          {static_cast<int64_t>(layer.histogram.size())},
                                          F32Bytes(layer.histogram)));
    }
  }
  return w.WriteFile(path);
}

absl::StatusOr<ActivationStats> ReadActivationStats(const std::string& path,
                                                    const ModelConfig* config) {
  const std::string where = absl::StrCat("activation stats ", path);
  absl::StatusOr<std::unique_ptr<GgufFile>> file_or =
      OpenGgufOfArchitecture(path, kArch, "activation stats",
                             "is this a stats file from `thermocline profile`?");
  if (!file_or.ok()) return file_or.status();
  const GgufFile& f = **file_or;
  ActivationStats s;
  absl::StatusOr<std::string> criterion = f.GetString("thermocline.stats.criterion");
  if (!criterion.ok()) return Invalid(where, std::string(criterion.status().message()));
  s.criterion = *criterion;
  TC_ASSIGN_OR_RETURN(s.tokens, ReadCountField(f, where, "thermocline.stats.tokens"));
  TC_ASSIGN_OR_RETURN(s.dim, ReadCountField(f, where, "thermocline.stats.model_dim"));
  TC_ASSIGN_OR_RETURN(s.ffn_dim, ReadCountField(f, where, "thermocline.stats.model_ffn_dim"));
  TC_ASSIGN_OR_RETURN(int64_t n_layers, ReadCountField(f, where, "thermocline.stats.block_count"));
  TC_ASSIGN_OR_RETURN(s.frequency_target,
                      ReadFloat(f, where, "thermocline.stats.frequency_target"));
  absl::StatusOr<const GgufArray*> targets = f.GetArray("thermocline.stats.targets");
  if (!targets.ok()) return Invalid(where, std::string(targets.status().message()));
  for (const GgufValue& v : (*targets)->items) {
    std::optional<double> t = v.AsDouble();
    if (!t || v.type() == GgufValueType::kBool) {
      return Invalid(where, "thermocline.stats.targets holds a value that is not a number");
    }
    s.targets.push_back(static_cast<float>(*t));
  }
  if (f.FindValue("thermocline.stats.expert_count") != nullptr) {
    TC_ASSIGN_OR_RETURN(s.n_experts, ReadCountField(f, where, "thermocline.stats.expert_count"));
  }
  if (config != nullptr) {
    if (s.dim != config->dim || s.ffn_dim != config->ffn_dim || n_layers != config->n_layers) {
      return Invalid(where,
                     absl::StrCat("profiled a model of dim ", s.dim, ", ffn ", s.ffn_dim, ", ",
                                  n_layers, " layers; this model has dim ", config->dim, ", ffn ",
                                  config->ffn_dim, ", ", config->n_layers, " layers"));
    }
    if (s.n_experts != config->n_experts) {
      return Invalid(where, absl::StrCat("profiled a model of ", s.n_experts,
                                         " experts per MoE layer; this model has ",
                                         config->n_experts,
                                         s.n_experts == 0 ? " (profile it again: the statistics "
                                                            "of its experts are missing)"
                                                          : ""));
    }
  }
  const bool has_hist = f.FindTensor("blk.0.act_hist") != nullptr;
  if (has_hist) {
    TC_ASSIGN_OR_RETURN(s.hist_log2_min, ReadFloat(f, where, "thermocline.stats.hist_log2_min"));
    TC_ASSIGN_OR_RETURN(int64_t bpo,
                        ReadCountField(f, where, "thermocline.stats.hist_bins_per_octave"));
    if (bpo > 1 << 20)
      return Invalid(where, absl::StrCat("hist_bins_per_octave ", bpo, " is too large"));
    s.hist_bins_per_octave = static_cast<int32_t>(bpo);
  }
  // Profiles from before the coefficient criterion have no coef_cuts; they still serve the
  // single-stage threshold and every other use.
  const bool has_coeff = f.FindTensor("blk.0.coef_cuts") != nullptr;
  s.layers.resize(n_layers);
  for (int64_t l = 0; l < n_layers; ++l) {
    LayerActivationStats& layer = s.layers[l];
    const std::string p = absl::StrCat("blk.", l, ".");
    // A layer's neurons say whether it is an MoE layer: ffn_dim, or expert_count * ffn_dim.
    const GgufTensorInfo* freq = f.FindTensor(p + "act_freq");
    const bool moe_layer = s.n_experts > 0 && freq != nullptr && freq->ne.size() == 1 &&
                           freq->ne[0] == s.n_experts * s.ffn_dim;
    if (config != nullptr && moe_layer != (LayerNeurons(*config, l) != config->ffn_dim)) {
      return Invalid(where, absl::StrCat("layer ", l, moe_layer ? " has" : " has no",
                                         " per-expert statistics, but the model's layer ", l,
                                         moe_layer ? " has no experts" : " is a mixture-of-experts layer"));
    }
    layer.experts = moe_layer ? s.n_experts : 0;
    const int64_t groups = moe_layer ? s.n_experts : 1;
    TC_ASSIGN_OR_RETURN(layer.frequency,
                        ReadF32Field(f, where, p + "act_freq", groups * s.ffn_dim));
    if (moe_layer) {
      TC_ASSIGN_OR_RETURN(layer.expert_share,
                          ReadF32Field(f, where, p + "expert_share", s.n_experts));
    }
    const int64_t n_cuts = groups * static_cast<int64_t>(s.targets.size());
    if (!s.targets.empty()) {
      TC_ASSIGN_OR_RETURN(layer.cuts, ReadF32Field(f, where, p + "act_cuts", n_cuts));
      if (has_coeff) {
        TC_ASSIGN_OR_RETURN(layer.coeff_cuts, ReadF32Field(f, where, p + "coef_cuts", n_cuts));
      }
    }
    if (has_hist) {
      TC_ASSIGN_OR_RETURN(layer.histogram, ReadF32Field(f, where, p + "act_hist", -1));
    }
  }
  TC_RETURN_IF_ERROR(Validate(s, where));
  return s;
}

}  // namespace thermocline
