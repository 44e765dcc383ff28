#include "shared/driver/restart_budget.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace thermocline::driver {

void RestartBudget::Expire(absl::Time now) {
  while (!recent_.empty() && now - recent_.front() >= policy_.window) recent_.pop_front();
}

int RestartBudget::RecentRestarts(absl::Time now) {
  Expire(now);
  return static_cast<int>(recent_.size());
}

absl::StatusOr<absl::Duration> RestartBudget::Next(absl::Time now) {
  Expire(now);
  if (static_cast<int>(recent_.size()) >= policy_.max_restarts) {
    return absl::ResourceExhaustedError(absl::StrCat(recent_.size(), " restarts within ",
                                                     absl::FormatDuration(policy_.window)));
  }
  // The k-th restart of the window (k = 0 first) waits initial_backoff when k == 0, else
  // backoff_step * 2^(k-1), capped.
  const int k = static_cast<int>(recent_.size());
  absl::Duration delay = policy_.initial_backoff;
  if (k > 0) {
    delay = policy_.backoff_step;
    for (int i = 1; i < k && delay < policy_.max_backoff; ++i) delay *= 2;
    delay = std::min(delay, policy_.max_backoff);
  }
  recent_.push_back(now);
  ++total_;
  return delay;
}

}  // namespace thermocline::driver
