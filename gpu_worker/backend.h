// The GPU worker's compute backend: everything dense (embeddings, attention and its KV cache,
// norms, predictors, the hot FFN neurons, the output head). The worker loop owns the rings;
// the backend owns weights, KV cache and compute, and reaches the CPU worker only through the
// ColdLink it is handed for each step.
//
// The interface is shaped for a device backend: a step is started (StartStep may only enqueue
// work on a stream) and finished (FinishStep waits); per layer the backend copies h to host
// memory, calls SendCold as soon as it is there, keeps computing the hot neurons, then calls
// ReceiveCold (blocking) and merges y_cold on its side. The host backend (host/) does all of
// this on CPU threads.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "shared/ipc/worker_metrics.h"
#include "shared/runtime/forward.h"

namespace thermocline::gpu_worker {

// One layer's request for the cold neurons, in host memory valid for the SendCold call.
struct ColdRequest {
  int64_t layer = 0;
  int64_t rows = 0;
  int64_t dim = 0;
  std::span<const float> h;  // [rows][dim], the ffn_norm output
  // Every cold neuron of the layer for every row (dense, exact and threshold layers); else row
  // r's candidates are ids[row_end[r-1] .. row_end[r]), global neuron ids, ascending, cold.
  bool all_cold = false;
  std::span<const uint32_t> row_end;
  std::span<const int32_t> ids;
  // Mixture-of-experts layers: the router's picks, computed once on this side. Row r uses
  // experts[r * picks + j] weighted by expert_weights[r * picks + j]; the CPU worker returns the
  // weighted sum of those experts' cold neurons. picks = 0 in other layers.
  int64_t picks = 0;
  std::span<const int32_t> experts;
  std::span<const float> expert_weights;
  // TEAL (only with all_cold, no picks): row r's input cuts of gate, up and down at
  // cuts[r * kTealCutsPerRow ..] (all 0: the row without TEAL); empty: no row has any.
  std::span<const float> cuts;
  static constexpr int kTealCutsPerRow = 3;
};

class ColdLink {
 public:
  virtual ~ColdLink() = default;
  // Hands the layer's h and candidates to the CPU worker; returns without waiting for it.
  virtual absl::Status SendCold(const ColdRequest& request) = 0;
  // Blocks until the CPU worker's partial sum of `layer` arrives and writes it to y_cold
  // ([rows][dim] of the matching SendCold). Unavailable when the CPU worker died or the epoch
  // moved on; the step is then abandoned.
  virtual absl::Status ReceiveCold(int64_t layer, std::span<float> y_cold) = 0;
};

// Shapes the worker loop validates Steps against (StepLimits).
struct BackendLimits {
  int32_t n_kv_slots = 0;
  int32_t context = 0;  // positions per slot
  int32_t max_batch = 0;
  int32_t vocab = 0;
  // A paged KV cache (the prefix cache): blocks in the pool and at most per slot table. 0: the
  // backend keeps a contiguous cache, and a Step with KV tables is refused when decoded.
  int32_t n_kv_blocks = 0;
  int32_t blocks_per_slot = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual const BackendLimits& limits() const = 0;

  // Starts one step over `batch` (positions follow ForwardPass::Run's rules: at most the slot's
  // length; equal appends, smaller rewinds). `cold` serves every layer's cold round trip until
  // FinishStep returns. An error here means nothing was started.
  virtual absl::Status StartStep(std::span<const BatchEntry> batch, ColdLink& cold) = 0;
  // Before a step's entries: the KV block copies and slot tables its Step carried (ids already
  // checked against limits()). Only a backend with n_kv_blocks > 0 gets them.
  virtual absl::Status MapKv(std::span<const KvSlotTable> /*tables*/,
                             std::span<const KvBlockCopy> /*copies*/) {
    return absl::FailedPreconditionError(
        "this backend keeps a contiguous KV cache: run with --prefix-cache-blocks 0");
  }
  // Waits for the started step. On success `logits` holds vocab floats per want_logits entry,
  // in batch order. On error the step is abandoned: KV rows it wrote hold garbage until a
  // retry at the same positions overwrites them.
  virtual absl::Status FinishStep(std::vector<float>* logits) = 0;
  // Where per-layer times, neuron counts, cold waits and recall samples go (docs/metrics.md);
  // null: nowhere. The writer outlives every later step.
  virtual void SetMetrics(ipc::WorkerMetricsWriter* metrics) = 0;
};

}  // namespace thermocline::gpu_worker
