#include "gpu_worker/host/split_ffn.h"

#include <algorithm>
#include <numeric>

#include "shared/ipc/futex.h"
#include "shared/kernels/matmul.h"
#include "shared/sparsity/profiler.h"

#include "shared/util/status_macros.h"

namespace thermocline::gpu_worker {

SplitFfn::SplitFfn(const Model& model, SparsityPlan plan, Partition partition,
                   ThreadPool& pool)
    : model_(model),
      plan_(std::move(plan)),
      partition_(std::move(partition)),
      pool_(pool),
      dense_(model, pool) {}

absl::StatusOr<std::unique_ptr<SplitFfn>> SplitFfn::Create(
    const Model& model, SparsityPlan plan, Partition partition, ThreadPool& pool,
    const std::optional<TealPlan>& teal_ffn) {
  const ModelConfig& c = model.config();
  TC_RETURN_IF_ERROR(plan.Validate(c));
  if (teal_ffn) {
    TC_RETURN_IF_ERROR(teal_ffn->Validate(c));
    if (!teal_ffn->ffn || teal_ffn->kind != TealPlan::Kind::kCuts || teal_ffn->masked) {
      return absl::InvalidArgumentError(
          "split FFN: TEAL over the FFN takes a plan of calibrated cuts (a --teal-profile)");
    }
    if (!plan.AllDense()) {
      return absl::InvalidArgumentError(
          "split FFN: TEAL over the FFN goes with the dense FFN mode (--sparsity teal)");
    }
  }
  if (static_cast<int64_t>(partition.layers.size()) != c.n_layers) {
    return absl::InvalidArgumentError("split FFN: partition and model disagree on layers");
  }
  std::unique_ptr<SplitFfn> ffn(new SplitFfn(model, std::move(plan), std::move(partition), pool));
  ffn->teal_ = teal_ffn;
  if (teal_ffn) ffn->teal_parts_.resize(c.n_layers);
  ffn->down_rows_.resize(c.n_layers);
  ffn->weights_.resize(c.n_layers);
  ffn->moe_.resize(c.n_layers);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerPartition& part = ffn->partition_.layers[l];
    if (c.layers[l].moe) {
      if (ffn->plan_.mode(l) == SparsityMode::kDense && part.cold.empty()) continue;  // DenseFfn
      const LayerWeights& w = model.layer(l);
      MoeLayer& m = ffn->moe_[l];
      m.experts.resize(w.experts.size());
      m.downs.resize(w.experts.size());
      m.hot.resize(w.experts.size());
      for (size_t e = 0; e < w.experts.size(); ++e) {
        for (int32_t id : ExpertSlice(part.hot, static_cast<int64_t>(e), c.ffn_dim)) {
          m.hot[e].push_back(static_cast<int32_t>(id - static_cast<int64_t>(e) * c.ffn_dim));
        }
        NeuronWeights& x = m.experts[e];
        x = NeuronWeights{w.experts[e].gate, w.experts[e].up, MatrixView{}, c.activation};
        if (m.hot[e].empty()) continue;
        TC_ASSIGN_OR_RETURN(m.downs[e], DownRows::ForMatrix(w.experts[e].down, std::nullopt, pool));
        x.down_t = m.downs[e].view();
        TC_RETURN_IF_ERROR(ValidateNeuronWeights(x));
      }
      if (!w.shared.up.empty()) {
        TC_ASSIGN_OR_RETURN(m.shared_down, DownRows::ForMatrix(w.shared.down, std::nullopt, pool));
        m.shared = NeuronWeights{w.shared.gate, w.shared.up, m.shared_down.view(), c.activation};
        TC_RETURN_IF_ERROR(ValidateNeuronWeights(m.shared));
      }
      continue;
    }
    NeuronWeights& nw = ffn->weights_[l];
    nw.gate = model.layer(l).gate;
    nw.up = model.layer(l).up;
    nw.up_b = model.layer(l).up_b;
    nw.activation = c.activation;
    // Dense, wholly hot layers run DenseFfn (TEAL's prompt rows too); layers without hot
    // neurons compute nothing here.
    const bool dense_all_hot = ffn->plan_.mode(l) == SparsityMode::kDense && part.cold.empty();
    if ((dense_all_hot && !teal_ffn) || part.hot.empty()) continue;
    TC_ASSIGN_OR_RETURN(ffn->down_rows_[l], DownRows::ForLayer(model, l, std::nullopt, pool));
    nw.down_t = ffn->down_rows_[l].view();
    TC_RETURN_IF_ERROR(ValidateNeuronWeights(nw));
    if (teal_ffn) {
      std::vector<float> up_b;
      if (!nw.up_b.empty()) {
        for (int32_t id : part.hot) up_b.push_back(nw.up_b[id]);
      }
      absl::StatusOr<TealFfnPart> made = TealFfnPart::Build(
          nw.gate, nw.up, part.hot, nw.down_t, part.hot, std::move(up_b), c.activation,
          TealFfnCuts::Of(teal_ffn->values[l]).shared_gate_up(), pool);
      if (!made.ok()) {
        return absl::Status(made.status().code(),
                            absl::StrCat("layer ", l, ": ", made.status().message()));
      }
      ffn->teal_parts_[l] = *std::move(made);
    }
  }
  ffn->neurons_ = NeuronFfn(std::max(c.ffn_dim, c.shared_expert_ffn_dim));
  ffn->shared_ids_.resize(c.shared_expert_ffn_dim);
  std::iota(ffn->shared_ids_.begin(), ffn->shared_ids_.end(), 0);
  return ffn;
}

void SplitFfn::BeginStep(ColdLink* link, std::span<const uint8_t> decode) {
  link_ = link;
  decode_ = decode;
  status_ = absl::OkStatus();
  ++steps_;
  mark_ns_ = ipc::MonotonicNs();
}

absl::Status SplitFfn::EndStep() {
  link_ = nullptr;
  return status_;
}

void SplitFfn::PredictRows(int64_t layer, const float* predictor_input, int64_t n_tokens) {
  const ModelConfig& c = model_.config();
  const LayerPartition& part = partition_.layers[layer];
  hot_ids_.clear();
  cold_ids_.clear();
  hot_end_.clear();
  cold_end_.clear();
  for (int64_t t = 0; t < n_tokens; ++t) {
    plan_.predictors->Predict(layer, predictor_input + t * c.dim, &predicted_, pool_);
    SplitIds(part, predicted_, &hot_tmp_, &cold_tmp_);
    hot_ids_.insert(hot_ids_.end(), hot_tmp_.begin(), hot_tmp_.end());
    cold_ids_.insert(cold_ids_.end(), cold_tmp_.begin(), cold_tmp_.end());
    hot_end_.push_back(static_cast<uint32_t>(hot_ids_.size()));
    cold_end_.push_back(static_cast<uint32_t>(cold_ids_.size()));
  }
}

void SplitFfn::SampleRecall(int64_t layer, const float* h, int64_t t, NeuronFilter filter) {
  const ModelConfig& c = model_.config();
  const LayerPartition& part = partition_.layers[layer];
  const bool relu = IsReluFamily(c.activation);
  if (part.hot.empty() || (!relu && filter.kind != NeuronFilter::Kind::kMagnitude)) return;
  const uint32_t begin = t == 0 ? 0 : hot_end_[t - 1];
  picked_.assign(c.ffn_dim, 0);
  for (uint32_t k = begin; k < hot_end_[t]; ++k) picked_[hot_ids_[k]] = 1;
  recall_gate_.resize(part.hot.size());
  const NeuronWeights& w = weights_[layer];
  GatherMatMul(w.selector(), part.hot.data(), static_cast<int64_t>(part.hot.size()),
               h + t * c.dim, recall_gate_.data(), pool_);
  if (!w.gated() && !w.up_b.empty()) {
    for (size_t k = 0; k < part.hot.size(); ++k) recall_gate_[k] += w.up_b[part.hot[k]];
  }
  uint64_t tp = 0, fn = 0;
  for (size_t k = 0; k < part.hot.size(); ++k) {
    const float a = ActivationMagnitude(c.activation, recall_gate_[k]);
    const bool active = relu && filter.kind != NeuronFilter::Kind::kMagnitude ? a > 0.0f
                                                                              : a >= filter.cut;
    if (!active) continue;
    if (picked_[part.hot[k]]) {
      ++tp;
    } else {
      ++fn;
    }
  }
  metrics_->AddRecall(1, tp, fn);
}

void SplitFfn::Compute(int64_t layer, const float* h, const float* predictor_input,
                       int64_t n_tokens, float* out) {
  ComputeLayer(layer, h, predictor_input, n_tokens, out);
  if (metrics_ == nullptr) return;
  // Each layer's time runs from the end of the previous layer's FFN, so it covers this layer's
  // attention as well, without ForwardPass knowing about metrics.
  const int64_t now = ipc::MonotonicNs();
  metrics_->AddLayerNs(layer, static_cast<uint64_t>(std::max<int64_t>(0, now - mark_ns_)));
  mark_ns_ = now;
}

void SplitFfn::ComputeLayer(int64_t layer, const float* h, const float* predictor_input,
                            int64_t n_tokens, float* out) {
  const ModelConfig& c = model_.config();
  const int64_t dim = c.dim;
  const LayerPartition& part = partition_.layers[layer];
  const SparsityMode mode = plan_.mode(layer);
  std::fill(out, out + n_tokens * dim, 0.0f);
  if (!status_.ok()) return;  // the step is already lost; spend nothing more on it
  if (teal_ && !c.layers[layer].moe && TealCuts(layer, n_tokens)) {
    ComputeTeal(layer, h, predictor_input, n_tokens, out);
    return;
  }
  if (mode == SparsityMode::kDense && part.cold.empty()) {
    dense_.Compute(layer, h, predictor_input, n_tokens, out);
    if (metrics_ != nullptr) {
      const uint64_t all = static_cast<uint64_t>(n_tokens) * part.hot.size();
      metrics_->AddNeurons(all, all, all);
    }
    return;
  }
  if (c.layers[layer].moe) {
    ComputeMoe(layer, h, n_tokens, out);
    return;
  }
  const bool predicted = mode == SparsityMode::kPredicted;
  if (predicted) PredictRows(layer, predictor_input, n_tokens);

  // Cold first, so the CPU worker runs while the hot neurons are computed here.
  bool sent = false;
  if (predicted ? !cold_ids_.empty() : !part.cold.empty()) {
    ColdRequest request = RequestFor(layer, h, n_tokens);
    request.all_cold = !predicted;
    if (predicted) {
      request.row_end = cold_end_;
      request.ids = cold_ids_;
    }
    if (!SendCold(request)) return;
    sent = true;
  }

  const NeuronWeights& w = weights_[layer];
  const NeuronFilter filter = plan_.FilterFor(layer, c.activation);
  uint64_t ran = 0, candidates = 0;
  for (int64_t t = 0; t < n_tokens; ++t) {
    std::span<const int32_t> hot = part.hot;
    if (predicted) {
      const uint32_t begin = t == 0 ? 0 : hot_end_[t - 1];
      hot = std::span<const int32_t>(hot_ids_).subspan(begin, hot_end_[t] - begin);
    }
    candidates += hot.size();
    if (!hot.empty()) ran += neurons_.Compute(w, h + t * dim, hot, filter, out + t * dim, pool_);
  }
  if (metrics_ != nullptr) {
    metrics_->AddNeurons(ran, candidates, static_cast<uint64_t>(n_tokens) * part.hot.size());
    // Sampled, not every step: the exact set costs a gate product over all hot neurons.
    if (predicted && steps_ % kRecallEvery == 0) {
      for (int64_t t = 0; t < n_tokens; ++t) SampleRecall(layer, h, t, filter);
    }
  }
  MergeCold(layer, n_tokens, sent, out);
}

bool SplitFfn::TealCuts(int64_t layer, int64_t n_tokens) {
  constexpr int kPer = ColdRequest::kTealCutsPerRow;
  const TealFfnCuts cuts = TealFfnCuts::Of(teal_->values[layer]);
  if (!cuts.any()) return false;
  row_cuts_.assign(n_tokens * kPer, 0.0f);
  bool any = false;
  for (int64_t t = 0; t < n_tokens; ++t) {
    if (t >= static_cast<int64_t>(decode_.size()) || decode_[t] == 0) continue;
    row_cuts_[t * kPer] = cuts.gate;
    row_cuts_[t * kPer + 1] = cuts.up;
    row_cuts_[t * kPer + 2] = cuts.down;
    any = true;
  }
  return any;
}

void SplitFfn::ComputeTeal(int64_t layer, const float* h, const float* predictor_input,
                           int64_t n_tokens, float* out) {
  const ModelConfig& c = model_.config();
  const int64_t dim = c.dim;
  const LayerPartition& part = partition_.layers[layer];
  constexpr int kPer = ColdRequest::kTealCutsPerRow;
  bool sent = false;
  if (!part.cold.empty()) {
    ColdRequest request = RequestFor(layer, h, n_tokens);
    request.cuts = row_cuts_;
    if (!SendCold(request)) return;
    sent = true;
  }
  const NeuronWeights& w = weights_[layer];
  const NeuronFilter filter = plan_.FilterFor(layer, c.activation);
  uint64_t ran = 0;
  // Prompt rows as without TEAL: DenseFfn where every neuron is here (runs of rows, so a
  // prompt is one GEMM), else the hot neurons row by row.
  int64_t run = 0;
  auto dense_rows = [&](int64_t t0, int64_t t1) {
    if (t1 <= t0 || part.hot.empty()) return;
    if (part.cold.empty()) {
      dense_.Compute(layer, h + t0 * dim, predictor_input + t0 * dim, t1 - t0, out + t0 * dim);
      ran += static_cast<uint64_t>(t1 - t0) * part.hot.size();
      return;
    }
    for (int64_t t = t0; t < t1; ++t) {
      ran += neurons_.Compute(w, h + t * dim, part.hot, filter, out + t * dim, pool_);
    }
  };
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* cut = row_cuts_.data() + t * kPer;
    const TealFfnCuts cuts{cut[0], cut[1], cut[2]};
    if (!cuts.any()) continue;
    dense_rows(run, t);
    run = t + 1;
    if (!part.hot.empty()) {
      ran += teal_parts_[layer].Compute(h + t * dim, cuts, out + t * dim, pool_);
    }
    // DenseFfn adds the down bias to its rows; MergeCold adds it where cold neurons exist.
    if (part.cold.empty()) AddRowBias(model_.layer(layer).down_b, 1, out + t * dim);
  }
  dense_rows(run, n_tokens);
  if (metrics_ != nullptr) {
    const uint64_t all = static_cast<uint64_t>(n_tokens) * part.hot.size();
    metrics_->AddNeurons(ran, all, all);
  }
  if (!part.cold.empty()) MergeCold(layer, n_tokens, sent, out);
}

void SplitFfn::ComputeMoe(int64_t layer, const float* h, int64_t n_tokens, float* out) {
  const ModelConfig& c = model_.config();
  const LayerWeights& w = model_.layer(layer);
  const LayerPartition& part = partition_.layers[layer];
  const MoeLayer& m = moe_[layer];
  const int64_t k = c.n_experts_used, dim = c.dim;
  RouteExperts(c, w, h, n_tokens, pool_, probs_, picks_, pick_w_);
  bool sent = false;
  if (!part.cold.empty()) {
    ColdRequest request = RequestFor(layer, h, n_tokens);
    request.picks = k;
    request.experts = picks_;
    request.expert_weights = pick_w_;
    if (!SendCold(request)) return;
    sent = true;
  }
  const NeuronFilter shared_filter = plan_.SharedExpertFilter(layer, c.activation);
  uint64_t ran = 0, candidates = 0;
  expert_y_.resize(dim);
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* ht = h + t * dim;
    float* o = out + t * dim;
    // Pick order and arithmetic as SparseFfn's and DenseFfn's: o += y_j * w_j for j < k.
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = picks_[t * k + j];
      if (m.hot[e].empty()) continue;
      std::fill(expert_y_.begin(), expert_y_.end(), 0.0f);
      ran += neurons_.Compute(m.experts[e], ht, m.hot[e], plan_.FilterFor(layer, c.activation, e),
                              expert_y_.data(), pool_);
      candidates += m.hot[e].size();
      const float wj = pick_w_[t * k + j];
      for (int64_t i = 0; i < dim; ++i) o[i] += expert_y_[i] * wj;
    }
    // The shared expert is not in the partition (always here), nor in the neuron counts.
    if (!w.shared.up.empty()) {
      std::fill(expert_y_.begin(), expert_y_.end(), 0.0f);
      neurons_.Compute(m.shared, ht, shared_ids_, shared_filter, expert_y_.data(), pool_);
      const float g = SharedExpertGate(w, ht);
      for (int64_t i = 0; i < dim; ++i) o[i] += expert_y_[i] * g;
    }
  }
  if (metrics_ != nullptr) {
    metrics_->AddNeurons(ran, candidates, static_cast<uint64_t>(n_tokens) * part.hot.size());
  }
  MergeCold(layer, n_tokens, sent, out);
}

ColdRequest SplitFfn::RequestFor(int64_t layer, const float* h, int64_t n_tokens) const {
  ColdRequest request;
  request.layer = layer;
  request.rows = n_tokens;
  request.dim = model_.config().dim;
  request.h = std::span<const float>(h, n_tokens * request.dim);
  request.all_cold = true;
  return request;
}

bool SplitFfn::SendCold(const ColdRequest& request) {
  if (link_ == nullptr) {
    status_ = absl::FailedPreconditionError("split FFN: cold neurons but no cold link");
    return false;
  }
  status_ = link_->SendCold(request);
  if (!status_.ok()) return false;
  if (metrics_ != nullptr) metrics_->AddActivation();
  return true;
}

void SplitFfn::MergeCold(int64_t layer, int64_t n_tokens, bool sent, float* out) {
  const int64_t dim = model_.config().dim;
  if (!sent) {
    AddRowBias(model_.layer(layer).down_b, n_tokens, out);
    return;
  }
  y_cold_.resize(n_tokens * dim);
  const int64_t wait_start = metrics_ != nullptr ? ipc::MonotonicNs() : 0;
  status_ = link_->ReceiveCold(layer, y_cold_);
  if (metrics_ != nullptr) {
    metrics_->AddRingWait(static_cast<uint64_t>(std::max<int64_t>(0, ipc::MonotonicNs() - wait_start)));
  }
  if (!status_.ok()) {
    std::fill(out, out + n_tokens * dim, 0.0f);
    return;
  }
  for (int64_t i = 0; i < n_tokens * dim; ++i) out[i] += y_cold_[i];
  AddRowBias(model_.layer(layer).down_b, n_tokens, out);
}

}  // namespace thermocline::gpu_worker
