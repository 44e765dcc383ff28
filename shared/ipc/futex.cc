#include "shared/ipc/futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>

namespace thermocline::ipc {

int64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

FutexWaitResult FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns) {
  timespec ts;
  timespec* tsp = nullptr;
  if (timeout_ns >= 0) {
    ts.tv_sec = static_cast<time_t>(timeout_ns / 1000000000);
    ts.tv_nsec = static_cast<long>(timeout_ns % 1000000000);
    tsp = &ts;
  }
  // FUTEX_WAIT's timeout is relative and measured on CLOCK_MONOTONIC.
  long rc =
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, tsp, nullptr, 0);
  if (rc == 0) return FutexWaitResult::kWoken;
  switch (errno) {
    case EAGAIN:
      return FutexWaitResult::kValueChanged;
    case ETIMEDOUT:
      return FutexWaitResult::kTimedOut;
    default:  // EINTR: a signal; the caller re-checks and waits again if it must.
      return FutexWaitResult::kWoken;
  }
}

void FutexWake(std::atomic<uint32_t>* word, int count) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, count, nullptr, nullptr, 0);
}

}  // namespace thermocline::ipc
