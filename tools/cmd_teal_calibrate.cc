// `thermocline teal-calibrate`: TEAL's offline step (sparsity/teal_calibration.h): per layer and
// projection, the magnitude distribution of its input over a corpus and the block-wise greedy
// allocation of sparsity for each model-level target, written as a TEAL profile (GGUF).
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "shared/sparsity/teal_calibration.h"
#include "tools/corpus_command.h"

namespace thermocline::tools {
namespace {

int RunTealCalibrate(const std::vector<std::string>& args) {
  TealCalibrationOptions o;
  o.progress = true;
  CorpusCommand c;
  c.name = "teal-calibrate";
  c.usage = "--model M.gguf --corpus TEXT -o TEAL.gguf [options]";
  c.output_help = "TEAL profile to write (GGUF)";
  c.tokens_help = "use at most this many corpus tokens for the input distributions (0 = all)";
  c.targets_default = "0.25,0.4,0.5";
  c.targets_help = "model-level target sparsities, ascending";
  c.add_options = [&](po::options_description& opts) {
    // clang-format off
    opts.add_options()
        ("greedy-tokens", po::value(&o.greedy_tokens)->default_value(o.greedy_tokens), "the first N of them measure the greedy allocation's block errors")
        ("step", po::value(&o.step)->default_value(o.step, "0.05"), "sparsity raise of one greedy move")
        ("window", po::value(&o.window)->default_value(o.window), "positions per window, BOS included")
        ("batch", po::value(&o.batch)->default_value(o.batch), "positions per forward call");
    // clang-format on
  };
  c.validate = [&](const std::vector<float>& targets, const Model& model) {
    o.targets = targets;
    return ValidateTealCalibrationOptions(o, model.config());
  };
  // The greedy's trials multiply whole batches of masked inputs (TealPlan::masked), the FFN's
  // too: its Q4_0 and K-quant matrices get the interleaved copy the dense mode's GEMMs read.
  c.prepare = [](Model& model) { return model.InterleaveDenseFfn(); };
  c.run = [&](const CorpusInput& in, const std::string& output) -> absl::StatusOr<std::string> {
    auto profile = CalibrateTeal(in.model, in.tokens, o, in.pool);
    if (!profile.ok()) return profile.status();
    if (absl::Status s = WriteTealProfile(*profile, output); !s.ok()) return s;
    std::cout << FormatTealProfile(in.model, *profile);
    return absl::StrFormat("calibrated on %d corpus tokens (greedy on %d)", profile->tokens,
                           profile->greedy_tokens);
  };
  return RunCorpusCommand(c, args);
}

CommandRegistrar reg({"teal-calibrate",
                      "TEAL: per-projection input magnitude cuts and their greedy allocation",
                      &RunTealCalibrate});

}  // namespace
}  // namespace thermocline::tools
