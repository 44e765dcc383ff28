#include "shared/sparsity/neuron_bundle.h"

#include <cstdlib>
#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "shared/util/status_macros.h"

namespace thermocline {

bool NeuronBundle::WantedFromEnvironment() {
  const char* env = std::getenv("THERMOCLINE_NEURON_BUNDLES");
  return env == nullptr || std::string_view(env) != "0";
}

absl::StatusOr<NeuronBundle> NeuronBundle::Build(const NeuronWeights& w, bool with_gate,
                                                 ThreadPool& pool) {
  TC_RETURN_IF_ERROR(ValidateNeuronWeights(w));
  NeuronBundle b;
  b.has_gate_ = with_gate && w.gated();
  // Each part starts on a cache line of its own (the arena's memory is 64-byte aligned), as
  // the model's rows of 2048-wide q4_0, q4_K, q8_0 or f16 do.
  auto lines = [](int64_t bytes) { return (bytes + 63) / 64 * 64; };
  const int64_t gate_bytes = b.has_gate_ ? w.gate.row_data_bytes() : 0;
  const int64_t up_bytes = w.up.row_data_bytes(), down_bytes = w.down_t.row_data_bytes();
  const int64_t up_at = lines(gate_bytes), down_at = up_at + lines(up_bytes);
  const int64_t stride = down_at + lines(down_bytes);
  const int64_t n = w.ffn_dim();
  b.memory_ = std::make_unique<PageArena>();
  uint8_t* base = b.memory_->Allocate(static_cast<size_t>(stride * n));
  if (base == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("neuron bundle: no memory for ", stride * n, " bytes (", n, " neurons of ",
                     stride, " bytes); THERMOCLINE_NEURON_BUNDLES=0 runs without bundles"));
  }
  b.bytes_ = stride * n;
  pool.ParallelFor(n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      uint8_t* dst = base + i * stride;
      if (gate_bytes > 0) std::memcpy(dst, w.gate.row(i), gate_bytes);
      std::memcpy(dst + up_at, w.up.row(i), up_bytes);
      std::memcpy(dst + down_at, w.down_t.row(i), down_bytes);
    }
  });
  auto strided = [&](const MatrixView& m, int64_t offset) {
    return MatrixView{m.type, m.rows, m.cols, base + offset, stride};
  };
  b.weights_ = w;
  if (b.has_gate_) b.weights_.gate = strided(w.gate, 0);
  b.weights_.up = strided(w.up, up_at);
  b.weights_.down_t = strided(w.down_t, down_at);
  return b;
}

}  // namespace thermocline
