#include "shared/gguf/q3_kx8.h"

#include <cstdint>

#include "shared/gguf/interleave_pieces.h"

namespace thermocline {
namespace {

// block_q3_K: hmask[32] at 0, qs[64] at 32, scales[12] at 96, fp16 d at 108.
constexpr int64_t kRowQs = 32, kRowScales = 96, kRowD = 108;

// Calls piece(row_offset, group_offset, bytes) for every piece of row r's super-block: where
// each of its bytes sits in the row and in the group.
template <class Piece>
void ForEachPiece(int64_t r, Piece&& piece) {
  piece(kRowD, kQ3_Kx8DAt + 2 * r, 2);
  for (int64_t k = 0; k < 3; ++k) piece(kRowScales + 4 * k, kQ3_Kx8ScalesAt + 32 * k + 4 * r, 4);
  for (int64_t j = 0; j < 8; ++j) piece(4 * j, kQ3_Kx8HmaskAt + 32 * j + 4 * r, 4);
  for (int64_t j = 0; j < 16; ++j) piece(kRowQs + 4 * j, kQ3_Kx8QsAt + 32 * j + 4 * r, 4);
}

}  // namespace

void InterleaveQ3_Kx8(const uint8_t* src, int64_t row_bytes, int64_t rows, int64_t cols,
                      uint8_t* out) {
  interleave_internal::InterleaveByPieces<kQ3_Kx8Rows, kQ3_KRowBlockBytes>(
      [](int64_t r, auto&& piece) { ForEachPiece(r, piece); }, src, row_bytes, rows, cols, out);
}

void ExtractQ3_Kx8Row(const uint8_t* interleaved, int64_t cols, int64_t r, uint8_t* row_out) {
  interleave_internal::ExtractRowByPieces<kQ3_Kx8Rows, kQ3_KRowBlockBytes>(
      [](int64_t r, auto&& piece) { ForEachPiece(r, piece); }, interleaved, cols, r, row_out);
}

}  // namespace thermocline
