#include "shared/model/quantize.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <memory>
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

// llama.cpp's use_more_bits: the first and last eighth of the layers and every third between.
bool UseMoreBits(int layer, int n_layers) {
  return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

}  // namespace

absl::StatusOr<QuantizeTarget> QuantizeTargetFromName(const std::string& name) {
  const std::string n = Upper(name);
  // llama_ftype values (llama.h).
  static const QuantizeTarget kTargets[] = {
      {"F32", GgmlType::kF32, 0},        {"F16", GgmlType::kF16, 1},
      {"Q4_0", GgmlType::kQ4_0, 2},      {"Q8_0", GgmlType::kQ8_0, 7},
      {"Q6_K", GgmlType::kQ6_K, 18},     {"BF16", GgmlType::kBF16, 32},
      {"Q2_K", GgmlType::kQ2_K, 10},     {"Q3_K_S", GgmlType::kQ3_K, 11},
      {"Q3_K_M", GgmlType::kQ3_K, 12},   {"Q3_K", GgmlType::kQ3_K, 12},  // alias
      {"Q4_K_S", GgmlType::kQ4_K, 14},   {"Q4_K_M", GgmlType::kQ4_K, 15},
      {"Q5_K_S", GgmlType::kQ5_K, 16},   {"Q5_K_M", GgmlType::kQ5_K, 17},
      {"Q4_K", GgmlType::kQ4_K, 15},     {"Q5_K", GgmlType::kQ5_K, 17},  // llama.cpp's aliases
      {"IQ4_NL", GgmlType::kIQ4_NL, 25}, {"IQ4_XS", GgmlType::kIQ4_XS, 30},
  };
  for (const QuantizeTarget& t : kTargets) {
    if (t.name == n) return t;
  }
  static const char* const kNotWritten[] = {
      "Q4_1",    "Q5_0",   "Q5_1",  "Q2_K_S", "Q3_K_L", "IQ3_XXS", "IQ3_S", "IQ3_M",
      "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M",  "IQ1_S",  "IQ1_M",   "TQ1_0", "TQ2_0"};
  for (const char* t : kNotWritten) {
    if (n == t) {
      return absl::UnimplementedError(absl::StrCat(
          "--type ", name,
          ": Thermocline can run this type but cannot write it yet (its "
          "quantizer is not implemented); supported: F32, F16, BF16, Q8_0, Q6_K, Q5_K_M, Q5_K_S, "
          "Q4_K_M, Q4_K_S, Q3_K_M, Q3_K_S, Q2_K, IQ4_NL, IQ4_XS, Q4_0"));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--type ", name,
      " is not a llama-quantize type; supported: F32, F16, BF16, "
      "Q8_0, Q6_K, Q5_K_M, Q5_K_S, Q4_K_M, Q4_K_S, Q3_K_M, Q3_K_S, Q2_K, IQ4_NL, IQ4_XS, Q4_0"));
}

absl::StatusOr<std::vector<QuantizedTensor>> PlanQuantization(const GgufFile& in,
                                                              const QuantizeOptions& options) {
  const GgmlType target = options.target.type;
  const bool quantized = TypeTraits(target).block_size > 1;
  // The _M mixes give attn_v and ffn_down of some layers (use_more_bits) q6_K; llama.cpp counts
  // those tensors to know the number of layers.
  const bool more_bits_mix = options.target.file_type == 15 || options.target.file_type == 17;
  const uint32_t ftype = options.target.file_type;
  // Grouped-query attention factor (heads per KV head), which the Q2_K rule for attn_v reads.
  int64_t gqa = 1;
  if (auto arch = in.GetString("general.architecture"); arch.ok()) {
    auto heads = in.GetInt(*arch + ".attention.head_count");
    auto kv_heads = in.GetInt(*arch + ".attention.head_count_kv");
    if (heads.ok() && kv_heads.ok() && *kv_heads > 0) gqa = *heads / *kv_heads;
  }
  int n_attn_v = 0, n_ffn_down = 0;
  for (const GgufTensorInfo& t : in.tensors()) {
    n_attn_v += EndsWith(t.name, ".attn_v.weight");
    n_ffn_down += EndsWith(t.name, ".ffn_down.weight");
  }
  std::vector<QuantizedTensor> plan;
  for (const GgufTensorInfo& t : in.tensors()) {
    QuantizedTensor q{t.name, t.type, t.type};
    if (IsQuantizable(t)) {
      q.to = target;
      if (quantized && !options.pure) {
        const int layer = LayerOf(t.name);
        if (t.name == "output.weight" && target != GgmlType::kQ8_0) {
          q.to = GgmlType::kQ6_K;
        } else if (more_bits_mix && layer >= 0 && EndsWith(t.name, ".attn_v.weight") &&
                   UseMoreBits(layer, n_attn_v)) {
          q.to = GgmlType::kQ6_K;
        } else if (more_bits_mix && layer >= 0 && EndsWith(t.name, ".ffn_down.weight") &&
                   UseMoreBits(layer, n_ffn_down)) {
          q.to = GgmlType::kQ6_K;
        } else if (ftype == 14 && layer >= 0 && layer < 4 && EndsWith(t.name, ".attn_v.weight")) {
          q.to = GgmlType::kQ5_K;  // Q4_K_S: the first four attn_v
        } else if (ftype == 14 && layer >= 0 && layer < n_ffn_down / 8 &&
                   EndsWith(t.name, ".ffn_down.weight")) {
          q.to = GgmlType::kQ5_K;                // Q4_K_S: ffn_down of the first eighth
        } else if (ftype == 10 && layer >= 0) {  // Q2_K
          if (EndsWith(t.name, ".attn_v.weight")) {
            q.to = gqa >= 4 ? GgmlType::kQ4_K : GgmlType::kQ3_K;
          } else if (EndsWith(t.name, ".ffn_down.weight") ||
                     EndsWith(t.name, ".attn_output.weight")) {
            q.to = GgmlType::kQ3_K;
          }
        } else if ((ftype == 25 || ftype == 30) && layer >= 0) {  // IQ4_NL, IQ4_XS
          if (EndsWith(t.name, ".attn_v.weight") && gqa >= 4) {
            q.to = GgmlType::kQ5_K;
          } else if (EndsWith(t.name, ".ffn_down.weight") && layer < n_ffn_down / 8) {
            q.to = GgmlType::kQ5_K;  // without an importance matrix
          }
        } else if (ftype == 12 && layer >= 0) {  // Q3_K_M
          if (EndsWith(t.name, ".attn_v.weight")) {
            q.to = layer < 2 ? GgmlType::kQ5_K : GgmlType::kQ4_K;
          } else if (EndsWith(t.name, ".ffn_down.weight")) {
            q.to = layer < n_ffn_down / 16 ? GgmlType::kQ5_K : GgmlType::kQ4_K;
          } else if (EndsWith(t.name, ".attn_output.weight")) {
            q.to = GgmlType::kQ4_K;
          }
        }
      }
      if (t.ne[0] % TypeTraits(q.to).block_size != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", t.name, "': rows of ", t.ne[0], " do not fit ", Name(q.to),
                         " blocks of ", TypeTraits(q.to).block_size,
                         " (llama.cpp would pick a fallback type; not implemented)"));
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
                           const QuantizeOptions& options,
                           const std::function<void(int64_t, int64_t)>& progress) {
  TC_ASSIGN_OR_RETURN(std::vector<QuantizedTensor> plan, PlanQuantization(in, options));
  GgufWriter w;
  w.set_powerinfer_magic(in.is_powerinfer());
  w.set_alignment(static_cast<uint32_t>(in.alignment()));
  for (const auto& [key, value] : in.metadata()) w.SetValue(key, value);
  w.SetValue("general.quantization_version", GgufU32(2));
  w.SetValue("general.file_type", GgufU32(options.target.file_type));
  const int64_t total = static_cast<int64_t>(plan.size());
  auto done = std::make_shared<int64_t>(0);
  for (size_t i = 0; i < plan.size(); ++i) {
    const GgufTensorInfo& t = in.tensors()[i];
    const QuantizedTensor q = plan[i];
    GgufWriter::TensorFiller fill;
    if (q.to == q.from) {
      fill = [&t, done, total, &progress](uint8_t* dst, int64_t n) -> absl::Status {
        if (n > 0) std::memcpy(dst, t.data, static_cast<size_t>(n));
        if (progress) progress(++*done, total);
        return absl::OkStatus();
      };
    } else {
      fill = [&t, q, done, total, &progress](uint8_t* dst, int64_t) -> absl::Status {
        const int64_t cols = t.ne[0], rows = t.n_elements / std::max<int64_t>(1, cols);
        const int64_t src_bytes = RowBytes(q.from, cols), dst_bytes = RowBytes(q.to, cols);
        std::vector<float> row(static_cast<size_t>(cols));
        for (int64_t r = 0; r < rows; ++r) {
          DequantizeRow(q.from, t.data + r * src_bytes, row.data(), cols);
          QuantizeRow(q.to, row.data(), dst + r * dst_bytes, cols);
        }
        if (progress) progress(++*done, total);
        return absl::OkStatus();
      };
    }
    TC_RETURN_IF_ERROR(w.AddTensor(t.name, q.to, t.ne, std::move(fill)));
  }
  return w.WriteFile(out_path);
}

}  // namespace thermocline
