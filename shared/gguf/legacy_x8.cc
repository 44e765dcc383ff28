#include "shared/gguf/legacy_x8.h"

#include <cstring>

namespace thermocline {
namespace {

// The Q5_0 fifth-bit word (legacy_x8.h): bit 8j + p holds the fifth bit of byte j of plane p,
// the file's qh bit of that element.
constexpr int QhSource(int bit) {
  return static_cast<int>(LegacyX8Format<GgmlType::kQ5_0>::PlaneElement(bit % 8)) + bit / 8;
}

uint32_t PermuteQh(uint32_t qh) {
  uint32_t out = 0;
  for (int bit = 0; bit < 32; ++bit) out |= ((qh >> QhSource(bit)) & 1u) << bit;
  return out;
}

uint32_t UnpermuteQh(uint32_t word) {
  uint32_t qh = 0;
  for (int bit = 0; bit < 32; ++bit) qh |= ((word >> bit) & 1u) << QhSource(bit);
  return qh;
}

uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

void StoreU32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

// Byte offset, inside a group's block, of row i's qs[4k..4k+3].
template <GgmlType kType>
constexpr int64_t QsAt(int64_t i, int64_t k) {
  return LegacyX8Format<kType>::kChunksAt + 32 * k + 4 * i;
}

}  // namespace

template <GgmlType kType>
void InterleaveLegacyX8(const uint8_t* src, int64_t row_bytes, int64_t rows, int64_t cols,
                        uint8_t* out) {
  using F = LegacyX8Format<kType>;
  const int64_t group_bytes = LegacyX8GroupBytes<kType>(cols);
  std::memset(out, 0, LegacyX8Groups(rows) * group_bytes);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* group = out + (r / kLegacyX8Rows) * group_bytes;
    const uint8_t* row = src + r * row_bytes;
    const int64_t i = r % kLegacyX8Rows;
    for (int64_t b = 0; b < cols / kQK; ++b) {
      const uint8_t* blk = row + b * F::kRowBlockBytes;
      uint8_t* dst = group + b * F::kBlockBytes;
      std::memcpy(dst + 2 * i, blk, 2);
      if constexpr (F::kQhBytes != 0) StoreU32(dst + F::kQhAt + 4 * i, PermuteQh(LoadU32(blk + 2)));
      const uint8_t* qs = blk + 2 + F::kQhBytes;
      for (int64_t k = 0; k < F::kChunks; ++k) std::memcpy(dst + QsAt<kType>(i, k), qs + 4 * k, 4);
    }
  }
}

template <GgmlType kType>
void ExtractLegacyX8Row(const uint8_t* interleaved, int64_t cols, int64_t r, uint8_t* row_out) {
  using F = LegacyX8Format<kType>;
  const uint8_t* group = interleaved + (r / kLegacyX8Rows) * LegacyX8GroupBytes<kType>(cols);
  const int64_t i = r % kLegacyX8Rows;
  for (int64_t b = 0; b < cols / kQK; ++b) {
    const uint8_t* src = group + b * F::kBlockBytes;
    uint8_t* blk = row_out + b * F::kRowBlockBytes;
    std::memcpy(blk, src + 2 * i, 2);
    if constexpr (F::kQhBytes != 0) StoreU32(blk + 2, UnpermuteQh(LoadU32(src + F::kQhAt + 4 * i)));
    uint8_t* qs = blk + 2 + F::kQhBytes;
    for (int64_t k = 0; k < F::kChunks; ++k) std::memcpy(qs + 4 * k, src + QsAt<kType>(i, k), 4);
  }
}

#define THERMOCLINE_LEGACY_X8(T)                                                            \
  template void InterleaveLegacyX8<T>(const uint8_t*, int64_t, int64_t, int64_t, uint8_t*); \
  template void ExtractLegacyX8Row<T>(const uint8_t*, int64_t, int64_t, uint8_t*);
THERMOCLINE_LEGACY_X8(GgmlType::kQ4_0)
THERMOCLINE_LEGACY_X8(GgmlType::kQ5_0)
THERMOCLINE_LEGACY_X8(GgmlType::kQ8_0)
#undef THERMOCLINE_LEGACY_X8

}  // namespace thermocline
