// The supervisor against real child processes (tests/helpers/driver_fake_worker, which does a
// worker's part of the lifecycle and nothing else): start and readiness, death detection after
// kill -9, restart under a new epoch, the restart budget when a worker keeps crashing at start,
// attach mode, and that no child or segment outlives the supervisor.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "gtest/gtest.h"
#include "shared/driver/supervisor.h"
#include "shared/ipc/segment.h"
#include "shared/ipc/transport.h"
#include "tests/fault_injection.h"
#include "tests/test_support.h"

namespace thermocline::driver {
namespace {

using ipc::Role;

class SupervisorTest : public ::testing::Test {
 protected:
  SupervisorTest() {
    static int counter = 0;
    instance_ = "drvsup-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
    auto t = ipc::Transport::Create(instance_);
    EXPECT_TRUE(t.ok()) << t.status();
    transport_ = std::move(*t);
    die_file_ = testing::TempDir() + "/die";
  }
  void TearDown() override {
    transport_.reset();
    EXPECT_TRUE(ipc::ListInstanceSegments(instance_).empty());
  }

  WorkerSpec Spec(Role role) {
    return WorkerSpec{role,
                      {testing::BinDir() + "/driver_fake_worker", "--instance", instance_,
                       "--role", role == Role::kGpuWorker ? "gpu" : "cpu", "--die-if-exists",
                       die_file_, "--exit-code", "3"}};
  }
  SupervisorOptions Options() {
    SupervisorOptions o;
    o.workers = {Spec(Role::kGpuWorker), Spec(Role::kCpuWorker)};
    o.restart.backoff_step = absl::Milliseconds(1);
    o.restart.max_backoff = absl::Milliseconds(4);
    o.ready_timeout = absl::Seconds(30);
    return o;
  }
  // Polls Check() in 20 ms slices (the engine's slice) until a death is reported.
  std::vector<WorkerDeath> WaitForDeath() {
    for (int i = 0; i < 3000; ++i) {
      std::vector<WorkerDeath> d = sup_->Check();
      if (!d.empty()) return d;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return {};
  }

  std::string instance_;
  std::string die_file_;
  std::unique_ptr<ipc::Transport> transport_;
  std::unique_ptr<Supervisor> sup_;
};

TEST_F(SupervisorTest, StartsBothAndRestartsAKilledOneUnderANewEpoch) {
  sup_ = std::make_unique<Supervisor>(*transport_, Options());
  ASSERT_TRUE(sup_->Start().ok());
  const pid_t gpu = sup_->pid(Role::kGpuWorker), cpu = sup_->pid(Role::kCpuWorker);
  ASSERT_GT(gpu, 0);
  ASSERT_GT(cpu, 0);
  EXPECT_TRUE(sup_->Check().empty());
  const uint64_t epoch0 = transport_->epoch();

  ASSERT_EQ(kill(cpu, SIGKILL), 0);
  std::vector<WorkerDeath> dead = WaitForDeath();
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].role, Role::kCpuWorker);
  EXPECT_EQ(dead[0].why, "killed by signal 9 (Killed)");

  const Role roles[] = {Role::kCpuWorker};
  auto epoch = sup_->Restart(roles);
  ASSERT_TRUE(epoch.ok()) << epoch.status();
  EXPECT_EQ(*epoch, epoch0 + 1);
  EXPECT_EQ(transport_->epoch(), *epoch);
  EXPECT_NE(sup_->pid(Role::kCpuWorker), cpu);
  EXPECT_EQ(sup_->pid(Role::kGpuWorker), gpu) << "the survivor is kept";
  ipc::ProcessInfo info = transport_->Process(Role::kCpuWorker);
  EXPECT_EQ(info.state, ipc::ProcessState::kReady);
  EXPECT_EQ(info.epoch, *epoch);
  EXPECT_TRUE(sup_->Check().empty());
  EXPECT_EQ(sup_->restarts(), 1);

  // Stop: SIGTERM is a clean exit for a worker; every child is reaped.
  const pid_t new_cpu = sup_->pid(Role::kCpuWorker);
  sup_->Stop(absl::Milliseconds(200));
  EXPECT_EQ(sup_->pid(Role::kGpuWorker), 0);
  EXPECT_EQ(sup_->pid(Role::kCpuWorker), 0);
  EXPECT_EQ(waitpid(new_cpu, nullptr, WNOHANG), -1) << "already reaped";
  EXPECT_EQ(transport_->Process(Role::kGpuWorker).state, ipc::ProcessState::kStopped);
}

// A ring marked corrupt while one worker is being restarted (the soak's ring scribble landing
// just after a kill): restarting that worker alone would leave the mark, and every real worker
// dies on it at its first read, so the restart takes both and resets every ring. Before the
// fix the survivor was kept and the ring stayed corrupt (the 10-minute soak's outage).
TEST_F(SupervisorTest, ARingMarkedCorruptDuringARestartIsResetWithBothWorkersReplaced) {
  sup_ = std::make_unique<Supervisor>(*transport_, Options());
  ASSERT_TRUE(sup_->Start().ok());
  const pid_t gpu = sup_->pid(Role::kGpuWorker), cpu = sup_->pid(Role::kCpuWorker);
  const uint64_t epoch0 = transport_->epoch();
  ASSERT_EQ(kill(cpu, SIGKILL), 0);
  std::vector<WorkerDeath> dead = WaitForDeath();
  ASSERT_EQ(dead.size(), 1u);
  {
    testing::MappedTransport shm(instance_);
    ASSERT_TRUE(shm.ok());
    shm.Ring(ipc::RingId::kGatewayToGpu).corrupt.store(1);
  }
  ASSERT_EQ(transport_->CorruptRings().size(), 1u);
  const Role roles[] = {Role::kCpuWorker};
  std::vector<Role> restarted;
  auto epoch = sup_->Restart(roles, &restarted);
  ASSERT_TRUE(epoch.ok()) << epoch.status();
  EXPECT_EQ(*epoch, epoch0 + 1) << "one epoch bump for both";
  EXPECT_EQ(restarted.size(), 2u);
  EXPECT_TRUE(transport_->CorruptRings().empty()) << "the mark outlived the restart";
  EXPECT_NE(sup_->pid(Role::kCpuWorker), cpu);
  EXPECT_NE(sup_->pid(Role::kGpuWorker), gpu) << "the survivor must go too: only then are rings reset";
  EXPECT_TRUE(sup_->Check().empty());
  sup_->Stop(absl::Milliseconds(200));
}

TEST_F(SupervisorTest, AWorkerThatKeepsCrashingSpendsTheBudgetAndIsNamed) {
  SupervisorOptions o = Options();
  o.restart.max_restarts = 3;
  sup_ = std::make_unique<Supervisor>(*transport_, o);
  ASSERT_TRUE(sup_->Start().ok());
  std::ofstream(die_file_) << "crash at start from now on";
  ASSERT_EQ(kill(sup_->pid(Role::kGpuWorker), SIGKILL), 0);
  ASSERT_FALSE(WaitForDeath().empty());
  const Role roles[] = {Role::kGpuWorker};
  auto epoch = sup_->Restart(roles);
  ASSERT_FALSE(epoch.ok());
  EXPECT_EQ(epoch.status().code(), absl::StatusCode::kUnavailable);
  const std::string msg(epoch.status().message());
  EXPECT_NE(msg.find("gpu_worker"), std::string::npos) << msg;
  EXPECT_NE(msg.find("exited with status 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("3 restarts within 1m"), std::string::npos) << msg;
  EXPECT_EQ(sup_->restarts(), 3);  // each attempt spawned once, then the budget said no
}

TEST_F(SupervisorTest, AWorkerThatCannotStartFailsStartWithItsExitStatus) {
  std::ofstream(die_file_) << "x";
  sup_ = std::make_unique<Supervisor>(*transport_, Options());
  absl::Status s = sup_->Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("exited with status 3 while starting"), std::string::npos) << s;
  EXPECT_EQ(sup_->pid(Role::kGpuWorker), 0);
  EXPECT_EQ(sup_->pid(Role::kCpuWorker), 0);
}

TEST_F(SupervisorTest, AttachModeWatchesHeartbeatsAndDoesNotRestart) {
  // Someone else starts the workers.
  auto gpu = WorkerProcess::Spawn(Spec(Role::kGpuWorker).argv);
  auto cpu = WorkerProcess::Spawn(Spec(Role::kCpuWorker).argv);
  ASSERT_TRUE(gpu.ok() && cpu.ok());
  SupervisorOptions o = Options();
  o.attach = true;
  sup_ = std::make_unique<Supervisor>(*transport_, o);
  ASSERT_TRUE(sup_->Start().ok());
  EXPECT_EQ(sup_->pid(Role::kGpuWorker), (*gpu)->pid());
  EXPECT_TRUE(sup_->Check().empty());
  // A stopped (SIGSTOP) worker still exists but no longer heartbeats: dead after 300 ms.
  ASSERT_EQ(kill((*gpu)->pid(), SIGSTOP), 0);
  std::vector<WorkerDeath> dead = WaitForDeath();
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].role, Role::kGpuWorker);
  EXPECT_NE(dead[0].why.find("no heartbeat"), std::string::npos) << dead[0].why;
  const Role roles[] = {Role::kGpuWorker};
  auto epoch = sup_->Restart(roles);
  EXPECT_EQ(epoch.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(epoch.status().message().find("attach mode"), std::string::npos) << epoch.status();
  sup_.reset();  // attach mode leaves the workers alone...
  EXPECT_FALSE((*cpu)->Exited());
  // ...and they are ours to end (WorkerProcess kills and reaps on destruction).
}

TEST(DescribeWaitStatus, NamesExitCodesAndSignals) {
  EXPECT_EQ(DescribeWaitStatus(3 << 8), "exited with status 3");
  EXPECT_EQ(DescribeWaitStatus(SIGKILL), "killed by signal 9 (Killed)");
}

}  // namespace
}  // namespace thermocline::driver
