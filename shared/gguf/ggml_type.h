// Tensor element types with ggml's numbering and exact block layouts, so that files move freely
// between Thermocline and llama.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace thermocline {

// Every type id today's ggml defines (ids 4, 5, 31..33 and 36..38 were removed from ggml and are
// unknown here). Knowing a type means a file holding it can be opened and listed; which types
// the engine can compute with is IsWeightType.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,  // ggml's activation type for the K-quant dot products; never a weight
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,  // integer tensors (PowerInfer's gpu_idx / gpu_bucket); never a weight matrix
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
};

inline constexpr int kQK = 32;     // elements per Q8_0 / Q4_0 / Q4_1 / Q5_x / IQ4_NL block
inline constexpr int kQK_K = 256;  // elements per K-quant / IQ4_XS super-block

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

// The other block layouts, as byte offsets inside one block (all little-endian, fp16 scales;
// blocks are read through byte pointers, see quant.cc). Element e of a block:
//   Q4_1  [d, m, qs[16]]: nibble as Q4_0; x = d * q + m.
//   Q5_0  [d, qh u32, qs[16]]: q = nibble | (bit e of qh) << 4; x = d * (q - 16).
//   Q5_1  [d, m, qh u32, qs[16]]: q as Q5_0; x = d * q + m.
//   Q2_K  [scales[16], qs[64], d, dmin]: sub-blocks of 16 (scale low nibble, min high nibble);
//         e = 128h + 32s + l -> bits 2s of qs[32h + l]; x = (d * sc) * q - dmin * m.
//   Q3_K  [hmask[32], qs[64], scales[12], d]: 16 signed 6-bit scales (low nibbles in bytes 0..7,
//         two high bits in bytes 8..11); q = 2 bits as Q2_K - (bit e/32 of hmask[e%32] ? 0 : 4);
//         x = (d * (sc - 32)) * q.
//   Q4_K  [d, dmin, scales[12], qs[128]]: 8 sub-blocks of 32 with 6-bit scale and min (ggml's
//         get_scale_min_k4 packing); e = 64g + 32s + l -> nibble s of qs[32g + l];
//         x = (d * sc) * q - dmin * m.
//   Q5_K  [d, dmin, scales[12], qh[32], qs[128]]: as Q4_K plus bit e/32 of qh[e%32] as bit 4.
//   Q6_K  [ql[128], qh[64], scales[16] int8, d]: halves of 128; in half h, e' = e - 128h:
//         nibble e'/64 of ql[64h + e'%64], two bits 2(e'/32) of qh[32h + e'%32]; q - 32;
//         x = (d * sc) * q, sub-blocks of 16.
//   Q8_K  [d f32, qs[256] int8, bsums[16] int16]: x = d * q.
//   IQ4_NL [d, qs[16]]: nibbles as Q4_0 index kIq4nlValues; x = d * value.
//   IQ4_XS [d, scales_h u16, scales_l[4], qs[128]]: 8 sub-blocks of 32 with a 6-bit scale
//         (low nibble from scales_l, two bits from scales_h), nibbles as IQ4_NL within each
//         sub-block's 16 bytes; x = (d * (sc - 32)) * value.
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

struct GgmlTypeTraits {
  GgmlType type;
  std::string_view name;  // as llama.cpp prints it: "f32", "q4_K", "iq4_xs", ...
  int64_t block_size;     // elements per block
  int64_t block_bytes;    // bytes per block
};

// Traits of a known type, or nullopt for any other ggml type id.
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
// True for the types weight matrices may have: those every kernel family computes with (f32,
// f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_K..q6_K, iq4_nl, iq4_xs). Other known types can
// be listed but not run.
bool IsWeightType(GgmlType type);
// Comma-separated names of the weight types, for error messages.
const char* WeightTypeNames();

// Bytes of `n` elements; n must be a multiple of the block size (checked by callers that read
// untrusted shapes, see RowBytesChecked in gguf.cc).
inline int64_t RowBytes(GgmlType type, int64_t n) {
  const GgmlTypeTraits& t = TypeTraits(type);
  return n / t.block_size * t.block_bytes;
}

}  // namespace thermocline
