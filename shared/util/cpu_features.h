// Which SIMD kernel family this CPU can run. Kernels are chosen once, at run time.
#pragma once

#include <optional>
#include <string_view>

namespace thermocline {

// Ordered: each level needs everything the one below it needs.
enum class SimdLevel { kPortable, kAvx2, kAvx512 };

// kAvx2 needs AVX2, FMA and F16C; kAvx512 adds AVX-512 F, BW, VL, DQ and VNNI (the extensions
// the *_avx512.cc files are compiled for). THERMOCLINE_SIMD=portable|avx2|avx512 in the
// environment caps the level (tests and benchmarks use it to run several families on one
// machine); a value that is not one of those, or a level this CPU lacks, is reported once on
// stderr and the best level the CPU has (at most the one asked for) is used.
SimdLevel DetectSimdLevel();
// The best level this CPU has, ignoring THERMOCLINE_SIMD.
SimdLevel CpuSimdLevel();
const char* SimdLevelName(SimdLevel level);
// The level SimdLevelName gives `name` ("portable", "avx2" or "avx512"); nullopt for any other.
std::optional<SimdLevel> SimdLevelFromName(std::string_view name);

// True when the avx512 family may use AMX-INT8 tiles (the *_amx.cc kernels): the CPU has AMX-TILE
// and AMX-INT8, the OS saves their state (XCR0), and it granted this process the tile data
// (arch_prctl ARCH_REQ_XCOMP_PERM, asked on the first call). THERMOCLINE_AMX=0 in the environment
// turns it off (benchmarks compare both; the results are the same bits either way).
bool AmxInt8Usable();

}  // namespace thermocline
