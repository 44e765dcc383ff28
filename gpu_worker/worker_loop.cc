#include "gpu_worker/worker_loop.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu_worker/ring_cold_link.h"
#include "shared/ipc/messages.h"
#include "shared/util/status_macros.h"

namespace thermocline::gpu_worker {
namespace {

// How long one idle wait lasts before the stop conditions are checked again (<= 200 ms).
constexpr absl::Duration kIdleSlice = absl::Milliseconds(100);

class GpuWorker {
 public:
  GpuWorker(ipc::WorkerSession& session, Backend& backend, const ModelConfig& config)
      : session_(session),
        backend_(backend),
        config_(config),
        // Metrics are optional: without the gateway's segment the writer drops everything.
        metrics_(session.transport().instance(), ipc::Role::kGpuWorker, config.n_layers,
                 session.LineLogger("metrics")) {}
  ~GpuWorker() { backend_.SetMetrics(nullptr); }

  absl::Status Run() {
    ipc::Transport& t = session_.transport();
    TC_ASSIGN_OR_RETURN(ipc::RingConsumer from_gateway, t.Consumer(ipc::RingId::kGatewayToGpu));
    TC_ASSIGN_OR_RETURN(ipc::RingProducer to_gateway, t.Producer(ipc::RingId::kGpuToGateway));
    TC_ASSIGN_OR_RETURN(ipc::RingProducer to_cpu, t.Producer(ipc::RingId::kGpuToCpu));
    TC_ASSIGN_OR_RETURN(ipc::RingConsumer from_cpu, t.Consumer(ipc::RingId::kCpuToGpu));
    to_gateway_ = &to_gateway;
    to_cpu_ = &to_cpu;
    from_cpu_ = &from_cpu;
    RingColdLink link(t, to_cpu, from_cpu, config_.dim, config_.n_layers,
                      session_.LineLogger("cold_link", Level::kWarn));
    link_ = &link;
    metrics_.MaybeAttach();
    backend_.SetMetrics(&metrics_);
    const BackendLimits& lim = backend_.limits();
    step_limits_ = ipc::StepLimits{static_cast<uint32_t>(lim.max_batch), lim.n_kv_slots,
                                   lim.context, lim.vocab, lim.n_kv_blocks, lim.blocks_per_slot};
    session_.SetReady();
    session_.Log(Level::kInfo, "ready",
                 {{"backend", backend_.name()}, {"kv_slots", lim.n_kv_slots},
                  {"context", lim.context}, {"max_batch", lim.max_batch},
                  {"epoch", static_cast<unsigned long long>(t.epoch())}});
    while (true) {
      session_.Progress();
      if (std::string why = session_.StopReason(); !why.empty()) {
        session_.Log(Level::kInfo, "stopping", {{"reason", why}});
        return absl::OkStatus();
      }
      absl::StatusOr<ipc::MessageView> m = from_gateway.Peek(kIdleSlice);
      if (!m.ok()) {
        if (absl::IsDeadlineExceeded(m.status())) continue;
        return m.status();
      }
      const ipc::MessageHeader header = m->header;
      AdoptEpoch(header.epoch);
      switch (m->kind()) {
        case ipc::MessageKind::kShutdown: {
          TC_RETURN_IF_ERROR(from_gateway.Release());
          // The CPU worker has no ring from the gateway: pass the Shutdown on.
          absl::Status fwd = ipc::SendShutdown(to_cpu, absl::Milliseconds(100));
          session_.Log(Level::kInfo, "shutdown", {{"cpu_worker_told", fwd.ok()}});
          return absl::OkStatus();
        }
        case ipc::MessageKind::kStep: {
          absl::StatusOr<ipc::StepMsg> step = ipc::DecodeStep(*m, step_limits_);
          TC_RETURN_IF_ERROR(from_gateway.Release());
          if (!step.ok()) {
            session_.Log(Level::kWarn, "step_rejected",
                         {{"step", static_cast<unsigned long long>(header.step_id)},
                          {"error", std::string(step.status().message())}});
            TC_RETURN_IF_ERROR(Reply(header.step_id, step.status(), {}, 0));
            break;
          }
          TC_RETURN_IF_ERROR(RunStep(*step, header.epoch));
          break;
        }
        default:
          session_.Log(Level::kWarn, "message_ignored",
                       {{"kind", ipc::MessageKindName(m->kind())}, {"from", "gateway"}});
          TC_RETURN_IF_ERROR(from_gateway.Release());
      }
    }
  }

 private:
  // Replies carry the epoch of the request; older Partials are dropped by the consumer.
  void AdoptEpoch(uint64_t epoch) {
    to_gateway_->set_epoch(epoch);
    to_cpu_->set_epoch(epoch);
    from_cpu_->set_min_epoch(std::max(from_cpu_->min_epoch(), epoch));
  }

  absl::Status RunStep(const ipc::StepMsg& step, uint64_t epoch) {
    batch_.clear();
    int64_t rows = 0;
    for (const ipc::StepEntry& e : step.entries) {
      const bool want = (e.flags & ipc::kEntryWantsLogits) != 0;
      batch_.push_back(BatchEntry{e.kv_slot, e.position, e.token_id, want});
      rows += want ? 1 : 0;
    }
    link_->BeginStep(step.step_id, epoch);
    metrics_.MaybeAttach();
    absl::Status s = absl::OkStatus();
    if (!step.tables.empty() || !step.copies.empty()) s = backend_.MapKv(step.tables, step.copies);
    if (s.ok()) s = backend_.StartStep(batch_, *link_);
    if (s.ok()) s = backend_.FinishStep(&logits_);
    if (s.ok()) metrics_.AddStep(batch_.size());
    if (!s.ok()) {
      session_.Log(Level::kError, "step_failed",
                   {{"step", static_cast<unsigned long long>(step.step_id)},
                    {"error", s.ToString()}});
    }
    return Reply(step.step_id, s, logits_, rows);
  }

  // Sends Logits (or Error when `status` is not OK, or when the logits do not fit the ring).
  // Waits for ring space in slices, so that a stuck gateway cannot keep the worker from
  // noticing a stop request.
  absl::Status Reply(uint64_t step_id, absl::Status status, const std::vector<float>& logits,
                     int64_t rows) {
    if (status.ok() && ipc::MatrixBytes(rows, config_.vocab_size) > to_gateway_->max_payload_bytes()) {
      status = absl::ResourceExhaustedError(
          absl::StrCat(rows, " logits rows do not fit the gpu->gateway ring"));
    }
    while (true) {
      session_.Progress();  // waiting for the gateway to read is not a hang of this worker
      absl::Status s = status.ok()
                           ? ipc::SendLogits(*to_gateway_, step_id, static_cast<uint32_t>(rows),
                                             static_cast<uint32_t>(config_.vocab_size),
                                             absl::Span<const float>(logits.data(),
                                                                     rows * config_.vocab_size),
                                             kIdleSlice)
                           : ipc::SendError(*to_gateway_, step_id, status, kIdleSlice);
      if (!absl::IsDeadlineExceeded(s)) return s;
      if (!session_.StopReason().empty()) return absl::OkStatus();
    }
  }

  ipc::WorkerSession& session_;
  Backend& backend_;
  const ModelConfig& config_;
  ipc::WorkerMetricsWriter metrics_;
  ipc::RingProducer* to_gateway_ = nullptr;
  ipc::RingProducer* to_cpu_ = nullptr;
  ipc::RingConsumer* from_cpu_ = nullptr;
  RingColdLink* link_ = nullptr;
  ipc::StepLimits step_limits_;
  std::vector<BatchEntry> batch_;
  std::vector<float> logits_;
};

}  // namespace

absl::Status RunGpuWorker(ipc::WorkerSession& session, Backend& backend,
                          const ModelConfig& config) {
  GpuWorker worker(session, backend, config);
  return worker.Run();
}

}  // namespace thermocline::gpu_worker
