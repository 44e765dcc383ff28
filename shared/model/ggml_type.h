// Tensor element types with ggml's numbering and exact block layouts, so that files move freely
// between Thermocline and llama.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace thermocline {

enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ8_0 = 8,
  kI32 = 26,  // integer tensors (PowerInfer's gpu_idx / gpu_bucket); never a weight matrix
  kBF16 = 30,
};

inline constexpr int kQK = 32;  // elements per Q8_0 / Q4_0 block

// ggml block_q8_0: one fp16 scale, 32 int8 values; x = q * d.
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};
static_assert(sizeof(BlockQ8_0) == 34);

// ggml block_q4_0: one fp16 scale, 32 4-bit values; byte j holds element j in its low nibble and
// element j + 16 in its high nibble; x = (q - 8) * d.
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ4_0) == 18);

struct GgmlTypeTraits {
  GgmlType type;
  std::string_view name;  // as llama.cpp prints it: "f32", "f16", "bf16", "q8_0", "q4_0", "i32"
  int64_t block_size;     // elements per block
  int64_t block_bytes;    // bytes per block
};

// Traits of a supported type, or nullopt for any other ggml type id.
std::optional<GgmlTypeTraits> TypeTraits(uint32_t type_id);
const GgmlTypeTraits& TypeTraits(GgmlType type);
std::optional<GgmlType> TypeFromName(std::string_view name);

// PowerInfer's ggml predates the i-quants, so its integer types are numbered I8 = 16, I16 = 17,
// I32 = 18 (today's 24, 25, 26; today's 16..18 are i-quants), and its tools write the I32
// tensors of a .gpuidx file with id 18. In files with the PWRI magic the tensor type ids follow
// that numbering; ids 0..15 mean the same in both.
//
// Traits of a tensor type id as stored in a file (PowerInfer numbering when `powerinfer`).
std::optional<GgmlTypeTraits> TypeTraitsInFile(uint32_t type_id, bool powerinfer);
// The id to store for `type` in a file (PowerInfer numbering when `powerinfer`).
uint32_t TypeIdInFile(GgmlType type, bool powerinfer);
// True for the types weight matrices may have (f32, f16, bf16, q8_0, q4_0).
bool IsWeightType(GgmlType type);

// Bytes of `n` elements; n must be a multiple of the block size (checked by callers that read
// untrusted shapes, see RowBytesChecked in gguf.cc).
inline int64_t RowBytes(GgmlType type, int64_t n) {
  const GgmlTypeTraits& t = TypeTraits(type);
  return n / t.block_size * t.block_bytes;
}

}  // namespace thermocline
