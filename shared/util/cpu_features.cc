#include "shared/util/cpu_features.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "shared/util/env_switches.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace thermocline {

SimdLevel CpuSimdLevel() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // GCC's checks include the OS's XSAVE support for the ymm/zmm state.
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512vnni");
  if (avx2 && avx512) return SimdLevel::kAvx512;
  if (avx2) return SimdLevel::kAvx2;
#endif
  return SimdLevel::kPortable;
}

std::optional<SimdLevel> SimdLevelFromName(std::string_view name) {
  for (SimdLevel l : {SimdLevel::kPortable, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (name == SimdLevelName(l)) return l;
  }
  return std::nullopt;
}

SimdLevel DetectSimdLevel() {
  const SimdLevel cpu = CpuSimdLevel();
  const char* force = std::getenv("THERMOCLINE_SIMD");
  if (force == nullptr || *force == '\0') return cpu;
  const std::optional<SimdLevel> named = SimdLevelFromName(force);
  const bool known = named.has_value();
  const SimdLevel asked = named.value_or(cpu);
  const SimdLevel level = std::min(asked, cpu);
  static std::atomic<bool> reported{false};
  if ((!known || asked > cpu) && !reported.exchange(true)) {
    if (!known) {
      std::fprintf(stderr,
                   "thermocline: THERMOCLINE_SIMD=%s is not one of portable, avx2, avx512; "
                   "using %s\n",
                   force, SimdLevelName(level));
    } else {
      std::fprintf(stderr, "thermocline: THERMOCLINE_SIMD=%s but this CPU has only %s; using %s\n",
                   force, SimdLevelName(cpu), SimdLevelName(level));
    }
  }
  return level;
}

bool AmxInt8Usable() {
  static const bool usable = [] {
    if (!EnvSwitchOn(EnvSwitch::kAmx)) return false;
#if defined(__x86_64__)
    unsigned a, b, c, d;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
    const bool tile = (d >> 24) & 1, int8 = (d >> 25) & 1;
    if (!tile || !int8) return false;
    // XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA): the OS manages the tile state. xgetbv needs
    // OSXSAVE, which leaf 1 reports.
    if (__get_cpuid(1, &a, &b, &c, &d) == 0 || ((c >> 27) & 1) == 0) return false;
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if (((lo >> 17) & 3) != 3) return false;
    // Linux gives a process the 8 KiB of tile data only on request.
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
    return false;
#endif
  }();
  return usable;
}

const char* SimdLevelName(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512:
      return "avx512";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kPortable:
      return "portable";
  }
  return "unknown";
}

}  // namespace thermocline
