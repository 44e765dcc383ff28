#include "shared/model/quantize.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "shared/gguf/quant.h"
#include "shared/util/status_macros.h"

namespace thermocline {
namespace {

std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string Name(GgmlType t) { return std::string(TypeTraits(t).name); }

// llama.cpp's own test for "this tensor is a weight matrix to quantize" (names ending in
// "weight", at least two dimensions, not a norm).
bool IsQuantizable(const GgufTensorInfo& t) {
  int n_dims = static_cast<int>(t.ne.size());
  while (n_dims > 1 && t.ne[n_dims - 1] == 1) --n_dims;  // ggml_n_dims ignores trailing 1s
  return EndsWith(t.name, "weight") && n_dims >= 2 &&
         t.name.find("_norm.weight") == std::string::npos;
}

// The layer of a "blk.N.*" tensor, or -1.
int LayerOf(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  int layer = 0;
  size_t i = 4;
  for (; i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])); ++i) {
    layer = layer * 10 + (name[i] - '0');
    if (layer > 1 << 20) return -1;
  }
  return i > 4 && i < name.size() && name[i] == '.' ? layer : -1;
}

// What llama.cpp's per-tensor rules (llama_tensor_get_type) read about a tensor's layer.
struct LayerInfo {
  int layer;     // its index among the tensors of its kind (file order)
  int n_layers;  // how many tensors of its kind the model has
  int64_t gqa;   // query heads per KV head
};

// llama.cpp's use_more_bits: the first and last eighth of the layers and every third between.
bool UseMoreBits(const LayerInfo& l) {
  const int i = l.layer, n = l.n_layers;
  return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}
bool Always(const LayerInfo&) { return true; }
bool Gqa4(const LayerInfo& l) { return l.gqa >= 4; }
bool FirstEighth(const LayerInfo& l) { return l.layer < l.n_layers / 8; }
bool FirstSixteenth(const LayerInfo& l) { return l.layer < l.n_layers / 16; }
bool FirstTwo(const LayerInfo& l) { return l.layer < 2; }
bool FirstFour(const LayerInfo& l) { return l.layer < 4; }

// The tensors the mixes treat apart (llama.cpp matches these names as substrings of blk.N.*).
enum class Kind { kAttnV, kFfnDown, kAttnOutput, kOther };

Kind KindOf(const std::string& name) {
  if (EndsWith(name, ".attn_v.weight")) return Kind::kAttnV;
  if (EndsWith(name, ".ffn_down.weight")) return Kind::kFfnDown;
  if (EndsWith(name, ".attn_output.weight")) return Kind::kAttnOutput;
  return Kind::kOther;
}

// llama_tensor_get_type's mixes without an importance matrix, for a dense (non-MoE,
// non-Falcon, non-70B) model: for a tensor of `kind` in a `ftype` file, the first row whose
// condition holds gives its type; no row keeps the target type. (llama.cpp's if / else-if chain
// per tensor kind, one row per branch, in its order.) Ftypes with no row (Q4_0, Q4_1, Q5_0, Q5_1,
// Q8_0, Q3_K_S, Q5_K_S, Q6_K) only change output.weight.
struct MixRule {
  uint32_t ftype;
  Kind kind;
  bool (*applies)(const LayerInfo&);
  GgmlType type;
};
constexpr uint32_t kQ2_K = 10, kQ2_K_S = 21, kQ3_K_M = 12, kQ3_K_L = 13, kQ4_K_S = 14, kQ4_K_M = 15,
                   kQ5_K_M = 17, kIQ4_NL = 25, kIQ4_XS = 30;
constexpr MixRule kMixRules[] = {
    {kQ2_K, Kind::kAttnV, Gqa4, GgmlType::kQ4_K},
    {kQ2_K, Kind::kAttnV, Always, GgmlType::kQ3_K},
    {kQ2_K, Kind::kFfnDown, Always, GgmlType::kQ3_K},
    {kQ2_K, Kind::kAttnOutput, Always, GgmlType::kQ3_K},
    {kQ2_K_S, Kind::kAttnV, Gqa4, GgmlType::kQ4_K},
    {kQ2_K_S, Kind::kFfnDown, FirstEighth, GgmlType::kQ4_K},
    {kQ3_K_M, Kind::kAttnV, FirstTwo, GgmlType::kQ5_K},
    {kQ3_K_M, Kind::kAttnV, Always, GgmlType::kQ4_K},
    {kQ3_K_M, Kind::kFfnDown, FirstSixteenth, GgmlType::kQ5_K},
    {kQ3_K_M, Kind::kFfnDown, Always, GgmlType::kQ4_K},
    {kQ3_K_M, Kind::kAttnOutput, Always, GgmlType::kQ4_K},
    {kQ3_K_L, Kind::kAttnV, Always, GgmlType::kQ5_K},
    {kQ3_K_L, Kind::kFfnDown, Always, GgmlType::kQ5_K},
    {kQ3_K_L, Kind::kAttnOutput, Always, GgmlType::kQ5_K},
    {kIQ4_NL, Kind::kAttnV, Gqa4, GgmlType::kQ5_K},
    {kIQ4_NL, Kind::kFfnDown, FirstEighth, GgmlType::kQ5_K},
    {kIQ4_XS, Kind::kAttnV, Gqa4, GgmlType::kQ5_K},
    {kIQ4_XS, Kind::kFfnDown, FirstEighth, GgmlType::kQ5_K},
    {kQ4_K_M, Kind::kAttnV, UseMoreBits, GgmlType::kQ6_K},
    {kQ4_K_M, Kind::kFfnDown, UseMoreBits, GgmlType::kQ6_K},
    {kQ5_K_M, Kind::kAttnV, UseMoreBits, GgmlType::kQ6_K},
    {kQ5_K_M, Kind::kFfnDown, UseMoreBits, GgmlType::kQ6_K},
    {kQ4_K_S, Kind::kAttnV, FirstFour, GgmlType::kQ5_K},
    {kQ4_K_S, Kind::kFfnDown, FirstEighth, GgmlType::kQ5_K},
};

// llama.cpp's fallback for a tensor whose rows do not fit its type's 256-element super-blocks:
// a 32-element type of about the same size (then f16 if rows do not fit 32 either). No
// fallback (an error) for the other types.
std::optional<GgmlType> FallbackFor(GgmlType t) {
  switch (t) {
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kIQ4_XS:
      return GgmlType::kIQ4_NL;
    case GgmlType::kQ4_K:
      return GgmlType::kQ5_0;
    case GgmlType::kQ5_K:
      return GgmlType::kQ5_1;
    case GgmlType::kQ6_K:
      return GgmlType::kQ8_0;
    default:
      return std::nullopt;
  }
}

// llama_ftype values (llama.h). An alias follows the name llama.cpp prints for its id.
const QuantizeTarget kTargets[] = {
    {"F32", GgmlType::kF32, 0},        {"F16", GgmlType::kF16, 1},
    {"Q4_0", GgmlType::kQ4_0, 2},      {"Q4_1", GgmlType::kQ4_1, 3},
    {"Q8_0", GgmlType::kQ8_0, 7},      {"Q5_0", GgmlType::kQ5_0, 8},
    {"Q5_1", GgmlType::kQ5_1, 9},      {"Q6_K", GgmlType::kQ6_K, 18},
    {"BF16", GgmlType::kBF16, 32},     {"Q2_K", GgmlType::kQ2_K, 10},
    {"Q2_K_S", GgmlType::kQ2_K, 21},   {"Q3_K_S", GgmlType::kQ3_K, 11},
    {"Q3_K_M", GgmlType::kQ3_K, 12},   {"Q3_K", GgmlType::kQ3_K, 12},  // alias
    {"Q3_K_L", GgmlType::kQ3_K, 13},   {"Q4_K_S", GgmlType::kQ4_K, 14},
    {"Q4_K_M", GgmlType::kQ4_K, 15},   {"Q5_K_S", GgmlType::kQ5_K, 16},
    {"Q5_K_M", GgmlType::kQ5_K, 17},   {"Q4_K", GgmlType::kQ4_K, 15},  // llama.cpp's aliases
    {"Q5_K", GgmlType::kQ5_K, 17},     {"IQ4_NL", GgmlType::kIQ4_NL, 25},
    {"IQ4_XS", GgmlType::kIQ4_XS, 30},
};
}  // namespace

std::optional<std::string> FileTypeName(uint32_t file_type) {
  for (const QuantizeTarget& t : kTargets) {
    if (t.file_type == file_type) return t.name;
  }
  return std::nullopt;
}

absl::StatusOr<QuantizeTarget> QuantizeTargetFromName(const std::string& name) {
  const std::string n = Upper(name);
  for (const QuantizeTarget& t : kTargets) {
    if (t.name == n) return t;
  }
  static constexpr char kSupported[] =
      "supported: F32, F16, BF16, Q8_0, Q6_K, Q5_K_M, Q5_K_S, Q5_1, Q5_0, Q4_K_M, Q4_K_S, Q4_1, "
      "Q4_0, Q3_K_L, Q3_K_M, Q3_K_S, Q2_K, Q2_K_S, IQ4_NL, IQ4_XS";
  static const char* const kNotWritten[] = {"IQ3_XXS", "IQ3_XS", "IQ3_S", "IQ3_M",
                                            "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M",
                                            "IQ1_S",   "IQ1_M",  "TQ1_0", "TQ2_0"};
  for (const char* t : kNotWritten) {
    if (n == t) {
      return absl::UnimplementedError(
          absl::StrCat("--type ", name,
                       ": Thermocline can run this type but cannot write it yet (its "
                       "quantizer is not implemented); ",
                       kSupported));
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--type ", name, " is not a llama-quantize type; ", kSupported));
}

absl::StatusOr<std::vector<QuantizedTensor>> PlanQuantization(const GgufFile& in,
                                                              const QuantizeOptions& options) {
  const GgmlType target = options.target.type;
  const bool quantized = TypeTraits(target).block_size > 1;
  const uint32_t ftype = options.target.file_type;
  // Grouped-query attention factor (heads per KV head), which some attn_v rules read.
  int64_t gqa = 1;
  if (auto arch = in.GetString("general.architecture"); arch.ok()) {
    auto heads = in.GetInt(*arch + ".attention.head_count");
    auto kv_heads = in.GetInt(*arch + ".attention.head_count_kv");
    if (heads.ok() && kv_heads.ok() && *kv_heads > 0) gqa = *heads / *kv_heads;
  }
  // llama.cpp counts the tensors of each kind to know the number of layers, and numbers them in
  // file order; a model without output.weight reuses token_embd as the output, which then gets
  // output.weight's type.
  int count[4] = {0, 0, 0, 0};
  bool has_output = false;
  for (const GgufTensorInfo& t : in.tensors()) {
    ++count[static_cast<int>(KindOf(t.name))];
    has_output |= t.name == "output.weight";
  }
  int seen[4] = {0, 0, 0, 0};
  std::vector<QuantizedTensor> plan;
  for (const GgufTensorInfo& t : in.tensors()) {
    QuantizedTensor q{t.name, t.type, t.type};
    const Kind kind = KindOf(t.name);
    const LayerInfo layer{seen[static_cast<int>(kind)]++, count[static_cast<int>(kind)], gqa};
    if (IsQuantizable(t)) {
      q.to = target;
      const int64_t cols = t.ne[0];
      if (quantized && !options.pure) {
        if (t.name == "output.weight" || (!has_output && t.name == "token_embd.weight")) {
          // q6_K, or q8_0 where rows do not fit the target's own blocks.
          if (cols % TypeTraits(target).block_size != 0) {
            q.to = GgmlType::kQ8_0;
          } else if (target != GgmlType::kQ8_0) {
            q.to = GgmlType::kQ6_K;
          }
        } else if (kind != Kind::kOther && LayerOf(t.name) >= 0) {
          for (const MixRule& r : kMixRules) {
            if (r.ftype == ftype && r.kind == kind && r.applies(layer)) {
              q.to = r.type;
              break;
            }
          }
        }
        if (cols % TypeTraits(q.to).block_size != 0) {
          if (std::optional<GgmlType> f = FallbackFor(q.to); f.has_value()) {
            q.to = cols % TypeTraits(*f).block_size == 0 ? *f : GgmlType::kF16;
          }
        }
      }
      if (cols % TypeTraits(q.to).block_size != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", t.name, "': rows of ", cols, " do not fit ", Name(q.to), " blocks of ",
            TypeTraits(q.to).block_size, " (llama.cpp has no fallback for it either)"));
      }
      if (q.to != q.from && !HasQuantizer(q.to)) {
        return absl::UnimplementedError(absl::StrCat(
            "tensor '", t.name, "': llama.cpp's ", options.target.name, " mix stores it as ",
            Name(q.to), ", whose quantizer is not implemented (--pure keeps it ", Name(target),
            ")"));
      }
      if (q.to != q.from && q.from != GgmlType::kF32 && q.from != GgmlType::kF16 &&
          q.from != GgmlType::kBF16) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", t.name, "' is ", Name(q.from),
                         ": quantize from an f32, f16 or bf16 model (requantizing rounds twice)"));
      }
    }
    plan.push_back(std::move(q));
  }
  return plan;
}

absl::Status QuantizeModel(const GgufFile& in, const std::string& out_path,
                           const QuantizeOptions& options, ThreadPool& pool,
                           const std::function<void(int64_t, int64_t)>& progress) {
  TC_ASSIGN_OR_RETURN(std::vector<QuantizedTensor> plan, PlanQuantization(in, options));
  GgufWriter w;
  w.set_powerinfer_magic(in.is_powerinfer());
  w.set_alignment(static_cast<uint32_t>(in.alignment()));
  for (const auto& [key, value] : in.metadata()) w.SetValue(key, value);
  w.SetValue("general.quantization_version", GgufU32(2));
  w.SetValue("general.file_type", GgufU32(options.target.file_type));
  int64_t total = 0;
  for (const GgufTensorInfo& t : in.tensors()) total += t.n_bytes;
  auto done = std::make_shared<int64_t>(0);
  for (size_t i = 0; i < plan.size(); ++i) {
    const GgufTensorInfo& t = in.tensors()[i];
    const QuantizedTensor q = plan[i];
    GgufWriter::TensorFiller fill;
    if (q.to == q.from) {
      fill = [&t, done, total, &progress](uint8_t* dst, int64_t n) -> absl::Status {
        if (n > 0) std::memcpy(dst, t.data, static_cast<size_t>(n));
        if (progress) progress(*done += t.n_bytes, total);
        return absl::OkStatus();
      };
    } else {
      fill = [&t, q, done, total, &progress, &pool](uint8_t* dst, int64_t) -> absl::Status {
        const int64_t cols = t.ne[0], rows = t.n_elements / std::max<int64_t>(1, cols);
        const int64_t src_bytes = RowBytes(q.from, cols), dst_bytes = RowBytes(q.to, cols);
        // Pieces of at least a few rows' worth of quantizer work: the K-quant and IQ4
        // quantizers search every block's scale, so even one row is microseconds of work.
        pool.ParallelFor(
            rows,
            [&](int64_t r0, int64_t r1) {
              std::vector<float> row(static_cast<size_t>(cols));
              for (int64_t r = r0; r < r1; ++r) {
                DequantizeRow(q.from, t.data + r * src_bytes, row.data(), cols);
                QuantizeRow(q.to, row.data(), dst + r * dst_bytes, cols);
              }
            },
            /*grain=*/4);
        if (progress) progress(*done += t.n_bytes, total);
        return absl::OkStatus();
      };
    }
    TC_RETURN_IF_ERROR(w.AddTensor(t.name, q.to, t.ne, std::move(fill)));
  }
  return w.WriteFile(out_path);
}

}  // namespace thermocline
