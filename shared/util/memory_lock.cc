#include "shared/util/memory_lock.h"

#include <sys/mman.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace thermocline {

absl::Status LockMemory(const void* data, size_t bytes, std::string_view what) {
  if (bytes == 0 || mlock(data, bytes) == 0) return absl::OkStatus();
  const int err = errno;
  rlimit lim{};
  getrlimit(RLIMIT_MEMLOCK, &lim);
  return absl::ResourceExhaustedError(absl::StrCat(
      "--mlock: cannot lock ", bytes, " bytes of ", std::string(what), " (", std::strerror(err),
      "); RLIMIT_MEMLOCK is ",
      lim.rlim_cur == RLIM_INFINITY ? std::string("unlimited") : absl::StrCat(lim.rlim_cur),
      " bytes: raise it (ulimit -l, LimitMEMLOCK= in systemd) or drop --mlock"));
}

absl::StatusOr<int64_t> LockedBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    absl::string_view rest(line);
    if (!absl::ConsumePrefix(&rest, "VmLck:")) continue;
    rest = absl::StripAsciiWhitespace(rest);
    int64_t kib = 0;
    if (!absl::ConsumeSuffix(&rest, "kB") ||
        !absl::SimpleAtoi(absl::StripAsciiWhitespace(rest), &kib)) {
      return absl::InternalError(absl::StrCat("/proc/self/status: cannot read '", line, "'"));
    }
    return kib * 1024;
  }
  return absl::UnavailableError("/proc/self/status has no VmLck line");
}

}  // namespace thermocline
