#include "tools/corpus_command.h"

#include <chrono>
#include <iostream>
#include <thread>

#include "absl/strings/str_format.h"
#include "shared/runtime/corpus.h"

namespace thermocline::tools {

int RunCorpusCommand(const CorpusCommand& command, const std::vector<std::string>& args) {
  std::string model_path, corpus_path, output, targets_text;
  int64_t max_tokens = 0;
  int threads = 0;
  po::options_description opts("options");
  // clang-format off
  opts.add_options()
      ("model,m", po::value(&model_path)->required(), "model file (GGUF)")
      ("corpus", po::value(&corpus_path)->required(), "UTF-8 text to run the model over")
      ("output,o", po::value(&output)->required(), command.output_help.c_str())
      ("tokens", po::value(&max_tokens)->default_value(0), command.tokens_help.c_str())
      ("targets", po::value(&targets_text)->default_value(command.targets_default),
       command.targets_help.c_str())
      ("threads", po::value(&threads)->default_value(0), "CPU threads (0 = all cores)");
  // clang-format on
  command.add_options(opts);
  po::positional_options_description pos;
  po::variables_map vm;
  int exit_code = 0;
  if (!ParseOptions(command.name, command.usage, opts, pos, args, vm, exit_code)) return exit_code;
  auto fail = [&](const std::string& msg) {
    std::cerr << "thermocline " << command.name << ": " << msg << "\n";
    return 1;
  };
  if (threads < 0) return fail("--threads must be >= 0");
  if (max_tokens < 0) return fail("--tokens must be >= 0");
  absl::StatusOr<std::vector<float>> targets = ParseFloatList("--targets", targets_text);
  if (!targets.ok()) return fail(std::string(targets.status().message()));

  auto model = Model::Load(model_path);
  if (!model.ok()) return fail(std::string(model.status().message()));
  if (absl::Status s = command.validate(*targets, **model); !s.ok()) {
    return fail(std::string(s.message()));
  }
  if (command.prepare) {
    if (absl::Status s = command.prepare(**model); !s.ok()) return fail(std::string(s.message()));
  }
  auto tokens = TokenizeCorpusFile(corpus_path, (*model)->tokenizer(), max_tokens);
  if (!tokens.ok()) return fail(std::string(tokens.status().message()));

  const int n_threads =
      threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency());
  ThreadPool pool(n_threads);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::string> summary =
      command.run(CorpusInput{**model, *tokens, *targets, pool}, output);
  if (!summary.ok()) return fail(std::string(summary.status().message()));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cerr << absl::StrFormat("%s in %.1f s on %d threads; wrote %s\n", *summary, seconds,
                               n_threads, output);
  return 0;
}

}  // namespace thermocline::tools
