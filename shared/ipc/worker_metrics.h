// The workers' metrics: one shared-memory segment per instance, `thermocline-<instance>-metrics`
// (docs/metrics.md). The gateway creates it (mode 0600, removed with the instance) and turns it
// into Prometheus metrics at scrape time; each worker attaches and adds to its own block with
// relaxed atomics, a handful per step and layer, so reporting costs nothing measurable and never
// blocks. A separate segment (rather than more fields in the transport's control block) keeps
// the transport's layout and tests untouched and lets metrics change version on their own.
//
// Every counter is cumulative over the instance's life: a restarted worker attaches to the same
// block and keeps adding, so Prometheus counters never go backwards. Nothing a reader gets from
// the segment is trusted: the layout version, block sizes and the layer count are checked.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shared/ipc/segment.h"
#include "shared/ipc/transport.h"

namespace thermocline::ipc {

// Bump whenever anything after the SegmentPreamble changes.
inline constexpr uint32_t kWorkerMetricsLayoutVersion = 1;
inline constexpr char kWorkerMetricsSegment[] = "metrics";
// Per-layer slots in each block; deeper models report their first kMaxMetricsLayers layers
// and count the rest in layer_overflow_ns (reported, not lost).
inline constexpr int kMaxMetricsLayers = 256;
// The two reporting processes: the gpu worker (index 0) and the cpu worker (index 1).
inline constexpr int kNumMetricsWorkers = 2;

// One worker's counters. Everything is a cumulative sum except n_layers and pid.
struct alignas(64) WorkerMetricsBlock {
  std::atomic<uint64_t> steps;             // gpu: Steps served; cpu: distinct steps seen
  std::atomic<uint64_t> activations;       // gpu: Activations sent; cpu: Activations answered
  std::atomic<uint64_t> rows;              // token rows computed (sum over steps)
  std::atomic<uint64_t> active_neurons;    // FFN neurons of this side that ran (summed over rows)
  std::atomic<uint64_t> candidate_neurons; // neurons this side was asked to consider
  std::atomic<uint64_t> capacity_neurons;  // rows x neurons this side holds, for the ratios
  std::atomic<uint64_t> ring_wait_ns;      // see docs/metrics.md for what each side waits on
  std::atomic<uint64_t> ring_waits;
  std::atomic<uint64_t> recall_samples;         // gpu: sampled (row, layer) pairs
  std::atomic<uint64_t> recall_true_positive;   // truly active hot neurons the predictor picked
  std::atomic<uint64_t> recall_false_negative;  // truly active hot neurons it missed
  std::atomic<uint64_t> layer_overflow_ns;      // layers >= kMaxMetricsLayers
  std::atomic<uint32_t> n_layers;               // layers this worker reports (<= kMax...)
  std::atomic<int32_t> pid;                     // the last process that attached
  std::atomic<uint64_t> layer_ns[kMaxMetricsLayers];  // cumulative time per layer
};

struct WorkerMetricsLayout {
  SegmentPreamble preamble;
  alignas(64) uint32_t layout_bytes;  // sizeof(WorkerMetricsLayout)
  uint32_t block_bytes;               // sizeof(WorkerMetricsBlock)
  uint32_t max_layers;                // kMaxMetricsLayers
  uint32_t n_workers;                 // kNumMetricsWorkers
  WorkerMetricsBlock workers[kNumMetricsWorkers];
};
static_assert(sizeof(WorkerMetricsLayout) % 64 == 0);

// The block index of a worker role (kGpuWorker -> 0, kCpuWorker -> 1); -1 for the gateway.
int MetricsIndex(Role role);

// A consistent-enough copy of one block (each field is read atomically; fields are not read
// as one transaction, which sums that only grow make harmless).
struct WorkerMetricsSnapshot {
  uint64_t steps = 0, activations = 0, rows = 0;
  uint64_t active_neurons = 0, candidate_neurons = 0, capacity_neurons = 0;
  uint64_t ring_wait_ns = 0, ring_waits = 0;
  uint64_t recall_samples = 0, recall_true_positive = 0, recall_false_negative = 0;
  uint64_t layer_overflow_ns = 0;
  int32_t pid = 0;
  std::vector<uint64_t> layer_ns;  // [n_layers]
};

// Gateway side: creates (or replaces a stale) metrics segment and reads it.
class WorkerMetricsRegion {
 public:
  static absl::StatusOr<std::unique_ptr<WorkerMetricsRegion>> Create(std::string_view instance);
  // Read-only use from another process than the creator (tools, tests).
  static absl::StatusOr<std::unique_ptr<WorkerMetricsRegion>> Attach(std::string_view instance);
  // Removes the segment (when created here).
  ~WorkerMetricsRegion();

  const std::string& segment_name() const { return segment_->name(); }
  // The block of `role` (a worker role); InvalidArgument for the gateway, DataLoss when the
  // block's layer count is out of range.
  absl::StatusOr<WorkerMetricsSnapshot> Read(Role role) const;

 private:
  explicit WorkerMetricsRegion(std::unique_ptr<SharedSegment> segment);
  std::unique_ptr<SharedSegment> segment_;
  WorkerMetricsLayout* layout_ = nullptr;
};

// Worker side. Cheap to call on every step: while unattached, Attach retries at most once a
// second (the gateway may create the segment after it spawned the worker); the first failure
// is reported through `log` once. Every Add* is a no-op while unattached.
class WorkerMetricsWriter {
 public:
  WorkerMetricsWriter() = default;
  WorkerMetricsWriter(std::string instance, Role role, int64_t n_layers,
                      std::function<void(const std::string&)> log);
  ~WorkerMetricsWriter();
  WorkerMetricsWriter(const WorkerMetricsWriter&) = delete;
  WorkerMetricsWriter& operator=(const WorkerMetricsWriter&) = delete;

  // Tries to attach when not attached and the last try is a second old. Returns attached().
  bool MaybeAttach();
  bool attached() const { return block_ != nullptr; }

  void AddStep(uint64_t rows) {
    if (block_ == nullptr) return;
    block_->steps.fetch_add(1, std::memory_order_relaxed);
    block_->rows.fetch_add(rows, std::memory_order_relaxed);
  }
  void AddActivation() {
    if (block_ != nullptr) block_->activations.fetch_add(1, std::memory_order_relaxed);
  }
  void AddLayerNs(int64_t layer, uint64_t ns);
  void AddNeurons(uint64_t active, uint64_t candidates, uint64_t capacity) {
    if (block_ == nullptr) return;
    block_->active_neurons.fetch_add(active, std::memory_order_relaxed);
    block_->candidate_neurons.fetch_add(candidates, std::memory_order_relaxed);
    block_->capacity_neurons.fetch_add(capacity, std::memory_order_relaxed);
  }
  void AddRingWait(uint64_t ns) {
    if (block_ == nullptr) return;
    block_->ring_wait_ns.fetch_add(ns, std::memory_order_relaxed);
    block_->ring_waits.fetch_add(1, std::memory_order_relaxed);
  }
  void AddRecall(uint64_t samples, uint64_t true_positive, uint64_t false_negative) {
    if (block_ == nullptr) return;
    block_->recall_samples.fetch_add(samples, std::memory_order_relaxed);
    block_->recall_true_positive.fetch_add(true_positive, std::memory_order_relaxed);
    block_->recall_false_negative.fetch_add(false_negative, std::memory_order_relaxed);
  }

 private:
  std::string instance_;
  Role role_ = Role::kGpuWorker;
  int64_t n_layers_ = 0;
  std::function<void(const std::string&)> log_;
  std::unique_ptr<SharedSegment> segment_;
  WorkerMetricsBlock* block_ = nullptr;
  int64_t last_try_ns_ = 0;
  bool tried_ = false;
};

}  // namespace thermocline::ipc
