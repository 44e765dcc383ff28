// Re-storing a model's weight matrices in another type, with llama.cpp's rules for which
// tensors change (llama-quantize without an importance matrix), so that the same F32 source
// gives the same tensor bytes as llama.cpp's quantizer.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shared/gguf/ggml_type.h"
#include "shared/gguf/gguf.h"

namespace thermocline {

// A llama.cpp file type (llama_ftype) as `llama-quantize` names it.
struct QuantizeTarget {
  std::string name;    // "Q8_0", "Q4_0", "F16", ...
  GgmlType type;       // the type of most matrices
  uint32_t file_type;  // general.file_type
};

// The target for a llama-quantize type name (case-insensitive). Names llama.cpp knows whose
// quantizers or rules are not written here (Q4_1, Q5_0, Q3_K_L, IQ3_XXS, ...) get an error
// saying so.
absl::StatusOr<QuantizeTarget> QuantizeTargetFromName(const std::string& name);

struct QuantizeOptions {
  QuantizeTarget target;
  // llama-quantize --pure: every quantizable tensor gets target.type (no per-tensor mix).
  bool pure = false;
};

struct QuantizedTensor {
  std::string name;
  GgmlType from, to;
};

// The type llama.cpp's rules give each tensor of `in` (in file order): matrices (2+ dims, names
// ending in "weight", not norms) get the target type, except in a quantized non-pure target
// (llama_tensor_get_type): output.weight becomes q6_K unless the target is q8_0, and the
// IQ4_NL / IQ4_XS mixes give attn_v q5_K with 4+ query heads per KV head and ffn_down of the
// first eighth q5_K; Q4_K_M / Q5_K_M mixes give attn_v and ffn_down q6_K in the layers of
// use_more_bits (the first and last eighth, every third between), Q4_K_S gives the first four
// attn_v and the first eighth's ffn_down q5_K, Q3_K_M gives attn_v q5_K (first two layers) / q4_K,
// ffn_down q5_K (first sixteenth) / q4_K and attn_output q4_K, Q2_K gives attn_v q3_K (q4_K with 4+
// query heads per KV head), ffn_down and attn_output q3_K; everything else is copied. (The layer of
// attn_v is its index among the attn_v tensors, as llama.cpp counts; the files here number
// them alike.) Errors name a tensor whose type needs a quantizer not written here, or whose rows do
// not fit the block size.
absl::StatusOr<std::vector<QuantizedTensor>> PlanQuantization(const GgufFile& in,
                                                              const QuantizeOptions& options);

// Writes `in` to `out_path` per the plan: metadata copied in order with general.file_type and
// general.quantization_version (2) set, tensors in the same order. Source matrices must be
// f32, f16 or bf16 (requantizing a quantized file would round twice). `progress` is called
// after each tensor with (done, total).
absl::Status QuantizeModel(const GgufFile& in, const std::string& out_path,
                           const QuantizeOptions& options,
                           const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace thermocline
