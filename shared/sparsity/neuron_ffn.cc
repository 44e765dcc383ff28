#include "shared/sparsity/neuron_ffn.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "shared/gguf/quant.h"
#include "shared/runtime/ops.h"
#include "shared/util/status_macros.h"

namespace thermocline {
namespace {

// silu(g) with the float operations of ops.cc's SwiGlu, so that silu(g) * u below rounds
// exactly as the dense pass's fused loop does.
inline float Silu(float g) { return g * (1.0f / (1.0f + std::exp(-g))); }

// act(g) with the dense pass's operations (runtime/ffn.cc), for every activation.
inline float Act(FfnActivation activation, float g) {
  switch (activation) {
    case FfnActivation::kRelu:
    case FfnActivation::kDrelu:
      return g > 0.0f ? g : 0.0f;
    case FfnActivation::kGelu:
      return Gelu(g);
    case FfnActivation::kSilu:
      break;
  }
  return Silu(g);
}

// absl::StrCat here predates std::string_view support.
std::string TypeName(GgmlType t) { return std::string(TypeTraits(t).name); }

bool IsBlockQuantized(GgmlType t) { return TypeTraits(t).block_size > 1; }

// How many shares n items are cut into (at least one, none empty, at most one per thread): two
// shares need the pool's parallel threshold of weight traffic, so each has at least half of it.
int SharesFor(int64_t n, int64_t bytes_per_item, int n_threads) {
  const int64_t by_bytes = n * bytes_per_item / (ThreadPool::kMinParallelBytes / 2);
  return static_cast<int>(std::max<int64_t>(1, std::min({by_bytes, int64_t{n_threads}, n})));
}

// Writes the candidates that pass `filter` (ids, then their activations) to ids/act, in order;
// returns how many. Branch-free: the keep pattern is data-dependent and unpredictable, so every
// candidate is written and the output position advances only for kept ones.
size_t Compact(FfnActivation activation, const int32_t* candidates, const float* gate, size_t n,
               NeuronFilter filter, int32_t* ids, float* act) {
  size_t m = 0;
  for (size_t k = 0; k < n; ++k) {
    const float a = Act(activation, gate[k]);
    bool keep = true;
    switch (filter.kind) {
      case NeuronFilter::Kind::kNone:
        break;
      case NeuronFilter::Kind::kPositive:
        keep = a > 0.0f;
        break;
      case NeuronFilter::Kind::kMagnitude:
        keep = std::fabs(a) >= filter.cut;
        break;
    }
    ids[m] = candidates[k];
    act[m] = a;
    m += keep ? 1 : 0;
  }
  return m;
}

}  // namespace

absl::Status ValidateNeuronWeights(const NeuronWeights& w) {
  const MatrixView* mats[] = {&w.gate, &w.up, &w.down_t};
  const char* names[] = {"gate", "up", "down_t"};
  for (int k = w.gated() ? 0 : 1; k < 3; ++k) {
    const MatrixView& m = *mats[k];
    if (m.data == nullptr || m.rows != w.up.rows || m.cols != w.up.cols) {
      return absl::InvalidArgumentError(
          absl::StrCat("neuron FFN: ", names[k], " is ", m.rows, "x", m.cols,
                       (m.data == nullptr ? " (no data)" : ""),
                       "; every matrix must be [ffn_dim][dim] = ", w.up.rows, "x", w.up.cols));
    }
  }
  if (!w.up_b.empty() && static_cast<int64_t>(w.up_b.size()) != w.up.rows) {
    return absl::InvalidArgumentError(absl::StrCat("neuron FFN: up bias has ", w.up_b.size(),
                                                   " values for ", w.up.rows, " neurons"));
  }
  return absl::OkStatus();
}

absl::Status ValidateNeuronIds(std::span<const int32_t> ids, int64_t ffn_dim) {
  for (size_t k = 0; k < ids.size(); ++k) {
    if (ids[k] < 0 || ids[k] >= ffn_dim) {
      return absl::OutOfRangeError(
          absl::StrCat("neuron id ", ids[k], " at index ", k, " is not in [0, ", ffn_dim, ")"));
    }
    if (k > 0 && ids[k] <= ids[k - 1]) {
      return absl::InvalidArgumentError(absl::StrCat("neuron ids not strictly ascending at index ",
                                                     k, ": ", ids[k - 1], " then ", ids[k]));
    }
  }
  return absl::OkStatus();
}

NeuronFfn::NeuronFfn(int64_t max_candidates) { Prepare(static_cast<size_t>(max_candidates), 0, 1); }

void NeuronFfn::Prepare(size_t n, int64_t dim, int n_threads) {
  if (gate_.size() < n) {
    gate_.resize(n);
    coeff_.resize(n);
    up_.resize(n);
    ids_.resize(n);
    down_ids_.resize(n);
  }
  if (lanes_.size() < static_cast<size_t>(n_threads)) lanes_.resize(n_threads);
  for (Lane& lane : lanes_) {
    if (!lane.solo) lane.solo = std::make_unique<ThreadPool>(1);
    if (lane.partial.size() < static_cast<size_t>(dim)) lane.partial.resize(dim);
  }
}

int64_t NeuronFfn::Compute(const NeuronWeights& w, const float* h,
                           std::span<const int32_t> candidates, NeuronFilter filter, float* out,
                           ThreadPool& pool) {
  const size_t n = candidates.size();
  Prepare(n, w.dim(), pool.size());
  // One parallel region for the whole pipeline: each share runs the gate over its candidates,
  // then up and down over its own survivors. Survivor counts per share differ only by sampling
  // noise (a predicted set is mostly survivors), which costs less than a second region.
  const int shares =
      SharesFor(static_cast<int64_t>(n), w.selector().row_data_bytes(), pool.size());
  auto run_share = [&](int s) {
    const size_t k0 = n * s / shares, k1 = n * (s + 1) / shares;
    ThreadPool& solo = *lanes_[s].solo;
    GatherMatMul(w.selector(), candidates.data() + k0, static_cast<int64_t>(k1 - k0), h,
                 gate_.data() + k0, solo);
    if (!w.gated() && !w.up_b.empty()) {
      for (size_t k = k0; k < k1; ++k) gate_[k] += w.up_b[candidates[k]];
    }
    const size_t kept = Compact(w.activation, candidates.data() + k0, gate_.data() + k0, k1 - k0,
                                filter, ids_.data() + k0, coeff_.data() + k0);
    lanes_[s].kept = kept;
    lanes_[s].down_kept = RunRange(w, h, k0, k0 + kept, filter.coeff_cut,
                                   s == 0 ? out : lanes_[s].partial.data(), s > 0, solo);
  };
  if (shares == 1) {
    run_share(0);
  } else {
    // Shares are claimed (each has its own lane, whichever thread runs it), so a thread the
    // machine does not schedule holds up none.
    pool.ForEachPiece(shares, [&](int, int64_t s) { run_share(static_cast<int>(s)); });
    AddPartials(shares, w.dim(), out);
  }
  // Close the gaps between the shares' survivors, for survivors().
  size_t m = lanes_[0].kept;
  down_rows_ = static_cast<int64_t>(lanes_[0].down_kept);
  for (int s = 1; s < shares; ++s) {
    down_rows_ += static_cast<int64_t>(lanes_[s].down_kept);
    const size_t k0 = n * s / shares, kept = lanes_[s].kept;
    std::copy_n(ids_.data() + k0, kept, ids_.data() + m);
    m += kept;
  }
  n_survivors_ = m;
  return static_cast<int64_t>(m);
}

int64_t NeuronFfn::ComputeWithGate(const NeuronWeights& w, const float* h,
                                   std::span<const int32_t> candidates, const float* gate,
                                   NeuronFilter filter, float* out, ThreadPool& pool) {
  Prepare(candidates.size(), w.dim(), pool.size());
  // One pass on this thread: 8 bytes per candidate against the dim-sized rows the kernels read.
  n_survivors_ = Compact(w.activation, candidates.data(), gate, candidates.size(), filter,
                         ids_.data(), coeff_.data());
  RunSurvivors(w, h, filter.coeff_cut, out, pool);
  return static_cast<int64_t>(n_survivors_);
}

size_t NeuronFfn::RunRange(const NeuronWeights& w, const float* h, size_t k0, size_t k1,
                           float coeff_cut, float* acc, bool zero_acc, ThreadPool& solo) {
  const int64_t len = static_cast<int64_t>(k1 - k0);
  if (zero_acc) std::fill(acc, acc + w.dim(), 0.0f);
  if (len == 0) return 0;
  // Gated: the coefficient is act(g) * (up . h + b) (dReLU: times relu of it); without a gate
  // it is the activation alone.
  if (w.gated()) {
    GatherMatMul(w.up, ids_.data() + k0, len, h, up_.data() + k0, solo);
    if (!w.up_b.empty()) {
      for (size_t k = k0; k < k1; ++k) up_[k] += w.up_b[ids_[k]];
    }
    if (w.activation == FfnActivation::kDrelu) {
      for (size_t k = k0; k < k1; ++k) coeff_[k] = coeff_[k] * (up_[k] > 0.0f ? up_[k] : 0.0f);
    } else {
      for (size_t k = k0; k < k1; ++k) coeff_[k] = coeff_[k] * up_[k];
    }
  }
  if (!(coeff_cut > 0.0f)) {
    AxpyRows(w.down_t, ids_.data() + k0, coeff_.data() + k0, len, acc, solo);
    return k1 - k0;
  }
  // Second stage, compacted branch-free like the first (up_ is free again: it holds the kept
  // coefficients).
  size_t m = k0;
  for (size_t k = k0; k < k1; ++k) {
    down_ids_[m] = ids_[k];
    up_[m] = coeff_[k];
    m += std::fabs(coeff_[k]) >= coeff_cut ? 1 : 0;
  }
  AxpyRows(w.down_t, down_ids_.data() + k0, up_.data() + k0, static_cast<int64_t>(m - k0), acc,
           solo);
  return m - k0;
}

void NeuronFfn::AddPartials(int shares, int64_t dim, float* out) const {
  for (int s = 1; s < shares; ++s) {
    const float* p = lanes_[s].partial.data();
    for (int64_t c = 0; c < dim; ++c) out[c] += p[c];
  }
}

void NeuronFfn::RunSurvivors(const NeuronWeights& w, const float* h, float coeff_cut, float* out,
                             ThreadPool& pool) {
  const size_t m = n_survivors_;
  down_rows_ = 0;
  if (m == 0) return;
  const int shares =
      SharesFor(static_cast<int64_t>(m), w.up.row_data_bytes() + w.down_t.row_data_bytes(),
                pool.size());
  auto run_share = [&](int s) {
    lanes_[s].down_kept =
        RunRange(w, h, m * s / shares, m * (s + 1) / shares, coeff_cut,
                 s == 0 ? out : lanes_[s].partial.data(), s > 0, *lanes_[s].solo);
  };
  if (shares == 1) {
    run_share(0);
  } else {
    pool.ForEachPiece(shares, [&](int, int64_t s) { run_share(static_cast<int>(s)); });
    AddPartials(shares, w.dim(), out);
  }
  for (int s = 0; s < shares; ++s) down_rows_ += static_cast<int64_t>(lanes_[s].down_kept);
}

absl::StatusOr<DownRows> DownRows::ForLayer(const Model& model, int64_t layer,
                                            std::optional<GgmlType> quantized_type,
                                            ThreadPool& pool) {
  const LayerWeights& w = model.layer(layer);
  if (w.has_down_t) {
    DownRows d;
    d.view_ = w.down_t;
    return d;
  }
  return ForMatrix(w.down, quantized_type, pool);
}

GgmlType DownRows::TransposedType(GgmlType down_type, std::optional<GgmlType> quantized_type) {
  if (!IsBlockQuantized(down_type)) return down_type;
  if (quantized_type) return *quantized_type;
  // Other block types than Q8_0/Q4_0 (K-quants, i-quants, q4_1, q5_x) are stored as Q8_0:
  // most have no quantizer, and the K-quant ones search every sub-block (slow at load).
  if (down_type != GgmlType::kQ8_0 && down_type != GgmlType::kQ4_0) return GgmlType::kQ8_0;
  return down_type;
}

absl::StatusOr<DownRows> DownRows::ForMatrix(const MatrixView& down,
                                             std::optional<GgmlType> quantized_type,
                                             ThreadPool& pool) {
  return Transpose(down, TransposedType(down.type, quantized_type), pool);
}

namespace {

// Whether `down` can be stored transposed as rows of `type`; the error names the problem.
absl::Status CheckTransposable(const MatrixView& down, GgmlType type) {
  const bool src_quant = IsBlockQuantized(down.type);
  if (!src_quant && type != down.type) {
    return absl::InvalidArgumentError(absl::StrCat(
        "down_t of a ", TypeName(down.type), " matrix must keep its type, not ", TypeName(type)));
  }
  if (src_quant && (type == GgmlType::kBF16 || !HasQuantizer(type))) {
    return absl::InvalidArgumentError(absl::StrCat("down_t of a quantized matrix: ",
                                                   TypeName(type), " is not offered"));
  }
  const int64_t dim = down.rows, ffn = down.cols;
  if (ffn % TypeTraits(down.type).block_size != 0 || dim % TypeTraits(type).block_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "down_t: a ", dim, "x", ffn, " ", TypeName(down.type), " matrix cannot be stored as ", ffn,
        " rows of ", dim, " ", TypeName(type), " values (block size)"));
  }
  return absl::OkStatus();
}

// Column i of `down` as `type` values at dst + i * dst_row_bytes (CheckTransposable first).
void TransposeChecked(const MatrixView& down, GgmlType type, uint8_t* dst, int64_t dst_row_bytes,
                      ThreadPool& pool) {
  const bool src_quant = IsBlockQuantized(down.type);
  const int64_t dim = down.rows, ffn = down.cols;
  constexpr int64_t kTile = 32;
  if (type == down.type && !src_quant) {
    // Float types keep their bits: move elements, 32 neurons x 32 down rows at a time so that
    // both the reads and the writes stay within a few cache lines per row.
    auto transpose = [&]<typename T>(T) {
      pool.ParallelFor((ffn + kTile - 1) / kTile, [&](int64_t t0, int64_t t1) {
        for (int64_t i0 = t0 * kTile; i0 < std::min(ffn, t1 * kTile); i0 += kTile) {
          const int64_t i1 = std::min(ffn, i0 + kTile);
          for (int64_t r0 = 0; r0 < dim; r0 += kTile) {
            const int64_t r1 = std::min(dim, r0 + kTile);
            for (int64_t i = i0; i < i1; ++i) {
              T* out = reinterpret_cast<T*>(dst + i * dst_row_bytes);
              for (int64_t r = r0; r < r1; ++r) {
                std::memcpy(out + r, down.row(r) + i * sizeof(T), sizeof(T));
              }
            }
          }
        }
      });
    };
    if (TypeTraits(type).block_bytes == 4) {
      transpose(uint32_t{});
    } else {
      transpose(uint16_t{});
    }
    return;
  }
  // Quantized: tiles of one block of a down row (32 neurons, 256 for super-block types). Each
  // down row contributes one dequantized block, written transposed into that many f32 rows,
  // which are then stored in `type`.
  const int64_t q_tile = std::max<int64_t>(kTile, TypeTraits(down.type).block_size);
  pool.ParallelFor((ffn + q_tile - 1) / q_tile, [&](int64_t t0, int64_t t1) {
    std::vector<float> tile(q_tile * dim), block(q_tile);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t i0 = t * q_tile, width = std::min(q_tile, ffn - i0);
      // i0 is a multiple of the block size, so it starts a whole block.
      const int64_t offset = RowBytes(down.type, i0);
      for (int64_t r = 0; r < dim; ++r) {
        DequantizeRow(down.type, down.row(r) + offset, block.data(), width);
        for (int64_t k = 0; k < width; ++k) tile[k * dim + r] = block[k];
      }
      for (int64_t k = 0; k < width; ++k) {
        QuantizeRow(type, tile.data() + k * dim, dst + (i0 + k) * dst_row_bytes, dim);
      }
    }
  });
}

}  // namespace

absl::StatusOr<uint8_t*> DownRows::Own(int64_t bytes) {
  owned_ = PageBuffer(static_cast<size_t>(bytes));
  if (owned_.data() == nullptr && bytes > 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("transposed copy: cannot allocate ", bytes, " bytes"));
  }
  return owned_.data();
}

absl::Status DownRows::TransposeInto(const MatrixView& down, GgmlType type, uint8_t* dst,
                                     int64_t dst_row_bytes, ThreadPool& pool) {
  TC_RETURN_IF_ERROR(CheckTransposable(down, type));
  TransposeChecked(down, type, dst, dst_row_bytes, pool);
  return absl::OkStatus();
}

absl::StatusOr<DownRows> DownRows::Transpose(const MatrixView& down, GgmlType type,
                                             ThreadPool& pool) {
  DownRows d;
  const int64_t row_bytes = RowBytes(type, down.rows);
  TC_ASSIGN_OR_RETURN(uint8_t * data, d.Own(down.cols * row_bytes));
  d.view_ = MatrixView{type, down.cols, down.rows, data, row_bytes};
  TC_RETURN_IF_ERROR(TransposeInto(down, type, data, row_bytes, pool));
  return d;
}

absl::StatusOr<DownRows> DownRows::TransposeSideBySide(std::span<const MatrixView> parts,
                                                       GgmlType type, ThreadPool& pool) {
  if (parts.empty()) return absl::InvalidArgumentError("side-by-side copy of no matrices");
  int64_t outputs = 0;
  for (const MatrixView& m : parts) {
    if (m.cols != parts[0].cols) {
      return absl::InvalidArgumentError(absl::StrCat("side-by-side copy: inputs of ", m.cols,
                                                     " and ", parts[0].cols, " columns"));
    }
    TC_RETURN_IF_ERROR(CheckTransposable(m, type));
    outputs += m.rows;
  }
  DownRows d;
  const int64_t row_bytes = RowBytes(type, outputs);
  TC_ASSIGN_OR_RETURN(uint8_t * data, d.Own(parts[0].cols * row_bytes));
  d.view_ = MatrixView{type, parts[0].cols, outputs, data, row_bytes};
  int64_t at = 0;
  for (const MatrixView& m : parts) {
    // Each part's outputs are whole blocks (CheckTransposable), so it starts on a block.
    TransposeChecked(m, type, data + RowBytes(type, at), row_bytes, pool);
    at += m.rows;
  }
  return d;
}

}  // namespace thermocline
