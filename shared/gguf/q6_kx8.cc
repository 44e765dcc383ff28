#include "shared/gguf/q6_kx8.h"

#include <cstdint>

#include "shared/gguf/interleave_pieces.h"

namespace thermocline {
namespace {

// block_q6_K: ql[128] at 0, qh[64] at 128, int8 scales[16] at 192, fp16 d at 208.
constexpr int64_t kRowQh = 128, kRowScales = 192, kRowD = 208;

// Byte offset, inside a group's super-block, of row r's 4 bytes of chunk j at `base`.
constexpr int64_t ChunkAt(int64_t base, int64_t r, int64_t j) { return base + 32 * j + 4 * r; }
// Byte offset of row r's scale of sub-block s.
constexpr int64_t ScaleAt(int64_t r, int64_t s) {
  return kQ6_Kx8ScalesAt + 16 * (s / 2) + 2 * r + s % 2;
}

// Calls piece(row_offset, group_offset, bytes) for every piece of row r's super-block: where
// each of its bytes sits in the row and in the group.
template <class Piece>
void ForEachPiece(int64_t r, Piece&& piece) {
  piece(kRowD, kQ6_Kx8DAt + 2 * r, 2);
  for (int64_t s = 0; s < 16; ++s) piece(kRowScales + s, ScaleAt(r, s), 1);
  for (int64_t j = 0; j < 32; ++j) piece(4 * j, ChunkAt(kQ6_Kx8QlAt, r, j), 4);
  for (int64_t j = 0; j < 16; ++j) piece(kRowQh + 4 * j, ChunkAt(kQ6_Kx8QhAt, r, j), 4);
}

}  // namespace

void InterleaveQ6_Kx8(const uint8_t* src, int64_t row_bytes, int64_t rows, int64_t cols,
                      uint8_t* out) {
  interleave_internal::InterleaveByPieces<kQ6_Kx8Rows, kQ6_KRowBlockBytes>(
      [](int64_t r, auto&& piece) { ForEachPiece(r, piece); }, src, row_bytes, rows, cols, out);
}

void ExtractQ6_Kx8Row(const uint8_t* interleaved, int64_t cols, int64_t r, uint8_t* row_out) {
  interleave_internal::ExtractRowByPieces<kQ6_Kx8Rows, kQ6_KRowBlockBytes>(
      [](int64_t r, auto&& piece) { ForEachPiece(r, piece); }, interleaved, cols, r, row_out);
}

}  // namespace thermocline
