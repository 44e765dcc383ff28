// `thermocline train-predictor`: trains PowerInfer-style activation predictors for a model over
// a text corpus (see shared/sparsity/predictor_trainer.h) and writes them as GGUF.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "shared/model/model.h"
#include "shared/runtime/corpus.h"
#include "shared/sparsity/activation_stats.h"
#include "shared/sparsity/predictor.h"
#include "shared/sparsity/predictor_trainer.h"
#include "tools/command.h"

namespace thermocline::tools {
namespace {

int RunTrainPredictor(const std::vector<std::string>& args) {
  std::string model_path, corpus_path, output, rank_arg, candidates_arg, stats_path, type_name,
      eval_corpus_path;
  int64_t max_tokens = 0, eval_tokens = 0;
  int threads = 0;
  float stats_target = -1;
  PredictorTrainerOptions o;
  po::options_description opts("options");
  // clang-format off
  opts.add_options()
      ("model,m", po::value(&model_path)->required(), "model file (GGUF)")
      ("corpus", po::value(&corpus_path)->required(), "UTF-8 text to collect activations over")
      ("output,o", po::value(&output)->required(), "predictor file to write (GGUF)")
      ("tokens", po::value(&max_tokens)->default_value(65536), "corpus tokens to use at most (0 = all)")
      ("eval-corpus", po::value(&eval_corpus_path),
       "after training, also measure every layer on this text (one the predictors never saw)")
      ("eval-tokens", po::value(&eval_tokens)->default_value(65536),
       "--eval-corpus tokens to use at most (0 = all; capped by --max-samples)")
      ("window", po::value(&o.window)->default_value(o.window), "positions per corpus window, BOS included")
      ("rank", po::value(&rank_arg)->default_value("auto"),
       "predictor rank for every layer, or auto: per layer, the smallest candidate whose "
       "precision the next one does not beat by --rank-tolerance")
      ("rank-candidates", po::value(&candidates_arg)->default_value(""),
       "comma-separated ranks for --rank auto (default dim/16,dim/8,dim/4,dim/2,3dim/4,dim)")
      ("rank-tolerance", po::value(&o.rank_tolerance)->default_value(o.rank_tolerance, "0.02"),
       "precision gain that justifies a larger rank")
      ("epochs", po::value(&o.epochs)->default_value(o.epochs), "passes over the training samples")
      ("lr", po::value(&o.learning_rate)->default_value(o.learning_rate, "0.003"),
       "Adam learning rate (cosine-decayed to 10%)")
      ("batch", po::value(&o.batch)->default_value(o.batch), "samples per optimizer step")
      ("pos-weight", po::value(&o.pos_weight)->default_value(0.0f, "0"),
       "weight of active neurons in the loss (0 = sqrt(inactive/active share), at least 1)")
      ("recall-target", po::value(&o.recall_target)->default_value(o.recall_target, "0.95"),
       "share of active neurons the threshold must keep")
      ("holdout", po::value(&o.holdout)->default_value(o.holdout, "0.1"),
       "share of tokens held out: half picks the threshold, half measures recall/precision")
      ("max-samples", po::value(&o.max_samples_per_layer)->default_value(o.max_samples_per_layer),
       "token samples kept per layer (bounds memory)")
      ("stats", po::value(&stats_path),
       "activation statistics from `thermocline profile`; SiLU models need them: a neuron is "
       "active when |silu(gate)| >= the layer's cut")
      ("stats-target", po::value(&stats_target),
       "SiLU models: the target sparsity whose cuts define active (one of the stats file's "
       "targets; default its frequency target)")
      ("type", po::value(&type_name)->default_value("f16"), "predictor weight type: f32, f16, bf16")
      ("seed", po::value(&o.seed)->default_value(o.seed), "seed (same seed and data, same predictors)")
      ("threads", po::value(&threads)->default_value(0), "CPU threads (0 = all cores)");
  // clang-format on
  po::positional_options_description pos;
  po::variables_map vm;
  int exit_code = 0;
  if (!ParseOptions("train-predictor", "--model M.gguf --corpus TEXT -o PRED.gguf [options]", opts,
                    pos, args, vm, exit_code)) {
    return exit_code;
  }
  auto fail = [](const std::string& msg) {
    std::cerr << "thermocline train-predictor: " << msg << "\n";
    return 1;
  };
  if (threads < 0) return fail("--threads must be >= 0");
  if (max_tokens < 0) return fail("--tokens must be >= 0");
  if (eval_tokens < 0) return fail("--eval-tokens must be >= 0");
  if (vm.count("eval-tokens") && !vm["eval-tokens"].defaulted() && eval_corpus_path.empty()) {
    return fail("--eval-tokens needs --eval-corpus");
  }
  if (type_name != "f32" && type_name != "f16" && type_name != "bf16") {
    return fail("--type '" + type_name + "' is not one of: f32, f16, bf16");
  }
  o.type = *TypeFromName(type_name);
  if (rank_arg != "auto") {
    if (!absl::SimpleAtoi(rank_arg, &o.rank) || o.rank <= 0) {
      return fail("--rank '" + rank_arg + "' is neither a positive integer nor 'auto'");
    }
    if (!candidates_arg.empty()) return fail("--rank-candidates needs --rank auto");
  }
  for (absl::string_view part : absl::StrSplit(candidates_arg, ',', absl::SkipEmpty())) {
    int64_t r = 0;
    if (!absl::SimpleAtoi(part, &r) || r <= 0) {
      return fail("--rank-candidates '" + candidates_arg +
                  "' must be positive integers separated by commas");
    }
    o.rank_candidates.push_back(r);
  }
  o.progress = true;

  auto model_or = Model::Load(model_path);
  if (!model_or.ok()) return fail(std::string(model_or.status().message()));
  // The samples come from dense forward passes over corpus windows: the FFN's Q4_0 and
  // K-quant matrices get the interleaved copy its GEMMs read, as in `profile`.
  if (absl::Status s = (*model_or)->InterleaveDenseFfn(); !s.ok()) {
    return fail(std::string(s.message()));
  }
  const Model& model = **model_or;
  const ModelConfig& c = model.config();
  if (!IsReluFamily(c.activation) && stats_path.empty()) {
    return fail(model_path +
                " is a SiLU model: which of its neurons count as active is defined "
                "by the magnitude cuts of --stats (from `thermocline profile`)");
  }
  if (!stats_path.empty()) {
    auto stats = ReadActivationStats(stats_path, &c);
    if (!stats.ok()) return fail(std::string(stats.status().message()));
    if (!IsReluFamily(c.activation)) {
      if (stats->criterion != "magnitude") {
        return fail("--stats " + stats_path + " has criterion '" + stats->criterion +
                    "', expected 'magnitude' for this SiLU model");
      }
      const float target = vm.count("stats-target") ? stats_target : stats->frequency_target;
      for (int64_t l = 0; l < c.n_layers; ++l) {
        auto cut = stats->CutFor(l, target);
        if (!cut.ok())
          return fail("--stats " + stats_path + ": " + std::string(cut.status().message()));
        o.magnitude_cuts.push_back(*cut);
      }
      std::cerr << absl::StrFormat(
          "train-predictor: active = |silu(gate)| >= the layer's cut for %.0f%% sparsity (%s)\n",
          100 * target, stats_path);
    } else {
      // A ReLU neuron is active exactly when its gate is positive; the stats add nothing.
      if (vm.count("stats-target")) return fail("--stats-target applies to SiLU models only");
      std::cerr << "train-predictor: ReLU model: active = relu(gate) > 0; --stats is not needed\n";
    }
  } else if (vm.count("stats-target")) {
    return fail("--stats-target needs --stats");
  }
  if (o.rank == 0 && o.rank_candidates.empty())
    o.rank_candidates = DefaultRankCandidates(c, o.type);
  if (absl::Status s = ValidatePredictorTrainerOptions(o, c); !s.ok()) {
    return fail(std::string(s.message()));
  }
  auto tokens_or = TokenizeCorpusFile(corpus_path, model.tokenizer(), max_tokens);
  if (!tokens_or.ok()) return fail(std::string(tokens_or.status().message()));

  const int n_threads =
      threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency());
  ThreadPool pool(n_threads);
  // The evaluation samples are collected before training, so that a bad --eval-corpus fails
  // before the long part.
  std::vector<LayerSamples> eval_samples;
  if (!eval_corpus_path.empty()) {
    auto eval_tokens_or = TokenizeCorpusFile(eval_corpus_path, model.tokenizer(), eval_tokens);
    if (!eval_tokens_or.ok()) return fail(std::string(eval_tokens_or.status().message()));
    PredictorTrainerOptions eo = o;
    eo.progress = false;
    auto collected = CollectPredictorSamples(model, *eval_tokens_or, eo, pool);
    if (!collected.ok()) {
      return fail("--eval-corpus " + eval_corpus_path + ": " +
                  std::string(collected.status().message()));
    }
    eval_samples = std::move(*collected);
  }
  const int64_t per_layer_samples = std::min<int64_t>(
      o.max_samples_per_layer, static_cast<int64_t>(tokens_or->size()) / (o.window - 1) * o.window);
  const double sample_bytes = static_cast<double>(c.dim * 2 + (c.ffn_dim + 63) / 64 * 8 + 1);
  std::cerr << absl::StrFormat(
      "train-predictor: %d layers, dim %d, %d neurons, %d corpus tokens; up to %d samples per "
      "layer (%.1f MiB); ranks %s; %d threads\n",
      c.n_layers, c.dim, c.ffn_dim, tokens_or->size(), per_layer_samples,
      per_layer_samples * sample_bytes * c.n_layers / (1 << 20),
      o.rank > 0 ? std::to_string(o.rank) : "auto of " + absl::StrJoin(o.rank_candidates, ","),
      n_threads);
  // Too few optimizer steps is the usual reason for a weak predictor on a small corpus.
  constexpr int64_t kFewSteps = 1000;
  const int64_t approx_steps =
      o.epochs *
      static_cast<int64_t>((per_layer_samples * (1 - o.holdout) + o.batch - 1) / o.batch);
  if (approx_steps < kFewSteps) {
    std::cerr << absl::StrFormat(
        "train-predictor: note: about %d optimizer steps per rank; predictors are usually "
        "undertrained below %d (raise --tokens or --epochs)\n",
        approx_steps, kFewSteps);
  }

  auto summary_or = TrainPredictors(model, *tokens_or, o, pool);
  if (!summary_or.ok()) return fail(std::string(summary_or.status().message()));
  PredictorTrainingSummary& summary = *summary_or;
  const PredictorSet& set = summary.predictors;
  if (absl::Status s = WritePredictors(set, c, output); !s.ok()) {
    return fail(std::string(s.message()));
  }

  std::printf("samples per layer: %lld train, %lld calibration, %lld test (held out)\n",
              static_cast<long long>(summary.train_samples),
              static_cast<long long>(summary.calibration_samples),
              static_cast<long long>(summary.test_samples));
  std::printf("%5s %6s %9s %9s %10s %10s  %s\n", "layer", "rank", "recall", "precision",
              "predicted", "active", "rank trials (calibration precision)");
  double sum_recall = 0, sum_precision = 0, sum_predicted = 0, sum_active = 0;
  for (int64_t l = 0; l < set.n_layers(); ++l) {
    const PredictorLayerReport& r = set.report().layers[l];
    std::string trials;
    for (const RankTrial& t : summary.layers[l].trials) {
      trials +=
          absl::StrFormat("%s%d:%.3f", trials.empty() ? "" : " ", t.rank, t.calibration_precision);
    }
    std::printf("%5lld %6lld %9.4f %9.4f %10.4f %10.4f  %s\n", static_cast<long long>(l),
                static_cast<long long>(set.layer(l).rank), r.recall, r.precision,
                r.predicted_active, r.true_active, trials.c_str());
    sum_recall += r.recall;
    sum_precision += r.precision;
    sum_predicted += r.predicted_active;
    sum_active += r.true_active;
  }
  const double n = static_cast<double>(set.n_layers());
  std::printf("%5s %6s %9.4f %9.4f %10.4f %10.4f\n", "mean", "", sum_recall / n, sum_precision / n,
              sum_predicted / n, sum_active / n);
  std::printf("threshold: %s; predictors: %.2f MiB (%s)\n",
              summary.folded
                  ? absl::StrFormat("%g for every layer (folded into fc2)", set.threshold()).c_str()
                  : absl::StrFormat("per layer (thermocline.predictor.thresholds); global %g, "
                                    "the most permissive, for PowerInfer",
                                    set.threshold())
                        .c_str(),
              set.bytes() / double(1 << 20), type_name.c_str());
  if (!eval_samples.empty()) {
    // Every token of the evaluation text counts (no split): the predictors never saw any of it.
    std::printf("on %s (%lld samples per layer, none trained on):\n", eval_corpus_path.c_str(),
                static_cast<long long>(eval_samples[0].size()));
    std::printf("%5s %9s %9s %10s %10s %9s\n", "layer", "recall", "precision", "predicted",
                "active", "selected");
    double worst_recall = 1, worst_ratio = 0;
    for (int64_t l = 0; l < set.n_layers(); ++l) {
      const PredictorLayerReport r =
          EvaluatePredictorLayer(set, l, eval_samples[l], std::nullopt, pool);
      // Neurons computed per truly active neuron: the cost of the predictor's misses' cover.
      const double ratio = r.true_active > 0 ? r.predicted_active / r.true_active : 0;
      std::printf("%5lld %9.4f %9.4f %10.4f %10.4f %8.3fx\n", static_cast<long long>(l), r.recall,
                  r.precision, r.predicted_active, r.true_active, ratio);
      worst_recall = std::min<double>(worst_recall, r.recall);
      worst_ratio = std::max(worst_ratio, ratio);
    }
    std::printf("worst layer: recall %.4f, selected %.3fx the truly active\n", worst_recall,
                worst_ratio);
  }
  std::printf("wrote %s\n", output.c_str());
  return 0;
}

CommandRegistrar reg({"train-predictor",
                      "train per-layer activation predictors (PowerInfer's fc1/fc2) over a corpus",
                      &RunTrainPredictor});

}  // namespace
}  // namespace thermocline::tools
