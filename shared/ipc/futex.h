// Cross-process futex wait/wake on a 32-bit word in shared memory, and the monotonic clock the
// rings and heartbeats use.
#pragma once

#include <atomic>
#include <cstdint>

namespace thermocline::ipc {

// The kernel compares and sleeps on the raw 32-bit word, so the atomic must be exactly that.
static_assert(sizeof(std::atomic<uint32_t>) == 4 && std::atomic<uint32_t>::is_always_lock_free);

// CLOCK_MONOTONIC in nanoseconds. The same clock in every process on the host, so heartbeats
// written by one process can be aged by another.
int64_t MonotonicNs();

enum class FutexWaitResult {
  kWoken,         // woken by FutexWake (or spuriously): the caller re-checks its condition
  kValueChanged,  // *word != expected on entry: the event already happened
  kTimedOut,      // timeout_ns elapsed
};

// Sleeps while *word == expected, for at most timeout_ns (< 0: no limit). Not FUTEX_PRIVATE:
// the waker is another process that maps the same page at a different address.
FutexWaitResult FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns);

// Wakes up to `count` waiters sleeping on `word`.
void FutexWake(std::atomic<uint32_t>* word, int count);

// One spin-loop pause (x86 PAUSE; a compiler barrier elsewhere).
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::atomic_signal_fence(std::memory_order_seq_cst);
#endif
}

}  // namespace thermocline::ipc
