// Keeping memory resident for --mlock: a worker that serves from RAM must not have its weights
// paged out under memory pressure (a page fault in the middle of a token stalls every stream).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace thermocline {

// mlock(data, bytes). A failure names `what`, the size, RLIMIT_MEMLOCK's value and how to
// raise it. The lock lasts until the memory is unmapped.
absl::Status LockMemory(const void* data, size_t bytes, std::string_view what);

// Bytes this process holds locked (VmLck in /proc/self/status).
absl::StatusOr<int64_t> LockedBytes();

}  // namespace thermocline
