// AVX2/FMA/F16C attention products (attention.h's contract; the avx512 file gives these bits).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "shared/kernels/attention_kernels.h"
#include "shared/kernels/attention_rows.h"
#include "shared/kernels/simd_avx2.h"

namespace thermocline::attention_internal {
namespace {

// Four positions at a time keep four FMA chains in flight.
template <class L>
void Scores(const float* q, const uint8_t* const* k_rows, int64_t n, int64_t head_dim, float scale,
            float* scores) {
  constexpr int kP = 4;
  const int64_t full = head_dim / 8 * 8, rest = head_dim - full;
  alignas(32) float q_tail[8] = {};
  std::memcpy(q_tail, q + full, rest * sizeof(float));
  for (int64_t j0 = 0; j0 < n; j0 += kP) {
    const int np = static_cast<int>(n - j0 < kP ? n - j0 : kP);
    PrefetchRowsAhead<L>(k_rows, j0, kP, n, 0, head_dim * L::kBytes);
    __m256 acc[kP];
    for (int p = 0; p < kP; ++p) acc[p] = _mm256_setzero_ps();
    for (int64_t c = 0; c < full; c += 8) {
      const __m256 qv = _mm256_loadu_ps(q + c);
      for (int p = 0; p < np; ++p) {
        acc[p] = _mm256_fmadd_ps(L::Load8(k_rows[j0 + p] + c * L::kBytes), qv, acc[p]);
      }
    }
    if (rest > 0) {  // zero-padded, through the same vector step
      const __m256 qv = _mm256_load_ps(q_tail);
      for (int p = 0; p < np; ++p) {
        alignas(32) uint8_t k_tail[8 * L::kBytes] = {};
        std::memcpy(k_tail, k_rows[j0 + p] + full * L::kBytes, rest * L::kBytes);
        acc[p] = _mm256_fmadd_ps(L::Load8(k_tail), qv, acc[p]);
      }
    }
    for (int p = 0; p < np; ++p) scores[j0 + p] = simd::HorizontalSum(acc[p]) * scale;
  }
}

// Columns in chunks of 8 registers held across all rows.
template <class L>
void Mix(const float* weights, const uint8_t* const* v_rows, int64_t n, int64_t head_dim,
         float* out) {
  constexpr int kRegs = 8;
  int64_t c0 = 0;
  for (; c0 + 8 <= head_dim; c0 += 8 * kRegs) {
    const int nr = static_cast<int>((head_dim - c0) / 8 < kRegs ? (head_dim - c0) / 8 : kRegs);
    __m256 acc[kRegs];
    for (int k = 0; k < kRegs; ++k) acc[k] = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; ++j) {
      PrefetchRowsAhead<L>(v_rows, j, 1, n, c0 * L::kBytes, 8 * nr * L::kBytes);
      const __m256 a = _mm256_broadcast_ss(weights + j);
      const uint8_t* v = v_rows[j] + c0 * L::kBytes;
      for (int k = 0; k < nr; ++k)
        acc[k] = _mm256_fmadd_ps(a, L::Load8(v + 8 * k * L::kBytes), acc[k]);
    }
    for (int k = 0; k < nr; ++k) _mm256_storeu_ps(out + c0 + 8 * k, acc[k]);
    if (nr < kRegs) {
      c0 += 8 * nr;
      break;
    }
  }
  MixTail<L>(weights, v_rows, n, c0, head_dim, out);
}

constexpr AttentionKernels kAvx2[2] = {{&Scores<F32Row>, &Mix<F32Row>},
                                       {&Scores<F16Row>, &Mix<F16Row>}};

}  // namespace

const AttentionKernels* Avx2AttentionKernels() { return kAvx2; }

}  // namespace thermocline::attention_internal
