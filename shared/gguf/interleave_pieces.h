// What the 8-row layouts that only move bytes share (q6_kx8.cc, iq4_xsx8.cc): each row's
// super-block goes into its group's super-block in pieces, which the layout lists with
// for_each_piece(row_in_group, piece), calling piece(row_offset, group_offset, bytes) for every
// piece. The last group is padded with zero rows.
#pragma once

#include <cstdint>
#include <cstring>

#include "shared/gguf/ggml_type.h"

namespace thermocline::interleave_internal {

template <int64_t kRows, int64_t kRowBlockBytes, class ForEachPiece>
void InterleaveByPieces(ForEachPiece&& for_each_piece, const uint8_t* src, int64_t row_bytes,
                        int64_t rows, int64_t cols, uint8_t* out) {
  const int64_t n_blocks = cols / kQK_K, group_bytes = n_blocks * kRows * kRowBlockBytes;
  std::memset(out, 0, (rows + kRows - 1) / kRows * group_bytes);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* group = out + (r / kRows) * group_bytes;
    for (int64_t b = 0; b < n_blocks; ++b) {
      const uint8_t* blk = src + r * row_bytes + b * kRowBlockBytes;
      uint8_t* dst = group + b * kRows * kRowBlockBytes;
      for_each_piece(r % kRows, [&](int64_t at_row, int64_t at_group, size_t n) {
        std::memcpy(dst + at_group, blk + at_row, n);
      });
    }
  }
}

template <int64_t kRows, int64_t kRowBlockBytes, class ForEachPiece>
void ExtractRowByPieces(ForEachPiece&& for_each_piece, const uint8_t* interleaved, int64_t cols,
                        int64_t r, uint8_t* row_out) {
  const int64_t n_blocks = cols / kQK_K, group_bytes = n_blocks * kRows * kRowBlockBytes;
  const uint8_t* group = interleaved + (r / kRows) * group_bytes;
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint8_t* src = group + b * kRows * kRowBlockBytes;
    uint8_t* blk = row_out + b * kRowBlockBytes;
    for_each_piece(r % kRows, [&](int64_t at_row, int64_t at_group, size_t n) {
      std::memcpy(blk + at_row, src + at_group, n);
    });
  }
}

}  // namespace thermocline::interleave_internal
