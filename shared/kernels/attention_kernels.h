// Internal interface between attention.cc (dispatch, portable) and attention_avx2.cc /
// attention_avx512.cc. Not for use outside shared/kernels/ and its tests.
#pragma once

#include <cstdint>

namespace thermocline::attention_internal {

// One family's kernels for one element type; the contract is attention.h's.
struct AttentionKernels {
  void (*scores)(const float* q, const uint8_t* const* k_rows, int64_t n, int64_t head_dim,
                 float scale, float* scores);
  void (*mix)(const float* weights, const uint8_t* const* v_rows, int64_t n, int64_t head_dim,
              float* out);
};

// [0]: f32 rows, [1]: f16 rows. Only valid on CPUs with the family's extensions.
const AttentionKernels* Avx2AttentionKernels();
const AttentionKernels* Avx512AttentionKernels();

}  // namespace thermocline::attention_internal
