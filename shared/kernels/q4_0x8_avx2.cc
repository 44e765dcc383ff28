// AVX2 dot product of Q4_0 weights in the 8-row interleaved layout (shared/gguf/q4_0x8.h)
// against the activations of PrepareQ4_0x8 (q4_0x8.cc).
//
// Why. The row-layout kernel (matmul_avx2.cc, Q4Shifted + MaddubsEngine) spends, per row and
// 32-column block (18 bytes): a broadcast load, a shift and a mask to split the nibbles, maddubs,
// madd, the bias add, an int-to-float conversion, a scale broadcast, a multiply and an FMA, and
// a horizontal sum per row at the end: about 7 operations on the two vector ALU ports per 18
// bytes. Here a group of 8 rows shares every step after the byte products: per block (144
// bytes) 4 loads and 8 masks/shifts give the 8 nibble registers, 8 maddubs against 4-byte
// activation broadcasts (loads, not shuffles) summed in int16 (at most 8 x 2 x 15 x 127 = 30480,
// exact), one madd to int32, one bias add, one conversion, one F16C conversion of the 8 scales,
// one multiply and one FMA whose 8 lanes are the 8 rows; no horizontal sum. That is about 3.5
// ALU operations per row-block instead of 7. Expected (before measuring): at one thread the
// row kernel is ALU-bound below the read floor (0.65-0.80 of it in the measurements),
// so GEMV GB/s should rise by up to ~1.5x, capped by the floor; at two threads, where both
// kernels approach the floor, less.
//
// Arithmetic. Per row the block sum is an exact int32 and acc = fma(fl(d_w * d_x), sum, acc)
// over the blocks in order, exactly as DotQ4_0x8Portable: bit-identical to it. The row-layout
// kernel instead keeps 8 partial lanes per row and sums them at the end, so the two differ by
// rounding only (the bound is derived in tests/unit/q4_0x8_test.cc).
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "shared/gguf/q4_0x8.h"
#include "shared/kernels/matmul_kernels.h"

namespace thermocline::matmul_internal {
namespace {

// A group's blocks are one sequential stream, which the hardware prefetcher alone does not keep
// far enough ahead at one thread: every 4 blocks (576 bytes, 9 lines) the 4 blocks 16 ahead are
// prefetched into L2. In a standalone loop over 4 x 108 MiB (load ~2) that took the 1-thread
// DRAM GEMV from 12.2-12.6 to 16.6-18.4 GB/s (1152 and 4608 bytes ahead did no better). Past
// the matrix it is a harmless hint.
constexpr int64_t kPrefetchEvery = 4;
constexpr int64_t kPrefetchAhead = 16 * kQ4_0x8BlockBytes;

inline __m256i Broadcast4(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Adds block b of one group to acc[t] for T tokens.
template <int T>
inline void BlockStep(const uint8_t* group, int64_t b, const uint8_t* x, int64_t x_stride,
                      __m256* acc) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  const uint8_t* wb = group + b * kQ4_0x8BlockBytes;
  if (b % kPrefetchEvery == 0) {
    for (int64_t at = 0; at < kPrefetchEvery * kQ4_0x8BlockBytes; at += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(wb + kPrefetchAhead + at), _MM_HINT_T1);
    }
  }
  const __m256 wd = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb)));
  __m256i lo[4], hi[4];
  for (int k = 0; k < 4; ++k) {
    const __m256i v =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + kQ4_0x8ScaleBytes + 32 * k));
    lo[k] = _mm256_and_si256(v, low);
    hi[k] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
  }
  for (int t = 0; t < T; ++t) {
    const uint8_t* xb = x + t * x_stride + b * kQ4_0x8InputBlockBytes;
    const uint8_t* xq = xb + 8;
    __m256i s16 = _mm256_maddubs_epi16(lo[0], Broadcast4(xq));
    s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(hi[0], Broadcast4(xq + 16)));
    for (int k = 1; k < 4; ++k) {
      s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(lo[k], Broadcast4(xq + 4 * k)));
      s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(hi[k], Broadcast4(xq + 16 + 4 * k)));
    }
    int32_t bias;
    std::memcpy(&bias, xb + 4, 4);
    const __m256i s32 = _mm256_add_epi32(_mm256_madd_epi16(s16, ones), _mm256_set1_epi32(bias));
    const __m256 scale = _mm256_mul_ps(wd, _mm256_broadcast_ss(reinterpret_cast<const float*>(xb)));
    acc[t] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(s32), acc[t]);
  }
}

// y[t * y_stride + i] for the group's 8 rows i and T tokens.
template <int T>
void GroupTile(const uint8_t* group, int64_t n_blocks, const uint8_t* x, int64_t x_stride,
               float* y, int64_t y_stride) {
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n_blocks; ++b) BlockStep<T>(group, b, x, x_stride, acc);
  for (int t = 0; t < T; ++t) _mm256_storeu_ps(y + t * y_stride, acc[t]);
}

// Decode: two groups block by block, so that one thread reads two sequential streams at once
// (one stream per thread left DRAM bandwidth unused: see DotQ4_0x8Avx2). Each group's blocks
// are added in the same order as GroupTile's, so the outputs are the same bits.
void GroupPairTile(const uint8_t* a, const uint8_t* b, int64_t n_blocks, const uint8_t* x,
                   float* ya, float* yb) {
  __m256 acc_a[1] = {_mm256_setzero_ps()}, acc_b[1] = {_mm256_setzero_ps()};
  for (int64_t k = 0; k < n_blocks; ++k) {
    BlockStep<1>(a, k, x, 0, acc_a);
    BlockStep<1>(b, k, x, 0, acc_b);
  }
  _mm256_storeu_ps(ya, acc_a[0]);
  _mm256_storeu_ps(yb, acc_b[0]);
}

using GroupFn = void (*)(const uint8_t*, int64_t, const uint8_t*, int64_t, float*, int64_t);
constexpr int kMaxTokens = 4;
constexpr GroupFn kGroupTiles[kMaxTokens] = {&GroupTile<1>, &GroupTile<2>, &GroupTile<3>,
                                             &GroupTile<4>};

}  // namespace

void PrepareQ4_0x8Avx2(const float* x, int64_t cols, uint8_t* out) {
  // The row kernels' vectorized rounding: at decode the preparation is a visible share of a
  // small matrix's time (gemv_bench's in-L2 GEMV: 7.5 GB/s with the scalar QuantizeRow, 21 GB/s
  // with this, at load 6 on this machine).
  thread_local std::vector<BlockQ8_0> q;
  q.resize(cols / kQK);
  Avx2Kernels(false).quantize_q8_0(x, reinterpret_cast<uint8_t*>(q.data()), cols);
  PackQ4_0x8Input(q.data(), cols / kQK, out);
}

void DotQ4_0x8Avx2(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                   int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  const int64_t n_blocks = cols / kQK;
  int64_t first = 0;
  if (n_tokens == 1 && n_groups >= 2) {
    // Group i with group i + half: two streams half the range apart.
    const int64_t half = n_groups / 2;
    for (int64_t g = 0; g < half; ++g) {
      GroupPairTile(groups.base + g * groups.row_bytes, groups.base + (g + half) * groups.row_bytes,
                    n_blocks, x, y + g * kQ4_0x8Rows, y + (g + half) * kQ4_0x8Rows);
    }
    first = 2 * half;
  }
  const RowSource rest{groups.base + first * groups.row_bytes, groups.row_bytes, nullptr};
  ForEachGroupTile<kMaxTokens>(rest, n_groups - first, n_tokens,
                               [&](int64_t g, int64_t t0, int nt) {
    kGroupTiles[nt - 1](rest.base + g * rest.row_bytes, n_blocks, x + t0 * x_stride, x_stride,
                        y + t0 * y_stride + (first + g) * kQ4_0x8Rows, y_stride);
  });
}

}  // namespace thermocline::matmul_internal
