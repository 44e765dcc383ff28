#include "shared/gguf/interleaved8.h"

#include <cstdlib>

#include "shared/gguf/iq4_xsx8.h"
#include "shared/gguf/legacy_x8.h"
#include "shared/gguf/q3_kx8.h"
#include "shared/gguf/q4_kx8.h"
#include "shared/gguf/q6_kx8.h"

namespace thermocline {
namespace {

struct Layout {
  GgmlType type;
  int64_t (*group_bytes)(int64_t cols);
  void (*interleave)(const uint8_t*, int64_t, int64_t, int64_t, uint8_t*);
  void (*extract)(const uint8_t*, int64_t, int64_t, uint8_t*);
};
static_assert(kLegacyX8Rows == kInterleaved8Rows && kQ4_Kx8Rows == kInterleaved8Rows &&
              kQ6_Kx8Rows == kInterleaved8Rows && kIq4_XSx8Rows == kInterleaved8Rows &&
              kQ3_Kx8Rows == kInterleaved8Rows);

template <GgmlType kType>
constexpr Layout LegacyLayout() {
  return {kType, &LegacyX8GroupBytes<kType>, &InterleaveLegacyX8<kType>,
          &ExtractLegacyX8Row<kType>};
}

constexpr Layout kLayouts[] = {
    LegacyLayout<GgmlType::kQ4_0>(),
    LegacyLayout<GgmlType::kQ5_0>(),
    LegacyLayout<GgmlType::kQ8_0>(),
    {GgmlType::kQ3_K, &Q3_Kx8GroupBytes, &InterleaveQ3_Kx8, &ExtractQ3_Kx8Row},
    {GgmlType::kQ4_K, &Q4_Kx8GroupBytes, &InterleaveQ4_Kx8, &ExtractQ4_Kx8Row},
    {GgmlType::kQ5_K, &Q5_Kx8GroupBytes, &InterleaveQ5_Kx8, &ExtractQ5_Kx8Row},
    {GgmlType::kQ6_K, &Q6_Kx8GroupBytes, &InterleaveQ6_Kx8, &ExtractQ6_Kx8Row},
    {GgmlType::kIQ4_XS, &Iq4_XSx8GroupBytes, &InterleaveIq4_XSx8, &ExtractIq4_XSx8Row},
};

const Layout* Find(GgmlType type) {
  for (const Layout& l : kLayouts) {
    if (l.type == type) return &l;
  }
  return nullptr;
}

const Layout& Get(GgmlType type) {
  // Callers check HasInterleaved8Layout first; anything else is a programming error.
  const Layout* l = Find(type);
  if (l == nullptr) std::abort();
  return *l;
}

}  // namespace

bool HasInterleaved8Layout(GgmlType type) { return Find(type) != nullptr; }

int64_t Interleaved8GroupBytes(GgmlType type, int64_t cols) { return Get(type).group_bytes(cols); }

int64_t Interleaved8Bytes(GgmlType type, int64_t rows, int64_t cols) {
  return (rows + kInterleaved8Rows - 1) / kInterleaved8Rows * Interleaved8GroupBytes(type, cols);
}

void Interleave8(GgmlType type, const uint8_t* src, int64_t row_bytes, int64_t rows,
                 int64_t cols, uint8_t* out) {
  Get(type).interleave(src, row_bytes, rows, cols, out);
}

void ExtractInterleaved8Row(GgmlType type, const uint8_t* interleaved, int64_t cols, int64_t r,
                            uint8_t* row_out) {
  Get(type).extract(interleaved, cols, r, row_out);
}

}  // namespace thermocline
