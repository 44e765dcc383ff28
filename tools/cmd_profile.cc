// `thermocline profile`: per-neuron activation frequencies and per-layer magnitude cuts of a
// model over a text corpus (see sparsity/profiler.h), written as a stats GGUF.
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "shared/sparsity/activation_stats.h"
#include "shared/sparsity/profiler.h"
#include "tools/corpus_command.h"

namespace thermocline::tools {
namespace {

int RunProfile(const std::vector<std::string>& args) {
  ProfileOptions o;
  o.progress = true;
  CorpusCommand c;
  c.name = "profile";
  c.usage = "--model M.gguf --corpus TEXT -o STATS.gguf [options]";
  c.output_help = "stats file to write (GGUF)";
  c.tokens_help = "use at most this many corpus tokens (0 = all)";
  c.targets_default = "0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9";
  c.targets_help = "target sparsities to find per-layer magnitude cuts for, ascending";
  c.add_options = [&](po::options_description& opts) {
    // clang-format off
    opts.add_options()
        ("window", po::value(&o.window)->default_value(o.window), "positions per window, BOS included")
        ("batch", po::value(&o.batch)->default_value(o.batch), "positions per forward call")
        ("frequency-target", po::value(&o.frequency_target)->default_value(0.5f, "0.5"),
         "SiLU models: the target whose cut defines the stored frequencies (one of --targets)");
    // clang-format on
  };
  c.validate = [&](const std::vector<float>& targets, const Model& model) {
    o.targets = targets;
    return ValidateProfileOptions(o, model.config());
  };
  // The profile runs the dense FFN over corpus windows (one GEMM per window): its Q4_0 and
  // K-quant matrices get the interleaved copy, as `generate` gives the dense mode.
  c.prepare = [](Model& model) { return model.InterleaveDenseFfn(); };
  c.run = [&](const CorpusInput& in, const std::string& output) -> absl::StatusOr<std::string> {
    auto result = ProfileActivations(in.model, in.tokens, o, in.pool);
    if (!result.ok()) return result.status();
    if (absl::Status s = WriteActivationStats(result->stats, output); !s.ok()) return s;
    std::cout << FormatProfileReport(*result);
    return absl::StrFormat("profiled %d corpus tokens", in.tokens.size());
  };
  return RunCorpusCommand(c, args);
}

CommandRegistrar reg({"profile", "measure per-neuron activation frequencies and sparsity cuts",
                      &RunProfile});

}  // namespace
}  // namespace thermocline::tools
