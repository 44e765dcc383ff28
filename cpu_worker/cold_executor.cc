#include "cpu_worker/cold_executor.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "shared/util/memory_lock.h"
#include "shared/util/status_macros.h"

namespace thermocline::cpu_worker {

ColdExecutor::ColdExecutor(const ColdRows& rows, const Partition& partition,
                           const SparsityPlan& plan, FfnActivation activation, ThreadPool& pool)
    : rows_(rows), partition_(partition), plan_(plan), activation_(activation), pool_(pool) {
  int64_t max_cold = 0;
  for (const LayerPartition& l : partition.layers) max_cold = std::max(max_cold, l.n_cold());
  int64_t dim = 0;
  for (int64_t l = 0; l < rows.n_layers(); ++l) dim = std::max(dim, rows.layer(l).dim());
  all_.resize(max_cold);
  std::iota(all_.begin(), all_.end(), 0);
  lanes_.resize(pool.size());
  for (Lane& lane : lanes_) {
    lane.solo = std::make_unique<ThreadPool>(1);
    lane.neurons = NeuronFfn(max_cold);
    lane.expert_y.resize(dim);
  }
}

absl::Status ColdExecutor::Compute(const ipc::ActivationView& a, std::span<float> y) {
  const int64_t layer = a.layer;
  if (layer >= rows_.n_layers()) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " out of range"));
  }
  const LayerPartition& part = partition_.layers[layer];
  const int64_t dim = a.dim;
  const int64_t n_rows = a.rows;
  if (static_cast<int64_t>(y.size()) != n_rows * dim) {
    return absl::InternalError("cold executor: output size does not match the activation");
  }
  const bool moe = !rows_.experts(layer).empty();
  if (moe != (a.picks > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Activation step ", a.step_id, " layer ", layer,
        moe ? ": a mixture-of-experts layer needs the router's picks, the message has none"
            : ": the message carries expert picks, but the layer has no experts"));
  }
  if (moe) return ComputeRouted(a, y);
  if (!a.cuts.empty()) return ComputeTeal(a, y);
  // Translate and check every row before computing any.
  compact_.clear();
  row_end_.clear();
  if (!a.all_candidates) {
    for (uint32_t r = 0; r < a.rows; ++r) {
      for (int32_t id : a.row(r)) {
        // The decoder checked the range already; checked again since a wrong id would index memory.
        const bool in_range = id >= 0 && id < static_cast<int32_t>(part.cold_index.size());
        const int32_t k = in_range ? part.cold_index[id] : -1;
        if (k < 0) {
          return absl::InvalidArgumentError(absl::StrCat("Activation step ", a.step_id, " layer ",
                                                         layer, " row ", r, ": neuron ", id,
                                                         (in_range ? " is hot, not cold" : " is out of range")));
        }
        compact_.push_back(k);
      }
      row_end_.push_back(static_cast<uint32_t>(compact_.size()));
    }
  }
  auto row_ids = [&](int64_t r) -> std::span<const int32_t> {
    if (a.all_candidates) return std::span<const int32_t>(all_).first(part.n_cold());
    const uint32_t begin = r == 0 ? 0 : row_end_[r - 1];
    return std::span<const int32_t>(compact_).subspan(begin, row_end_[r] - begin);
  };
  std::fill(y.begin(), y.end(), 0.0f);
  const NeuronWeights& w = rows_.layer(layer);
  const NeuronFilter filter = plan_.FilterFor(layer, activation_);
  const float* h = a.h.data();
  float* out = y.data();
  for (Lane& lane : lanes_) lane.active = 0;
  // Like SparseFfn: one row uses the whole pool on its neurons; many rows are spread over the
  // threads, each running its rows alone (one parallel region per message).
  if (n_rows == 1 || pool_.size() == 1) {
    for (int64_t r = 0; r < n_rows; ++r) {
      std::span<const int32_t> ids = row_ids(r);
      if (ids.empty()) continue;
      lanes_[0].active +=
          lanes_[0].neurons.Compute(w, h + r * dim, ids, filter, out + r * dim, pool_);
    }
  } else {
    // Rows are claimed one at a time (their candidate lists differ in length), each by one
    // thread with that thread's lane; a row's result does not depend on the thread.
    pool_.ForEachPiece(n_rows, [&](int tid, int64_t r) {
      std::span<const int32_t> ids = row_ids(r);
      if (ids.empty()) return;
      Lane& lane = lanes_[tid];
      lane.active += lane.neurons.Compute(w, h + r * dim, ids, filter, out + r * dim, *lane.solo);
    });
  }
  last_active_ = 0;
  for (const Lane& lane : lanes_) last_active_ += lane.active;
  last_candidates_ = a.all_candidates ? part.n_cold() * n_rows
                                      : static_cast<int64_t>(a.active.size());
  return absl::OkStatus();
}

void ColdExecutor::ComputeRoutedRow(const ipc::ActivationView& a, int64_t r, Lane& lane,
                                    ThreadPool& pool, float* out) {
  const std::vector<NeuronWeights>& experts = rows_.experts(a.layer);
  const int64_t dim = a.dim;
  const float* h = a.h.data() + r * dim;
  // Pick order and arithmetic as the GPU side's: out += y_j * w_j for j < picks.
  for (uint32_t j = 0; j < a.picks; ++j) {
    const int32_t e = a.experts[r * a.picks + j];
    const NeuronWeights& w = experts[e];
    const int64_t n = w.ffn_dim();
    if (n == 0) continue;
    std::fill(lane.expert_y.begin(), lane.expert_y.begin() + dim, 0.0f);
    lane.active += lane.neurons.Compute(w, h, std::span<const int32_t>(all_).first(n),
                                        plan_.FilterFor(a.layer, activation_, e),
                                        lane.expert_y.data(), pool);
    lane.candidates += n;
    const float wj = a.expert_weights[r * a.picks + j];
    for (int64_t i = 0; i < dim; ++i) out[i] += lane.expert_y[i] * wj;
  }
}

absl::Status ColdExecutor::ComputeRouted(const ipc::ActivationView& a, std::span<float> y) {
  if (!a.all_candidates) {
    // The GPU worker sends per-row lists only in predicted layers, which MoE layers refuse.
    return absl::InvalidArgumentError(absl::StrCat(
        "Activation step ", a.step_id, " layer ", a.layer,
        ": candidate lists within experts are not supported; expected all cold neurons"));
  }
  if (a.experts.size() != static_cast<size_t>(a.rows) * a.picks) {
    return absl::InternalError("cold executor: routing does not match the rows");
  }
  const size_t n_experts = rows_.experts(a.layer).size();
  for (int32_t e : a.experts) {
    if (e < 0 || static_cast<size_t>(e) >= n_experts) {
      return absl::InvalidArgumentError(absl::StrCat("Activation step ", a.step_id, " layer ",
                                                     a.layer, ": expert ", e, " outside [0, ",
                                                     n_experts, ")"));
    }
  }
  std::fill(y.begin(), y.end(), 0.0f);
  for (Lane& lane : lanes_) lane.active = lane.candidates = 0;
  const int64_t n_rows = a.rows;
  if (n_rows == 1 || pool_.size() == 1) {
    for (int64_t r = 0; r < n_rows; ++r) {
      ComputeRoutedRow(a, r, lanes_[0], pool_, y.data() + r * a.dim);
    }
  } else {
    pool_.ForEachPiece(n_rows, [&](int tid, int64_t r) {
      ComputeRoutedRow(a, r, lanes_[tid], *lanes_[tid].solo, y.data() + r * a.dim);
    });
  }
  last_active_ = last_candidates_ = 0;
  for (const Lane& lane : lanes_) {
    last_active_ += lane.active;
    last_candidates_ += lane.candidates;
  }
  return absl::OkStatus();
}

absl::Status ColdExecutor::EnableTeal(const TealPlan& plan) {
  if (!plan.ffn || plan.kind != TealPlan::Kind::kCuts) {
    return absl::InvalidArgumentError(
        "cold executor: TEAL over the FFN takes a plan of calibrated cuts (a --teal-profile)");
  }
  if (static_cast<int64_t>(plan.values.size()) != rows_.n_layers()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cold executor: a TEAL plan of ", plan.values.size(), " layers for ", rows_.n_layers()));
  }
  std::vector<TealFfnPart> parts(rows_.n_layers());
  for (int64_t l = 0; l < rows_.n_layers(); ++l) {
    const NeuronWeights& w = rows_.layer(l);
    if (!rows_.experts(l).empty() || w.ffn_dim() == 0) continue;
    absl::StatusOr<TealFfnPart> made = TealFfnPart::Build(
        w.gate, w.up, {}, w.down_t, {}, std::vector<float>(w.up_b.begin(), w.up_b.end()),
        activation_, TealFfnCuts::Of(plan.values[l]).shared_gate_up(), pool_);
    if (!made.ok()) {
      return absl::Status(made.status().code(),
                          absl::StrCat("layer ", l, ": ", made.status().message()));
    }
    parts[l] = *std::move(made);
  }
  teal_ = std::move(parts);
  return absl::OkStatus();
}

int64_t ColdExecutor::teal_bytes() const {
  int64_t bytes = 0;
  for (const TealFfnPart& p : teal_) bytes += p.owned_bytes();
  return bytes;
}

absl::Status ColdExecutor::LockTeal() const {
  for (const TealFfnPart& p : teal_) {
    for (std::span<const uint8_t> m : p.owned_memory()) {
      TC_RETURN_IF_ERROR(LockMemory(m.data(), m.size(), "TEAL's transposed copies"));
    }
  }
  return absl::OkStatus();
}

absl::Status ColdExecutor::ComputeTeal(const ipc::ActivationView& a, std::span<float> y) {
  const int64_t layer = a.layer;
  if (teal_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Activation step ", a.step_id, " layer ", layer,
                     " carries TEAL cuts, but this worker runs the FFN without TEAL (start it with "
                     "--sparsity teal and the gpu worker's --teal-profile)"));
  }
  if (!a.all_candidates) {
    return absl::InvalidArgumentError(absl::StrCat("Activation step ", a.step_id, " layer ", layer,
                                                   ": TEAL cuts with candidate lists"));
  }
  const LayerPartition& part = partition_.layers[layer];
  const NeuronWeights& w = rows_.layer(layer);
  const NeuronFilter filter = plan_.FilterFor(layer, activation_);
  const int64_t dim = a.dim;
  std::span<const int32_t> all = std::span<const int32_t>(all_).first(part.n_cold());
  Lane& lane = lanes_[0];
  last_active_ = 0;
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* h = a.h.data() + r * dim;
    float* out = y.data() + r * dim;
    const float* cut = a.cuts.data() + r * ipc::kCutsPerRow;
    const TealFfnCuts cuts{cut[0], cut[1], cut[2]};
    if (all.empty()) {
      std::fill(out, out + dim, 0.0f);
    } else if (cuts.any()) {
      last_active_ += teal_[layer].Compute(h, cuts, out, pool_);
    } else {
      std::fill(out, out + dim, 0.0f);
      last_active_ += lane.neurons.Compute(w, h, all, filter, out, pool_);
    }
  }
  last_candidates_ = part.n_cold() * a.rows;
  return absl::OkStatus();
}

int64_t ColdExecutor::ColdNeurons(int64_t layer) const {
  if (layer < 0 || layer >= static_cast<int64_t>(partition_.layers.size())) return 0;
  return partition_.layers[layer].n_cold();
}

}  // namespace thermocline::cpu_worker
