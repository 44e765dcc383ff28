// The worker command line (docs/workers.md): WorkerFlags and its one field list,
// VisitWorkerFields, from which both workers register their options (ParseWorkerCommandLine)
// and the split driver emits their argv (WorkerArgv). Adding a flag is one line in that list.
// Given the same flags, both workers compute the same Placement and SparsityPlan, which is what
// lets them split every layer's neurons without telling each other which neuron lives where.
#pragma once

#include <boost/program_options.hpp>
#include <cstdint>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "shared/model/model.h"
#include "shared/sparsity/partition.h"
#include "shared/sparsity/placement.h"
#include "shared/sparsity/sparsity_mode.h"
#include "shared/sparsity/sparsity_options.h"
#include "shared/sparsity/teal_profile.h"
#include "shared/util/flag_options.h"
#include "shared/util/logfmt.h"
#include "shared/util/startup_environment.h"

namespace thermocline::ipc {

enum class WorkerKind { kGpu, kCpu };
const char* WorkerProgram(WorkerKind kind);    // "thermocline-gpu-worker"
const char* WorkerLogPrefix(WorkerKind kind);  // "gpu_worker", as its log lines

enum class Takers { kBoth, kGpu, kCpu };  // which workers take a flag
enum class Presence { kOptional, kRequired };  // required: always emitted, never defaulted

struct WorkerField {
  const char* name;  // without the leading "--"
  const char* help;
  Takers takers = Takers::kBoth;
  Presence presence = Presence::kOptional;
  bool TakenBy(WorkerKind kind) const {
    return takers == Takers::kBoth || (takers == Takers::kGpu) == (kind == WorkerKind::kGpu);
  }
  bool required() const { return presence == Presence::kRequired; }
};

struct WorkerFlags {
  // Both workers.
  std::string instance;
  std::string model_path;
  std::string check_tensors = "auto";
  int threads = 1;
  std::string plan_path;
  std::optional<double> hot_fraction;
  SparsityFlags sparsity;
  // TEAL: on attention (the gpu worker), or with --sparsity teal on the FFN too (both workers).
  TealFlags teal;
  // gpu_worker.
  std::string backend = "host";
  int32_t kv_slots = 4;
  int32_t context = 0;
  int32_t max_batch = 512;
  std::string kv_type = "f32";
  int32_t prefix_cache_blocks = 0;
  std::string vram_budget = "0";
  // cpu_worker.
  std::optional<int> numa_node;
  std::string cpus;
  bool mlock = false;

  PlacementFlags placement() const { return {plan_path, hot_fraction, sparsity.stats_path}; }
};

// THE list: calls v(field, member...) with the same member of every struct in `flags`, in the
// order WorkerArgv emits them. A member of WorkerFlags missing here is not a flag.
template <class V, class... Flags>
void VisitWorkerFields(V&& v, Flags&... f) {
  constexpr Takers kGpu = Takers::kGpu, kCpu = Takers::kCpu, kBoth = Takers::kBoth;
  constexpr Presence kRequired = Presence::kRequired;
  v(WorkerField{"instance", "transport instance to attach to", kBoth, kRequired}, f.instance...);
  v(WorkerField{"model", "model file (GGUF)", kBoth, kRequired}, f.model_path...);
  v(WorkerField{"check-tensors",
                "scan the weights for NaN/infinity at load: auto (files up to 2 GiB), on or off"},
    f.check_tensors...);
  v(WorkerField{"threads", "compute threads (>= 1)"}, f.threads...);
  v(WorkerField{"plan", "placement (.gpuidx) from `thermocline plan`"}, f.plan_path...);
  v(WorkerField{"hot-fraction",
                "or: share of each layer's neurons that is hot, in [0, 1] (hottest first by "
                "--stats when given)"},
    f.hot_fraction...);
  VisitSparsityFields(
      [&v](const char* name, const char* help, auto&... value) {
        v(WorkerField{name, help}, value...);
      },
      f.sparsity...);
  v(WorkerField{"teal-sparsity",
                "TEAL: model-level input sparsity (a --teal-profile target, or the per-token "
                "share without one) on attention with an FFN mode, on the FFN too with "
                "--sparsity teal (which needs the profile)"},
    f.teal.sparsity...);
  v(WorkerField{"teal-profile", "TEAL's calibrated cuts from `thermocline teal-calibrate`"},
    f.teal.profile_path...);
  v(WorkerField{"backend", "compute backend: host or cuda", kGpu}, f.backend...);
  v(WorkerField{"kv-slots", "KV cache slots (sequences)", kGpu}, f.kv_slots...);
  v(WorkerField{"context", "positions per slot (0 = the model's context length)", kGpu},
    f.context...);
  v(WorkerField{"max-batch", "most entries in one Step", kGpu}, f.max_batch...);
  v(WorkerField{"kv-type", "KV cache element type: f32 or f16", kGpu}, f.kv_type...);
  v(WorkerField{"prefix-cache-blocks",
                "KV blocks (16 positions) beyond the slots' own, for the prefix cache; 0: off "
                "(a contiguous cache, no KV tables in Steps)",
                kGpu},
    f.prefix_cache_blocks...);
  v(WorkerField{"vram-budget",
                "cuda: device memory the backend may use, e.g. 20G (0 = the device's free "
                "memory)",
                kGpu},
    f.vram_budget...);
  v(WorkerField{"numa-node",
                "NUMA node holding the cold rows (and, without --cpus, running the threads)",
                kCpu},
    f.numa_node...);
  v(WorkerField{"cpus", "CPUs to pin the threads to, e.g. 0-3,6", kCpu}, f.cpus...);
  v(WorkerField{"mlock", "lock the cold rows in memory", kCpu}, f.mlock...);
}

// Field by field, over the list (so it compares exactly what a command line carries).
bool operator==(const WorkerFlags& a, const WorkerFlags& b);

// The flags `kind` takes, without the program name: required fields always, every other one
// only where it differs from WorkerFlags{}'s default (a default travels as the absence of its
// flag, so the worker's own default applies: they are the same struct). Numbers are written in
// the shortest form that reads back to the same value.
std::vector<std::string> WorkerArgv(const WorkerFlags& flags, WorkerKind kind);

// The checks every worker makes before attaching, so a bad command line fails at once.
absl::Status ValidateWorkerFlags(const WorkerFlags& flags);

// `kind`'s options (and --help), writing into `flags` at po::notify.
inline void AddWorkerOptions(boost::program_options::options_description& opts,
                             WorkerKind kind, WorkerFlags& flags) {
  opts.add_options()("help", "show this help");
  VisitWorkerFields(
      [&](const WorkerField& field, auto& value) {
        if (field.TakenBy(kind)) AddFlagOption(opts, field.name, field.help, value, field.required());
      },
      flags);
}

// Parses args (without the program name). *help is set when --help was given (nothing else is
// then checked). Errors name the flag (an unknown one, a bad value, a missing one).
inline absl::StatusOr<WorkerFlags> ParseWorkerFlags(WorkerKind kind,
                                                    const std::vector<std::string>& args,
                                                    bool* help = nullptr) {
  namespace po = boost::program_options;
  WorkerFlags flags;
  po::options_description opts;
  AddWorkerOptions(opts, kind, flags);
  po::variables_map vm;
  try {
    // No positional arguments: a stray word (a value whose flag was dropped) is an error.
    const po::positional_options_description none;
    po::store(po::command_line_parser(args).options(opts).positional(none).run(), vm);
    if (help != nullptr) *help = vm.count("help") > 0;
    if (vm.count("help")) return flags;
    po::notify(vm);
  } catch (const po::error& e) {
    return absl::InvalidArgumentError(e.what());
  }
  if (absl::Status s = ValidateWorkerFlags(flags); !s.ok()) return s;
  return flags;
}

// The workers' main(): on --help prints usage to stdout and sets exit_code 0; on a bad command
// line prints the error to stderr and sets exit_code 2. Returns true when the worker should go on.
inline bool ParseWorkerCommandLine(WorkerKind kind, int argc, char** argv, WorkerFlags& flags,
                                   int& exit_code) {
  namespace po = boost::program_options;
  const std::vector<std::string> args(argv + (argc > 0 ? 1 : 0), argv + argc);
  bool help = false;
  absl::StatusOr<WorkerFlags> parsed = ParseWorkerFlags(kind, args, &help);
  if (help) {
    WorkerFlags shown;  // defaults, for the help text
    po::options_description opts(absl::StrCat(WorkerProgram(kind), " options"));
    AddWorkerOptions(opts, kind, shown);
    std::cout << "usage: " << WorkerProgram(kind) << " --instance NAME --model M.gguf "
              << "(--plan PLAN.gguf | --hot-fraction F) [options]\n"
              << opts << "\n";
    exit_code = 0;
    return false;
  }
  if (!parsed.ok()) {
    Log(Level::kError, "start_failed",
        {{"error", std::string(parsed.status().message())},
         {"hint", absl::StrCat(WorkerProgram(kind), " --help lists the options")}},
        WorkerLogPrefix(kind));
    exit_code = 2;
    return false;
  }
  if (absl::Status env = CheckEnvironmentSwitches(); !env.ok()) {
    Log(Level::kError, "start_failed", {{"error", std::string(env.message())}},
        WorkerLogPrefix(kind));
    exit_code = 2;
    return false;
  }
  flags = *std::move(parsed);
  return true;
}

// What both workers load from the common flags.
struct WorkerModel {
  std::unique_ptr<Model> model;
  SparsityPlan plan;
  Placement placement;
  Partition partition;
  // TEAL on attention (the gpu worker runs it); with plan.ffn (--sparsity teal: calibrated
  // cuts) each worker runs it over its FFN neurons too.
  std::optional<TealPlan> teal;
};
absl::StatusOr<WorkerModel> LoadWorkerModel(const WorkerFlags& flags);

}  // namespace thermocline::ipc
