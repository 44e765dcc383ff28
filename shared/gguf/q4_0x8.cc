#include "shared/gguf/q4_0x8.h"

#include <cstring>

namespace thermocline {
namespace {

// Byte offset, inside a group's block, of row r's qs[4k..4k+3].
constexpr int64_t QsAt(int64_t r, int64_t k) { return kQ4_0x8ScaleBytes + 32 * k + 4 * r; }

}  // namespace

void InterleaveQ4_0x8(const uint8_t* src, int64_t row_bytes, int64_t rows, int64_t cols,
                      uint8_t* out) {
  const int64_t n_blocks = cols / kQK;
  const int64_t groups = Q4_0x8Groups(rows);
  std::memset(out, 0, groups * Q4_0x8GroupBytes(cols));
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* group = out + (r / kQ4_0x8Rows) * Q4_0x8GroupBytes(cols);
    const int64_t i = r % kQ4_0x8Rows;
    const uint8_t* row = src + r * row_bytes;
    for (int64_t b = 0; b < n_blocks; ++b) {
      const uint8_t* blk = row + b * static_cast<int64_t>(sizeof(BlockQ4_0));
      uint8_t* dst = group + b * kQ4_0x8BlockBytes;
      std::memcpy(dst + 2 * i, blk, 2);
      for (int64_t k = 0; k < 4; ++k) std::memcpy(dst + QsAt(i, k), blk + 2 + 4 * k, 4);
    }
  }
}

void ExtractQ4_0x8Row(const uint8_t* interleaved, int64_t cols, int64_t r, uint8_t* row_out) {
  const uint8_t* group = interleaved + (r / kQ4_0x8Rows) * Q4_0x8GroupBytes(cols);
  const int64_t i = r % kQ4_0x8Rows;
  for (int64_t b = 0; b < cols / kQK; ++b) {
    const uint8_t* src = group + b * kQ4_0x8BlockBytes;
    uint8_t* blk = row_out + b * static_cast<int64_t>(sizeof(BlockQ4_0));
    std::memcpy(blk, src + 2 * i, 2);
    for (int64_t k = 0; k < 4; ++k) std::memcpy(blk + 2 + 4 * k, src + QsAt(i, k), 4);
  }
}

}  // namespace thermocline
