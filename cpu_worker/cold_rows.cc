#include "cpu_worker/cold_rows.h"

#include <cstring>

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

}  // namespace

absl::StatusOr<ColdRows> ColdRows::Build(const Model& model, const Partition& partition,
                                         std::optional<int> node, ThreadPool& pool) {
  const ModelConfig& c = model.config();
  if (static_cast<int64_t>(partition.layers.size()) != c.n_layers) {
    return absl::InvalidArgumentError("cold rows: partition and model disagree on layers");
  }
  // down_t row bytes per layer: the model's ffn_down_t, or DownRows' type for the transpose
  // (the model's own type, so the same as the gate's row bytes for every supported type).
  int64_t total = 0;
  // MoE layers run whole on the gpu worker (split_ffn.h): no cold rows here.
  auto n_cold = [&](int64_t l) { return c.layers[l].moe ? 0 : partition.layers[l].n_cold(); };
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = model.layer(l);
    const int64_t n = n_cold(l);
    const int64_t down_row = w.has_down_t ? w.down_t.row_bytes : w.up.row_bytes;
    total += AlignUp(n * w.gate.row_bytes) + AlignUp(n * w.up.row_bytes) + AlignUp(n * down_row);
  }
  ColdRows rows;
  TC_ASSIGN_OR_RETURN(rows.memory_, NodeMemory::Allocate(static_cast<size_t>(total), node));
  rows.layers_.resize(c.n_layers);
  rows.up_b_.resize(c.n_layers);
  uint8_t* p = rows.memory_.data();
  const std::vector<int32_t> none;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = model.layer(l);
    const std::vector<int32_t>& cold = c.layers[l].moe ? none : partition.layers[l].cold;
    NeuronWeights& nw = rows.layers_[l];
    nw.activation = c.activation;
    if (!w.gate.empty()) {
      nw.gate = Gather(w.gate, cold, p);
      p += AlignUp(nw.gate.rows * nw.gate.row_bytes);
    }
    if (c.layers[l].moe) {
      nw.up = MatrixView{GgmlType::kF32, 0, c.dim, p, RowBytes(GgmlType::kF32, c.dim)};
      nw.down_t = nw.up;
      continue;
    }
    nw.up = Gather(w.up, cold, p);
    p += AlignUp(nw.up.rows * nw.up.row_bytes);
    if (!w.up_b.empty()) {
      for (int32_t id : cold) rows.up_b_[l].push_back(w.up_b[id]);
      nw.up_b = rows.up_b_[l];
    }
    if (w.has_down_t) {
      nw.down_t = Gather(w.down_t, cold, p);
    } else if (cold.empty()) {
      nw.down_t = MatrixView{w.up.type, 0, c.dim, p, w.up.row_bytes};
    } else {
      TC_ASSIGN_OR_RETURN(DownRows down, DownRows::ForLayer(model, l, std::nullopt, pool));
      if (down.view().row_bytes != w.up.row_bytes) {
        return absl::InternalError("cold rows: transposed down rows differ from the gate rows");
      }
      nw.down_t = Gather(down.view(), cold, p);
    }
    p += AlignUp(nw.down_t.rows * nw.down_t.row_bytes);
    if (!cold.empty()) TC_RETURN_IF_ERROR(ValidateNeuronWeights(nw));
  }
  return rows;
}

}  // namespace thermocline::cpu_worker
