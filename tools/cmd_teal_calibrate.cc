// `thermocline teal-calibrate`: TEAL's offline step (sparsity/teal_calibration.h): per layer and
// projection, the magnitude distribution of its input over a corpus and the block-wise greedy
// allocation of sparsity for each model-level target, written as a TEAL profile (GGUF).
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
#include "shared/sparsity/teal_calibration.h"
#include "tools/command.h"

namespace thermocline::tools {
namespace {

int RunTealCalibrate(const std::vector<std::string>& args) {
  std::string model_path, corpus_path, output, targets_text;
  int64_t max_tokens = 0;
  int threads = 0;
  TealCalibrationOptions o;
  po::options_description opts("options");
  // clang-format off
  opts.add_options()
      ("model,m", po::value(&model_path)->required(), "model file (GGUF)")
      ("corpus", po::value(&corpus_path)->required(), "UTF-8 text to run the model over")
      ("output,o", po::value(&output)->required(), "TEAL profile to write (GGUF)")
      ("tokens", po::value(&max_tokens)->default_value(0), "use at most this many corpus tokens for the input distributions (0 = all)")
      ("greedy-tokens", po::value(&o.greedy_tokens)->default_value(o.greedy_tokens), "the first N of them measure the greedy allocation's block errors")
      ("targets", po::value(&targets_text)->default_value("0.25,0.4,0.5"), "model-level target sparsities, ascending")
      ("step", po::value(&o.step)->default_value(o.step, "0.05"), "sparsity raise of one greedy move")
      ("window", po::value(&o.window)->default_value(o.window), "positions per window, BOS included")
      ("batch", po::value(&o.batch)->default_value(o.batch), "positions per forward call")
      ("threads", po::value(&threads)->default_value(0), "CPU threads (0 = all cores)");
  // clang-format on
  po::positional_options_description pos;
  po::variables_map vm;
  int exit_code = 0;
  if (!ParseOptions("teal-calibrate", "--model M.gguf --corpus TEXT -o TEAL.gguf [options]", opts,
                    pos, args, vm, exit_code)) {
    return exit_code;
  }
  auto fail = [](const std::string& msg) {
    std::cerr << "thermocline teal-calibrate: " << msg << "\n";
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
  if (absl::Status s = ValidateTealCalibrationOptions(o, model.config()); !s.ok()) {
    return fail(std::string(s.message()));
  }
  auto tokens = TokenizeCorpusFile(corpus_path, model.tokenizer(), max_tokens);
  if (!tokens.ok()) return fail(std::string(tokens.status().message()));
  const int n_threads =
      threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency());
  ThreadPool pool(n_threads);
  const auto start = std::chrono::steady_clock::now();
  auto profile = CalibrateTeal(model, *tokens, o, pool);
  if (!profile.ok()) return fail(std::string(profile.status().message()));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (absl::Status s = WriteTealProfile(*profile, output); !s.ok()) {
    return fail(std::string(s.message()));
  }
  std::cout << FormatTealProfile(model, *profile);
  std::cerr << absl::StrFormat(
      "calibrated on %d corpus tokens (greedy on %d) in %.1f s on %d threads; wrote %s\n",
      profile->tokens, profile->greedy_tokens, seconds, n_threads, output);
  return 0;
}

CommandRegistrar reg({"teal-calibrate",
                      "TEAL: per-projection input magnitude cuts and their greedy allocation",
                      &RunTealCalibrate});

}  // namespace
}  // namespace thermocline::tools
