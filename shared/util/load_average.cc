#include "shared/util/load_average.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace thermocline {

absl::StatusOr<LoadAverage> ParseLoadAverage(std::string_view text) {
  // This Abseil predates std::string_view support.
  const absl::string_view t(text.data(), text.size());
  const std::vector<absl::string_view> f =
      absl::StrSplit(absl::StripAsciiWhitespace(t), ' ', absl::SkipEmpty());
  if (f.size() < 4) {
    return absl::InvalidArgumentError(absl::StrCat("loadavg: expected 5 fields, got ", f.size(),
                                                   " in '", t, "'"));
  }
  LoadAverage l;
  double* avgs[] = {&l.one, &l.five, &l.fifteen};
  const char* names[] = {"1-minute", "5-minute", "15-minute"};
  for (int i = 0; i < 3; ++i) {
    if (!absl::SimpleAtod(f[i], avgs[i]) || !(*avgs[i] >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat("loadavg: bad ", names[i], " average '",
                                                     f[i], "'"));
    }
  }
  const std::vector<absl::string_view> rt = absl::StrSplit(f[3], '/');
  if (rt.size() != 2 || !absl::SimpleAtoi(rt[0], &l.runnable) ||
      !absl::SimpleAtoi(rt[1], &l.total) || l.runnable < 0 || l.total < l.runnable) {
    return absl::InvalidArgumentError(
        absl::StrCat("loadavg: bad runnable/total field '", f[3], "'"));
  }
  return l;
}

absl::StatusOr<LoadAverage> ReadLoadAverage() {
  const int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::UnavailableError("loadavg: cannot open /proc/loadavg");
  char buf[256];
  const ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return absl::UnavailableError("loadavg: cannot read /proc/loadavg");
  return ParseLoadAverage(std::string_view(buf, static_cast<size_t>(n)));
}

int UsableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<int>(online) : 1;
}

bool Oversubscribed(const LoadAverage& load, int cpus) {
  return load.runnable > cpus || load.one > cpus + 0.5;
}

}  // namespace thermocline
