// The CUDA hot FFN's element decoders (gpu_worker/cuda/block_decode.h) on the host, against
// shared/gguf's DequantizeRow: every element of random rows of every block type the device reads,
// bit for bit. The same header is compiled by nvcc for the device kernels, so what is checked
// here is the decoders' arithmetic; the kernels around them are tests/gpu/cuda_kernels_test.cc's.
// The fp16 conversion is checked on all 65536 values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_worker/cuda/block_decode.h"
#include "shared/gguf/ggml_type.h"
#include "shared/gguf/quant.h"
#include "shared/util/fp16.h"

namespace thermocline::gpu_worker::cuda::blocks {
namespace {

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

TEST(CudaBlockDecode, HalfToFloatMatchesFp16ToFp32OnEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float want = Fp16ToFp32(static_cast<uint16_t>(h));
    const float got = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << h;
    } else {
      EXPECT_EQ(Bits(got), Bits(want)) << h;
    }
  }
}

// Random blocks whose fp16 scales (at `scale_at` within each block) are finite: random bytes
// everywhere else, so every quant value, sub-scale and high bit occurs.
template <class D>
void CheckType(GgmlType type, std::initializer_list<int> scale_at) {
  SCOPED_TRACE(std::string(TypeTraits(type).name));
  ASSERT_EQ(TypeTraits(type).block_size, D::kBlockElems);
  ASSERT_EQ(TypeTraits(type).block_bytes, D::kBlockBytes);
  const int64_t blocks = 24, cols = blocks * D::kBlockElems;
  std::mt19937 rng(static_cast<uint32_t>(type) * 7919u + 1u);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(-2.0f, 2.0f);
  std::vector<uint8_t> row(blocks * D::kBlockBytes);
  for (uint8_t& b : row) b = static_cast<uint8_t>(byte(rng));
  for (int64_t k = 0; k < blocks; ++k) {
    for (int at : scale_at) {
      const uint16_t h = Fp32ToFp16(scale(rng));
      row[k * D::kBlockBytes + at] = static_cast<uint8_t>(h & 0xFF);
      row[k * D::kBlockBytes + at + 1] = static_cast<uint8_t>(h >> 8);
    }
  }
  std::vector<float> want(cols);
  DequantizeRow(type, row.data(), want.data(), cols);
  for (int64_t c = 0; c < cols; ++c) {
    ASSERT_EQ(Bits(D::Element(row.data(), c)), Bits(want[c])) << "element " << c;
  }
}

TEST(CudaBlockDecode, EveryTypeMatchesDequantizeRowBitForBit) {
  CheckType<Q8_0>(GgmlType::kQ8_0, {0});
  CheckType<Q4_0>(GgmlType::kQ4_0, {0});
  CheckType<Q4_1>(GgmlType::kQ4_1, {0, 2});
  CheckType<Q5_0>(GgmlType::kQ5_0, {0});
  CheckType<Q5_1>(GgmlType::kQ5_1, {0, 2});
  CheckType<Q2_K>(GgmlType::kQ2_K, {80, 82});
  CheckType<Q3_K>(GgmlType::kQ3_K, {108});
  CheckType<Q4_K>(GgmlType::kQ4_K, {0, 2});
  CheckType<Q5_K>(GgmlType::kQ5_K, {0, 2});
  CheckType<Q6_K>(GgmlType::kQ6_K, {208});
  CheckType<IQ4_NL>(GgmlType::kIQ4_NL, {0});
  CheckType<IQ4_XS>(GgmlType::kIQ4_XS, {0});
}

}  // namespace
}  // namespace thermocline::gpu_worker::cuda::blocks
