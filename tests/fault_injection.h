// Faults from outside a process, for the recovery tests and the soak: a thread frozen with
// ptrace while the rest of its process runs, and the transport segment of an instance mapped
// for scribbling, as another process of the same user could do.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>

#include "shared/ipc/ring.h"
#include "shared/ipc/transport.h"

namespace thermocline::testing {

// Freezes thread `tid` (a worker's main thread runs its compute loop) with PTRACE_INTERRUPT
// and keeps it frozen, leaving the other threads of its process (the heartbeat) running.
// The tracer is a child process of its own: ptrace-stops are reported to the tracer's waitpid,
// and a supervisor's waitpid on the worker must see only the worker's exit. The tracer reaps
// the tracee's exit notification (which the real parent gets only after that) and exits; it
// dies with the caller (PDEATHSIG), which detaches and resumes the thread. Returns the
// tracer's pid (ReapTracer waits for it), or -1 when fork failed.
pid_t FreezeThread(pid_t tid);
// The tracer's exit status: 0 once the frozen thread's process died while frozen; 2-4 when
// ptrace or waitpid failed (the thread was never frozen); -2 when the thread was still frozen
// after `timeout_seconds` (the tracer is then killed, which resumes it).
int ReapTracer(pid_t tracer, int timeout_seconds = 60);

// The instance's transport segment (/dev/shm/thermocline-<instance>-transport) mapped
// read-write into this process.
class MappedTransport {
 public:
  explicit MappedTransport(const std::string& instance);
  ~MappedTransport();
  MappedTransport(const MappedTransport&) = delete;
  MappedTransport& operator=(const MappedTransport&) = delete;

  bool ok() const { return base_ != nullptr; }
  ipc::RingControl& Ring(ipc::RingId id) const;
  // Publishes 48 bytes of garbage as the next record of `id`, as a stray write over a header
  // would look to its consumer.
  void PublishGarbageHeader(ipc::RingId id) const;

 private:
  std::byte* base_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace thermocline::testing
