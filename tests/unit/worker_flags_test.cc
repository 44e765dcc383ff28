// The worker command line (shared/ipc/worker_flags.h): the one field list both parses the
// workers' flags and emits the driver's argv, so the two cannot disagree. Round trips over many
// field combinations, the list's registration, refusals naming the flag, the real binaries'
// --help, and the split driver's argv.
#include "shared/ipc/worker_flags.h"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <sstream>
#include <type_traits>

#include "shared/driver/split_engine.h"
#include "tests/test_support.h"

namespace thermocline::ipc {
namespace {

constexpr WorkerKind kKinds[] = {WorkerKind::kGpu, WorkerKind::kCpu};

std::vector<std::string> TakenNames(WorkerKind kind) {
  std::vector<std::string> names;
  WorkerFlags f;
  VisitWorkerFields(
      [&](const WorkerField& field, auto&) {
        if (field.TakenBy(kind)) names.push_back(field.name);
      },
      f);
  return names;
}

// A value unlike the default, chosen by `rng`; never starting with '-', which Boost would read
// as the next option (the driver emits only paths, names and non-negative numbers).
template <class T>
void SetOther(T& v, std::mt19937& rng, const std::string& name) {
  if constexpr (std::is_same_v<T, std::string>) {
    v = absl::StrCat("/tmp/", name, "-", rng() % 1000, " with space");
  } else if constexpr (std::is_same_v<T, bool>) {
    v = !v;
  } else if constexpr (std::is_floating_point_v<T>) {
    T x = std::uniform_real_distribution<T>(0, 1)(rng);  // most have no short decimal form
    v = x == v ? x + T(0.5) : x;
  } else {
    T x = static_cast<T>(1 + rng() % 100000);
    v = x == v ? x + 1 : x;
  }
}
template <class T>
void SetOther(std::optional<T>& v, std::mt19937& rng, const std::string& name) {
  T x{};
  SetOther(x, rng, name);
  v = x;
}

// Flags `kind` takes, each field left at its default or set otherwise at random, fixed up to
// the rules parsing enforces (exactly one placement).
WorkerFlags RandomFlags(WorkerKind kind, std::mt19937& rng) {
  WorkerFlags f;
  VisitWorkerFields(
      [&](const WorkerField& field, auto& value) {
        if (field.TakenBy(kind) && (field.required() || rng() % 2 == 0)) {
          SetOther(value, rng, field.name);
        }
      },
      f);
  if (f.plan_path.empty() == !f.hot_fraction.has_value()) {
    if (rng() % 2) {
      f.plan_path.clear();
      f.hot_fraction = 0.25;
    } else {
      f.plan_path = "/tmp/p.gpuidx";
      f.hot_fraction.reset();
    }
  }
  return f;
}

std::string Join(const std::vector<std::string>& argv) {
  std::string s;
  for (const std::string& a : argv) absl::StrAppend(&s, "'", a, "' ");
  return s;
}

TEST(WorkerFlagsTest, RoundTripOverManyCombinations) {
  std::mt19937 rng(7);
  for (WorkerKind kind : kKinds) {
    for (int i = 0; i < 500; ++i) {
      const WorkerFlags f = RandomFlags(kind, rng);
      const std::vector<std::string> argv = WorkerArgv(f, kind);
      absl::StatusOr<WorkerFlags> parsed = ParseWorkerFlags(kind, argv);
      ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << Join(argv);
      EXPECT_TRUE(*parsed == f) << Join(argv);
      EXPECT_EQ(WorkerArgv(*parsed, kind), argv);
    }
  }
}

TEST(WorkerFlagsTest, EqualityComparesEveryField) {
  // The round trips rest on operator==: changing any one field of the list must break it.
  std::mt19937 rng(3);
  WorkerFlags base;
  VisitWorkerFields(
      [&](const WorkerField& field, auto& value) {
        WorkerFlags changed = base;
        VisitWorkerFields(
            [&](const WorkerField& other, auto& v) {
              if (std::string(other.name) == field.name) SetOther(v, rng, other.name);
            },
            changed);
        EXPECT_FALSE(changed == base) << field.name;
        (void)value;
      },
      base);
}

TEST(WorkerFlagsTest, DefaultsAreNotEmitted) {
  WorkerFlags f;
  f.instance = "i";
  f.model_path = "m.gguf";
  f.hot_fraction = 0.5;
  for (WorkerKind kind : kKinds) {
    EXPECT_EQ(WorkerArgv(f, kind),
              (std::vector<std::string>{"--instance", "i", "--model", "m.gguf", "--hot-fraction",
                                        "0.5"}));
  }
  // A default given explicitly parses to the same flags, and is then not emitted.
  const std::vector<std::string> explicit_defaults = {
      "--instance", "i",         "--model",    "m.gguf", "--hot-fraction", "0.5", "--threads",
      "1",          "--sparsity", "dense",     "--kv-slots", "4",          "--kv-type", "f32"};
  absl::StatusOr<WorkerFlags> parsed = ParseWorkerFlags(WorkerKind::kGpu, explicit_defaults);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(*parsed == f);
}

TEST(WorkerFlagsTest, NumbersTravelExactlyInTheirShortestForm) {
  WorkerFlags f;
  f.instance = "i";
  f.model_path = "m";
  f.hot_fraction = 0.1 + 0.2;  // 0.30000000000000004
  f.sparsity.target_sparsity = 0.2f;
  f.sparsity.gate_sparsity = 1e-7f;
  const std::vector<std::string> argv = WorkerArgv(f, WorkerKind::kCpu);
  EXPECT_EQ(argv, (std::vector<std::string>{"--instance", "i", "--model", "m", "--hot-fraction",
                                            "0.30000000000000004", "--target-sparsity", "0.2",
                                            "--gate-sparsity", "1e-07"}));
  absl::StatusOr<WorkerFlags> parsed = ParseWorkerFlags(WorkerKind::kCpu, argv);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed->hot_fraction, 0.1 + 0.2);
  EXPECT_EQ(*parsed->sparsity.gate_sparsity, 1e-7f);
}

TEST(WorkerFlagsTest, EveryFieldIsRegisteredExactlyOnce) {
  std::set<std::string> all;
  int n_all = 0;
  WorkerFlags f;
  VisitWorkerFields(
      [&](const WorkerField& field, auto&) {
        all.insert(field.name);
        ++n_all;
        EXPECT_TRUE(field.TakenBy(WorkerKind::kGpu) || field.TakenBy(WorkerKind::kCpu))
            << field.name << " is taken by no worker";
      },
      f);
  EXPECT_EQ(static_cast<int>(all.size()), n_all) << "a flag name appears twice in the list";
  for (WorkerKind kind : kKinds) {
    boost::program_options::options_description opts;
    WorkerFlags g;
    AddWorkerOptions(opts, kind, g);
    const std::vector<std::string> names = TakenNames(kind);
    ASSERT_EQ(opts.options().size(), names.size() + 1);  // + --help
    for (const std::string& name : names) {
      int count = 0;
      for (const auto& o : opts.options()) count += o->long_name() == name;
      EXPECT_EQ(count, 1) << name;
    }
  }
}

std::vector<std::string> Valid(std::vector<std::string> more) {
  std::vector<std::string> a = {"--instance", "i", "--model", "m", "--hot-fraction", "1"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

void ExpectRefused(WorkerKind kind, const std::vector<std::string>& args,
                   const std::string& named) {
  absl::StatusOr<WorkerFlags> parsed = ParseWorkerFlags(kind, args);
  ASSERT_FALSE(parsed.ok()) << Join(args);
  EXPECT_TRUE(absl::IsInvalidArgument(parsed.status()));
  EXPECT_NE(parsed.status().message().find(named), std::string::npos)
      << parsed.status() << " does not name " << named;
}

TEST(WorkerFlagsTest, BadCommandLinesAreRefusedNamingTheProblem) {
  for (WorkerKind kind : kKinds) {
    ExpectRefused(kind, Valid({"--bogus", "1"}), "--bogus");
    ExpectRefused(kind, Valid({"--threads", "many"}), "--threads");
    ExpectRefused(kind, Valid({"--threads", "0"}), "--threads");
    ExpectRefused(kind, Valid({"--hot-fraction", "0.5"}), "--hot-fraction");  // twice
    ExpectRefused(kind, Valid({"stray"}), "positional");
    ExpectRefused(kind, {"--model", "m", "--hot-fraction", "1"}, "--instance");
    ExpectRefused(kind, {"--instance", "i", "--hot-fraction", "1"}, "--model");
    ExpectRefused(kind, {"--instance", "", "--model", "m", "--hot-fraction", "1"}, "--instance");
    ExpectRefused(kind, {"--instance", "i", "--model", "m"}, "--plan");
    ExpectRefused(kind, Valid({"--plan", "p"}), "--hot-fraction");
  }
  // One worker's flags are unknown to the other.
  ExpectRefused(WorkerKind::kGpu, Valid({"--mlock"}), "--mlock");
  ExpectRefused(WorkerKind::kGpu, Valid({"--numa-node", "0"}), "--numa-node");
  ExpectRefused(WorkerKind::kCpu, Valid({"--backend", "host"}), "--backend");
  ExpectRefused(WorkerKind::kCpu, Valid({"--vram-budget", "1G"}), "--vram-budget");
  ExpectRefused(WorkerKind::kCpu, Valid({"--numa-node", "-1"}), "--numa-node");
}

// The long option names a --help lists: lines "  --name ...".
std::set<std::string> HelpFlags(const std::string& help) {
  std::set<std::string> names;
  std::istringstream in(help);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("  --", 0) != 0) continue;
    const size_t end = line.find(' ', 4);
    names.insert(line.substr(4, end == std::string::npos ? end : end - 4));
  }
  return names;
}

TEST(WorkerFlagsTest, TheRealWorkersListExactlyTheirFieldsInHelp) {
  for (WorkerKind kind : kKinds) {
    const testing::CommandResult r =
        testing::RunCommand({testing::BinDir() + "/" + WorkerProgram(kind), "--help"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::vector<std::string> expected = TakenNames(kind);
    expected.push_back("help");
    EXPECT_EQ(HelpFlags(r.out), std::set<std::string>(expected.begin(), expected.end()))
        << r.out;
  }
}

TEST(WorkerFlagsTest, TheRealWorkersRefuseUnknownFlagsByName) {
  for (WorkerKind kind : kKinds) {
    const testing::CommandResult r = testing::RunCommand(
        {testing::BinDir() + "/" + WorkerProgram(kind), "--instance", "x", "--model", "m",
         "--hot-fraction", "1", "--no-such-flag"});
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("--no-such-flag"), std::string::npos) << r.err;
  }
}

TEST(WorkerFlagsTest, TheDriverEmitsEachWorkerItsOwnFlags) {
  driver::SplitEngineOptions o;
  o.instance = "inst";
  o.model_path = "/m.gguf";
  o.bindir = "/bin";
  o.hot_fraction = 0.75;
  o.sparsity.mode = "threshold";
  o.sparsity.stats_path = "/s.gguf";
  o.sparsity.target_sparsity = 0.5f;
  o.gpu_threads = 3;
  o.cpu_threads = 2;
  o.kv_slots = 7;
  o.context = 96;
  o.max_batch = 33;
  o.kv_type = "f16";
  o.gpu_backend = "cuda";
  o.cpus = "0-1";
  o.numa_node = 1;
  o.mlock = true;
  o.extra_gpu_args = {"--vram-budget", "64K"};
  o.extra_cpu_args = {"--threads-extra-marker"};

  const std::vector<std::string> gpu = driver::GpuWorkerArgv(o);
  ASSERT_GE(gpu.size(), 3u);
  EXPECT_EQ(gpu[0], "/bin/thermocline-gpu-worker");
  EXPECT_EQ(std::vector<std::string>(gpu.end() - 2, gpu.end()), o.extra_gpu_args);
  absl::StatusOr<WorkerFlags> g = ParseWorkerFlags(WorkerKind::kGpu, {gpu.begin() + 1, gpu.end()});
  ASSERT_TRUE(g.ok()) << g.status() << "\n" << Join(gpu);
  WorkerFlags want_gpu;
  want_gpu.instance = "inst";
  want_gpu.model_path = "/m.gguf";
  want_gpu.threads = 3;
  want_gpu.hot_fraction = 0.75;
  want_gpu.sparsity = o.sparsity;
  want_gpu.backend = "cuda";
  want_gpu.kv_slots = 7;
  want_gpu.context = 96;
  want_gpu.max_batch = 33;
  want_gpu.kv_type = "f16";
  want_gpu.vram_budget = "64K";  // from the extra args
  EXPECT_TRUE(*g == want_gpu) << Join(gpu);

  const std::vector<std::string> cpu = driver::CpuWorkerArgv(o);
  EXPECT_EQ(cpu[0], "/bin/thermocline-cpu-worker");
  EXPECT_EQ(cpu.back(), "--threads-extra-marker");
  absl::StatusOr<WorkerFlags> c =
      ParseWorkerFlags(WorkerKind::kCpu, {cpu.begin() + 1, cpu.end() - 1});
  ASSERT_TRUE(c.ok()) << c.status() << "\n" << Join(cpu);
  WorkerFlags want_cpu;
  want_cpu.instance = "inst";
  want_cpu.model_path = "/m.gguf";
  want_cpu.threads = 2;
  want_cpu.hot_fraction = 0.75;
  want_cpu.sparsity = o.sparsity;
  want_cpu.cpus = "0-1";
  want_cpu.numa_node = 1;
  want_cpu.mlock = true;
  EXPECT_TRUE(*c == want_cpu) << Join(cpu);

  // A plan wins over a hot fraction (the engine's rule), so the workers are given one placement.
  o.plan_path = "/p.gpuidx";
  const std::vector<std::string> with_plan = driver::CpuWorkerArgv(o);
  absl::StatusOr<WorkerFlags> p = ParseWorkerFlags(WorkerKind::kCpu, {with_plan.begin() + 1, with_plan.end() - 1});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->plan_path, "/p.gpuidx");
  EXPECT_FALSE(p->hot_fraction.has_value());
}

}  // namespace
}  // namespace thermocline::ipc
