// kill -9 of a worker during a generation through the SplitEngine (real worker processes):
// detected, restarted under a new epoch, and the generation completes with the tokens of an
// uninterrupted run (greedy). The kills land deterministically: from the engine's on_step_sent
// hook after a fixed number of steps (the step is then in flight: the worker dies mid-step), or
// from the token callback (between steps: the worker dies idle). Also: a worker that keeps
// dying spends the restart budget and the error names it; Ctrl-C of `generate --split` stops
// everything cleanly; kill -9 of the driver itself leaves workers that exit on their own and a
// segment that RemoveStale clears; no segment is left in /dev/shm after any of this. And hangs
// that a heartbeat cannot see: one worker's compute thread frozen by ptrace while its heartbeat
// thread beats on is found by its lack of progress, and that worker, not the one waiting on it,
// is replaced.
//
// Logits after a gpu_worker restart come from a KV cache rebuilt by a replayed prefill, while
// the uninterrupted run built it one decode step at a time; rows of one batch are computed
// independently with the same kernels, so the rows are expected bit-identical, but the test
// holds them only to the split bound of split_equivalence_test.cc (1e-4 * max(1, RMS)) and
// the tokens to exact equality: the requirement is the output, not the arithmetic.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "shared/driver/split_engine.h"
#include "shared/ipc/segment.h"
#include "shared/ipc/transport.h"
#include "shared/model/model.h"
#include "shared/runtime/forward.h"
#include "shared/runtime/generate.h"
#include "shared/runtime/kv_cache.h"
#include "tests/fault_injection.h"
#include "tests/process_spawn.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

using ipc::Role;

constexpr double kTolerance = 1e-4;
constexpr int kNewTokens = 48;
constexpr int kKillAfterSteps = 20;  // prefill is step 1; the kill lands in the middle of decode

std::string Stories() { return testing::ModelPath("stories260K/stories260K.gguf"); }

struct Output {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
  absl::Status status;
};

class SplitRecovery : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = Model::Load(Stories());
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
  }

  driver::SplitEngineOptions Options() {
    driver::SplitEngineOptions o;
    o.model_path = Stories();
    o.config = model_->config();
    o.hot_fraction = 0.5;  // both workers compute part of every layer
    o.kv_slots = 2;
    o.bindir = testing::BinDir();
    o.restart.backoff_step = absl::Milliseconds(1);
    return o;
  }

  // Greedy generation through `engine`; `on_token(i)` runs after the i-th token (0-based).
  Output Generate(driver::SplitEngine& engine, const std::function<void(int)>& on_token = {}) {
    GenerationRequest req;
    req.prompt = model_->tokenizer().Encode("Once upon a time", /*add_bos=*/true);
    req.max_new_tokens = kNewTokens;
    req.sampling.temperature = 0;
    req.ignore_eos = true;
    req.slot = 1;
    Output out;
    auto stats = thermocline::Generate(engine, model_->tokenizer().eos(), req,
                                       [&](int32_t token, std::span<const float> logits) {
                                         out.tokens.push_back(token);
                                         out.logits.emplace_back(logits.begin(), logits.end());
                                         if (on_token) on_token(static_cast<int>(out.tokens.size()) - 1);
                                         return true;
                                       });
    out.status = stats.status();
    return out;
  }

  // The uninterrupted run, once per test.
  const Output& Reference() {
    if (reference_.tokens.empty()) {
      auto engine = driver::SplitEngine::Create(Options());
      EXPECT_TRUE(engine.ok()) << engine.status();
      reference_ = Generate(**engine);
      EXPECT_TRUE(reference_.status.ok()) << reference_.status;
      EXPECT_EQ((*engine)->stats().restarts, 0);
    }
    return reference_;
  }

  void ExpectSameOutput(const Output& got) {
    const Output& ref = Reference();
    ASSERT_TRUE(got.status.ok()) << got.status;
    ASSERT_EQ(got.tokens, ref.tokens);
    double worst = 0;
    for (size_t t = 0; t < ref.logits.size(); ++t) {
      double sq = 0;
      for (float v : ref.logits[t]) sq += static_cast<double>(v) * v;
      const double scale = std::max(1.0, std::sqrt(sq / ref.logits[t].size()));
      for (size_t i = 0; i < ref.logits[t].size(); ++i) {
        worst = std::max(worst, std::abs(got.logits[t][i] - ref.logits[t][i]) / scale);
      }
    }
    std::printf("max |recovered - uninterrupted| / max(1, RMS) = %.3g\n", worst);
    EXPECT_LE(worst, kTolerance);
  }

  // Runs `body` with a fresh engine, then checks that it left nothing behind.
  void WithEngine(driver::SplitEngineOptions o,
                  const std::function<void(driver::SplitEngine&)>& body) {
    std::string instance;
    std::vector<pid_t> pids;
    {
      auto engine = driver::SplitEngine::Create(std::move(o));
      ASSERT_TRUE(engine.ok()) << engine.status();
      instance = (*engine)->instance();
      engine_ = engine->get();
      body(**engine);
      engine_ = nullptr;
      pids = {(*engine)->worker_pid(Role::kGpuWorker), (*engine)->worker_pid(Role::kCpuWorker)};
    }
    EXPECT_TRUE(ipc::ListInstanceSegments(instance).empty()) << "segment left in /dev/shm";
    for (pid_t pid : pids) {
      if (pid > 0) {
        EXPECT_EQ(waitpid(pid, nullptr, WNOHANG), -1) << "worker " << pid << " not reaped";
      }
    }
  }

  // An on_step_sent hook that SIGKILLs `role`'s worker once, right after the step that follows
  // `steps` completed steps is sent: the worker dies with that step in flight. The pid goes to
  // *killed.
  std::function<void(uint64_t, int64_t)> KillWhenSent(Role role, int64_t steps, pid_t* killed) {
    return [this, role, steps, killed](uint64_t, int64_t done) {
      if (done == steps && *killed == 0) {
        *killed = engine_->worker_pid(role);
        kill(*killed, SIGKILL);
      }
    };
  }

  std::unique_ptr<Model> model_;
  Output reference_;
  driver::SplitEngine* engine_ = nullptr;  // the engine of WithEngine's body
};

TEST_F(SplitRecovery, GpuWorkerKilledMidStepIsReplacedAndTheSequenceReplayed) {
  const Output& ref = Reference();
  ASSERT_FALSE(ref.tokens.empty());
  driver::SplitEngineOptions o = Options();
  pid_t killed = 0;
  o.on_step_sent = KillWhenSent(Role::kGpuWorker, kKillAfterSteps, &killed);
  WithEngine(o, [&](driver::SplitEngine& engine) {
    const Output got = Generate(engine);
    ExpectSameOutput(got);
    const driver::SplitEngineStats& s = engine.stats();
    EXPECT_EQ(s.gpu_restarts, 1);
    EXPECT_EQ(s.cpu_restarts, 0);
    EXPECT_GE(s.resent_steps, 1);
    // The prompt (5 tokens) and every decoded token submitted before the lost step.
    EXPECT_EQ(s.replayed_tokens, 5 + kKillAfterSteps - 1);
    EXPECT_NE(engine.worker_pid(Role::kGpuWorker), killed);
  });
}

TEST_F(SplitRecovery, CpuWorkerKilledMidStepIsReplacedWithoutReplay) {
  ASSERT_FALSE(Reference().tokens.empty());
  driver::SplitEngineOptions o = Options();
  pid_t killed = 0;
  o.on_step_sent = KillWhenSent(Role::kCpuWorker, kKillAfterSteps, &killed);
  WithEngine(o, [&](driver::SplitEngine& engine) {
    const pid_t gpu = engine.worker_pid(Role::kGpuWorker);
    const Output got = Generate(engine);
    ExpectSameOutput(got);
    const driver::SplitEngineStats& s = engine.stats();
    EXPECT_EQ(s.cpu_restarts, 1);
    EXPECT_EQ(s.gpu_restarts, 0);
    EXPECT_EQ(s.replayed_tokens, 0) << "the gpu_worker's KV cache survives";
    EXPECT_EQ(engine.worker_pid(Role::kGpuWorker), gpu);
    EXPECT_NE(engine.worker_pid(Role::kCpuWorker), killed);
  });
}

// A hang that the heartbeat cannot show: the compute thread of one worker is frozen mid-step
// while its heartbeat thread goes on. Before progress was tracked, the stream stalled for the
// 300 s step timeout and then the gpu_worker was killed whichever worker hung.
class SplitHang : public SplitRecovery,
                  public ::testing::WithParamInterface<Role> {};

TEST_P(SplitHang, AFrozenComputeThreadIsFoundAndItsWorkerAloneReplaced) {
  const Role frozen_role = GetParam();
  ASSERT_FALSE(Reference().tokens.empty());
  driver::SplitEngineOptions o = Options();
  o.hang_timeout = absl::Seconds(2);
  pid_t frozen = 0, tracer = 0;
  o.on_step_sent = [&](uint64_t, int64_t done) {
    if (done == kKillAfterSteps && frozen == 0) {
      frozen = engine_->worker_pid(frozen_role);
      tracer = testing::FreezeThread(frozen);
    }
  };
  WithEngine(o, [&](driver::SplitEngine& engine) {
    const pid_t other = engine.worker_pid(frozen_role == Role::kGpuWorker ? Role::kCpuWorker
                                                                          : Role::kGpuWorker);
    const Output got = Generate(engine);
    ASSERT_GT(tracer, 0);
    EXPECT_EQ(testing::ReapTracer(tracer), 0) << "the frozen worker was not killed while frozen";
    ExpectSameOutput(got);
    const driver::SplitEngineStats& s = engine.stats();
    const bool gpu = frozen_role == Role::kGpuWorker;
    EXPECT_EQ(s.gpu_restarts, gpu ? 1 : 0);
    EXPECT_EQ(s.cpu_restarts, gpu ? 0 : 1);
    EXPECT_NE(engine.worker_pid(frozen_role), frozen);
    EXPECT_EQ(engine.worker_pid(gpu ? Role::kCpuWorker : Role::kGpuWorker), other)
        << "the worker that waited was replaced";
  });
}

INSTANTIATE_TEST_SUITE_P(BothWorkers, SplitHang,
                         ::testing::Values(Role::kGpuWorker, Role::kCpuWorker),
                         [](const ::testing::TestParamInfo<Role>& info) {
                           return std::string(info.param == Role::kGpuWorker ? "GpuWorker"
                                                                             : "CpuWorker");
                         });

// The model file truncated in place under running workers: their next touch of a weight page
// past the new end is SIGBUS. Before, the workers crashed, were restarted onto the truncated
// file, died loading it, and the budget went on "exited with status 1". Now the worker says
// what happened and the engine gives up at once, naming the file and the change (a restart
// would load other bytes than a survivor holds), marked for the gateway to exit.
TEST_F(SplitRecovery, AModelFileTruncatedUnderTheWorkersIsReportedAsChangedNotRestarted) {
  const std::string copy = testing::TempDir() + "/truncated-under-service.gguf";
  {
    std::ifstream in(Stories(), std::ios::binary);
    std::ofstream out(copy, std::ios::binary | std::ios::trunc);
    out << in.rdbuf();
    ASSERT_TRUE(out.good());
  }
  driver::SplitEngineOptions o = Options();
  o.model_path = copy;
  WithEngine(o, [&](driver::SplitEngine& engine) {
    const Output got = Generate(engine, [&](int i) {
      if (i == 5) {
        ASSERT_EQ(truncate(copy.c_str(), 4096), 0) << std::strerror(errno);
      }
    });
    ASSERT_FALSE(got.status.ok());
    EXPECT_EQ(got.status.code(), absl::StatusCode::kUnavailable) << got.status;
    EXPECT_TRUE(driver::IsGivenUp(got.status)) << got.status;
    const std::string msg(got.status.message());
    EXPECT_NE(msg.find("changed since the workers loaded it"), std::string::npos) << msg;
    EXPECT_NE(msg.find("bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("SIGBUS"), std::string::npos) << msg;
    EXPECT_EQ(engine.stats().restarts, 0);
    EXPECT_GE(got.tokens.size(), 6u);
  });
  std::remove(copy.c_str());
}

TEST_F(SplitRecovery, WorkersKilledBetweenStepsAreReplacedBeforeTheNextStep) {
  ASSERT_FALSE(Reference().tokens.empty());
  WithEngine(Options(), [&](driver::SplitEngine& engine) {
    // Both die while idle, after the 10th token; then the cpu_worker alone after the 30th.
    const Output got = Generate(engine, [&](int i) {
      if (i == 10) {
        kill(engine.worker_pid(Role::kGpuWorker), SIGKILL);
        kill(engine.worker_pid(Role::kCpuWorker), SIGKILL);
      } else if (i == 30) {
        kill(engine.worker_pid(Role::kCpuWorker), SIGKILL);
      }
    });
    ExpectSameOutput(got);
    EXPECT_EQ(engine.stats().gpu_restarts, 1);
    EXPECT_EQ(engine.stats().cpu_restarts, 2);
  });
}

TEST_F(SplitRecovery, AWorkerThatKeepsDyingSpendsTheBudgetAndIsNamed) {
  driver::SplitEngineOptions o = Options();
  o.restart.max_restarts = 2;
  // From step 5 on, every step's gpu_worker is killed as soon as the step is sent.
  o.on_step_sent = [&](uint64_t, int64_t steps_done) {
    if (steps_done >= 5) kill(engine_->worker_pid(Role::kGpuWorker), SIGKILL);
  };
  WithEngine(o, [&](driver::SplitEngine& engine) {
    const Output got = Generate(engine);
    ASSERT_FALSE(got.status.ok());
    EXPECT_EQ(got.status.code(), absl::StatusCode::kUnavailable);
    const std::string msg(got.status.message());
    EXPECT_NE(msg.find("gpu_worker"), std::string::npos) << msg;
    EXPECT_NE(msg.find("killed by signal 9"), std::string::npos) << msg;
    EXPECT_NE(msg.find("2 restarts within 1m"), std::string::npos) << msg;
    EXPECT_EQ(engine.stats().gpu_restarts, 2);
  });
}

// What the gateway will do: several sequences in one batch (one entry per slot per step). A
// gpu_worker killed mid-step loses every slot's cache; the replay rebuilds all of them, and
// both sequences go on exactly as in the single-process engine.
TEST_F(SplitRecovery, InterleavedSequencesAllSurviveAGpuRestart) {
  const std::vector<std::string> prompts = {"Once upon a time", "The little dog"};
  constexpr int kSteps = 24;
  // Greedy, both slots advanced together; the prompts go in as one mixed batch.
  auto drive = [&](BatchRunner& runner, std::vector<std::vector<int32_t>>& out) -> absl::Status {
    std::vector<BatchEntry> batch;
    std::vector<int32_t> length(prompts.size());
    for (size_t s = 0; s < prompts.size(); ++s) {
      const std::vector<int32_t> ids = model_->tokenizer().Encode(prompts[s], true);
      for (size_t p = 0; p < ids.size(); ++p) {
        batch.push_back({static_cast<int32_t>(s), static_cast<int32_t>(p), ids[p],
                         p + 1 == ids.size()});
      }
      length[s] = static_cast<int32_t>(ids.size());
    }
    out.assign(prompts.size(), {});
    std::vector<float> logits;
    const int64_t vocab = runner.vocab_size();
    for (int step = 0; step <= kSteps; ++step) {
      if (absl::Status st = runner.Run(batch, logits); !st.ok()) return st;
      batch.clear();
      for (size_t s = 0; s < prompts.size(); ++s) {
        const float* row = logits.data() + s * vocab;
        const int32_t next = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
        out[s].push_back(next);
        batch.push_back({static_cast<int32_t>(s), length[s]++, next, true});
      }
    }
    return absl::OkStatus();
  };
  std::vector<std::vector<int32_t>> want, got;
  {
    ThreadPool pool(1);
    auto kv = KvCache::Create(model_->config(), 2, 64, GgmlType::kF32);
    ASSERT_TRUE(kv.ok());
    ForwardPass pass(*model_, *kv, pool);
    ForwardPassRunner local(pass);
    ASSERT_TRUE(drive(local, want).ok());
  }
  driver::SplitEngineOptions o = Options();
  int64_t held_at_kill = -1;
  o.on_step_sent = [&](uint64_t, int64_t steps_done) {
    if (steps_done == 10 && held_at_kill < 0) {
      held_at_kill = engine_->history().total_tokens();
      kill(engine_->worker_pid(Role::kGpuWorker), SIGKILL);
    }
  };
  WithEngine(o, [&](driver::SplitEngine& engine) {
    ASSERT_TRUE(drive(engine, got).ok());
    EXPECT_EQ(got, want);
    EXPECT_EQ(engine.stats().gpu_restarts, 1);
    EXPECT_EQ(engine.stats().replayed_tokens, held_at_kill) << "both slots, every position";
  });
}

// `thermocline generate --split` as a child process with its stdout and stderr on pipes.
class DriverProcess {
 public:
  explicit DriverProcess(const std::string& instance) {
    std::vector<std::string> args = {testing::BinDir() + "/thermocline", "generate", "-m",
                                     Stories(), "-p", kPromptText, "-n", "400", "-t", "0",
                                     "--ignore-eos", "--split", "--hot-fraction", "0.5",
                                     "--instance", instance};
    auto child = testing::SpawnProcess(args, {.stdout_pipe = true, .stderr_pipe = true});
    if (!child.ok()) {
      ADD_FAILURE() << child.status();
      return;
    }
    pid_ = child->pid;
    out_ = child->stdout_fd;
    err_ = child->stderr_fd;
  }
  ~DriverProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) close(out_);
    if (err_ >= 0) close(err_);
  }

  // Reads both pipes until `chars` characters past the prompt are printed: generation is
  // under way. False when the driver ends first or nothing comes for 30 s.
  bool WaitForText(size_t chars) {
    pollfd fds[2] = {{out_, POLLIN, 0}, {err_, POLLIN, 0}};
    while (text_.size() < std::strlen(kPromptText) + chars) {
      if (poll(fds, 2, 30000) <= 0) return false;
      char buf[4096];
      for (int i = 0; i < 2; ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP))) continue;
        const ssize_t n = read(fds[i].fd, buf, sizeof buf);
        if (n <= 0) return false;
        (i == 0 ? text_ : log_).append(buf, n);
      }
    }
    return true;
  }
  // Sends `sig` and reaps the driver; returns its wait status.
  int SignalAndWait(int sig) {
    kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = 0;
    return status;
  }
  // The rest of stderr, up to EOF: the workers hold the pipe until they exit, so this also
  // waits for them (bounded by the test's own timeout).
  const std::string& DrainLog() {
    char buf[4096];
    ssize_t n;
    while ((n = read(err_, buf, sizeof buf)) > 0) log_.append(buf, n);
    return log_;
  }
  const std::string& log() const { return log_; }
  // The worker pids, from their "event=attached instance=… pid=N" lines.
  std::vector<pid_t> WorkerPids() const {
    std::vector<pid_t> pids;
    const std::regex attached("event=attached instance=[^ ]+ pid=([0-9]+)");
    for (std::sregex_iterator it(log_.begin(), log_.end(), attached), end; it != end; ++it) {
      pids.push_back(std::stoi((*it)[1]));
    }
    return pids;
  }

  static constexpr char kPromptText[] = "Once upon a time";

 private:
  pid_t pid_ = 0;
  int out_ = -1, err_ = -1;
  std::string text_, log_;
};

// Present and not a zombie (the workers of a killed driver are no longer our descendants).
bool Alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t close_paren = line.rfind(')');
  return close_paren != std::string::npos && line.size() > close_paren + 2 &&
         line[close_paren + 2] != 'Z';
}

// Ctrl-C (SIGINT) of `generate --split` mid-generation: the driver stops after the current step,
// shuts the workers down and removes the segment; exit status 130.
TEST(SplitDriverInterrupted, StopsTheWorkersAndRemovesTheSegment) {
  const std::string instance = absl::StrCat("splitint-", getpid());
  DriverProcess driver(instance);
  ASSERT_TRUE(driver.WaitForText(40)) << driver.log();
  const int status = driver.SignalAndWait(SIGINT);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by the signal instead of handling it";
  EXPECT_EQ(WEXITSTATUS(status), 130);
  const std::string& log = driver.DrainLog();
  EXPECT_NE(log.find("interrupted; workers stopped"), std::string::npos) << log;
  const std::vector<pid_t> workers = driver.WorkerPids();
  EXPECT_EQ(workers.size(), 2u) << log;
  for (pid_t pid : workers) EXPECT_FALSE(Alive(pid)) << "worker " << pid << " still runs";
  EXPECT_TRUE(ipc::ListInstanceSegments(instance).empty());
}

// kill -9 of the driver mid-generation: the workers notice that the segment's owner is gone
// and exit; the test kills whatever is left, and Transport::RemoveStale clears the segment.
TEST(SplitDriverKilled, WorkersExitAndTheStaleSegmentIsRemoved) {
  const std::string instance = absl::StrCat("splitkill-", getpid());
  DriverProcess driver(instance);
  ASSERT_TRUE(driver.WaitForText(40)) << driver.log();
  const int status = driver.SignalAndWait(SIGKILL);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the generation finished before the kill";
  std::vector<pid_t> workers = driver.WorkerPids();
  EXPECT_EQ(workers.size(), 2u) << driver.log();
  for (pid_t pid : workers) {
    for (int i = 0; i < 1000 && Alive(pid); ++i) usleep(10000);
    EXPECT_FALSE(Alive(pid)) << "worker " << pid << " outlived its driver by 10 s";
    if (Alive(pid)) kill(pid, SIGKILL);
  }
  driver.DrainLog();
  // The driver could not remove its segment; the next owner (or an operator) does.
  auto removed = ipc::Transport::RemoveStale(instance);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_TRUE(*removed);
  EXPECT_TRUE(ipc::ListInstanceSegments(instance).empty());
}

}  // namespace
}  // namespace thermocline
