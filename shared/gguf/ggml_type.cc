#include "shared/gguf/ggml_type.h"

#include <array>
#include <cstdlib>

namespace thermocline {

namespace {

using T = GgmlType;

// Block sizes and bytes as in ggml's type_traits table.
constexpr std::array<GgmlTypeTraits, 32> kTraits = {{
    {T::kF32, "f32", 1, 4},
    {T::kF16, "f16", 1, 2},
    {T::kQ4_0, "q4_0", kQK, 18},
    {T::kQ4_1, "q4_1", kQK, 20},
    {T::kQ5_0, "q5_0", kQK, 22},
    {T::kQ5_1, "q5_1", kQK, 24},
    {T::kQ8_0, "q8_0", kQK, 34},
    {T::kQ8_1, "q8_1", kQK, 36},
    {T::kQ2_K, "q2_K", kQK_K, 84},
    {T::kQ3_K, "q3_K", kQK_K, 110},
    {T::kQ4_K, "q4_K", kQK_K, 144},
    {T::kQ5_K, "q5_K", kQK_K, 176},
    {T::kQ6_K, "q6_K", kQK_K, 210},
    {T::kQ8_K, "q8_K", kQK_K, 292},
    {T::kIQ2_XXS, "iq2_xxs", kQK_K, 66},
    {T::kIQ2_XS, "iq2_xs", kQK_K, 74},
    {T::kIQ3_XXS, "iq3_xxs", kQK_K, 98},
    {T::kIQ1_S, "iq1_s", kQK_K, 50},
    {T::kIQ4_NL, "iq4_nl", kQK, 18},
    {T::kIQ3_S, "iq3_s", kQK_K, 110},
    {T::kIQ2_S, "iq2_s", kQK_K, 82},
    {T::kIQ4_XS, "iq4_xs", kQK_K, 136},
    {T::kI8, "i8", 1, 1},
    {T::kI16, "i16", 1, 2},
    {T::kI32, "i32", 1, 4},
    {T::kI64, "i64", 1, 8},
    {T::kF64, "f64", 1, 8},
    {T::kIQ1_M, "iq1_m", kQK_K, 56},
    {T::kBF16, "bf16", 1, 2},
    {T::kTQ1_0, "tq1_0", kQK_K, 54},
    {T::kTQ2_0, "tq2_0", kQK_K, 66},
    {T::kMXFP4, "mxfp4", kQK, 17},
}};

// Kept in step with the kernel table (shared/kernels/): matmul_test checks that every family
// has kernels for exactly these.
constexpr std::array<GgmlType, 15> kWeightTypes = {
    T::kF32,  T::kF16,  T::kBF16, T::kQ8_0, T::kQ4_0, T::kQ4_1,   T::kQ5_0,  T::kQ5_1,
    T::kQ2_K, T::kQ3_K, T::kQ4_K, T::kQ5_K, T::kQ6_K, T::kIQ4_NL, T::kIQ4_XS};

constexpr uint32_t kPowerInferI8 = 16;  // then I16 = 17, I32 = 18

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
    // Today's ids 16..18 are i-quants that a PowerInfer file cannot contain. 24..26 are
    // accepted too: they can only mean the same integer types.
    if (type_id == kPowerInferI8) return TypeTraits(GgmlType::kI8);
    if (type_id == kPowerInferI8 + 1) return TypeTraits(GgmlType::kI16);
    if (type_id == kPowerInferI8 + 2) return TypeTraits(GgmlType::kI32);
  }
  return TypeTraits(type_id);
}

uint32_t TypeIdInFile(GgmlType type, bool powerinfer) {
  if (powerinfer && (type == GgmlType::kI8 || type == GgmlType::kI16 || type == GgmlType::kI32)) {
    return kPowerInferI8 + (static_cast<uint32_t>(type) - static_cast<uint32_t>(GgmlType::kI8));
  }
  return static_cast<uint32_t>(type);
}

bool IsWeightType(GgmlType type) {
  for (GgmlType t : kWeightTypes) {
    if (t == type) return true;
  }
  return false;
}

const char* WeightTypeNames() {
  return "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, q4_K, q5_K, q6_K, iq4_nl, "
         "iq4_xs";
}

}  // namespace thermocline
