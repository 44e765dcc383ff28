// Q3_K weights interleaved 8 rows at a time, for dense products that never need a single row.
//
// Layout. Rows are taken in groups of 8 (the last group padded with zero rows: d = 0 makes every
// product 0). A group holds, for each 256-column super-block b in order, 880 bytes:
//   bytes    0..15   the 8 rows' fp16 d, row 0 first;
//   bytes   16..111  the rows' 12 packed scale bytes as three 32-bit words: word k of row r at
//                    16 + 32k + 4r;
//   bytes  112..367  8 chunks of 32 bytes; chunk j holds row r's hmask[4j..4j+3] at 4r..4r+3;
//   bytes  368..879  16 chunks of 32 bytes; chunk j holds row r's qs[4j..4j+3] likewise.
// In half h of a super-block (elements 128h..128h+127) element 128h + 32j + l has its two low
// bits in bits 2j, 2j + 1 of qs[32h + l] and its third bit in bit 4h + j of hmask[l] (ggml's
// layout), and belongs to sub-block 8h + 2j + l / 16. So every 32-bit lane of a chunk is one row
// and covers 4 consecutive elements: one 4-byte Q8_K activation broadcast serves all 8 rows of a
// lane-wise byte product, and a sub-block's 8 per-row sums land in the 8 lanes of one register.
// Each sub-block's 6-bit scale comes out of its row's lane with shifts and masks.
//
// Size. Exactly the bytes of the 8 rows in another order (880 = 8 x 110): no extra space, and
// any row can be read back byte for byte (ExtractQ3_Kx8Row).
//
// This is llama.cpp's interleaved-rows idea, written here from the Q3_K block format; the byte
// order within a group is this file's own. Gathered (sparse) products keep the file's row layout
// (see MatrixView::interleaved).
//
// Expected, stated before measuring (docs/performance.md, "Q3_K interleaved 8 rows"): the row
// kernel is compute-bound (14.8 GB/s in L2 on one Emerald Rapids core, 79-80% of the read floor
// from DRAM). Most of Q3_K's work is the per-element assembly of its 3-bit quants, which
// interleaving does not share; what it shares (broadcasts, scales, the offset, no horizontal
// sums) and vpdpbusd straight on the assembled quants should bring it from compute-bound to
// memory-bound, about 1.3x in L2 and the GEMV near the interleaved Q6_K's 88-91%.
#pragma once

#include <cstdint>

#include "shared/gguf/ggml_type.h"

namespace thermocline {

inline constexpr int64_t kQ3_Kx8Rows = 8;
inline constexpr int64_t kQ3_KRowBlockBytes = 110;  // block_q3_K
inline constexpr int64_t kQ3_Kx8DAt = 0;
inline constexpr int64_t kQ3_Kx8ScalesAt = 16;
inline constexpr int64_t kQ3_Kx8HmaskAt = 112;
inline constexpr int64_t kQ3_Kx8QsAt = 368;
inline constexpr int64_t kQ3_Kx8BlockBytes = 880;
static_assert(kQ3_Kx8BlockBytes == kQ3_Kx8Rows * kQ3_KRowBlockBytes);

// Groups of an interleaved matrix of `rows` rows, and bytes of one group of `cols` columns.
inline int64_t Q3_Kx8Groups(int64_t rows) { return (rows + kQ3_Kx8Rows - 1) / kQ3_Kx8Rows; }
inline int64_t Q3_Kx8GroupBytes(int64_t cols) { return cols / kQK_K * kQ3_Kx8BlockBytes; }

// Writes the interleaved form of `rows` Q3_K rows (`cols` columns, a multiple of 256; row r at
// src + r * row_bytes) to out, which holds Q3_Kx8Groups(rows) * Q3_Kx8GroupBytes(cols) bytes.
void InterleaveQ3_Kx8(const uint8_t* src, int64_t row_bytes, int64_t rows, int64_t cols,
                      uint8_t* out);

// Row r of an interleaved matrix, back in the row layout (RowBytes(kQ3_K, cols) bytes).
void ExtractQ3_Kx8Row(const uint8_t* interleaved, int64_t cols, int64_t r, uint8_t* row_out);

}  // namespace thermocline
