// `thermocline profile`: per-neuron activation frequencies and per-layer magnitude cuts of a
// model over a text corpus (see sparsity/profiler.h), written as a stats GGUF.
#include <chrono>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "shared/model/model.h"
#include "shared/runtime/corpus.h"
#include "shared/sparsity/activation_stats.h"
#include "shared/sparsity/profiler.h"
#include "tools/command.h"

namespace thermocline::tools {
namespace {

int RunProfile(const std::vector<std::string>& args) {
  std::string model_path, corpus_path, output, targets_text;
  int64_t max_tokens = 0;
  int threads = 0;
  ProfileOptions o;
  po::options_description opts("options");
  // clang-format off
  opts.add_options()
      ("model,m", po::value(&model_path)->required(), "model file (GGUF)")
      ("corpus", po::value(&corpus_path)->required(), "UTF-8 text to run the model over")
      ("output,o", po::value(&output)->required(), "stats file to write (GGUF)")
      ("tokens", po::value(&max_tokens)->default_value(0), "use at most this many corpus tokens (0 = all)")
      ("window", po::value(&o.window)->default_value(o.window), "positions per window, BOS included")
      ("batch", po::value(&o.batch)->default_value(o.batch), "positions per forward call")
      ("targets", po::value(&targets_text)->default_value("0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9"),
       "target sparsities to find per-layer magnitude cuts for, ascending")
      ("frequency-target", po::value(&o.frequency_target)->default_value(0.5f, "0.5"),
       "SiLU models: the target whose cut defines the stored frequencies (one of --targets)")
      ("threads", po::value(&threads)->default_value(0), "CPU threads (0 = all cores)");
  // clang-format on
  po::positional_options_description pos;
  po::variables_map vm;
  int exit_code = 0;
  if (!ParseOptions("profile", "--model M.gguf --corpus TEXT -o STATS.gguf [options]", opts, pos,
                    args, vm, exit_code)) {
    return exit_code;
  }
  auto fail = [](const std::string& msg) {
    std::cerr << "thermocline profile: " << msg << "\n";
    return 1;
  };
  if (threads < 0) return fail("--threads must be >= 0");
  if (max_tokens < 0) return fail("--tokens must be >= 0");
  absl::StatusOr<std::vector<float>> targets = ParseFloatList("--targets", targets_text);
  if (!targets.ok()) return fail(std::string(targets.status().message()));
  o.targets = *std::move(targets);
  o.progress = true;

  auto model_or = Model::Load(model_path);
  if (!model_or.ok()) return fail(std::string(model_or.status().message()));
  const Model& model = **model_or;
  if (absl::Status s = ValidateProfileOptions(o, model.config()); !s.ok()) {
    return fail(std::string(s.message()));
  }
  auto tokens = TokenizeCorpusFile(corpus_path, model.tokenizer(), max_tokens);
  if (!tokens.ok()) return fail(std::string(tokens.status().message()));

  const int n_threads =
      threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency());
  ThreadPool pool(n_threads);
  const auto start = std::chrono::steady_clock::now();
  auto result = ProfileActivations(model, *tokens, o, pool);
  if (!result.ok()) return fail(std::string(result.status().message()));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (absl::Status s = WriteActivationStats(result->stats, output); !s.ok()) {
    return fail(std::string(s.message()));
  }
  std::cout << FormatProfileReport(*result);
  std::cerr << absl::StrFormat("profiled %d corpus tokens in %.1f s on %d threads; wrote %s\n",
                               tokens->size(), seconds, n_threads, output);
  return 0;
}

CommandRegistrar reg({"profile", "measure per-neuron activation frequencies and sparsity cuts",
                      &RunProfile});

}  // namespace
}  // namespace thermocline::tools
