// `thermocline synth`: writes a llama-architecture GGUF with random weights (see model/synth.h),
// and with --powerinfer the same weights in PowerInfer's layout beside it.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "shared/model/ggml_type.h"
#include "shared/model/quant.h"
#include "shared/model/synth.h"
#include "tools/command.h"

namespace thermocline::tools {
namespace {

constexpr int64_t kProgressMinBytes = 64ll << 20;  // smaller models finish before it matters

int RunSynth(const std::vector<std::string>& args) {
  SynthOptions o;
  std::string output, type_name, ffn_kind, powerinfer_output;
  bool powerinfer = false;
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
      ("active-fraction", po::value(&o.active_fraction)->default_value(o.active_fraction),
       "relu-gated: share of a layer's neurons that fire per token (0: unshaped i.i.d. weights)")
      ("skew", po::value(&o.skew)->default_value(o.skew),
       "relu-gated: spread of the neurons' firing thresholds (0: equal frequencies)")
      ("powerinfer", po::bool_switch(&powerinfer),
       "also write the same weights in PowerInfer's layout (PWRI, ffn_down_t, fc1/fc2 "
       "predictors) to M.powerinfer.gguf")
      ("powerinfer-output", po::value(&powerinfer_output),
       "path of the PowerInfer file (implies --powerinfer)")
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
  if (!type || !IsWeightType(*type) || !HasQuantizer(*type)) {
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
  const bool relu = o.ffn_kind == SynthFfnKind::kReluGated;
  for (const char* flag : {"active-fraction", "skew"}) {
    if (!relu && !vm[flag].defaulted()) {
      return fail(std::string("--") + flag +
                  " applies to --ffn-kind relu-gated only (SwiGLU neurons never output exactly 0)");
    }
  }
  if (!powerinfer_output.empty()) powerinfer = true;
  if (powerinfer && powerinfer_output.empty()) {
    const std::string ext = ".gguf";
    const bool has_ext = output.size() > ext.size() &&
                         output.compare(output.size() - ext.size(), ext.size(), ext) == 0;
    powerinfer_output =
        (has_ext ? output.substr(0, output.size() - ext.size()) : output) + ".powerinfer.gguf";
  }
  if (powerinfer && powerinfer_output == output) {
    return fail("--powerinfer-output must differ from -o");
  }
  if (absl::Status s = ValidateSynthOptions(o); !s.ok()) return fail(std::string(s.message()));
  if (powerinfer) {
    // Checked before anything is written (BuildSynthModel gives the reason).
    if (absl::StatusOr<GgufWriter> w = BuildSynthModel(o, SynthLayout::kPowerInfer); !w.ok()) {
      return fail(std::string(w.status().message()));
    }
  }

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
  auto seconds_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  auto start = std::chrono::steady_clock::now();
  if (absl::Status s = WriteSynthModel(o, output); !s.ok()) return fail(std::string(s.message()));
  const int64_t head_dim = o.dim / o.heads;
  const int64_t per_layer =
      2 * o.dim + 2 * o.dim * o.dim + 2 * o.dim * head_dim * o.kv_heads + 3 * o.dim * o.ffn;
  const int64_t params = 2 * o.vocab * o.dim + o.dim + o.layers * per_layer;
  std::cerr << absl::StrFormat("synth: wrote %s: %d parameters, type %s, %.1f s\n", output, params,
                               type_name, seconds_since(start));
  const SynthSparsityDesign d = DesignSynthSparsity(o);
  if (d.enabled) {
    std::cerr << absl::StrFormat(
        "synth: relu-gated, about %.0f%% of neurons fire per token (skew %.2f, persistent "
        "coordinate %d)\n",
        100 * o.active_fraction, o.skew, d.persistent_dim);
  }
  if (powerinfer) {
    last_decile = -1;
    start = std::chrono::steady_clock::now();
    if (absl::Status s = WriteSynthModel(o, powerinfer_output, SynthLayout::kPowerInfer); !s.ok()) {
      return fail(std::string(s.message()));
    }
    std::cerr << absl::StrFormat(
        "synth: wrote %s: the same weights in PowerInfer's layout, predictors of rank %d "
        "(expected recall %.3f), %.1f s\n",
        powerinfer_output, d.predictor_rank(), d.predictor_recall, seconds_since(start));
  }
  return 0;
}

static CommandRegistrar registrar({"synth", "write a llama-architecture GGUF with random weights",
                                   &RunSynth});

}  // namespace
}  // namespace thermocline::tools
