#include "shared/model/llama2c.h"

#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "shared/gguf/quant.h"
#include "shared/util/status_macros.h"

namespace thermocline {

// Both llama2.c formats are little-endian and are read by memcpy.
static_assert(std::endian::native == std::endian::little, "llama2.c reader assumes little-endian");

namespace {

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581
constexpr size_t kHeaderBytes = 7 * sizeof(int32_t);
// llama2.c's export.py "version 1/2" files start with this uint32 ("ak42"); run.c reads only
// version 0, and so do we.
constexpr uint32_t kLlama2cMagic = 0x616b3432;

absl::StatusOr<std::string> ReadWholeFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot open ", what, " '", path, "': ", std::strerror(errno)));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", what, " '", path, "'"));
  return std::move(ss).str();
}

// Sums products of non-negative factors, reporting overflow instead of wrapping: header values
// come from the file and can be anything up to 2^31-1.
class CheckedCount {
 public:
  void AddProduct(std::initializer_list<int64_t> factors) {
    int64_t p = 1;
    for (int64_t f : factors) {
      if (__builtin_mul_overflow(p, f, &p)) overflow_ = true;
    }
    if (__builtin_add_overflow(total_, p, &total_)) overflow_ = true;
  }
  bool overflow() const { return overflow_; }
  int64_t total() const { return total_; }

 private:
  int64_t total_ = 0;
  bool overflow_ = false;
};

std::string DescribeConfig(const Llama2cConfig& c) {
  return absl::StrCat("dim ", c.dim, ", hidden_dim ", c.hidden_dim, ", n_layers ", c.n_layers,
                      ", n_heads ", c.n_heads, ", n_kv_heads ", c.n_kv_heads, ", vocab_size ",
                      c.shared_classifier ? "" : "-", c.vocab_size, ", seq_len ", c.seq_len);
}

// Bytes of the float arrays after the header, with or without the separate classifier.
absl::StatusOr<int64_t> WeightBytes(const Llama2cConfig& c, bool with_wcls) {
  const int64_t dim = c.dim, hidden = c.hidden_dim, layers = c.n_layers, kv = c.kv_dim();
  CheckedCount n;
  n.AddProduct({c.vocab_size, dim});          // token_embedding_table
  n.AddProduct({layers, dim});                // rms_att_weight
  n.AddProduct({layers, dim, dim});           // wq
  n.AddProduct({layers, kv, dim});            // wk
  n.AddProduct({layers, kv, dim});            // wv
  n.AddProduct({layers, dim, dim});           // wo
  n.AddProduct({layers, dim});                // rms_ffn_weight
  n.AddProduct({layers, hidden, dim});        // w1
  n.AddProduct({layers, dim, hidden});        // w2
  n.AddProduct({layers, hidden, dim});        // w3
  n.AddProduct({dim});                        // rms_final_weight
  n.AddProduct({2, c.seq_len, c.head_size() / 2});  // freq_cis_real, freq_cis_imag
  if (with_wcls) n.AddProduct({c.vocab_size, dim});
  int64_t bytes = 0;
  if (n.overflow() || __builtin_mul_overflow(n.total(), int64_t{4}, &bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llama2.c header (", DescribeConfig(c), ") describes more data than any file can hold"));
  }
  return bytes;
}

}  // namespace

std::string_view Llama2cCheckpoint::Slice(const Llama2cArray& a, int32_t layer) const {
  const int64_t n = a.n_bytes();
  return std::string_view(bytes).substr(static_cast<size_t>(a.offset + layer * n),
                                        static_cast<size_t>(n));
}

absl::StatusOr<Llama2cConfig> ParseLlama2cHeader(std::string_view bytes) {
  if (bytes.size() < kHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama2.c checkpoint is ", bytes.size(),
                     " bytes, shorter than its 28-byte header (7 int32)"));
  }
  int32_t h[7];
  std::memcpy(h, bytes.data(), sizeof h);
  if (static_cast<uint32_t>(h[0]) == kLlama2cMagic) {
    return absl::InvalidArgumentError(
        "llama2.c checkpoint starts with the magic 'ak42' of export.py version 1/2; only the "
        "legacy version 0 format (run.c's) is supported: export with --version 0");
  }
  static constexpr const char* kNames[7] = {"dim",        "hidden_dim", "n_layers", "n_heads",
                                            "n_kv_heads", "vocab_size", "seq_len"};
  for (int i = 0; i < 7; ++i) {
    // vocab_size may be negative (unshared classifier), but not zero, and INT32_MIN has no
    // positive counterpart.
    const bool ok = i == 5 ? h[i] != 0 && h[i] != std::numeric_limits<int32_t>::min() : h[i] > 0;
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat("llama2.c header field ", kNames[i], " is ",
                                                     h[i], "; it must be ",
                                                     i == 5 ? "non-zero" : "positive"));
    }
  }
  Llama2cConfig c;
  c.dim = h[0];
  c.hidden_dim = h[1];
  c.n_layers = h[2];
  c.n_heads = h[3];
  c.n_kv_heads = h[4];
  c.shared_classifier = h[5] > 0;
  c.vocab_size = h[5] > 0 ? h[5] : -h[5];
  c.seq_len = h[6];
  if (c.dim % c.n_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("llama2.c header: dim ", c.dim,
                                                   " is not a multiple of n_heads ", c.n_heads));
  }
  if (c.n_kv_heads > c.n_heads || c.n_heads % c.n_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama2.c header: n_heads ", c.n_heads,
                     " is not a multiple of n_kv_heads ", c.n_kv_heads));
  }
  if (c.head_size() % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama2.c header: head size ", c.head_size(), " (dim ", c.dim, " / n_heads ",
                     c.n_heads, ") is odd; RoPE rotates pairs and needs it even"));
  }
  return c;
}

absl::StatusOr<Llama2cCheckpoint> ParseLlama2cCheckpoint(std::string bytes) {
  TC_ASSIGN_OR_RETURN(Llama2cConfig c, ParseLlama2cHeader(bytes));
  TC_ASSIGN_OR_RETURN(int64_t expected, WeightBytes(c, !c.shared_classifier));
  expected += static_cast<int64_t>(kHeaderBytes);
  const auto size = static_cast<int64_t>(bytes.size());
  if (size != expected) {
    std::string hint;
    // Say what the size would fit, so that a flipped vocab sign is recognizable.
    TC_ASSIGN_OR_RETURN(int64_t other, WeightBytes(c, c.shared_classifier));
    if (size == other + static_cast<int64_t>(kHeaderBytes)) {
      hint = c.shared_classifier
                 ? "; that is the size with a separate classifier (wcls), which a positive "
                   "vocab_size says is absent"
                 : "; that is the size without a separate classifier (wcls), which a negative "
                   "vocab_size says is present";
    } else if (size < expected) {
      hint = " (truncated?)";
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "llama2.c checkpoint is ", size, " bytes but its header (", DescribeConfig(c),
        ") implies ", expected, " bytes", hint));
  }

  Llama2cCheckpoint ck;
  ck.config = c;
  int64_t offset = kHeaderBytes;
  auto take = [&offset](int64_t rows, int64_t cols) {
    Llama2cArray a{offset, rows, cols};
    offset += a.n_bytes();
    return a;
  };
  const int64_t dim = c.dim, hidden = c.hidden_dim, layers = c.n_layers, kv = c.kv_dim();
  // A per-layer array is described by its layer-0 slice; Slice() steps over layers.
  auto take_layers = [&](int64_t rows, int64_t cols) {
    Llama2cArray a = take(rows, cols);
    offset += (layers - 1) * a.n_bytes();
    return a;
  };
  ck.token_embedding = take(c.vocab_size, dim);
  ck.rms_att = take_layers(1, dim);
  ck.wq = take_layers(dim, dim);
  ck.wk = take_layers(kv, dim);
  ck.wv = take_layers(kv, dim);
  ck.wo = take_layers(dim, dim);
  ck.rms_ffn = take_layers(1, dim);
  ck.w1 = take_layers(hidden, dim);
  ck.w2 = take_layers(dim, hidden);
  ck.w3 = take_layers(hidden, dim);
  ck.rms_final = take(1, dim);
  offset += 2 * static_cast<int64_t>(c.seq_len) * (c.head_size() / 2) * 4;  // legacy RoPE tables
  ck.wcls = c.shared_classifier ? ck.token_embedding : take(c.vocab_size, dim);
  if (offset != size) {
    return absl::InternalError(
        absl::StrCat("llama2.c layout ends at ", offset, " but the file has ", size, " bytes"));
  }
  ck.bytes = std::move(bytes);
  return ck;
}

absl::StatusOr<Llama2cCheckpoint> ReadLlama2cCheckpoint(const std::string& path) {
  TC_ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path, "llama2.c checkpoint"));
  absl::StatusOr<Llama2cCheckpoint> ck = ParseLlama2cCheckpoint(std::move(bytes));
  if (!ck.ok()) {
    return absl::Status(ck.status().code(), absl::StrCat(path, ": ", ck.status().message()));
  }
  return ck;
}

absl::StatusOr<Llama2cVocab> ParseLlama2cTokenizer(std::string_view bytes, int32_t vocab_size) {
  if (vocab_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama2.c tokenizer: vocab_size ", vocab_size, " must be positive"));
  }
  if (bytes.size() < 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llama2.c tokenizer is ", bytes.size(), " bytes, too short for max_token_length"));
  }
  Llama2cVocab v;
  std::memcpy(&v.max_token_length, bytes.data(), 4);
  if (v.max_token_length == 0) {
    return absl::InvalidArgumentError("llama2.c tokenizer: max_token_length is 0");
  }
  // Every token needs at least 8 bytes, so a count the file cannot hold is caught before
  // reserving memory for it.
  if (static_cast<uint64_t>(vocab_size) > (bytes.size() - 4) / 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llama2.c tokenizer is ", bytes.size(), " bytes, too short for ", vocab_size,
        " tokens (the model's vocab_size); is it the tokenizer of another model?"));
  }
  v.texts.reserve(vocab_size);
  v.scores.reserve(vocab_size);
  size_t off = 4;
  for (int32_t id = 0; id < vocab_size; ++id) {
    if (bytes.size() - off < 8) {
      return absl::InvalidArgumentError(absl::StrCat(
          "llama2.c tokenizer is truncated: token ", id, " of ", vocab_size,
          " needs a score and a length at byte ", off, " but the file ends at ", bytes.size()));
    }
    float score;
    uint32_t len;
    std::memcpy(&score, bytes.data() + off, 4);
    std::memcpy(&len, bytes.data() + off + 4, 4);
    if (std::isnan(score)) {
      return absl::InvalidArgumentError(
          absl::StrCat("llama2.c tokenizer: token ", id, " at byte ", off, " has a NaN score"));
    }
    if (len > v.max_token_length) {
      return absl::InvalidArgumentError(absl::StrCat(
          "llama2.c tokenizer: token ", id, " at byte ", off, " has length ", len,
          ", more than max_token_length ", v.max_token_length));
    }
    off += 8;
    if (bytes.size() - off < len) {
      return absl::InvalidArgumentError(absl::StrCat(
          "llama2.c tokenizer is truncated: token ", id, " needs ", len, " bytes at byte ", off,
          " but the file ends at ", bytes.size()));
    }
    v.scores.push_back(score);
    v.texts.emplace_back(bytes.substr(off, len));
    off += len;
  }
  if (off != bytes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llama2.c tokenizer has ", bytes.size() - off, " bytes after its ", vocab_size,
        " tokens (the model's vocab_size); is it the tokenizer of another model?"));
  }
  return v;
}

absl::StatusOr<Llama2cVocab> ReadLlama2cTokenizer(const std::string& path, int32_t vocab_size) {
  TC_ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path, "llama2.c tokenizer"));
  absl::StatusOr<Llama2cVocab> v = ParseLlama2cTokenizer(bytes, vocab_size);
  if (!v.ok()) {
    return absl::Status(v.status().code(), absl::StrCat(path, ": ", v.status().message()));
  }
  return v;
}

absl::StatusOr<GgufVocab> Llama2cVocabToGguf(const Llama2cVocab& vocab) {
  const size_t n = vocab.texts.size();
  if (n < 3 || vocab.scores.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama2.c vocabulary needs at least 3 tokens (unk, BOS, EOS) and a score "
                     "each; it has ",
                     n, " texts and ", vocab.scores.size(), " scores"));
  }
  GgufVocab g;
  g.pieces.reserve(n);
  g.types.reserve(n);
  g.scores = vocab.scores;
  for (size_t id = 0; id < n; ++id) {
    const std::string& text = vocab.texts[id];
    // llama.cpp assigns these by id, whatever the text says; llama2.c's tokenizers always put
    // <unk>, "\n<s>\n" and "\n</s>\n" there.
    if (id == 0) {
      g.pieces.push_back("<unk>");
      g.types.push_back(TokenType::kUnknown);
      continue;
    }
    if (id == 1 || id == 2) {
      g.pieces.push_back(id == 1 ? "<s>" : "</s>");
      g.types.push_back(TokenType::kControl);
      continue;
    }
    TokenType type = TokenType::kNormal;
    if (text.empty()) {
      type = TokenType::kControl;
    } else if (text.size() == 6 && text.starts_with("<0x") && text[5] == '>' &&
               absl::ascii_isxdigit(text[3]) && absl::ascii_isxdigit(text[4])) {
      type = TokenType::kByte;
    }
    std::string piece;
    piece.reserve(text.size());
    for (char c : text) {
      if (c == ' ') {
        piece.append(kSpaceMarker);
      } else {
        piece.push_back(c);
      }
    }
    g.pieces.push_back(std::move(piece));
    g.types.push_back(type);
  }
  return g;
}

absl::StatusOr<Tokenizer> TokenizerFromLlama2c(const Llama2cVocab& vocab) {
  TC_ASSIGN_OR_RETURN(GgufVocab g, Llama2cVocabToGguf(vocab));
  return Tokenizer::FromVocab(std::move(g.pieces), std::move(g.scores), std::move(g.types), g.bos,
                              g.eos, g.unk);
}

uint32_t LlamaFileType(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return 0;
    case GgmlType::kF16:
      return 1;
    case GgmlType::kQ4_0:
      return 2;
    case GgmlType::kQ4_1:
      return 3;
    case GgmlType::kQ5_0:
      return 8;
    case GgmlType::kQ5_1:
      return 9;
    case GgmlType::kQ8_0:
      return 7;
    case GgmlType::kBF16:
      return 32;
    case GgmlType::kQ6_K:
      return 18;
    case GgmlType::kQ2_K:
      return 10;
    case GgmlType::kQ3_K:
      return 12;
    case GgmlType::kQ4_K:
      return 15;
    case GgmlType::kQ5_K:
      return 17;
    case GgmlType::kIQ4_NL:
      return 25;
    case GgmlType::kIQ4_XS:
      return 30;
    default:
      break;  // the converter writes only the types above
  }
  return 0;
}

namespace {

// Fills a tensor from `rows` rows of `cols` float32 values at `src`, converting to `type`.
GgufWriter::TensorFiller MakeFiller(std::string_view src, GgmlType type, int64_t rows,
                                    int64_t cols) {
  return [src, type, rows, cols](uint8_t* dst, int64_t n_bytes) -> absl::Status {
    const int64_t row_bytes = RowBytes(type, cols);
    if (n_bytes != rows * row_bytes) {
      return absl::InternalError(absl::StrCat("tensor wants ", n_bytes, " bytes, conversion makes ",
                                              rows * row_bytes));
    }
    if (type == GgmlType::kF32) {
      std::memcpy(dst, src.data(), src.size());
      return absl::OkStatus();
    }
    std::vector<float> row(cols);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(row.data(), src.data() + r * cols * 4, cols * 4);
      QuantizeRow(type, row.data(), dst + r * row_bytes, cols);
    }
    return absl::OkStatus();
  };
}

}  // namespace

absl::StatusOr<Llama2cConvertSummary> AddLlama2cToGguf(const Llama2cCheckpoint& ck,
                                                       const Llama2cVocab& vocab,
                                                       const Llama2cConvertOptions& options,
                                                       GgufWriter* writer) {
  const Llama2cConfig& c = ck.config;
  if (!IsWeightType(options.type) || !HasQuantizer(options.type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot convert to ", std::string(TypeTraits(options.type).name),
                     ": the converter writes f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, "
                     "q2_K..q6_K, iq4_nl or iq4_xs"));
  }
  if (static_cast<int64_t>(vocab.texts.size()) != c.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer has ", vocab.texts.size(),
                                                   " tokens but the model's vocab_size is ",
                                                   c.vocab_size));
  }
  TC_ASSIGN_OR_RETURN(GgufVocab g, Llama2cVocabToGguf(vocab));
  std::vector<int32_t> types;
  types.reserve(g.types.size());
  for (TokenType t : g.types) types.push_back(static_cast<int32_t>(t));

  // Keys in the order llama.cpp's converter writes them, then the two it leaves to defaults.
  writer->SetValue("tokenizer.ggml.tokens", GgufStringArray(std::move(g.pieces)));
  writer->SetValue("tokenizer.ggml.scores", GgufF32Array(g.scores));
  writer->SetValue("tokenizer.ggml.token_type", GgufI32Array(types));
  writer->SetValue("tokenizer.ggml.model", GgufString("llama"));
  writer->SetValue("general.architecture", GgufString("llama"));
  writer->SetValue("general.name", GgufString(options.name));
  writer->SetValue("tokenizer.ggml.unknown_token_id", GgufU32(g.unk));
  writer->SetValue("tokenizer.ggml.bos_token_id", GgufU32(g.bos));
  writer->SetValue("tokenizer.ggml.eos_token_id", GgufU32(g.eos));
  // llama.cpp writes "no such token" as UINT32_MAX, with its historical spelling of separator.
  writer->SetValue("tokenizer.ggml.seperator_token_id", GgufU32(UINT32_MAX));
  writer->SetValue("tokenizer.ggml.padding_token_id", GgufU32(UINT32_MAX));
  // llama.cpp's converter writes its default context (2048) here; the checkpoint knows the
  // length the model was trained for, so we write that instead.
  writer->SetValue("llama.context_length", GgufU32(c.seq_len));
  writer->SetValue("llama.embedding_length", GgufU32(c.dim));
  writer->SetValue("llama.feed_forward_length", GgufU32(c.hidden_dim));
  writer->SetValue("llama.attention.head_count", GgufU32(c.n_heads));
  writer->SetValue("llama.attention.head_count_kv", GgufU32(c.n_kv_heads));
  writer->SetValue("llama.block_count", GgufU32(c.n_layers));
  writer->SetValue("llama.rope.dimension_count", GgufU32(c.head_size()));
  writer->SetValue("llama.attention.layer_norm_rms_epsilon", GgufF32(1e-5f));
  writer->SetValue("llama.rope.freq_base", GgufF32(10000.0f));
  writer->SetValue("general.file_type", GgufU32(LlamaFileType(options.type)));

  Llama2cConvertSummary summary;
  summary.config = c;
  auto add_norm = [&](std::string name, const Llama2cArray& a, int32_t layer) -> absl::Status {
    ++summary.n_tensors;
    return writer->AddTensor(std::move(name), GgmlType::kF32, {a.cols},
                             MakeFiller(ck.Slice(a, layer), GgmlType::kF32, 1, a.cols));
  };
  auto add_matrix = [&](std::string name, const Llama2cArray& a, int32_t layer) -> absl::Status {
    GgmlType type = options.type;
    if (a.cols % TypeTraits(type).block_size != 0) {
      type = GgmlType::kF16;
      ++summary.n_fallback_f16;
    }
    ++summary.n_tensors;
    // ggml lists the contiguous (input) dimension first.
    return writer->AddTensor(std::move(name), type, {a.cols, a.rows},
                             MakeFiller(ck.Slice(a, layer), type, a.rows, a.cols));
  };

  // Tensor order as in llama.cpp's converter.
  TC_RETURN_IF_ERROR(add_matrix("token_embd.weight", ck.token_embedding, 0));
  TC_RETURN_IF_ERROR(add_norm("output_norm.weight", ck.rms_final, 0));
  // llama.cpp writes the shared classifier as an explicit copy of the embedding.
  TC_RETURN_IF_ERROR(add_matrix("output.weight", ck.wcls, 0));
  for (int32_t l = 0; l < c.n_layers; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    TC_RETURN_IF_ERROR(add_matrix(p + "attn_q.weight", ck.wq, l));
    TC_RETURN_IF_ERROR(add_matrix(p + "attn_k.weight", ck.wk, l));
    TC_RETURN_IF_ERROR(add_matrix(p + "attn_v.weight", ck.wv, l));
    TC_RETURN_IF_ERROR(add_matrix(p + "attn_output.weight", ck.wo, l));
    TC_RETURN_IF_ERROR(add_norm(p + "attn_norm.weight", ck.rms_att, l));
    TC_RETURN_IF_ERROR(add_matrix(p + "ffn_gate.weight", ck.w1, l));
    TC_RETURN_IF_ERROR(add_matrix(p + "ffn_down.weight", ck.w2, l));
    TC_RETURN_IF_ERROR(add_matrix(p + "ffn_up.weight", ck.w3, l));
    TC_RETURN_IF_ERROR(add_norm(p + "ffn_norm.weight", ck.rms_ffn, l));
  }

  const int64_t layers = c.n_layers;
  auto layer_elems = [&](const Llama2cArray& a) { return layers * a.rows * a.cols; };
  summary.n_parameters = ck.token_embedding.rows * ck.token_embedding.cols +
                         layer_elems(ck.rms_att) + layer_elems(ck.wq) + layer_elems(ck.wk) +
                         layer_elems(ck.wv) + layer_elems(ck.wo) + layer_elems(ck.rms_ffn) +
                         layer_elems(ck.w1) + layer_elems(ck.w2) + layer_elems(ck.w3) + c.dim +
                         (c.shared_classifier ? 0 : ck.wcls.rows * ck.wcls.cols);
  return summary;
}

absl::StatusOr<Llama2cConvertSummary> ConvertLlama2cToGguf(const std::string& model_path,
                                                           const std::string& tokenizer_path,
                                                           const std::string& out_path,
                                                           const Llama2cConvertOptions& options) {
  TC_ASSIGN_OR_RETURN(Llama2cCheckpoint ck, ReadLlama2cCheckpoint(model_path));
  TC_ASSIGN_OR_RETURN(Llama2cVocab vocab,
                      ReadLlama2cTokenizer(tokenizer_path, ck.config.vocab_size));
  GgufWriter writer;
  TC_ASSIGN_OR_RETURN(Llama2cConvertSummary summary,
                      AddLlama2cToGguf(ck, vocab, options, &writer));
  TC_RETURN_IF_ERROR(writer.WriteFile(out_path));
  return summary;
}

}  // namespace thermocline
