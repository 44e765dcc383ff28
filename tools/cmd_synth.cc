// `thermocline synth`: writes a GGUF of any architecture Thermocline runs (llama by default) with
// random weights (see model/synth.h), and with --powerinfer the same weights in PowerInfer's
// layout beside it.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "shared/model/arch.h"
#include "shared/gguf/ggml_type.h"
#include "shared/gguf/quant.h"
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
  const std::string arch_help = "architecture (general.architecture): " + KnownArchNames();
  // One option per line reads as a table.
  // clang-format off
  opts.add_options()
      ("output,o", po::value(&output)->required(), "output GGUF path")
      ("arch", po::value(&o.arch)->default_value(o.arch),
       arch_help.c_str())
      ("dim", po::value(&o.dim)->default_value(o.dim), "embedding width")
      ("ffn", po::value(&o.ffn)->default_value(o.ffn), "FFN hidden width (neurons per layer)")
      ("layers", po::value(&o.layers)->default_value(o.layers), "transformer blocks")
      ("heads", po::value(&o.heads)->default_value(o.heads), "attention (query) heads")
      ("kv-heads", po::value(&o.kv_heads)->default_value(o.kv_heads), "key/value heads (GQA)")
      ("vocab", po::value(&o.vocab)->default_value(o.vocab), "vocabulary size (>= 259)")
      ("tokenizer-from", po::value(&o.tokenizer_from),
       "take the tokenizer (and vocabulary size) of this GGUF, e.g. a vocabulary-only file")
      ("context", po::value(&o.context)->default_value(o.context), "context length")
      ("head-dim", po::value(&o.head_dim)->default_value(0),
       "attention head size (0: dim / heads; else written as attention.key_length)")
      ("experts", po::value(&o.experts)->default_value(0),
       "MoE experts per layer (llama, mistral, qwen2moe, qwen3moe; 0: none, or 4 for the "
       "MoE-only qwen2moe and qwen3moe)")
      ("experts-used", po::value(&o.experts_used)->default_value(0),
       "experts each token uses (0: min(2, experts))")
      ("expert-ffn", po::value(&o.expert_ffn)->default_value(0),
       "neurons per expert where the architecture has expert_feed_forward_length (qwen2moe, "
       "qwen3moe; 0: --ffn)")
      ("sliding-window", po::value(&o.sliding_window)->default_value(0),
       "window of the sliding-window layers (gemma2, gemma3, phi3; 0: min(4096, context / 2))")
      ("type", po::value(&type_name)->default_value("f32"),
       "matrix type: f32, f16, bf16, q8_0, q4_0 (norms are always f32)")
      ("ffn-kind", po::value(&ffn_kind),
       "the architecture's own activation (default; swiglu: silu(gate)*up, gelu, drelu) or ReLU "
       "(relu-gated or relu: relu(gate)*up; relu: relu(up) for the gateless falcon, starcoder2)")
      ("active-fraction", po::value(&o.active_fraction)->default_value(o.active_fraction),
       "ReLU: share of a layer's neurons that fire per token (0: unshaped i.i.d. weights)")
      ("skew", po::value(&o.skew)->default_value(o.skew),
       "ReLU: spread of the neurons' firing thresholds (0: equal frequencies)")
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
  if (FindArch(o.arch) == nullptr) {
    return fail("--arch '" + o.arch + "' is not one of: " + KnownArchNames());
  }
  if (!ffn_kind.empty()) {
    std::string names;
    for (SynthFfnKind k : SynthFfnKinds(o.arch)) {
      std::vector<std::string> spellings = {SynthFfnKindName(o.arch, k)};
      // Plain `relu` says ReLU in whatever form the architecture's FFN has.
      if (spellings[0] == "relu-gated") spellings.push_back("relu");
      for (const std::string& name : spellings) {
        if (name == ffn_kind) o.ffn_kind = k;
        names += (names.empty() ? "" : ", ") + name;
      }
    }
    if (o.ffn_kind == SynthFfnKind::kArchDefault) {
      return fail("--ffn-kind '" + ffn_kind + "' is not one of: " + names + " (--arch " + o.arch +
                  ": its own activation or ReLU)");
    }
  }
  const SynthFfnKind kind = ResolvedSynthFfnKind(o);
  if (kind != SynthFfnKind::kReluGated) {
    const std::string relu = SynthFfnKindName(o.arch, SynthFfnKind::kReluGated);
    const char* why = kind == SynthFfnKind::kSwiGlu ? "SwiGLU neurons never output exactly 0"
                      : kind == SynthFfnKind::kGelu ? "GELU neurons never output exactly 0"
                                                    : "the shaped design thresholds ReLU gates";
    for (const char* flag : {"active-fraction", "skew"}) {
      if (!vm[flag].defaulted()) {
        return fail(std::string("--") + flag + " applies to --ffn-kind " + relu + " only (" +
                    why + ")");
      }
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
  const int64_t params = SynthParameterCount(o);
  std::cerr << absl::StrFormat("synth: wrote %s: %d parameters, type %s, %.1f s\n", output, params,
                               type_name, seconds_since(start));
  const SynthSparsityDesign d = DesignSynthSparsity(o);
  if (d.enabled) {
    std::cerr << absl::StrFormat(
        "synth: %s, about %.0f%% of neurons fire per token (skew %.2f, persistent "
        "coordinate %d)\n",
        SynthFfnKindName(o.arch, kind), 100 * o.active_fraction, o.skew, d.persistent_dim);
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

static CommandRegistrar registrar({"synth",
                                   "write a GGUF of any supported architecture with random weights",
                                   &RunSynth});

}  // namespace
}  // namespace thermocline::tools
