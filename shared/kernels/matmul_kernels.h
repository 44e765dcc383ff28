// Internal interface between matmul.cc (threading, activation quantization, dispatch) and the
// per-ISA kernel files (matmul_portable.cc, matmul_avx2.cc, *_avx512.cc). Not for use outside
// shared/kernels/ and its tests.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <utility>

#include "shared/gguf/ggml_type.h"
#include "shared/kernels/matmul.h"

namespace thermocline::matmul_internal {

// Rows of a weight matrix addressed either consecutively from `base` or through an id list
// (the sparse FFN gathers rows by neuron id).
struct RowSource {
  const uint8_t* base = nullptr;
  int64_t row_bytes = 0;
  const int32_t* ids = nullptr;  // nullptr: row i is base + i * row_bytes

  const uint8_t* row(int64_t i) const { return base + (ids != nullptr ? ids[i] : i) * row_bytes; }
};

// Kernels for one weight type at one SIMD level.
//
// Activation arithmetic, per type, as llama.cpp's CPU backend: the activations are rounded to
// 8 bits once per call and each block's product is an exact integer sum, scaled in f32 as
// ggml's vec_dot_<type>_<vec_dot_type> scales it.
//   q8_0, q4_0, q5_0, iq4_nl: Q8_0 activations (blocks of 32, ggml's reference rounding).
//   q2_K..q6_K, iq4_xs: Q8_K activations (blocks of 256, QuantizeRowQ8_K: ggml's
//     quantize_row_q8_K_ref); per super-block (d * xd) * I - (dmin * xd) * M with I the
//     sub-block-scaled integer sum and M the mins times the activation's bsums (K-quants with
//     mins), both exact int32.
//   q4_1, q5_1: Q8_1 activations (Q8_0's rounding plus s = fp16(d * sum q), QuantizeRowQ8_1);
//     per block (d_w * d_x) * I + m_w * s_x.
//   f32, f16, bf16: f32 activations.
// axpy (the sparse down_t path) multiplies f32 coefficients into rows: every block type but
// q8_0/q4_0 decodes its rows to the f32 values DequantizeRow gives and adds them exactly as the
// f32 kernel of the same family adds an f32 row.
struct TypeKernels {
  // y[t * y_stride + i] = dot(rows.row(i), x_t) for i < n_rows, t < n_tokens, where
  // x_t = x + t * x_stride bytes holds `cols` f32 values, or the prepared activations when the
  // type has prepare_input. Every (i, t) dot product is computed with the same sequence of
  // operations whatever the tile it falls in, so batching tokens never changes a result.
  // nullptr: no kernels for this type in this set.
  void (*dot)(const RowSource& rows, int64_t n_rows, int64_t cols, const uint8_t* x,
              int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride);
  // y[c] += sum_i coeffs[i] * rows.row(i)[c] for c < cols, rows added in order.
  void (*axpy)(const RowSource& rows, const float* coeffs, int64_t n_rows, int64_t cols, float* y);
  // One row converted to f32, bit-identical to DequantizeRow.
  void (*dequantize)(const uint8_t* row, int64_t cols, float* out);
  // Activations prepared once per call, in a layout of the set's own choosing: input_bytes(cols)
  // bytes per token, written by prepare_input. nullptr: dot reads the f32 activations.
  int64_t (*input_bytes)(int64_t cols) = nullptr;
  void (*prepare_input)(const float* x, int64_t cols, uint8_t* out) = nullptr;
};

// Type ids run from 0 to 39 (ggml_type.h); a set's table has a slot for each.
inline constexpr size_t kTypeSlots = 40;

using AxpyFn = void (*)(const RowSource& rows, const float* coeffs, int64_t n_rows, int64_t cols,
                        float* y);

// The integer axpy over Q4_0 rows (IntAxpyRows; q4_0_int_axpy{,_avx2,_avx512}.cc). Rows
// go in groups of kIntAxpyGroupRows, in order, the last one shorter. Per group and block b of
// 32 columns, with d_i the block's fp16 scale in row i and u_ic its unsigned nibbles:
//   a_i = coeffs[i] * f32(d_i); s = max |a_i| / 127 over the a_i that are not NaN (0 if none),
//   so that the maximum does not depend on the order the rows are taken in;
//   id = s >= 2^-100 ? 1 / s : 0;
//   q_i = nearbyint(a_i * id) (ties to even; a NaN gives 0), in [-127, 127] since
//   |a_i| * id <= 127 (1 + 2^-22) for finite a_i;
//   n_c = sum_i q_i * (u_ic - 8), an exact int32; y[c] = fma(s, f32(n_c), y[c]);
// groups in order. Every family performs exactly these operations: the same bits.
// Sixteen rows because the AVX2 kernel sums pairs of rows (maddubs, |pair| <= 2*15*127 = 3810)
// into int16 lanes: eight pairs stay below 32767.
inline constexpr int64_t kIntAxpyGroupRows = 16;
// Below it a block's products are dropped (they are under 2^-93 in all) rather than scaled by
// an id that 1 / s could overflow to infinity.
inline constexpr float kIntAxpyMinScale = 0x1p-100f;
void IntAxpyQ4_0Portable(const RowSource& rows, const float* coeffs, int64_t n_rows, int64_t cols,
                         float* y);
void IntAxpyQ4_0Avx2(const RowSource& rows, const float* coeffs, int64_t n_rows, int64_t cols,
                     float* y);
void IntAxpyQ4_0Avx512(const RowSource& rows, const float* coeffs, int64_t n_rows, int64_t cols,
                       float* y);
constexpr std::array<AxpyFn, kTypeSlots> IntAxpyTable(AxpyFn q4_0) {
  std::array<AxpyFn, kTypeSlots> table{};
  table[static_cast<size_t>(GgmlType::kQ4_0)] = q4_0;
  return table;
}

struct KernelSet {
  const char* name;
  std::array<TypeKernels, kTypeSlots> by_type;  // indexed by ggml type id
  // The Q8_0 activation quantization written as plain BlockQ8_0 (lets tests compare it with
  // QuantizeRow); bit-identical to QuantizeRow(kQ8_0) for finite input. (The Q8_K types'
  // prepare_input writes plain block_q8_K in every set, bit-identical to QuantizeRowQ8_K.)
  void (*quantize_q8_0)(const float* x, uint8_t* blocks, int64_t n);
  // Kernels over the 8-row interleaved layouts of MatrixView::interleaved (interleaved8.h), a
  // table of its own so that a view's layout, not its type alone, picks the kernel. Only dot,
  // input_bytes and prepare_input are set; dot's RowSource addresses groups (row_bytes: one
  // group's bytes, never ids), n_rows counts groups and group g writes y[t * y_stride + 8g + i]
  // for its rows i < 8.
  std::array<TypeKernels, kTypeSlots> interleaved8{};
  // IntAxpyRows (matmul.h) by type; nullptr where a type has none (every set has the same
  // types, so whether a product takes the integer form never depends on the family).
  std::array<AxpyFn, kTypeSlots> int_axpy{};

  bool HasIntAxpy(GgmlType type) const {
    const size_t i = static_cast<size_t>(type);
    return i < kTypeSlots && int_axpy[i] != nullptr;
  }

  bool HasInterleaved8(GgmlType type) const {
    const size_t i = static_cast<size_t>(type);
    return i < kTypeSlots && interleaved8[i].dot != nullptr;
  }
  bool Has(GgmlType type) const {
    const size_t i = static_cast<size_t>(type);
    return i < kTypeSlots && by_type[i].dot != nullptr;
  }
  const TypeKernels& For(GgmlType type) const {
    // Matrices are only built over weight types (loaders validate them, and a test checks that
    // every set covers every weight type); anything else is a programming error, stopped here
    // rather than computed as garbage.
    if (!Has(type)) std::abort();
    return by_type[static_cast<size_t>(type)];
  }
};

struct TypeEntry {
  GgmlType type;
  TypeKernels kernels;
};
template <size_t N>
constexpr std::array<TypeKernels, kTypeSlots> MakeTypeTable(const TypeEntry (&entries)[N]) {
  std::array<TypeKernels, kTypeSlots> table{};
  for (const TypeEntry& e : entries) table[static_cast<size_t>(e.type)] = e.kernels;
  return table;
}

// Q4_0, Q5_0 and Q8_0 in their interleaved layouts (legacy_x8.h; legacy_x8.cc,
// legacy_x8_avx2.cc, legacy_x8_avx512.cc). Activations, the same bytes for the three: per block
// the f32 of the fp16 Q8_0 scale, the int32 -o * sum(q) with o the type's offset
// (LegacyX8Offset: the kernels may multiply the weight quants as the unsigned bytes q_w + o, and
// this takes o back out), and the 32 quants (ggml's reference rounding, as every Q8_0 input). Per
// row and block the integer sum is exact and added as acc = fma(fl(d_w * d_x), sum, acc), blocks
// in order, in every family: portable, AVX2 and AVX-512 agree bit for bit.
inline constexpr int64_t kLegacyX8InputBlockBytes = 40;
constexpr int32_t LegacyX8Offset(GgmlType type) {
  return type == GgmlType::kQ4_0 ? 8 : type == GgmlType::kQ5_0 ? 16 : 128;
}
int64_t LegacyX8InputBytes(int64_t cols);
template <GgmlType kType>
void PrepareLegacyX8(const float* x, int64_t cols, uint8_t* out);
// The same bytes, rounded by the AVX2 set's Q8_0 quantizer (bit-identical to QuantizeRow).
template <GgmlType kType>
void PrepareLegacyX8Avx2(const float* x, int64_t cols, uint8_t* out);
// Writes the prepared form of n_blocks Q8_0 blocks (shared by both preparations).
void PackLegacyX8Input(const BlockQ8_0* q, int64_t n_blocks, int32_t offset, uint8_t* out);
template <GgmlType kType>
void DotLegacyX8Portable(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                         int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride);
// kVnni: the block sums by AVX-VNNI's vpdpbusd (the same integers).
template <GgmlType kType, bool kVnni>
void DotLegacyX8Avx2(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                     int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride);
template <GgmlType kType>
inline constexpr TypeKernels kLegacyX8Portable = {&DotLegacyX8Portable<kType>, nullptr, nullptr,
                                                  &LegacyX8InputBytes, &PrepareLegacyX8<kType>};
template <GgmlType kType, bool kVnni = false>
inline constexpr TypeKernels kLegacyX8Avx2 = {&DotLegacyX8Avx2<kType, kVnni>, nullptr, nullptr,
                                              &LegacyX8InputBytes, &PrepareLegacyX8Avx2<kType>};
// Q4_K in the interleaved layout (q4_kx8.cc, q4_kx8_avx2.cc). Activations: per super-block
// the 256 Q8_K quants (QuantizeRowQ8_K's rounding, as every Q8_K input), its f32 d and the 8
// int16 sums of each 32 quants (two of Q8_K's bsums each), which the mins meet; 288 bytes. Per
// row and super-block the integer sums I (quants times scales) and M (mins times sums) are
// exact int32 and added as acc = fma(fl(d * xd), fl(I), acc), then
// acc = fma(-fl(dmin * xd), fl(M), acc), super-blocks in order, in both families: portable and
// AVX2 agree bit for bit.
inline constexpr int64_t kQ4_Kx8InputBlockBytes = 288;
inline constexpr int64_t kQ4_Kx8InputDAt = 256;
inline constexpr int64_t kQ4_Kx8InputSumsAt = 260;
int64_t Q4_Kx8InputBytes(int64_t cols);
void PrepareQ4_Kx8(const float* x, int64_t cols, uint8_t* out);
// The same bytes, rounded by the AVX2 set's Q8_K quantizer (bit-identical to QuantizeRowQ8_K).
void PrepareQ4_Kx8Avx2(const float* x, int64_t cols, uint8_t* out);
// Writes the prepared form of n_blocks block_q8_K (shared by both preparations).
void PackQ4_Kx8Input(const uint8_t* q8k, int64_t n_blocks, uint8_t* out);
void DotQ4_Kx8Portable(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                       int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride);
void DotQ4_Kx8Avx2(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                   int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride);
inline constexpr TypeKernels kQ4_Kx8Portable = {&DotQ4_Kx8Portable, nullptr, nullptr,
                                                &Q4_Kx8InputBytes, &PrepareQ4_Kx8};
inline constexpr TypeKernels kQ4_Kx8Avx2 = {&DotQ4_Kx8Avx2, nullptr, nullptr, &Q4_Kx8InputBytes,
                                            &PrepareQ4_Kx8Avx2};
// Q5_K in its interleaved layout (q4_kx8.h): the same activations and arithmetic as Q4_K.
void DotQ5_Kx8Portable(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                       int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride);
void DotQ5_Kx8Avx2(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                   int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride);
inline constexpr TypeKernels kQ5_Kx8Portable = {&DotQ5_Kx8Portable, nullptr, nullptr,
                                                &Q4_Kx8InputBytes, &PrepareQ4_Kx8};
inline constexpr TypeKernels kQ5_Kx8Avx2 = {&DotQ5_Kx8Avx2, nullptr, nullptr, &Q4_Kx8InputBytes,
                                            &PrepareQ4_Kx8Avx2};

// Q6_K in the interleaved layout (q6_kx8.cc, q6_kx8_avx2.cc). Activations: plain block_q8_K
// (the row kernels' preparation; its bsums pairs are what the scale pairs meet). Per row and
// super-block I = sum_s sc_s * sum_{l in s} (q_l - 32) xq_l is an exact int32, added as
// acc = fma(fl(d * xd), fl(I), acc), super-blocks in order, in both families: portable and AVX2
// agree bit for bit.
int64_t Q6_Kx8InputBytes(int64_t cols);
void PrepareQ6_Kx8(const float* x, int64_t cols, uint8_t* out);
void PrepareQ6_Kx8Avx2(const float* x, int64_t cols, uint8_t* out);
void DotQ6_Kx8Portable(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                       int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride);
void DotQ6_Kx8Avx2(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                   int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride);
inline constexpr TypeKernels kQ6_Kx8Portable = {&DotQ6_Kx8Portable, nullptr, nullptr,
                                                &Q6_Kx8InputBytes, &PrepareQ6_Kx8};
inline constexpr TypeKernels kQ6_Kx8Avx2 = {&DotQ6_Kx8Avx2, nullptr, nullptr, &Q6_Kx8InputBytes,
                                            &PrepareQ6_Kx8Avx2};

// IQ4_XS in the interleaved layout (iq4_xsx8.cc, iq4_xsx8_avx2.cc): Q6_K's plain Q8_K
// activations; per row and super-block I = sum_s sc_s * sum_{l in s} value(q_l) xq_l, exact, added
// as Q6_K's I is, so every family gives the same bits.
void DotIq4_XSx8Portable(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                         int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride);
// kVnni: the sums by AVX-VNNI's vpdpbusd (the same integers).
template <bool kVnni>
void DotIq4_XSx8Avx2(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                     int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride);
inline constexpr TypeKernels kIq4_XSx8Portable = {&DotIq4_XSx8Portable, nullptr, nullptr,
                                                  &Q6_Kx8InputBytes, &PrepareQ6_Kx8};
template <bool kVnni = false>
inline constexpr TypeKernels kIq4_XSx8Avx2 = {&DotIq4_XSx8Avx2<kVnni>, nullptr, nullptr,
                                              &Q6_Kx8InputBytes, &PrepareQ6_Kx8Avx2};

// Q3_K in the interleaved layout (q3_kx8.cc, q3_kx8_avx2.cc): Q6_K's plain Q8_K activations;
// per row and super-block I = sum_s sc_s * sum_{l in s} (q_l - 4) xq_l, exact, added as Q6_K's I
// is, so every family gives the same bits.
void DotQ3_Kx8Portable(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                       int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride);
// kVnni: the sums by AVX-VNNI's vpdpbusd (the same integers).
template <bool kVnni>
void DotQ3_Kx8Avx2(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                   int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride);
inline constexpr TypeKernels kQ3_Kx8Portable = {&DotQ3_Kx8Portable, nullptr, nullptr,
                                                &Q6_Kx8InputBytes, &PrepareQ6_Kx8};
template <bool kVnni = false>
inline constexpr TypeKernels kQ3_Kx8Avx2 = {&DotQ3_Kx8Avx2<kVnni>, nullptr, nullptr,
                                            &Q6_Kx8InputBytes, &PrepareQ6_Kx8Avx2};

template <const TypeKernels& kQ4_0, const TypeKernels& kQ5_0, const TypeKernels& kQ8_0,
          const TypeKernels& kQ3_K, const TypeKernels& kQ4_K, const TypeKernels& kQ5_K,
          const TypeKernels& kQ6_K, const TypeKernels& kIQ4_XS>
constexpr std::array<TypeKernels, kTypeSlots> Interleaved8Table() {
  std::array<TypeKernels, kTypeSlots> table{};
  table[static_cast<size_t>(GgmlType::kQ4_0)] = kQ4_0;
  table[static_cast<size_t>(GgmlType::kQ5_0)] = kQ5_0;
  table[static_cast<size_t>(GgmlType::kQ8_0)] = kQ8_0;
  table[static_cast<size_t>(GgmlType::kQ3_K)] = kQ3_K;
  table[static_cast<size_t>(GgmlType::kQ4_K)] = kQ4_K;
  table[static_cast<size_t>(GgmlType::kQ5_K)] = kQ5_K;
  table[static_cast<size_t>(GgmlType::kQ6_K)] = kQ6_K;
  table[static_cast<size_t>(GgmlType::kIQ4_XS)] = kIQ4_XS;
  return table;
}

const KernelSet& PortableKernels();
// Only valid on a CPU with AVX2, FMA and F16C; with `vnni`, AVX-VNNI too (it only changes how
// the quantized kernels form their exact integer block sums, so results are bit-identical).
const KernelSet& Avx2Kernels(bool vnni);
bool CpuHasAvx2();
bool CpuHasAvxVnni();
// Only valid where CpuSimdLevel() is kAvx512 (avx512_set.cc assembles it from the
// *_avx512.cc files, each of which fills the slots it has kernels for).
const KernelSet& Avx512Kernels();
// Overwrite the set's Q2_K..Q6_K and IQ4_XS row-layout slots with AVX-512 kernels
// (kquant_avx512.cc).
void FillKQuantAvx512(KernelSet& set);
// The interleaved layouts' AVX-512 dot products (legacy_x8_avx512.cc, q4_kx8_avx512.cc,
// q6_kx8_avx512.cc: the avx2 kernels' bits, two groups per zmm) and the slots they fill
// (interleaved8_avx512.cc), with the AVX2 preparations.
template <GgmlType kType>
void DotLegacyX8Avx512(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                       int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride);
void DotQ4_Kx8Avx512(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                     int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride);
void DotQ5_Kx8Avx512(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                     int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride);
void DotQ6_Kx8Avx512(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                     int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride);
void DotQ3_Kx8Avx512(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                     int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride);
void DotIq4_XSx8Avx512(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                       int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride);
// With 16 or more tokens, through AMX tiles (legacy_x8_amx.cc, q4_kx8_amx.cc; only where
// AmxInt8Usable()): the same bits as the Dot*Avx512 kernels above (DotLegacyX8Avx512<kQ4_0> for
// Q4_0), which they call for the rest.
template <GgmlType kType>
void DotLegacyX8Amx(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                    int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride);
void DotQ4_Kx8Amx(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                  int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride);
void DotQ5_Kx8Amx(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                  int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride);
void FillInterleavedAvx512(KernelSet& set);
// Overwrite the avx512 set's slots of F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL
// (and its quantize_q8_0) with matmul_avx512.cc's kernels.
void FillRowAvx512(KernelSet& set);

// f32 value of every fp16 bit pattern (256 KiB, built on first use). A lookup is cheaper than
// the arithmetic conversion in portable code and than F16C's insert-convert-broadcast for a
// single scale in the AVX2 kernels; only entries of values that occur are ever touched.
const float* HalfToFloatTable();

// A block of rows sized to stay in L2 while every token tile passes over it, so that with many
// tokens each weight byte comes from memory once (the activations of a token tile stay in L1).
inline constexpr int64_t kRowBlockBytes = 256 << 10;

// How far ahead the tile drivers prefetch rows the hardware prefetcher cannot predict (gathered
// rows, the next row tile): the first whole tile of R rows at least this many bytes of rows on.
// Measured with gemv_bench's sparse kernels (25% of 4096-column rows, one thread, from DRAM):
// the tile right after the current one is too close for short rows (4 q4_K rows are 9 KiB,
// decoded in about a microsecond): axpy 21-29% of the read floor one tile ahead, 46-53% two
// and four tiles ahead (q4_K, q6_K; q8_0 73-77% either way).
inline constexpr int64_t kPrefetchAheadBytes = kGatherPrefetchAheadBytes;
inline constexpr int64_t PrefetchAheadRows(int R, int64_t row_bytes) {
  const int64_t tile = R * std::max<int64_t>(1, row_bytes);
  return R * std::max<int64_t>(1, (kPrefetchAheadBytes + tile - 1) / tile);
}

// Walks the n_rows x n_tokens output y (y[t * y_stride + i]) in tiles of at most R rows by T
// tokens and calls tile(row_ptrs, next_ptrs, n_tile_rows, n_tile_tokens, first_token, y_tile,
// y_tile_stride) for each; the tile writes its output for (row r, token t) to
// y_tile[t * y_tile_stride + r].
//
// One token tile (decode), contiguous rows: a tile takes row i of each of R equal slices of the
// range, not R neighbouring rows, so the kernel reads R long sequential streams, which the
// hardware prefetcher follows across pages, instead of R streams that end after one row (a row
// of 2048 f16 weights is one 4 KiB page, where the prefetcher starts over). Measured on one core
// from DRAM, f16 rows of 2048 columns: 20.2-20.5 GB/s against 15.8-16.0 for neighbouring rows,
// the 8-stream read floor at 23-24 (rows of 5504 columns: the same 19.3 either way). Which rows
// share a tile does not change any row's arithmetic: the output is the same bit for bit.
//
// Otherwise rows go in L2-sized blocks, all tokens per block; gathered rows (ids) and many tokens
// keep neighbouring rows. While the weights still come from memory (the first token tile)
// next_ptrs holds the R rows of a later row tile for the kernel to prefetch: the next tile for
// contiguous rows, for gathered (scattered) rows the first at least kPrefetchAheadBytes on,
// which hides DRAM latency. Elsewhere, and when no such tile is left, it is nullptr.
//
// kPrefetchStripes: in the striped tiles each stream also prefetches, as next_ptrs, the row that
// starts at least kStripeAheadBytes (a page) past the row it reads: the next row for rows of a
// page or more, a few rows on for shorter ones (the kernel's choice: K::kPrefetchStripes, see
// RunRowTiles). Within a row the prefetcher starts over at every page; measured on Zen 3, one
// thread, from DRAM: f16 at 4096 / 5504 columns 70-74% / 69% of the read floor without, 81-85% /
// 81% with; q8_0 55-58% / 59-60% without, 71% / 71-82% with; f32 87-91% / 86-87% without, 82-85%
// / 82-83% with (the prefetches cost it more than they save: it asks for no prefetch). A row of
// exactly one page (2048 f16 columns: q, k, v, o, gate and up of a 2048-wide model) starts a new
// page at every row, so it is prefetched too: on Intel (Emerald Rapids, one and two threads, from
// DRAM) f16 and bf16 at 2048 columns 78-79% -> 91-93% of the read floor. Shorter rows (a model
// narrower than 2048) were left to the hardware prefetcher until a page ahead was measured on
// Emerald Rapids: f16 at 257 columns 77% -> 93-95%, at 1024 columns 77-79% -> 88-98%, the
// row-layout q4_K / q6_K at 2048 columns 78% / 81% -> 89-95% / 90-93%, and a 1024-wide F16
// model's decode 0.77 -> 0.86-0.88 of its floor at one thread (docs/performance.md, "Rows
// shorter than a page").
inline constexpr int64_t kStripeAheadBytes = 4096;

template <int R, int T, bool kPrefetchStripes = false, class TileFn>
inline void ForEachTile(const RowSource& rows, int64_t n_rows, int64_t n_tokens, float* y,
                        int64_t y_stride, TileFn&& tile) {
  int64_t i = 0;
  if (n_tokens <= T && rows.ids == nullptr && R > 1 && n_rows >= 2 * R) {
    const int nt = static_cast<int>(n_tokens);
    const int64_t slice = n_rows / R;
    const int64_t d = std::max<int64_t>(
        1, (kStripeAheadBytes + rows.row_bytes - 1) / std::max<int64_t>(1, rows.row_bytes));
    float out[T * R];
    for (; i < slice; ++i) {
      const uint8_t* ptrs[R];
      const uint8_t* next[R];
      for (int k = 0; k < R; ++k) ptrs[k] = rows.row(k * slice + i);
      if (kPrefetchStripes) {
        for (int k = 0; k < R; ++k) next[k] = rows.row(k * slice + std::min(i + d, slice - 1));
      }
      tile(ptrs, kPrefetchStripes ? next : nullptr, R, nt, int64_t{0}, out, int64_t{R});
      for (int t = 0; t < nt; ++t) {
        for (int k = 0; k < R; ++k) y[t * y_stride + k * slice + i] = out[t * R + k];
      }
    }
    i = slice * R;  // the n_rows % R rows left go below, as neighbours
  }
  const int64_t first = i;
  // Contiguous rows (many tokens) keep the next tile: the hardware prefetcher follows them.
  const int64_t ahead = rows.ids != nullptr ? PrefetchAheadRows(R, rows.row_bytes) : R;
  int64_t block = n_rows - first;
  if (n_tokens > T) {
    block = std::max<int64_t>(R, kRowBlockBytes / std::max<int64_t>(1, rows.row_bytes) / R * R);
  }
  for (int64_t b0 = first; b0 < n_rows; b0 += block) {
    const int64_t b1 = std::min(n_rows, b0 + block);
    for (int64_t t0 = 0; t0 < n_tokens; t0 += T) {
      const int nt = static_cast<int>(std::min<int64_t>(T, n_tokens - t0));
      for (int64_t r = b0; r < b1; r += R) {
        const int nr = static_cast<int>(std::min<int64_t>(R, b1 - r));
        const uint8_t* ptrs[R];
        const uint8_t* next[R];
        for (int k = 0; k < nr; ++k) ptrs[k] = rows.row(r + k);
        const bool prefetch = t0 == 0 && r + ahead < n_rows;
        if (prefetch) {
          for (int k = 0; k < R; ++k) next[k] = rows.row(std::min(r + ahead + k, n_rows - 1));
        }
        tile(ptrs, prefetch ? next : nullptr, nr, nt, t0, y + t0 * y_stride + r, y_stride);
      }
    }
  }
}

// Drivers of the SIMD families' row kernels (matmul_avx2.cc, *_avx512.cc), over any kernel K
// with tiles K::Tile<R, T> (R <= K::kGemvRows for one token, R <= K::kRows and T <= K::kTokens
// otherwise) and axpy tiles K::AxpyTile<R> for R = 1 and 4. Each file instantiates them with its
// own kernels, compiled with its own flags.
//
// A tile: rows, the rows to prefetch meanwhile or nullptr (see ForEachTile), the columns, the
// tile's first token's activations and their stride, and its output y[t * y_stride + r].
using RowTileFn = void (*)(const uint8_t* const* rows, const uint8_t* const* next, int64_t cols,
                           const uint8_t* x, int64_t x_stride, float* y, int64_t y_stride);

template <class K, int kMaxR, int kMaxT, size_t... I>
constexpr std::array<RowTileFn, sizeof...(I)> MakeRowTileTable(std::index_sequence<I...>) {
  return {&K::template Tile<static_cast<int>(I) / kMaxT + 1, static_cast<int>(I) % kMaxT + 1>...};
}

// K::kPrefetchStripes, where K declares it (ForEachTile); false otherwise.
template <class K>
constexpr bool PrefetchStripes() {
  if constexpr (requires { K::kPrefetchStripes; }) {
    return K::kPrefetchStripes;
  } else {
    return false;
  }
}

template <class K, int kMaxR, int kMaxT>
void RunRowTiles(const RowSource& rows, int64_t n_rows, int64_t cols, const uint8_t* x,
                 int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  static constexpr auto kTable =
      MakeRowTileTable<K, kMaxR, kMaxT>(std::make_index_sequence<kMaxR * kMaxT>());
  ForEachTile<kMaxR, kMaxT, PrefetchStripes<K>()>(
      rows, n_rows, n_tokens, y, y_stride,
      [&](const uint8_t* const* w, const uint8_t* const* next, int nr, int nt, int64_t t0,
          float* yt, int64_t yt_stride) {
        kTable[(nr - 1) * kMaxT + (nt - 1)](w, next, cols, x + t0 * x_stride, x_stride, yt,
                                            yt_stride);
      });
}

// TypeKernels::dot through K's tiles.
template <class K>
void TiledDotRows(const RowSource& rows, int64_t n_rows, int64_t cols, const uint8_t* x,
                  int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  if (n_tokens == 1) {
    RunRowTiles<K, K::kGemvRows, 1>(rows, n_rows, cols, x, x_stride, 1, y, y_stride);
  } else {
    RunRowTiles<K, K::kRows, K::kTokens>(rows, n_rows, cols, x, x_stride, n_tokens, y, y_stride);
  }
}

// Rows per axpy tile: K::kAxpyRows where K declares it, else 4.
template <class K>
constexpr int AxpyRows() {
  if constexpr (requires { K::kAxpyRows; }) {
    return K::kAxpyRows;
  } else {
    return 4;
  }
}

// TypeKernels::axpy through K's axpy tiles. R rows per pass over y (AxpyRows: 4, or what K
// declares) keep y's loads and stores to 1/R of the FMAs, and make R streams of scattered rows
// at once; R rows at least kPrefetchAheadBytes on (scattered, for the sparse FFN and TEAL) are
// prefetched meanwhile. A tile adds its rows into y in order, so the grouping never changes a
// bit.
template <class K>
void TiledAxpyRows(const RowSource& rows, const float* coeffs, int64_t n_rows, int64_t cols,
                   float* y) {
  constexpr int kR = AxpyRows<K>();
  const int64_t ahead = PrefetchAheadRows(kR, rows.row_bytes);
  int64_t i = 0;
  for (; i + kR <= n_rows; i += kR) {
    const uint8_t* w[kR];
    const uint8_t* next[kR];
    for (int k = 0; k < kR; ++k) {
      w[k] = rows.row(i + k);
      next[k] = rows.row(std::min(i + ahead + k, n_rows - 1));
    }
    K::template AxpyTile<kR>(w, i + ahead < n_rows ? next : nullptr, coeffs + i, cols, y);
  }
  for (; i < n_rows; ++i) {
    const uint8_t* w[1] = {rows.row(i)};
    K::template AxpyTile<1>(w, nullptr, coeffs + i, cols, y);
  }
}

// Walks the groups x tokens of an interleaved product in tiles of one group by at most T tokens
// and calls tile(g, t0, n_tile_tokens) for each. With more tokens than one tile, groups go in
// L2-sized blocks that every token tile passes over, so each weight byte comes from memory once
// (as ForEachTile does for rows).
template <int T, class TileFn>
inline void ForEachGroupTile(const RowSource& groups, int64_t n_groups, int64_t n_tokens,
                             TileFn&& tile) {
  const int64_t block =
      n_tokens > T ? std::max<int64_t>(1, kRowBlockBytes / groups.row_bytes) : n_groups;
  for (int64_t g0 = 0; g0 < n_groups; g0 += block) {
    const int64_t g1 = std::min(n_groups, g0 + block);
    for (int64_t t0 = 0; t0 < n_tokens; t0 += T) {
      const int nt = static_cast<int>(std::min<int64_t>(T, n_tokens - t0));
      for (int64_t g = g0; g < g1; ++g) tile(g, t0, nt);
    }
  }
}

// A group tile of an interleaved kernel: y[t * y_stride + i] for the group's 8 rows i and the
// tile's tokens, from n_blocks blocks of the group and of each token's prepared activations.
using GroupTileFn = void (*)(const uint8_t* group, int64_t n_blocks, const uint8_t* x,
                             int64_t x_stride, float* y, int64_t y_stride);

// tiles[nt - 1] over every group of an interleaved product (8 rows each) and token tile of at
// most T tokens, as ForEachGroupTile walks them.
template <int T>
inline void RunGroupTiles(const GroupTileFn (&tiles)[T], const RowSource& groups, int64_t n_groups,
                          int64_t n_blocks, const uint8_t* x, int64_t x_stride, int64_t n_tokens,
                          float* y, int64_t y_stride) {
  constexpr int64_t kGroupRows = 8;
  ForEachGroupTile<T>(groups, n_groups, n_tokens, [&](int64_t g, int64_t t0, int nt) {
    tiles[nt - 1](groups.base + g * groups.row_bytes, n_blocks, x + t0 * x_stride, x_stride,
                  y + t0 * y_stride + g * kGroupRows, y_stride);
  });
}

}  // namespace thermocline::matmul_internal
