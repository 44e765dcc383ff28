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

absl::StatusOr<std::unique_ptr<SplitFfn>> SplitFfn::Create(const Model& model,
                                                           SparsityPlan plan, Partition partition,
                                                           ThreadPool& pool) {
  const ModelConfig& c = model.config();
  TC_RETURN_IF_ERROR(plan.Validate(c));
  if (static_cast<int64_t>(partition.layers.size()) != c.n_layers) {
    return absl::InvalidArgumentError("split FFN: partition and model disagree on layers");
  }
  std::unique_ptr<SplitFfn> ffn(new SplitFfn(model, std::move(plan), std::move(partition), pool));
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
    // Dense, wholly hot layers run DenseFfn; layers without hot neurons compute nothing here.
    const bool dense_all_hot = ffn->plan_.mode(l) == SparsityMode::kDense && part.cold.empty();
    if (dense_all_hot || part.hot.empty()) continue;
    TC_ASSIGN_OR_RETURN(ffn->down_rows_[l], DownRows::ForLayer(model, l, std::nullopt, pool));
    nw.down_t = ffn->down_rows_[l].view();
    TC_RETURN_IF_ERROR(ValidateNeuronWeights(nw));
  }
  ffn->neurons_ = NeuronFfn(std::max(c.ffn_dim, c.shared_expert_ffn_dim));
  ffn->shared_ids_.resize(c.shared_expert_ffn_dim);
  std::iota(ffn->shared_ids_.begin(), ffn->shared_ids_.end(), 0);
  return ffn;
}

void SplitFfn::BeginStep(ColdLink* link) {
  link_ = link;
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
    ColdRequest request;
    request.layer = layer;
    request.rows = n_tokens;
    request.dim = dim;
    request.h = std::span<const float>(h, n_tokens * dim);
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

void SplitFfn::ComputeMoe(int64_t layer, const float* h, int64_t n_tokens, float* out) {
  const ModelConfig& c = model_.config();
  const LayerWeights& w = model_.layer(layer);
  const LayerPartition& part = partition_.layers[layer];
  const MoeLayer& m = moe_[layer];
  const int64_t k = c.n_experts_used, dim = c.dim;
  RouteExperts(c, w, h, n_tokens, pool_, probs_, picks_, pick_w_);
  bool sent = false;
  if (!part.cold.empty()) {
    ColdRequest request;
    request.layer = layer;
    request.rows = n_tokens;
    request.dim = dim;
    request.h = std::span<const float>(h, n_tokens * dim);
    request.all_cold = true;
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
