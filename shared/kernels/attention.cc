#include "shared/kernels/attention.h"

#include <cstdlib>
#include <cstring>

#include "shared/kernels/attention_kernels.h"
#include "shared/kernels/dispatch.h"
#include "shared/util/fp16.h"

namespace thermocline {
namespace {

using attention_internal::AttentionKernels;

inline float Load(const float* p, int64_t i) { return p[i]; }
inline float Load(const uint16_t* p, int64_t i) { return Fp16ToFp32(p[i]); }

// run.c's order: one running sum per score, rows added in order.
template <typename T>
void ScoresPortable(const float* q, const uint8_t* const* k_rows, int64_t n, int64_t head_dim,
                    float scale, float* scores) {
  for (int64_t j = 0; j < n; ++j) {
    const T* k = reinterpret_cast<const T*>(k_rows[j]);
    float s = 0.0f;
    for (int64_t i = 0; i < head_dim; ++i) s += q[i] * Load(k, i);
    scores[j] = s * scale;
  }
}

template <typename T>
void MixPortable(const float* weights, const uint8_t* const* v_rows, int64_t n, int64_t head_dim,
                 float* out) {
  std::memset(out, 0, head_dim * sizeof(float));
  for (int64_t j = 0; j < n; ++j) {
    const T* v = reinterpret_cast<const T*>(v_rows[j]);
    const float a = weights[j];
    for (int64_t i = 0; i < head_dim; ++i) out[i] += a * Load(v, i);
  }
}

constexpr AttentionKernels kPortable[2] = {{&ScoresPortable<float>, &MixPortable<float>},
                                           {&ScoresPortable<uint16_t>, &MixPortable<uint16_t>}};

const AttentionKernels& For(GgmlType kv_type) {
  // The KV cache is built with one of these two (kv_cache.cc validates the flag); anything else
  // is a programming error, stopped rather than read as the wrong element size.
  if (kv_type != GgmlType::kF32 && kv_type != GgmlType::kF16) std::abort();
  const int i = kv_type == GgmlType::kF16 ? 1 : 0;
  switch (ActiveKernelSimdLevel()) {
    case SimdLevel::kAvx512:
      return attention_internal::Avx512AttentionKernels()[i];
    case SimdLevel::kAvx2:
      return attention_internal::Avx2AttentionKernels()[i];
    case SimdLevel::kPortable:
      break;
  }
  return kPortable[i];
}

}  // namespace

void AttentionScores(GgmlType kv_type, const float* q, const uint8_t* const* k_rows, int64_t n,
                     int64_t head_dim, float scale, float* scores) {
  if (n <= 0) return;
  For(kv_type).scores(q, k_rows, n, head_dim, scale, scores);
}

void AttentionMix(GgmlType kv_type, const float* weights, const uint8_t* const* v_rows, int64_t n,
                  int64_t head_dim, float* out) {
  if (head_dim <= 0) return;
  For(kv_type).mix(weights, v_rows, n, head_dim, out);
}

}  // namespace thermocline
