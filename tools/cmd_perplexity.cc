// `thermocline perplexity`: the model's perplexity over a text corpus in any sparsity mode, the
// measurement behind every accuracy claim about sparsity (docs/sparsity.md).
#include <algorithm>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/str_format.h"
#include "shared/model/model.h"
#include "shared/runtime/corpus.h"
#include "shared/sparsity/sparse_ffn.h"
#include "shared/sparsity/sparsity_mode.h"
#include "shared/sparsity/sparsity_options.h"
#include "shared/sparsity/sparsity_setup.h"
#include "shared/sparsity/teal.h"
#include "shared/sparsity/teal_options.h"
#include "tools/command.h"

namespace thermocline::tools {
namespace {

int RunPerplexity(const std::vector<std::string>& args) {
  std::string model_path, corpus_path, down_t_type;
  int64_t max_tokens = 0, skip_tokens = 0, window = 0, batch = 0;
  int threads = 0;
  SparsityFlags sf;
  TealFlags tf;
  po::options_description opts("options");
  // One option per line reads as a table.
  // clang-format off
  opts.add_options()
      ("model,m", po::value(&model_path)->required(), "model file (GGUF)")
      ("corpus", po::value(&corpus_path)->required(), "UTF-8 text file, scored as one stream")
      ("tokens", po::value(&max_tokens)->default_value(0), "use the first N tokens of the corpus (0 = all)")
      ("skip-tokens", po::value(&skip_tokens)->default_value(0), "start after the first N tokens (text a calibration on the first N never saw)")
      ("window", po::value(&window)->default_value(256), "positions per window, BOS included")
      ("batch", po::value(&batch)->default_value(256), "positions per forward call")
      ("down-t-type", po::value(&down_t_type)->default_value(""),
       "element type of the transposed down rows of a q8_0/q4_0 model: f16 or f32 (exact); "
       "default: the model's own (requantized)")
      ("threads", po::value(&threads)->default_value(0), "CPU threads (0 = all cores)");
  // clang-format on
  AddSparsityOptions(opts, sf);
  AddTealOptions(opts, tf);
  po::positional_options_description pos;
  po::variables_map vm;
  int exit_code = 0;
  if (!ParseOptions("perplexity", "--model M.gguf --corpus TEXT [options]", opts, pos, args, vm,
                    exit_code)) {
    return exit_code;
  }
  auto fail = [](const std::string& msg) {
    std::cerr << "thermocline perplexity: " << msg << "\n";
    return 1;
  };
  if (threads < 0) return fail("--threads must be >= 0");
  if (max_tokens < 0) return fail("--tokens must be >= 0");
  if (skip_tokens < 0) return fail("--skip-tokens must be >= 0");
  if (skip_tokens > 0 && max_tokens == 0) return fail("--skip-tokens needs --tokens");
  if (batch <= 0) return fail("--batch must be > 0");
  SparseFfnOptions ffn_options;
  if (!down_t_type.empty()) {
    if (down_t_type != "f16" && down_t_type != "f32")
      return fail("--down-t-type must be f16 or f32");
    ffn_options.quantized_down_t_type = down_t_type == "f16" ? GgmlType::kF16 : GgmlType::kF32;
  }

  auto model_or = Model::Load(model_path);
  if (!model_or.ok()) return fail(std::string(model_or.status().message()));
  const Model& model = **model_or;
  const ModelConfig& c = model.config();
  if (window < 2 || window > c.context_length) {
    return fail(absl::StrFormat("--window %d must be in [2, %d] (the model's context)", window,
                                c.context_length));
  }
  auto setup = SparsitySetupFromFlags(model, sf, tf);
  if (!setup.ok()) return fail(std::string(setup.status().message()));
  // The dense FFN multiplied whole (every position of a window in one GEMM): its Q4_0 and
  // K-quant matrices get the interleaved copy, as in `generate`. TEAL's plan here sparsifies
  // every position, so the FFN's dense GEMMs would be unused under it.
  if (setup->ffn.AllDense() && !(setup->teal && setup->teal->ffn)) {
    if (absl::Status s = (*model_or)->InterleaveDenseFfn(); !s.ok()) {
      return fail(std::string(s.message()));
    }
  }
  auto tokens = TokenizeCorpusFile(corpus_path, model.tokenizer(), skip_tokens + max_tokens);
  if (!tokens.ok()) return fail(std::string(tokens.status().message()));
  if (static_cast<int64_t>(tokens->size()) <= skip_tokens) {
    return fail(absl::StrFormat("--skip-tokens %d: the corpus has only %d tokens", skip_tokens,
                                tokens->size()));
  }
  tokens->erase(tokens->begin(), tokens->begin() + skip_tokens);
  auto kv = KvCache::Create(c, 1, window, GgmlType::kF32);
  if (!kv.ok()) return fail(std::string(kv.status().message()));
  const int n_threads =
      threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency());
  ThreadPool pool(n_threads);

  // Perplexity scores TEAL's decode-time computation on every position (as the paper measures
  // it); serving keeps prompt positions dense.
  if (setup->teal) setup->teal->sparse_prompt = true;
  // Dense runs through the plain dense executor, so its figure is the reference one.
  auto executors = BuildLocalExecutors(model, std::move(*setup), pool, ffn_options);
  if (!executors.ok()) return fail(std::string(executors.status().message()));
  const SparseFfn* sparse = executors->ffn.get();
  const TealLinear* teal = executors->teal.get();
  ForwardPass pass(model, *kv, pool, executors->ffn.get(), executors->teal.get());
  CorpusWindowOptions wo;
  wo.window = window;
  wo.batch = batch;
  wo.progress_label = "perplexity";
  auto result = Perplexity(pass, *tokens, wo);
  if (!result.ok()) return fail(std::string(result.status().message()));

  std::cout << absl::StrFormat("model: %s (%s, %s FFN)\n", model_path, model.weight_type_name(),
                               ActivationName(c.activation));
  std::cout << absl::StrFormat("sparsity: %s", sf.mode);
  if (sf.target_sparsity) std::cout << absl::StrFormat(" (target %.2f)", *sf.target_sparsity);
  if (tf.sparsity) {
    std::cout << absl::StrFormat(" teal %.2f (%s)", *tf.sparsity,
                                 tf.profile_path.empty() ? "per-token top-k" : "calibrated cuts");
  }
  std::cout << "\n";
  std::cout << absl::StrFormat("tokens: %d scored in %d windows of %d\n", result->predicted,
                               result->windows, window);
  std::cout << absl::StrFormat("mean nll: %.6f\n", result->mean_nll);
  std::cout << absl::StrFormat("perplexity: %.4f\n", result->perplexity);
  if (teal) {
    std::cout << "layer       q       k       v       o    gate      up    down\n";
    for (int64_t l = 0; l < c.n_layers; ++l) {
      std::cout << absl::StrFormat("%5d", l);
      for (int p = 0; p < kNumProjections; ++p) {
        const ProjectionActivity& a = teal->activity(l, static_cast<Projection>(p));
        std::cout << absl::StrFormat(
            "  %6.4f", a.inputs > 0 ? 1.0 - static_cast<double>(a.kept) / a.inputs : 0.0);
      }
      std::cout << "\n";
    }
    std::cout << absl::StrFormat("teal sparsity (parameter-weighted): %.4f\n",
                                 teal->MeasuredSparsity());
    if (teal->owned_bytes() > 0) {
      std::cerr << absl::StrFormat("perplexity: transposed projections hold %.1f MiB\n",
                                   teal->owned_bytes() / double(1 << 20));
    }
  }
  if (sparse) {
    const SparsityPlan* plan = &sparse->plan();
    const bool predicted = std::any_of(plan->modes.begin(), plan->modes.end(), [](SparsityMode m) {
      return m == SparsityMode::kPredicted;
    });
    std::cout << "layer  mode       cut         coeff cut   active  down"
              << (predicted ? "  predicted" : "") << "\n";
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const LayerActivity& a = sparse->activity()[l];
      std::cout << absl::StrFormat(
          "%5d  %-9s  %-10.4g  %-10.4g  %6.4f  %6.4f", l,
          std::string(SparsityModeName(plan->mode(l))), plan->cuts[l], plan->coeff_cuts[l],
          sparse->ActiveRatio(l),
          a.tokens > 0 ? static_cast<double>(a.down) / (a.tokens * c.ffn_dim) : 0.0);
      if (predicted) {
        std::cout << absl::StrFormat(
            "  %9.4f",
            a.tokens > 0 ? static_cast<double>(a.candidates) / (a.tokens * c.ffn_dim) : 0.0);
      }
      std::cout << "\n";
    }
    std::cout << absl::StrFormat("active ratio: %.4f (sparsity %.4f)\n", sparse->ActiveRatio(),
                                 1 - sparse->ActiveRatio());
    std::cout << absl::StrFormat("down rows read: %.4f (down sparsity %.4f)\n",
                                 sparse->DownRatio(), 1 - sparse->DownRatio());
    if (sparse->down_t_bytes() > 0) {
      std::cerr << absl::StrFormat("perplexity: transposed down rows hold %.1f MiB\n",
                                   sparse->down_t_bytes() / double(1 << 20));
    }
    if (sparse->bundle_bytes() > 0) {
      std::cerr << absl::StrFormat("perplexity: neuron bundles hold %.1f MiB\n",
                                   sparse->bundle_bytes() / double(1 << 20));
    }
  }
  return 0;
}

CommandRegistrar reg({"perplexity",
                      "perplexity of a model over a text corpus, in any sparsity mode",
                      &RunPerplexity});

}  // namespace
}  // namespace thermocline::tools
