#include "cpu_worker/cold_rows.h"

#include <cstring>
#include <optional>

#include "shared/util/status_macros.h"

namespace thermocline::cpu_worker {
namespace {

constexpr int64_t kAlign = 64;
int64_t AlignUp(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Copies rows `ids` of `src` to `dst` and returns the compact view.
MatrixView Gather(const MatrixView& src, const std::vector<int32_t>& ids, uint8_t* dst) {
  for (size_t k = 0; k < ids.size(); ++k) {
    std::memcpy(dst + k * src.row_bytes, src.row(ids[k]), src.row_bytes);
  }
  return MatrixView{src.type, static_cast<int64_t>(ids.size()), src.cols, dst, src.row_bytes};
}

// A non-MoE layer's cold neurons as bundles (sparsity/neuron_bundle.h): the gate first as its
// own compact matrix unless it joins the bundle, then one bundle per cold neuron.
struct ColdBundles {
  BundleLayout layout;
  int64_t gate_bytes = 0;  // the separate gate matrix
  int64_t total = 0;
};

ColdBundles ColdBundlesFor(const LayerWeights& w, int64_t down_row, int64_t n,
                           bool gate_in_bundle) {
  ColdBundles b;
  const bool joins = gate_in_bundle && !w.gate.empty();
  b.layout = BundleLayout::For(joins ? w.gate.row_bytes : 0, w.up.row_bytes, down_row);
  if (!w.gate.empty() && !joins) b.gate_bytes = AlignUp(n * w.gate.row_bytes);
  b.total = b.gate_bytes + n * b.layout.stride;
  return b;
}

// One non-MoE layer's cold rows at `at`, laid out as `b` says.
absl::Status BundleLayer(const LayerWeights& w, const std::vector<int32_t>& cold,
                         const ColdBundles& b, const ModelConfig& c, ThreadPool& pool, uint8_t* at,
                         NeuronWeights& nw) {
  // The down rows: the model's ffn_down_t, or one transposed copy of this layer's ffn_down,
  // dropped when this returns.
  std::optional<DownRows> transposed;
  MatrixView down_t = w.down_t;
  if (!w.has_down_t) {
    if (cold.empty()) {
      const GgmlType type = DownRows::TransposedType(w.down.type, std::nullopt);
      down_t = MatrixView{type, 0, c.dim, at, RowBytes(type, c.dim)};
    } else {
      TC_ASSIGN_OR_RETURN(transposed, DownRows::ForMatrix(w.down, std::nullopt, pool));
      down_t = transposed->view();
    }
  }
  nw = WriteBundles(NeuronWeights{w.gate, w.up, down_t, c.activation}, b.layout, cold,
                    at + b.gate_bytes, pool);
  if (!w.gate.empty() && !b.layout.gate) nw.gate = Gather(w.gate, cold, at);
  return cold.empty() ? absl::OkStatus() : ValidateNeuronWeights(nw);
}

}  // namespace

absl::StatusOr<ColdRows> ColdRows::Build(const Model& model, const Partition& partition,
                                         std::optional<int> node, ThreadPool& pool,
                                         const SparsityPlan* plan, bool bundles) {
  const ModelConfig& c = model.config();
  if (static_cast<int64_t>(partition.layers.size()) != c.n_layers) {
    return absl::InvalidArgumentError("cold rows: partition and model disagree on layers");
  }
  // down_t row bytes per layer: the model's ffn_down_t, or those of the type DownRows gives the
  // transpose, which need not be the up rows' (Q4_K_M: Q4_K up, Q6_K down -> Q8_0 down_t).
  auto down_t_row_bytes = [&](const MatrixView& down) {
    return RowBytes(DownRows::TransposedType(down.type, std::nullopt), c.dim);
  };
  int64_t total = 0;
  auto bytes = [](const FfnWeights& f, int64_t n, int64_t down_row) {
    return AlignUp(n * f.gate.row_bytes) + AlignUp(n * f.up.row_bytes) + AlignUp(n * down_row);
  };
  auto gate_in_bundle = [&](int64_t l) {
    return plan != nullptr && l < static_cast<int64_t>(plan->modes.size()) &&
           plan->mode(l) == SparsityMode::kPredicted;
  };
  std::vector<ColdBundles> layouts(c.n_layers);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = model.layer(l);
    const std::vector<int32_t>& cold = partition.layers[l].cold;
    if (c.layers[l].moe) {
      for (size_t e = 0; e < w.experts.size(); ++e) {
        const int64_t n = static_cast<int64_t>(
            ExpertSlice(cold, static_cast<int64_t>(e), c.ffn_dim).size());
        total += bytes(w.experts[e], n, down_t_row_bytes(w.experts[e].down));
      }
      continue;
    }
    const int64_t down_row = w.has_down_t ? w.down_t.row_bytes : down_t_row_bytes(w.down);
    const int64_t n = partition.layers[l].n_cold();
    if (!bundles) {
      total += bytes(FfnWeights{w.gate, w.up, {}}, n, down_row);
      continue;
    }
    layouts[l] = ColdBundlesFor(w, down_row, n, gate_in_bundle(l));
    total += layouts[l].total;
  }
  ColdRows rows;
  TC_ASSIGN_OR_RETURN(rows.memory_, NodeMemory::Allocate(static_cast<size_t>(total), node));
  rows.layers_.resize(c.n_layers);
  rows.experts_.resize(c.n_layers);
  rows.up_b_.resize(c.n_layers);
  uint8_t* p = rows.memory_.data();
  // The cold rows `ids` of one FFN (gate may be empty) into compact NeuronWeights at p.
  auto gather_ffn = [&](const MatrixView& gate, const MatrixView& up,
                        const std::vector<int32_t>& ids, NeuronWeights& nw) {
    nw.activation = c.activation;
    if (!gate.empty()) {
      nw.gate = Gather(gate, ids, p);
      p += AlignUp(nw.gate.rows * nw.gate.row_bytes);
    }
    nw.up = Gather(up, ids, p);
    p += AlignUp(nw.up.rows * nw.up.row_bytes);
  };
  // The down rows `ids` of `down` ([dim][ffn_dim]) via one transposed copy, dropped after.
  auto gather_down = [&](const MatrixView& down, const std::vector<int32_t>& ids,
                         NeuronWeights& nw) -> absl::Status {
    if (ids.empty()) {
      const GgmlType type = DownRows::TransposedType(down.type, std::nullopt);
      nw.down_t = MatrixView{type, 0, c.dim, p, RowBytes(type, c.dim)};
      return absl::OkStatus();
    }
    TC_ASSIGN_OR_RETURN(DownRows t, DownRows::ForMatrix(down, std::nullopt, pool));
    if (t.view().row_bytes != down_t_row_bytes(down)) {
      return absl::InternalError("cold rows: transposed down rows are not the size reserved");
    }
    nw.down_t = Gather(t.view(), ids, p);
    p += AlignUp(nw.down_t.rows * nw.down_t.row_bytes);
    return ValidateNeuronWeights(nw);
  };
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = model.layer(l);
    const std::vector<int32_t>& cold = partition.layers[l].cold;
    NeuronWeights& nw = rows.layers_[l];
    nw.activation = c.activation;
    if (c.layers[l].moe) {
      nw.up = MatrixView{GgmlType::kF32, 0, c.dim, p, RowBytes(GgmlType::kF32, c.dim)};
      nw.down_t = nw.up;
      std::vector<int32_t> local;
      for (size_t e = 0; e < w.experts.size(); ++e) {
        const int64_t base = static_cast<int64_t>(e) * c.ffn_dim;
        local.clear();
        for (int32_t id : ExpertSlice(cold, static_cast<int64_t>(e), c.ffn_dim)) {
          local.push_back(static_cast<int32_t>(id - base));
        }
        NeuronWeights x;
        gather_ffn(w.experts[e].gate, w.experts[e].up, local, x);
        TC_RETURN_IF_ERROR(gather_down(w.experts[e].down, local, x));
        rows.experts_[l].push_back(x);
      }
      continue;
    }
    if (!w.up_b.empty()) {
      for (int32_t id : cold) rows.up_b_[l].push_back(w.up_b[id]);
    }
    if (bundles) {
      TC_RETURN_IF_ERROR(BundleLayer(w, cold, layouts[l], c, pool, p, nw));
      nw.up_b = rows.up_b_[l];
      p += layouts[l].total;
      continue;
    }
    gather_ffn(w.gate, w.up, cold, nw);
    nw.up_b = rows.up_b_[l];
    if (w.has_down_t) {
      nw.down_t = Gather(w.down_t, cold, p);
      p += AlignUp(nw.down_t.rows * nw.down_t.row_bytes);
      if (!cold.empty()) TC_RETURN_IF_ERROR(ValidateNeuronWeights(nw));
    } else {
      TC_RETURN_IF_ERROR(gather_down(w.down, cold, nw));
    }
  }
  return rows;
}

}  // namespace thermocline::cpu_worker
