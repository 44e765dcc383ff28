// Every program refuses a bad THERMOCLINE_* switch at start, naming it (shared/util/
// env_switches.h), before it opens anything: with a good value the same command fails at its
// next step (the model path does not exist, the workers' instance is not there).
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

struct Program {
  std::vector<std::string> args;  // after the binary
  int exit_code;                  // for a bad environment
  std::string next_error;         // what it reports with a good one: its first step after
};

TEST(EnvSwitchesProcess, EveryProgramRefusesABadSwitchAtStart) {
  const std::string bin = testing::BinDir();
  const std::vector<std::pair<std::string, Program>> programs = {
      {"thermocline", {{"info", "/nonexistent.gguf"}, 2, "nonexistent.gguf"}},
      {"thermocline-gateway", {{"--model", "/nonexistent.gguf"}, 1, "nonexistent.gguf"}},
      // A worker's first step is to attach to its gateway's shared memory.
      {"thermocline-cpu-worker",
       {{"--instance", "envtest", "--model", "/nonexistent.gguf", "--hot-fraction", "0.5"},
        2,
        "instance 'envtest'"}},
      {"thermocline-gpu-worker",
       {{"--instance", "envtest", "--model", "/nonexistent.gguf", "--hot-fraction", "0.5"},
        2,
        "instance 'envtest'"}},
  };
  for (const auto& [name, p] : programs) {
    SCOPED_TRACE(name);
    auto run = [&](const std::string& env) {
      std::vector<std::string> argv = {"/usr/bin/env", env, bin + "/" + name};
      argv.insert(argv.end(), p.args.begin(), p.args.end());
      return testing::RunCommand(argv);
    };
    const testing::CommandResult bad = run("THERMOCLINE_NEURON_BUNDLES=false");
    const std::string said = bad.err + bad.out;
    EXPECT_EQ(bad.exit_code, p.exit_code) << said;
    EXPECT_NE(said.find("THERMOCLINE_NEURON_BUNDLES='false' must be 0"), std::string::npos) << said;
    // With a good value the same command goes on to its next step.
    const testing::CommandResult good = run("THERMOCLINE_NEURON_BUNDLES=0");
    const std::string good_said = good.err + good.out;
    EXPECT_NE(good.exit_code, 0);
    EXPECT_EQ(good_said.find("THERMOCLINE_NEURON_BUNDLES"), std::string::npos) << good_said;
    EXPECT_NE(good_said.find(p.next_error), std::string::npos) << good_said;
  }
}

}  // namespace
}  // namespace thermocline
