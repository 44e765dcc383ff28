#include "shared/ipc/worker_flags.h"

#include <charconv>
#include <type_traits>
#include <utility>

#include "shared/sparsity/sparsity_setup.h"
#include "shared/util/status_macros.h"

namespace thermocline::ipc {
namespace {

// The text of a value as its flag carries it; nullopt: the flag is absent. Floating point in
// the shortest form that reads back to the same value, so a command line typed that way (0.5,
// 0.2) is emitted unchanged.
template <class T>
std::optional<std::string> FlagText(const T& v) {
  if constexpr (std::is_same_v<T, std::string>) {
    return v;
  } else if constexpr (std::is_same_v<T, bool>) {
    return v ? std::optional<std::string>("") : std::nullopt;
  } else if constexpr (std::is_floating_point_v<T>) {
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    return std::string(buf, r.ptr);
  } else {
    static_assert(std::is_integral_v<T>);
    return absl::StrCat(v);
  }
}
template <class T>
std::optional<std::string> FlagText(const std::optional<T>& v) {
  return v.has_value() ? FlagText(*v) : std::nullopt;
}

}  // namespace

const char* WorkerProgram(WorkerKind kind) {
  return kind == WorkerKind::kGpu ? "thermocline-gpu-worker" : "thermocline-cpu-worker";
}
const char* WorkerLogPrefix(WorkerKind kind) {
  return kind == WorkerKind::kGpu ? "gpu_worker" : "cpu_worker";
}

bool operator==(const WorkerFlags& a, const WorkerFlags& b) {
  bool equal = true;
  VisitWorkerFields([&equal](const WorkerField&, const auto& x, const auto& y) {
    equal = equal && x == y;
  }, a, b);
  return equal;
}

std::vector<std::string> WorkerArgv(const WorkerFlags& flags, WorkerKind kind) {
  const WorkerFlags defaults;
  std::vector<std::string> argv;
  VisitWorkerFields(
      [&](const WorkerField& field, const auto& value, const auto& default_value) {
        if (!field.TakenBy(kind)) return;
        if (!field.required() && value == default_value) return;
        const std::optional<std::string> text = FlagText(value);
        if (!text.has_value()) return;
        argv.push_back(absl::StrCat("--", field.name));
        // A switch is its name alone.
        if constexpr (!std::is_same_v<std::decay_t<decltype(value)>, bool>) argv.push_back(*text);
      },
      flags, defaults);
  return argv;
}

absl::Status ValidateWorkerFlags(const WorkerFlags& f) {
  if (f.instance.empty()) return absl::InvalidArgumentError("--instance must not be empty");
  if (f.model_path.empty()) return absl::InvalidArgumentError("--model must not be empty");
  if (f.plan_path.empty() == !f.hot_fraction.has_value()) {
    return absl::InvalidArgumentError("give exactly one of --plan PLAN.gguf and --hot-fraction F");
  }
  if (f.threads < 1) return absl::InvalidArgumentError("--threads must be >= 1");
  if (f.numa_node.has_value() && *f.numa_node < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--numa-node ", *f.numa_node, " must be >= 0"));
  }
  return absl::OkStatus();
}

absl::StatusOr<WorkerModel> LoadWorkerModel(const WorkerFlags& flags) {
  WorkerModel w;
  TC_ASSIGN_OR_RETURN(const TensorCheck check, TensorCheckFromName(flags.check_tensors));
  TC_ASSIGN_OR_RETURN(w.model, Model::Load(flags.model_path, check));
  TC_ASSIGN_OR_RETURN(SparsitySetup setup,
                      SparsitySetupFromFlags(*w.model, flags.sparsity, flags.teal));
  TC_RETURN_IF_ERROR(CheckSplitTealPlan(setup.teal));
  w.plan = std::move(setup.ffn);
  w.teal = std::move(setup.teal);
  TC_ASSIGN_OR_RETURN(w.placement, PlacementFromFlags(w.model->config(), flags.placement()));
  TC_ASSIGN_OR_RETURN(w.partition, Partition::FromPlacement(w.placement, w.model->config()));
  return w;
}

}  // namespace thermocline::ipc
