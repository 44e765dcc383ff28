#include "shared/gguf/q4_kx8.h"

#include <cstring>

#include "shared/gguf/quant.h"

namespace thermocline {
namespace {

// The two layouts' offsets: Q4_K, or (kHigh) Q5_K with its qh.
template <bool kHigh>
struct Layout {
  static constexpr int64_t kRowBlock = kHigh ? kQ5_KRowBlockBytes : kQ4_KRowBlockBytes;
  static constexpr int64_t kRowQs = kHigh ? 48 : 16;  // qs in block_q4_K / block_q5_K
  static constexpr int64_t kBlock = kHigh ? kQ5_Kx8BlockBytes : kQ4_Kx8BlockBytes;
  static constexpr int64_t kQs = kHigh ? kQ5_Kx8QsAt : kQ4_Kx8QsAt;
  static int64_t GroupBytes(int64_t cols) { return cols / kQK_K * kBlock; }
};

// Byte offset, inside a group's super-block, of row r's 4 bytes of chunk j at `base`.
constexpr int64_t ChunkAt(int64_t base, int64_t r, int64_t j) { return base + 32 * j + 4 * r; }
// Byte offset of row r's scale (kQ4_Kx8ScalesAt) or min (kQ4_Kx8MinsAt) of sub-block s.
constexpr int64_t SubAt(int64_t base, int64_t r, int64_t s) {
  return base + 16 * (s / 2) + 2 * r + s % 2;
}

// ggml's 6-bit packing of 8 scales and 8 mins into 12 bytes (the inverse of Q4KScaleMin,
// quantize_row_q4_K_ref's packing): sub-blocks 0..3 in the low 6 bits of bytes 0..3 (scales)
// and 4..7 (mins); sub-blocks 4..7 with their low 4 bits in bytes 8..11 (scale low, min high
// nibble) and their high 2 bits in the top bits of bytes 0..3 (scales) and 4..7 (mins).
void PackScalesMins(const uint8_t* sc, const uint8_t* mn, uint8_t* packed) {
  for (int j = 0; j < 4; ++j) {
    packed[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    packed[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
    packed[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0x0F) | ((mn[j + 4] & 0x0F) << 4));
  }
}

template <bool kHigh>
void Interleave(const uint8_t* src, int64_t row_bytes, int64_t rows, int64_t cols, uint8_t* out) {
  using L = Layout<kHigh>;
  std::memset(out, 0, (rows + kQ4_Kx8Rows - 1) / kQ4_Kx8Rows * L::GroupBytes(cols));
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* group = out + (r / kQ4_Kx8Rows) * L::GroupBytes(cols);
    const int64_t i = r % kQ4_Kx8Rows;
    const uint8_t* row = src + r * row_bytes;
    for (int64_t b = 0; b < cols / kQK_K; ++b) {
      const uint8_t* blk = row + b * L::kRowBlock;
      uint8_t* dst = group + b * L::kBlock;
      std::memcpy(dst + kQ4_Kx8DAt + 2 * i, blk, 2);
      std::memcpy(dst + kQ4_Kx8DminAt + 2 * i, blk + 2, 2);
      for (int s = 0; s < 8; ++s) {
        int sc, m;
        Q4KScaleMin(blk + 4, s, &sc, &m);
        dst[SubAt(kQ4_Kx8ScalesAt, i, s)] = static_cast<uint8_t>(sc);
        dst[SubAt(kQ4_Kx8MinsAt, i, s)] = static_cast<uint8_t>(m);
      }
      if constexpr (kHigh) {
        for (int64_t j = 0; j < 8; ++j) {
          std::memcpy(dst + ChunkAt(kQ5_Kx8QhAt, i, j), blk + 16 + 4 * j, 4);
        }
      }
      for (int64_t j = 0; j < 32; ++j) {
        std::memcpy(dst + ChunkAt(L::kQs, i, j), blk + L::kRowQs + 4 * j, 4);
      }
    }
  }
}

template <bool kHigh>
void Extract(const uint8_t* interleaved, int64_t cols, int64_t r, uint8_t* row_out) {
  using L = Layout<kHigh>;
  const uint8_t* group = interleaved + (r / kQ4_Kx8Rows) * L::GroupBytes(cols);
  const int64_t i = r % kQ4_Kx8Rows;
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const uint8_t* src = group + b * L::kBlock;
    uint8_t* blk = row_out + b * L::kRowBlock;
    std::memcpy(blk, src + kQ4_Kx8DAt + 2 * i, 2);
    std::memcpy(blk + 2, src + kQ4_Kx8DminAt + 2 * i, 2);
    uint8_t sc[8], mn[8];
    for (int s = 0; s < 8; ++s) {
      sc[s] = src[SubAt(kQ4_Kx8ScalesAt, i, s)];
      mn[s] = src[SubAt(kQ4_Kx8MinsAt, i, s)];
    }
    PackScalesMins(sc, mn, blk + 4);
    if constexpr (kHigh) {
      for (int64_t j = 0; j < 8; ++j) {
        std::memcpy(blk + 16 + 4 * j, src + ChunkAt(kQ5_Kx8QhAt, i, j), 4);
      }
    }
    for (int64_t j = 0; j < 32; ++j) {
      std::memcpy(blk + L::kRowQs + 4 * j, src + ChunkAt(L::kQs, i, j), 4);
    }
  }
}

}  // namespace

void InterleaveQ4_Kx8(const uint8_t* src, int64_t row_bytes, int64_t rows, int64_t cols,
                      uint8_t* out) {
  Interleave<false>(src, row_bytes, rows, cols, out);
}

void ExtractQ4_Kx8Row(const uint8_t* interleaved, int64_t cols, int64_t r, uint8_t* row_out) {
  Extract<false>(interleaved, cols, r, row_out);
}

void InterleaveQ5_Kx8(const uint8_t* src, int64_t row_bytes, int64_t rows, int64_t cols,
                      uint8_t* out) {
  Interleave<true>(src, row_bytes, rows, cols, out);
}

void ExtractQ5_Kx8Row(const uint8_t* interleaved, int64_t cols, int64_t r, uint8_t* row_out) {
  Extract<true>(interleaved, cols, r, row_out);
}

}  // namespace thermocline
