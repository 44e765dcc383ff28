// Reference (scalar) conversion of rows between float and every supported tensor type.
// Quantization follows ggml's reference rounding so that our files match llama.cpp's bit for bit.
#pragma once

#include <cstdint>

#include "shared/model/ggml_type.h"

namespace thermocline {

// dst receives n floats. n must be a multiple of the type's block size.
void DequantizeRow(GgmlType type, const void* src, float* dst, int64_t n);
// dst receives RowBytes(type, n) bytes. n must be a multiple of the type's block size.
void QuantizeRow(GgmlType type, const float* src, void* dst, int64_t n);

}  // namespace thermocline
