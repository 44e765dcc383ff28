// The machine's load as the kernel reports it in /proc/loadavg: the thread pool reads it to tell
// whether spinning can pay (a spinning thread takes a core some other runnable thread needs),
// the benchmarks print it next to every measurement.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"

namespace thermocline {

struct LoadAverage {
  double one = 0, five = 0, fifteen = 0;  // exponentially damped run-queue lengths
  int runnable = 0;                       // threads runnable right now, the reader included
  int total = 0;                          // threads that exist
};

// Parses the text of /proc/loadavg ("0.52 0.61 0.70 2/311 12345"); an error names the field.
absl::StatusOr<LoadAverage> ParseLoadAverage(std::string_view text);

// Reads /proc/loadavg now (a few microseconds).
absl::StatusOr<LoadAverage> ReadLoadAverage();

// CPUs this process may run on (its affinity mask), at least 1.
int UsableCpus();

// True when a thread that spins keeps some other runnable thread off a core: more threads are
// runnable right now than there are CPUs, or the one-minute average is more than half a CPU
// above them. The margin is for the process's own threads: load.one counts them too, and two
// decode threads kept busy on two CPUs hold it at 1.7-1.9 by themselves (docs/performance.md,
// "Our own load"), so any background at all would otherwise stop the workers spinning.
bool Oversubscribed(const LoadAverage& load, int cpus);

}  // namespace thermocline
