// Cached key/value rows as the AVX2 and AVX-512 attention kernels read them (f32 or f16
// elements; loads of 8, of one, and the columns past the last whole vector). Include only from
// files compiled with AVX2 enabled (attention_avx2.cc, attention_avx512.cc).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace thermocline::attention_internal {
// In an unnamed namespace: the two including files are compiled with different ISA flags, and
// one shared (inline, external) copy of these functions chosen by the linker could carry
// AVX-512 instructions into the avx2 path.
namespace {

struct F32Row {
  static constexpr int kBytes = 4;
  static constexpr bool kPrefetch = false;
  static __m256 Load8(const uint8_t* p) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  }
  static float LoadOne(const uint8_t* p) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
};
struct F16Row {
  static constexpr int kBytes = 2;
  static constexpr bool kPrefetch = true;
  static __m256 Load8(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static float LoadOne(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
  }
};

// A head's cached row is head_dim elements at a stride of a whole position (every kv head side
// by side). F16 rows (256 bytes at head_dim 128) are too short a run for the hardware
// prefetcher, so the kernels ask for the row kRowsAhead positions on (L::kPrefetch). Measured
// (attention_bench, one thread, avx512, 256 / 1024 / 4096 positions): f16 7.3 / 6.5 / 4.7 ->
// 10.5 / 8.5 / 7.9 GB/s; f32 rows (512 bytes) read as well or worse with it (10.9-11.2 ->
// 9.8-10.3 GB/s at 1024 with 16 ahead; 4 and 8 ahead no better), so they do not ask.
// Prefetches change no result.
inline constexpr int64_t kRowsAhead = 16;
// Prefetches bytes [offset, offset + bytes) of rows[j + kRowsAhead] .. rows[j + kRowsAhead +
// count - 1], those below n, when L asks for it.
template <class L>
inline void PrefetchRowsAhead(const uint8_t* const* rows, int64_t j, int count, int64_t n,
                              int64_t offset, int64_t bytes) {
  if constexpr (L::kPrefetch) {
    for (int64_t r = j + kRowsAhead; r < j + kRowsAhead + count && r < n; ++r) {
      const uint8_t* row = rows[r] + offset;
      for (int64_t b = 0; b < bytes; b += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(row + b), _MM_HINT_T0);
      }
      _mm_prefetch(reinterpret_cast<const char*>(row + bytes - 1), _MM_HINT_T0);
    }
  }
}

// The mix's columns [c0, head_dim) (fewer than one vector): one fused multiply-add per row and
// element, rows in order, as each vector lane does.
template <class L>
inline void MixTail(const float* weights, const uint8_t* const* v_rows, int64_t n, int64_t c0,
                    int64_t head_dim, float* out) {
  for (int64_t c = c0; c < head_dim; ++c) {
    float acc = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      acc = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(weights[j]),
                                       _mm_set_ss(L::LoadOne(v_rows[j] + c * L::kBytes)),
                                       _mm_set_ss(acc)));
    }
    out[c] = acc;
  }
}

}  // namespace
}  // namespace thermocline::attention_internal
