#include "shared/ipc/worker_metrics.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "shared/ipc/futex.h"
#include "shared/util/status_macros.h"

namespace thermocline::ipc {
namespace {

// How often an unattached writer retries: often enough that a gateway which creates the
// segment after spawning its workers sees their metrics within a second, rarely enough that a
// gateway without metrics costs the workers nothing.
constexpr int64_t kRetryNs = 1'000'000'000;

// The checks every reader applies to a mapped segment before touching a block.
absl::Status ValidateLayout(const SharedSegment& segment) {
  const std::string where = absl::StrCat("/dev/shm/", segment.name());
  if (segment.size() < sizeof(WorkerMetricsLayout)) {
    return absl::DataLossError(absl::StrCat(where, ": ", segment.size(), " bytes, too small"));
  }
  const auto* l = static_cast<const WorkerMetricsLayout*>(segment.base());
  if (l->layout_bytes != sizeof(WorkerMetricsLayout) ||
      l->block_bytes != sizeof(WorkerMetricsBlock) || l->max_layers != kMaxMetricsLayers ||
      l->n_workers != kNumMetricsWorkers) {
    return absl::DataLossError(absl::StrCat(where, ": layout of ", l->layout_bytes, " bytes, blocks of ",
                                            l->block_bytes, " bytes, ", l->max_layers, " layers, ",
                                            l->n_workers, " workers; expected ",
                                            sizeof(WorkerMetricsLayout), ", ",
                                            sizeof(WorkerMetricsBlock), ", ", kMaxMetricsLayers,
                                            ", ", kNumMetricsWorkers));
  }
  return absl::OkStatus();
}

}  // namespace

int MetricsIndex(Role role) {
  switch (role) {
    case Role::kGpuWorker:
      return 0;
    case Role::kCpuWorker:
      return 1;
    default:
      return -1;
  }
}

WorkerMetricsRegion::WorkerMetricsRegion(std::unique_ptr<SharedSegment> segment)
    : segment_(std::move(segment)),
      layout_(static_cast<WorkerMetricsLayout*>(segment_->base())) {}

WorkerMetricsRegion::~WorkerMetricsRegion() = default;

absl::StatusOr<std::unique_ptr<WorkerMetricsRegion>> WorkerMetricsRegion::Create(
    std::string_view instance) {
  auto init = [](void* base) -> absl::Status {
    auto* l = static_cast<WorkerMetricsLayout*>(base);
    l->layout_bytes = sizeof(WorkerMetricsLayout);
    l->block_bytes = sizeof(WorkerMetricsBlock);
    l->max_layers = kMaxMetricsLayers;
    l->n_workers = kNumMetricsWorkers;
    return absl::OkStatus();  // the counters start at zero: the segment comes zeroed
  };
  TC_ASSIGN_OR_RETURN(std::unique_ptr<SharedSegment> segment,
                      SharedSegment::Create(instance, kWorkerMetricsSegment,
                                            sizeof(WorkerMetricsLayout),
                                            kWorkerMetricsLayoutVersion, init));
  return std::unique_ptr<WorkerMetricsRegion>(new WorkerMetricsRegion(std::move(segment)));
}

absl::StatusOr<std::unique_ptr<WorkerMetricsRegion>> WorkerMetricsRegion::Attach(
    std::string_view instance) {
  TC_ASSIGN_OR_RETURN(std::unique_ptr<SharedSegment> segment,
                      SharedSegment::Attach(instance, kWorkerMetricsSegment,
                                            kWorkerMetricsLayoutVersion));
  TC_RETURN_IF_ERROR(ValidateLayout(*segment));
  return std::unique_ptr<WorkerMetricsRegion>(new WorkerMetricsRegion(std::move(segment)));
}

absl::StatusOr<WorkerMetricsSnapshot> WorkerMetricsRegion::Read(Role role) const {
  const int index = MetricsIndex(role);
  if (index < 0) return absl::InvalidArgumentError("only the workers have metrics blocks");
  const WorkerMetricsBlock& b = layout_->workers[index];
  constexpr auto r = std::memory_order_relaxed;
  WorkerMetricsSnapshot s;
  s.steps = b.steps.load(r);
  s.activations = b.activations.load(r);
  s.rows = b.rows.load(r);
  s.active_neurons = b.active_neurons.load(r);
  s.candidate_neurons = b.candidate_neurons.load(r);
  s.capacity_neurons = b.capacity_neurons.load(r);
  s.ring_wait_ns = b.ring_wait_ns.load(r);
  s.ring_waits = b.ring_waits.load(r);
  s.recall_samples = b.recall_samples.load(r);
  s.recall_true_positive = b.recall_true_positive.load(r);
  s.recall_false_negative = b.recall_false_negative.load(r);
  s.layer_overflow_ns = b.layer_overflow_ns.load(r);
  s.pid = b.pid.load(r);
  // Written by another process: a layer count beyond the block would read past it.
  const uint32_t n = b.n_layers.load(r);
  if (n > kMaxMetricsLayers) {
    return absl::DataLossError(absl::StrCat(segment_->name(), ": ", absl::string_view(RoleName(role).data(), RoleName(role).size()), " reports ",
                                            n, " layers, more than ", kMaxMetricsLayers));
  }
  s.layer_ns.resize(n);
  for (uint32_t i = 0; i < n; ++i) s.layer_ns[i] = b.layer_ns[i].load(r);
  return s;
}

WorkerMetricsWriter::WorkerMetricsWriter(std::string instance, Role role, int64_t n_layers,
                                         std::function<void(const std::string&)> log)
    : instance_(std::move(instance)), role_(role), n_layers_(n_layers), log_(std::move(log)) {}

WorkerMetricsWriter::~WorkerMetricsWriter() = default;

bool WorkerMetricsWriter::MaybeAttach() {
  if (block_ != nullptr) return true;
  if (instance_.empty() || MetricsIndex(role_) < 0) return false;
  const int64_t now = MonotonicNs();
  if (tried_ && now - last_try_ns_ < kRetryNs) return false;
  last_try_ns_ = now;
  absl::StatusOr<std::unique_ptr<SharedSegment>> segment =
      SharedSegment::Attach(instance_, kWorkerMetricsSegment, kWorkerMetricsLayoutVersion);
  absl::Status s = segment.status();
  if (s.ok()) s = ValidateLayout(**segment);
  if (!s.ok()) {
    // Metrics are optional: the worker serves without them, and says so once.
    if (!tried_ && log_) {
      log_(absl::StrCat("metrics: not reporting yet (", s.message(),
                        "); retrying every second, serving meanwhile"));
    }
    tried_ = true;
    return false;
  }
  tried_ = true;
  segment_ = std::move(*segment);
  auto* layout = static_cast<WorkerMetricsLayout*>(segment_->base());
  block_ = &layout->workers[MetricsIndex(role_)];
  const uint32_t n = static_cast<uint32_t>(std::min<int64_t>(n_layers_, kMaxMetricsLayers));
  // A restarted worker keeps adding to its predecessor's sums; only the shape and pid change.
  block_->n_layers.store(n, std::memory_order_relaxed);
  block_->pid.store(SelfIdentity().pid, std::memory_order_relaxed);
  if (log_) log_(absl::StrCat("metrics: reporting to /dev/shm/", segment_->name()));
  return true;
}

void WorkerMetricsWriter::AddLayerNs(int64_t layer, uint64_t ns) {
  if (block_ == nullptr || layer < 0) return;
  if (layer < kMaxMetricsLayers) {
    block_->layer_ns[layer].fetch_add(ns, std::memory_order_relaxed);
  } else {
    block_->layer_overflow_ns.fetch_add(ns, std::memory_order_relaxed);
  }
}

}  // namespace thermocline::ipc
