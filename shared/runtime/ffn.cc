#include "shared/runtime/ffn.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "shared/kernels/matmul.h"
#include "shared/runtime/ops.h"

namespace thermocline {

void AddRowBias(const std::vector<float>& b, int64_t n_rows, float* y) {
  const int64_t width = static_cast<int64_t>(b.size());
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t i = 0; i < width; ++i) y[r * width + i] += b[i];
  }
}

float SharedExpertGate(const LayerWeights& w, const float* h) {
  float g = 0.0f;
  for (size_t i = 0; i < w.shared_gate.size(); ++i) g += w.shared_gate[i] * h[i];
  return 1.0f / (1.0f + std::exp(-g));
}

void Activate(FfnActivation activation, float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    switch (activation) {
      case FfnActivation::kSilu:
        x[i] = x[i] * (1.0f / (1.0f + std::exp(-x[i])));
        break;
      case FfnActivation::kRelu:
      case FfnActivation::kDrelu:
        x[i] = x[i] > 0.0f ? x[i] : 0.0f;
        break;
      case FfnActivation::kGelu:
        x[i] = Gelu(x[i]);
        break;
    }
  }
}

void GatedActivate(FfnActivation activation, float* gate, const float* up, int64_t n) {
  switch (activation) {
    case FfnActivation::kSilu:
      SwiGlu(gate, up, n);
      break;
    case FfnActivation::kRelu:
      ReluGlu(gate, up, n);
      break;
    case FfnActivation::kGelu:
      GeluGlu(gate, up, n);
      break;
    case FfnActivation::kDrelu:
      DreluGlu(gate, up, n);
      break;
  }
}

// Below this many values an activation runs on the caller.
constexpr int64_t kParallelActivationValues = 4096;

// Element-wise, so the pool's split leaves every bit as it is. SiLU and GELU cost an exp or a
// table lookup per value (SiLU: 22 us for one token of the 1.3B shape's 5504 neurons, a serial
// step the other threads would wait through), so they are split when there are enough values;
// ReLU's select is too cheap to pay for a region.
void ActivateValues(FfnActivation activation, float* gate, const float* up, int64_t n,
                    ThreadPool& pool) {
  auto run = [&](int64_t i0, int64_t i1) {
    if (up != nullptr) {
      GatedActivate(activation, gate + i0, up + i0, i1 - i0);
    } else {
      Activate(activation, gate + i0, i1 - i0);
    }
  };
  const bool costly = activation == FfnActivation::kSilu || activation == FfnActivation::kGelu;
  if (costly && pool.size() > 1 && n >= kParallelActivationValues) {
    pool.ParallelFor(n, run, 256);
  } else {
    run(0, n);
  }
}

void DenseFfn::RunFfn(const FfnWeights& w, const std::vector<float>& up_b, int64_t nf,
                      const float* h, int64_t n, float* out, int64_t layer, int64_t expert) {
  const ModelConfig& c = model_.config();
  const bool observe = observer_ != nullptr && expert >= 0;
  gate_.resize(n * nf);
  if (w.gate.empty()) {
    MatMul(w.up, h, n, c.dim, gate_.data(), nf, pool_);
    AddRowBias(up_b, n, gate_.data());
    if (observe) observer_->OnExpertFfn(layer, expert, gate_.data(), nullptr, n);
    ActivateValues(c.activation, gate_.data(), nullptr, n * nf, pool_);
  } else {
    up_.resize(n * nf);
    const MatMulOutput outs[] = {{&w.gate, gate_.data(), nf}, {&w.up, up_.data(), nf}};
    MatMulMany(outs, h, n, c.dim, pool_);
    AddRowBias(up_b, n, up_.data());
    if (observe) observer_->OnExpertFfn(layer, expert, gate_.data(), up_.data(), n);
    ActivateValues(c.activation, gate_.data(), up_.data(), n * nf, pool_);
  }
  MatMul(w.down, gate_.data(), n, nf, out, c.dim, pool_);
}

void DenseFfn::Compute(int64_t layer, const float* h, const float* predictor_input,
                       int64_t n_tokens, float* out) {
  const ModelConfig& c = model_.config();
  const LayerWeights& w = model_.layer(layer);
  if (!w.experts.empty()) {
    ComputeMoe(layer, h, n_tokens, out);
    return;
  }
  const int64_t nf = c.ffn_dim;
  const bool gated = !w.gate.empty();
  gate_.resize(n_tokens * nf);
  if (gated) {
    up_.resize(n_tokens * nf);
    // One region and one rounding of h for both, or the linear executor's products of h.
    const LinearExecutor::Output outs[] = {{Projection::kGate, &w.gate, gate_.data(), nf},
                                           {Projection::kUp, &w.up, up_.data(), nf}};
    Products(linear_, layer, outs, h, n_tokens, c.dim, pool_);
    AddRowBias(w.up_b, n_tokens, up_.data());
  } else {
    Product(layer, Projection::kUp, w.up, false, h, n_tokens, c.dim, gate_.data(), nf);
    AddRowBias(w.up_b, n_tokens, gate_.data());
  }
  if (observer_ != nullptr) {
    observer_->OnPredictorInput(layer, predictor_input, n_tokens);
    observer_->OnFfn(layer, h, gate_.data(), gated ? up_.data() : nullptr, n_tokens);
  }
  ActivateValues(c.activation, gate_.data(), gated ? up_.data() : nullptr, n_tokens * nf, pool_);
  Product(layer, Projection::kDown, w.has_down_t ? w.down_t : w.down, w.has_down_t, gate_.data(),
          n_tokens, nf, out, c.dim);
  AddRowBias(w.down_b, n_tokens, out);
}

void DenseFfn::Product(int64_t layer, Projection p, const MatrixView& w, bool transposed,
                       const float* in, int64_t n_tokens, int64_t n_in, float* out,
                       int64_t n_out) {
  if (linear_ != nullptr) {
    linear_->Apply(layer, p, w, transposed, in, n_tokens, n_in, out, n_out);
    return;
  }
  if (!transposed) {
    MatMul(w, in, n_tokens, n_in, out, n_out, pool_);
    return;
  }
  if (static_cast<int64_t>(all_rows_.size()) != n_in) {
    all_rows_.resize(n_in);
    std::iota(all_rows_.begin(), all_rows_.end(), 0);
  }
  for (int64_t t = 0; t < n_tokens; ++t) {
    std::fill(out + t * n_out, out + (t + 1) * n_out, 0.0f);
    AxpyRows(w, all_rows_.data(), in + t * n_in, n_in, out + t * n_out, pool_);
  }
}

void RouteExperts(const ModelConfig& c, const LayerWeights& w, const float* h, int64_t n_tokens,
                  ThreadPool& pool, std::vector<float>& probs, std::vector<int32_t>& picks,
                  std::vector<float>& weights) {
  const int64_t n_exp = c.n_experts, k = c.n_experts_used;
  probs.resize(n_tokens * n_exp);
  MatMul(w.router, h, n_tokens, c.dim, probs.data(), n_exp, pool);
  picks.resize(n_tokens * k);
  weights.resize(n_tokens * k);
  std::vector<int32_t> order(n_exp);
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* p = probs.data() + t * n_exp;
    Softmax(p, n_exp);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [p](int32_t a, int32_t b) { return p[a] > p[b]; });
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      picks[t * k + j] = order[j];
      weights[t * k + j] = p[order[j]];
      sum += p[order[j]];
    }
    if (c.expert_weights_norm) {
      for (int64_t j = 0; j < k; ++j) weights[t * k + j] /= sum;
    }
  }
}

void DenseFfn::ComputeMoe(int64_t layer, const float* h, int64_t n_tokens, float* out) {
  const ModelConfig& c = model_.config();
  const LayerWeights& w = model_.layer(layer);
  const int64_t n_exp = c.n_experts, k = c.n_experts_used, dim = c.dim;
  RouteExperts(c, w, h, n_tokens, pool_, probs_, picks_, pick_w_);
  // Each expert runs once over the tokens that picked it; outputs land per (token, pick) and
  // are summed in pick order, so the result does not depend on how tokens were grouped.
  picks_y_.resize(n_tokens * k * dim);
  for (int64_t e = 0; e < n_exp; ++e) {
    moe_rows_.clear();
    for (int64_t i = 0; i < n_tokens * k; ++i) {
      if (picks_[i] == e) moe_rows_.push_back(i);
    }
    if (moe_rows_.empty()) continue;
    const int64_t m = static_cast<int64_t>(moe_rows_.size());
    moe_h_.resize(m * dim);
    moe_y_.resize(m * dim);
    for (int64_t r = 0; r < m; ++r) {
      const float* src = h + (moe_rows_[r] / k) * dim;
      std::copy(src, src + dim, moe_h_.begin() + r * dim);
    }
    RunFfn(w.experts[e], {}, c.ffn_dim, moe_h_.data(), m, moe_y_.data(), layer, e);
    for (int64_t r = 0; r < m; ++r) {
      std::copy(moe_y_.begin() + r * dim, moe_y_.begin() + (r + 1) * dim,
                picks_y_.begin() + moe_rows_[r] * dim);
    }
  }
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* o = out + t * dim;
    std::fill(o, o + dim, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const float wj = pick_w_[t * k + j];
      const float* y = picks_y_.data() + (t * k + j) * dim;
      for (int64_t i = 0; i < dim; ++i) o[i] += y[i] * wj;
    }
  }
  if (!w.shared.up.empty()) {
    shared_y_.resize(n_tokens * dim);
    RunFfn(w.shared, {}, c.shared_expert_ffn_dim, h, n_tokens, shared_y_.data());
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float g = SharedExpertGate(w, h + t * dim);
      for (int64_t i = 0; i < dim; ++i) out[t * dim + i] += shared_y_[t * dim + i] * g;
    }
  }
}

}  // namespace thermocline
