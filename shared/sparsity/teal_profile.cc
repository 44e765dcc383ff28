#include "shared/sparsity/teal_profile.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "shared/gguf/gguf.h"
#include "shared/sparsity/profile_fields.h"
#include "shared/util/status_macros.h"

namespace thermocline {
namespace {

constexpr char kArch[] = "thermocline.teal";

absl::Status Invalid(const std::string& where, const std::string& what) {
  return ProfileFieldError(where, what);
}

// A 1-D F32 tensor of `n` magnitudes (finite, >= 0).
absl::StatusOr<std::vector<float>> ReadF32(const GgufFile& f, const std::string& where,
                                           const std::string& name, int64_t n) {
  absl::StatusOr<std::vector<float>> out = ReadF32Field(f, where, name, n);
  if (!out.ok()) return out.status();
  for (float v : *out) {
    if (!std::isfinite(v) || v < 0) {
      return Invalid(where, absl::StrCat("tensor '", name, "' holds ", v, " (must be >= 0)"));
    }
  }
  return out;
}

}  // namespace

TealInput InputOf(Projection p) {
  switch (p) {
    case Projection::kQ:
    case Projection::kK:
    case Projection::kV:
      return TealInput::kAttnIn;
    case Projection::kO:
      return TealInput::kAttnOut;
    case Projection::kGate:
    case Projection::kUp:
      return TealInput::kFfnIn;
    case Projection::kDown:
      return TealInput::kDownIn;
  }
  return TealInput::kAttnIn;
}

float TealProfile::CutFor(int64_t layer, TealInput input, float share) const {
  if (share <= 0) return 0.0f;
  const auto& q = layers[layer].quantiles[static_cast<int>(input)];
  const double x = std::min<double>(share, 1.0) * (kTealQuantiles - 1);
  const int i = std::min(static_cast<int>(x), kTealQuantiles - 2);
  const double f = x - i;
  return static_cast<float>(q[i] + (q[i + 1] - q[i]) * f);
}

absl::StatusOr<TealPlan> TealProfile::PlanFor(float target) const {
  for (size_t t = 0; t < targets.size(); ++t) {
    if (std::fabs(targets[t] - target) > 1e-4f) continue;
    TealPlan plan;
    plan.kind = TealPlan::Kind::kCuts;
    for (const TealLayerProfile& l : layers) plan.values.push_back(l.cuts[t]);
    return plan;
  }
  return absl::NotFoundError(absl::StrCat("the TEAL profile has no allocation for target ", target,
                                          "; it has: ", absl::StrJoin(targets, ", ")));
}

absl::Status WriteTealProfile(const TealProfile& p, const std::string& path) {
  GgufWriter w;
  w.SetValue("general.architecture", GgufString(kArch));
  w.SetValue("thermocline.teal.tokens", GgufU64(static_cast<uint64_t>(p.tokens)));
  w.SetValue("thermocline.teal.greedy_tokens", GgufU64(static_cast<uint64_t>(p.greedy_tokens)));
  w.SetValue("thermocline.teal.step", GgufF32(p.step));
  w.SetValue("thermocline.teal.targets", GgufF32Array(p.targets));
  w.SetValue("thermocline.teal.model_dim", GgufU32(static_cast<uint32_t>(p.dim)));
  w.SetValue("thermocline.teal.block_count", GgufU32(static_cast<uint32_t>(p.layers.size())));
  for (size_t l = 0; l < p.layers.size(); ++l) {
    const TealLayerProfile& layer = p.layers[l];
    const std::string pre = absl::StrCat("blk.", l, ".");
    std::vector<float> q, s, c;
    for (const auto& input : layer.quantiles) q.insert(q.end(), input.begin(), input.end());
    for (size_t t = 0; t < p.targets.size(); ++t) {
      s.insert(s.end(), layer.sparsity[t].begin(), layer.sparsity[t].end());
      c.insert(c.end(), layer.cuts[t].begin(), layer.cuts[t].end());
    }
    TC_RETURN_IF_ERROR(w.AddTensorBytes(pre + "teal_quantiles", GgmlType::kF32,
                                        {static_cast<int64_t>(q.size())}, F32Bytes(q)));
    if (!p.targets.empty()) {
      TC_RETURN_IF_ERROR(w.AddTensorBytes(pre + "teal_sparsity", GgmlType::kF32,
                                          {static_cast<int64_t>(s.size())}, F32Bytes(s)));
      TC_RETURN_IF_ERROR(w.AddTensorBytes(pre + "teal_cuts", GgmlType::kF32,
                                          {static_cast<int64_t>(c.size())}, F32Bytes(c)));
    }
  }
  return w.WriteFile(path);
}

absl::StatusOr<TealProfile> ReadTealProfile(const std::string& path, const ModelConfig* config) {
  const std::string where = absl::StrCat("TEAL profile ", path);
  TC_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file,
                      OpenGgufOfArchitecture(path, kArch, "TEAL profile",
                                             "is this a file from `thermocline teal-calibrate`?"));
  const GgufFile& f = *file;
  TealProfile p;
  TC_ASSIGN_OR_RETURN(p.tokens, ReadCountField(f, where, "thermocline.teal.tokens"));
  TC_ASSIGN_OR_RETURN(p.greedy_tokens, ReadCountField(f, where, "thermocline.teal.greedy_tokens"));
  TC_ASSIGN_OR_RETURN(p.dim, ReadCountField(f, where, "thermocline.teal.model_dim"));
  TC_ASSIGN_OR_RETURN(int64_t n_layers, ReadCountField(f, where, "thermocline.teal.block_count"));
  absl::StatusOr<double> step = f.GetDouble("thermocline.teal.step");
  if (!step.ok()) return Invalid(where, std::string(step.status().message()));
  p.step = static_cast<float>(*step);
  absl::StatusOr<const GgufArray*> targets = f.GetArray("thermocline.teal.targets");
  if (!targets.ok()) return Invalid(where, std::string(targets.status().message()));
  for (const GgufValue& v : (*targets)->items) {
    std::optional<double> t = v.AsDouble();
    if (!t || v.type() == GgufValueType::kBool || !(*t > 0 && *t < 1) ||
        (!p.targets.empty() && *t <= p.targets.back())) {
      return Invalid(where, "thermocline.teal.targets must be ascending numbers in (0, 1)");
    }
    p.targets.push_back(static_cast<float>(*t));
  }
  if (config != nullptr && (p.dim != config->dim || n_layers != config->n_layers)) {
    return Invalid(where, absl::StrCat("calibrated a model of dim ", p.dim, ", ", n_layers,
                                       " layers; this model has dim ", config->dim, ", ",
                                       config->n_layers, " layers"));
  }
  if (n_layers > 4096) return Invalid(where, absl::StrCat(n_layers, " layers is too many"));
  const int64_t nt = static_cast<int64_t>(p.targets.size());
  p.layers.resize(n_layers);
  for (int64_t l = 0; l < n_layers; ++l) {
    const std::string pre = absl::StrCat("blk.", l, ".");
    TealLayerProfile& layer = p.layers[l];
    TC_ASSIGN_OR_RETURN(std::vector<float> q,
                        ReadF32(f, where, pre + "teal_quantiles", kNumTealInputs * kTealQuantiles));
    for (int i = 0; i < kNumTealInputs; ++i) {
      for (int k = 0; k < kTealQuantiles; ++k) {
        layer.quantiles[i][k] = q[i * kTealQuantiles + k];
        if (k > 0 && layer.quantiles[i][k] < layer.quantiles[i][k - 1]) {
          return Invalid(where, absl::StrCat(pre, "teal_quantiles is not ascending"));
        }
      }
    }
    if (nt == 0) continue;
    TC_ASSIGN_OR_RETURN(std::vector<float> s,
                        ReadF32(f, where, pre + "teal_sparsity", nt * kNumProjections));
    TC_ASSIGN_OR_RETURN(std::vector<float> c,
                        ReadF32(f, where, pre + "teal_cuts", nt * kNumProjections));
    layer.sparsity.resize(nt);
    layer.cuts.resize(nt);
    for (int64_t t = 0; t < nt; ++t) {
      for (int k = 0; k < kNumProjections; ++k) {
        layer.sparsity[t][k] = s[t * kNumProjections + k];
        layer.cuts[t][k] = c[t * kNumProjections + k];
        if (layer.sparsity[t][k] >= 1) {
          return Invalid(where, absl::StrCat(pre, "teal_sparsity holds ", layer.sparsity[t][k],
                                             " (must be < 1)"));
        }
      }
    }
  }
  return p;
}

absl::StatusOr<std::optional<TealPlan>> TealPlanFromFlags(const Model& model,
                                                          const std::string& ffn_mode,
                                                          const TealFlags& flags) {
  const bool all = ffn_mode == "teal";
  const bool wanted = all || flags.sparsity || !flags.profile_path.empty();
  if (!wanted) return std::optional<TealPlan>();
  if (!flags.sparsity) {
    return absl::InvalidArgumentError(
        "TEAL needs --teal-sparsity T: the model-level target (with --teal-profile, one of its "
        "calibrated targets) or, without a profile, the share of each projection's inputs "
        "dropped per token");
  }
  if (!(*flags.sparsity >= 0 && *flags.sparsity < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--teal-sparsity ", *flags.sparsity, " must be in [0, 1)"));
  }
  if (!all && ffn_mode != "exact" && ffn_mode != "threshold" && ffn_mode != "predicted") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--teal-sparsity/--teal-profile go with --sparsity teal (every projection) or with an "
        "FFN mode (exact, threshold, predicted: TEAL then covers attention), not '",
        ffn_mode, "'"));
  }
  const ModelConfig& c = model.config();
  TealPlan plan;
  if (flags.profile_path.empty() || *flags.sparsity == 0) {
    // Target 0 is dense by definition; no profile stores it.
    plan = TealPlan::TopShare(c.n_layers, *flags.sparsity);
  } else {
    absl::StatusOr<TealProfile> profile = ReadTealProfile(flags.profile_path, &c);
    if (!profile.ok()) {
      return absl::Status(profile.status().code(),
                          absl::StrCat("--teal-profile: ", profile.status().message()));
    }
    absl::StatusOr<TealPlan> p = profile->PlanFor(*flags.sparsity);
    if (!p.ok()) {
      return absl::Status(p.status().code(),
                          absl::StrCat("--teal-sparsity: ", p.status().message()));
    }
    plan = std::move(*p);
  }
  plan.ffn = all;
  if (!all) {
    for (ProjectionValues& v : plan.values) {
      v[static_cast<int>(Projection::kGate)] = 0;
      v[static_cast<int>(Projection::kUp)] = 0;
      v[static_cast<int>(Projection::kDown)] = 0;
    }
  }
  TC_RETURN_IF_ERROR(plan.Validate(c));
  return std::optional<TealPlan>(std::move(plan));
}

absl::Status CheckSplitTealPlan(const std::optional<TealPlan>& plan) {
  if (plan && plan->ffn && plan->kind != TealPlan::Kind::kCuts) {
    return absl::InvalidArgumentError(
        "--sparsity teal over the split workers needs --teal-profile (calibrated cuts): "
        "without one, the cut of down's inputs is a share of every neuron's activation, which "
        "no worker holds alone");
  }
  return absl::OkStatus();
}

}  // namespace thermocline
