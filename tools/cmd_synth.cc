// `thermocline synth`: writes a llama-architecture GGUF with random weights (see model/synth.h).
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "shared/model/ggml_type.h"
#include "shared/model/synth.h"
#include "tools/command.h"

namespace thermocline::tools {
namespace {

constexpr int64_t kProgressMinBytes = 64ll << 20;  // smaller models finish before it matters

int RunSynth(const std::vector<std::string>& args) {
  SynthOptions o;
  std::string output, type_name, ffn_kind;
  po::options_description opts("options");
  // One option per line reads as a table.
  // clang-format off
  opts.add_options()
      ("output,o", po::value(&output)->required(), "output GGUF path")
      ("dim", po::value(&o.dim)->default_value(o.dim), "embedding width")
      ("ffn", po::value(&o.ffn)->default_value(o.ffn), "FFN hidden width (neurons per layer)")
      ("layers", po::value(&o.layers)->default_value(o.layers), "transformer blocks")
      ("heads", po::value(&o.heads)->default_value(o.heads), "attention (query) heads")
      ("kv-heads", po::value(&o.kv_heads)->default_value(o.kv_heads), "key/value heads (GQA)")
      ("vocab", po::value(&o.vocab)->default_value(o.vocab), "vocabulary size (>= 259)")
      ("context", po::value(&o.context)->default_value(o.context), "context length")
      ("type", po::value(&type_name)->default_value("f32"),
       "matrix type: f32, f16, bf16, q8_0, q4_0 (norms are always f32)")
      ("ffn-kind", po::value(&ffn_kind)->default_value("swiglu"),
       "swiglu (silu(gate)*up) or relu-gated (relu(gate)*up)")
      ("seed", po::value(&o.seed)->default_value(o.seed), "weights seed (same seed, same bytes)")
      ("name", po::value(&o.name)->default_value(o.name), "general.name")
      ("threads", po::value(&o.threads)->default_value(0),
       "generator threads (0 = all cores; the output does not depend on it)");
  // clang-format on
  po::positional_options_description pos;
  po::variables_map vm;
  int exit_code = 0;
  if (!ParseOptions("synth", "-o M.gguf [options]", opts, pos, args, vm, exit_code)) {
    return exit_code;
  }
  auto fail = [](const std::string& msg) {
    std::cerr << "thermocline synth: " << msg << "\n";
    return 1;
  };
  std::optional<GgmlType> type = TypeFromName(type_name);
  if (!type || !IsWeightType(*type)) {
    return fail("--type '" + type_name + "' is not one of: f32, f16, bf16, q8_0, q4_0");
  }
  o.type = *type;
  if (ffn_kind == "swiglu") {
    o.ffn_kind = SynthFfnKind::kSwiGlu;
  } else if (ffn_kind == "relu-gated") {
    o.ffn_kind = SynthFfnKind::kReluGated;
  } else {
    return fail("--ffn-kind '" + ffn_kind + "' is not one of: swiglu, relu-gated");
  }
  if (absl::Status s = ValidateSynthOptions(o); !s.ok()) return fail(std::string(s.message()));

  const bool tty = isatty(STDERR_FILENO) == 1;
  int last_decile = -1;
  o.progress = [&](int64_t done, int64_t total) {
    if (total < kProgressMinBytes) return;
    const int percent = static_cast<int>(100 * done / total);
    if (tty) {
      std::cerr << absl::StrFormat("\rsynth: %3d%% (%.2f of %.2f GiB)", percent,
                                   done / double(1ll << 30), total / double(1ll << 30))
                << (done == total ? "\n" : "") << std::flush;
    } else if (percent / 10 != last_decile) {
      last_decile = percent / 10;
      std::cerr << "synth: " << percent << "%\n";
    }
  };
  const auto start = std::chrono::steady_clock::now();
  if (absl::Status s = WriteSynthModel(o, output); !s.ok()) return fail(std::string(s.message()));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t head_dim = o.dim / o.heads;
  const int64_t per_layer =
      2 * o.dim + 2 * o.dim * o.dim + 2 * o.dim * head_dim * o.kv_heads + 3 * o.dim * o.ffn;
  const int64_t params = 2 * o.vocab * o.dim + o.dim + o.layers * per_layer;
  std::cerr << absl::StrFormat("synth: wrote %s: %d parameters, type %s, %.1f s\n", output, params,
                               type_name, seconds);
  return 0;
}

static CommandRegistrar registrar({"synth", "write a llama-architecture GGUF with random weights",
                                   &RunSynth});

}  // namespace
}  // namespace thermocline::tools
