#include "shared/sparsity/teal_ffn.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "shared/runtime/ffn.h"
#include "shared/sparsity/teal.h"
#include "shared/util/status_macros.h"

namespace thermocline {
namespace {

// Rows `source` (empty: the first n) of m, then zero rows up to `padded`, as one compact matrix
// in `storage`. Zero bytes are zero values in every type (the block scales are zero too).
MatrixView CompactRows(const MatrixView& m, std::span<const int32_t> source, int64_t n,
                       int64_t padded, std::vector<uint8_t>& storage) {
  storage.assign(static_cast<size_t>(padded * m.row_bytes), 0);
  for (int64_t k = 0; k < n; ++k) {
    const int64_t r = source.empty() ? k : source[k];
    std::memcpy(storage.data() + k * m.row_bytes, m.row(r), m.row_bytes);
  }
  return MatrixView{m.type, padded, m.cols, storage.data(), m.row_bytes};
}

}  // namespace

absl::StatusOr<TealFfnPart> TealFfnPart::Build(const MatrixView& gate, const MatrixView& up,
                                               std::span<const int32_t> source_rows,
                                               const MatrixView& down_t,
                                               std::vector<int32_t> down_rows,
                                               std::vector<float> up_b, FfnActivation activation,
                                               bool shared_gate_up, ThreadPool& pool) {
  TealFfnPart p;
  const bool gated = !gate.empty();
  p.n_ = source_rows.empty() ? up.rows : static_cast<int64_t>(source_rows.size());
  if (gated && (gate.cols != up.cols || gate.type != up.type || gate.rows != up.rows)) {
    return absl::InvalidArgumentError(absl::StrCat("teal ffn part: gate ", gate.rows, "x",
                                                   gate.cols, " and up ", up.rows, "x", up.cols,
                                                   " do not match"));
  }
  for (int32_t r : source_rows) {
    if (r < 0 || r >= up.rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("teal ffn part: neuron row ", r, " outside [0, ", up.rows, ")"));
    }
  }
  if (!down_rows.empty() && static_cast<int64_t>(down_rows.size()) != p.n_) {
    return absl::InvalidArgumentError(
        absl::StrCat("teal ffn part: ", down_rows.size(), " down rows for ", p.n_, " neurons"));
  }
  if (down_rows.empty() && down_t.rows < p.n_) {
    return absl::InvalidArgumentError(
        absl::StrCat("teal ffn part: ", down_t.rows, " down rows for ", p.n_, " neurons"));
  }
  for (int32_t r : down_rows) {
    if (r < 0 || r >= down_t.rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("teal ffn part: down row ", r, " outside [0, ", down_t.rows, ")"));
    }
  }
  if (down_t.cols != up.cols) {
    return absl::InvalidArgumentError(absl::StrCat("teal ffn part: down rows of ", down_t.cols,
                                                   " values for a model dim of ", up.cols));
  }
  if (!up_b.empty() && static_cast<int64_t>(up_b.size()) != p.n_) {
    return absl::InvalidArgumentError(
        absl::StrCat("teal ffn part: ", up_b.size(), " up biases for ", p.n_, " neurons"));
  }
  // Whole blocks along the copies' rows: the neuron count padded with zero rows.
  const GgmlType type = DownRows::TransposedType(up.type, std::nullopt);
  const int64_t block = TypeTraits(type).block_size;
  p.padded_ = (p.n_ + block - 1) / block * block;
  p.shared_ = gated && shared_gate_up;
  p.activation_ = activation;
  p.down_t_ = down_t;
  p.down_rows_ = std::move(down_rows);
  p.up_b_ = std::move(up_b);
  if (p.n_ == 0) return p;

  std::vector<uint8_t> gate_rows, up_rows;
  const MatrixView up_c = CompactRows(up, source_rows, p.n_, p.padded_, up_rows);
  if (p.shared_) {
    const MatrixView parts[] = {CompactRows(gate, source_rows, p.n_, p.padded_, gate_rows), up_c};
    TC_ASSIGN_OR_RETURN(p.gate_up_, DownRows::TransposeSideBySide(parts, type, pool));
    p.gate_t_ = p.gate_up_.view();  // [dim][2 * padded]: gate's values, then up's
    return p;
  }
  if (gated) {
    const MatrixView gate_c = CompactRows(gate, source_rows, p.n_, p.padded_, gate_rows);
    TC_ASSIGN_OR_RETURN(p.gate_up_, DownRows::Transpose(gate_c, type, pool));
    p.gate_t_ = p.gate_up_.view();
    TC_ASSIGN_OR_RETURN(p.up_copy_, DownRows::Transpose(up_c, type, pool));
    p.up_t_ = p.up_copy_.view();
  } else {
    TC_ASSIGN_OR_RETURN(p.gate_up_, DownRows::Transpose(up_c, type, pool));
    p.up_t_ = p.gate_up_.view();
  }
  return p;
}

int64_t TealFfnPart::Compute(const float* h, const TealFfnCuts& cuts, float* out,
                             ThreadPool& pool) {
  if (n_ == 0) {
    std::fill(out, out + down_t_.cols, 0.0f);
    return 0;
  }
  // The products as TealLinear runs them: one over the side-by-side copy, or one per copy.
  float* g = nullptr;
  float* u = nullptr;
  if (shared_) {
    gate_.resize(2 * padded_);
    InputSparseMatVec(gate_t_, h, cuts.gate, ids_, coeffs_, gate_.data(), pool);
    g = gate_.data();
    u = gate_.data() + padded_;
  } else if (!gate_t_.empty()) {
    gate_.resize(padded_);
    up_.resize(padded_);
    InputSparseMatVec(gate_t_, h, cuts.gate, ids_, coeffs_, gate_.data(), pool);
    InputSparseMatVec(up_t_, h, cuts.up, ids_, coeffs_, up_.data(), pool);
    g = gate_.data();
    u = up_.data();
  } else {
    // Without a gate the activation reads up . h (+ bias), as DenseFfn's gate_ holds it.
    gate_.resize(padded_);
    InputSparseMatVec(up_t_, h, cuts.up, ids_, coeffs_, gate_.data(), pool);
    g = gate_.data();
  }
  float* biased = u != nullptr ? u : g;
  for (size_t k = 0; k < up_b_.size(); ++k) biased[k] += up_b_[k];
  ActivateValues(activation_, g, u, n_, pool);
  if (down_rows_.empty()) {
    const MatrixView first{down_t_.type, n_, down_t_.cols, down_t_.data, down_t_.row_bytes};
    return InputSparseMatVec(first, g, cuts.down, ids_, coeffs_, out, pool);
  }
  return InputSparseMatVec(down_t_, down_rows_, g, cuts.down, ids_, coeffs_, out, pool);
}

std::vector<std::span<const uint8_t>> TealFfnPart::owned_memory() const {
  std::vector<std::span<const uint8_t>> spans;
  for (const DownRows* copy : {&gate_up_, &up_copy_}) {
    if (copy->owned_bytes() > 0) spans.push_back(copy->owned_memory());
  }
  return spans;
}

}  // namespace thermocline
