#include "cpu_worker/worker_loop.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "shared/ipc/messages.h"
#include "shared/util/status_macros.h"

namespace thermocline::cpu_worker {
namespace {

absl::string_view Av(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// How long one idle wait lasts before the stop conditions are checked again (<= 200 ms).
constexpr absl::Duration kIdleSlice = absl::Milliseconds(100);

// Sends with waits of one slice at a time, so that a GPU worker that stopped reading cannot
// keep this one from noticing a stop request. OK when stopping instead.
template <typename SendFn>
absl::Status SendPatiently(ipc::WorkerSession& session, SendFn send) {
  while (true) {
    absl::Status s = send(kIdleSlice);
    if (!absl::IsDeadlineExceeded(s)) return s;
    if (!session.StopReason().empty()) return absl::OkStatus();
  }
}

}  // namespace

absl::Status RunCpuWorker(ipc::WorkerSession& session, ColdExecutor& executor,
                          const LlamaConfig& config) {
  ipc::Transport& t = session.transport();
  TC_ASSIGN_OR_RETURN(ipc::RingConsumer from_gpu, t.Consumer(ipc::RingId::kGpuToCpu));
  TC_ASSIGN_OR_RETURN(ipc::RingProducer to_gpu, t.Producer(ipc::RingId::kCpuToGpu));
  // The GPU worker's batch limit is not known here; the ring bounds what can arrive.
  const uint64_t row_bytes = static_cast<uint64_t>(config.dim) * sizeof(float);
  const ipc::ActivationLimits limits{
      static_cast<uint32_t>(config.dim),
      static_cast<uint32_t>(std::min<uint64_t>(from_gpu.capacity() / 2 / row_bytes, UINT32_MAX)),
      static_cast<uint32_t>(config.n_layers), static_cast<int32_t>(config.ffn_dim)};
  std::vector<float> y;
  session.SetReady();
  session.Log(absl::StrCat("ready, epoch ", t.epoch()));
  while (true) {
    if (std::string why = session.StopReason(); !why.empty()) {
      session.Log(absl::StrCat("stopping: ", why));
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
      session.Log("shutdown requested");
      return absl::OkStatus();
    }
    if (m->kind() != ipc::MessageKind::kActivation) {
      session.Log(absl::StrCat("ignoring a ", Av(ipc::MessageKindName(m->kind())),
                               " message from the gpu worker"));
      TC_RETURN_IF_ERROR(from_gpu.Release());
      continue;
    }
    absl::StatusOr<ipc::ActivationView> a = ipc::DecodeActivation(*m, limits);
    absl::Status s = a.status();
    if (s.ok()) {
      y.resize(static_cast<size_t>(a->rows) * a->dim);
      // Computed straight from h in the ring (no copy); released after.
      s = executor.Compute(*a, y);
    }
    TC_RETURN_IF_ERROR(from_gpu.Release());
    if (!s.ok()) {
      session.Log(absl::StrCat("step ", header.step_id, " layer ", header.layer,
                               " rejected: ", s.message()));
      TC_RETURN_IF_ERROR(SendPatiently(session, [&](absl::Duration timeout) {
        return ipc::SendError(to_gpu, header.step_id, s, timeout);
      }));
      continue;
    }
    TC_RETURN_IF_ERROR(SendPatiently(session, [&](absl::Duration timeout) {
      return ipc::SendPartial(to_gpu, header.step_id, header.layer, a->rows, a->dim, y, timeout);
    }));
  }
}

}  // namespace thermocline::cpu_worker
