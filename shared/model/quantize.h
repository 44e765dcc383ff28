// Re-storing a model's weight matrices in another type, with llama.cpp's rules for which
// tensors change (llama-quantize without an importance matrix), so that the same F32 source
// gives the same tensor bytes as llama.cpp's quantizer.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shared/gguf/ggml_type.h"
#include "shared/gguf/gguf.h"
#include "shared/util/thread_pool.h"

namespace thermocline {

// A llama.cpp file type (llama_ftype) as `llama-quantize` names it.
struct QuantizeTarget {
  std::string name;    // "Q8_0", "Q4_0", "F16", ...
  GgmlType type;       // the type of most matrices
  uint32_t file_type;  // general.file_type
};

// The target for a llama-quantize type name (case-insensitive). Names llama.cpp knows whose
// quantizers are not written here (IQ3_XXS, IQ2_XS, TQ1_0, ...) get an error saying so.
absl::StatusOr<QuantizeTarget> QuantizeTargetFromName(const std::string& name);

// The llama-quantize name of a general.file_type (llama_ftype) this file knows ("Q4_K_M" for 15).
std::optional<std::string> FileTypeName(uint32_t file_type);

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
// (llama_tensor_get_type for a dense model without importance matrix):
// * output.weight (token_embd.weight when there is no output.weight) becomes q6_K, unless the
//   target is q8_0, or q8_0 when its rows do not fit the target's blocks;
// * attn_v, ffn_down and attn_output follow the mix's rule table (quantize.cc: kMixRules). By
//   layer: Q4_K_M / Q5_K_M give attn_v and ffn_down q6_K in the layers of use_more_bits (the
//   first and last eighth, every third between); Q4_K_S gives the first four attn_v and the first
//   eighth's ffn_down q5_K; Q3_K_M gives attn_v q5_K (first two layers) / q4_K, ffn_down q5_K
//   (first sixteenth) / q4_K and attn_output q4_K; Q3_K_L gives all three q5_K; Q2_K gives attn_v
//   q3_K (q4_K with 4+ query heads per KV head), ffn_down and attn_output q3_K; Q2_K_S gives
//   attn_v q4_K only with 4+ query heads per KV head and ffn_down of the first eighth q4_K;
//   IQ4_NL / IQ4_XS give attn_v q5_K with 4+ query heads per KV head and ffn_down of the first
//   eighth q5_K. Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q3_K_S, Q5_K_S and Q6_K have no such rule;
// * a tensor whose rows do not fit its type's 256-element blocks falls back as llama.cpp does:
//   q2_K / q3_K / iq4_xs to iq4_nl, q4_K to q5_0, q5_K to q5_1, q6_K to q8_0, and to f16 when
//   rows do not fit 32 either.
// The layer of a tensor is its index among the tensors of its kind, as llama.cpp counts (the
// files here number them alike). Everything else is copied. Errors name a tensor whose type needs
// a quantizer not written here, or whose rows fit no block size llama.cpp would use.
absl::StatusOr<std::vector<QuantizedTensor>> PlanQuantization(const GgufFile& in,
                                                              const QuantizeOptions& options);

// Writes `in` to `out_path` per the plan: metadata copied in order with general.file_type and
// general.quantization_version (2) set, tensors in the same order. Source matrices must be
// f32, f16 or bf16 (requantizing a quantized file would round twice). A tensor's rows are
// quantized on the pool's threads; every row is its own block sequence, so the bytes do not
// depend on the pool's size. `progress` is called on the calling thread after each tensor with
// (source bytes done, source bytes in all): quantizing takes time in proportion to the bytes,
// not to the tensors (the first tensor, the embedding, is often the largest).
absl::Status QuantizeModel(const GgufFile& in, const std::string& out_path,
                           const QuantizeOptions& options, ThreadPool& pool,
                           const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace thermocline
