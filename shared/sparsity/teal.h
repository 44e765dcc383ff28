// TEAL (Liu et al. 2024, "Training-Free Activation Sparsity in Large Language Models"): the
// input of every projection of a layer (q, k, v: the attention norm's output; o: the attention
// output; gate, up: the FFN norm's output; down: the gated activation) loses its entries of
// small magnitude, and only the weight columns of the surviving entries are read.
//
// y = W x with x sparse is y = sum over kept c of x_c * column c of W. The model stores W by
// rows ([out][in]), so the executor keeps a transposed copy ([in][out], one row per input, as
// the sparse FFN's down_t) of every projection it sparsifies and runs AxpyRows over the kept
// inputs' rows: the bytes read shrink with the share of inputs dropped.
//
// Decode positions only (one entry of its slot in a batch): prompt positions stay dense (their
// GEMMs read each weight once for many tokens), unless TealPlan::sparse_prompt says otherwise
// (perplexity and calibration measure the decode computation on every position).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shared/model/model.h"
#include "shared/runtime/linear.h"
#include "shared/sparsity/neuron_ffn.h"
#include "shared/util/thread_pool.h"

namespace thermocline {

using ProjectionValues = std::array<float, kNumProjections>;

// Which inputs of which projection are dropped, per layer.
struct TealPlan {
  enum class Kind {
    kCuts,      // |x_c| < cut is dropped (calibrated cuts from a TEAL profile); 0 = dense
    kTopShare,  // the given share of each row's inputs, smallest magnitudes first, is dropped
                // (per-token top-k, needs no calibration); 0 = dense
  };
  Kind kind = Kind::kCuts;
  std::vector<ProjectionValues> values;  // [n_layers], indexed by Projection
  bool sparse_prompt = false;            // prompt positions too (see the file comment)
  // Sparse rows computed as the dense product (MatMul) of their input with the dropped entries
  // zeroed: TEAL's function, but through the GEMM, which reads each weight once for a batch
  // instead of once per row. For the calibration's trials, which score every position of a
  // batch; the rounding differs from the input-sparse kernels' in the last bits (float
  // weights: the order of the sums) or in the activations' 8-bit rounding (quantized weights).
  bool masked = false;
  bool ffn = true;                       // false: gate/up/down stay dense (another FFN runs them)

  static TealPlan TopShare(int64_t n_layers, float share, bool ffn = true);
  float value(int64_t layer, Projection p) const { return values[layer][static_cast<int>(p)]; }
  // One entry per layer, every value finite and >= 0 (shares < 1). Errors name layer and
  // projection.
  absl::Status Validate(const ModelConfig& config) const;
};

// The share of the layer's projection weights (parameter counts) a given set of per-projection
// input sparsities skips: TEAL's block sparsity.
// Projections the plan cannot sparsify (an MoE layer's FFN, or an FFN left to another executor)
// count as dense.
double BlockSparsity(const Model& model, int64_t layer, const ProjectionValues& sparsity);
// Parameters of each projection of a layer (0 for one the layer does not have, and for the FFN
// of a mixture-of-experts layer, which TEAL leaves dense).
ProjectionValues ProjectionParams(const Model& model, int64_t layer);

// The magnitude under which `share` of x's n values lie: the floor(share * n)-th smallest |x_c|
// (0-based); dropping |x_c| < it drops at most that many (ties keep more). 0 for share 0.
float TopShareCut(const float* x, int64_t n, float share, std::vector<uint32_t>& scratch);

// y[0..wt.cols) = sum over c with |x_c| >= cut and x_c != 0 of x_c * wt.row(c): the
// input-sparse product of the transposed weights wt ([in][out]) with x[0..wt.rows). Zeros are
// skipped at any cut (exactly: they add nothing), so a ReLU output's zeros cost no reads.
// ids and coeffs are scratch. Returns the number of inputs kept. Threads split the kept inputs
// into shares fixed by the bytes to read, so the result does not depend on the pool size.
// Q4_0 copies are summed by IntAxpyRows (kernels/matmul.h: each x_c times a block scale rounded
// to 8 bits against the largest of its group of 16 kept inputs), every other type in f32.
int64_t InputSparseMatVec(const MatrixView& wt, const float* x, float cut,
                          std::vector<int32_t>& ids, std::vector<float>& coeffs, float* y,
                          ThreadPool& pool);
// The same with input c's row at wt.row(rows[c]), for x[0..rows.size()): a subset of a copy's
// rows, such as one split worker's neurons of a down copy.
int64_t InputSparseMatVec(const MatrixView& wt, std::span<const int32_t> rows, const float* x,
                          float cut, std::vector<int32_t>& ids, std::vector<float>& coeffs,
                          float* y, ThreadPool& pool);

struct TealOptions {
  // Element type of the transposed copies of block-quantized projections: nullopt requantizes
  // to the model's type (Q8_0/Q4_0; other block types become Q8_0), as DownRows does.
  std::optional<GgmlType> quantized_type;
  // Build the transposed copy of every projection, not only of those the plan sparsifies (for
  // calibration, which changes the plan with SetLayer).
  bool all_projections = false;
};

// What a projection did since the last reset.
struct ProjectionActivity {
  int64_t sparse_rows = 0;  // rows computed input-sparse
  int64_t inputs = 0;       // their inputs
  int64_t kept = 0;         // of those, kept
};

class TealLinear final : public LinearExecutor {
 public:
  static absl::StatusOr<std::unique_ptr<TealLinear>> Create(const Model& model, TealPlan plan,
                                                            ThreadPool& pool,
                                                            const TealOptions& options = {});

  void BeginBatch(std::span<const uint8_t> decode) override { decode_ = decode; }
  void Apply(int64_t layer, Projection p, const MatrixView& w, bool transposed, const float* x,
             int64_t n, int64_t x_stride, float* y, int64_t y_stride) override;
  // q, k, v (gate, up) with equal values in a layer with their side-by-side copy: one product
  // over the shared copy per decode row, and one MatMulMany for the dense rows (all rows when
  // the values are 0). Anything else goes projection by projection.
  void ApplyShared(int64_t layer, std::span<const Output> outs, const float* x, int64_t n,
                   int64_t x_stride) override;

  const TealPlan& plan() const { return plan_; }
  // Replaces one layer's values (the plan's kind); the projections must have transposed copies
  // (TealOptions::all_projections, or sparsified by the plan Create saw).
  absl::Status SetLayer(int64_t layer, const ProjectionValues& values);

  const ProjectionActivity& activity(int64_t layer, Projection p) const {
    return activity_[layer][static_cast<int>(p)];
  }
  void ResetActivity();
  // Parameter-weighted share of the projection weights skipped over the recorded sparse rows
  // (every projection of every layer, those left dense counting as 0); 0 before any.
  double MeasuredSparsity() const;
  // Bytes held by the transposed copies.
  int64_t owned_bytes() const;
  // Whether projection p of the layer reads its part of a side-by-side copy (ApplyShared).
  bool reads_shared_copy(int64_t layer, Projection p) const;

 private:
  TealLinear(const Model& model, TealPlan plan, ThreadPool& pool)
      : model_(model), plan_(std::move(plan)), pool_(pool) {}
  // W x for rows [t0, t1) as the model would compute it (MatMul, or AxpyRows for ffn_down_t).
  void Dense(const MatrixView& w, bool transposed, const float* x, int64_t t0, int64_t t1,
             int64_t x_stride, float* y, int64_t y_stride);
  // Whether batch row t is computed input-sparse (a decode row, or any row with sparse_prompt).
  bool SparseRow(int64_t t) const {
    return plan_.sparse_prompt || (t < static_cast<int64_t>(decode_.size()) && decode_[t] != 0);
  }
  // TopShareCut of x, or the last one's when x holds the same values: q, k and v read one
  // input, and so do gate and up.
  float CachedTopShareCut(const float* x, int64_t n, float share);
  // The cut of a sparse row x of n inputs for a plan value: the value itself (kCuts), or the
  // row's top-share cut.
  float RowCut(const float* x, int64_t n, float value);
  // One sparse row of projection p: `kept` of `inputs` inputs kept.
  void Record(int64_t layer, Projection p, int64_t kept, int64_t inputs);
  // x's n rows of `in` inputs with each sparse row's dropped entries zeroed (TealPlan::masked),
  // counted into the activity of `ps`; the rows live in masked_.
  const float* Masked(const float* x, int64_t n, int64_t x_stride, int64_t in, float value,
                      std::span<const Projection> ps, int64_t layer);

  const Model& model_;
  TealPlan plan_;
  ThreadPool& pool_;
  // The projections that read one input, whose copies are kept side by side (shared_).
  static constexpr Projection kQkv[] = {Projection::kQ, Projection::kK, Projection::kV};
  static constexpr Projection kGateUp[] = {Projection::kGate, Projection::kUp};
  static constexpr std::array<std::span<const Projection>, 2> kSharedGroups = {kQkv, kGateUp};

  std::vector<std::array<DownRows, kNumProjections>> rows_;  // transposed copies, [n_layers]
  std::vector<std::array<DownRows, 2>> shared_;              // side-by-side copies of kSharedGroups
  // What each projection reads: its rows_ copy or its part of a shared_ copy (empty: none).
  std::vector<std::array<MatrixView, kNumProjections>> views_;
  std::vector<float> shared_y_;
  std::vector<float> masked_;
  std::vector<std::array<ProjectionActivity, kNumProjections>> activity_;
  std::span<const uint8_t> decode_;
  std::vector<int32_t> ids_, all_ids_;
  std::vector<float> coeffs_;
  std::vector<uint32_t> scratch_;
  std::vector<float> cut_input_;  // the input of the last top-share cut, and its share and cut
  float cut_share_ = 0.0f, cut_ = 0.0f;
};

}  // namespace thermocline
