#include "shared/ipc/worker_session.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace thermocline::ipc {
namespace {

// Set from the signal handler; read by StopReason. Lock-free atomics are async-signal-safe.
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

void OnStopSignal(int sig) { g_stop_signal.store(sig, std::memory_order_relaxed); }

// The line OnBusError writes, composed before any handler can run (a handler may only write).
char g_bus_error_line[256] = "worker: SIGBUS\n";
size_t g_bus_error_len = 0;

void OnBusError(int) {
  (void)!write(STDERR_FILENO, g_bus_error_line, g_bus_error_len);
  _exit(kExitMappedFileShrank);
}

void InstallStopHandlers(std::string_view prefix) {
  struct sigaction sa = {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  // logfmt like every other line, without ts= (a signal handler cannot format a time; the
  // journal stamps the line anyway).
  const int n = std::snprintf(
      g_bus_error_line, sizeof(g_bus_error_line),
      "level=error component=%.*s event=sigbus error=\"SIGBUS: a mapped file is shorter than its "
      "mapping (was the model file truncated or rewritten while in use?)\" exit_status=%d\n",
      static_cast<int>(prefix.size()), prefix.data(), kExitMappedFileShrank);
  g_bus_error_len = n > 0 ? std::min(static_cast<size_t>(n), sizeof(g_bus_error_line) - 1) : 0;
  struct sigaction bus = {};
  bus.sa_handler = OnBusError;
  sigemptyset(&bus.sa_mask);
  sigaction(SIGBUS, &bus, nullptr);
}


}  // namespace

WorkerSession::WorkerSession(std::string prefix, std::unique_ptr<Transport> transport)
    : prefix_(std::move(prefix)), transport_(std::move(transport)) {
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
}

absl::StatusOr<std::unique_ptr<WorkerSession>> WorkerSession::Start(std::string_view log_prefix,
                                                                    std::string_view instance,
                                                                    Role role,
                                                                    absl::Duration attach_timeout) {
  InstallStopHandlers(log_prefix);
  // The supervisor may start a worker before (or while) the gateway publishes the segment:
  // NotFound (no segment yet) and Unavailable (still being formatted) are worth waiting out.
  const absl::Time deadline = absl::Now() + attach_timeout;
  absl::StatusOr<std::unique_ptr<Transport>> t = Transport::Attach(instance, role);
  while (!t.ok() &&
         (absl::IsNotFound(t.status()) || absl::IsUnavailable(t.status())) &&
         absl::Now() < deadline && g_stop_signal.load() == 0) {
    absl::SleepFor(absl::Milliseconds(20));
    t = Transport::Attach(instance, role);
  }
  if (!t.ok()) return t.status();
  (*t)->SetState(ProcessState::kStarting);
  (*t)->Heartbeat();
  return std::unique_ptr<WorkerSession>(
      new WorkerSession(std::string(log_prefix), std::move(*t)));
}

WorkerSession::~WorkerSession() {
  stop_heartbeat_.store(true);
  if (heartbeat_.joinable()) heartbeat_.join();
}

void WorkerSession::HeartbeatLoop() {
  while (!stop_heartbeat_.load(std::memory_order_relaxed)) {
    transport_->Heartbeat();
    absl::SleepFor(absl::Milliseconds(50));
  }
}

void WorkerSession::Log(Level level, std::string_view event,
                        std::initializer_list<LogField> fields) const {
  ::thermocline::Log(level, event, fields, prefix_);
}

std::function<void(const std::string&)> WorkerSession::LineLogger(std::string_view event,
                                                                  Level level) const {
  return [this, event = std::string(event), level](const std::string& line) {
    Log(level, event, {{"msg", line}});
  };
}

std::string WorkerSession::StopReason() const {
  const int sig = g_stop_signal.load(std::memory_order_relaxed);
  if (sig != 0) return sig == SIGTERM ? "SIGTERM received" : absl::StrCat("signal ", sig, " received");
  if (!transport_->OwnerAlive()) return "the gateway that owns the instance exited";
  return "";
}

void WorkerSession::Fail(const absl::Status& status) {
  Log(Level::kError, "fatal", {{"error", status.ToString()}});
  transport_->SetState(ProcessState::kFailed);
  std::_Exit(1);
}

}  // namespace thermocline::ipc
