// Q4_K (and Q5_K) weights interleaved 8 rows at a time, for dense products that never need a
// single row.
//
// Layout. Rows are taken in groups of 8 (the last group padded with zero rows: d = dmin = 0
// makes every product 0). A group holds, for each 256-column super-block b in order, 1184 bytes:
//   bytes    0..15    the 8 rows' fp16 d, row 0 first;
//   bytes   16..31    the 8 rows' fp16 dmin;
//   bytes   32..95    the sub-block scales as bytes: pair p (sub-blocks 2p, 2p + 1) at 32 + 16p,
//                     row r's two at 2r, 2r + 1 of it;
//   bytes   96..159   the sub-block mins, in the same order;
//   bytes  160..1183  32 chunks of 32 bytes; chunk j holds, for row r at bytes 4r..4r+3, the
//                     row's qs[4j..4j+3] as stored in its block_q4_K.
// A row's qs[32g + l] holds element 64g + l in its low nibble (sub-block 2g) and element
// 64g + 32 + l in its high nibble (sub-block 2g + 1). So in chunk j = 8g + k every 32-bit lane is
// one row, its low nibbles elements 64g+4k..64g+4k+3 and its high nibbles 64g+32+4k..+3: one
// 4-byte Q8_K activation broadcast serves all 8 rows of a lane-wise byte product, and a
// sub-block's 8 per-row sums land in the 8 lanes of one register (no horizontal sum, ever).
// The scales and mins are unpacked from ggml's 6-bit packing (get_scale_min_k4) once, here, and
// widen to the int16 pairs `madd` takes with one conversion: the kernel does no bit unpacking
// of them. Each 16-byte pair of a register's worth of mins meets the activation's sub-block
// sums in one `madd` per row group, not per row. The d and dmin of 8 rows convert with one F16C
// instruction each.
//
// Size. A row's 12 packed bytes of scales and mins become 16: 148 bytes per row and super-block
// instead of 144, +2.8% (1184 = 8 x 148). The 6-bit packing uses every bit of its 12 bytes, so
// any row can be read back byte for byte (ExtractQ4_Kx8Row) by packing them again.
//
// Q5_K is Q4_K plus a fifth bit per quant (bit e/32 of its qh[e % 32]): its groups are Q4_K's
// with the 8 rows' qh inserted before the nibbles, 8 chunks of 32 bytes (chunk k holding row r's
// qh[4k..4k+3] at 4r), the nibble chunks following at 416; 1440 bytes per super-block, 180 per
// row against 176 (+2.3%). A qh chunk k serves the nibble chunks 8g + k of every g.
//
// This is llama.cpp's Q4_K_8x8 idea (rows interleaved so that scales and byte products are
// shared across rows), written here from the Q4_K block format; the byte order within a group
// is this file's own. Gathered (sparse) products keep the file's row layout: the interleaved
// copy is an addition, never a replacement (see MatrixView::interleaved).
//
// Expected, stated before measuring (docs/performance.md, "Q4_K interleaved 8 rows"): per
// super-block and 8 rows the AVX2 kernel spends ~110 vector ALU operations shared by the tokens
// of a tile (nibble masks and shifts, scale widening, two F16C conversions) and ~150 per token
// (64 maddubs, 56 int16 adds, 12 madd, the conversions and FMAs), ~260 in all for GEMV, against
// ~60 per row and super-block (~480 for 8 rows) in the row kernel: ~1.8x fewer. The row
// kernel's in-L2 GEMV is 16 GB/s at one thread (49% of the read floor); this one should reach
// ~25-28 GB/s in L2 (~1.6x), i.e. 0.75-0.85 of the one-thread read floor out of DRAM, and less
// gain at two threads where the row kernel is already nearer the floor.
#pragma once

#include <cstdint>

#include "shared/gguf/ggml_type.h"

namespace thermocline {

inline constexpr int64_t kQ4_Kx8Rows = 8;
inline constexpr int64_t kQ4_KRowBlockBytes = 144;  // block_q4_K
inline constexpr int64_t kQ4_Kx8DAt = 0;
inline constexpr int64_t kQ4_Kx8DminAt = 16;
inline constexpr int64_t kQ4_Kx8ScalesAt = 32;
inline constexpr int64_t kQ4_Kx8MinsAt = 96;
inline constexpr int64_t kQ4_Kx8QsAt = 160;
inline constexpr int64_t kQ4_Kx8BlockBytes = 1184;
static_assert(kQ4_Kx8BlockBytes == kQ4_Kx8QsAt + kQ4_Kx8Rows * kQK_K / 2);
// Q5_K: d, dmin, scales and mins at Q4_K's offsets, then qh and the nibbles.
inline constexpr int64_t kQ5_KRowBlockBytes = 176;  // block_q5_K
inline constexpr int64_t kQ5_Kx8QhAt = 160;
inline constexpr int64_t kQ5_Kx8QsAt = 416;
inline constexpr int64_t kQ5_Kx8BlockBytes = 1440;
static_assert(kQ5_Kx8BlockBytes == kQ5_Kx8QsAt + kQ4_Kx8Rows * kQK_K / 2);

// Groups of an interleaved matrix of `rows` rows, and bytes of one group of `cols` columns.
inline int64_t Q4_Kx8Groups(int64_t rows) { return (rows + kQ4_Kx8Rows - 1) / kQ4_Kx8Rows; }
inline int64_t Q4_Kx8GroupBytes(int64_t cols) { return cols / kQK_K * kQ4_Kx8BlockBytes; }

// Writes the interleaved form of `rows` Q4_K rows (`cols` columns, a multiple of 256; row r at
// src + r * row_bytes) to out, which holds Q4_Kx8Groups(rows) * Q4_Kx8GroupBytes(cols) bytes.
void InterleaveQ4_Kx8(const uint8_t* src, int64_t row_bytes, int64_t rows, int64_t cols,
                      uint8_t* out);

// Row r of an interleaved matrix, back in the row layout (RowBytes(kQ4_K, cols) bytes).
void ExtractQ4_Kx8Row(const uint8_t* interleaved, int64_t cols, int64_t r, uint8_t* row_out);

// The same for Q5_K (groups of Q5_Kx8GroupBytes, rows of RowBytes(kQ5_K, cols) bytes).
inline int64_t Q5_Kx8GroupBytes(int64_t cols) { return cols / kQK_K * kQ5_Kx8BlockBytes; }
void InterleaveQ5_Kx8(const uint8_t* src, int64_t row_bytes, int64_t rows, int64_t cols,
                      uint8_t* out);
void ExtractQ5_Kx8Row(const uint8_t* interleaved, int64_t cols, int64_t r, uint8_t* row_out);

}  // namespace thermocline
