// The 32-element block types Q4_0, Q5_0 and Q8_0 interleaved 8 rows at a time, for dense
// products that never need a single row: one format and one repack for the three, which differ
// only in how a row's quants become bytes.
//
// Layout. Rows are taken in groups of 8 (the last group padded with zero rows, whose scale 0
// makes every product 0). A group holds, for each 32-column block b in order, 8 x the type's
// block bytes (Q4_0 144, Q5_0 176, Q8_0 272):
//   bytes  0..15       the 8 rows' fp16 scales d, row 0 first;
//   Q5_0 only, 16..47  the 8 rows' 32 fifth bits, row r's as the 32-bit word at 16 + 4r, in the
//                      order below;
//   then               32-byte chunks (Q4_0 and Q5_0 4, Q8_0 8); chunk k holds, for row r at
//                      bytes 4r..4r+3, the row's qs[4k..4k+3] as stored in its block.
// In every chunk a 32-bit lane is one row: one 4-byte activation broadcast serves all 8 rows of
// a lane-wise byte product, the 8 per-row block sums come out as the 8 lanes of one register (no
// horizontal sum, ever), and the 8 scales convert with one instruction. A Q4_0 / Q5_0 qs[j]
// holds element j in its low nibble and element j + 16 in its high nibble, so chunk k's low
// nibbles are elements 4k..4k+3 and its high nibbles 16+4k..16+4k+3: the kernels' eight
// 32-byte "planes" per block are p = 2k (low nibbles of chunk k) and p = 2k + 1 (high nibbles);
// Q8_0's plane p is chunk p. A Q5_0 row's fifth-bit word holds at bit 8j + p the fifth bit of
// byte j of plane p, that is of element 16 (p % 2) + 4 (p / 2) + j (the file's qh bit of that
// element): one shift and one mask put a plane's 32 fifth bits at bit 4 of its bytes.
//
// A group is exactly the bytes of its 8 rows, only in another order (Q5_0's qh bits permuted
// within their word): the copy costs no extra space per row, and any row can be read back
// (ExtractLegacyX8Row) byte for byte.
//
// This is llama.cpp's Q4_0_8_8 idea (rows interleaved so that scales and byte products are
// shared across rows), written here from the block formats; the byte order within a group is
// this file's own. Gathered (sparse) products keep the file's row layout: the interleaved copy
// is an addition, never a replacement (see MatrixView::interleaved).
#pragma once

#include <cstdint>

#include "shared/gguf/ggml_type.h"

namespace thermocline {

inline constexpr int64_t kLegacyX8Rows = 8;
inline constexpr int64_t kLegacyX8ScaleBytes = kLegacyX8Rows * 2;

// The format constants of one type (kQ4_0, kQ5_0 or kQ8_0).
template <GgmlType kType>
struct LegacyX8Format {
  static_assert(kType == GgmlType::kQ4_0 || kType == GgmlType::kQ5_0 || kType == GgmlType::kQ8_0);
  // A row's block: [d][qh u32, Q5_0 only][qs].
  static constexpr int64_t kQhBytes = kType == GgmlType::kQ5_0 ? 4 : 0;
  static constexpr int64_t kQsBytes = kType == GgmlType::kQ8_0 ? kQK : kQK / 2;
  static constexpr int64_t kRowBlockBytes = 2 + kQhBytes + kQsBytes;
  // Offsets inside a group's block.
  static constexpr int64_t kQhAt = kLegacyX8ScaleBytes;
  static constexpr int64_t kChunksAt = kQhAt + kLegacyX8Rows * kQhBytes;
  static constexpr int64_t kChunks = kQsBytes / 4;
  static constexpr int64_t kBlockBytes = kLegacyX8Rows * kRowBlockBytes;
  static_assert(kBlockBytes == kChunksAt + 32 * kChunks);
  // The block element in byte 0 of plane p's row lanes (bytes 1..3 hold the next three).
  static constexpr int64_t PlaneElement(int64_t p) {
    return kType == GgmlType::kQ8_0 ? 4 * p : 16 * (p % 2) + 4 * (p / 2);
  }
};

// Groups of an interleaved matrix of `rows` rows, and bytes of one group of `cols` columns.
inline int64_t LegacyX8Groups(int64_t rows) { return (rows + kLegacyX8Rows - 1) / kLegacyX8Rows; }
template <GgmlType kType>
int64_t LegacyX8GroupBytes(int64_t cols) {
  return cols / kQK * LegacyX8Format<kType>::kBlockBytes;
}

// Writes the interleaved form of `rows` rows (`cols` columns, a multiple of 32; row r at
// src + r * row_bytes) to out, which holds LegacyX8Groups(rows) * LegacyX8GroupBytes(cols) bytes.
template <GgmlType kType>
void InterleaveLegacyX8(const uint8_t* src, int64_t row_bytes, int64_t rows, int64_t cols,
                        uint8_t* out);

// Row r of an interleaved matrix, back in the row layout (RowBytes(kType, cols) bytes).
template <GgmlType kType>
void ExtractLegacyX8Row(const uint8_t* interleaved, int64_t cols, int64_t r, uint8_t* row_out);

}  // namespace thermocline
