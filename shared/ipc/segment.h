// Named shared-memory segments (Boost.Interprocess, POSIX shm under /dev/shm).
//
// A segment is named `thermocline-<instance>-<what>`, created by exactly one owner with mode
// 0600 and removed by it on destruction. Its first 64 bytes are a SegmentPreamble whose layout
// never changes, so any build can tell who owns a segment left by another build: a segment
// whose owner is dead, that is not a Thermocline segment, or that was never finished is stale
// and gets replaced; one with a live owner is refused. A name that another user holds (or that
// is not a plain file) is refused by Create, Attach and RemoveIfStale alike with
// PermissionDenied naming its owner: the names are predictable, /dev/shm is open to all, and a
// squatter's segment must neither be trusted nor silently replaced.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace thermocline::ipc {

// [A-Za-z0-9_-]{1,64}: safe in a file name and unambiguous after the "thermocline-" prefix.
absl::Status ValidateInstanceName(std::string_view instance);
// "thermocline-<instance>-<what>"; `what` is [a-z0-9]{1,32}.
absl::StatusOr<std::string> SegmentName(std::string_view instance, std::string_view what);
// Names under /dev/shm that belong to `instance` (for cleanup checks and operations).
std::vector<std::string> ListInstanceSegments(std::string_view instance);

inline constexpr uint64_t kSegmentMagic = 0x31474553434d5254ull;  // "TRMCSEG1"

// The first 64 bytes of every segment. Never change this layout: bump the caller's
// layout_version for everything after it instead.
struct SegmentPreamble {
  std::atomic<uint64_t> magic;  // kSegmentMagic, release-stored last by the creator
  uint32_t layout_version;
  uint32_t preamble_bytes;
  uint64_t segment_bytes;
  std::atomic<int32_t> owner_pid;  // 0 after a clean exit
  uint32_t reserved0;
  std::atomic<uint64_t> owner_start_ticks;  // /proc/<pid>/stat starttime: detects pid reuse
  uint64_t reserved1[3];
};
static_assert(sizeof(SegmentPreamble) == 64);

// This process's pid and kernel start time.
struct ProcessIdentity {
  int32_t pid = 0;
  uint64_t start_ticks = 0;  // 0 when /proc is unreadable
};
ProcessIdentity SelfIdentity();
// Whether `pid` runs and is the same process (start time, when known, matches). Zombies count
// as dead.
bool ProcessAlive(int32_t pid, uint64_t start_ticks);

class SharedSegment {
 public:
  // Creates `thermocline-<instance>-<what>` of `bytes` (memory committed up front, so a full
  // /dev/shm is an error now rather than SIGBUS later), formats it with `init` (given the base
  // address; everything after the preamble is zero) and publishes it. An existing segment is
  // replaced when stale and refused with FailedPrecondition when its owner is alive.
  static absl::StatusOr<std::unique_ptr<SharedSegment>> Create(
      std::string_view instance, std::string_view what, uint64_t bytes, uint32_t layout_version,
      absl::FunctionRef<absl::Status(void* base)> init);
  // Maps an existing segment read-write after checking its preamble: magic, layout version,
  // size, live owner. NotFound when there is none; Unavailable while its creator is still
  // formatting it; FailedPrecondition when it is stale or of another layout.
  static absl::StatusOr<std::unique_ptr<SharedSegment>> Attach(std::string_view instance,
                                                               std::string_view what,
                                                               uint32_t layout_version);
  // Removes the segment when it is stale (as Create judges it). Returns whether one was
  // removed; a live owner's segment is left alone.
  static absl::StatusOr<bool> RemoveIfStale(std::string_view instance, std::string_view what);

  ~SharedSegment();
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  void* base() const;
  uint64_t size() const;
  bool is_owner() const;
  const std::string& name() const;
  const SegmentPreamble& preamble() const { return *static_cast<const SegmentPreamble*>(base()); }
  // Whether the owner recorded in the preamble still runs.
  bool OwnerAlive() const;
  // Why Create replaced an existing segment ("" when it did not).
  const std::string& replaced_reason() const;

 private:
  struct Impl;
  explicit SharedSegment(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace thermocline::ipc
