// TEAL's FFN (teal.h: gate, up and down with inputs of small magnitude dropped) over a subset
// of one layer's neurons, for the split workers: the GPU worker runs its hot neurons, the CPU
// worker its cold ones, and the two partial outputs add up to the layer's output.
//
// gate . h and up . h of the subset's neurons read a transposed copy of their gate and up rows
// ([dim][neurons], one row per input, as TealLinear keeps for the whole matrix), so a dropped
// input of h costs no reads; down reads the subset's rows of a down copy, one per neuron, and
// skips the neurons whose activation lies under the down cut. A neuron's value is a function of
// h and the cuts alone, so the split computes TEAL's function; only the order of the sums can
// differ from one process (and not even that when one side holds every neuron: the copies, the
// shares and the sums are then TealLinear's).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "shared/model/model.h"
#include "shared/sparsity/neuron_ffn.h"
#include "shared/sparsity/teal.h"
#include "shared/util/thread_pool.h"

namespace thermocline {

// One row's input cuts of the FFN's projections: |x_c| < cut is dropped (zeros always are).
struct TealFfnCuts {
  float gate = 0.0f;  // of h, for gate (and for up when the two share a copy)
  float up = 0.0f;    // of h, for up
  float down = 0.0f;  // of the activations, for down
  // All 0: the row's FFN without TEAL (the split runs it as before).
  bool any() const { return gate > 0.0f || up > 0.0f || down > 0.0f; }
  // Gate and up take one cut: their copies sit side by side, as TealLinear lays them out.
  bool shared_gate_up() const { return gate == up; }
  // A layer's cuts in a calibrated plan (TealPlan::values).
  static TealFfnCuts Of(const ProjectionValues& v) {
    return {v[static_cast<int>(Projection::kGate)], v[static_cast<int>(Projection::kUp)],
            v[static_cast<int>(Projection::kDown)]};
  }
};

class TealFfnPart {
 public:
  TealFfnPart() = default;
  TealFfnPart(TealFfnPart&&) = default;
  TealFfnPart& operator=(TealFfnPart&&) = default;

  // The part's neuron k: rows source_rows[k] of gate and up ([ffn][dim] row-major; gate empty
  // in an FFN without one; source_rows empty: row k, every row of up), row down_rows[k] of
  // down_t (one row of dim values per neuron; empty: row k), up bias up_b[k] (empty: none).
  // `shared_gate_up`: gate and up take one cut, so their copies sit side by side (one run per
  // kept input), as TealLinear lays them out for equal values. Copies of block-quantized rows
  // are stored in DownRows::TransposedType, padded with zero rows to whole blocks.
  static absl::StatusOr<TealFfnPart> Build(const MatrixView& gate, const MatrixView& up,
                                           std::span<const int32_t> source_rows,
                                           const MatrixView& down_t, std::vector<int32_t> down_rows,
                                           std::vector<float> up_b, FfnActivation activation,
                                           bool shared_gate_up, ThreadPool& pool);

  int64_t n_neurons() const { return n_; }
  int64_t owned_bytes() const { return gate_up_.owned_bytes() + up_copy_.owned_bytes(); }
  // The memory behind owned_bytes(), one span per copy (for --mlock).
  std::vector<std::span<const uint8_t>> owned_memory() const;

  // out[0..dim) = the part's share of the FFN output of h under `cuts` (overwritten). Returns
  // the neurons down read. Not reentrant: one row at a time (each uses the whole pool).
  int64_t Compute(const float* h, const TealFfnCuts& cuts, float* out, ThreadPool& pool);

 private:
  DownRows gate_up_;  // gate and up side by side, or gate alone (or up alone without a gate)
  DownRows up_copy_;  // up, when it is not beside the gate
  // [dim][padded] views of the copies (gate_t_ empty: no gate); shared_: gate_t_ is the
  // side-by-side copy, [dim][2 * padded], and up_t_ is empty.
  MatrixView gate_t_, up_t_;
  bool shared_ = false;
  MatrixView down_t_;
  std::vector<int32_t> down_rows_;
  std::vector<float> up_b_;
  FfnActivation activation_ = FfnActivation::kSilu;
  int64_t n_ = 0, padded_ = 0;
  std::vector<float> gate_, up_;
  std::vector<int32_t> ids_;
  std::vector<float> coeffs_;
};

}  // namespace thermocline
