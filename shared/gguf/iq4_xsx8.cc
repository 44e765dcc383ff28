#include "shared/gguf/iq4_xsx8.h"

#include <cstdint>

#include "shared/gguf/interleave_pieces.h"

namespace thermocline {
namespace {

// block_iq4_xs: fp16 d at 0, uint16 scales_h at 2, scales_l[4] at 4, qs[128] at 8.
constexpr int64_t kRowScalesH = 2, kRowScalesL = 4, kRowQs = 8;

// Calls piece(row_offset, group_offset, bytes) for every piece of row r's super-block: where
// each of its bytes sits in the row and in the group.
template <class Piece>
void ForEachPiece(int64_t r, Piece&& piece) {
  piece(0, kIq4_XSx8DAt + 2 * r, 2);
  piece(kRowScalesH, kIq4_XSx8ScalesHAt + 2 * r, 2);
  piece(kRowScalesL, kIq4_XSx8ScalesLAt + 4 * r, 4);
  for (int64_t j = 0; j < 32; ++j) piece(kRowQs + 4 * j, kIq4_XSx8QsAt + 32 * j + 4 * r, 4);
}

}  // namespace

void InterleaveIq4_XSx8(const uint8_t* src, int64_t row_bytes, int64_t rows, int64_t cols,
                        uint8_t* out) {
  interleave_internal::InterleaveByPieces<kIq4_XSx8Rows, kIq4_XSRowBlockBytes>(
      [](int64_t r, auto&& piece) { ForEachPiece(r, piece); }, src, row_bytes, rows, cols, out);
}

void ExtractIq4_XSx8Row(const uint8_t* interleaved, int64_t cols, int64_t r, uint8_t* row_out) {
  interleave_internal::ExtractRowByPieces<kIq4_XSx8Rows, kIq4_XSRowBlockBytes>(
      [](int64_t r, auto&& piece) { ForEachPiece(r, piece); }, interleaved, cols, r, row_out);
}

}  // namespace thermocline
