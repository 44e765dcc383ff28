#include "shared/sparsity/sparse_ffn.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>

#include "shared/util/status_macros.h"

namespace thermocline {

SparseFfn::SparseFfn(const Model& model, SparsityPlan plan, ThreadPool& pool)
    : model_(model), plan_(std::move(plan)), pool_(pool), dense_(model, pool) {}

absl::StatusOr<std::unique_ptr<SparseFfn>> SparseFfn::Create(const Model& model,
                                                             SparsityPlan plan, ThreadPool& pool,
                                                             const SparseFfnOptions& options) {
  const ModelConfig& c = model.config();
  TC_RETURN_IF_ERROR(plan.Validate(c));
  std::unique_ptr<SparseFfn> ffn(new SparseFfn(model, std::move(plan), pool));
  ffn->down_rows_.resize(c.n_layers);
  ffn->bundles_.resize(c.n_layers);
  ffn->weights_.resize(c.n_layers);
  ffn->activity_.assign(c.n_layers, LayerActivity{});
  ffn->moe_.resize(c.n_layers);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = model.layer(l);
    NeuronWeights& nw = ffn->weights_[l];
    if (c.layers[l].moe) {
      if (ffn->plan_.mode(l) == SparsityMode::kDense) continue;
      MoeLayer& m = ffn->moe_[l];
      auto neuron_weights = [&](const FfnWeights& e, DownRows& down) -> absl::StatusOr<NeuronWeights> {
        TC_ASSIGN_OR_RETURN(down, DownRows::ForMatrix(e.down, options.quantized_down_t_type, pool));
        NeuronWeights x{e.gate, e.up, down.view(), c.activation};
        TC_RETURN_IF_ERROR(ValidateNeuronWeights(x));
        return x;
      };
      m.downs.resize(w.experts.size());
      for (size_t e = 0; e < w.experts.size(); ++e) {
        TC_ASSIGN_OR_RETURN(NeuronWeights x, neuron_weights(w.experts[e], m.downs[e]));
        m.experts.push_back(x);
      }
      if (!w.shared.up.empty()) {
        TC_ASSIGN_OR_RETURN(m.shared, neuron_weights(w.shared, m.shared_down));
      }
      continue;
    }
    nw.gate = w.gate;
    nw.up = w.up;
    nw.up_b = w.up_b;
    nw.activation = c.activation;
    if (ffn->plan_.mode(l) == SparsityMode::kDense) continue;
    TC_ASSIGN_OR_RETURN(ffn->down_rows_[l],
                        DownRows::ForLayer(model, l, options.quantized_down_t_type, pool));
    nw.down_t = ffn->down_rows_[l].view();
    TC_RETURN_IF_ERROR(ValidateNeuronWeights(nw));
    if (options.neuron_bundles) {
      const bool with_gate = ffn->plan_.mode(l) == SparsityMode::kPredicted;
      TC_ASSIGN_OR_RETURN(ffn->bundles_[l], NeuronBundle::Build(nw, with_gate, pool));
      nw = ffn->bundles_[l].weights();
      ffn->down_rows_[l] = DownRows();  // its rows live in the bundle now
    }
  }
  // 0..n-1 for every neuron set the layers run whole: the FFN, or an MoE shared expert.
  ffn->all_ids_.resize(std::max(c.ffn_dim, c.shared_expert_ffn_dim));
  std::iota(ffn->all_ids_.begin(), ffn->all_ids_.end(), 0);
  ffn->workers_.resize(pool.size());
  for (Worker& worker : ffn->workers_) {
    worker.solo = std::make_unique<ThreadPool>(1);
    worker.neurons = NeuronFfn(c.ffn_dim);
    worker.predicted.reserve(c.ffn_dim);
  }
  return ffn;
}

void SparseFfn::RunToken(Worker& worker, ThreadPool& pool, int64_t layer, const float* h,
                         const float* predictor_input, const float* gate, float* out) {
  const NeuronWeights& w = weights_[layer];
  const NeuronFilter filter = plan_.FilterFor(layer, model_.config().activation);
  if (gate != nullptr) {
    const std::span<const int32_t> all(all_ids_.data(), static_cast<size_t>(w.ffn_dim()));
    worker.candidates += static_cast<int64_t>(all.size());
    worker.active += worker.neurons.ComputeWithGate(w, h, all, gate, filter, out, pool);
    worker.down += worker.neurons.down_rows();
    return;
  }
  worker.predictor_bytes +=
      plan_.predictors->Predict(layer, predictor_input, &worker.predicted, pool);
  worker.candidates += static_cast<int64_t>(worker.predicted.size());
  worker.active += worker.neurons.Compute(w, h, worker.predicted, filter, out, pool);
  worker.down += worker.neurons.down_rows();
}

void SparseFfn::Compute(int64_t layer, const float* h, const float* predictor_input,
                        int64_t n_tokens, float* out) {
  const ModelConfig& c = model_.config();
  const SparsityMode mode = plan_.mode(layer);
  LayerActivity& act = activity_[layer];
  act.tokens += n_tokens;
  if (mode != SparsityMode::kDense && c.layers[layer].moe) {
    ComputeMoe(layer, h, n_tokens, out);
    return;
  }
  if (mode == SparsityMode::kDense) {
    dense_.Compute(layer, h, predictor_input, n_tokens, out);
    act.candidates += n_tokens * c.ffn_dim;
    act.active += n_tokens * c.ffn_dim;
    act.down += n_tokens * c.ffn_dim;
    return;
  }
  std::fill(out, out + n_tokens * c.dim, 0.0f);
  const float* gate = nullptr;
  if (mode != SparsityMode::kPredicted) {
    // Every neuron is a candidate: the gate is a plain MatMul over contiguous rows, streamed
    // once for all tokens with no id indirection.
    const NeuronWeights& w = weights_[layer];
    batch_gate_.resize(n_tokens * c.ffn_dim);
    MatMul(w.selector(), h, n_tokens, c.dim, batch_gate_.data(), c.ffn_dim, pool_);
    if (!w.gated() && !w.up_b.empty()) {
      for (int64_t t = 0; t < n_tokens; ++t) {
        for (int64_t i = 0; i < c.ffn_dim; ++i) batch_gate_[t * c.ffn_dim + i] += w.up_b[i];
      }
    }
    gate = batch_gate_.data();
  }
  auto token_gate = [&](int64_t t) { return gate != nullptr ? gate + t * c.ffn_dim : nullptr; };
  if (n_tokens == 1 || pool_.size() == 1) {
    for (int64_t t = 0; t < n_tokens; ++t) {
      RunToken(workers_[0], pool_, layer, h + t * c.dim, predictor_input + t * c.dim,
               token_gate(t), out + t * c.dim);
    }
  } else {
    // Tokens are claimed one at a time, each by one thread with that thread's scratch: a token
    // is a whole FFN, so claiming balances tokens of different sparsity, and a thread the
    // machine does not schedule holds up none. A token's result does not depend on the thread.
    pool_.ForEachPiece(n_tokens, [&](int tid, int64_t t) {
      RunToken(workers_[tid], *workers_[tid].solo, layer, h + t * c.dim,
               predictor_input + t * c.dim, token_gate(t), out + t * c.dim);
    });
  }
  // The down bias is one vector per layer, not per neuron: added once to the sum.
  AddRowBias(model_.layer(layer).down_b, n_tokens, out);
  for (Worker& worker : workers_) {
    act.candidates += worker.candidates;
    act.active += worker.active;
    act.down += worker.down;
    act.predictor_bytes += worker.predictor_bytes;
    worker.candidates = worker.active = worker.down = worker.predictor_bytes = 0;
  }
}

void SparseFfn::ComputeMoe(int64_t layer, const float* h, int64_t n_tokens, float* out) {
  const ModelConfig& c = model_.config();
  const LayerWeights& w = model_.layer(layer);
  const MoeLayer& m = moe_[layer];
  const int64_t k = c.n_experts_used, dim = c.dim;
  RouteExperts(c, w, h, n_tokens, pool_, moe_probs_, moe_picks_, moe_weights_);
  const NeuronFilter shared_filter = plan_.SharedExpertFilter(layer, c.activation);
  const std::span<const int32_t> expert_ids(all_ids_.data(), c.ffn_dim);
  const std::span<const int32_t> shared_ids(all_ids_.data(), c.shared_expert_ffn_dim);
  LayerActivity& act = activity_[layer];
  NeuronFfn& neurons = workers_[0].neurons;
  moe_y_.resize(dim);
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* ht = h + t * dim;
    float* o = out + t * dim;
    std::fill(o, o + dim, 0.0f);
    // Pick order and arithmetic as DenseFfn's: o += y_j * w_j for j = 0..k-1.
    for (int64_t j = 0; j < k; ++j) {
      std::fill(moe_y_.begin(), moe_y_.end(), 0.0f);
      const int32_t e = moe_picks_[t * k + j];
      const int64_t ran = neurons.Compute(m.experts[e], ht, expert_ids,
                                          plan_.FilterFor(layer, c.activation, e), moe_y_.data(),
                                          pool_);
      act.candidates += c.ffn_dim;
      act.active += ran;
      act.down += neurons.down_rows();
      const float wj = moe_weights_[t * k + j];
      for (int64_t i = 0; i < dim; ++i) o[i] += moe_y_[i] * wj;
    }
    if (!w.shared.up.empty()) {
      std::fill(moe_y_.begin(), moe_y_.end(), 0.0f);
      neurons.Compute(m.shared, ht, shared_ids, shared_filter, moe_y_.data(), pool_);
      const float g = SharedExpertGate(w, ht);
      for (int64_t i = 0; i < dim; ++i) o[i] += moe_y_[i] * g;
    }
  }
}

void SparseFfn::ResetActivity() { activity_.assign(activity_.size(), LayerActivity{}); }

double SparseFfn::ActiveRatio(int64_t layer) const {
  const LayerActivity& a = activity_[layer];
  if (a.tokens == 0) return 0;
  return static_cast<double>(a.active) / (static_cast<double>(a.tokens) * model_.config().ffn_dim);
}

double SparseFfn::ActiveRatio() const {
  double active = 0, total = 0;
  for (const LayerActivity& a : activity_) {
    active += static_cast<double>(a.active);
    total += static_cast<double>(a.tokens) * model_.config().ffn_dim;
  }
  return total > 0 ? active / total : 0;
}

double SparseFfn::DownRatio() const {
  double down = 0, total = 0;
  for (const LayerActivity& a : activity_) {
    down += static_cast<double>(a.down);
    total += static_cast<double>(a.tokens) * model_.config().ffn_dim;
  }
  return total > 0 ? down / total : 0;
}

double SparseFfn::FfnBytesPerToken() const {
  double bytes = 0;
  for (size_t l = 0; l < activity_.size(); ++l) {
    const LayerActivity& a = activity_[l];
    if (a.tokens == 0) continue;
    const LayerWeights& lw = model_.layer(static_cast<int64_t>(l));
    const double n = static_cast<double>(a.tokens);
    if (plan_.mode(static_cast<int64_t>(l)) == SparsityMode::kDense) {
      const MatrixView& down = lw.has_down_t ? lw.down_t : lw.down;
      bytes += static_cast<double>(lw.gate.rows * lw.gate.row_bytes + lw.up.rows * lw.up.row_bytes +
                                   down.rows * down.row_bytes);
      continue;
    }
    const NeuronWeights& w = weights_[l];
    bytes += (static_cast<double>(a.candidates) * w.gate.row_data_bytes() +
              static_cast<double>(a.active) * w.up.row_data_bytes() +
              static_cast<double>(a.down) * w.down_t.row_data_bytes()) /
             n;
    bytes += static_cast<double>(a.predictor_bytes) / n;
  }
  return bytes;
}

int64_t SparseFfn::bundle_bytes() const {
  int64_t total = 0;
  for (const NeuronBundle& b : bundles_) total += b.bytes();
  return total;
}

int64_t SparseFfn::down_t_bytes() const {
  int64_t total = 0;
  for (const DownRows& d : down_rows_) total += d.owned_bytes();
  return total;
}

}  // namespace thermocline
