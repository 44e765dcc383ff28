#include "shared/sparsity/neuron_bundle.h"

#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "shared/util/env_switches.h"
#include "shared/util/status_macros.h"

namespace thermocline {

bool NeuronBundle::WantedFromEnvironment() { return EnvSwitchOn(EnvSwitch::kNeuronBundles); }

BundleLayout BundleLayout::For(int64_t gate_bytes, int64_t up_bytes, int64_t down_bytes) {
  // Each part starts on a cache line of its own, as the model's rows of 2048-wide q4_0, q4_K,
  // q8_0 or f16 do.
  auto lines = [](int64_t bytes) { return (bytes + 63) / 64 * 64; };
  BundleLayout o;
  o.gate = gate_bytes > 0;
  o.up_at = lines(gate_bytes);
  o.down_at = o.up_at + lines(up_bytes);
  o.stride = o.down_at + lines(down_bytes);
  return o;
}

NeuronWeights WriteBundles(const NeuronWeights& w, const BundleLayout& layout,
                           std::span<const int32_t> ids, uint8_t* dst, ThreadPool& pool) {
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t gate_bytes = layout.gate ? w.gate.row_data_bytes() : 0;
  const int64_t up_bytes = w.up.row_data_bytes(), down_bytes = w.down_t.row_data_bytes();
  pool.ParallelFor(n, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      uint8_t* b = dst + k * layout.stride;
      if (layout.gate) std::memcpy(b, w.gate.row(ids[k]), gate_bytes);
      std::memcpy(b + layout.up_at, w.up.row(ids[k]), up_bytes);
      std::memcpy(b + layout.down_at, w.down_t.row(ids[k]), down_bytes);
    }
  });
  auto strided = [&](const MatrixView& m, int64_t offset) {
    return MatrixView{m.type, n, m.cols, dst + offset, layout.stride};
  };
  NeuronWeights out = w;
  if (layout.gate) out.gate = strided(w.gate, 0);
  out.up = strided(w.up, layout.up_at);
  out.down_t = strided(w.down_t, layout.down_at);
  return out;
}

absl::StatusOr<NeuronBundle> NeuronBundle::Build(const NeuronWeights& w, bool with_gate,
                                                 ThreadPool& pool) {
  TC_RETURN_IF_ERROR(ValidateNeuronWeights(w));
  NeuronBundle b;
  b.has_gate_ = with_gate && w.gated();
  const BundleLayout layout = BundleLayout::For(b.has_gate_ ? w.gate.row_data_bytes() : 0,
                                                w.up.row_data_bytes(), w.down_t.row_data_bytes());
  const int64_t n = w.ffn_dim();
  b.memory_ = std::make_unique<PageArena>();
  uint8_t* base = b.memory_->Allocate(static_cast<size_t>(layout.stride * n));  // 64-aligned
  if (base == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "neuron bundle: no memory for ", layout.stride * n, " bytes (", n, " neurons of ",
        layout.stride, " bytes); THERMOCLINE_NEURON_BUNDLES=0 runs without bundles"));
  }
  b.bytes_ = layout.stride * n;
  std::vector<int32_t> all(n);
  std::iota(all.begin(), all.end(), 0);
  b.weights_ = WriteBundles(w, layout, all, base, pool);
  return b;
}

}  // namespace thermocline
