#include "shared/sparsity/teal.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "shared/kernels/matmul.h"
#include "shared/util/status_macros.h"

namespace thermocline {
namespace {

// The model's matrix for (layer, p), and whether it is stored one row per input already.
struct LayerMatrix {
  MatrixView w;
  bool transposed = false;
};

LayerMatrix MatrixOf(const Model& model, int64_t layer, Projection p) {
  const LayerWeights& w = model.layer(layer);
  switch (p) {
    case Projection::kQ:
      return {w.wq};
    case Projection::kK:
      return {w.wk};
    case Projection::kV:
      return {w.wv};
    case Projection::kO:
      return {w.wo};
    case Projection::kGate:
      return {w.experts.empty() ? w.gate : MatrixView{}};
    case Projection::kUp:
      return {w.experts.empty() ? w.up : MatrixView{}};
    case Projection::kDown:
      if (!w.experts.empty()) return {};
      return w.has_down_t ? LayerMatrix{w.down_t, true} : LayerMatrix{w.down};
  }
  return {};
}


}  // namespace

TealPlan TealPlan::TopShare(int64_t n_layers, float share, bool ffn) {
  TealPlan plan;
  plan.kind = Kind::kTopShare;
  plan.ffn = ffn;
  ProjectionValues v;
  v.fill(share);
  plan.values.assign(n_layers, v);
  return plan;
}

absl::Status TealPlan::Validate(const ModelConfig& config) const {
  if (static_cast<int64_t>(values.size()) != config.n_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("teal plan has ", values.size(), " layers; the model has ", config.n_layers));
  }
  for (int64_t l = 0; l < config.n_layers; ++l) {
    for (int p = 0; p < kNumProjections; ++p) {
      const float v = values[l][p];
      const bool share = kind == Kind::kTopShare;
      if (!std::isfinite(v) || v < 0 || (share && v >= 1)) {
        return absl::InvalidArgumentError(
            absl::StrCat("teal plan: layer ", l, " projection ",
                         std::string(ProjectionName(static_cast<Projection>(p))), ": ",
                         share ? "share " : "cut ", v,
                         share ? " is not in [0, 1)" : " is not a finite value >= 0"));
      }
    }
  }
  return absl::OkStatus();
}

ProjectionValues ProjectionParams(const Model& model, int64_t layer) {
  ProjectionValues out{};
  for (int p = 0; p < kNumProjections; ++p) {
    const MatrixView& w = MatrixOf(model, layer, static_cast<Projection>(p)).w;
    out[p] = static_cast<float>(w.rows * w.cols);
  }
  return out;
}

double BlockSparsity(const Model& model, int64_t layer, const ProjectionValues& sparsity) {
  const ProjectionValues params = ProjectionParams(model, layer);
  double skipped = 0, total = 0;
  for (int p = 0; p < kNumProjections; ++p) {
    skipped += static_cast<double>(params[p]) * sparsity[p];
    total += params[p];
  }
  return total > 0 ? skipped / total : 0.0;
}

float TopShareCut(const float* x, int64_t n, float share, std::vector<uint32_t>& scratch) {
  const int64_t k_share = static_cast<int64_t>(std::floor(static_cast<double>(share) * n));
  if (k_share <= 0 || n == 0) return 0.0f;
  // A radix select over the magnitudes' bit patterns, whose integer order is their order as
  // floats (NaN above infinity): three digits, most significant first, each pass counting the
  // candidates' digits and keeping those with the digit the k-th smallest has. About 4x faster
  // than std::nth_element on the 1.3B shape's 2048 and 5504 inputs (docs/sparsity.md), which
  // took 21 and 56 us a call, on the step's serial path.
  scratch.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof(bits));
    scratch[i] = bits & 0x7FFFFFFFu;
  }
  // All n dropped needs a cut above the largest magnitude: find the largest (k = n - 1).
  int64_t k = std::min(k_share, n - 1);
  constexpr int kShift[3] = {21, 10, 0};
  constexpr uint32_t kDigits[3] = {2048, 2048, 1024};
  uint32_t kth = 0;
  int64_t m = n;
  for (int pass = 0; pass < 3; ++pass) {
    std::array<uint32_t, 2048> count{};
    const int shift = kShift[pass];
    const uint32_t mask = kDigits[pass] - 1;
    for (int64_t i = 0; i < m; ++i) ++count[(scratch[i] >> shift) & mask];
    uint32_t d = 0;
    int64_t below = 0;
    while (below + count[d] <= k) below += count[d++];
    k -= below;
    kth |= d << shift;
    if (pass == 2) break;
    // Branch-free: every candidate is written, the count advances only for those kept.
    int64_t kept = 0;
    for (int64_t i = 0; i < m; ++i) {
      const uint32_t v = scratch[i];
      scratch[kept] = v;
      kept += ((v >> shift) & mask) == d ? 1 : 0;
    }
    m = kept;
  }
  float cut;
  std::memcpy(&cut, &kth, sizeof(cut));
  return k_share >= n ? std::nextafter(cut, INFINITY) : cut;
}

namespace {

// InputSparseMatVec over input c's row rows[c] of wt (rows null: row c), for c < n_in.
int64_t InputSparseRows(const MatrixView& wt, const int32_t* rows, int64_t n_in, const float* x,
                        float cut, std::vector<int32_t>& ids, std::vector<float>& coeffs, float* y,
                        ThreadPool& pool) {
  ids.resize(n_in);
  coeffs.resize(n_in);
  // A zero input adds nothing whatever the cut (ReLU's zeros cost no reads).
  const float keep = std::max(cut, std::numeric_limits<float>::denorm_min());
  // Branch-free compaction: every input is written, the count advances only for kept ones.
  int64_t k = 0;
  for (int64_t c = 0; c < n_in; ++c) {
    ids[k] = rows != nullptr ? rows[c] : static_cast<int32_t>(c);
    coeffs[k] = x[c];
    k += std::fabs(x[c]) >= keep ? 1 : 0;
  }
  std::fill(y, y + wt.cols, 0.0f);
  if (k == 0) return 0;
  // Threads split the kept inputs into shares, each summed whole-row into its own partial (share
  // 0 straight into y), and the partials are added to y in share order. The number of shares
  // depends only on the bytes to read, never on the pool, so every pool size gives the same
  // bits. Splitting the outputs instead (one slice of every kept row per thread) cut each row
  // into short runs at scattered addresses, which leave the memory latency exposed: at Q4_0
  // with 2048 outputs, two threads' 1024-column slices are 576-byte runs, and the 2-thread TEAL
  // decode of the 24-layer model ran at 0.64x dense (1.12x at one thread). A share is at least
  // kMinParallelBytes so that one share (no partials) is what small products run.
  constexpr int64_t kMaxShares = 4;
  const int64_t bytes = k * wt.row_bytes;
  const int64_t shares = std::clamp<int64_t>(bytes / ThreadPool::kMinParallelBytes, 1, kMaxShares);
  thread_local ThreadPool solo(1);
  // Q4_0 copies take the integer axpy (coefficients rounded to 8 bits per group of rows, as a
  // quantized GEMV rounds its activations): on AVX2 the f32 decode of each block cost more per
  // weight than the dense integer GEMV, so TEAL at 50% was slower than dense (docs/sparsity.md).
  const bool integer = HasIntAxpy(wt.type);
  auto axpy = [&](int64_t i0, int64_t i1, float* acc) {
    if (integer) {
      IntAxpyRows(wt, ids.data() + i0, coeffs.data() + i0, i1 - i0, acc);
    } else {
      AxpyRows(wt, ids.data() + i0, coeffs.data() + i0, i1 - i0, acc, solo);
    }
  };
  if (shares == 1) {
    axpy(0, k, y);
    return k;
  }
  thread_local std::vector<float> partials;
  const int64_t cols = wt.cols;
  partials.resize((shares - 1) * cols);
  float* part = partials.data();
  pool.ForEachPieceBytes(shares, bytes, [&](int, int64_t s) {
    const int64_t i0 = k * s / shares, i1 = k * (s + 1) / shares;
    float* acc = s == 0 ? y : part + (s - 1) * cols;
    if (s > 0) std::fill(acc, acc + cols, 0.0f);
    axpy(i0, i1, acc);
  });
  for (int64_t s = 1; s < shares; ++s) {
    const float* p = part + (s - 1) * cols;
    for (int64_t c = 0; c < cols; ++c) y[c] += p[c];
  }
  return k;
}

}  // namespace

int64_t InputSparseMatVec(const MatrixView& wt, const float* x, float cut,
                          std::vector<int32_t>& ids, std::vector<float>& coeffs, float* y,
                          ThreadPool& pool) {
  return InputSparseRows(wt, nullptr, wt.rows, x, cut, ids, coeffs, y, pool);
}

int64_t InputSparseMatVec(const MatrixView& wt, std::span<const int32_t> rows, const float* x,
                          float cut, std::vector<int32_t>& ids, std::vector<float>& coeffs,
                          float* y, ThreadPool& pool) {
  return InputSparseRows(wt, rows.data(), static_cast<int64_t>(rows.size()), x, cut, ids, coeffs, y,
                         pool);
}

absl::StatusOr<std::unique_ptr<TealLinear>> TealLinear::Create(const Model& model, TealPlan plan,
                                                               ThreadPool& pool,
                                                               const TealOptions& options) {
  const ModelConfig& c = model.config();
  TC_RETURN_IF_ERROR(plan.Validate(c));
  std::unique_ptr<TealLinear> t(new TealLinear(model, std::move(plan), pool));
  t->rows_.resize(c.n_layers);
  t->shared_.resize(c.n_layers);
  t->views_.assign(c.n_layers, {});
  t->activity_.assign(c.n_layers, {});
  auto copy_type = [&](const MatrixView& w) {
    std::optional<GgmlType> type = options.quantized_type;
    // A block type needs whole blocks along the transposed rows (the projection's outputs);
    // F16 holds the dequantized weights exactly where they do not fit.
    if (TypeTraits(w.type).block_size > 1 && w.rows % 32 != 0) type = GgmlType::kF16;
    return DownRows::TransposedType(w.type, type);
  };
  auto named = [](int64_t l, const std::string& what, const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("teal: layer ", l, " ", what, ": ", s.message()));
  };
  for (int64_t l = 0; l < c.n_layers; ++l) {
    std::array<bool, kNumProjections> need{};
    for (int p = 0; p < kNumProjections; ++p) {
      const auto proj = static_cast<Projection>(p);
      const bool ffn =
          proj == Projection::kGate || proj == Projection::kUp || proj == Projection::kDown;
      need[p] = !(ffn && !t->plan_.ffn) &&
                (options.all_projections || t->plan_.values[l][p] != 0) &&
                !MatrixOf(model, l, proj).w.empty();
    }
    // Projections of one input share one copy, side by side, when the plan gives them the same
    // value (per-token top-k shares; calibrated cuts differ) and their copies the same type: a
    // kept input is then one run of all their values (longer runs read faster) and one
    // product. Where the values differ, the copies stay separate: a projection's kept rows that
    // are neighbours are then one run, where a side-by-side copy's parts would be strided (a
    // reason, not a measurement: no calibrated plan was timed both ways).
    for (int g = 0; g < static_cast<int>(kSharedGroups.size()); ++g) {
      const std::span<const Projection> group = kSharedGroups[g];
      const float value = t->plan_.values[l][static_cast<int>(group[0])];
      std::vector<MatrixView> parts;
      for (Projection p : group) {
        const MatrixView w = MatrixOf(model, l, p).w;
        if (need[static_cast<int>(p)] && !options.all_projections &&
            t->plan_.values[l][static_cast<int>(p)] == value &&
            copy_type(w) == copy_type(MatrixOf(model, l, group[0]).w)) {
          parts.push_back(w);
        }
      }
      if (parts.size() != group.size()) continue;
      const GgmlType type = copy_type(parts[0]);
      absl::StatusOr<DownRows> rows = DownRows::TransposeSideBySide(parts, type, pool);
      if (!rows.ok()) return named(l, std::string(ProjectionName(group[0])) + "...", rows.status());
      t->shared_[l][g] = std::move(*rows);
      const MatrixView& whole = t->shared_[l][g].view();
      int64_t at = 0;
      for (size_t i = 0; i < group.size(); ++i) {
        MatrixView part = whole;
        part.cols = parts[i].rows;
        part.data = whole.data + RowBytes(type, at);
        t->views_[l][static_cast<int>(group[i])] = part;
        at += parts[i].rows;
        need[static_cast<int>(group[i])] = false;
      }
    }
    for (int p = 0; p < kNumProjections; ++p) {
      if (!need[p]) continue;
      const auto proj = static_cast<Projection>(p);
      const LayerMatrix m = MatrixOf(model, l, proj);
      absl::StatusOr<DownRows> rows = m.transposed
                                          ? DownRows::ForLayer(model, l, std::nullopt, pool)
                                          : DownRows::Transpose(m.w, copy_type(m.w), pool);
      if (!rows.ok()) return named(l, std::string(ProjectionName(proj)), rows.status());
      t->rows_[l][p] = std::move(*rows);
      t->views_[l][p] = t->rows_[l][p].view();
    }
  }
  return t;
}

absl::Status TealLinear::SetLayer(int64_t layer, const ProjectionValues& values) {
  if (layer < 0 || layer >= static_cast<int64_t>(plan_.values.size())) {
    return absl::InvalidArgumentError(absl::StrCat("teal: no layer ", layer));
  }
  for (int p = 0; p < kNumProjections; ++p) {
    const bool ffn = p >= static_cast<int>(Projection::kGate);
    if (values[p] != 0 && views_[layer][p].empty() &&
        !MatrixOf(model_, layer, static_cast<Projection>(p)).w.empty() && (plan_.ffn || !ffn)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "teal: layer ", layer, " ", std::string(ProjectionName(static_cast<Projection>(p))),
          " has no transposed copy"));
    }
  }
  plan_.values[layer] = values;
  return plan_.Validate(model_.config());
}

void TealLinear::Dense(const MatrixView& w, bool transposed, const float* x, int64_t t0, int64_t t1,
                       int64_t x_stride, float* y, int64_t y_stride) {
  if (t1 <= t0) return;
  if (!transposed) {
    MatMul(w, x + t0 * x_stride, t1 - t0, x_stride, y + t0 * y_stride, y_stride, pool_);
    return;
  }
  // ffn_down_t: every row, as DenseFfn computes it.
  if (static_cast<int64_t>(all_ids_.size()) < w.rows) {
    all_ids_.resize(w.rows);
    std::iota(all_ids_.begin(), all_ids_.end(), 0);
  }
  for (int64_t t = t0; t < t1; ++t) {
    std::fill(y + t * y_stride, y + t * y_stride + w.cols, 0.0f);
    AxpyRows(w, all_ids_.data(), x + t * x_stride, w.rows, y + t * y_stride, pool_);
  }
}

void TealLinear::Apply(int64_t layer, Projection p, const MatrixView& w, bool transposed,
                       const float* x, int64_t n, int64_t x_stride, float* y, int64_t y_stride) {
  const int pi = static_cast<int>(p);
  const float value = plan_.values[layer][pi];
  const MatrixView& wt = views_[layer][pi];
  if (value == 0 || wt.empty()) {
    Dense(w, transposed, x, 0, n, x_stride, y, y_stride);
    return;
  }
  if (plan_.masked) {
    const Projection ps[] = {p};
    Dense(w, transposed, Masked(x, n, x_stride, wt.rows, value, ps, layer), 0, n, wt.rows, y,
          y_stride);
    return;
  }
  int64_t run = 0;  // first row of the current run of dense rows
  for (int64_t t = 0; t < n; ++t) {
    if (!SparseRow(t)) continue;
    Dense(w, transposed, x, run, t, x_stride, y, y_stride);
    run = t + 1;
    const float* xt = x + t * x_stride;
    const int64_t kept = InputSparseMatVec(wt, xt, RowCut(xt, wt.rows, value), ids_, coeffs_,
                                           y + t * y_stride, pool_);
    Record(layer, p, kept, wt.rows);
  }
  Dense(w, transposed, x, run, n, x_stride, y, y_stride);
}

float TealLinear::RowCut(const float* x, int64_t n, float value) {
  return plan_.kind == TealPlan::Kind::kCuts ? value : CachedTopShareCut(x, n, value);
}

void TealLinear::Record(int64_t layer, Projection p, int64_t kept, int64_t inputs) {
  ProjectionActivity& a = activity_[layer][static_cast<int>(p)];
  a.kept += kept;
  a.inputs += inputs;
  ++a.sparse_rows;
}

float TealLinear::CachedTopShareCut(const float* x, int64_t n, float share) {
  const bool same = n == static_cast<int64_t>(cut_input_.size()) && share == cut_share_ &&
                    std::memcmp(x, cut_input_.data(), n * sizeof(float)) == 0;
  if (!same) {
    cut_input_.assign(x, x + n);
    cut_share_ = share;
    cut_ = TopShareCut(x, n, share, scratch_);
  }
  return cut_;
}

const float* TealLinear::Masked(const float* x, int64_t n, int64_t x_stride, int64_t in,
                                float value, std::span<const Projection> ps, int64_t layer) {
  masked_.resize(n * in);
  // InputSparseMatVec's rule: zeros are dropped at any cut.
  const float floor = std::numeric_limits<float>::denorm_min();
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x + t * x_stride;
    float* mt = masked_.data() + t * in;
    if (!SparseRow(t)) {
      std::copy_n(xt, in, mt);
      continue;
    }
    const float cut = std::max(RowCut(xt, in, value), floor);
    int64_t kept = 0;
    for (int64_t c = 0; c < in; ++c) {
      const bool keep = std::fabs(xt[c]) >= cut;
      mt[c] = keep ? xt[c] : 0.0f;
      kept += keep ? 1 : 0;
    }
    for (Projection p : ps) Record(layer, p, kept, in);
  }
  return masked_.data();
}

void TealLinear::ApplyShared(int64_t layer, std::span<const Output> outs, const float* x, int64_t n,
                             int64_t x_stride) {
  int group = -1;
  for (int g = 0; g < static_cast<int>(kSharedGroups.size()); ++g) {
    const std::span<const Projection> ps = kSharedGroups[g];
    bool match = outs.size() == ps.size();
    for (size_t i = 0; match && i < ps.size(); ++i) match = outs[i].p == ps[i];
    if (match) group = g;
  }
  const float value = plan_.values[layer][static_cast<int>(outs[0].p)];
  bool same = outs.size() <= kMaxMatMulMany;
  for (const Output& o : outs) same &= plan_.values[layer][static_cast<int>(o.p)] == value;
  if (same && value == 0) {
    DenseProducts(outs, x, x_stride, 0, n, pool_);
    return;
  }
  bool copies = true;
  for (const Output& o : outs) copies &= !views_[layer][static_cast<int>(o.p)].empty();
  if (same && copies && plan_.masked) {
    // One masked input for every output: they share the cut.
    std::array<Projection, kMaxMatMulMany> ps;
    for (size_t i = 0; i < outs.size(); ++i) ps[i] = outs[i].p;
    const int64_t in = outs[0].w->cols;
    DenseProducts(outs, Masked(x, n, x_stride, in, value, std::span(ps.data(), outs.size()), layer),
                  in, 0, n, pool_);
    return;
  }
  if (!same || group < 0 || plan_.masked || shared_[layer][group].view().empty()) {
    LinearExecutor::ApplyShared(layer, outs, x, n, x_stride);
    return;
  }
  const MatrixView& wt = shared_[layer][group].view();
  shared_y_.resize(wt.cols);
  int64_t run = 0;  // first row of the current run of dense rows
  for (int64_t t = 0; t < n; ++t) {
    if (!SparseRow(t)) continue;
    DenseProducts(outs, x, x_stride, run, t, pool_);
    run = t + 1;
    const float* xt = x + t * x_stride;
    const int64_t kept = InputSparseMatVec(wt, xt, RowCut(xt, wt.rows, value), ids_, coeffs_,
                                           shared_y_.data(), pool_);
    int64_t at = 0;
    for (const Output& o : outs) {
      std::copy_n(shared_y_.data() + at, o.w->rows, o.y + t * o.y_stride);
      at += o.w->rows;
      Record(layer, o.p, kept, wt.rows);
    }
  }
  DenseProducts(outs, x, x_stride, run, n, pool_);
}

void TealLinear::ResetActivity() {
  for (auto& layer : activity_) layer.fill({});
}

double TealLinear::MeasuredSparsity() const {
  double skipped = 0, total = 0;
  for (size_t l = 0; l < activity_.size(); ++l) {
    const ProjectionValues params = ProjectionParams(model_, static_cast<int64_t>(l));
    // Per token: the rows of the layer's most-sparsified projection set the token count.
    int64_t tokens = 0;
    for (const ProjectionActivity& a : activity_[l]) tokens = std::max(tokens, a.sparse_rows);
    for (int p = 0; p < kNumProjections; ++p) {
      const ProjectionActivity& a = activity_[l][p];
      total += static_cast<double>(params[p]) * tokens;
      if (a.inputs > 0) {
        skipped += static_cast<double>(params[p]) * (a.inputs - a.kept) / a.inputs * a.sparse_rows;
      }
    }
  }
  return total > 0 ? skipped / total : 0.0;
}

bool TealLinear::reads_shared_copy(int64_t layer, Projection p) const {
  for (size_t g = 0; g < kSharedGroups.size(); ++g) {
    const MatrixView& whole = shared_[layer][g].view();
    const MatrixView& mine = views_[layer][static_cast<int>(p)];
    if (!whole.empty() && mine.data >= whole.data &&
        mine.data < whole.data + whole.rows * whole.row_bytes) {
      return true;
    }
  }
  return false;
}

int64_t TealLinear::owned_bytes() const {
  int64_t total = 0;
  for (const auto& layer : rows_) {
    for (const DownRows& r : layer) total += r.owned_bytes();
  }
  for (const auto& layer : shared_) {
    for (const DownRows& r : layer) total += r.owned_bytes();
  }
  return total;
}

}  // namespace thermocline
