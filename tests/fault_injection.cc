#include "tests/fault_injection.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace thermocline::testing {

pid_t FreezeThread(pid_t tid) {
  const pid_t tracer = fork();
  if (tracer != 0) return tracer;
  // Only async-signal-safe calls from here: the calling process has threads.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (ptrace(PTRACE_SEIZE, tid, nullptr, nullptr) != 0) _exit(2);
  if (ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr) != 0) _exit(3);
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(tid, &status, __WALL);
    if (r < 0 && errno != EINTR) _exit(4);
    if (r == tid && (WIFEXITED(status) || WIFSIGNALED(status))) _exit(0);
    // A stop (the interrupt, or a signal about to be delivered): stay stopped.
  }
}

int ReapTracer(pid_t tracer, int timeout_seconds) {
  int status = 0;
  for (int waited_ms = 0;; waited_ms += 10) {
    const pid_t r = waitpid(tracer, &status, WNOHANG);
    if (r == tracer) break;
    if (r < 0 && errno != EINTR) return -1;
    if (waited_ms >= timeout_seconds * 1000) {
      // The thread is still frozen: end the tracer (which resumes it) and say so.
      kill(tracer, SIGKILL);
      waitpid(tracer, &status, 0);
      return -2;
    }
    usleep(10000);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

MappedTransport::MappedTransport(const std::string& instance) {
  const std::string path = absl::StrCat("/dev/shm/thermocline-", instance, "-transport");
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  struct stat st {};
  if (fd < 0) return;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return;
  }
  bytes_ = static_cast<size_t>(st.st_size);
  void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p != MAP_FAILED) base_ = static_cast<std::byte*>(p);
}

MappedTransport::~MappedTransport() {
  if (base_ != nullptr) munmap(base_, bytes_);
}

ipc::RingControl& MappedTransport::Ring(ipc::RingId id) const {
  const auto* cb = reinterpret_cast<const ipc::ControlBlock*>(base_);
  return *reinterpret_cast<ipc::RingControl*>(base_ + cb->rings[static_cast<int>(id)].offset);
}

void MappedTransport::PublishGarbageHeader(ipc::RingId id) const {
  ipc::RingControl& ctl = Ring(id);
  std::byte* data = reinterpret_cast<std::byte*>(&ctl) + sizeof(ipc::RingControl);
  const uint64_t head = ctl.head.load(std::memory_order_acquire);
  const uint64_t offset = head & (ctl.capacity - 1);
  const uint64_t to_end = ctl.capacity - offset;
  // A record never starts in the last 47 bytes: the consumer skips them to the start.
  const uint64_t at = to_end < ipc::kHeaderBytes ? 0 : offset;
  const uint64_t skip = to_end < ipc::kHeaderBytes ? to_end : 0;
  std::memset(data + at, 0xEE, ipc::kHeaderBytes);
  ctl.head.store(head + skip + ipc::kHeaderBytes, std::memory_order_release);
}

}  // namespace thermocline::testing
