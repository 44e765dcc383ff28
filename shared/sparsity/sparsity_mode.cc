#include "shared/sparsity/sparsity_mode.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "shared/util/status_macros.h"

namespace thermocline {

std::string_view SparsityModeName(SparsityMode mode) {
  switch (mode) {
    case SparsityMode::kDense:
      return "dense";
    case SparsityMode::kExact:
      return "exact";
    case SparsityMode::kThreshold:
      return "threshold";
    case SparsityMode::kPredicted:
      return "predicted";
  }
  return "?";
}

std::optional<SparsityMode> ParseSparsityMode(std::string_view name) {
  for (SparsityMode m : {SparsityMode::kDense, SparsityMode::kExact, SparsityMode::kThreshold,
                         SparsityMode::kPredicted}) {
    if (name == SparsityModeName(m)) return m;
  }
  return std::nullopt;
}

absl::StatusOr<SparsityMode> ParseSparsityModeOrError(std::string_view name) {
  if (std::optional<SparsityMode> m = ParseSparsityMode(name)) return *m;
  return absl::InvalidArgumentError(absl::StrCat(
      "sparsity mode '", std::string(name), "' is not one of: dense, exact, threshold, predicted"));
}

SparsityPlan SparsityPlan::Uniform(SparsityMode mode, int64_t n_layers) {
  SparsityPlan plan;
  plan.modes.assign(n_layers, mode);
  plan.cuts.assign(n_layers, 0.0f);
  plan.coeff_cuts.assign(n_layers, 0.0f);
  return plan;
}

NeuronFilter SparsityPlan::FilterFor(int64_t layer, FfnActivation activation,
                                     int64_t expert) const {
  switch (mode(layer)) {
    case SparsityMode::kExact:
      return NeuronFilter::Positive();
    case SparsityMode::kThreshold: {
      const bool per_expert = expert >= 0 && layer < static_cast<int64_t>(expert_cuts.size()) &&
                              expert < static_cast<int64_t>(expert_cuts[layer].size());
      const float cut = per_expert ? expert_cuts[layer][expert] : cuts[layer];
      const float coeff_cut = per_expert ? expert_coeff_cuts[layer][expert] : coeff_cuts[layer];
      // On a ReLU model a zero activation is never worth its up row, whatever the gate cut.
      return NeuronFilter::Magnitude(
          IsReluFamily(activation) ? std::max(cut, std::numeric_limits<float>::denorm_min())
                                   : cut,
          coeff_cut);
    }
    case SparsityMode::kPredicted:
      // A predicted neuron whose ReLU activation is 0 contributes nothing: skipping its up and
      // down rows loses nothing and saves the reads of the predictor's false positives.
      return IsReluFamily(activation) ? NeuronFilter::Positive()
                                                : NeuronFilter::Magnitude(cuts[layer]);
    case SparsityMode::kDense:
      break;
  }
  return NeuronFilter::None();
}

NeuronFilter SparsityPlan::SharedExpertFilter(int64_t layer, FfnActivation activation) const {
  return mode(layer) == SparsityMode::kThreshold ? NeuronFilter::None()
                                                 : FilterFor(layer, activation);
}

bool SparsityPlan::AllDense() const {
  return std::all_of(modes.begin(), modes.end(),
                     [](SparsityMode m) { return m == SparsityMode::kDense; });
}

absl::StatusOr<SparsityPlan> SparsityPlan::ForModel(
    const ModelConfig& config, SparsityMode mode, const ActivationStats* stats,
    std::optional<float> target_sparsity, std::shared_ptr<const PredictorSet> predictors,
    std::optional<float> gate_sparsity) {
  SparsityPlan plan = Uniform(mode, config.n_layers);
  const bool wants_cuts =
      mode == SparsityMode::kThreshold ||
      (mode == SparsityMode::kPredicted && !IsReluFamily(config.activation));
  if (mode == SparsityMode::kThreshold && (stats == nullptr || !target_sparsity)) {
    return absl::InvalidArgumentError(
        "sparsity mode 'threshold' needs activation statistics and a target sparsity (the "
        "per-layer cuts come from `thermocline profile`: --stats S.gguf --target-sparsity 0.5)");
  }
  if (wants_cuts && stats != nullptr && target_sparsity) {
    if (stats->dim != config.dim || stats->ffn_dim != config.ffn_dim ||
        static_cast<int64_t>(stats->layers.size()) != config.n_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("activation statistics are for dim ", stats->dim, ", ffn_dim ",
                       stats->ffn_dim, ", ", stats->layers.size(), " layers; the model has dim ",
                       config.dim, ", ffn_dim ", config.ffn_dim, ", ", config.n_layers, " layers"));
    }
    for (int64_t l = 0; l < config.n_layers; ++l) {
      const bool moe = l < static_cast<int64_t>(config.layers.size()) && config.layers[l].moe;
      // Predicted MoE layers are refused by Validate, with the reason.
      if (mode != SparsityMode::kThreshold && moe) continue;
      if (mode != SparsityMode::kThreshold) {
        TC_ASSIGN_OR_RETURN(plan.cuts[l], stats->CutFor(l, *target_sparsity));
        continue;
      }
      if (moe) {
        // Each expert's cuts, calibrated over the tokens routed to it.
        plan.expert_cuts.resize(config.n_layers);
        plan.expert_coeff_cuts.resize(config.n_layers);
        plan.expert_cuts[l].assign(config.n_experts, 0.0f);
        plan.expert_coeff_cuts[l].assign(config.n_experts, 0.0f);
        for (int64_t e = 0; e < config.n_experts; ++e) {
          TC_ASSIGN_OR_RETURN(plan.expert_coeff_cuts[l][e],
                              stats->CoeffCutFor(l, *target_sparsity, e));
          if (gate_sparsity && *gate_sparsity > 0) {
            TC_ASSIGN_OR_RETURN(plan.expert_cuts[l][e], stats->CutFor(l, *gate_sparsity, e));
          }
        }
        continue;
      }
      TC_ASSIGN_OR_RETURN(plan.coeff_cuts[l], stats->CoeffCutFor(l, *target_sparsity));
      if (gate_sparsity && *gate_sparsity > 0) {
        // The gate sparsity often comes from the default, so say which flag asked for it.
        absl::StatusOr<float> cut = stats->CutFor(l, *gate_sparsity);
        if (!cut.ok()) {
          return absl::Status(cut.status().code(),
                              absl::StrCat("--gate-sparsity ", *gate_sparsity, " (default ",
                                           kDefaultGateSparsity, "; 0 turns the gate cut off): ",
                                           cut.status().message()));
        }
        plan.cuts[l] = *cut;
      }
    }
  }
  if (mode == SparsityMode::kPredicted && predictors == nullptr) {
    return absl::InvalidArgumentError(
        "sparsity mode 'predicted' needs predictors (--predictor P.gguf, from `thermocline "
        "train-predictor` or a PowerInfer model)");
  }
  plan.predictors = std::move(predictors);
  TC_RETURN_IF_ERROR(plan.Validate(config));
  return plan;
}

absl::Status SparsityPlan::Validate(const ModelConfig& config) const {
  const int64_t n = config.n_layers;
  if (static_cast<int64_t>(modes.size()) != n || static_cast<int64_t>(cuts.size()) != n ||
      static_cast<int64_t>(coeff_cuts.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sparsity plan has ", modes.size(), " modes, ", cuts.size(), " cuts and ",
        coeff_cuts.size(), " coefficient cuts; the model has ", n, " layers"));
  }
  for (int64_t l = 0; l < n; ++l) {
    for (float c : {cuts[l], coeff_cuts[l]}) {
      if (!std::isfinite(c) || c < 0) {
        return absl::InvalidArgumentError(absl::StrCat("sparsity plan: layer ", l, ": cut ", c,
                                                       " is not a finite value >= 0"));
      }
    }
    const bool moe_layer = l < static_cast<int64_t>(config.layers.size()) && config.layers[l].moe;
    // Predictors pick neurons of one FFN; an MoE layer would need one per expert, which neither
    // PowerInfer's format nor train-predictor has.
    if (moe_layer && modes[l] == SparsityMode::kPredicted) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sparsity plan: layer ", l,
          " is a mixture-of-experts layer: mode 'predicted' needs one predictor per expert, "
          "which neither PowerInfer's predictor format nor `thermocline train-predictor` "
          "provides; use --sparsity threshold (per-expert cuts from `thermocline profile`), "
          "exact (ReLU models) or dense"));
    }
    const bool has_expert_cuts = l < static_cast<int64_t>(expert_cuts.size()) &&
                                 !expert_cuts[l].empty();
    if (has_expert_cuts != (moe_layer && modes[l] == SparsityMode::kThreshold)) {
      return absl::InvalidArgumentError(
          moe_layer && modes[l] == SparsityMode::kThreshold
              ? absl::StrCat("sparsity plan: layer ", l,
                             " is a mixture-of-experts layer: mode 'threshold' needs each "
                             "expert's cuts (activation statistics of this model from "
                             "`thermocline profile`)")
              : absl::StrCat("sparsity plan: layer ", l,
                             ": per-expert cuts belong to threshold layers with experts only"));
    }
    if (has_expert_cuts) {
      if (static_cast<int64_t>(expert_cuts[l].size()) != config.n_experts ||
          l >= static_cast<int64_t>(expert_coeff_cuts.size()) ||
          expert_coeff_cuts[l].size() != expert_cuts[l].size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "sparsity plan: layer ", l, " has cuts for ", expert_cuts[l].size(), " experts and ",
            l < static_cast<int64_t>(expert_coeff_cuts.size()) ? expert_coeff_cuts[l].size() : 0,
            " coefficient cuts; the model has ", config.n_experts, " experts"));
      }
      for (int64_t e = 0; e < config.n_experts; ++e) {
        for (float c : {expert_cuts[l][e], expert_coeff_cuts[l][e]}) {
          if (!std::isfinite(c) || c < 0) {
            return absl::InvalidArgumentError(absl::StrCat("sparsity plan: layer ", l, " expert ",
                                                           e, ": cut ", c,
                                                           " is not a finite value >= 0"));
          }
        }
      }
      if (cuts[l] != 0 || coeff_cuts[l] != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "sparsity plan: layer ", l,
            " is a mixture-of-experts layer: its cuts are per expert, not per layer"));
      }
    }
    if (modes[l] != SparsityMode::kThreshold && coeff_cuts[l] != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sparsity plan: layer ", l, ": a coefficient cut belongs to mode 'threshold' only"));
    }
    switch (modes[l]) {
      case SparsityMode::kDense:
      case SparsityMode::kThreshold:
        break;
      case SparsityMode::kExact:
        if (!IsReluFamily(config.activation)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "sparsity plan: layer ", l,
              ": mode 'exact' needs a ReLU-gated model (this one uses SiLU, whose activation is "
              "nonzero almost everywhere); use 'threshold' with a calibrated cut"));
        }
        break;
      case SparsityMode::kPredicted: {
        if (predictors == nullptr) {
          return absl::InvalidArgumentError(
              absl::StrCat("sparsity plan: layer ", l, ": mode 'predicted' without predictors"));
        }
        if (l >= predictors->n_layers()) {
          return absl::InvalidArgumentError(absl::StrCat("sparsity plan: layer ", l,
                                                         ": the predictor set has only ",
                                                         predictors->n_layers(), " layers"));
        }
        const LayerPredictor& p = predictors->layer(l);
        if (p.fc1.cols != config.dim || p.fc2.rows != config.ffn_dim || p.fc1.rows != p.rank ||
            p.fc2.cols != p.rank) {
          return absl::InvalidArgumentError(absl::StrCat(
              "sparsity plan: layer ", l, ": predictor fc1 is ", p.fc1.rows, "x", p.fc1.cols,
              " and fc2 ", p.fc2.rows, "x", p.fc2.cols, "; the model needs ", p.rank, "x",
              config.dim, " and ", config.ffn_dim, "x", p.rank));
        }
        break;
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SparsityPlan> SparsityPlanFromFlags(const Model& model,
                                                   const SparsityFlags& flags) {
  TC_ASSIGN_OR_RETURN(SparsityMode mode, ParseSparsityModeOrError(flags.mode));
  const ModelConfig& c = model.config();
  if (mode == SparsityMode::kPredicted && c.moe()) {
    // Refused whatever the other flags say: name the MoE layer and why, before asking for
    // predictors that cannot exist.
    TC_RETURN_IF_ERROR(SparsityPlan::Uniform(mode, c.n_layers).Validate(c));
  }
  const bool uses_cuts = mode == SparsityMode::kThreshold ||
                         (mode == SparsityMode::kPredicted && !IsReluFamily(c.activation));
  if (flags.stats_path.empty() != !flags.target_sparsity.has_value()) {
    return absl::InvalidArgumentError(
        "--stats and --target-sparsity go together: the statistics hold one cut per layer for "
        "each target sparsity they were profiled at");
  }
  if (!flags.stats_path.empty() && !uses_cuts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--stats/--target-sparsity set cuts, which sparsity mode '", flags.mode,
        "' does not use on this model (they apply to threshold, and to predicted on SiLU models)"));
  }
  if (!flags.predictor_path.empty() && mode != SparsityMode::kPredicted) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--predictor is only used by sparsity mode 'predicted', not '", flags.mode, "'"));
  }
  if (mode == SparsityMode::kThreshold && flags.stats_path.empty()) {
    return absl::InvalidArgumentError(
        "sparsity mode 'threshold' needs the per-layer cuts: --stats S.gguf (from `thermocline "
        "profile`) and --target-sparsity T (one of the targets profiled)");
  }
  if (flags.target_sparsity && !(*flags.target_sparsity >= 0 && *flags.target_sparsity < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--target-sparsity ", *flags.target_sparsity, " must be in [0, 1)"));
  }
  if (flags.gate_sparsity && mode != SparsityMode::kThreshold) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gate-sparsity is only used by sparsity mode 'threshold', not '", flags.mode, "'"));
  }
  std::optional<float> gate_sparsity;
  if (mode == SparsityMode::kThreshold) {
    gate_sparsity = flags.gate_sparsity.value_or(
        std::min(kDefaultGateSparsity, flags.target_sparsity.value_or(0.0f)));
    if (!(*gate_sparsity >= 0 && *gate_sparsity <= flags.target_sparsity.value_or(0.0f))) {
      return absl::InvalidArgumentError(
          absl::StrCat("--gate-sparsity ", *gate_sparsity, " must be in [0, --target-sparsity ",
                       flags.target_sparsity.value_or(0.0f), "]"));
    }
  }
  std::optional<ActivationStats> stats;
  if (!flags.stats_path.empty()) {
    auto read = ReadActivationStats(flags.stats_path, &c);
    if (!read.ok()) {
      return absl::Status(read.status().code(), absl::StrCat("--stats: ", read.status().message()));
    }
    stats = std::move(*read);
  }
  std::shared_ptr<const PredictorSet> predictors;
  if (mode == SparsityMode::kPredicted) {
    absl::StatusOr<PredictorSet> set = absl::NotFoundError("");
    if (!flags.predictor_path.empty()) {
      set = PredictorSet::Load(flags.predictor_path, c);
    } else if (model.file().FindTensor("blk.0.fc1.weight") != nullptr) {
      // The model outlives the plan's users, so the set may borrow its file.
      set = PredictorSet::FromGguf(
          std::shared_ptr<const GgufFile>(&model.file(), [](const GgufFile*) {}), c);
    } else {
      return absl::InvalidArgumentError(
          "sparsity mode 'predicted' needs predictors: --predictor P.gguf (from `thermocline "
          "train-predictor`), or a PowerInfer model that carries blk.N.fc1/fc2");
    }
    if (!set.ok()) {
      return absl::Status(
          set.status().code(),
          absl::StrCat(flags.predictor_path.empty() ? "the model's predictors: " : "--predictor: ",
                       set.status().message()));
    }
    predictors = std::make_shared<const PredictorSet>(std::move(*set));
  }
  return SparsityPlan::ForModel(c, mode, stats ? &*stats : nullptr, flags.target_sparsity,
                                std::move(predictors), gate_sparsity);
}

}  // namespace thermocline
