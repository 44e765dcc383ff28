// ParseLogfmtLine against the writer it inverts (FormatLogLine): every byte value survives a
// round trip through quoting and escapes; lines a writer could not have produced are refused.
// Also the gpu worker's --device-memory line, which a default placement reads.
#include "shared/util/logfmt.h"

#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "shared/driver/default_placement.h"

namespace thermocline {
namespace {

using Fields = std::vector<std::pair<std::string, std::string>>;

TEST(LogfmtTest, EveryValueSurvivesARoundTrip) {
  std::mt19937 rng(7);
  const std::vector<std::string> fixed = {"",     "plain", "two words", "a=b",  "\"q\"",
                                          "back\\slash", "tab\there", "nl\n", "\x01\x7f", "é ✓"};
  for (int trial = 0; trial < 500; ++trial) {
    std::string a, b;
    if (trial < static_cast<int>(fixed.size())) {
      a = fixed[trial];
    } else {
      const int n = static_cast<int>(rng() % 12);
      for (int i = 0; i < n; ++i) a += static_cast<char>(rng() % 256);
    }
    for (int i = 0; i < 3; ++i) b += static_cast<char>(' ' + rng() % 95);
    const std::string line =
        FormatLogLine("2026-12-01T00:00:00.000000Z", Level::kWarn, "gpu_worker", "ev",
                      {{"a", a}, {"b", b}, {"n", 42}});
    const auto parsed = ParseLogfmtLine(line);
    ASSERT_TRUE(parsed.has_value()) << line;
    const Fields want = {{"ts", "2026-12-01T00:00:00.000000Z"}, {"level", "warn"},
                         {"component", "gpu_worker"},          {"event", "ev"},
                         {"a", a},                             {"b", b},
                         {"n", "42"}};
    EXPECT_EQ(*parsed, want) << line;
  }
}

TEST(LogfmtTest, LinesNoWriterProducesAreRefused) {
  for (const char* bad : {"key", "=v", "a=\"open", "a=\"x\"y", "a=\"bad\\q\"", "a=\"\\x4\"",
                          "a=\"\\xzz\"", "a=x\"y", "a=b=c", "a=\"x\\"}) {
    EXPECT_FALSE(ParseLogfmtLine(bad).has_value()) << bad;
  }
  const auto empty = ParseLogfmtLine("  ");
  ASSERT_TRUE(empty.has_value());
  EXPECT_TRUE(empty->empty());
}

TEST(LogfmtTest, DeviceMemoryLine) {
  const std::string line =
      FormatLogLine("t", Level::kInfo, "gpu_worker", "device_memory",
                    {{"device", 0}, {"name", "NVIDIA H200"}, {"free_bytes", 1000LL},
                     {"total_bytes", 4000LL}});
  absl::StatusOr<driver::DeviceMemory> m = driver::ParseDeviceMemoryLine(line);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->name, "NVIDIA H200");
  EXPECT_EQ(m->free_bytes, 1000);
  EXPECT_EQ(m->total_bytes, 4000);
  for (const std::string& bad :
       {FormatLogLine("t", Level::kInfo, "gpu_worker", "ready", {{"free_bytes", 1}}),
        FormatLogLine("t", Level::kInfo, "gpu_worker", "device_memory", {{"free_bytes", 1}}),
        FormatLogLine("t", Level::kInfo, "gpu_worker", "device_memory",
                      {{"free_bytes", "-5"}, {"total_bytes", 9}}),
        FormatLogLine("t", Level::kInfo, "gpu_worker", "device_memory",
                      {{"free_bytes", 10}, {"total_bytes", 9}}),
        FormatLogLine("t", Level::kInfo, "gpu_worker", "device_memory",
                      {{"free_bytes", "lots"}, {"total_bytes", 9}}),
        std::string("not logfmt \"")}) {
    EXPECT_FALSE(driver::ParseDeviceMemoryLine(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace thermocline
