#include "shared/model/synth.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numbers>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "shared/gguf/quant.h"
#include "shared/model/arch.h"
#include "shared/model/synth_arch.h"
#include "shared/tokenizer/tokenizer.h"
#include "shared/tokenizer/vocab_metadata.h"
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
float ProjectionStddev(int64_t fan_in) { return 1.0f / std::sqrt(static_cast<float>(fan_in)); }
void ProjectionWeights(uint64_t key, int64_t fan_in, int64_t begin, int64_t end, float* out) {
  FillUniform(key, ProjectionStddev(fan_in), begin, end, out);
}

// Small beside the activations they are added to, but nonzero: a forward pass that dropped a
// bias would change the logits.
constexpr float kBiasStddev = 0.1f;

// Keys of the per-layer streams the realistic construction shares between tensors (thresholds,
// loadings, basis): far above any tensor index, so no tensor's own stream is reused.
constexpr uint64_t kStreamBase = uint64_t{1} << 40;
enum Stream : uint64_t { kThresholdStream = 0, kLoadingStream = 1, kBasisStream = 2 };
constexpr uint64_t kPersistentDimStream = kStreamBase - 1;

uint64_t StreamKey(uint64_t seed, int64_t layer, Stream stream) {
  return TensorKey(seed, kStreamBase + static_cast<uint64_t>(layer) * 16 + stream);
}

// Share of each gate row's variance in its low-rank part: what a rank-basis_rank predictor can
// see. Real ReLU LLMs' gates have decaying spectra that PowerInfer's predictors exploit the same
// way.
constexpr double kExplained = 0.95;
// The analytic predictor's margin is chosen for this recall under the construction's Gaussian
// statistics; the real forward pass loses a little to quantization, RMS spread and context.
constexpr double kPredictorRecallTarget = 0.985;
// Thresholds are clipped here: beyond it a neuron fires with probability < 1e-15, and the clip
// bounds gate[i][k] (see gate_scale) so that quantization blocks keep their resolution.
constexpr double kMaxThreshold = 8.0;

// Standard normal quantile (Acklam's rational approximation, relative error < 1.2e-9).
double NormalQuantile(double p) {
  static constexpr double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,
                                 -2.759285104469687e+02, 1.383577518672690e+02,
                                 -3.066479806614716e+01, 2.506628277459239e+00};
  static constexpr double b[] = {-5.447609879822406e+01, 1.615858368580409e+02,
                                 -1.556989798598866e+02, 6.680131188771972e+01,
                                 -1.328068155288572e+01};
  static constexpr double c[] = {-7.784894002430293e-03, -3.223964580411365e-01,
                                 -2.400758277161838e+00, -2.549732539343734e+00,
                                 4.374664141464968e+00,  2.938163982698783e+00};
  static constexpr double d[] = {7.784695709041462e-03, 3.224671290700398e-01,
                                 2.445134137142996e+00, 3.754408661907416e+00};
  constexpr double kLow = 0.02425;
  if (p < kLow) {
    const double q = std::sqrt(-2 * std::log(p));
    return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
           ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  if (p > 1 - kLow) return -NormalQuantile(1 - p);
  const double q = p - 0.5, r = q * q;
  return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
         (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
}

double NormalCdf(double x) { return 0.5 * std::erfc(-x / std::numbers::sqrt2); }

// Expected recall of the analytic predictor: a neuron with threshold t ~ N(mu, s^2) fires when
// S + E > t and is predicted when S >= t - margin, S ~ N(0, a2), E ~ N(0, 1 - a2) independent.
// Recall = P(predicted and fires) / P(fires), over tokens and neurons.
double ExpectedRecall(double mu, double s, double a2, double margin) {
  const double a = std::sqrt(a2), b = std::sqrt(1 - a2);
  constexpr int kT = 121, kS = 241;
  double fires = 0, hit = 0;
  for (int it = 0; it < kT; ++it) {
    const double z = s > 0 ? -6.0 + 12.0 * it / (kT - 1) : 0.0;
    const double wt = s > 0 ? std::exp(-0.5 * z * z) : 1.0;
    const double t = mu + s * z;
    fires += wt * NormalCdf(-t);
    // Trapezoid over S in [t - margin, 8a] of phi(S / a) / a * P(E > t - S).
    const double lo = std::max(t - margin, -8 * a), hi = 8 * a;
    if (lo < hi) {
      const double step = (hi - lo) / (kS - 1);
      double sum = 0;
      for (int i = 0; i < kS; ++i) {
        const double x = lo + step * i;
        const double f = std::exp(-0.5 * x * x / a2) * NormalCdf((x - t) / b);
        sum += (i == 0 || i == kS - 1) ? 0.5 * f : f;
      }
      hit += wt * sum * step / (a * std::sqrt(2 * std::numbers::pi));
    }
    if (s <= 0) break;
  }
  return fires > 0 ? hit / fires : 1.0;
}

// Expected per-element RMS of the residual stream at layer l's FFN input (the embeddings' is 1),
// measured on these models over TinyStories text: the mean over seeds and active fractions
// 0.05-0.2 at every 4th layer, the same within 1% at dim 128, 256, 512 and 1024 (every
// projection has variance 1/fan_in, so the stream's per-element statistics do not depend on the
// width). Linear in between and, past the table, at the last segment's slope. No forward pass
// runs at synth time; docs/synthetic-models.md has the measurements.
double ResidualRms(int64_t layer) {
  static constexpr double kEvery = 4;
  static constexpr double kRms[] = {1.042, 1.513, 2.110, 2.727, 3.261, 3.757, 4.150, 4.590};
  constexpr int kN = sizeof(kRms) / sizeof(kRms[0]);
  const double x = static_cast<double>(layer) / kEvery;
  const int i = std::min(static_cast<int>(x), kN - 2);
  return kRms[i] + (x - i) * (kRms[i + 1] - kRms[i]);
}

absl::Status Bad(std::string_view flag, int64_t value, std::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("--", absl::string_view(flag.data(), flag.size()),
                                                 " ", value, ": ",
                                                 absl::string_view(why.data(), why.size())));
}
absl::Status BadNumber(std::string_view flag, double value, std::string_view why) {
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
    case GgmlType::kQ4_1:
      return 3;  // LLAMA_FTYPE_MOSTLY_Q4_1
    case GgmlType::kQ5_0:
      return 8;  // LLAMA_FTYPE_MOSTLY_Q5_0
    case GgmlType::kQ5_1:
      return 9;  // LLAMA_FTYPE_MOSTLY_Q5_1
    case GgmlType::kQ8_0:
      return 7;  // LLAMA_FTYPE_MOSTLY_Q8_0
    case GgmlType::kBF16:
      return 32;  // LLAMA_FTYPE_MOSTLY_BF16
    case GgmlType::kQ6_K:
      return 18;  // LLAMA_FTYPE_MOSTLY_Q6_K
    case GgmlType::kQ2_K:
      return 10;  // LLAMA_FTYPE_MOSTLY_Q2_K
    case GgmlType::kQ3_K:
      return 12;  // LLAMA_FTYPE_MOSTLY_Q3_K_M
    case GgmlType::kQ4_K:
      return 15;  // LLAMA_FTYPE_MOSTLY_Q4_K_M
    case GgmlType::kQ5_K:
      return 17;  // LLAMA_FTYPE_MOSTLY_Q5_K_M
    case GgmlType::kIQ4_NL:
      return 25;  // LLAMA_FTYPE_MOSTLY_IQ4_NL
    case GgmlType::kIQ4_XS:
      return 30;  // LLAMA_FTYPE_MOSTLY_IQ4_XS
    default:
      break;  // synth writes only the types above
  }
  return 0;
}


SynthFfnKind KindOf(FfnActivation a) {
  switch (a) {
    case FfnActivation::kSilu:
      return SynthFfnKind::kSwiGlu;
    case FfnActivation::kRelu:
      return SynthFfnKind::kReluGated;
    case FfnActivation::kGelu:
      return SynthFfnKind::kGelu;
    case FfnActivation::kDrelu:
      return SynthFfnKind::kDrelu;
  }
  return SynthFfnKind::kSwiGlu;
}

// thermocline.ffn_activation's value (model.cc reads it).
std::string_view ActivationName(SynthFfnKind kind) {
  switch (kind) {
    case SynthFfnKind::kReluGated:
      return "relu";
    case SynthFfnKind::kGelu:
      return "gelu";
    case SynthFfnKind::kDrelu:
      return "drelu";
    case SynthFfnKind::kArchDefault:
    case SynthFfnKind::kSwiGlu:
      break;
  }
  return "silu";
}

// The options resolved against their architecture: what the tensor list and the keys read.
struct SynthShape {
  const ArchSpec* spec = nullptr;  // null: unknown architecture (refused by validation)
  const SynthArchLayout* layout = nullptr;
  int64_t head_dim = 0, q_dim = 0, kv_dim = 0;
  int64_t experts = 0, experts_used = 0, expert_ffn = 0;
  int64_t sliding_window = 0;  // 0: the architecture has no sliding layers
};

constexpr int64_t kDefaultExperts = 4;  // where every layer is MoE and --experts is not given
constexpr int64_t kMaxExperts = 512;
constexpr int64_t kMaxHeadDim = 4096;

SynthShape ResolveShape(const SynthOptions& o) {
  SynthShape s;
  s.spec = FindArch(o.arch);
  s.layout = FindSynthArchLayout(o.arch);
  if (s.spec == nullptr || s.layout == nullptr) return s;
  s.head_dim = o.head_dim > 0 ? o.head_dim : (o.heads > 0 ? o.dim / o.heads : 0);
  s.q_dim = o.heads * s.head_dim;
  s.kv_dim = o.kv_heads * s.head_dim;
  s.experts = o.experts > 0 ? o.experts : (s.layout->experts_only ? kDefaultExperts : 0);
  if (s.experts > 0) {
    s.experts_used = o.experts_used > 0 ? o.experts_used : std::min<int64_t>(2, s.experts);
    s.expert_ffn = o.expert_ffn > 0 ? o.expert_ffn : o.ffn;
  }
  if (s.spec->sliding != SlidingLayers::kNone) {
    s.sliding_window = o.sliding_window > 0
                           ? o.sliding_window
                           : std::min<int64_t>(4096, std::max<int64_t>(1, o.context / 2));
  }
  return s;
}

// Why the shaped ReLU design (docs/synthetic-models.md) does not fit an architecture; empty when
// it does. The design needs one coordinate k of the FFN input that is the same for every token,
// which the gate rows (up rows without a gate) threshold: with RMSNorm, a persistent stream
// coordinate that ffn_norm amplifies, with thresholds calibrated on the llama block's residual
// growth; with LayerNorm, the norm's bias alone (weight 0 at k), whatever the stream does.
std::string ShapedDesignMisfit(const ArchSpec& a, int64_t experts) {
  if (experts > 0) return "its FFNs are mixtures of experts (the design shapes one dense FFN)";
  if (a.norm == NormKind::kLayer) return "";
  if (!a.ffn_norm || a.parallel_block) {
    return "it has no ffn_norm to carry the persistent coordinate's gain";
  }
  if (a.post_attn_norm || a.post_ffn_norm || a.embed_scale) {
    return "its post-sublayer norms and scaled embeddings change the residual RMS the "
           "thresholds are calibrated on";
  }
  return "";
}

}  // namespace

absl::Status ValidateSynthOptions(const SynthOptions& o) {
  const SynthShape shape = ResolveShape(o);
  if (shape.spec == nullptr || shape.layout == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--arch '", o.arch, "' is not one of: ", KnownArchNames()));
  }
  const ArchSpec& a = *shape.spec;
  const SynthArchLayout& lay = *shape.layout;
  const std::string arch = absl::StrCat(" ", o.arch);
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
  if (o.head_dim == 0 && o.dim % o.heads != 0) {
    return Bad("dim", o.dim, absl::StrCat("must be divisible by --heads ", o.heads));
  }
  if (o.heads % o.kv_heads != 0) {
    return Bad("heads", o.heads, absl::StrCat("must be divisible by --kv-heads ", o.kv_heads));
  }
  if (o.head_dim != 0) {
    TC_RETURN_IF_ERROR(range("head-dim", o.head_dim, 2, kMaxHeadDim));
    if (o.head_dim % 2 != 0) {
      return Bad("head-dim", o.head_dim, "must be even (RoPE rotates pairs)");
    }
    if (shape.q_dim > kMaxDim) {
      return Bad("head-dim", o.head_dim,
                 absl::StrCat("times --heads ", o.heads, " exceeds ", kMaxDim));
    }
  } else if (shape.head_dim % 2 != 0) {
    return Bad("dim", o.dim,
               absl::StrCat("gives an odd head dimension ", shape.head_dim, " with --heads ",
                            o.heads, " (RoPE rotates pairs)"));
  }
  if (!TypeTraits(static_cast<uint32_t>(o.type)) || !IsWeightType(o.type) ||
      !HasQuantizer(o.type)) {
    return absl::InvalidArgumentError(absl::StrCat("--type: type id ",
                                                   static_cast<uint32_t>(o.type),
                                                   " is not a weight type (f32, f16, bf16, "
                                                   "q8_0, q4_0)"));
  }
  const GgmlTypeTraits& t = TypeTraits(o.type);
  const std::string why = absl::StrCat("must be a multiple of ", t.block_size, " for --type ",
                                       absl::string_view(t.name.data(), t.name.size()));
  // dim is ne[0] of the embedding and every projection except ffn_down, whose ne[0] is ffn, and
  // attn_output, whose ne[0] is heads * head_dim.
  if (o.dim % t.block_size != 0) return Bad("dim", o.dim, why);
  if (o.ffn % t.block_size != 0) return Bad("ffn", o.ffn, why);
  if (shape.q_dim % t.block_size != 0) {
    return Bad("head-dim", shape.head_dim,
               absl::StrCat("times --heads ", o.heads, " (attn_output's rows) ", why));
  }
  if (o.threads < 0) return Bad("threads", o.threads, "must be >= 0");
  if (!(o.active_fraction >= 0 && o.active_fraction < 1)) {
    return BadNumber("active-fraction", o.active_fraction, "must be in [0, 1)");
  }
  if (!(o.skew >= 0 && o.skew <= 4)) return BadNumber("skew", o.skew, "must be in [0, 4]");

  // Experts.
  if (o.experts != 0) {
    if (!a.moe) {
      return Bad("experts", o.experts,
                 absl::StrCat("the", arch, " architecture has no experts"));
    }
    TC_RETURN_IF_ERROR(range("experts", o.experts, 1, kMaxExperts));
  }
  if (shape.experts == 0) {
    if (o.experts_used != 0) {
      return Bad("experts-used", o.experts_used, "applies to MoE models only (--experts N)");
    }
    if (o.expert_ffn != 0) {
      return Bad("expert-ffn", o.expert_ffn, "applies to MoE models only (--experts N)");
    }
  } else {
    if (o.experts_used != 0) {
      TC_RETURN_IF_ERROR(range("experts-used", o.experts_used, 1, shape.experts));
    }
    if (o.expert_ffn != 0) {
      if (!lay.expert_ffn_key) {
        return Bad("expert-ffn", o.expert_ffn,
                   absl::StrCat("the", arch,
                                " architecture's experts are --ffn wide (it has no "
                                "expert_feed_forward_length)"));
      }
      TC_RETURN_IF_ERROR(range("expert-ffn", o.expert_ffn, 1, kMaxFfn));
      if (o.expert_ffn % t.block_size != 0) return Bad("expert-ffn", o.expert_ffn, why);
    }
  }
  if (o.sliding_window != 0) {
    if (a.sliding == SlidingLayers::kNone) {
      return Bad("sliding-window", o.sliding_window,
                 absl::StrCat("the", arch, " architecture has no sliding-window layers"));
    }
    TC_RETURN_IF_ERROR(range("sliding-window", o.sliding_window, 1, o.context));
  }

  // The activation: the architecture's own or ReLU.
  const SynthFfnKind kind = ResolvedSynthFfnKind(o);
  const std::vector<SynthFfnKind> kinds = SynthFfnKinds(o.arch);
  if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--ffn-kind '", SynthFfnKindName(o.arch, kind), "' is not one of the", arch,
        " architecture's: ", absl::StrJoin(kinds, ", ", [&](std::string* out, SynthFfnKind k) {
          out->append(SynthFfnKindName(o.arch, k));
        })));
  }
  if (DesignSynthSparsity(o).enabled) {
    if (const std::string misfit = ShapedDesignMisfit(a, shape.experts); !misfit.empty()) {
      return BadNumber("active-fraction", o.active_fraction,
                       absl::StrCat("the shaped ReLU design does not fit --arch", arch, ": ",
                                    misfit, "; --active-fraction 0 writes i.i.d. ReLU weights"));
    }
  }
  return absl::OkStatus();
}

SynthFfnKind ResolvedSynthFfnKind(const SynthOptions& o) {
  if (o.ffn_kind != SynthFfnKind::kArchDefault) return o.ffn_kind;
  const ArchSpec* a = FindArch(o.arch);
  return a == nullptr ? SynthFfnKind::kSwiGlu : KindOf(a->activation);
}

std::string SynthFfnKindName(std::string_view arch, SynthFfnKind kind) {
  const ArchSpec* a = FindArch(arch);
  if (kind == SynthFfnKind::kArchDefault) {
    kind = a == nullptr ? SynthFfnKind::kSwiGlu : KindOf(a->activation);
  }
  switch (kind) {
    case SynthFfnKind::kReluGated:
      return a == nullptr || a->gated_ffn ? "relu-gated" : "relu";
    case SynthFfnKind::kGelu:
      return "gelu";
    case SynthFfnKind::kDrelu:
      return "drelu";
    case SynthFfnKind::kArchDefault:
    case SynthFfnKind::kSwiGlu:
      break;
  }
  return "swiglu";
}

std::vector<SynthFfnKind> SynthFfnKinds(std::string_view arch) {
  const ArchSpec* a = FindArch(arch);
  if (a == nullptr) return {};
  std::vector<SynthFfnKind> kinds = {KindOf(a->activation)};
  if (kinds[0] != SynthFfnKind::kReluGated) kinds.push_back(SynthFfnKind::kReluGated);
  return kinds;
}

SynthSparsityDesign DesignSynthSparsity(const SynthOptions& o) {
  SynthSparsityDesign d;
  d.enabled = o.ffn_kind == SynthFfnKind::kReluGated && o.active_fraction > 0 && o.dim >= 2;
  if (!d.enabled) return d;
  d.persistent_dim = static_cast<int64_t>(Mix64(TensorKey(o.seed, kPersistentDimStream)) %
                                          static_cast<uint64_t>(o.dim));
  d.persistent_value = 1.0f;
  d.basis_rank = std::clamp<int64_t>(o.dim / 16, 1, std::min<int64_t>(128, o.dim - 1));
  d.explained = kExplained;
  d.threshold_spread = o.skew;
  // With the token term N(0, 1) and t ~ N(mu, s^2), P(fire) = Phi(-mu / sqrt(1 + s^2)).
  d.threshold_mean = -NormalQuantile(o.active_fraction) * std::sqrt(1 + o.skew * o.skew);
  // gate[i][k] = -t_i / gate_scale stays within about 2 / sqrt(dim), the size of the row's
  // largest other weights, for |t_i| <= kMaxThreshold.
  d.gate_scale = 0.5 * kMaxThreshold * std::sqrt(static_cast<double>(o.dim));
  d.residual_rms.resize(o.layers);
  for (int64_t l = 0; l < o.layers; ++l) d.residual_rms[l] = ResidualRms(l);
  // The smallest margin that reaches the recall target (recall grows with the margin).
  double lo = 0, hi = 8 * std::sqrt(1 - kExplained);
  for (int it = 0; it < 30; ++it) {
    const double mid = 0.5 * (lo + hi);
    if (ExpectedRecall(d.threshold_mean, d.threshold_spread, d.explained, mid) >=
        kPredictorRecallTarget) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  d.predictor_margin = hi;
  d.predictor_recall = ExpectedRecall(d.threshold_mean, d.threshold_spread, d.explained, hi);
  return d;
}

std::vector<float> SynthNeuronThresholds(const SynthOptions& o, const SynthSparsityDesign& d,
                                         int64_t layer) {
  std::vector<float> t(static_cast<size_t>(o.ffn));
  const uint64_t key = StreamKey(o.seed, layer, kThresholdStream);
  for (int64_t i = 0; i < o.ffn; ++i) {
    const double u = 0.5 * (static_cast<double>(UniformPm1(key, i)) + 1.0);  // in (0, 1)
    const double x = d.threshold_mean + d.threshold_spread * NormalQuantile(u);
    t[i] = static_cast<float>(std::clamp(x, -kMaxThreshold, kMaxThreshold));
  }
  return t;
}

void SynthWeights(SynthRole role, uint64_t seed, uint64_t tensor_index, int64_t fan_in,
                  int64_t begin, int64_t end, float* out) {
  const uint64_t key = TensorKey(seed, tensor_index);
  switch (role) {
    case SynthRole::kTokenEmbedding:
      EmbeddingWeights(key, begin, end, out);
      return;
    case SynthRole::kNorm:
    case SynthRole::kFfnNorm:
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
    case SynthRole::kRouter:
      ProjectionWeights(key, fan_in, begin, end, out);
      return;
    case SynthRole::kBias:
    case SynthRole::kFfnNormBias:
      FillUniform(key, kBiasStddev, begin, end, out);
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

namespace {

// How a tensor's rows are drawn: from its parts' roles (kPlain, shaped per role when the design
// is enabled), or as one of the PowerInfer layout's tensors.
enum class SynthTensorKind { kPlain, kDownT, kFc1, kFc2 };

// A block of a tensor's rows drawn as a tensor of its own: fused tensors ([q | k | v],
// [gate | up]) hold several, each keyed by its own index, so their weights are those the
// separate tensors would hold.
struct SynthPart {
  SynthRole role;
  int64_t rows = 0;
  uint64_t index = 0;  // the part's position among the llama.cpp layout's tensors: its key
};

struct SynthTensorSpec {
  std::string name;
  std::vector<SynthPart> parts;
  std::vector<int64_t> ne;  // ggml order; rows are ne[1] * ne[2] of ne[0] values
  int64_t layer = -1;
  SynthTensorKind kind = SynthTensorKind::kPlain;
  GgmlType type = GgmlType::kF32;

  int64_t ne0() const { return ne[0]; }
  int64_t rows() const {
    int64_t r = 1;
    for (size_t i = 1; i < ne.size(); ++i) r *= ne[i];
    return r;
  }
};

// What the rows of one tensor share, built once per tensor before its rows are drawn in
// parallel (read-only while they are).
struct SynthTensorContext {
  const SynthOptions* o = nullptr;
  const SynthSparsityDesign* d = nullptr;
  const SynthTensorSpec* spec = nullptr;
  std::vector<uint64_t> keys;     // one per part
  bool shaped = false;            // the design applies to this tensor
  bool layer_norm = false;        // the FFN's norm is LayerNorm: its bias carries coordinate k
  bool attn_reads_ffn_norm = false;  // parallel blocks: attention reads the FFN's norm too
  std::vector<float> basis;       // [basis_rank][dim]: gate, fc1
  std::vector<float> thresholds;  // [ffn]: gate, fc2
};

// Basis direction r of layer l: i.i.d. uniform with standard deviation 1/sqrt(dim), so about
// unit norm, and 0 on the persistent coordinate so that only gate[i][k] reads it.
std::vector<float> LayerBasis(const SynthOptions& o, const SynthSparsityDesign& d, int64_t l) {
  std::vector<float> b(static_cast<size_t>(d.basis_rank * o.dim));
  const uint64_t key = StreamKey(o.seed, l, kBasisStream);
  FillUniform(key, ProjectionStddev(o.dim), 0, d.basis_rank * o.dim, b.data());
  for (int64_t r = 0; r < d.basis_rank; ++r) b[r * o.dim + d.persistent_dim] = 0.0f;
  return b;
}

// Neuron i's loadings c_i on the basis, scaled by a = sqrt(explained): each has standard
// deviation a / sqrt(basis_rank), so a c_i . B has per-element variance explained / dim.
void NeuronLoadings(const SynthOptions& o, const SynthSparsityDesign& d, int64_t l, int64_t i,
                    float* c) {
  const float stddev = static_cast<float>(std::sqrt(d.explained / d.basis_rank));
  FillUniform(StreamKey(o.seed, l, kLoadingStream), stddev, i * d.basis_rank,
              (i + 1) * d.basis_rank, c);
}

SynthTensorContext MakeTensorContext(const SynthOptions& o, const SynthSparsityDesign& d,
                                     const ArchSpec& a, const SynthTensorSpec& s) {
  SynthTensorContext c;
  c.o = &o;
  c.d = &d;
  c.spec = &s;
  c.layer_norm = a.norm == NormKind::kLayer;
  c.attn_reads_ffn_norm = a.parallel_block;
  bool gate = false;
  for (const SynthPart& p : s.parts) {
    c.keys.push_back(TensorKey(o.seed, p.index));
    gate = gate || (s.kind == SynthTensorKind::kPlain && p.role == SynthRole::kFfnGate);
  }
  c.shaped = d.enabled;
  if (!c.shaped) return c;
  if (gate || s.kind == SynthTensorKind::kFc1) c.basis = LayerBasis(o, d, s.layer);
  if (gate || s.kind == SynthTensorKind::kFc2) c.thresholds = SynthNeuronThresholds(o, d, s.layer);
  return c;
}

// Row `row` (ne0 values) of the tensor.
void SynthRow(const SynthTensorContext& c, int64_t row, float* out, std::vector<float>& scratch) {
  const SynthOptions& o = *c.o;
  const SynthSparsityDesign& d = *c.d;
  const SynthTensorSpec& s = *c.spec;
  const int64_t n = s.ne0();
  const int64_t k = d.persistent_dim;
  switch (s.kind) {
    case SynthTensorKind::kDownT: {
      // Row r of ffn_down_t is column r of ffn_down ([dim][ffn], element j * ffn + r): the same
      // values, element by element.
      const float a = ProjectionStddev(o.ffn) * std::sqrt(3.0f);
      for (int64_t j = 0; j < n; ++j) out[j] = a * UniformPm1(c.keys[0], j * o.ffn + row);
      if (c.shaped) out[k] = 0.0f;
      return;
    }
    case SynthTensorKind::kFc1: {
      std::fill(out, out + n, 0.0f);
      if (row < 2 * d.basis_rank) {
        // [B; -B]: relu(B h) - relu(-B h) = B h, the gate's low-rank term.
        const float sign = row < d.basis_rank ? 1.0f : -1.0f;
        const float* b = c.basis.data() + (row % d.basis_rank) * o.dim;
        for (int64_t j = 0; j < n; ++j) out[j] = sign * b[j];
      } else {
        // relu(h_k / gate_scale), about 1, where h = ffn_norm(x). The predictors read ffn_inp
        // x itself (PowerInfer's input): ffn_norm multiplies coordinate k by its weight
        // gate_scale * residual_rms / persistent_value (below) and every other one by 1, so
        // this row carries that weight and the whole fc1 output is rms(x) times the one over
        // h: the same decisions, since relu and the >= 0 test are scale-invariant.
        out[k] = static_cast<float>(d.residual_rms[s.layer] / d.persistent_value);
      }
      return;
    }
    case SynthTensorKind::kFc2: {
      const int64_t rank = d.basis_rank;
      NeuronLoadings(o, d, s.layer, row, out);
      for (int64_t q = 0; q < rank; ++q) out[rank + q] = -out[q];
      out[2 * rank] = static_cast<float>(-c.thresholds[row] + d.predictor_margin);
      return;
    }
    case SynthTensorKind::kPlain:
      break;
  }
  // The part holding the row, and the row within it.
  size_t p = 0;
  int64_t r = row;
  while (r >= s.parts[p].rows) r -= s.parts[p++].rows;
  const SynthRole role = s.parts[p].role;
  if (c.shaped && role == SynthRole::kFfnGate) {
    // b e_i (i.i.d., this tensor's own stream) + a c_i . B, then the threshold on coordinate k.
    const double b = std::sqrt(1 - d.explained);
    FillUniform(c.keys[p], static_cast<float>(b) * ProjectionStddev(n), r * n, (r + 1) * n, out);
    scratch.resize(static_cast<size_t>(d.basis_rank));
    NeuronLoadings(o, d, s.layer, r, scratch.data());
    for (int64_t q = 0; q < d.basis_rank; ++q) {
      const float cq = scratch[q];
      const float* bq = c.basis.data() + q * n;
      for (int64_t j = 0; j < n; ++j) out[j] += cq * bq[j];
    }
    out[k] = static_cast<float>(-c.thresholds[r] / d.gate_scale);
    return;
  }
  SynthWeights(role, o.seed, s.parts[p].index, n, r * n, (r + 1) * n, out);
  if (!c.shaped) return;
  switch (role) {
    case SynthRole::kTokenEmbedding:
      out[k] = d.persistent_value;  // every token starts with the persistent component
      return;
    case SynthRole::kFfnNorm:
      // LayerNorm: h_k is the bias alone (below), so no stream statistic enters the threshold.
      out[k] = c.layer_norm ? 0.0f
                            : static_cast<float>(d.gate_scale * d.residual_rms[s.layer] /
                                                 d.persistent_value);
      return;
    case SynthRole::kFfnNormBias:
      std::fill(out, out + n, 0.0f);
      out[k] = static_cast<float>(d.gate_scale);
      return;
    case SynthRole::kBias:
      // LayerNorm models' biases would shift each neuron's threshold (up's, the norms') or the
      // stream's mean; zero keeps the thresholds as designed.
      if (c.layer_norm) std::fill(out, out + n, 0.0f);
      return;
    case SynthRole::kAttnQ:
    case SynthRole::kAttnK:
    case SynthRole::kAttnV:
      if (c.attn_reads_ffn_norm) out[k] = 0.0f;  // attention ignores the gate's constant input
      return;
    case SynthRole::kAttnOutput:
    case SynthRole::kFfnDown:
      if (r == k) std::fill(out, out + n, 0.0f);  // no block writes the persistent coordinate
      return;
    case SynthRole::kFfnUp:
      out[k] = 0.0f;  // up reads the token-dependent part only
      return;
    default:
      return;
  }
}

// Every tensor of the file, in file order: the architecture's spec says which norms, biases
// and FFN form a block has; the synth layout table (synth_arch.h) how the file stores them.
std::vector<SynthTensorSpec> SynthSpecs(const SynthOptions& o, const SynthShape& shape,
                                        const SynthSparsityDesign& d, SynthLayout layout) {
  const ArchSpec& a = *shape.spec;
  const SynthArchLayout& lay = *shape.layout;
  const int64_t dim = o.dim, q_dim = shape.q_dim, kv_dim = shape.kv_dim;
  std::vector<SynthTensorSpec> specs;
  uint64_t index = 0;
  // parts: (role, rows) in row order; a tensor of one part when there is one.
  auto add = [&](std::string name, std::vector<std::pair<SynthRole, int64_t>> parts,
                 std::vector<int64_t> ne, int64_t layer) {
    SynthTensorSpec s;
    s.name = std::move(name);
    s.ne = std::move(ne);
    for (auto [role, rows] : parts) s.parts.push_back({role, rows, index++});
    s.layer = layer;
    // Norms, biases and routers stay F32, as in llama.cpp's own conversions.
    const SynthRole role = s.parts[0].role;
    const bool f32 = role == SynthRole::kNorm || role == SynthRole::kFfnNorm ||
                     role == SynthRole::kBias || role == SynthRole::kFfnNormBias ||
                     role == SynthRole::kRouter;
    s.type = f32 ? GgmlType::kF32 : o.type;
    specs.push_back(std::move(s));
  };
  auto add1 = [&](std::string name, SynthRole role, std::vector<int64_t> ne, int64_t layer) {
    int64_t rows = 1;
    for (size_t i = 1; i < ne.size(); ++i) rows *= ne[i];
    add(std::move(name), {{role, rows}}, std::move(ne), layer);
  };
  auto norm = [&](const std::string& base, SynthRole role, int64_t layer) {
    add1(base + ".weight", role, {dim}, layer);
    if (a.norm == NormKind::kLayer) {
      add1(base + ".bias",
           role == SynthRole::kFfnNorm ? SynthRole::kFfnNormBias : SynthRole::kBias, {dim},
           layer);
    }
  };
  add1("token_embd.weight", SynthRole::kTokenEmbedding, {dim, o.vocab}, -1);
  for (int64_t l = 0; l < o.layers; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    // A parallel block's one norm feeds the FFN too: it plays ffn_norm's part in the design.
    if (a.attn_norm) {
      norm(p + "attn_norm", a.parallel_block ? SynthRole::kFfnNorm : SynthRole::kNorm, l);
    }
    if (lay.fused_qkv) {
      add(p + "attn_qkv.weight",
          {{SynthRole::kAttnQ, q_dim}, {SynthRole::kAttnK, kv_dim}, {SynthRole::kAttnV, kv_dim}},
          {dim, q_dim + 2 * kv_dim}, l);
      if (lay.qkv_bias) add1(p + "attn_qkv.bias", SynthRole::kBias, {q_dim + 2 * kv_dim}, l);
    } else {
      for (auto [name, role, rows] : {std::tuple{"attn_q", SynthRole::kAttnQ, q_dim},
                                      std::tuple{"attn_k", SynthRole::kAttnK, kv_dim},
                                      std::tuple{"attn_v", SynthRole::kAttnV, kv_dim}}) {
        add1(p + name + ".weight", role, {dim, rows}, l);
        if (lay.qkv_bias) add1(p + name + ".bias", SynthRole::kBias, {rows}, l);
      }
    }
    add1(p + "attn_output.weight", SynthRole::kAttnOutput, {q_dim, dim}, l);
    if (lay.other_biases) add1(p + "attn_output.bias", SynthRole::kBias, {dim}, l);
    if (a.qk_norm) {
      add1(p + "attn_q_norm.weight", SynthRole::kNorm, {lay.qk_norm_whole ? q_dim : shape.head_dim},
           l);
      add1(p + "attn_k_norm.weight", SynthRole::kNorm,
           {lay.qk_norm_whole ? kv_dim : shape.head_dim}, l);
    }
    if (a.post_attn_norm) add1(p + "post_attention_norm.weight", SynthRole::kNorm, {dim}, l);
    if (a.ffn_norm && !a.parallel_block) norm(p + "ffn_norm", SynthRole::kFfnNorm, l);
    if (shape.experts > 0) {
      const int64_t ne = shape.experts, ef = shape.expert_ffn;
      add1(p + "ffn_gate_inp.weight", SynthRole::kRouter, {dim, ne}, l);
      add1(p + "ffn_gate_exps.weight", SynthRole::kFfnGate, {dim, ef, ne}, l);
      add1(p + "ffn_up_exps.weight", SynthRole::kFfnUp, {dim, ef, ne}, l);
      add1(p + "ffn_down_exps.weight", SynthRole::kFfnDown, {ef, dim, ne}, l);
      if (lay.shared_expert) {
        add1(p + "ffn_gate_inp_shexp.weight", SynthRole::kRouter, {dim}, l);
        add1(p + "ffn_gate_shexp.weight", SynthRole::kFfnGate, {dim, o.ffn}, l);
        add1(p + "ffn_up_shexp.weight", SynthRole::kFfnUp, {dim, o.ffn}, l);
        add1(p + "ffn_down_shexp.weight", SynthRole::kFfnDown, {o.ffn, dim}, l);
      }
    } else {
      if (!a.gated_ffn) {
        // Without a gate, up is what the activation reads: it plays the gate's part.
        add1(p + "ffn_up.weight", SynthRole::kFfnGate, {dim, o.ffn}, l);
      } else if (lay.fused_gate_up) {
        add(p + "ffn_up.weight", {{SynthRole::kFfnGate, o.ffn}, {SynthRole::kFfnUp, o.ffn}},
            {dim, 2 * o.ffn}, l);
      } else {
        add1(p + "ffn_gate.weight", SynthRole::kFfnGate, {dim, o.ffn}, l);
        add1(p + "ffn_up.weight", SynthRole::kFfnUp, {dim, o.ffn}, l);
      }
      if (lay.other_biases) add1(p + "ffn_up.bias", SynthRole::kBias, {o.ffn}, l);
      add1(p + "ffn_down.weight", SynthRole::kFfnDown, {o.ffn, dim}, l);
      if (layout == SynthLayout::kPowerInfer) {
        SynthTensorSpec& down = specs.back();  // same weights, one row per neuron
        down.name = p + "ffn_down_t.weight";
        down.kind = SynthTensorKind::kDownT;
        down.ne = {dim, o.ffn};
        // The predictors are functions of the design, not weights with their own stream.
        for (SynthTensorKind kind : {SynthTensorKind::kFc1, SynthTensorKind::kFc2}) {
          SynthTensorSpec s;
          const bool fc1 = kind == SynthTensorKind::kFc1;
          s.name = p + (fc1 ? "fc1.weight" : "fc2.weight");
          s.ne = {fc1 ? dim : d.predictor_rank(), fc1 ? d.predictor_rank() : o.ffn};
          s.parts = {{SynthRole::kFfnGate, s.ne[1], 0}};
          s.layer = l;
          s.kind = kind;
          s.type = GgmlType::kF16;
          specs.push_back(std::move(s));
        }
      }
      if (lay.other_biases) add1(p + "ffn_down.bias", SynthRole::kBias, {dim}, l);
    }
    if (a.post_ffn_norm) add1(p + "post_ffw_norm.weight", SynthRole::kNorm, {dim}, l);
  }
  norm("output_norm", SynthRole::kNorm, -1);
  if (!a.output_always_tied) add1("output.weight", SynthRole::kOutput, {dim, o.vocab}, -1);
  return specs;
}

}  // namespace

int64_t SynthParameterCount(const SynthOptions& o) {
  const SynthShape shape = ResolveShape(o);
  if (shape.spec == nullptr || shape.layout == nullptr) return 0;
  int64_t n = 0;
  for (const SynthTensorSpec& s :
       SynthSpecs(o, shape, SynthSparsityDesign{}, SynthLayout::kLlamaCpp)) {
    n += s.ne0() * s.rows();
  }
  return n;
}

absl::StatusOr<GgufWriter> BuildSynthModel(const SynthOptions& requested, SynthLayout layout) {
  SynthOptions o = requested;
  std::unique_ptr<GgufFile> vocab_file;
  if (!o.tokenizer_from.empty()) {
    // Only the header is read: a model file lends its vocabulary without its weights.
    auto opened = GgufFile::OpenHeader(o.tokenizer_from);
    if (!opened.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tokenizer-from: ", opened.status().message()));
    }
    vocab_file = std::move(*opened);
    auto tokenizer = Tokenizer::FromGguf(*vocab_file);
    if (!tokenizer.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tokenizer-from ", o.tokenizer_from, ": ", tokenizer.status().message()));
    }
    o.vocab = tokenizer->vocab_size();
  }
  TC_RETURN_IF_ERROR(ValidateSynthOptions(o));
  const SynthShape shape = ResolveShape(o);
  auto design = std::make_shared<const SynthSparsityDesign>(DesignSynthSparsity(o));
  if (layout == SynthLayout::kPowerInfer && o.arch != "llama") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--powerinfer: PowerInfer's layout is written for --arch llama only (not ", o.arch, ")"));
  }
  if (layout == SynthLayout::kPowerInfer && !design->enabled) {
    return absl::InvalidArgumentError(
        ResolvedSynthFfnKind(o) != SynthFfnKind::kReluGated
            ? "--powerinfer: PowerInfer runs ReLU models only (use --ffn-kind relu-gated)"
            : "--powerinfer: the predictors need a shaped model (--active-fraction > 0)");
  }
  const ArchSpec& a = *shape.spec;
  const SynthArchLayout& lay = *shape.layout;
  auto u32 = [](int64_t v) { return GgufU32(static_cast<uint32_t>(v)); };
  const std::string pre = absl::StrCat(o.arch, ".");

  GgufWriter w;
  w.set_powerinfer_magic(layout == SynthLayout::kPowerInfer);
  w.SetValue("general.architecture", GgufString(o.arch));
  w.SetValue("general.name", GgufString(o.name));
  w.SetValue("general.file_type", GgufU32(SynthFileType(o.type)));
  w.SetValue(pre + "vocab_size", u32(o.vocab));
  w.SetValue(pre + "context_length", u32(o.context));
  w.SetValue(pre + "embedding_length", u32(o.dim));
  w.SetValue(pre + "feed_forward_length", u32(o.ffn));
  w.SetValue(pre + "block_count", u32(o.layers));
  w.SetValue(pre + "attention.head_count", u32(o.heads));
  w.SetValue(pre + "attention.head_count_kv", u32(o.kv_heads));
  w.SetValue(pre + std::string(a.eps_key), GgufF32(a.default_eps));
  w.SetValue(pre + "rope.freq_base", GgufF32(10000.0f));
  w.SetValue(pre + "rope.dimension_count", u32(shape.head_dim));
  if (o.head_dim > 0) {
    w.SetValue(pre + "attention.key_length", u32(shape.head_dim));
    w.SetValue(pre + "attention.value_length", u32(shape.head_dim));
  }
  if (shape.sliding_window > 0) {
    w.SetValue(pre + "attention.sliding_window", u32(shape.sliding_window));
  }
  if (lay.attn_softcap > 0) w.SetValue(pre + "attn_logit_softcapping", GgufF32(lay.attn_softcap));
  if (lay.final_softcap > 0) {
    w.SetValue(pre + "final_logit_softcapping", GgufF32(lay.final_softcap));
  }
  if (shape.experts > 0) {
    w.SetValue(pre + "expert_count", u32(shape.experts));
    w.SetValue(pre + "expert_used_count", u32(shape.experts_used));
    if (lay.expert_ffn_key) w.SetValue(pre + "expert_feed_forward_length", u32(shape.expert_ffn));
    if (lay.shared_expert) w.SetValue(pre + "expert_shared_feed_forward_length", u32(o.ffn));
  }
  w.SetValue("thermocline.ffn_activation",
             GgufString(std::string(ActivationName(ResolvedSynthFfnKind(o)))));
  w.SetValue("thermocline.synth.seed", GgufU64(o.seed));
  if (design->enabled) {
    w.SetValue("thermocline.synth.active_fraction", GgufF32(static_cast<float>(o.active_fraction)));
    w.SetValue("thermocline.synth.skew", GgufF32(static_cast<float>(o.skew)));
    w.SetValue("thermocline.synth.persistent_dim",
               GgufU32(static_cast<uint32_t>(design->persistent_dim)));
  }
  if (layout == SynthLayout::kPowerInfer) {
    w.SetValue("powerinfer.sparse_threshold", GgufF32(0.0f));
  }

  if (vocab_file != nullptr) {
    TC_ASSIGN_OR_RETURN(const int32_t n, CopyTokenizerMetadata(*vocab_file, w));
    if (n != o.vocab) return absl::InternalError("--tokenizer-from: the vocabulary size changed");
  } else {
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
  }

  auto specs =
      std::make_shared<const std::vector<SynthTensorSpec>>(SynthSpecs(o, shape, *design, layout));
  const int threads = o.threads > 0
                          ? o.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  auto pool = std::make_shared<ThreadPool>(threads);
  auto options = std::make_shared<const SynthOptions>(o);
  int64_t total = 0;
  for (const SynthTensorSpec& s : *specs) total += RowBytes(s.type, s.ne0()) * s.rows();
  auto done = std::make_shared<int64_t>(0);
  for (size_t i = 0; i < specs->size(); ++i) {
    const SynthTensorSpec& s = (*specs)[i];
    const int64_t rows = s.rows();
    auto fill = [pool, done, total, options, design, specs, i, rows, arch = shape.spec](
                    uint8_t* dst, int64_t n_bytes) -> absl::Status {
      const SynthTensorSpec& s = (*specs)[i];
      const int64_t row_bytes = RowBytes(s.type, s.ne0());
      if (row_bytes * rows != n_bytes) return absl::InternalError("synth: tensor size mismatch");
      const SynthTensorContext ctx = MakeTensorContext(*options, *design, *arch, s);
      // Rows are generated independently from their element indices, so the split across
      // threads never changes the bytes.
      pool->ParallelFor(
          rows,
          [&](int64_t r0, int64_t r1) {
            std::vector<float> row(static_cast<size_t>(s.ne0())), scratch;
            for (int64_t r = r0; r < r1; ++r) {
              SynthRow(ctx, r, row.data(), scratch);
              QuantizeRow(s.type, row.data(), dst + r * row_bytes, s.ne0());
            }
          },
          std::max<int64_t>(1, 16384 / s.ne0()));
      *done += n_bytes;
      if (options->progress) options->progress(*done, total);
      return absl::OkStatus();
    };
    TC_RETURN_IF_ERROR(w.AddTensor(s.name, s.type, s.ne, std::move(fill)));
  }
  return w;
}

absl::Status WriteSynthModel(const SynthOptions& options, const std::string& path,
                             SynthLayout layout) {
  TC_ASSIGN_OR_RETURN(GgufWriter w, BuildSynthModel(options, layout));
  return w.WriteFile(path);
}

}  // namespace thermocline
