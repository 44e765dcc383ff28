// Q6_K weights interleaved 8 rows at a time, for dense products that never need a single row.
//
// Layout. Rows are taken in groups of 8 (the last group padded with zero rows: d = 0 makes every
// product 0). A group holds, for each 256-column super-block b in order, 1680 bytes:
//   bytes    0..15    the 8 rows' fp16 d, row 0 first;
//   bytes   16..143   the 16 int8 sub-block scales: pair p (sub-blocks 2p, 2p + 1) at 16 + 16p,
//                     row r's two at 2r, 2r + 1 of it;
//   bytes  144..1167  32 chunks of 32 bytes; chunk j holds, for row r at bytes 4r..4r+3, the
//                     row's ql[4j..4j+3] as stored in its block_q6_K;
//   bytes 1168..1679  16 chunks of 32 bytes; chunk j holds row r's qh[4j..4j+3] likewise.
// In half h of a super-block (elements 128h..128h+127, e' = e - 128h) element e' has its low 4
// bits in nibble e'/64 of ql[64h + e'%64] and its top 2 bits in bits 2(e'/32) of qh[32h + e'%32]
// (ggml's layout). So every 32-bit lane of a chunk is one row and covers 4 consecutive elements
// of each of 2 (ql) or 4 (qh) element ranges: one 4-byte Q8_K activation broadcast serves all 8
// rows of a lane-wise byte product, and a sub-block's 8 per-row sums land in the 8 lanes of one
// register. The scales widen to the int16 pairs `madd` takes with one conversion, and each pair
// meets the activation's bsums (which take the +32 offset of the stored quants back out) in one
// `madd` per row group, not per row.
//
// Size. Exactly the bytes of the 8 rows in another order (1680 = 8 x 210): no extra space, and
// any row can be read back byte for byte (ExtractQ6_Kx8Row).
//
// This is llama.cpp's interleaved-rows idea, written here from the Q6_K block format; the byte
// order within a group is this file's own. Gathered (sparse) products keep the file's row
// layout (see MatrixView::interleaved).
//
// Expected, stated before measuring (docs/performance.md, "Q6_K interleaved 8 rows"): unlike
// Q4_K, most of Q6_K's work is per-row bit assembly (nibble plus two high bits, ~4 operations
// per 32 quant bytes) that interleaving cannot share; it shares the scale handling, the
// broadcasts and the offset and float steps. Per super-block and 8 rows ~480 vector operations
// against ~640 in the row kernel: ~1.3x in L2 (19.4 GB/s today, so ~25 GB/s).
#pragma once

#include <cstdint>

#include "shared/gguf/ggml_type.h"

namespace thermocline {

inline constexpr int64_t kQ6_Kx8Rows = 8;
inline constexpr int64_t kQ6_KRowBlockBytes = 210;  // block_q6_K
inline constexpr int64_t kQ6_Kx8DAt = 0;
inline constexpr int64_t kQ6_Kx8ScalesAt = 16;
inline constexpr int64_t kQ6_Kx8QlAt = 144;
inline constexpr int64_t kQ6_Kx8QhAt = 1168;
inline constexpr int64_t kQ6_Kx8BlockBytes = 1680;
static_assert(kQ6_Kx8BlockBytes == kQ6_Kx8Rows * kQ6_KRowBlockBytes);

// Groups of an interleaved matrix of `rows` rows, and bytes of one group of `cols` columns.
inline int64_t Q6_Kx8Groups(int64_t rows) { return (rows + kQ6_Kx8Rows - 1) / kQ6_Kx8Rows; }
inline int64_t Q6_Kx8GroupBytes(int64_t cols) { return cols / kQK_K * kQ6_Kx8BlockBytes; }

// Writes the interleaved form of `rows` Q6_K rows (`cols` columns, a multiple of 256; row r at
// src + r * row_bytes) to out, which holds Q6_Kx8Groups(rows) * Q6_Kx8GroupBytes(cols) bytes.
void InterleaveQ6_Kx8(const uint8_t* src, int64_t row_bytes, int64_t rows, int64_t cols,
                      uint8_t* out);

// Row r of an interleaved matrix, back in the row layout (RowBytes(kQ6_K, cols) bytes).
void ExtractQ6_Kx8Row(const uint8_t* interleaved, int64_t cols, int64_t r, uint8_t* row_out);

}  // namespace thermocline
