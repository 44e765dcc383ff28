// Synthetic llama-architecture models: random weights of any size and type, a byte-level
// vocabulary, written as GGUF that llama.cpp can load. For tests and benchmarks at sizes no real
// model here has (the 1.3B F16 model is about 2.6 GB).
//
// Weights come from a counter-based generator keyed by (seed, tensor index, element index), so a
// file depends only on its options: the same bytes on every run and for any thread count.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shared/model/ggml_type.h"
#include "shared/model/gguf.h"

namespace thermocline {

enum class SynthFfnKind {
  kSwiGlu,     // down(silu(gate x) * up x); thermocline.ffn_activation = "silu"
  kReluGated,  // down(relu(gate x) * up x); thermocline.ffn_activation = "relu"
};

struct SynthOptions {
  int64_t dim = 256;
  int64_t ffn = 704;  // a multiple of 32, so the defaults work for every --type
  int64_t layers = 4;
  int64_t heads = 8;
  int64_t kv_heads = 4;
  int64_t vocab = 512;
  int64_t context = 512;
  GgmlType type = GgmlType::kF32;  // token embedding and matrices; norms are always F32
  SynthFfnKind ffn_kind = SynthFfnKind::kSwiGlu;
  uint64_t seed = 1;
  std::string name = "thermocline-synth";
  int threads = 0;  // 0 = all cores; never changes the output
  // Called after each tensor is generated, with bytes done and total tensor bytes.
  std::function<void(int64_t done, int64_t total)> progress;
};

// Checks the shape options; the error names the flag (--dim, --heads, ...) and its value.
absl::Status ValidateSynthOptions(const SynthOptions& options);

// Role of a tensor, which decides how its weights are drawn. Each role has its own generator so
// that realistic activation statistics can later be given to one role without touching others.
enum class SynthRole {
  kTokenEmbedding,
  kNorm,
  kAttnQ,
  kAttnK,
  kAttnV,
  kAttnOutput,
  kFfnGate,
  kFfnUp,
  kFfnDown,
  kOutput,
};

// Weights [begin, end) of a tensor with ggml shape (fan_in, rows...) in element order.
// `tensor_index` is the tensor's position in the file.
void SynthWeights(SynthRole role, uint64_t seed, uint64_t tensor_index, int64_t fan_in,
                  int64_t begin, int64_t end, float* out);

struct SynthVocab {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t>
      types;  // llama.cpp token types: 1 normal, 2 unknown, 3 control, 5 unused, 6 byte
};

// 0 <unk>, 1 <s>, 2 </s>, 3..258 <0x00>..<0xFF>, then common English pieces (spaces as U+2581,
// every piece's prefixes present so merges can build it, shorter and commoner pieces scored
// higher), then <unused_N>. vocab_size must be at least 259.
SynthVocab MakeSynthVocab(int64_t vocab_size);

// Metadata and tensors of the model, ready to write (fillers run while writing).
absl::StatusOr<GgufWriter> BuildSynthModel(const SynthOptions& options);

// Validates, builds and writes the model to `path`.
absl::Status WriteSynthModel(const SynthOptions& options, const std::string& path);

}  // namespace thermocline
