// The two products of one attention head over its cached key and value rows (f32 or f16
// elements, one row per position): the scores q . k_j and the mix sum_j w_j v_j.
//
// The avx2 and avx512 families give the same bits (each score is one 8-lane FMA accumulation
// over the head's elements in steps of 8, reduced in one fixed order; each mixed element adds
// the rows in order with one FMA apiece), so a model's tokens do not depend on which of the two
// a CPU runs. The portable family keeps llama2.c's run.c order (one running sum, separate
// multiply and add).
#pragma once

#include <cstdint>

#include "shared/gguf/ggml_type.h"

namespace thermocline {

// scores[j] = scale * dot(q, k_rows[j][0 .. head_dim)) for j < n. kv_type: kF32 or kF16.
void AttentionScores(GgmlType kv_type, const float* q, const uint8_t* const* k_rows, int64_t n,
                     int64_t head_dim, float scale, float* scores);

// out[i] = sum_{j < n} weights[j] * v_rows[j][i] for i < head_dim, rows added in order (out is
// overwritten; n == 0 gives zeros).
void AttentionMix(GgmlType kv_type, const float* weights, const uint8_t* const* v_rows, int64_t n,
                  int64_t head_dim, float* out);

}  // namespace thermocline
