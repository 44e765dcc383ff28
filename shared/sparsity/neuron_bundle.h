// A layer's neuron rows copied side by side, so that one neuron's rows are one run of memory.
//
// The sparse FFN reads a few neurons' rows at scattered addresses: a q4_0 or q4_K row of a
// 2048-wide model is 1152 bytes, 18 cache lines at a new address, and such gathers reach about
// half of the read bandwidth where the same kernel over contiguous rows reaches three quarters
// (docs/performance.md, "Neuron bundles"). Laid out as [gate_i | up_i | down_i], a neuron whose
// gate row is read brings its up and down rows along in the same run, and the up and down
// passes that follow find them in cache.
//
// The gate joins the bundle only where it is gathered by candidate (predicted mode). Where the
// gate runs over every neuron (exact, threshold), a whole-matrix pass over [gate | up | down]
// would stream every up and down row too, so there the bundle is [up_i | down_i] and the gate
// keeps its own rows.
//
// The bundle's views are strided MatrixViews (row_bytes: the bundle's bytes per neuron), so every
// kernel reads them as it reads the model's rows, with the same arithmetic: a NeuronFfn over
// the bundle gives the same bits as over the separate rows.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/statusor.h"
#include "shared/sparsity/neuron_ffn.h"
#include "shared/util/page_arena.h"
#include "shared/util/thread_pool.h"

namespace thermocline {

// Where one neuron's rows sit in a bundle: [gate | up | down_t] (no gate when gate_bytes is 0),
// each part on whole cache lines, `stride` bytes a neuron.
struct BundleLayout {
  bool gate = false;
  int64_t up_at = 0, down_at = 0, stride = 0;
  // From each part's row bytes (gate_bytes 0: the gate stays out).
  static BundleLayout For(int64_t gate_bytes, int64_t up_bytes, int64_t down_bytes);
};

// Writes neuron ids[k] of w as bundle k at dst + k * layout.stride (dst 64-byte aligned, room
// for ids.size() bundles), and returns w with up and down_t (and the gate, when it joins) as
// strided views of dst of ids.size() rows. A gate that stays out is returned as w's own: a
// caller writing a subset of the neurons gathers it itself.
NeuronWeights WriteBundles(const NeuronWeights& w, const BundleLayout& layout,
                           std::span<const int32_t> ids, uint8_t* dst, ThreadPool& pool);

class NeuronBundle {
 public:
  NeuronBundle() = default;
  NeuronBundle(NeuronBundle&&) noexcept = default;
  NeuronBundle& operator=(NeuronBundle&&) noexcept = default;

  // Copies w's rows (gate too when with_gate and w has one) into a bundle on huge pages. The
  // up bias and the activation carry over. An error when the memory cannot be had.
  static absl::StatusOr<NeuronBundle> Build(const NeuronWeights& w, bool with_gate,
                                            ThreadPool& pool);

  // The same neurons, read from the bundle (the gate from w's own rows unless bundled).
  const NeuronWeights& weights() const { return weights_; }
  int64_t bytes() const { return bytes_; }
  bool has_gate() const { return has_gate_; }

  // False when THERMOCLINE_NEURON_BUNDLES=0 is in the environment (for A/B runs and machines
  // short of memory); any other value, or none, keeps them on.
  static bool WantedFromEnvironment();

 private:
  NeuronWeights weights_;
  std::unique_ptr<PageArena> memory_;
  int64_t bytes_ = 0;
  bool has_gate_ = false;
};

}  // namespace thermocline
