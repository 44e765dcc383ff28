// The 8-row interleaved layouts of MatrixView::interleaved, by weight type: Q4_0, Q5_0 and Q8_0
// (legacy_x8.h), Q3_K (q3_kx8.h), Q4_K and Q5_K (q4_kx8.h), Q6_K (q6_kx8.h), IQ4_XS (iq4_xsx8.h).
// Callers that hold a matrix of any type (the model's load, the kernels' dispatch, benchmarks)
// ask here whether its type has one and how large it is.
#pragma once

#include <cstdint>

#include "shared/gguf/ggml_type.h"

namespace thermocline {

// Rows per group, in every layout.
inline constexpr int64_t kInterleaved8Rows = 8;

bool HasInterleaved8Layout(GgmlType type);
// Bytes of one group of `cols` columns, and of the whole copy of `rows` rows (the last group
// padded with zero rows). HasInterleaved8Layout(type).
int64_t Interleaved8GroupBytes(GgmlType type, int64_t cols);
int64_t Interleaved8Bytes(GgmlType type, int64_t rows, int64_t cols);
// The copy of `rows` rows (row r at src + r * row_bytes) into out (Interleaved8Bytes), and row
// r of it back in the row layout, byte for byte. HasInterleaved8Layout(type).
void Interleave8(GgmlType type, const uint8_t* src, int64_t row_bytes, int64_t rows,
                 int64_t cols, uint8_t* out);
void ExtractInterleaved8Row(GgmlType type, const uint8_t* interleaved, int64_t cols, int64_t r,
                            uint8_t* row_out);

}  // namespace thermocline
