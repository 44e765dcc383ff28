// The FFN of one layer over a subset of its neurons, for one token: the unit of work of every
// sparse executor. SparseFfn runs it over all of a layer's neurons (or the predictor's pick);
// the split workers run it over the hot subset (GPU side) and the cold subset (CPU worker) and
// add the two partial outputs.
//
// For one token h and candidate neurons C (ids into the layer's ffn_dim rows):
//   g_i = gate_i . h                     for i in C        (GatherMatMul over the gate rows)
//   S   = {i in C : filter(act(g_i))}                        (the neurons that run)
//   u_i = up_i . h                       for i in S        (GatherMatMul over the up rows)
//   D   = {i in S : |act(g_i) u_i| >= coeff_cut}           (all of S without a coefficient cut)
//   out += sum_{i in D} act(g_i) u_i down_t_i              (AxpyRows over down_t rows)
// Each g_i and u_i is computed by the same kernel and the same operation sequence as the dense
// MatMul computes it, and act(g) * u with the same float operations as ops.h's SwiGlu/ReluGlu,
// so every per-neuron product is bit-identical to the dense pass; only the order in which the
// down projection sums them differs.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shared/kernels/matmul.h"
#include "shared/model/model.h"
#include "shared/util/page_arena.h"
#include "shared/util/thread_pool.h"

namespace thermocline {

// Which candidates run: their up rows judged on a = act(gate . h), then (optionally) their
// down rows on the coefficient c = a * (up . h) that scales the down row.
struct NeuronFilter {
  enum class Kind {
    kNone,       // every candidate
    kPositive,   // a > 0: exact for ReLU (the others contribute exactly 0)
    kMagnitude,  // |a| >= cut (CATS; activation_stats.h's definition of "active")
  };
  Kind kind = Kind::kNone;
  float cut = 0.0f;
  // > 0: of the neurons that passed the first stage, only those with |c| >= coeff_cut have
  // their down row read. |c| is the exact size of the neuron's contribution (times its down
  // row), so this second stage drops far less than a gate cut skipping as many down rows: the
  // gate alone cannot see a large up value (TEAL's argument for sparsifying the down input).
  float coeff_cut = 0.0f;

  static NeuronFilter None() { return {Kind::kNone, 0.0f, 0.0f}; }
  static NeuronFilter Positive() { return {Kind::kPositive, 0.0f, 0.0f}; }
  static NeuronFilter Magnitude(float cut, float coeff_cut = 0.0f) {
    return {Kind::kMagnitude, cut, coeff_cut};
  }
};

// One layer's FFN weights in neuron-major form: gate, up and down_t are all [ffn_dim][dim],
// row i belonging to neuron i. FFNs without a gate (plain MLPs: falcon, starcoder2) leave gate
// empty: neuron i's activation is then act(up_i . h + up_b[i]) and it scales down_t row i by
// that alone. up_b (empty: none) is indexed like the rows.
struct NeuronWeights {
  MatrixView gate, up, down_t;
  FfnActivation activation = FfnActivation::kSilu;
  std::span<const float> up_b;

  bool gated() const { return !gate.empty(); }
  // The rows whose product decides whether a neuron runs: gate's, or up's without a gate.
  const MatrixView& selector() const { return gated() ? gate : up; }
  int64_t ffn_dim() const { return up.rows; }
  int64_t dim() const { return up.cols; }
};

// Shapes agree: gate, up and down_t have the same rows and cols.
absl::Status ValidateNeuronWeights(const NeuronWeights& w);

// For ids from outside the process (a shared-memory message): every id in [0, ffn_dim) and
// strictly ascending (so none repeats; a repeated id would be added twice).
absl::Status ValidateNeuronIds(std::span<const int32_t> ids, int64_t ffn_dim);

// Runs NeuronWeights over candidate subsets. Holds the per-call scratch, so one instance per
// thread that drives a pool; buffers only grow, so a steady decode loop allocates nothing.
//
// Threads: Compute gives each of the pool's threads an equal share of the candidates (every
// row of a matrix costs the same, so equal counts are equal work) and runs gate, filter, up and
// down of that share in one parallel region. ComputeWithGate filters on the calling thread and
// splits the survivors equally. Each thread runs the kernels on its share alone and sums its
// down rows into a private partial; the partials are added to `out` in thread order, so results
// depend on the pool size, never on timing. Shares below ~64 KiB of weights are not split.
class NeuronFfn {
 public:
  NeuronFfn() = default;
  // Reserves scratch for up to `max_candidates` candidates (optional; calls grow it).
  explicit NeuronFfn(int64_t max_candidates);

  // Adds the FFN output of the candidates that pass `filter` to out[0..dim) for one token
  // h[0..dim) (see the top of this file) and returns how many ran (had their up row read;
  // down_rows() says how many of those had their down row read). Candidates must be distinct
  // and in [0, ffn_dim) (ValidateNeuronIds for untrusted lists); any order.
  int64_t Compute(const NeuronWeights& w, const float* h, std::span<const int32_t> candidates,
                  NeuronFilter filter, float* out, ThreadPool& pool);

  // The same with the candidates' gate pre-activations given (gate[k] for candidates[k]), for
  // callers that computed them for many tokens in one MatMul.
  int64_t ComputeWithGate(const NeuronWeights& w, const float* h,
                          std::span<const int32_t> candidates, const float* gate,
                          NeuronFilter filter, float* out, ThreadPool& pool);

  // The neurons that ran in the last call, in candidate order.
  std::span<const int32_t> survivors() const { return {ids_.data(), n_survivors_}; }
  // Down rows read in the last call (= survivors().size() without a coefficient cut).
  int64_t down_rows() const { return down_rows_; }

 private:
  // One per pool thread: a single-thread pool that runs the kernels on that thread's share,
  // and its partial down sum.
  struct Lane {
    std::unique_ptr<ThreadPool> solo;
    std::vector<float> partial;
    size_t kept = 0;       // survivors of the first stage
    size_t down_kept = 0;  // of those, down rows read
  };
  void Prepare(size_t n_candidates, int64_t dim, int n_threads);
  // Up and down of the survivors ids_[k0, k1) (coeff_ holding their activations) added to acc
  // (zeroed first if asked), on the calling thread; returns the down rows read.
  size_t RunRange(const NeuronWeights& w, const float* h, size_t k0, size_t k1, float coeff_cut,
                  float* acc, bool zero_acc, ThreadPool& solo);
  // out += the partials of shares 1..shares-1, in order.
  void AddPartials(int shares, int64_t dim, float* out) const;
  // Up and down over ids_[0, n_survivors_), split equally over the pool.
  void RunSurvivors(const NeuronWeights& w, const float* h, float coeff_cut, float* out,
                    ThreadPool& pool);

  std::vector<Lane> lanes_;
  std::vector<float> gate_, coeff_, up_;
  std::vector<int32_t> ids_;
  std::vector<int32_t> down_ids_;  // second-stage survivors, at the same offsets as ids_
  size_t n_survivors_ = 0;
  int64_t down_rows_ = 0;
};

// The down projection of one layer stored one row per neuron, for AxpyRows: the model's
// ffn_down_t when it has one (PowerInfer files), else a transposed copy of ffn_down
// ([dim][ffn_dim] in llama.cpp files) built at construction.
//
// The copy costs one more down matrix of memory per layer that needs it. F32, F16 and BF16
// transpose exactly (elements move, bits unchanged). Q8_0 and Q4_0 blocks run along a row, so
// the copy dequantizes and requantizes every row to `quantized_type`: the same type as the model
// keeps the bytes read per active neuron equal to the dense path's but rounds each weight a
// second time (an error of up to half a quantization step of the new block); kF16 keeps the
// dequantized values exactly at ~3.6x (vs Q4_0) or ~1.9x (vs Q8_0) the bytes. The other block
// types (q4_1, q5_x, the K-quants, iq4_nl, iq4_xs) go the same way via f32 and are stored as
// Q8_0 by default (most have no quantizer; Q8_0 is the closest cheap type in bytes per neuron:
// ~1.9x a Q4_K row, one extra rounding of at most half a Q8_0 step), or as `quantized_type`.
class DownRows {
 public:
  DownRows() = default;
  // Moves keep view() valid (it points into owned storage); copies would not, so none.
  DownRows(DownRows&&) = default;
  DownRows& operator=(DownRows&&) = default;
  DownRows(const DownRows&) = delete;
  DownRows& operator=(const DownRows&) = delete;

  // Borrows `model.layer(layer).down_t`, or builds the transposed copy. quantized_type applies
  // to block-quantized models only and must be kF32, kF16 or a type with a quantizer (default:
  // the model's own type for Q8_0/Q4_0, else kQ8_0).
  static absl::StatusOr<DownRows> ForLayer(const Model& model, int64_t layer,
                                           std::optional<GgmlType> quantized_type,
                                           ThreadPool& pool);
  // The same for any down matrix (an expert's), with ForLayer's choice of type.
  static absl::StatusOr<DownRows> ForMatrix(const MatrixView& down,
                                            std::optional<GgmlType> quantized_type,
                                            ThreadPool& pool);
  // The type ForMatrix gives the transposed copy of a `down_type` matrix (so that callers can
  // size storage for it before building it).
  static GgmlType TransposedType(GgmlType down_type, std::optional<GgmlType> quantized_type);
  // The transposed copy of `down` ([dim][ffn_dim]) as [ffn_dim][dim] rows of `type` (the same
  // rules as above; float types must equal down's type).
  static absl::StatusOr<DownRows> Transpose(const MatrixView& down, GgmlType type,
                                            ThreadPool& pool);

  // Column i of `down` as `type` values at dst + i * dst_row_bytes (RowBytes(type, down.rows)
  // of each), under Transpose's rules: the storage is the caller's.
  static absl::Status TransposeInto(const MatrixView& down, GgmlType type, uint8_t* dst,
                                    int64_t dst_row_bytes, ThreadPool& pool);
  // The transposed copies of matrices that read one input (q, k and v; gate and up) side by
  // side: row c holds column c of each part in turn, each part as Transpose would store it
  // (the same type rules; every part's outputs a whole number of `type` blocks). One kept
  // input is then one run of all the parts' values.
  static absl::StatusOr<DownRows> TransposeSideBySide(std::span<const MatrixView> parts,
                                                      GgmlType type, ThreadPool& pool);

  const MatrixView& view() const { return view_; }
  // Bytes this object owns (0 when it borrows the model's ffn_down_t).
  int64_t owned_bytes() const { return static_cast<int64_t>(owned_.size()); }
  std::span<const uint8_t> owned_memory() const { return {owned_.data(), owned_.size()}; }

 private:
  // Zeroed storage for `bytes` bytes owned by this object.
  absl::StatusOr<uint8_t*> Own(int64_t bytes);

  MatrixView view_;
  // Huge pages where whole ones fit (util/page_arena.h): a token's products read rows all over
  // the copy, one 4 KiB page or less per row. TEAL's Q4_0 decode of the 24-block model ran
  // about 8% more tokens a second at one thread with them (docs/performance.md).
  PageBuffer owned_;
};

}  // namespace thermocline
