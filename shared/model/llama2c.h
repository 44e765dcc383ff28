// llama2.c model files: the "version 0" checkpoint (run.c's legacy format) and the tokenizer
// .bin, and their conversion to a llama GGUF laid out as llama.cpp's convert-llama2c-to-ggml
// lays it out (same tensor names, order, shapes and bytes; same tokenizer keys).
//
// Both formats carry no magic and no checksums, so everything is checked against the file size:
// the 7-int header must describe exactly the bytes that follow, and the tokenizer's records must
// fill the file exactly. Errors name the field and, for the tokenizer, the token and offset.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shared/gguf/ggml_type.h"
#include "shared/gguf/gguf.h"
#include "shared/tokenizer/tokenizer.h"

namespace thermocline {

// The checkpoint header, with vocab_size made positive.
struct Llama2cConfig {
  int32_t dim = 0;
  int32_t hidden_dim = 0;
  int32_t n_layers = 0;
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t vocab_size = 0;
  int32_t seq_len = 0;
  // A positive vocab_size in the file means the classifier shares the token embedding; a
  // negative one means a separate wcls array follows the RoPE tables.
  bool shared_classifier = true;

  int32_t head_size() const { return dim / n_heads; }
  int32_t kv_dim() const { return dim / n_heads * n_kv_heads; }
};

// One float32 array of the checkpoint, stored row-major [rows][cols] (a matrix is [out][in]).
struct Llama2cArray {
  int64_t offset = 0;  // bytes from the start of the file
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t n_bytes() const { return rows * cols * 4; }
};

struct Llama2cCheckpoint {
  Llama2cConfig config;
  std::string bytes;  // the whole file

  // Per-layer arrays hold all layers back to back: layer l starts at offset + l * layer bytes.
  Llama2cArray token_embedding;  // [vocab][dim]
  Llama2cArray rms_att;          // [n_layers * 1][dim]
  Llama2cArray wq, wk, wv, wo;   // [n_layers * out][in]
  Llama2cArray rms_ffn;
  Llama2cArray w1, w2, w3;
  Llama2cArray rms_final;  // [1][dim]
  Llama2cArray wcls;       // [vocab][dim]; token_embedding when the classifier is shared

  // The bytes of one layer's slice of a per-layer array (or of a whole global array with
  // layer 0), as rows*cols little-endian float32.
  std::string_view Slice(const Llama2cArray& a, int32_t layer) const;
};

// Validates the 7 × int32 header at the start of `bytes` (which may be longer).
absl::StatusOr<Llama2cConfig> ParseLlama2cHeader(std::string_view bytes);
// Validates a whole checkpoint image: header values, their consistency and the exact size.
absl::StatusOr<Llama2cCheckpoint> ParseLlama2cCheckpoint(std::string bytes);
absl::StatusOr<Llama2cCheckpoint> ReadLlama2cCheckpoint(const std::string& path);

// The tokenizer .bin as stored: texts use ' ' for spaces and "\n<s>\n" / "\n</s>\n" for BOS/EOS.
struct Llama2cVocab {
  uint32_t max_token_length = 0;
  std::vector<std::string> texts;
  std::vector<float> scores;
};

// The file does not store the token count; it comes from the model header.
absl::StatusOr<Llama2cVocab> ParseLlama2cTokenizer(std::string_view bytes, int32_t vocab_size);
absl::StatusOr<Llama2cVocab> ReadLlama2cTokenizer(const std::string& path, int32_t vocab_size);

// The vocabulary as GGUF / llama.cpp stores it.
struct GgufVocab {
  std::vector<std::string> pieces;
  std::vector<float> scores;
  std::vector<TokenType> types;
  int32_t bos = 1;
  int32_t eos = 2;
  int32_t unk = 0;
};

// llama.cpp's mapping: id 0 is "<unk>" (unknown), ids 1 and 2 are "<s>" and "</s>" (control),
// empty texts are control, "<0xNN>" texts are byte tokens, everything else is normal; spaces
// become U+2581. Scores are kept bit for bit. Needs at least 3 tokens.
absl::StatusOr<GgufVocab> Llama2cVocabToGguf(const Llama2cVocab& vocab);
// The tokenizer a converted model would have.
absl::StatusOr<Tokenizer> TokenizerFromLlama2c(const Llama2cVocab& vocab);

struct Llama2cConvertOptions {
  // Type of the 2-D weight matrices (norms stay f32). A matrix whose rows are not a whole number
  // of blocks of a quantized type is written as f16 instead, as llama.cpp's quantizer does for
  // types without a compatible fallback.
  GgmlType type = GgmlType::kF32;
  std::string name = "llama";  // general.name; llama.cpp's converter writes "llama"
};

struct Llama2cConvertSummary {
  Llama2cConfig config;
  int64_t n_tensors = 0;
  int64_t n_parameters = 0;  // elements of the distinct checkpoint weights (no output copy)
  int64_t n_fallback_f16 = 0;  // matrices written as f16 because of their row length
};

// Adds the metadata and tensors of a converted model to `writer`. The tensor bytes are produced
// while the writer writes, from `checkpoint`, which must outlive the writer's WriteFile call.
absl::StatusOr<Llama2cConvertSummary> AddLlama2cToGguf(const Llama2cCheckpoint& checkpoint,
                                                       const Llama2cVocab& vocab,
                                                       const Llama2cConvertOptions& options,
                                                       GgufWriter* writer);

// Reads both files, converts and writes `out_path`.
absl::StatusOr<Llama2cConvertSummary> ConvertLlama2cToGguf(const std::string& model_path,
                                                           const std::string& tokenizer_path,
                                                           const std::string& out_path,
                                                           const Llama2cConvertOptions& options);

// general.file_type (llama_ftype) for a file whose matrices are `type`: 0 f32, 1 f16, 2 q4_0,
// 7 q8_0, 32 bf16.
uint32_t LlamaFileType(GgmlType type);

}  // namespace thermocline
