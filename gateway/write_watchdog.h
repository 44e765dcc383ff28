// Bounds how long one streamed write may block. gRPC's synchronous Write returns only once the
// message is handed to the transport, which a reader that stops reading (HTTP/2 window 0) can
// postpone forever, pinning the handler's thread; the scheduler's --stream-idle-timeout covers
// a sequence that is still generating, but not the last messages of one that has finished.
// Handlers bracket each Write with a Guard; a thread of this class cancels the call
// (ServerContext::TryCancel, which makes the blocked Write return false) when a write has been
// blocked longer than the timeout.
#pragma once

#include <grpcpp/server_context.h>

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <thread>

#include "absl/time/time.h"

namespace thermocline::gateway {

class WriteWatchdog {
 public:
  // timeout <= 0: no thread, no limit.
  explicit WriteWatchdog(absl::Duration timeout);
  ~WriteWatchdog();
  WriteWatchdog(const WriteWatchdog&) = delete;
  WriteWatchdog& operator=(const WriteWatchdog&) = delete;

  absl::Duration timeout() const { return timeout_; }
  // Calls cancelled so far because a write blocked past the timeout.
  int64_t cancelled() const;

  // One write: registered for its lifetime.
  class Guard {
   public:
    Guard(WriteWatchdog& dog, grpc::ServerContext* context);
    ~Guard();
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;
    // Whether the watchdog cancelled the call during this write.
    bool timed_out() const;

   private:
    WriteWatchdog& dog_;
    uint64_t id_ = 0;
  };

 private:
  struct Write {
    grpc::ServerContext* context;
    absl::Time started;
    bool cancelled = false;
  };
  void Loop();

  const absl::Duration timeout_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Write> writes_;
  uint64_t next_id_ = 1;
  int64_t cancelled_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace thermocline::gateway
