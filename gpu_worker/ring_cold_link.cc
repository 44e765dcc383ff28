#include "gpu_worker/ring_cold_link.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "shared/ipc/messages.h"
#include "shared/util/status_macros.h"

namespace thermocline::gpu_worker {
namespace {
absl::string_view Av(std::string_view s) { return absl::string_view(s.data(), s.size()); }
}  // namespace

RingColdLink::RingColdLink(ipc::Transport& transport, ipc::RingProducer& to_cpu,
                           ipc::RingConsumer& from_cpu, int64_t dim, int64_t n_layers,
                           std::function<void(const std::string&)> log, ColdLinkTiming timing)
    : transport_(transport),
      to_cpu_(to_cpu),
      from_cpu_(from_cpu),
      dim_(dim),
      n_layers_(n_layers),
      log_(std::move(log)),
      timing_(timing) {}

void RingColdLink::BeginStep(uint64_t step_id, uint64_t epoch) {
  step_id_ = step_id;
  epoch_ = epoch;
  sent_rows_ = 0;
  transport_.Progress();
}

absl::Status RingColdLink::CheckPeer(std::string_view waiting_for) {
  transport_.Progress();
  const uint64_t now_epoch = transport_.epoch();
  if (now_epoch != epoch_) {
    return absl::UnavailableError(absl::StrCat("cpu worker: epoch moved from ", epoch_, " to ",
                                               now_epoch, " while step ", step_id_, " waited for ",
                                               Av(waiting_for)));
  }
  const ipc::ProcessInfo cpu = transport_.Process(ipc::Role::kCpuWorker);
  if (!cpu.alive) {
    return absl::UnavailableError(absl::StrCat("cpu worker (pid ", cpu.pid, ") is not running; step ",
                                               step_id_, " waited for ", Av(waiting_for)));
  }
  const int64_t age = transport_.HeartbeatAgeNs(ipc::Role::kCpuWorker);
  if (age > absl::ToInt64Nanoseconds(timing_.heartbeat_limit)) {
    return absl::UnavailableError(absl::StrCat("cpu worker (pid ", cpu.pid, ") heartbeat is ",
                                               age / 1000000, " ms old; step ", step_id_,
                                               " waited for ", Av(waiting_for)));
  }
  const absl::Duration hang = transport_.hang_timeout();
  const int64_t idle = transport_.ProgressAgeNs(ipc::Role::kCpuWorker);
  if (hang > absl::ZeroDuration() && idle > absl::ToInt64Nanoseconds(hang)) {
    return absl::UnavailableError(absl::StrCat(
        "cpu worker (pid ", cpu.pid, ") is hung: its compute thread made no progress for ",
        idle / 1000000, " ms (its heartbeat thread still beats); step ", step_id_,
        " waited for ", Av(waiting_for)));
  }
  return absl::OkStatus();
}

absl::Status RingColdLink::SendCold(const ColdRequest& r) {
  const ipc::ActivationCandidates candidates =
      r.all_cold ? ipc::ActivationCandidates::All()
                 : ipc::ActivationCandidates::PerRow(
                       absl::Span<const uint32_t>(r.row_end.data(), r.row_end.size()),
                       absl::Span<const int32_t>(r.ids.data(), r.ids.size()));
  const absl::Span<const float> h(r.h.data(), r.h.size());
  const ipc::ActivationRouting routing{
      static_cast<uint32_t>(r.picks),
      absl::Span<const int32_t>(r.experts.data(), r.experts.size()),
      absl::Span<const float>(r.expert_weights.data(), r.expert_weights.size())};
  static_assert(ColdRequest::kTealCutsPerRow == ipc::kCutsPerRow);
  const absl::Span<const float> cuts(r.cuts.data(), r.cuts.size());
  while (true) {
    absl::Status s = ipc::SendActivation(
        to_cpu_, step_id_, static_cast<uint32_t>(r.layer), static_cast<uint32_t>(r.rows),
        static_cast<uint32_t>(r.dim), h, candidates, timing_.slice, routing, cuts);
    if (s.ok()) break;
    // A full ring means the CPU worker is behind, or gone: find out which before waiting on.
    if (!absl::IsDeadlineExceeded(s)) return s;
    TC_RETURN_IF_ERROR(CheckPeer(absl::StrCat("ring space for layer ", r.layer)));
  }
  sent_rows_ = r.rows;
  transport_.Progress();
  return absl::OkStatus();
}

absl::Status RingColdLink::ReceiveCold(int64_t layer, std::span<float> y_cold) {
  const std::string what = absl::StrCat("the partial of layer ", layer);
  const ipc::MatrixLimits limits{static_cast<uint32_t>(dim_), static_cast<uint32_t>(sent_rows_),
                                 static_cast<uint32_t>(n_layers_)};
  while (true) {
    absl::StatusOr<ipc::MessageView> m = from_cpu_.Peek(timing_.slice);
    if (!m.ok()) {
      if (!absl::IsDeadlineExceeded(m.status())) return m.status();
      TC_RETURN_IF_ERROR(CheckPeer(what));
      continue;
    }
    const ipc::MessageHeader header = m->header;
    const bool ours = header.step_id == step_id_;
    if (ours && m->kind() == ipc::MessageKind::kPartial && header.layer == layer) {
      absl::StatusOr<ipc::MatrixView> p = ipc::DecodePartial(*m, limits);
      absl::Status s = p.status();
      if (s.ok() && p->rows != sent_rows_) {
        s = absl::InternalError(absl::StrCat("cpu worker answered layer ", layer, " with ", p->rows,
                                             " rows, ", sent_rows_, " were sent"));
      }
      if (s.ok()) std::memcpy(y_cold.data(), p->data.data(), y_cold.size() * sizeof(float));
      transport_.Progress();
      TC_RETURN_IF_ERROR(from_cpu_.Release());
      return s;
    }
    if (ours && m->kind() == ipc::MessageKind::kError) {
      absl::Status sender;
      absl::Status s = ipc::DecodeError(*m, &sender);
      TC_RETURN_IF_ERROR(from_cpu_.Release());
      TC_RETURN_IF_ERROR(s);
      return absl::Status(sender.code(), absl::StrCat("cpu worker: ", sender.message()));
    }
    log_(absl::StrCat("dropping ", Av(ipc::MessageKindName(m->kind())), " of step ",
                      header.step_id, " layer ", header.layer, " (waiting for step ", step_id_,
                      " layer ", layer, ")"));
    TC_RETURN_IF_ERROR(from_cpu_.Release());
    // A stream of stale messages must not keep the liveness checks from running.
    TC_RETURN_IF_ERROR(CheckPeer(what));
  }
}

}  // namespace thermocline::gpu_worker
