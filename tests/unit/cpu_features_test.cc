// THERMOCLINE_SIMD caps the kernel level (shared/util/cpu_features.h): a level the CPU has is
// taken as asked, one above it or an unknown value falls back to what the CPU has.
#include "shared/util/cpu_features.h"

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace thermocline {
namespace {

class SimdEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* v = std::getenv("THERMOCLINE_SIMD");
    had_ = v != nullptr;
    if (had_) saved_ = v;
  }
  void TearDown() override {
    if (had_) {
      setenv("THERMOCLINE_SIMD", saved_.c_str(), 1);
    } else {
      unsetenv("THERMOCLINE_SIMD");
    }
  }
  static SimdLevel With(const char* value) {
    setenv("THERMOCLINE_SIMD", value, 1);
    return DetectSimdLevel();
  }

 private:
  bool had_ = false;
  std::string saved_;
};

TEST_F(SimdEnvTest, UnsetOrEmptyIsTheCpusLevel) {
  unsetenv("THERMOCLINE_SIMD");
  EXPECT_EQ(DetectSimdLevel(), CpuSimdLevel());
  EXPECT_EQ(With(""), CpuSimdLevel());
}

TEST_F(SimdEnvTest, EachLevelIsCappedByTheCpu) {
  for (SimdLevel asked : {SimdLevel::kPortable, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    const SimdLevel expected = asked <= CpuSimdLevel() ? asked : CpuSimdLevel();
    EXPECT_EQ(With(SimdLevelName(asked)), expected) << SimdLevelName(asked);
  }
}

TEST_F(SimdEnvTest, AnUnknownValueIsTheCpusLevel) {
  EXPECT_EQ(With("avx1024"), CpuSimdLevel());
  EXPECT_EQ(With("AVX2"), CpuSimdLevel());  // the names are lower case, as SimdLevelName gives
}

TEST(SimdLevelNameTest, NamesAreTheEnvironmentValues) {
  EXPECT_STREQ(SimdLevelName(SimdLevel::kPortable), "portable");
  EXPECT_STREQ(SimdLevelName(SimdLevel::kAvx2), "avx2");
  EXPECT_STREQ(SimdLevelName(SimdLevel::kAvx512), "avx512");
}

}  // namespace
}  // namespace thermocline
