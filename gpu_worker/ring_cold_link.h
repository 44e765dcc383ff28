// The ColdLink over the gpu->cpu and cpu->gpu rings, with the failure rules of the protocol
// (docs/workers.md): while it waits it wakes at least every 20 ms and gives up the step with
// Unavailable when the epoch moved on, the CPU worker's process is gone, its heartbeat is
// older than 300 ms, or its compute thread has shown no progress for the gateway's hang timeout
// (the process runs but its work does not: docs/workers.md, liveness). Waiting counts as this
// worker's own progress, so that the one waited on is blamed, never the one waiting. Messages that belong to another step or layer (left over from an
// abandoned step) are dropped with a log line.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gpu_worker/backend.h"
#include "shared/ipc/ring.h"
#include "shared/ipc/transport.h"

namespace thermocline::gpu_worker {

struct ColdLinkTiming {
  absl::Duration slice = absl::Milliseconds(20);           // longest wait between checks
  absl::Duration heartbeat_limit = absl::Milliseconds(300);  // older means the peer is stuck
};

class RingColdLink final : public ColdLink {
 public:
  RingColdLink(ipc::Transport& transport, ipc::RingProducer& to_cpu, ipc::RingConsumer& from_cpu,
               int64_t dim, int64_t n_layers, std::function<void(const std::string&)> log,
               ColdLinkTiming timing = {});

  // The step that following calls serve, and the epoch it was sent under.
  void BeginStep(uint64_t step_id, uint64_t epoch);

  absl::Status SendCold(const ColdRequest& request) override;
  absl::Status ReceiveCold(int64_t layer, std::span<float> y_cold) override;

 private:
  // Unavailable when the CPU worker cannot answer this step any more.
  absl::Status CheckPeer(std::string_view waiting_for);

  ipc::Transport& transport_;
  ipc::RingProducer& to_cpu_;
  ipc::RingConsumer& from_cpu_;
  int64_t dim_;
  int64_t n_layers_;
  std::function<void(const std::string&)> log_;
  ColdLinkTiming timing_;
  uint64_t step_id_ = 0;
  uint64_t epoch_ = 0;
  int64_t sent_rows_ = 0;  // rows of the outstanding Activation
};

}  // namespace thermocline::gpu_worker
