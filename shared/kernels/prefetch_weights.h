// The prefetch every kernel issues for the weight lines it reads next. One hint for all, so
// that the choice is measured and made once.
//
// To L1 (T0), not L2 (T1). Measured on Intel Emerald Rapids (2026-12-05, docs/performance.md,
// "GEMVs one after another"): with T1 a GEMV that follows another GEMV read 6-9% slower than
// the same GEMV after a plain read of other memory, and a decode is nothing but GEMVs one after
// another; gemv_bench, which reads between its GEMVs, did not show it. With T0 the history
// no longer matters, and the 1.3B decode at Q4_0 went from 0.81 to 0.91 of the read floor at
// one thread. An earlier gemv_bench measurement on another VM (q4_kx8_avx2.cc's) had T1 ahead
// of T0, but gemv_bench cannot see the effect; no other CPU was at hand to measure again.
#pragma once

#include <xmmintrin.h>

namespace thermocline::matmul_internal {

inline void PrefetchWeights(const void* p) {
  _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0);
}

}  // namespace thermocline::matmul_internal
