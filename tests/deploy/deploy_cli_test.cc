// What a newcomer types first: --version on every binary; the flags the deployment files and
// docs give each binary are flags that binary takes; the gateway's defaults (no placement
// flag: the whole FFN hot on the host backend) and --numa-node, which the docs use; a plan made
// for another KV cache than the gateway's is refused naming both.
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "shared/model/model.h"
#include "shared/sparsity/placement.h"
#include "tests/e2e/gateway_harness.h"

namespace thermocline::testing {
namespace {

std::string SourceFile(const std::string& rel) {
  return ReadFileOrDie(absl::StrCat(THERMOCLINE_SOURCE_DIR, "/", rel));
}

std::set<std::string> FlagsIn(const std::string& text) {
  std::set<std::string> out;
  const std::regex flag("--[a-z][a-z0-9-]*");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), flag); it != std::sregex_iterator();
       ++it) {
    out.insert(it->str());
  }
  return out;
}

TEST(DeployCli, EveryBinaryPrintsItsVersion) {
  for (const std::string name : {"thermocline", "thermocline-gateway", "thermocline-gpu-worker",
                                 "thermocline-cpu-worker"}) {
    const CommandResult r = RunCommand({absl::StrCat(BinDir(), "/", name), "--version"});
    EXPECT_EQ(r.exit_code, 0) << name << ": " << r.err;
    EXPECT_TRUE(std::regex_match(r.out, std::regex(name + " [0-9]+\\.[0-9]+\\.[0-9]+\n")))
        << name << " printed '" << r.out << "'";
  }
}

// Every flag deploy/thermocline.env.example hands a binary (in a variable, or suggested in the
// comment above it) is one that binary's --help lists: a unit never starts with a flag it
// refuses.
TEST(DeployCli, FlagsOfTheExampleConfigurationExist) {
  std::map<std::string, std::string> help;
  for (const std::string name : {"thermocline-gateway", "thermocline-gpu-worker",
                                 "thermocline-cpu-worker"}) {
    const CommandResult r = RunCommand({absl::StrCat(BinDir(), "/", name), "--help"});
    ASSERT_EQ(r.exit_code, 0) << name;
    help[name] = r.out;
  }
  // Which binary reads each variable (THERMOCLINE_PLACEMENT goes to all three).
  const std::map<std::string, std::vector<std::string>> readers = {
      {"THERMOCLINE_PLACEMENT", {"thermocline-gateway", "thermocline-gpu-worker", "thermocline-cpu-worker"}},
      {"THERMOCLINE_GATEWAY_ARGS", {"thermocline-gateway"}},
      {"THERMOCLINE_SPAWN_ARGS", {"thermocline-gateway"}},
      {"THERMOCLINE_GPU_WORKER_ARGS", {"thermocline-gpu-worker"}},
      {"THERMOCLINE_CPU_WORKER_ARGS", {"thermocline-cpu-worker"}}};
  std::istringstream lines(SourceFile("deploy/thermocline.env.example"));
  std::string line, comments;
  int checked = 0;
  while (std::getline(lines, line)) {
    if (line.rfind("#", 0) == 0) {
      comments += line + "\n";
      continue;
    }
    const size_t eq = line.find('=');
    if (eq == std::string::npos) {
      comments.clear();
      continue;
    }
    const auto it = readers.find(line.substr(0, eq));
    if (it != readers.end()) {
      // The comments above the workers' variables talk about the gateway's flags; the others
      // list more flags for the same variable.
      const bool worker_vars = it->first.find("WORKER") != std::string::npos;
      for (const std::string& flag :
           FlagsIn((worker_vars ? std::string() : comments) + line.substr(eq + 1))) {
        for (const std::string& binary : it->second) {
          EXPECT_NE(help[binary].find(flag + " "), std::string::npos)
              << it->first << " gives " << binary << " " << flag << ", which it does not take";
          ++checked;
        }
      }
    }
    comments.clear();
  }
  EXPECT_GT(checked, 10);
}

// A fresh clone has no ../shared: a suite that needs it (gateway_wire_test, which links
// tests/require_shared_data.cc) reports its tests skipped with the reason and exits 0; under CI
// (CI set), where the data must be, the same is a failure.
TEST(DeployCli, TestsWithoutSharedDataSkipWithTheReasonButFailUnderCi) {
  const std::string suite = absl::StrCat(BinDir(), "/gateway_wire_test");
  const CommandResult skipped =
      RunCommand({"/usr/bin/env", "-u", "CI", "THERMOCLINE_SHARED_DATA_DIR=/nonexistent", suite});
  EXPECT_EQ(skipped.exit_code, 0) << skipped.out;
  EXPECT_NE(skipped.out.find("[  SKIPPED ]"), std::string::npos) << skipped.out;
  EXPECT_NE(skipped.out.find("reference data not found: no directory /nonexistent"),
            std::string::npos)
      << skipped.out;
  const CommandResult ci = RunCommand(
      {"/usr/bin/env", "CI=1", "THERMOCLINE_SHARED_DATA_DIR=/nonexistent", suite});
  EXPECT_NE(ci.exit_code, 0) << ci.out;
  EXPECT_NE(ci.out.find("CI is set: not skipping"), std::string::npos) << ci.out;
}

// No --hot-fraction and no --plan: the gateway serves with the whole FFN on the gpu worker
// (host backend) and says so; --numa-node is taken and passed to the cpu worker.
TEST(DeployCli, GatewayDefaultsToTheWholeFfnHotAndTakesNumaNode) {
  THERMOCLINE_REQUIRE_SHARED_DATA();
  Gateway gw(absl::StrCat("cli-default-", getpid()), {"--numa-node", "0"}, /*placement=*/false);
  grpc::ClientContext ctx;
  v1::ModelInfo info;
  ASSERT_TRUE(gw.stub().GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok()) << gw.Log();
  EXPECT_EQ(info.hot_fraction(), 1.0);
  EXPECT_NE(gw.Log().find("event=placement_default"), std::string::npos) << gw.Log();
  const Completion c = gw.Generate(Greedy("Once upon a time", 16));
  ASSERT_TRUE(c.status.ok()) << c.status.error_message();
  EXPECT_FALSE(c.ids.empty());
}

// `thermocline plan` charges the KV cache the gateway will allocate and records it: a gateway
// started with another KV configuration refuses the plan, naming both and the plan command
// that fits; with the same one it serves.
TEST(DeployCli, APlanMadeForAnotherKvCacheIsRefusedNamingBoth) {
  THERMOCLINE_REQUIRE_SHARED_DATA();
  auto model = Model::Load(Stories260K());
  ASSERT_TRUE(model.ok()) << model.status();
  Placement p = Placement::Uniform((*model)->config(), 0.5);
  p.kv_slots = 4;
  p.kv_context = 512;
  p.kv_type = "f16";
  const std::string plan = absl::StrCat(TempDir(), "/kv-plan.gguf");
  ASSERT_TRUE(WritePlacement(p, plan).ok());
  const CommandResult r = RunCommand(
      {absl::StrCat(BinDir(), "/thermocline-gateway"), "--model", Stories260K(), "--plan", plan,
       "--context", "256", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
       "--instance", absl::StrCat("cli-kvplan-", getpid())});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("was made for a KV cache of 4 slots x 512 positions (f16); this gateway "
                       "allocates 4 slots x 256 positions (f32)"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("thermocline plan --kv-slots 4 --context 256 --kv-type f32"),
            std::string::npos)
      << r.err;
  Gateway gw(absl::StrCat("cli-kvplan-ok-", getpid()),
             {"--plan", plan, "--context", "512", "--kv-type", "f16"}, /*placement=*/false);
  const Completion c = gw.Generate(Greedy("Once upon a time", 8));
  EXPECT_TRUE(c.status.ok()) << c.status.error_message();
}

}  // namespace
}  // namespace thermocline::testing
