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
  static __m256 Load8(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static float LoadOne(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
  }
};

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
