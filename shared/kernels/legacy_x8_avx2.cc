// AVX2 dot product of Q4_0, Q5_0 and Q8_0 weights in their 8-row interleaved layouts
// (shared/gguf/legacy_x8.h) against the activations of PrepareLegacyX8Avx2.
//
// Why. The row-layout kernels (matmul_avx2.cc, e.g. Q4Shifted + MaddubsEngine) spend, per row and
// 32-column block: a broadcast load, the unpacking of the quants, maddubs, madd, the bias add, an
// int-to-float conversion, a scale broadcast, a multiply and an FMA, and a horizontal sum per row
// at the end: about 7 operations on the two vector ALU ports per row-block (Q4_0: 18 bytes).
// Here a group of 8 rows shares every step after the byte products: per block the unpacking
// gives the eight 32-byte planes, 8 maddubs against 4-byte activation broadcasts (loads, not
// shuffles) are summed to int32, then one bias add, one conversion, one F16C conversion of the
// 8 scales, one multiply and one FMA whose 8 lanes are the 8 rows; no horizontal sum. For Q4_0
// that is about 3.5 ALU operations per row-block instead of 7. Expected (before measuring): at
// one thread the row kernel is ALU-bound below the read floor (0.65-0.80 of it in the issue's
// measurements), so GEMV GB/s should rise by up to ~1.5x, capped by the floor; at two threads,
// where both kernels approach the floor, less. Q5_0 adds a shift, a mask and an or per plane for
// its fifth bits; Q8_0 (twice Q4_0's bytes per element) the sign trick per plane and token, which
// leaves it the row kernel's ALU operations at one token (measured: one-thread in-L2 GEMV
// 19-23 GB/s, the row kernel 20-24; 64-token GEMM 1.37x). With AVX-VNNI (the avx2+vnni set)
// every type's planes are the unsigned q_w + o and one vpdpbusd per plane and token replaces the
// maddubs, int16 adds and madds (Q8_0: in-L2 GEMV 28-30 GB/s, the VNNI row kernel 28; 64-token
// GEMM 1.75x it).
//
// Arithmetic. Per row the block sum is an exact int32 and acc = fma(fl(d_w * d_x), sum, acc)
// over the blocks in order, exactly as DotLegacyX8Portable: bit-identical to it. The row-layout
// kernels instead keep 8 partial lanes per row and sum them at the end, so the two differ by
// rounding only (the bound is derived in tests/unit/q4_0x8_test.cc).
#include <immintrin.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "shared/gguf/legacy_x8.h"
#include "shared/kernels/matmul_kernels.h"
#include "shared/kernels/prefetch_weights.h"
#include "shared/kernels/simd_avx2.h"

namespace thermocline::matmul_internal {
namespace {

using simd::Broadcast4;
using simd::Load32;

// Plane p's fifth bits, at bit 8j + p of each row's word, moved to bit 4 of byte j (shifts by a
// template constant: the immediate forms).
template <int p>
inline __m256i FifthBits(__m256i qh) {
  const __m256i bit4 = _mm256_set1_epi8(0x10);
  if constexpr (p < 4) return _mm256_and_si256(_mm256_slli_epi32(qh, 4 - p), bit4);
  if constexpr (p == 4) return _mm256_and_si256(qh, bit4);
  if constexpr (p > 4) return _mm256_and_si256(_mm256_srli_epi32(qh, p - 4), bit4);
}

template <GgmlType kType, int... p>
inline void OrFifthBits(const uint8_t* wb, __m256i (&u)[8], std::integer_sequence<int, p...>) {
  const __m256i qh = Load32(wb + LegacyX8Format<kType>::kQhAt);
  ((u[p] = _mm256_or_si256(u[p], FifthBits<p>(qh))), ...);
}

// The eight planes (legacy_x8.h) of a group's block as unsigned q_w + o. Q4_0: plane 2k the low
// nibbles of chunk k (elements 4k..), 2k + 1 its high nibbles (16 + 4k..). Q5_0: the same with the
// fifth bit at bit 4: plane p's bits sit at bit 8j + p of each row's word, one shift and mask away.
// Q8_0: chunk p with the sign bit flipped.
template <GgmlType kType>
inline void UnsignedPlanes(const uint8_t* wb, __m256i (&u)[8]) {
  using F = LegacyX8Format<kType>;
  if constexpr (kType == GgmlType::kQ8_0) {
    const __m256i sign = _mm256_set1_epi8(static_cast<char>(0x80));
    for (int p = 0; p < 8; ++p) u[p] = _mm256_xor_si256(Load32(wb + F::kChunksAt + 32 * p), sign);
  } else {
    const __m256i low = _mm256_set1_epi8(0x0F);
    for (int k = 0; k < 4; ++k) {
      const __m256i v = Load32(wb + F::kChunksAt + 32 * k);
      u[2 * k] = _mm256_and_si256(v, low);
      u[2 * k + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    }
    if constexpr (kType == GgmlType::kQ5_0) {
      OrFifthBits<kType>(wb, u, std::make_integer_sequence<int, 8>());
    }
  }
}

// The prepared block's int32 bias in every lane (a broadcasting load, as Broadcast4).
inline __m256i Bias(const uint8_t* xb) { return Broadcast4(xb + 4); }

// A group's block unpacked, and its 8 rows' exact int32 block sums against one token's block xb
// (the prepared [d][bias][32 quants]): one class per way of forming them.
template <GgmlType kType, bool kVnni>
struct Planes;

// AVX-VNNI, every type: one vpdpbusd per plane, in two chains of 4 (half the latency that bounds
// a one-token tile).
template <GgmlType kType>
struct Planes<kType, true> {
  using F = LegacyX8Format<kType>;
  __m256i u[8];

  explicit Planes(const uint8_t* wb) { UnsignedPlanes<kType>(wb, u); }

  __m256i Sum(const uint8_t* xb) const {
    const uint8_t* xq = xb + 8;
    __m256i s[2] = {Bias(xb), _mm256_setzero_si256()};
    for (int p = 0; p < 8; ++p) {
      s[p % 2] = simd::DpbusdVex(s[p % 2], u[p], Broadcast4(xq + F::PlaneElement(p)));
    }
    return _mm256_add_epi32(s[0], s[1]);
  }
};

// Q4_0: the 8 maddubs sum in int16 (at most 8 x 2 x 15 x 128 = 30720 < 2^15: exact). Q5_0's
// planes reach 31: four maddubs at most per int16 sum (4 x 2 x 31 x 128 = 31744 < 2^15), so
// two sums of four.
template <GgmlType kType>
struct Planes<kType, false> {
  using F = LegacyX8Format<kType>;
  __m256i u[8];

  explicit Planes(const uint8_t* wb) { UnsignedPlanes<kType>(wb, u); }

  __m256i Sum(const uint8_t* xb) const {
    constexpr int kPerSum = kType == GgmlType::kQ4_0 ? 8 : 4;
    const uint8_t* xq = xb + 8;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s32 = Bias(xb);
    for (int p0 = 0; p0 < 8; p0 += kPerSum) {
      __m256i s16 = _mm256_maddubs_epi16(u[p0], Broadcast4(xq + F::PlaneElement(p0)));
      for (int p = p0 + 1; p < p0 + kPerSum; ++p) {
        s16 =
            _mm256_add_epi16(s16, _mm256_maddubs_epi16(u[p], Broadcast4(xq + F::PlaneElement(p))));
      }
      s32 = _mm256_add_epi32(s32, _mm256_madd_epi16(s16, ones));
    }
    return s32;
  }
};

// Q8_0 without VNNI: signed planes. maddubs takes |q_w| (-128 too: 0x80 is 128 unsigned)
// against q_x with q_w's sign, at most 2 x 128 x 127 < 2^15 per int16, so each plane's pairs go
// to int32 at once; no offset, so the bias is not needed.
template <>
struct Planes<GgmlType::kQ8_0, false> {
  using F = LegacyX8Format<GgmlType::kQ8_0>;
  __m256i w[8], a[8];

  explicit Planes(const uint8_t* wb) {
    for (int k = 0; k < 8; ++k) {
      w[k] = Load32(wb + F::kChunksAt + 32 * k);
      a[k] = _mm256_abs_epi8(w[k]);
    }
  }

  __m256i Sum(const uint8_t* xb) const {
    const uint8_t* xq = xb + 8;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s32 = _mm256_setzero_si256();
    for (int k = 0; k < 8; ++k) {
      const __m256i x = _mm256_sign_epi8(Broadcast4(xq + 4 * k), w[k]);
      s32 = _mm256_add_epi32(s32, _mm256_madd_epi16(_mm256_maddubs_epi16(a[k], x), ones));
    }
    return s32;
  }
};

// A group's blocks are one sequential stream, which the hardware prefetcher alone does not keep
// far enough ahead at one thread: every 4 blocks the 4 blocks 16 ahead are prefetched.
// For Q4_0 (576 bytes, 9 lines per 4 blocks), in a standalone loop over 4 x 108 MiB (load ~2),
// that took the 1-thread DRAM GEMV from 12.2-12.6 to 16.6-18.4 GB/s (1152 and 4608 bytes ahead
// did no better). Past the matrix it is a harmless hint.
constexpr int64_t kPrefetchEvery = 4;

// Adds block b of one group to acc[t] for T tokens.
template <GgmlType kType, bool kVnni, int T>
inline void BlockStep(const uint8_t* group, int64_t b, const uint8_t* x, int64_t x_stride,
                      __m256* acc) {
  constexpr int64_t kBlockBytes = LegacyX8Format<kType>::kBlockBytes;
  const uint8_t* wb = group + b * kBlockBytes;
  if (b % kPrefetchEvery == 0) {
    for (int64_t at = 0; at < kPrefetchEvery * kBlockBytes; at += 64) {
      PrefetchWeights(wb + 16 * kBlockBytes + at);
    }
  }
  const __m256 wd = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb)));
  const Planes<kType, kVnni> planes(wb);
  for (int t = 0; t < T; ++t) {
    const uint8_t* xb = x + t * x_stride + b * kLegacyX8InputBlockBytes;
    const __m256i s32 = planes.Sum(xb);
    const __m256 scale = _mm256_mul_ps(wd, _mm256_broadcast_ss(reinterpret_cast<const float*>(xb)));
    acc[t] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(s32), acc[t]);
  }
}

// y[t * y_stride + i] for the group's 8 rows i and T tokens.
template <GgmlType kType, bool kVnni, int T>
void GroupTile(const uint8_t* group, int64_t n_blocks, const uint8_t* x, int64_t x_stride, float* y,
               int64_t y_stride) {
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n_blocks; ++b) BlockStep<kType, kVnni, T>(group, b, x, x_stride, acc);
  for (int t = 0; t < T; ++t) _mm256_storeu_ps(y + t * y_stride, acc[t]);
}

// Decode: two groups block by block, so that one thread reads two sequential streams at once
// (one stream per thread left DRAM bandwidth unused: see DotLegacyX8Avx2). Each group's blocks
// are added in the same order as GroupTile's, so the outputs are the same bits.
template <GgmlType kType, bool kVnni>
void GroupPairTile(const uint8_t* a, const uint8_t* b, int64_t n_blocks, const uint8_t* x,
                   float* ya, float* yb) {
  __m256 acc_a[1] = {_mm256_setzero_ps()}, acc_b[1] = {_mm256_setzero_ps()};
  for (int64_t k = 0; k < n_blocks; ++k) {
    BlockStep<kType, kVnni, 1>(a, k, x, 0, acc_a);
    BlockStep<kType, kVnni, 1>(b, k, x, 0, acc_b);
  }
  _mm256_storeu_ps(ya, acc_a[0]);
  _mm256_storeu_ps(yb, acc_b[0]);
}

template <GgmlType kType, bool kVnni>
constexpr GroupTileFn kGroupTiles[] = {&GroupTile<kType, kVnni, 1>, &GroupTile<kType, kVnni, 2>,
                                       &GroupTile<kType, kVnni, 3>, &GroupTile<kType, kVnni, 4>};

}  // namespace

template <GgmlType kType>
void PrepareLegacyX8Avx2(const float* x, int64_t cols, uint8_t* out) {
  // The row kernels' vectorized rounding: at decode the preparation is a visible share of a
  // small matrix's time (gemv_bench's in-L2 Q4_0 GEMV: 7.5 GB/s with the scalar QuantizeRow,
  // 21 GB/s with this, at load 6 on this machine).
  thread_local std::vector<BlockQ8_0> q;
  q.resize(cols / kQK);
  Avx2Kernels(false).quantize_q8_0(x, reinterpret_cast<uint8_t*>(q.data()), cols);
  PackLegacyX8Input(q.data(), cols / kQK, LegacyX8Offset(kType), out);
}

template <GgmlType kType, bool kVnni>
void DotLegacyX8Avx2(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                     int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  const int64_t n_blocks = cols / kQK;
  int64_t first = 0;
  if (n_tokens == 1 && n_groups >= 2) {
    // Group i with group i + half: two streams half the range apart.
    const int64_t half = n_groups / 2;
    for (int64_t g = 0; g < half; ++g) {
      GroupPairTile<kType, kVnni>(groups.base + g * groups.row_bytes,
                                  groups.base + (g + half) * groups.row_bytes, n_blocks, x,
                                  y + g * kLegacyX8Rows, y + (g + half) * kLegacyX8Rows);
    }
    first = 2 * half;
  }
  const RowSource rest{groups.base + first * groups.row_bytes, groups.row_bytes, nullptr};
  RunGroupTiles(kGroupTiles<kType, kVnni>, rest, n_groups - first, n_blocks, x, x_stride, n_tokens,
                y + first * kLegacyX8Rows, y_stride);
}

#define THERMOCLINE_LEGACY_X8(T)                                                              \
  template void PrepareLegacyX8Avx2<T>(const float*, int64_t, uint8_t*);                      \
  template void DotLegacyX8Avx2<T, false>(const RowSource&, int64_t, int64_t, const uint8_t*, \
                                          int64_t, int64_t, float*, int64_t);                 \
  template void DotLegacyX8Avx2<T, true>(const RowSource&, int64_t, int64_t, const uint8_t*,  \
                                         int64_t, int64_t, float*, int64_t);
THERMOCLINE_LEGACY_X8(GgmlType::kQ4_0)
THERMOCLINE_LEGACY_X8(GgmlType::kQ5_0)
THERMOCLINE_LEGACY_X8(GgmlType::kQ8_0)
#undef THERMOCLINE_LEGACY_X8

}  // namespace thermocline::matmul_internal
