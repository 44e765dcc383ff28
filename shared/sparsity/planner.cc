#include "shared/sparsity/planner.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <numeric>
#include <queue>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "shared/util/status_macros.h"

namespace thermocline {
namespace {

int64_t MatrixBytes(const MatrixView& m) { return m.rows * m.row_bytes; }

// Bytes of `n` elements of `type`, whole blocks (a column of a quantized matrix, stored as a row
// of its own on the GPU, needs whole blocks).
int64_t ElementBytes(GgmlType type, int64_t n) {
  const GgmlTypeTraits& t = TypeTraits(type);
  return (n + t.block_size - 1) / t.block_size * t.block_bytes;
}

int64_t NeuronBytes(const LayerWeights& w, int64_t dim) {
  if (!w.experts.empty()) {
    // Every expert has the same shapes and types (the file stores them as one tensor each).
    const FfnWeights& e = w.experts[0];
    return e.gate.row_bytes + e.up.row_bytes + ElementBytes(e.down.type, dim);
  }
  const int64_t down = w.has_down_t ? w.down_t.row_bytes : ElementBytes(w.down.type, dim);
  return w.gate.row_bytes + w.up.row_bytes + down;
}

}  // namespace

absl::StatusOr<int64_t> ParseByteSize(const std::string& text) {
  auto fail = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("size '", text, "': ", why));
  };
  const std::string s(absl::StripAsciiWhitespace(text));
  size_t i = 0;
  double value = 0;
  int digits = 0;
  while (i < s.size() && absl::ascii_isdigit(static_cast<unsigned char>(s[i]))) {
    value = value * 10 + (s[i] - '0');
    ++i;
    ++digits;
  }
  if (i < s.size() && s[i] == '.') {
    ++i;
    double scale = 0.1;
    while (i < s.size() && absl::ascii_isdigit(static_cast<unsigned char>(s[i]))) {
      value += (s[i] - '0') * scale;
      scale /= 10;
      ++i;
      ++digits;
    }
  }
  if (digits == 0) {
    return fail(
        "expected a non-negative number with an optional unit (B, KiB, MiB, GiB, TiB, "
        "K, M, G, T, KB, MB, GB, TB), e.g. 6GiB");
  }
  while (i < s.size() && s[i] == ' ') ++i;
  const std::string unit = absl::AsciiStrToLower(s.substr(i));
  double mult = 0;
  if (unit.empty() || unit == "b") {
    mult = 1;
  } else {
    static const struct {
      const char* name;
      double mult;
    } kUnits[] = {
        {"k", 0x1p10}, {"kib", 0x1p10}, {"kb", 1e3}, {"m", 0x1p20}, {"mib", 0x1p20}, {"mb", 1e6},
        {"g", 0x1p30}, {"gib", 0x1p30}, {"gb", 1e9}, {"t", 0x1p40}, {"tib", 0x1p40}, {"tb", 1e12},
    };
    for (const auto& u : kUnits) {
      if (unit == u.name) mult = u.mult;
    }
    if (mult == 0) {
      return fail(absl::StrCat("unknown unit '", s.substr(i),
                               "' (use B, KiB, MiB, GiB, TiB, K, M, G, T, KB, MB, GB or TB)"));
    }
  }
  const double bytes = value * mult;
  if (!(bytes < 0x1p62)) return fail("too large");
  return static_cast<int64_t>(std::llround(bytes));
}

std::string FormatBytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (int64_t{1} << 30)) return absl::StrFormat("%.2f GiB", b / 0x1p30);
  if (bytes >= (int64_t{1} << 20)) return absl::StrFormat("%.2f MiB", b / 0x1p20);
  if (bytes >= (int64_t{1} << 10)) return absl::StrFormat("%.1f KiB", b / 0x1p10);
  return absl::StrFormat("%d B", bytes);
}

absl::StatusOr<int64_t> PredictorBytes(const GgufFile& file, const ModelConfig& config) {
  int64_t total = 0;
  int64_t found = 0;
  std::string missing;
  for (int64_t l = 0; l < config.n_layers; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    const GgufTensorInfo* fc1 = file.FindTensor(p + "fc1.weight");
    const GgufTensorInfo* fc2 = file.FindTensor(p + "fc2.weight");
    if (fc1 == nullptr || fc2 == nullptr) {
      if (missing.empty()) missing = absl::StrCat(p, fc1 == nullptr ? "fc1" : "fc2", ".weight");
      continue;
    }
    ++found;
    if (fc1->ne.size() != 2 || fc1->ne[0] != config.dim || fc2->ne.size() != 2 ||
        fc2->ne[1] != config.ffn_dim || fc2->ne[0] != fc1->ne[1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("predictors in ", file.path(), ": layer ", l, " has fc1 (",
                       absl::StrJoin(fc1->ne, ", "), ") and fc2 (", absl::StrJoin(fc2->ne, ", "),
                       "); expected (", config.dim, ", rank) and (rank, ", config.ffn_dim, ")"));
    }
    total += fc1->n_bytes + fc2->n_bytes;
  }
  if (found > 0 && found < config.n_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("predictors in ", file.path(), ": tensor '", missing, "' is missing"));
  }
  return total;
}

DenseCharges ChargeDense(const Model& model, const PlannerOptions& options) {
  const ModelConfig& c = model.config();
  DenseCharges d;
  d.token_embd = MatrixBytes(model.token_embd());
  d.output = model.output_tied() ? 0 : MatrixBytes(model.output());
  d.norms = (2 * c.n_layers + 1) * c.dim * static_cast<int64_t>(sizeof(float));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = model.layer(l);
    d.attention += MatrixBytes(w.wq) + MatrixBytes(w.wk) + MatrixBytes(w.wv) + MatrixBytes(w.wo);
    if (!w.experts.empty()) {
      d.moe_dense += MatrixBytes(w.router) + MatrixBytes(w.shared.gate) + MatrixBytes(w.shared.up) +
                     MatrixBytes(w.shared.down) +
                     static_cast<int64_t>(w.shared_gate.size() * sizeof(float));
    }
  }
  d.predictors = options.predictor_bytes;
  const int64_t context = options.context > 0 ? options.context : c.context_length;
  // K and V, per layer, per position, per slot (the gateway's slots plus its probe slot).
  const int64_t element = options.kv_type == "f16" ? 2 : 4;
  d.kv_cache = 2 * c.n_layers * context * c.kv_dim * element * (options.kv_slots + 1);
  d.scratch = options.scratch_bytes;
  return d;
}

absl::StatusOr<Plan> PlanPlacement(const Model& model, const ActivationStats& stats,
                                   const PlannerOptions& options) {
  const ModelConfig& c = model.config();
  if (stats.dim != c.dim || stats.ffn_dim != c.ffn_dim || stats.n_experts != c.n_experts ||
      static_cast<int64_t>(stats.layers.size()) != c.n_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("the activation stats are of a model with dim ", stats.dim, ", ffn ",
                     stats.ffn_dim, ", ", stats.layers.size(), " layers, ", stats.n_experts,
                     " experts; this model has dim ", c.dim, ", ffn ", c.ffn_dim, ", ",
                     c.n_layers, " layers, ", c.n_experts, " experts"));
  }
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerActivationStats& s = stats.layers[l];
    if (static_cast<int64_t>(s.frequency.size()) != LayerNeurons(c, l) ||
        static_cast<int64_t>(s.expert_share.size()) != (c.layers[l].moe ? c.n_experts : 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("the activation stats' layer ", l, " has ", s.frequency.size(),
                       " neurons and ", s.expert_share.size(), " expert shares; the model's has ",
                       LayerNeurons(c, l), " and ", c.layers[l].moe ? c.n_experts : 0));
    }
  }
  if (options.vram_budget <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--vram-budget ", options.vram_budget, " must be > 0"));
  }
  if (options.context < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--context ", options.context, " must be >= 0"));
  }
  if (options.kv_slots < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--kv-slots ", options.kv_slots, " must be >= 1"));
  }
  if (options.kv_type != "f32" && options.kv_type != "f16") {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-type '", options.kv_type, "' must be f32 or f16"));
  }
  if (options.context > c.context_length) {
    return absl::InvalidArgumentError(absl::StrCat("--context ", options.context,
                                                   " exceeds the model's context of ",
                                                   c.context_length));
  }
  if (options.min_slice < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--min-slice ", options.min_slice, " must be >= 1"));
  }
  if (options.scratch_bytes < 0 || options.predictor_bytes < 0) {
    return absl::InvalidArgumentError("scratch and predictor bytes must be >= 0");
  }

  Plan plan;
  plan.budget = options.vram_budget;
  plan.context = options.context > 0 ? options.context : c.context_length;
  plan.dense = ChargeDense(model, options);
  const int64_t dense = plan.dense.total();
  if (dense > options.vram_budget) {
    const int64_t missing = dense - options.vram_budget;
    const DenseCharges& d = plan.dense;
    return absl::ResourceExhaustedError(absl::StrFormat(
        "VRAM budget %d bytes (%s) cannot hold the dense part, %d bytes (%s): token embeddings "
        "%s, output head %s, norms %s, attention %s, predictors %s, KV cache %s (%d slots + 1 "
        "x %d positions, %s), scratch %s%s; %d bytes (%s) are missing",
        options.vram_budget, FormatBytes(options.vram_budget), dense, FormatBytes(dense),
        FormatBytes(d.token_embd), FormatBytes(d.output), FormatBytes(d.norms),
        FormatBytes(d.attention), FormatBytes(d.predictors), FormatBytes(d.kv_cache),
        options.kv_slots, plan.context, options.kv_type, FormatBytes(d.scratch),
        d.moe_dense > 0 ? absl::StrCat(", routers and shared experts ", FormatBytes(d.moe_dense))
                        : "",
        missing, FormatBytes(missing)));
  }
  int64_t remaining = options.vram_budget - dense;

  // A neuron's worth: its expected activations per token (frequency, times the expert's share of
  // the tokens in MoE layers).
  std::vector<std::vector<double>> value(c.n_layers);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerActivationStats& s = stats.layers[l];
    value[l].resize(s.frequency.size());
    for (size_t i = 0; i < s.frequency.size(); ++i) {
      const double share = s.expert_share.empty() ? 1.0 : s.expert_share[i / c.ffn_dim];
      value[l][i] = static_cast<double>(s.frequency[i]) * share;
    }
  }
  struct LayerState {
    std::vector<int32_t> order;  // neuron ids, most valuable first
    int64_t taken = 0;
    int64_t n = 0;  // the layer's neurons
  };
  std::vector<LayerState> state(c.n_layers);
  plan.layers.resize(c.n_layers);
  // The next step of a layer: neurons [taken, end) of its order.
  auto step_end = [&](const LayerState& s) {
    const int64_t first = (options.min_slice + kSliceAlign - 1) / kSliceAlign * kSliceAlign;
    return std::min(s.n, s.taken == 0 ? first : s.taken + kSliceAlign);
  };
  struct Step {
    double density;
    int64_t layer;
    bool operator<(const Step& o) const {
      // Max-heap on density; among equals the lower layer first, for a deterministic plan.
      return density != o.density ? density < o.density : layer > o.layer;
    }
  };
  std::priority_queue<Step> heap;
  auto push_next = [&](int64_t l) {
    const LayerState& s = state[l];
    if (s.taken >= s.n) return;
    double v = 0;
    const int64_t end = step_end(s);
    for (int64_t i = s.taken; i < end; ++i) v += value[l][s.order[i]];
    const double bytes = static_cast<double>((end - s.taken) * plan.layers[l].neuron_bytes);
    heap.push({v / std::max(1.0, bytes), l});
  };
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerState& s = state[l];
    const std::vector<double>& v = value[l];
    s.n = static_cast<int64_t>(v.size());
    s.order.resize(s.n);
    std::iota(s.order.begin(), s.order.end(), 0);
    std::stable_sort(s.order.begin(), s.order.end(),
                     [&](int32_t a, int32_t b) { return v[a] > v[b]; });
    LayerPlan& lp = plan.layers[l];
    lp.neuron_bytes = NeuronBytes(model.layer(l), c.dim);
    lp.activations = std::accumulate(v.begin(), v.end(), 0.0);
    plan.ffn_bytes += lp.neuron_bytes * s.n;
    push_next(l);
  }
  while (!heap.empty()) {
    const Step step = heap.top();
    heap.pop();
    LayerState& s = state[step.layer];
    LayerPlan& lp = plan.layers[step.layer];
    const int64_t end = step_end(s);
    const int64_t bytes = (end - s.taken) * lp.neuron_bytes;
    if (bytes > remaining) continue;  // this layer can grow no further
    remaining -= bytes;
    s.taken = end;
    push_next(step.layer);
  }

  Placement& p = plan.placement;
  p.vram_capacity = options.vram_budget;
  p.kv_slots = options.kv_slots;
  p.kv_context = static_cast<int32_t>(plan.context);
  p.kv_type = options.kv_type;
  p.layers.resize(c.n_layers);
  double placed = 0, total = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerState& s = state[l];
    LayerPlan& lp = plan.layers[l];
    LayerPlacement& out = p.layers[l];
    out.on_gpu.assign(s.n, 0);
    out.gpu_bucket.assign(s.order.begin(), s.order.begin() + s.taken);
    std::sort(out.gpu_bucket.begin(), out.gpu_bucket.end());
    double layer_placed = 0;
    for (int32_t id : out.gpu_bucket) {
      out.on_gpu[id] = 1;
      layer_placed += value[l][id];
    }
    lp.n_gpu = s.taken;
    lp.bytes = s.taken * lp.neuron_bytes;
    lp.gpu_share = lp.activations > 0 ? layer_placed / lp.activations : (s.taken == s.n ? 1 : 0);
    plan.gpu_ffn_bytes += lp.bytes;
    placed += layer_placed;
    total += lp.activations;
  }
  const bool all = plan.gpu_ffn_bytes == plan.ffn_bytes;
  p.expected_gpu_share = total > 0 ? std::min(1.0, placed / total) : (all ? 1.0 : 0.0);
  p.gpu_ffn_bytes = plan.gpu_ffn_bytes;
  return plan;
}

std::string FormatPlan(const Plan& plan, const ModelConfig& c) {
  const DenseCharges& d = plan.dense;
  std::string out = absl::StrFormat("VRAM budget %s; dense part %s:\n", FormatBytes(plan.budget),
                                    FormatBytes(d.total()));
  auto row = [&](const std::string& name, int64_t bytes) {
    out += absl::StrFormat("  %-34s %12s\n", name, FormatBytes(bytes));
  };
  row("token embeddings", d.token_embd);
  row(d.output > 0 ? "output head" : "output head (tied to embeddings)", d.output);
  row("norms (f32)", d.norms);
  row("attention", d.attention);
  row(d.predictors > 0 ? "predictors" : "predictors (none given)", d.predictors);
  // Slots as allocated: the gateway's --kv-slots plus its probe slot.
  row(absl::StrFormat("KV cache (%s, %d slots x %d)", plan.placement.kv_type,
                      plan.placement.kv_slots + 1, plan.context),
      d.kv_cache);
  row("scratch reserve", d.scratch);
  if (d.moe_dense > 0) row("routers and shared experts", d.moe_dense);
  const int64_t available = plan.budget - d.total();
  int64_t n_gpu = 0;
  for (const LayerPlan& l : plan.layers) n_gpu += l.n_gpu;
  int64_t n_all = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) n_all += LayerNeurons(c, l);
  out += absl::StrFormat(
      "FFN neurons: %s available, %s for all %d; placed %d (%.1f%%) in %s, %s unused\n",
      FormatBytes(available), FormatBytes(plan.ffn_bytes), n_all, n_gpu,
      100.0 * static_cast<double>(n_gpu) / static_cast<double>(n_all),
      FormatBytes(plan.gpu_ffn_bytes), FormatBytes(available - plan.gpu_ffn_bytes));
  out += absl::StrFormat("%-5s %13s %10s %12s %9s\n", "layer", "gpu neurons", "bytes", "act/token",
                         "gpu share");
  for (size_t l = 0; l < plan.layers.size(); ++l) {
    const LayerPlan& lp = plan.layers[l];
    out += absl::StrFormat("%-5d %13s %10s %12.2f %9.4f\n", l,
                           absl::StrFormat("%d/%d", lp.n_gpu, LayerNeurons(c, static_cast<int64_t>(l))),
                           FormatBytes(lp.bytes),
                           lp.activations, lp.gpu_share);
  }
  out += absl::StrFormat("expected share of activations served by the GPU: %.4f\n",
                         plan.placement.expected_gpu_share);
  return out;
}

std::string FormatPlacement(const Placement& p) {
  int64_t n_all = 0;
  for (const LayerPlacement& l : p.layers) n_all += static_cast<int64_t>(l.on_gpu.size());
  const int64_t n_gpu = p.n_gpu_neurons();
  std::string out = absl::StrFormat(
      "placement: %d layers, %d of %d neurons on the GPU (%.1f%%); made for %s of VRAM",
      p.layers.size(), n_gpu, n_all,
      n_all > 0 ? 100.0 * static_cast<double>(n_gpu) / static_cast<double>(n_all) : 0.0,
      FormatBytes(p.vram_capacity));
  if (p.gpu_ffn_bytes > 0)
    out += absl::StrFormat(", GPU neurons take %s", FormatBytes(p.gpu_ffn_bytes));
  out += absl::StrFormat("; expected GPU share of activations %.4f%s\n", p.expected_gpu_share,
                         p.expected_gpu_share == 0 ? " (0 = unknown)" : "");
  out += absl::StrFormat("%-5s %13s %s\n", "layer", "gpu neurons", "first ids");
  for (size_t l = 0; l < p.layers.size(); ++l) {
    const LayerPlacement& lp = p.layers[l];
    std::vector<int32_t> head(lp.gpu_bucket.begin(),
                              lp.gpu_bucket.begin() + std::min<size_t>(8, lp.gpu_bucket.size()));
    out += absl::StrFormat("%-5d %13s %s%s\n", l,
                           absl::StrFormat("%d/%d", lp.gpu_bucket.size(), lp.on_gpu.size()),
                           absl::StrJoin(head, " "), lp.gpu_bucket.size() > 8 ? " ..." : "");
  }
  return out;
}

}  // namespace thermocline
