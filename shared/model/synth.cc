#include "shared/model/synth.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string_view>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "shared/model/quant.h"
#include "shared/util/status_macros.h"
#include "shared/util/thread_pool.h"

namespace thermocline {

namespace {

// Limits that keep every product of shapes far from overflow and reject typos (an extra zero)
// before gigabytes are written.
constexpr int64_t kMaxDim = 1 << 16;
constexpr int64_t kMaxFfn = 1 << 18;
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxVocab = 1 << 21;
constexpr int64_t kMaxContext = 1 << 24;
constexpr int64_t kMinVocab = 259;  // unk, bos, eos and 256 byte tokens

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

inline uint64_t Mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t TensorKey(uint64_t seed, uint64_t tensor_index) {
  return Mix64(Mix64(seed + kGolden) ^ ((tensor_index + 1) * 0xD1B54A32D192ED03ull));
}

// Element i of the tensor's stream (splitmix64), as a float uniform in (-1, 1). The 24 bits are
// converted exactly, so the value does not depend on the compiler's float contraction.
inline float UniformPm1(uint64_t key, int64_t i) {
  const uint64_t u = Mix64(key + static_cast<uint64_t>(i + 1) * kGolden);
  const int32_t bits = static_cast<int32_t>(u >> 40);  // 24 bits
  return (static_cast<float>(bits - (1 << 23)) + 0.5f) * (1.0f / (1 << 23));
}

// Uniform(-a, a) has standard deviation a / sqrt(3).
void FillUniform(uint64_t key, float stddev, int64_t begin, int64_t end, float* out) {
  const float a = stddev * std::sqrt(3.0f);
  for (int64_t i = begin; i < end; ++i) out[i - begin] = a * UniformPm1(key, i);
}

// One generator per role (see SynthRole). Projections use std 1/sqrt(fan_in), so each output has
// about the variance of one input element and activations neither explode nor vanish with depth.
void EmbeddingWeights(uint64_t key, int64_t begin, int64_t end, float* out) {
  FillUniform(key, 1.0f, begin, end, out);  // the residual stream starts at rms ~1
}
void NormWeights(int64_t begin, int64_t end, float* out) {
  std::fill(out, out + (end - begin), 1.0f);
}
void ProjectionWeights(uint64_t key, int64_t fan_in, int64_t begin, int64_t end, float* out) {
  FillUniform(key, 1.0f / std::sqrt(static_cast<float>(fan_in)), begin, end, out);
}

std::string_view FfnActivationName(SynthFfnKind kind) {
  return kind == SynthFfnKind::kReluGated ? "relu" : "silu";
}

absl::Status Bad(std::string_view flag, int64_t value, std::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("--", absl::string_view(flag.data(), flag.size()),
                                                 " ", value, ": ",
                                                 absl::string_view(why.data(), why.size())));
}

// Common English pieces, commonest first. Words carry the U+2581 word-start marker.
constexpr std::string_view kSingles[] = {
    "▁", "e", "t", "a", "o", "i", "n", "s", "h", "r", "d", "l", "c", "u", "m",  "w", "f", "g",
    "y", "p", "b", "v", "k", "j", "x", "q", "z", ".", ",", "'", "!", "?", "\"", "-", ":", ";",
    "(", ")", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "T", "S", "A",  "I", "O", "H",
    "W", "L", "M", "B", "C", "D", "E", "F", "G", "J", "K", "N", "P", "R", "U",  "V", "Y"};
constexpr std::string_view kWords[] = {
    "the",    "a",       "and",    "to",    "was",   "he",     "she",     "it",    "of",
    "in",     "is",      "that",   "for",   "on",    "with",   "they",    "his",   "her",
    "you",    "at",      "be",     "had",   "not",   "but",    "said",    "I",     "The",
    "day",    "one",     "all",    "so",    "were",  "when",   "we",      "there", "can",
    "an",     "your",    "what",   "their", "if",    "do",     "will",    "about", "up",
    "out",    "them",    "then",   "some",  "very",  "would",  "into",    "has",   "more",
    "two",    "like",    "him",    "see",   "time",  "could",  "no",      "make",  "than",
    "first",  "been",    "its",    "who",   "now",   "my",     "made",    "over",  "did",
    "down",   "only",    "way",    "find",  "may",   "long",   "little",  "after", "just",
    "where",  "know",    "get",    "back",  "much",  "go",     "good",    "new",   "our",
    "me",     "man",     "too",    "any",   "same",  "right",  "look",    "think", "also",
    "around", "came",    "come",   "work",  "three", "must",   "because", "even",  "place",
    "well",   "here",    "take",   "why",   "help",  "put",    "away",    "again", "off",
    "went",   "old",     "great",  "tell",  "say",   "small",  "every",   "found", "still",
    "name",   "home",    "big",    "give",  "own",   "last",   "never",   "us",    "end",
    "saw",    "thought", "always", "happy", "play",  "friend", "friends", "mom",   "dad",
    "dog",    "cat",     "tree",   "park",  "ball",  "sun",    "girl",    "boy",   "Once",
    "upon",   "One",     "She",    "He",    "They",  "It",     "Lily",    "Tom",   "loved",
    "wanted", "named",   "each",   "other", "toy",   "fun",    "sad",     "lot",   "red",
    "bird",   "box",     "car",    "let",   "Mom",   "sky",    "water",   "hat",   "tree",
};
constexpr std::string_view kSuffixes[] = {"ed", "ing", "er", "ly", "es", "s",  "y",  "le", "en",
                                          "on", "an",  "in", "at", "or", "ar", "th", "he", "ll"};

// Splits a piece into characters (the ▁ marker is one 3-byte character).
std::vector<std::string_view> Chars(std::string_view s) {
  std::vector<std::string_view> out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

// llama.cpp's general.file_type (enum llama_ftype) for a model whose matrices are `type`.
uint32_t SynthFileType(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return 0;  // LLAMA_FTYPE_ALL_F32
    case GgmlType::kF16:
      return 1;  // LLAMA_FTYPE_MOSTLY_F16
    case GgmlType::kQ4_0:
      return 2;  // LLAMA_FTYPE_MOSTLY_Q4_0
    case GgmlType::kQ8_0:
      return 7;  // LLAMA_FTYPE_MOSTLY_Q8_0
    case GgmlType::kBF16:
      return 32;  // LLAMA_FTYPE_MOSTLY_BF16
    case GgmlType::kI32:
      break;  // never a weight type
  }
  return 0;
}

}  // namespace

absl::Status ValidateSynthOptions(const SynthOptions& o) {
  auto range = [](std::string_view flag, int64_t v, int64_t lo, int64_t hi) -> absl::Status {
    if (v < lo || v > hi) return Bad(flag, v, absl::StrCat("must be in [", lo, ", ", hi, "]"));
    return absl::OkStatus();
  };
  TC_RETURN_IF_ERROR(range("dim", o.dim, 2, kMaxDim));
  TC_RETURN_IF_ERROR(range("ffn", o.ffn, 1, kMaxFfn));
  TC_RETURN_IF_ERROR(range("layers", o.layers, 1, kMaxLayers));
  TC_RETURN_IF_ERROR(range("heads", o.heads, 1, o.dim));
  TC_RETURN_IF_ERROR(range("kv-heads", o.kv_heads, 1, o.heads));
  TC_RETURN_IF_ERROR(range("vocab", o.vocab, kMinVocab, kMaxVocab));
  TC_RETURN_IF_ERROR(range("context", o.context, 1, kMaxContext));
  if (o.dim % o.heads != 0) {
    return Bad("dim", o.dim, absl::StrCat("must be divisible by --heads ", o.heads));
  }
  if (o.heads % o.kv_heads != 0) {
    return Bad("heads", o.heads, absl::StrCat("must be divisible by --kv-heads ", o.kv_heads));
  }
  const int64_t head_dim = o.dim / o.heads;
  if (head_dim % 2 != 0) {
    return Bad("dim", o.dim,
               absl::StrCat("gives an odd head dimension ", head_dim, " with --heads ", o.heads,
                            " (RoPE rotates pairs)"));
  }
  if (!TypeTraits(static_cast<uint32_t>(o.type)) || !IsWeightType(o.type)) {
    return absl::InvalidArgumentError(absl::StrCat("--type: type id ",
                                                   static_cast<uint32_t>(o.type),
                                                   " is not a weight type (f32, f16, bf16, "
                                                   "q8_0, q4_0)"));
  }
  const GgmlTypeTraits& t = TypeTraits(o.type);
  const std::string why = absl::StrCat("must be a multiple of ", t.block_size, " for --type ",
                                       absl::string_view(t.name.data(), t.name.size()));
  // dim is ne[0] of the embedding and every projection except ffn_down, whose ne[0] is ffn.
  if (o.dim % t.block_size != 0) return Bad("dim", o.dim, why);
  if (o.ffn % t.block_size != 0) return Bad("ffn", o.ffn, why);
  if (o.threads < 0) return Bad("threads", o.threads, "must be >= 0");
  return absl::OkStatus();
}

void SynthWeights(SynthRole role, uint64_t seed, uint64_t tensor_index, int64_t fan_in,
                  int64_t begin, int64_t end, float* out) {
  const uint64_t key = TensorKey(seed, tensor_index);
  switch (role) {
    case SynthRole::kTokenEmbedding:
      EmbeddingWeights(key, begin, end, out);
      return;
    case SynthRole::kNorm:
      NormWeights(begin, end, out);
      return;
    case SynthRole::kAttnQ:
    case SynthRole::kAttnK:
    case SynthRole::kAttnV:
    case SynthRole::kAttnOutput:
    case SynthRole::kFfnGate:
    case SynthRole::kFfnUp:
    case SynthRole::kFfnDown:
    case SynthRole::kOutput:
      ProjectionWeights(key, fan_in, begin, end, out);
      return;
  }
}

SynthVocab MakeSynthVocab(int64_t vocab_size) {
  SynthVocab v;
  const size_t n = static_cast<size_t>(std::max<int64_t>(vocab_size, 0));
  v.tokens.reserve(n);
  v.scores.reserve(n);
  v.types.reserve(n);
  auto add = [&](std::string piece, float score, int32_t type) {
    if (v.tokens.size() >= n) return false;
    v.tokens.push_back(std::move(piece));
    v.scores.push_back(score);
    v.types.push_back(type);
    return true;
  };
  add("<unk>", 0.0f, 2);
  add("<s>", 0.0f, 3);
  add("</s>", 0.0f, 3);
  for (int b = 0; b < 256; ++b) add(absl::StrFormat("<0x%02X>", b), 0.0f, 6);

  // Normal pieces in priority order; a piece is only added after all its prefixes, so the
  // encoder's pairwise merges can always build it.
  std::vector<std::string> pieces;
  absl::flat_hash_set<std::string> seen;
  auto want = [&](std::string_view piece) {
    std::vector<std::string_view> chars = Chars(piece);
    std::string prefix;
    for (std::string_view c : chars) {
      prefix.append(c);
      if (seen.insert(prefix).second) pieces.push_back(prefix);
    }
  };
  for (std::string_view s : kSingles) want(s);
  for (std::string_view w : kWords) {
    want(absl::StrCat("▁", absl::string_view(w.data(), w.size())));
  }
  for (std::string_view s : kSuffixes) want(s);
  float score = -1.0f;
  for (std::string& p : pieces) {
    if (!add(std::move(p), score, 1)) break;
    score -= 1.0f;
  }
  for (int64_t id = static_cast<int64_t>(v.tokens.size()); id < vocab_size; ++id) {
    add(absl::StrCat("<unused_", id, ">"), -1e9f, 5);
  }
  return v;
}

absl::StatusOr<GgufWriter> BuildSynthModel(const SynthOptions& o) {
  TC_RETURN_IF_ERROR(ValidateSynthOptions(o));
  const int64_t head_dim = o.dim / o.heads;
  const int64_t kv_dim = head_dim * o.kv_heads;

  GgufWriter w;
  w.SetValue("general.architecture", GgufString("llama"));
  w.SetValue("general.name", GgufString(o.name));
  w.SetValue("general.file_type", GgufU32(SynthFileType(o.type)));
  w.SetValue("llama.vocab_size", GgufU32(static_cast<uint32_t>(o.vocab)));
  w.SetValue("llama.context_length", GgufU32(static_cast<uint32_t>(o.context)));
  w.SetValue("llama.embedding_length", GgufU32(static_cast<uint32_t>(o.dim)));
  w.SetValue("llama.feed_forward_length", GgufU32(static_cast<uint32_t>(o.ffn)));
  w.SetValue("llama.block_count", GgufU32(static_cast<uint32_t>(o.layers)));
  w.SetValue("llama.attention.head_count", GgufU32(static_cast<uint32_t>(o.heads)));
  w.SetValue("llama.attention.head_count_kv", GgufU32(static_cast<uint32_t>(o.kv_heads)));
  w.SetValue("llama.attention.layer_norm_rms_epsilon", GgufF32(1e-5f));
  w.SetValue("llama.rope.freq_base", GgufF32(10000.0f));
  w.SetValue("llama.rope.dimension_count", GgufU32(static_cast<uint32_t>(head_dim)));
  w.SetValue("thermocline.ffn_activation", GgufString(std::string(FfnActivationName(o.ffn_kind))));
  w.SetValue("thermocline.synth.seed", GgufU64(o.seed));

  SynthVocab vocab = MakeSynthVocab(o.vocab);
  w.SetValue("tokenizer.ggml.model", GgufString("llama"));
  w.SetValue("tokenizer.ggml.tokens", GgufStringArray(std::move(vocab.tokens)));
  w.SetValue("tokenizer.ggml.scores", GgufF32Array(vocab.scores));
  w.SetValue("tokenizer.ggml.token_type", GgufI32Array(vocab.types));
  w.SetValue("tokenizer.ggml.bos_token_id", GgufU32(1));
  w.SetValue("tokenizer.ggml.eos_token_id", GgufU32(2));
  w.SetValue("tokenizer.ggml.unknown_token_id", GgufU32(0));
  w.SetValue("tokenizer.ggml.add_bos_token", GgufBool(true));
  w.SetValue("tokenizer.ggml.add_eos_token", GgufBool(false));

  struct Spec {
    std::string name;
    SynthRole role;
    int64_t ne0, ne1;  // ne1 == 0: a vector
  };
  std::vector<Spec> specs;
  specs.push_back({"token_embd.weight", SynthRole::kTokenEmbedding, o.dim, o.vocab});
  for (int64_t l = 0; l < o.layers; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    specs.push_back({p + "attn_norm.weight", SynthRole::kNorm, o.dim, 0});
    specs.push_back({p + "attn_q.weight", SynthRole::kAttnQ, o.dim, o.dim});
    specs.push_back({p + "attn_k.weight", SynthRole::kAttnK, o.dim, kv_dim});
    specs.push_back({p + "attn_v.weight", SynthRole::kAttnV, o.dim, kv_dim});
    specs.push_back({p + "attn_output.weight", SynthRole::kAttnOutput, o.dim, o.dim});
    specs.push_back({p + "ffn_norm.weight", SynthRole::kNorm, o.dim, 0});
    specs.push_back({p + "ffn_gate.weight", SynthRole::kFfnGate, o.dim, o.ffn});
    specs.push_back({p + "ffn_up.weight", SynthRole::kFfnUp, o.dim, o.ffn});
    specs.push_back({p + "ffn_down.weight", SynthRole::kFfnDown, o.ffn, o.dim});
  }
  specs.push_back({"output_norm.weight", SynthRole::kNorm, o.dim, 0});
  specs.push_back({"output.weight", SynthRole::kOutput, o.dim, o.vocab});

  const int threads = o.threads > 0
                          ? o.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  auto pool = std::make_shared<ThreadPool>(threads);
  int64_t total = 0;
  for (const Spec& s : specs) {
    const GgmlType type = s.role == SynthRole::kNorm ? GgmlType::kF32 : o.type;
    total += RowBytes(type, s.ne0) * std::max<int64_t>(s.ne1, 1);
  }
  auto done = std::make_shared<int64_t>(0);
  for (size_t i = 0; i < specs.size(); ++i) {
    const Spec& s = specs[i];
    // Norms stay F32, as in llama.cpp's own conversions.
    const GgmlType type = s.role == SynthRole::kNorm ? GgmlType::kF32 : o.type;
    std::vector<int64_t> ne = {s.ne0};
    if (s.ne1 > 0) ne.push_back(s.ne1);
    const int64_t rows = std::max<int64_t>(s.ne1, 1);
    auto fill = [pool, done, total, progress = o.progress, role = s.role, seed = o.seed,
                 index = static_cast<uint64_t>(i), type, ne0 = s.ne0,
                 rows](uint8_t* dst, int64_t n_bytes) -> absl::Status {
      const int64_t row_bytes = RowBytes(type, ne0);
      if (row_bytes * rows != n_bytes) return absl::InternalError("synth: tensor size mismatch");
      // Rows are generated independently from their element indices, so the split across
      // threads never changes the bytes.
      pool->ParallelFor(
          rows,
          [&](int64_t r0, int64_t r1) {
            std::vector<float> row(static_cast<size_t>(ne0));
            for (int64_t r = r0; r < r1; ++r) {
              SynthWeights(role, seed, index, ne0, r * ne0, (r + 1) * ne0, row.data());
              QuantizeRow(type, row.data(), dst + r * row_bytes, ne0);
            }
          },
          std::max<int64_t>(1, 16384 / ne0));
      *done += n_bytes;
      if (progress) progress(*done, total);
      return absl::OkStatus();
    };
    TC_RETURN_IF_ERROR(w.AddTensor(s.name, type, std::move(ne), std::move(fill)));
  }
  return w;
}

absl::Status WriteSynthModel(const SynthOptions& options, const std::string& path) {
  TC_ASSIGN_OR_RETURN(GgufWriter w, BuildSynthModel(options));
  return w.WriteFile(path);
}

}  // namespace thermocline
