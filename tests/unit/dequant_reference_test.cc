// Dequantization of every quantized weight type against references that Thermocline did not
// compute: ../shared/models/quants/dequant/ holds one tensor per type exactly as llama-quantize
// stored it and its dequantization by gguf-py (equal to ggml's to_float, bit for bit). The
// legacy types without reference tensors (q4_1, q5_0, q5_1) are checked on blocks whose values
// follow from the format by hand.
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "shared/gguf/ggml_type.h"
#include "shared/gguf/quant.h"
#include "shared/util/fp16.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

using testing::ModelPath;

TEST(DequantReferenceTest, EveryStoredTypeIsBitExact) {
  const std::string dir = ModelPath("quants/dequant");
  const nlohmann::json index = nlohmann::json::parse(testing::ReadFileOrDie(dir + "/index.json"));
  ASSERT_TRUE(index.is_array());
  int checked = 0;
  for (const nlohmann::json& e : index) {
    const std::string name = e.at("type").get<std::string>();
    const uint32_t id = e.at("type_id").get<uint32_t>();
    const auto traits = TypeTraits(id);
    ASSERT_TRUE(traits.has_value()) << name;
    EXPECT_EQ(traits->block_size, e.at("block_size").get<int64_t>()) << name;
    EXPECT_EQ(traits->block_bytes, e.at("type_size").get<int64_t>()) << name;
    if (!HasDequantizer(traits->type)) continue;  // i-quants with grids (iq3_xxs, iq3_s)
    const int64_t cols = e.at("ne")[0].get<int64_t>(), rows = e.at("ne")[1].get<int64_t>();
    const std::string base = dir + "/" + name + "." + e.at("tensor").get<std::string>();
    const std::string raw = testing::ReadFileOrDie(base + ".raw");
    const std::vector<float> want = testing::ReadF32File(base + ".f32");
    ASSERT_EQ(static_cast<int64_t>(raw.size()), rows * RowBytes(traits->type, cols)) << name;
    ASSERT_EQ(static_cast<int64_t>(want.size()), rows * cols) << name;
    // Row by row from an odd address (alignment-1 files), as the engine reads them.
    std::vector<uint8_t> bytes(raw.size() + 1);
    std::memcpy(bytes.data() + 1, raw.data(), raw.size());
    std::vector<float> got(rows * cols);
    const int64_t rb = RowBytes(traits->type, cols);
    for (int64_t r = 0; r < rows; ++r) {
      DequantizeRow(traits->type, bytes.data() + 1 + r * rb, got.data() + r * cols, cols);
    }
    int64_t differ = 0, first = -1;
    for (int64_t i = 0; i < rows * cols; ++i) {
      if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
        if (first < 0) first = i;
        ++differ;
      }
    }
    EXPECT_EQ(differ, 0) << name << ": " << differ << " of " << rows * cols
                         << " values differ; first at " << first << ": " << got[first] << " vs "
                         << want[first];
    ++checked;
  }
  // q2_K..q6_K, q8_0, q4_0, iq4_nl, iq4_xs.
  EXPECT_EQ(checked, 9);
}

void PutHalf(uint8_t* p, float v) {
  const uint16_t h = Fp32ToFp16(v);
  std::memcpy(p, &h, 2);
}

// One block of each legacy type with nibbles q_j = j % 16 and, for the 5-bit types, bit 4 set
// on odd j: every element's value is then known from the format alone.
TEST(DequantReferenceTest, LegacyTypesByHand) {
  struct Case {
    GgmlType type;
    bool has_min, has_high;
  };
  for (const Case& c : {Case{GgmlType::kQ4_1, true, false}, Case{GgmlType::kQ5_0, false, true},
                        Case{GgmlType::kQ5_1, true, true}}) {
    const GgmlTypeTraits& t = TypeTraits(c.type);
    std::vector<uint8_t> b(t.block_bytes, 0);
    PutHalf(b.data(), 0.5f);
    if (c.has_min) PutHalf(b.data() + 2, -3.0f);
    const int qh_at = c.has_min ? 4 : 2;
    const int qs_at = qh_at + (c.has_high ? 4 : 0);
    if (c.has_high) {
      const uint32_t qh = 0xAAAAAAAAu;  // odd j
      std::memcpy(b.data() + qh_at, &qh, 4);
    }
    for (int j = 0; j < 16; ++j) {
      const int lo = j % 16, hi = (j + 16) % 16;
      b[qs_at + j] = static_cast<uint8_t>(lo | (hi << 4));
    }
    std::vector<float> y(32);
    DequantizeRow(c.type, b.data(), y.data(), 32);
    for (int j = 0; j < 32; ++j) {
      int q = j % 16;
      if (c.has_high && j % 2 == 1) q += 16;
      float want;
      if (c.has_min) {
        want = 0.5f * q - 3.0f;
      } else {
        want = 0.5f * (q - 16);
      }
      EXPECT_EQ(y[j], want) << t.name << " j=" << j;
    }
  }
}

}  // namespace
}  // namespace thermocline
