// Q4_0 weights interleaved 8 rows at a time: the Q4_0 case of legacy_x8.h (its layout, 144 bytes
// per group and block), under the names its kernels and tests have used since before Q5_0 and
// Q8_0 shared the format.
#pragma once

#include <cstdint>

#include "shared/gguf/ggml_type.h"
#include "shared/gguf/legacy_x8.h"

namespace thermocline {

inline constexpr int64_t kQ4_0x8Rows = kLegacyX8Rows;
inline constexpr int64_t kQ4_0x8ScaleBytes = kLegacyX8ScaleBytes;
inline constexpr int64_t kQ4_0x8BlockBytes = LegacyX8Format<GgmlType::kQ4_0>::kBlockBytes;
static_assert(kQ4_0x8BlockBytes == kQ4_0x8Rows * sizeof(BlockQ4_0));  // 144

inline int64_t Q4_0x8Groups(int64_t rows) { return LegacyX8Groups(rows); }
inline int64_t Q4_0x8GroupBytes(int64_t cols) { return LegacyX8GroupBytes<GgmlType::kQ4_0>(cols); }

inline void InterleaveQ4_0x8(const uint8_t* src, int64_t row_bytes, int64_t rows, int64_t cols,
                             uint8_t* out) {
  InterleaveLegacyX8<GgmlType::kQ4_0>(src, row_bytes, rows, cols, out);
}

inline void ExtractQ4_0x8Row(const uint8_t* interleaved, int64_t cols, int64_t r,
                             uint8_t* row_out) {
  ExtractLegacyX8Row<GgmlType::kQ4_0>(interleaved, cols, r, row_out);
}

}  // namespace thermocline
