// Q4_0 weights interleaved 8 rows at a time, for dense products that never need a single row.
//
// Layout. Rows are taken in groups of 8 (the last group padded with zero rows, whose scale 0
// makes every product 0). A group holds, for each 32-column block b in order, 144 bytes:
//   bytes  0..15   the 8 rows' fp16 scales d, row 0 first;
//   bytes 16..143  four 32-byte chunks; chunk k holds, for row r = 0..7 at bytes 4r..4r+3,
//                  the row's qs[4k..4k+3] as stored in its BlockQ4_0.
// A row's qs[j] holds element j in its low nibble and element j + 16 in its high nibble, so in
// chunk k every 32-bit lane is one row: its low nibbles are elements 4k..4k+3 and its high
// nibbles elements 16+4k..16+4k+3. One 4-byte activation broadcast then serves all 8 rows of a
// lane-wise byte product, the 8 per-row block sums come out as the 8 lanes of one register (no
// horizontal sum, ever), and the 8 scales convert with one instruction. A group is exactly the
// bytes of its 8 rows (8 x 18 per block), only in another order: the copy costs no extra space
// per row, and any row can be read back (ExtractQ4_0x8Row) byte for byte.
//
// This is llama.cpp's Q4_0_8_8 idea (rows interleaved so that scales and byte products are
// shared across rows), written here from the Q4_0 block format; the byte order within a group
// is this file's own. Gathered (sparse) products keep the file's row layout: the interleaved
// copy is an addition, never a replacement (see MatrixView::interleaved).
#pragma once

#include <cstdint>

#include "shared/gguf/ggml_type.h"

namespace thermocline {

inline constexpr int64_t kQ4_0x8Rows = 8;
inline constexpr int64_t kQ4_0x8ScaleBytes = kQ4_0x8Rows * 2;
inline constexpr int64_t kQ4_0x8BlockBytes = kQ4_0x8Rows * sizeof(BlockQ4_0);  // 144
static_assert(kQ4_0x8BlockBytes == kQ4_0x8ScaleBytes + kQ4_0x8Rows * kQK / 2);

// Groups of an interleaved matrix of `rows` rows, and bytes of one group of `cols` columns.
inline int64_t Q4_0x8Groups(int64_t rows) { return (rows + kQ4_0x8Rows - 1) / kQ4_0x8Rows; }
inline int64_t Q4_0x8GroupBytes(int64_t cols) { return cols / kQK * kQ4_0x8BlockBytes; }

// Writes the interleaved form of `rows` Q4_0 rows (`cols` columns, a multiple of 32; row r at
// src + r * row_bytes) to out, which holds Q4_0x8Groups(rows) * Q4_0x8GroupBytes(cols) bytes.
void InterleaveQ4_0x8(const uint8_t* src, int64_t row_bytes, int64_t rows, int64_t cols,
                      uint8_t* out);

// Row r of an interleaved matrix, back in the row layout (RowBytes(kQ4_0, cols) bytes).
void ExtractQ4_0x8Row(const uint8_t* interleaved, int64_t cols, int64_t r, uint8_t* row_out);

}  // namespace thermocline
