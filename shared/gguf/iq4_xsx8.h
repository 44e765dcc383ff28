// IQ4_XS weights interleaved 8 rows at a time, for dense products that never need a single row.
//
// Layout. Rows are taken in groups of 8 (the last group padded with zero rows: d = 0 makes every
// product 0). A group holds, for each 256-column super-block b in order, 1088 bytes:
//   bytes   0..15    the 8 rows' fp16 d, row 0 first;
//   bytes  16..31    the 8 rows' scales_h (16 bits: two high bits of each sub-block's scale);
//   bytes  32..63    the 8 rows' scales_l (4 bytes: the low nibbles), row r at 4r..4r+3;
//   bytes  64..1087  32 chunks of 32 bytes; chunk j holds, for row r at bytes 4r..4r+3, the
//                    row's qs[4j..4j+3] as stored in its block_iq4_xs.
// Sub-block s (elements 32s..32s+31) is qs[16s..16s+15]: low nibbles are elements 32s + i,
// high nibbles 32s + 16 + i (ggml's layout), indices into the IQ4_NL values. So every 32-bit
// lane of a chunk is one row and covers 4 consecutive elements of each nibble: one 4-byte Q8_K
// activation broadcast serves all 8 rows of a lane-wise byte product, and a sub-block's 8
// per-row sums land in the 8 lanes of one register. A row's scale words sit in its lane too
// (scales_l as one 32-bit word, scales_h widened from 16), so each sub-block's scale comes out
// per lane with two shifts and masks.
//
// Size. Exactly the bytes of the 8 rows in another order (1088 = 8 x 136): no extra space, and
// any row can be read back byte for byte (ExtractIq4_XSx8Row).
//
// This is llama.cpp's interleaved-rows idea, written here from the IQ4_XS block format; the
// byte order within a group is this file's own. Gathered (sparse) products keep the file's row
// layout (see MatrixView::interleaved).
//
// Expected, stated before measuring (docs/performance.md, "IQ4_XS interleaved 8 rows"): the row
// kernel is compute-bound (in L2 about 16 GB/s on one Emerald Rapids core against a 16-17 GB/s
// read floor, so 82-83% from DRAM), spending per row pair and sub-block pair two table shuffles,
// two sign masks, two blends, two maddubs and two vpdpwssd on 64 bytes. Here a vpdpbusd takes the
// table's values + 128 (unsigned) against the activations directly, the +128 comes back out
// once per sub-block from the bsums, and 16 rows share every broadcast: about half the
// operations per weight byte, so the GEMV from DRAM should read near the interleaved Q4_K's
// 88-89% of the floor.
#pragma once

#include <cstdint>

#include "shared/gguf/ggml_type.h"

namespace thermocline {

inline constexpr int64_t kIq4_XSx8Rows = 8;
inline constexpr int64_t kIq4_XSRowBlockBytes = 136;  // block_iq4_xs
inline constexpr int64_t kIq4_XSx8DAt = 0;
inline constexpr int64_t kIq4_XSx8ScalesHAt = 16;
inline constexpr int64_t kIq4_XSx8ScalesLAt = 32;
inline constexpr int64_t kIq4_XSx8QsAt = 64;
inline constexpr int64_t kIq4_XSx8BlockBytes = 1088;
static_assert(kIq4_XSx8BlockBytes == kIq4_XSx8Rows * kIq4_XSRowBlockBytes);

// Groups of an interleaved matrix of `rows` rows, and bytes of one group of `cols` columns.
inline int64_t Iq4_XSx8Groups(int64_t rows) { return (rows + kIq4_XSx8Rows - 1) / kIq4_XSx8Rows; }
inline int64_t Iq4_XSx8GroupBytes(int64_t cols) { return cols / kQK_K * kIq4_XSx8BlockBytes; }

// Writes the interleaved form of `rows` IQ4_XS rows (`cols` columns, a multiple of 256; row r at
// src + r * row_bytes) to out, which holds Iq4_XSx8Groups(rows) * Iq4_XSx8GroupBytes(cols)
// bytes.
void InterleaveIq4_XSx8(const uint8_t* src, int64_t row_bytes, int64_t rows, int64_t cols,
                        uint8_t* out);

// Row r of an interleaved matrix, back in the row layout (RowBytes(kIQ4_XS, cols) bytes).
void ExtractIq4_XSx8Row(const uint8_t* interleaved, int64_t cols, int64_t r, uint8_t* row_out);

}  // namespace thermocline
