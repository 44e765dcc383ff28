#include "gateway/write_watchdog.h"

#include <algorithm>
#include <chrono>

namespace thermocline::gateway {

WriteWatchdog::WriteWatchdog(absl::Duration timeout) : timeout_(timeout) {
  if (timeout_ > absl::ZeroDuration()) thread_ = std::thread([this] { Loop(); });
}

WriteWatchdog::~WriteWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

int64_t WriteWatchdog::cancelled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

void WriteWatchdog::Loop() {
  // Checked at a tenth of the timeout (at most every second): a write is cancelled between 1
  // and 1.1 timeouts after it began.
  const auto period = absl::ToChronoMilliseconds(
      std::min(absl::Seconds(1), std::max(absl::Milliseconds(10), timeout_ / 10)));
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, period, [&] { return stop_; });
    const absl::Time now = absl::Now();
    for (auto& [id, w] : writes_) {
      if (!w.cancelled && now - w.started > timeout_) {
        w.cancelled = true;
        ++cancelled_;
        // TryCancel is safe from any thread while the call lives, and the call lives while
        // its handler is inside the Write this entry brackets.
        w.context->TryCancel();
      }
    }
  }
}

WriteWatchdog::Guard::Guard(WriteWatchdog& dog, grpc::ServerContext* context) : dog_(dog) {
  if (dog_.timeout_ <= absl::ZeroDuration()) return;
  std::lock_guard<std::mutex> lock(dog_.mu_);
  id_ = dog_.next_id_++;
  dog_.writes_.emplace(id_, Write{context, absl::Now()});
}

WriteWatchdog::Guard::~Guard() {
  if (id_ == 0) return;
  std::lock_guard<std::mutex> lock(dog_.mu_);
  dog_.writes_.erase(id_);
}

bool WriteWatchdog::Guard::timed_out() const {
  if (id_ == 0) return false;
  std::lock_guard<std::mutex> lock(dog_.mu_);
  auto it = dog_.writes_.find(id_);
  return it != dog_.writes_.end() && it->second.cancelled;
}

}  // namespace thermocline::gateway
