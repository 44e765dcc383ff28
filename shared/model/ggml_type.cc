#include "shared/model/ggml_type.h"

#include <array>
#include <cstdlib>

namespace thermocline {

namespace {

// Block sizes and bytes as in ggml's type_traits table.
constexpr std::array<GgmlTypeTraits, 6> kTraits = {{
    {GgmlType::kF32, "f32", 1, 4},
    {GgmlType::kF16, "f16", 1, 2},
    {GgmlType::kBF16, "bf16", 1, 2},
    {GgmlType::kQ8_0, "q8_0", kQK, 34},
    {GgmlType::kQ4_0, "q4_0", kQK, 18},
    {GgmlType::kI32, "i32", 1, 4},
}};

constexpr uint32_t kPowerInferI32 = 18;

static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_0) == 18);

}  // namespace

std::optional<GgmlTypeTraits> TypeTraits(uint32_t type_id) {
  for (const GgmlTypeTraits& t : kTraits) {
    if (static_cast<uint32_t>(t.type) == type_id) return t;
  }
  return std::nullopt;
}

const GgmlTypeTraits& TypeTraits(GgmlType type) {
  for (const GgmlTypeTraits& t : kTraits) {
    if (t.type == type) return t;
  }
  // A GgmlType value outside the enum can only come from a cast that skipped validation; every
  // reader of untrusted ids goes through the optional overload above.
  std::abort();
}

std::optional<GgmlType> TypeFromName(std::string_view name) {
  for (const GgmlTypeTraits& t : kTraits) {
    if (t.name == name) return t.type;
  }
  return std::nullopt;
}

std::optional<GgmlTypeTraits> TypeTraitsInFile(uint32_t type_id, bool powerinfer) {
  if (powerinfer) {
    // 16 and 17 are PowerInfer's I8/I16, which nothing here reads; today's ids 16..18 are
    // i-quants that a PowerInfer file cannot contain. 26 is accepted too: it can only mean I32.
    if (type_id == kPowerInferI32) return TypeTraits(GgmlType::kI32);
    if (type_id == 16 || type_id == 17) return std::nullopt;
  }
  return TypeTraits(type_id);
}

uint32_t TypeIdInFile(GgmlType type, bool powerinfer) {
  if (powerinfer && type == GgmlType::kI32) return kPowerInferI32;
  return static_cast<uint32_t>(type);
}

bool IsWeightType(GgmlType type) { return type != GgmlType::kI32; }

}  // namespace thermocline
