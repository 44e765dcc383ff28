// What identifies the contents of a file a process has mapped: device, inode, size and
// modification time. A process restarted onto a path whose identity changed would load other
// bytes than the processes that survived it (the split workers must hold the same model), so
// the driver compares identities before every restart.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace thermocline {

struct FileIdentity {
  uint64_t device = 0;
  uint64_t inode = 0;
  int64_t size = 0;
  int64_t mtime_ns = 0;

  bool operator==(const FileIdentity&) const = default;
};

// stat(2) of `path` (following links, as open does). NotFound / FailedPrecondition name it.
absl::StatusOr<FileIdentity> IdentifyFile(const std::string& path);

// How `now` differs from `then`, for an error message: "size 1185376 -> 4096 bytes",
// "replaced (inode 12 -> 40)", "modified (mtime moved by 3.2 s)"; empty when equal.
std::string DescribeFileChange(const FileIdentity& then, const FileIdentity& now);

}  // namespace thermocline
