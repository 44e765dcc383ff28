// How often a worker may be restarted: at most `max_restarts` within a sliding `window`, each
// after a backoff that doubles from `initial_backoff` up to `max_backoff` while restarts come
// in quick succession (a worker that crashes at load would otherwise be respawned in a tight
// loop). The clock is passed in, so the policy is tested without waiting.
#pragma once

#include <cstdint>
#include <deque>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace thermocline::driver {

struct RestartPolicy {
  int max_restarts = 5;  // within `window`; the next one is refused
  absl::Duration window = absl::Minutes(1);
  // The first restart in a quiet period waits this long (0 = at once: one crash should cost as
  // little latency as possible); each further restart within `window` doubles it.
  absl::Duration initial_backoff = absl::ZeroDuration();
  absl::Duration backoff_step = absl::Milliseconds(100);  // first non-zero backoff
  absl::Duration max_backoff = absl::Seconds(2);
};

class RestartBudget {
 public:
  explicit RestartBudget(const RestartPolicy& policy = {}) : policy_(policy) {}

  // Records a restart at `now` and returns how long to wait before doing it, or
  // ResourceExhausted (message: "N restarts within W") when the window is full. A refused
  // restart is not recorded.
  absl::StatusOr<absl::Duration> Next(absl::Time now);
  // Restarts recorded within the window ending at `now`.
  int RecentRestarts(absl::Time now);
  int64_t total() const { return total_; }
  const RestartPolicy& policy() const { return policy_; }

 private:
  void Expire(absl::Time now);

  RestartPolicy policy_;
  std::deque<absl::Time> recent_;  // times of the restarts within the window, oldest first
  int64_t total_ = 0;
};

}  // namespace thermocline::driver
