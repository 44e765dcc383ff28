#include "shared/sparsity/teal_calibration.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "shared/kernels/matmul.h"
#include "shared/runtime/corpus.h"
#include "shared/runtime/forward.h"
#include "shared/runtime/kv_cache.h"
#include "shared/sparsity/profiler.h"
#include "shared/sparsity/teal.h"
#include "shared/util/progress.h"
#include "shared/util/status_macros.h"

namespace thermocline {
namespace {

// Dense products that histogram each layer's four inputs on the way (q for the attention input,
// up for the FFN input: present in every FFN form).
class InputRecorder final : public LinearExecutor {
 public:
  InputRecorder(int64_t n_layers, ThreadPool& pool) : hist_(n_layers), pool_(pool) {
    for (auto& layer : hist_) {
      for (auto& h : layer) h = std::make_unique<MagnitudeHistogram>();
    }
  }
  void BeginBatch(std::span<const uint8_t>) override {}
  void Apply(int64_t layer, Projection p, const MatrixView& w, bool transposed, const float* x,
             int64_t n, int64_t x_stride, float* y, int64_t y_stride) override {
    const int64_t n_in = transposed ? w.rows : w.cols;
    if (p == Projection::kQ || p == Projection::kO || p == Projection::kUp ||
        p == Projection::kDown) {
      MagnitudeHistogram& h = *hist_[layer][static_cast<int>(InputOf(p))];
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t c = 0; c < n_in; ++c) h.Add(std::fabs(x[t * x_stride + c]));
      }
    }
    if (!transposed) {
      MatMul(w, x, n, x_stride, y, y_stride, pool_);
      return;
    }
    if (static_cast<int64_t>(ids_.size()) < w.rows) {
      ids_.resize(w.rows);
      for (int64_t i = 0; i < w.rows; ++i) ids_[i] = static_cast<int32_t>(i);
    }
    for (int64_t t = 0; t < n; ++t) {
      std::fill(y + t * y_stride, y + t * y_stride + w.cols, 0.0f);
      AxpyRows(w, ids_.data(), x + t * x_stride, w.rows, y + t * y_stride, pool_);
    }
  }
  const MagnitudeHistogram& hist(int64_t layer, int input) const { return *hist_[layer][input]; }

 private:
  std::vector<std::array<std::unique_ptr<MagnitudeHistogram>, kNumTealInputs>> hist_;
  ThreadPool& pool_;
  std::vector<int32_t> ids_;
};

ProjectionValues CutsFor(const TealProfile& profile, int64_t layer, const ProjectionValues& s) {
  ProjectionValues cuts{};
  for (int p = 0; p < kNumProjections; ++p) {
    // A share inside the input's zeros (ReLU) has cut 0, which would mean dense: the smallest
    // positive cut drops the zeros instead.
    const float cut = profile.CutFor(layer, InputOf(static_cast<Projection>(p)), s[p]);
    cuts[p] = s[p] > 0 ? std::max(cut, std::numeric_limits<float>::denorm_min()) : 0.0f;
  }
  return cuts;
}

}  // namespace

absl::Status ValidateTealCalibrationOptions(const TealCalibrationOptions& o,
                                            const ModelConfig& config) {
  if (o.window < 2 || o.window > config.context_length) {
    return absl::InvalidArgumentError(
        absl::StrCat("--window ", o.window, " must be in [2, ", config.context_length, "]"));
  }
  if (o.batch <= 0) return absl::InvalidArgumentError("--batch must be > 0");
  if (o.targets.empty()) return absl::InvalidArgumentError("--targets: at least one target");
  for (size_t i = 0; i < o.targets.size(); ++i) {
    if (!(o.targets[i] > 0 && o.targets[i] < o.max_sparsity) ||
        (i > 0 && o.targets[i] <= o.targets[i - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("--targets must be ascending values in (0, ", o.max_sparsity, ")"));
    }
  }
  if (!(o.step > 0 && o.step <= 0.5f)) {
    return absl::InvalidArgumentError(absl::StrCat("--step ", o.step, " must be in (0, 0.5]"));
  }
  if (!(o.max_sparsity > 0 && o.max_sparsity < 1)) {
    return absl::InvalidArgumentError("max sparsity must be in (0, 1)");
  }
  if (o.greedy_tokens < o.window - 1) {
    return absl::InvalidArgumentError(absl::StrCat("--greedy-tokens ", o.greedy_tokens,
                                                   " must be at least one window (", o.window - 1,
                                                   " tokens)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<TealProfile> CalibrateTeal(const Model& model, std::span<const int32_t> tokens,
                                          const TealCalibrationOptions& o, ThreadPool& pool) {
  const ModelConfig& c = model.config();
  TC_RETURN_IF_ERROR(ValidateTealCalibrationOptions(o, c));
  TC_ASSIGN_OR_RETURN(KvCache kv, KvCache::Create(c, 1, o.window, GgmlType::kF32));
  CorpusWindowOptions wo;
  wo.window = o.window;
  wo.batch = o.batch;
  wo.want_logits = false;

  TealProfile profile;
  profile.dim = c.dim;
  profile.step = o.step;
  profile.targets = o.targets;
  profile.layers.resize(c.n_layers);
  {
    InputRecorder recorder(c.n_layers, pool);
    ForwardPass pass(model, kv, pool, nullptr, &recorder);
    if (o.progress) wo.progress_label = "teal: input magnitudes";
    TC_ASSIGN_OR_RETURN(int64_t windows, RunCorpusWindows(pass, tokens, wo, [](auto, auto) {}));
    profile.tokens = windows * (o.window - 1);
    for (int64_t l = 0; l < c.n_layers; ++l) {
      for (int i = 0; i < kNumTealInputs; ++i) {
        const MagnitudeHistogram& h = recorder.hist(l, i);
        auto& q = profile.layers[l].quantiles[i];
        q[0] = 0.0f;
        for (int k = 1; k < kTealQuantiles - 1; ++k) q[k] = h.Quantile(k / 100.0);
        q[kTealQuantiles - 1] = h.Quantile(1.0 - 1e-9);
        for (int k = 1; k < kTealQuantiles; ++k) q[k] = std::max(q[k], q[k - 1]);
      }
    }
  }

  // The greedy's corpus: whole windows of the first greedy_tokens tokens.
  const int64_t per_window = o.window - 1;
  const int64_t n_greedy = std::min<int64_t>(static_cast<int64_t>(tokens.size()), o.greedy_tokens) /
                           per_window * per_window;
  std::span<const int32_t> greedy = tokens.first(n_greedy);
  profile.greedy_tokens = n_greedy;
  TealPlan zero = TealPlan::TopShare(c.n_layers, 0.0f);
  zero.kind = TealPlan::Kind::kCuts;
  zero.sparse_prompt = true;
  zero.masked = true;
  TealOptions to;
  to.all_projections = true;
  TC_ASSIGN_OR_RETURN(std::unique_ptr<TealLinear> teal, TealLinear::Create(model, zero, pool, to));
  ForwardPass pass(model, kv, pool, nullptr, teal.get());
  wo.progress_label.clear();
  // One call per window: a stopped batch leaves the slot's length behind, so a window must not
  // continue in a second call.
  wo.batch = o.window;

  // The dense residual stream after each block, in the order the forward calls see it.
  std::vector<std::vector<float>> reference(c.n_layers);
  pass.set_layer_observer([&](int64_t l, const float* x, int64_t n) {
    reference[l].insert(reference[l].end(), x, x + n * c.dim);
    return true;
  });
  TC_RETURN_IF_ERROR(RunCorpusWindows(pass, greedy, wo, [](auto, auto) {}).status());

  // Relative error of block `layer`'s output with its current cuts. The block starts from the
  // dense stream recorded after the block before it (the blocks before are dense, so that is
  // their output bit for bit) instead of recomputing them: one block per trial, not layer + 1.
  auto block_error = [&](int64_t layer) -> absl::StatusOr<double> {
    double err = 0, norm = 0;
    size_t offset = 0, in_offset = 0;
    const std::vector<float>& ref = reference[layer];
    if (layer > 0) {
      const std::vector<float>& in = reference[layer - 1];
      pass.set_start(layer, [&](int64_t n) -> const float* {
        if (in_offset + n * c.dim > in.size()) return nullptr;
        const float* p = in.data() + in_offset;
        in_offset += n * c.dim;
        return p;
      });
    }
    // The later blocks cannot change this one's output: the batch stops after it.
    pass.set_layer_observer([&](int64_t l, const float* x, int64_t n) {
      if (l != layer) return true;
      for (int64_t i = 0; i < n * c.dim; ++i) {
        const double d = static_cast<double>(x[i]) - ref[offset + i];
        err += d * d;
        norm += static_cast<double>(ref[offset + i]) * ref[offset + i];
      }
      offset += n * c.dim;
      return false;
    });
    const absl::Status run = RunCorpusWindows(pass, greedy, wo, [](auto, auto) {}).status();
    pass.set_start(0, nullptr);
    TC_RETURN_IF_ERROR(run);
    return norm > 0 ? err / norm : 0.0;
  };

  std::unique_ptr<ProgressBar> bar;
  if (o.progress) {
    bar = std::make_unique<ProgressBar>("teal: greedy allocation", c.n_layers, "blocks");
  }
  for (int64_t l = 0; l < c.n_layers; ++l) {
    TealLayerProfile& lp = profile.layers[l];
    const ProjectionValues params = ProjectionParams(model, l);
    ProjectionValues s{};
    size_t next = 0;
    auto record = [&] {
      while (next < o.targets.size() && BlockSparsity(model, l, s) >= o.targets[next] - 1e-6) {
        lp.sparsity.push_back(s);
        lp.cuts.push_back(CutsFor(profile, l, s));
        ++next;
      }
    };
    while (next < o.targets.size()) {
      int best = -1;
      double best_err = std::numeric_limits<double>::infinity();
      for (int p = 0; p < kNumProjections; ++p) {
        if (params[p] == 0 || s[p] + o.step > o.max_sparsity + 1e-6f) continue;
        ProjectionValues trial = s;
        trial[p] = std::min(1.0f, s[p] + o.step);
        TC_RETURN_IF_ERROR(teal->SetLayer(l, CutsFor(profile, l, trial)));
        TC_ASSIGN_OR_RETURN(double err, block_error(l));
        if (err < best_err) {
          best_err = err;
          best = p;
        }
      }
      if (best < 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("teal calibration: layer ", l, " cannot reach target ", o.targets[next],
                         " with every projection at most ", o.max_sparsity, " sparse"));
      }
      s[best] = std::min(1.0f, s[best] + o.step);
      record();
    }
    TC_RETURN_IF_ERROR(teal->SetLayer(l, ProjectionValues{}));
    if (bar) bar->Update(l + 1);
  }
  return profile;
}

std::string FormatTealProfile(const Model& model, const TealProfile& profile) {
  std::string out = "target  layer      q      k      v      o   gate     up   down  block\n";
  for (size_t t = 0; t < profile.targets.size(); ++t) {
    for (size_t l = 0; l < profile.layers.size(); ++l) {
      const ProjectionValues& s = profile.layers[l].sparsity[t];
      absl::StrAppendFormat(&out, "%6.2f  %5d", profile.targets[t], l);
      for (float v : s) absl::StrAppendFormat(&out, "  %5.2f", v);
      absl::StrAppendFormat(&out, "  %5.3f\n", BlockSparsity(model, static_cast<int64_t>(l), s));
    }
  }
  return out;
}

}  // namespace thermocline
