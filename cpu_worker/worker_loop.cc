#include "cpu_worker/worker_loop.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "shared/ipc/futex.h"
#include "shared/ipc/messages.h"
#include "shared/ipc/worker_metrics.h"
#include "shared/sparsity/placement.h"
#include "shared/util/status_macros.h"

namespace thermocline::cpu_worker {
namespace {


// How long one idle wait lasts before the stop conditions are checked again (<= 200 ms).
constexpr absl::Duration kIdleSlice = absl::Milliseconds(100);

// Sends with waits of one slice at a time, so that a GPU worker that stopped reading cannot
// keep this one from noticing a stop request. OK when stopping instead. The time spent here is
// this side's ring wait (the gpu->cpu ring's idle time is not: it only says no work came).
template <typename SendFn>
absl::Status SendPatiently(ipc::WorkerSession& session, ipc::WorkerMetricsWriter& metrics,
                           SendFn send) {
  const int64_t start = ipc::MonotonicNs();
  absl::Status s;
  while (true) {
    // Waiting for the gpu worker to read is not a hang of this one.
    session.Progress();
    s = send(kIdleSlice);
    if (!absl::IsDeadlineExceeded(s)) break;
    if (!session.StopReason().empty()) {
      s = absl::OkStatus();
      break;
    }
  }
  metrics.AddRingWait(static_cast<uint64_t>(std::max<int64_t>(0, ipc::MonotonicNs() - start)));
  return s;
}

}  // namespace

absl::Status RunCpuWorker(ipc::WorkerSession& session, ColdExecutor& executor,
                          const ModelConfig& config) {
  ipc::Transport& t = session.transport();
  TC_ASSIGN_OR_RETURN(ipc::RingConsumer from_gpu, t.Consumer(ipc::RingId::kGpuToCpu));
  TC_ASSIGN_OR_RETURN(ipc::RingProducer to_gpu, t.Producer(ipc::RingId::kCpuToGpu));
  // The GPU worker's batch limit is not known here; the ring bounds what can arrive.
  const uint64_t row_bytes = static_cast<uint64_t>(config.dim) * sizeof(float);
  int64_t max_neurons = 0;
  for (int64_t l = 0; l < config.n_layers; ++l) {
    max_neurons = std::max(max_neurons, LayerNeurons(config, l));
  }
  const ipc::ActivationLimits limits{
      static_cast<uint32_t>(config.dim),
      static_cast<uint32_t>(std::min<uint64_t>(from_gpu.capacity() / 2 / row_bytes, UINT32_MAX)),
      static_cast<uint32_t>(config.n_layers), static_cast<int32_t>(max_neurons),
      static_cast<uint32_t>(config.n_experts), static_cast<uint32_t>(config.n_experts_used)};
  std::vector<float> y;
  // Metrics are optional: without the gateway's segment the writer drops everything.
  ipc::WorkerMetricsWriter metrics(t.instance(), ipc::Role::kCpuWorker, config.n_layers,
                                   session.LineLogger("metrics"));
  metrics.MaybeAttach();
  uint64_t last_step = 0;
  bool any_step = false;
  session.SetReady();
  session.Log(Level::kInfo, "ready", {{"epoch", static_cast<unsigned long long>(t.epoch())}});
  while (true) {
    session.Progress();
    if (std::string why = session.StopReason(); !why.empty()) {
      session.Log(Level::kInfo, "stopping", {{"reason", why}});
      return absl::OkStatus();
    }
    absl::StatusOr<ipc::MessageView> m = from_gpu.Peek(kIdleSlice);
    if (!m.ok()) {
      if (absl::IsDeadlineExceeded(m.status())) continue;
      return m.status();
    }
    const ipc::MessageHeader header = m->header;
    // Replies carry the epoch of the request they answer.
    to_gpu.set_epoch(header.epoch);
    if (m->kind() == ipc::MessageKind::kShutdown) {
      TC_RETURN_IF_ERROR(from_gpu.Release());
      session.Log(Level::kInfo, "shutdown");
      return absl::OkStatus();
    }
    if (m->kind() != ipc::MessageKind::kActivation) {
      session.Log(Level::kWarn, "message_ignored",
                  {{"kind", ipc::MessageKindName(m->kind())}, {"from", "gpu_worker"}});
      TC_RETURN_IF_ERROR(from_gpu.Release());
      continue;
    }
    absl::StatusOr<ipc::ActivationView> a = ipc::DecodeActivation(*m, limits);
    absl::Status s = a.status();
    if (s.ok()) {
      y.resize(static_cast<size_t>(a->rows) * a->dim);
      metrics.MaybeAttach();
      const int64_t start = ipc::MonotonicNs();
      // Computed straight from h in the ring (no copy); released after.
      s = executor.Compute(*a, y);
      if (s.ok()) {
        metrics.AddLayerNs(a->layer,
                           static_cast<uint64_t>(std::max<int64_t>(0, ipc::MonotonicNs() - start)));
        metrics.AddActivation();
        // A step's Activations arrive in layer order; a new step id starts a new step.
        if (!any_step || header.step_id != last_step) metrics.AddStep(a->rows);
        any_step = true;
        last_step = header.step_id;
        const uint64_t n_cold =
            static_cast<uint64_t>(executor.ColdNeurons(static_cast<int64_t>(a->layer)));
        const uint64_t capacity = n_cold * a->rows;
        metrics.AddNeurons(static_cast<uint64_t>(executor.last_active()),
                           static_cast<uint64_t>(executor.last_candidates()), capacity);
      }
    }
    TC_RETURN_IF_ERROR(from_gpu.Release());
    if (!s.ok()) {
      session.Log(Level::kWarn, "activation_rejected",
                  {{"step", static_cast<unsigned long long>(header.step_id)},
                   {"layer", static_cast<unsigned long long>(header.layer)},
                   {"error", std::string(s.message())}});
      TC_RETURN_IF_ERROR(SendPatiently(session, metrics, [&](absl::Duration timeout) {
        return ipc::SendError(to_gpu, header.step_id, s, timeout);
      }));
      continue;
    }
    TC_RETURN_IF_ERROR(SendPatiently(session, metrics, [&](absl::Duration timeout) {
      return ipc::SendPartial(to_gpu, header.step_id, header.layer, a->rows, a->dim, y, timeout);
    }));
  }
}

}  // namespace thermocline::cpu_worker
