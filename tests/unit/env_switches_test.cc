// The THERMOCLINE_* switches (shared/util/env_switches.h): every switch takes unset, empty, 1
// (on) and 0 (off), and any other value is an error that names the variable; processes refuse it
// at start (tests/integration/env_switches_process_test.cc runs the programs).
#include "shared/util/env_switches.h"

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/util/startup_environment.h"

namespace thermocline {
namespace {

constexpr EnvSwitch kAll[] = {EnvSwitch::kRepack, EnvSwitch::kNeuronBundles, EnvSwitch::kHugePages,
                              EnvSwitch::kAmx};

// Restores the variables a test touches.
class EnvSwitchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (EnvSwitch s : kAll) Save(EnvSwitchName(s));
    Save("THERMOCLINE_SIMD");
    for (auto& [name, value] : saved_) unsetenv(name.c_str());
  }
  void TearDown() override {
    for (auto& [name, value] : saved_) {
      if (value) {
        setenv(name.c_str(), value->c_str(), 1);
      } else {
        unsetenv(name.c_str());
      }
    }
  }

 private:
  void Save(const char* name) {
    const char* v = std::getenv(name);
    saved_.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
  }
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST_F(EnvSwitchTest, UnsetEmptyAndOneAreOnZeroIsOff) {
  for (EnvSwitch s : kAll) {
    const char* name = EnvSwitchName(s);
    SCOPED_TRACE(name);
    unsetenv(name);
    EXPECT_EQ(ReadEnvSwitch(s).value_or(false), true);
    for (const char* v : {"", "1"}) {
      setenv(name, v, 1);
      EXPECT_EQ(ReadEnvSwitch(s).value_or(false), true) << "'" << v << "'";
    }
    setenv(name, "0", 1);
    EXPECT_EQ(ReadEnvSwitch(s).value_or(true), false);
    EXPECT_FALSE(EnvSwitchOn(s));
    EXPECT_TRUE(CheckEnvironmentSwitches().ok());
    unsetenv(name);
  }
}

TEST_F(EnvSwitchTest, OtherValuesAreErrorsThatNameTheVariable) {
  for (EnvSwitch s : kAll) {
    const char* name = EnvSwitchName(s);
    SCOPED_TRACE(name);
    for (const char* v : {"off", "false", "no", "2", " 0", "00"}) {
      setenv(name, v, 1);
      const absl::StatusOr<bool> on = ReadEnvSwitch(s);
      ASSERT_FALSE(on.ok()) << "'" << v << "'";
      EXPECT_EQ(on.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(on.status().message().find(std::string(name) + "='" + v + "'"), std::string::npos)
          << on.status();
      // Code past the start check takes a bad value as the default.
      EXPECT_TRUE(EnvSwitchOn(s));
      const absl::Status all = CheckEnvironmentSwitches();
      EXPECT_FALSE(all.ok());
      EXPECT_NE(all.message().find(name), std::string::npos) << all;
    }
    unsetenv(name);
  }
}

TEST_F(EnvSwitchTest, TheStartCheckNamesEveryBadVariableAndTheSimdLevel) {
  EXPECT_TRUE(CheckEnvironmentSwitches().ok());
  for (const char* level : {"", "portable", "avx2", "avx512"}) {
    setenv("THERMOCLINE_SIMD", level, 1);
    EXPECT_TRUE(CheckEnvironmentSwitches().ok()) << level;
  }
  setenv("THERMOCLINE_SIMD", "avx1024", 1);
  setenv("THERMOCLINE_HUGEPAGES", "off", 1);
  setenv("THERMOCLINE_REPACK", "0", 1);
  const absl::Status s = CheckEnvironmentSwitches();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("THERMOCLINE_SIMD='avx1024'"), std::string::npos) << s;
  EXPECT_NE(s.message().find("THERMOCLINE_HUGEPAGES='off'"), std::string::npos) << s;
  EXPECT_EQ(s.message().find("THERMOCLINE_REPACK"), std::string::npos) << s;
}

}  // namespace
}  // namespace thermocline
