// Reference (scalar) conversion of rows between float and every supported tensor type.
// Quantization follows ggml's reference rounding so that our files match llama.cpp's bit for bit.
#pragma once

#include <cstdint>

#include "shared/gguf/ggml_type.h"

namespace thermocline {

// Which types each direction handles: dequantization every weight type plus q8_K and i32;
// quantization f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_K..q6_K, iq4_nl, iq4_xs and i32
// (ggml's quantizers without importance matrix; bit for bit with llama.cpp's files for all but
// q4_1 / q5_0 / q5_1, for which no llama.cpp file is at hand). Anything reading types from a
// file or a flag checks these first.
bool HasDequantizer(GgmlType type);
bool HasQuantizer(GgmlType type);

// dst receives n floats. n must be a multiple of the type's block size; HasDequantizer(type).
void DequantizeRow(GgmlType type, const void* src, float* dst, int64_t n);
// dst receives RowBytes(type, n) bytes. n must be a multiple of the type's block size;
// HasQuantizer(type).
void QuantizeRow(GgmlType type, const float* src, void* dst, int64_t n);

// Activations for the K-quant and IQ4_XS dot products: n floats to n / 256 ggml block_q8_K
// (292 bytes: f32 d, int8 qs[256], int16 bsums[16]), ggml's quantize_row_q8_K_ref bit for bit
// (which llama.cpp's x86 CPU backend calls too): d = max / -127 for the value of largest
// magnitude, q = nearest_int(x * -127 / max) (ties to even) capped at 127, bsums the sums of
// each 16 q. An all-zero block gets d = 0 and zero quants and sums (ggml leaves its bsums
// unwritten; any value gives the same products since d = 0). Not a weight type: QuantizeRow
// does not take kQ8_K.
void QuantizeRowQ8_K(const float* src, uint8_t* dst, int64_t n);
inline constexpr int64_t kQ8KBlockBytes = 292;
// Activations for the q4_1 / q5_1 dot products: n floats to n / 32 ggml block_q8_1 (36 bytes:
// fp16 d, fp16 s, int8 qs[32]), ggml's quantize_row_q8_1_ref bit for bit: d and qs as Q8_0's
// reference (amax / 127, roundf), s = fp16(sum of qs * d) with the f32 d before its rounding.
void QuantizeRowQ8_1(const float* src, uint8_t* dst, int64_t n);
inline constexpr int64_t kQ8_1BlockBytes = 36;

// Sub-block j (0..7) of a Q4_K / Q5_K super-block: its 6-bit scale and min from the 12 packed
// bytes at `scales` (ggml's get_scale_min_k4). Shared with the SIMD kernels.
void Q4KScaleMin(const uint8_t* scales, int j, int* sc, int* m);
// Sub-block j (0..15) of a Q3_K super-block: its scale minus 32, from the 12 packed bytes.
int Q3KScale(const uint8_t* scales, int j);
// Sub-block j (0..7) of an IQ4_XS block: its scale minus 32.
int Iq4xsScale(const uint8_t* block, int j);

}  // namespace thermocline
