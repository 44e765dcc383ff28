#include "shared/driver/default_placement.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "shared/driver/split_engine.h"
#include "shared/driver/worker_process.h"
#include "shared/gguf/gguf.h"
#include "shared/ipc/worker_flags.h"
#include "shared/model/model.h"
#include "shared/sparsity/activation_stats.h"
#include "shared/sparsity/placement.h"
#include "shared/sparsity/planner.h"
#include "shared/util/logfmt.h"
#include "shared/util/status_macros.h"

namespace thermocline::driver {
namespace {

// CUDA's first initialisation on a large device can take seconds; a probe that says nothing for
// this long is not going to.
constexpr auto kProbeTimeout = std::chrono::seconds(60);

// Of the free memory the probe saw, what is kept back: another process may allocate between
// the probe and the worker's start, and the worker's own context and libraries take some that
// the plan's scratch reserve does not cover.
int64_t Reserve(int64_t free_bytes) {
  return std::max<int64_t>(int64_t{256} << 20, free_bytes / 20);
}

// No statistics: nothing says which neurons fire, so every layer gets the same share, by bytes.
// Worth falls slowly with the id (1 down to 0.5) so that the planner, which takes the best
// value per byte first, goes round the layers one slice at a time (equal worth everywhere would
// fill one layer before the next) and takes the lowest ids first, as --hot-fraction does
// without statistics.
ActivationStats UniformStats(const ModelConfig& c) {
  ActivationStats s;
  s.dim = c.dim;
  s.ffn_dim = c.ffn_dim;
  s.n_experts = c.n_experts;
  s.layers.resize(c.n_layers);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerActivationStats& layer = s.layers[l];
    const int64_t n = LayerNeurons(c, l);
    layer.frequency.resize(n);
    for (int64_t i = 0; i < n; ++i) {
      layer.frequency[i] = 1.0f - 0.5f * static_cast<float>(i) / static_cast<float>(n);
    }
    if (c.layers[l].moe) {
      layer.experts = c.n_experts;
      layer.expert_share.assign(c.n_experts, 1.0f / static_cast<float>(c.n_experts));
    }
  }
  return s;
}

}  // namespace

absl::StatusOr<DeviceMemory> ParseDeviceMemoryLine(const std::string& line) {
  auto fields = ParseLogfmtLine(line);
  if (!fields.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat("not a logfmt line: '", line, "'"));
  }
  DeviceMemory m;
  bool event = false, have_free = false, have_total = false;
  for (const auto& [key, value] : *fields) {
    if (key == "event") event = value == "device_memory";
    if (key == "name") m.name = value;
    if (key == "device" && !absl::SimpleAtoi(value, &m.device)) {
      return absl::InvalidArgumentError(absl::StrCat("device=", value, " is not a number"));
    }
    if (key == "free_bytes") {
      have_free = absl::SimpleAtoi(value, &m.free_bytes) && m.free_bytes >= 0;
      if (!have_free) return absl::InvalidArgumentError("free_bytes=" + value + " is not a size");
    }
    if (key == "total_bytes") {
      have_total = absl::SimpleAtoi(value, &m.total_bytes) && m.total_bytes >= 0;
      if (!have_total) return absl::InvalidArgumentError("total_bytes=" + value + " is not a size");
    }
  }
  if (!event) return absl::InvalidArgumentError("not a device_memory event: '" + line + "'");
  if (!have_free || !have_total) {
    return absl::InvalidArgumentError("a device_memory line without free_bytes and total_bytes: '" +
                                      line + "'");
  }
  if (m.free_bytes > m.total_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("free_bytes ", m.free_bytes,
                                                   " exceeds total_bytes ", m.total_bytes));
  }
  return m;
}

absl::StatusOr<DeviceMemory> ProbeDeviceMemory(const std::string& gpu_worker_path) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  SpawnOptions spawn;
  spawn.output_fd = fds[1];
  absl::StatusOr<std::unique_ptr<WorkerProcess>> child =
      WorkerProcess::Spawn({gpu_worker_path, "--device-memory"}, spawn);
  close(fds[1]);
  if (!child.ok()) {
    close(fds[0]);
    return child.status();
  }
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + kProbeTimeout;
  bool timed_out = false;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int r = poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      timed_out = r == 0;
      break;
    }
    char buf[4096];
    const ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: the worker closed its output
    // A probe prints a line or two; a worker that floods is not answering the question.
    if (out.size() < (1 << 16)) out.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  if (timed_out) {
    (*child)->KillAndReap();
    return absl::DeadlineExceededError(absl::StrCat(
        gpu_worker_path, " --device-memory said nothing for ",
        std::chrono::duration_cast<std::chrono::seconds>(kProbeTimeout).count(), " s"));
  }
  (*child)->WaitExit(absl::Seconds(10));
  std::string error;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    absl::StatusOr<DeviceMemory> m = ParseDeviceMemoryLine(std::string(line));
    if (m.ok()) return m;
    if (auto fields = ParseLogfmtLine(std::string(line)); fields.has_value()) {
      for (const auto& [key, value] : *fields) {
        if (key == "error") error = value;
      }
    }
  }
  if (error.empty()) error = out.empty() ? "(no output)" : out;
  return absl::UnavailableError(absl::StrCat(gpu_worker_path, " --device-memory ",
                                             (*child)->ExitDescription(), ": ", error));
}

absl::StatusOr<DefaultPlacement> ChooseDefaultPlacement(const DefaultPlacementOptions& o) {
  DefaultPlacement d;
  if (o.gpu_backend == "host") {
    d.hot_fraction = 1.0;
    d.gpu_ffn_share = 1.0;
    d.why = "host backend: the gpu worker computes on this machine's CPU too, so the whole FFN "
            "stays with it";
    return d;
  }
  if (o.vram_budget > 0) {
    d.budget = o.vram_budget;
    d.budget_source = "--vram-budget";
  } else {
    TC_ASSIGN_OR_RETURN(const std::string bindir,
                        o.bindir.empty() ? SelfBinDir() : absl::StatusOr<std::string>(o.bindir));
    absl::StatusOr<DeviceMemory> m =
        ProbeDeviceMemory(bindir + "/" + ipc::WorkerProgram(ipc::WorkerKind::kGpu));
    if (!m.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--backend ", o.gpu_backend, " without --plan or --hot-fraction plans from the "
          "device's free memory, which could not be read: ", m.status().message(),
          ". Give --vram-budget, --plan or --hot-fraction"));
    }
    d.budget = m->free_bytes - Reserve(m->free_bytes);
    d.budget_source = absl::StrCat("device free memory (", m->name, ": ", FormatBytes(m->free_bytes),
                                   " free of ", FormatBytes(m->total_bytes), ", ",
                                   FormatBytes(Reserve(m->free_bytes)), " kept back)");
    if (d.budget <= 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("--backend ", o.gpu_backend, ": the device has ",
                       FormatBytes(m->free_bytes), " free, nothing to plan for"));
    }
  }

  // Mapped, not read: the planner looks at tensor types and shapes only.
  TC_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Load(o.model_path, TensorCheck::kOff));
  const ModelConfig& config = model->config();
  ActivationStats stats;
  if (!o.stats_path.empty()) {
    absl::StatusOr<ActivationStats> read = ReadActivationStats(o.stats_path, &config);
    if (!read.ok()) return absl::InvalidArgumentError(absl::StrCat("--stats: ", read.status().message()));
    stats = std::move(*read);
    d.ranked_by_stats = true;
  } else {
    stats = UniformStats(config);
  }
  PlannerOptions po;
  po.vram_budget = d.budget;
  po.context = o.context;
  po.kv_slots = o.kv_slots;
  po.kv_type = o.kv_type;
  if (!o.predictor_path.empty()) {
    TC_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(o.predictor_path));
    TC_ASSIGN_OR_RETURN(po.predictor_bytes, PredictorBytes(*file, config));
  } else {
    TC_ASSIGN_OR_RETURN(po.predictor_bytes, PredictorBytes(model->file(), config));
  }
  absl::StatusOr<Plan> plan = PlanPlacement(*model, stats, po);
  if (!plan.ok()) {
    return absl::Status(plan.status().code(),
                        absl::StrCat("planning for ", FormatBytes(d.budget), " from ",
                                     d.budget_source, ": ", plan.status().message()));
  }
  d.plan_path = o.plan_path;
  if (d.plan_path.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string dir = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                                   "/thermocline-plan-XXXXXX");
    if (mkdtemp(dir.data()) == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot make a directory for the placement (", dir, "): ", std::strerror(errno)));
    }
    d.plan_dir = dir;
    d.plan_path = dir + "/plan.gpuidx";
  }
  if (absl::Status s = WritePlacement(plan->placement, d.plan_path); !s.ok()) {
    RemoveDefaultPlan(d);
    return s;
  }
  d.gpu_ffn_share = plan->ffn_bytes > 0 ? static_cast<double>(plan->gpu_ffn_bytes) /
                                              static_cast<double>(plan->ffn_bytes)
                                        : 0.0;
  d.why = absl::StrCat(
      "planned for ", FormatBytes(d.budget), " from ", d.budget_source, "; ",
      d.ranked_by_stats ? "neurons ranked by --stats"
                        : "no --stats, so every neuron counts the same (`thermocline profile` "
                          "and --stats put the hottest ones on the device)");
  return d;
}

void RemoveDefaultPlan(const DefaultPlacement& placement) {
  if (placement.plan_dir.empty()) return;
  unlink(placement.plan_path.c_str());
  rmdir(placement.plan_dir.c_str());
}

}  // namespace thermocline::driver
