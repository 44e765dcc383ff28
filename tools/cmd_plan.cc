// `thermocline plan`: which FFN neurons go to the GPU under a VRAM budget (see
// sparsity/planner.h), written in PowerInfer's .gpuidx format; `--show` prints any such file.
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "shared/gguf/gguf.h"
#include "shared/model/model.h"
#include "shared/sparsity/activation_stats.h"
#include "shared/sparsity/placement.h"
#include "shared/sparsity/planner.h"
#include "tools/command.h"

namespace thermocline::tools {
namespace {

int RunPlan(const std::vector<std::string>& args) {
  std::string model_path, stats_path, output, budget_text, predictor_path, show_path;
  std::string scratch_text;
  PlannerOptions o;
  double hot_fraction = -1;
  po::options_description opts("options");
  // clang-format off
  opts.add_options()
      ("model,m", po::value(&model_path), "model file (GGUF)")
      ("stats", po::value(&stats_path), "activation stats from `thermocline profile`")
      ("vram-budget", po::value(&budget_text), "GPU memory to plan for, e.g. 6GiB, 512MiB, 8G")
      ("context", po::value(&o.context)->default_value(0),
       "KV cache positions per slot (0 = the model's context length), as the gateway's --context")
      ("kv-slots", po::value(&o.kv_slots)->default_value(o.kv_slots),
       "KV cache slots, as the gateway's --kv-slots (it allocates one more, its probe slot)")
      ("kv-type", po::value(&o.kv_type)->default_value(o.kv_type),
       "KV cache element type, as the gateway's --kv-type: f32 or f16")
      ("predictor", po::value(&predictor_path),
       "predictor file whose weights the GPU holds (default: the model's own, if it has any)")
      ("min-slice", po::value(&o.min_slice)->default_value(o.min_slice),
       "a layer gets no GPU neurons or at least this many")
      ("scratch", po::value(&scratch_text)->default_value("128MiB"),
       "reserve for activations and kernel workspaces")
      ("hot-fraction", po::value(&hot_fraction),
       "skip the planner: put this fraction of every layer's neurons on the GPU (hottest first "
       "with --stats, else the lowest ids)")
      ("output,o", po::value(&output), "placement file to write (PowerInfer .gpuidx format)")
      ("show", po::value(&show_path), "print a placement file (ours or PowerInfer's) and exit");
  // clang-format on
  po::positional_options_description pos;
  po::variables_map vm;
  int exit_code = 0;
  if (!ParseOptions("plan",
                    "--model M.gguf --stats S.gguf --vram-budget 6GiB -o PLAN.gguf [options]\n"
                    "       thermocline plan --show PLAN.gguf [--model M.gguf]",
                    opts, pos, args, vm, exit_code)) {
    return exit_code;
  }
  auto fail = [](const std::string& msg) {
    std::cerr << "thermocline plan: " << msg << "\n";
    return 1;
  };
  std::unique_ptr<Model> model;
  if (!model_path.empty()) {
    auto model_or = Model::Load(model_path);
    if (!model_or.ok()) return fail(std::string(model_or.status().message()));
    model = std::move(*model_or);
  }

  if (!show_path.empty()) {
    auto placement = model ? ReadPlacement(show_path, model->config()) : ReadPlacement(show_path);
    if (!placement.ok()) return fail(std::string(placement.status().message()));
    std::cout << FormatPlacement(*placement);
    return 0;
  }

  if (!model) return fail("--model is required");
  if (output.empty()) return fail("-o/--output is required");
  const ModelConfig& config = model->config();
  std::unique_ptr<ActivationStats> stats;
  if (!stats_path.empty()) {
    auto stats_or = ReadActivationStats(stats_path, &config);
    if (!stats_or.ok()) return fail(std::string(stats_or.status().message()));
    stats = std::make_unique<ActivationStats>(std::move(*stats_or));
  }

  if (vm.count("hot-fraction")) {
    if (!(hot_fraction >= 0 && hot_fraction <= 1)) return fail("--hot-fraction must be in [0, 1]");
    Placement p = Placement::Uniform(config, hot_fraction, stats.get());
    if (absl::Status s = WritePlacement(p, output); !s.ok()) return fail(std::string(s.message()));
    std::cout << FormatPlacement(p);
    return 0;
  }

  if (!stats) return fail("--stats is required (or --hot-fraction)");
  if (budget_text.empty()) return fail("--vram-budget is required");
  auto budget = ParseByteSize(budget_text);
  if (!budget.ok()) return fail(absl::StrCat("--vram-budget: ", budget.status().message()));
  o.vram_budget = *budget;
  auto scratch = ParseByteSize(scratch_text);
  if (!scratch.ok()) return fail(absl::StrCat("--scratch: ", scratch.status().message()));
  o.scratch_bytes = *scratch;
  if (o.context < 0) return fail("--context must be >= 0");

  if (!predictor_path.empty()) {
    auto file = GgufFile::Open(predictor_path);
    if (!file.ok()) return fail(std::string(file.status().message()));
    auto bytes = PredictorBytes(**file, config);
    if (!bytes.ok()) return fail(std::string(bytes.status().message()));
    if (*bytes == 0)
      return fail(absl::StrCat("--predictor ", predictor_path, " has no blk.N.fc1/fc2 tensors"));
    o.predictor_bytes = *bytes;
  } else {
    // A PowerInfer model carries its predictors; the GPU worker uploads them with the rest.
    auto bytes = PredictorBytes(model->file(), config);
    if (!bytes.ok()) return fail(std::string(bytes.status().message()));
    o.predictor_bytes = *bytes;
  }

  auto plan = PlanPlacement(*model, *stats, o);
  if (!plan.ok()) return fail(std::string(plan.status().message()));
  if (absl::Status s = WritePlacement(plan->placement, output); !s.ok()) {
    return fail(std::string(s.message()));
  }
  std::cout << FormatPlan(*plan, config);
  std::cerr << "wrote " << output << "\n";
  return 0;
}

CommandRegistrar reg({"plan", "choose the FFN neurons that live on the GPU under a VRAM budget",
                      &RunPlan});

}  // namespace
}  // namespace thermocline::tools
