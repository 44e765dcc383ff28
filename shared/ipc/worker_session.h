// The lifecycle both worker processes share (docs/workers.md): attach to the instance's
// transport (waiting up to 5 s for the gateway to publish it), mark the slot starting, keep a
// heartbeat every 50 ms from a thread of its own (so a long load or a long step still reads as
// alive; the compute thread's own progress is published separately, Progress), and watch for the two reasons to stop: SIGTERM/SIGINT and the death of the gateway
// that owns the segment. Log lines go to stderr in the gateway's logfmt (shared/util/logfmt.h),
// component=gpu_worker or cpu_worker, one line per event.
#pragma once

#include <atomic>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "shared/ipc/transport.h"
#include "shared/util/logfmt.h"

namespace thermocline::ipc {

// A worker's exit status after SIGBUS: a file it had mapped became shorter than the mapping
// (the model file truncated or rewritten in place under the service). The worker writes one
// line saying so and exits with this status instead of dumping core; the driver names it.
inline constexpr int kExitMappedFileShrank = 86;

class WorkerSession {
 public:
  // `log_prefix`: "gpu_worker" or "cpu_worker". Installs SIGTERM/SIGINT handlers that only set a
  // flag (StopRequested), a SIGBUS handler (kExitMappedFileShrank), attaches, SetState(kStarting) and starts the heartbeat thread.
  static absl::StatusOr<std::unique_ptr<WorkerSession>> Start(
      std::string_view log_prefix, std::string_view instance, Role role,
      absl::Duration attach_timeout = absl::Seconds(5));
  // Stops the heartbeat thread; the Transport then marks the slot stopped.
  ~WorkerSession();
  WorkerSession(const WorkerSession&) = delete;
  WorkerSession& operator=(const WorkerSession&) = delete;

  Transport& transport() { return *transport_; }

  // One logfmt line, component=<log_prefix> (written with a single call, so that lines of the
  // two workers and the gateway, sharing one stderr, never interleave mid-line).
  void Log(Level level, std::string_view event, std::initializer_list<LogField> fields = {}) const;
  // For the parts that report in sentences (metrics writer, cold link, CUDA backend): each line
  // becomes one event `event` with msg=<line>.
  std::function<void(const std::string&)> LineLogger(std::string_view event,
                                                     Level level = Level::kInfo) const;

  // Non-empty when the worker should exit cleanly: "SIGTERM received", "gateway exited".
  std::string StopReason() const;

  // Loading is over: the hang timeout (progress) applies from here.
  void SetReady() {
    transport_->Progress();
    transport_->SetState(ProcessState::kReady);
  }
  // The compute thread's sign of life (Transport::Progress): the worker loops call it per
  // message and per idle or waiting slice, never from another thread.
  void Progress() { transport_->Progress(); }
  // Clean exit: kStopped (kept by the Transport's destructor).
  void SetStopped() { transport_->SetState(ProcessState::kStopped); }
  // Fatal error: logs it, marks the slot kFailed and exits the process with status 1 without
  // running destructors, since the Transport's destructor would overwrite kFailed with kStopped
  // and the supervisor must see the failure.
  [[noreturn]] void Fail(const absl::Status& status);

 private:
  WorkerSession(std::string prefix, std::unique_ptr<Transport> transport);
  void HeartbeatLoop();

  std::string prefix_;
  std::unique_ptr<Transport> transport_;
  std::atomic<bool> stop_heartbeat_{false};
  std::thread heartbeat_;
};

}  // namespace thermocline::ipc
