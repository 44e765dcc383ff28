#include "shared/runtime/ffn.h"

#include <algorithm>
#include <numeric>

#include "shared/runtime/ops.h"

namespace thermocline {

void DenseFfn::Compute(int64_t layer, const float* h, int64_t n_tokens, float* out) {
  const LlamaConfig& c = model_.config();
  const LayerWeights& w = model_.layer(layer);
  const int64_t nf = c.ffn_dim;
  gate_.resize(n_tokens * nf);
  up_.resize(n_tokens * nf);
  MatMul(w.gate, h, n_tokens, c.dim, gate_.data(), nf, pool_);
  MatMul(w.up, h, n_tokens, c.dim, up_.data(), nf, pool_);
  if (observer_ != nullptr) observer_->OnFfn(layer, h, gate_.data(), up_.data(), n_tokens);
  for (int64_t t = 0; t < n_tokens; ++t) {
    if (c.activation == FfnActivation::kSilu) {
      SwiGlu(gate_.data() + t * nf, up_.data() + t * nf, nf);
    } else {
      ReluGlu(gate_.data() + t * nf, up_.data() + t * nf, nf);
    }
  }
  if (!w.has_down_t) {
    MatMul(w.down, gate_.data(), n_tokens, nf, out, c.dim, pool_);
    return;
  }
  if (static_cast<int64_t>(all_rows_.size()) != nf) {
    all_rows_.resize(nf);
    std::iota(all_rows_.begin(), all_rows_.end(), 0);
  }
  for (int64_t t = 0; t < n_tokens; ++t) {
    std::fill(out + t * c.dim, out + (t + 1) * c.dim, 0.0f);
    AxpyRows(w.down_t, all_rows_.data(), gate_.data() + t * nf, nf, out + t * c.dim, pool_);
  }
}

}  // namespace thermocline
