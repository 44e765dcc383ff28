// Real processes over the shared-memory transport: this test is the gateway (segment owner);
// tests/helpers/ipc_peer is spawned as the gpu_worker or as a rival owner. Checks every byte of
// 100000 messages each way, that a producer killed between Reserve and Commit never hands over
// a torn message, and that no segment is left in /dev/shm.
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "shared/ipc/ring.h"
#include "shared/ipc/transport.h"
#include "tests/helpers/ipc_payload.h"
#include "tests/process_spawn.h"
#include "tests/test_support.h"

namespace thermocline::ipc {
namespace {

using testing::CheckStreamMessage;
using testing::FillStreamMessage;
using testing::StreamMessageSize;

constexpr absl::Duration kOpTimeout = absl::Seconds(60);

// A spawned ipc_peer with pipes on its stdin and stdout; killed and reaped on destruction.
class Peer {
 public:
  explicit Peer(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {thermocline::testing::BinDir() + "/ipc_peer"};
    argv.insert(argv.end(), args.begin(), args.end());
    auto child =
        thermocline::testing::SpawnProcess(argv, {.stdin_pipe = true, .stdout_pipe = true});
    if (!child.ok()) {
      ADD_FAILURE() << child.status();
      return;
    }
    pid_ = child->pid;
    stdin_ = child->stdin_fd;
    stdout_ = child->stdout_fd;
  }
  ~Peer() {
    Kill();
    if (stdin_ >= 0) close(stdin_);
    if (stdout_ >= 0) close(stdout_);
  }

  pid_t pid() const { return pid_; }

  // The next line of the peer's stdout, or "" after `timeout_ms` or at EOF.
  std::string ReadLine(int timeout_ms = 60000) {
    std::string line;
    for (;;) {
      pollfd p = {stdout_, POLLIN, 0};
      if (poll(&p, 1, timeout_ms) <= 0) return "";
      char c;
      if (read(stdout_, &c, 1) != 1) return "";
      if (c == '\n') return line;
      line.push_back(c);
    }
  }
  void CloseStdin() {
    close(stdin_);
    stdin_ = -1;
  }
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // Exit status (128 + signal when killed by one).
  int Wait() {
    if (pid_ <= 0) return -1;
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
  int stdin_ = -1;
  int stdout_ = -1;
};

class IpcProcesses : public ::testing::Test {
 protected:
  IpcProcesses() {
    static int counter = 0;
    instance_ = "ipcproc-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
  }
  // The cleanup check of every test: whatever happened, nothing of this instance may remain.
  void TearDown() override {
    std::vector<std::string> left = ListInstanceSegments(instance_);
    for (const std::string& name : left) shm_unlink(("/" + name).c_str());
    EXPECT_TRUE(left.empty()) << "left in /dev/shm: " << left.front();
  }

  std::unique_ptr<Transport> CreateGateway(uint64_t capacity = 1 << 16) {
    TransportOptions options;
    options.ring_capacity = {capacity, capacity, capacity, capacity};
    auto t = Transport::Create(instance_, options);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? std::move(*t) : nullptr;
  }

  std::vector<std::string> PeerArgs(const char* mode, uint64_t count, uint64_t seed,
                                    uint64_t max_bytes) {
    return {mode,
            "--instance",
            instance_,
            "--count",
            std::to_string(count),
            "--seed",
            std::to_string(seed),
            "--max-bytes",
            std::to_string(max_bytes)};
  }

  std::string instance_;
};

// Receives and checks messages [first, first + n) of stream `seed`.
void ExpectStream(RingConsumer& in, uint64_t seed, uint64_t first, uint64_t n, uint64_t max_bytes,
                  absl::Duration timeout = kOpTimeout) {
  for (uint64_t i = first; i < first + n; ++i) {
    auto m = in.Peek(timeout);
    ASSERT_TRUE(m.ok()) << "message " << i << ": " << m.status();
    ASSERT_EQ(m->header.step_id, i) << "lost, duplicated or reordered";
    ASSERT_EQ(m->header.layer, i % 97);
    ASSERT_EQ(CheckStreamMessage(seed, i, max_bytes, m->payload), "");
    ASSERT_TRUE(in.Release().ok());
  }
}

TEST_F(IpcProcesses, HundredThousandMessagesEachWay) {
  constexpr uint64_t kCount = 100000;
  constexpr uint64_t kMaxBytes = 4000;
  auto gw = CreateGateway();
  ASSERT_NE(gw, nullptr);
  auto out = gw->Producer(RingId::kGatewayToGpu);
  auto in = gw->Consumer(RingId::kGpuToGateway);
  ASSERT_TRUE(out.ok() && in.ok());
  Peer peer(PeerArgs("duplex", kCount, 7, kMaxBytes));
  absl::Status produced;
  std::thread producer([&] {
    for (uint64_t i = 0; i < kCount && produced.ok(); ++i) {
      auto buf = out->Reserve(StreamMessageSize(8, i, kMaxBytes), kOpTimeout);
      if (!buf.ok()) {
        produced = buf.status();
        break;
      }
      FillStreamMessage(8, i, *buf);
      produced = out->Commit(MessageInfo{MessageKind::kBytes, i, static_cast<uint32_t>(i % 97)});
    }
  });
  ExpectStream(*in, 7, 0, kCount, kMaxBytes);
  producer.join();
  EXPECT_TRUE(produced.ok()) << produced;
  EXPECT_EQ(peer.Wait(), 0) << "the peer found a bad message (see its stderr)";
  EXPECT_EQ(in->dropped_stale(), 0u);
  // The worker exited cleanly: its slot says so.
  ProcessInfo gpu = gw->Process(Role::kGpuWorker);
  EXPECT_EQ(gpu.state, ProcessState::kStopped);
  EXPECT_EQ(gpu.pid, 0);
  gw.reset();
  EXPECT_TRUE(ListInstanceSegments(instance_).empty());
}

TEST_F(IpcProcesses, ProducerKilledBetweenReserveAndCommit) {
  constexpr uint64_t kMaxBytes = 3000;
  auto gw = CreateGateway();
  ASSERT_NE(gw, nullptr);
  auto in = gw->Consumer(RingId::kGpuToGateway);
  ASSERT_TRUE(in.ok());
  {
    Peer peer(PeerArgs("stall", 10, 5, kMaxBytes));
    ASSERT_EQ(peer.ReadLine(), "stalled");
    peer.Kill();
  }
  // The half-written message is in the ring's memory...
  const auto* cb = static_cast<const ControlBlock*>(gw->segment().base());
  const RingDescriptor& d = cb->rings[static_cast<int>(RingId::kGpuToGateway)];
  const auto* data =
      static_cast<const uint8_t*>(gw->segment().base()) + d.offset + sizeof(RingControl);
  uint64_t run = 0, longest = 0;
  for (uint64_t k = 0; k < d.capacity; ++k) {
    run = data[k] == 0xab ? run + 1 : 0;
    longest = std::max(longest, run);
  }
  EXPECT_GE(longest, kMaxBytes / 2) << "the stalled write is not in the ring";
  // ...but only the ten committed messages come out, then nothing.
  ExpectStream(*in, 5, 0, 10, kMaxBytes);
  auto none = in->Peek(absl::Milliseconds(200));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kDeadlineExceeded) << none.status();

  // A restarted producer (new epoch) resumes at the published head, over the torn bytes.
  auto epoch = gw->BumpEpoch();
  ASSERT_TRUE(epoch.ok());
  in->set_min_epoch(*epoch);
  Peer again(PeerArgs("produce", 50, 21, kMaxBytes));
  ExpectStream(*in, 21, 0, 50, kMaxBytes);
  EXPECT_EQ(again.Wait(), 0);
  EXPECT_EQ(gw->Process(Role::kGpuWorker).epoch, *epoch);
}

TEST_F(IpcProcesses, RandomKillsNeverDeliverTornMessages) {
  constexpr uint64_t kMaxBytes = 3000;
  auto gw = CreateGateway();
  ASSERT_NE(gw, nullptr);
  auto in = gw->Consumer(RingId::kGpuToGateway);
  ASSERT_TRUE(in.ok());
  std::mt19937_64 rng(12345);
  for (uint64_t round = 0; round < 6; ++round) {
    const uint64_t seed = 100 + round;
    std::vector<std::string> args = PeerArgs("produce", 0, seed, kMaxBytes);
    args.insert(args.end(), {"--dawdle-us", "20"});
    Peer peer(args);
    const uint64_t before_kill = 1 + rng() % 2000;
    ExpectStream(*in, seed, 0, before_kill, kMaxBytes);
    peer.Kill();  // most likely between a Reserve and its Commit
    // Everything committed before the kill is whole; then the ring is quiet.
    uint64_t i = before_kill;
    for (;; ++i) {
      auto m = in->Peek(absl::Milliseconds(100));
      if (!m.ok()) {
        ASSERT_EQ(m.status().code(), absl::StatusCode::kDeadlineExceeded) << m.status();
        break;
      }
      ASSERT_EQ(m->header.step_id, i);
      ASSERT_EQ(CheckStreamMessage(seed, i, kMaxBytes, m->payload), "") << "round " << round;
      ASSERT_TRUE(in->Release().ok());
    }
    auto epoch = gw->BumpEpoch();
    ASSERT_TRUE(epoch.ok());
    in->set_min_epoch(*epoch);
  }
}

TEST_F(IpcProcesses, RivalOwnerIsRefusedAndItsLeftoversCleanedAfterKill) {
  Peer owner({"own", "--instance", instance_});
  ASSERT_EQ(owner.ReadLine().rfind("ready", 0), 0u);
  auto mine = Transport::Create(instance_);
  ASSERT_EQ(mine.status().code(), absl::StatusCode::kFailedPrecondition) << mine.status();
  EXPECT_NE(std::string(mine.status().message()).find(std::to_string(owner.pid())),
            std::string::npos);
  auto worker = Transport::Attach(instance_, Role::kCpuWorker);
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_TRUE((*worker)->OwnerAlive());
  owner.Kill();
  EXPECT_FALSE((*worker)->OwnerAlive());
  ASSERT_EQ(ListInstanceSegments(instance_).size(), 1u);  // SIGKILL ran no destructor
  EXPECT_EQ(Transport::Attach(instance_, Role::kGpuWorker).status().code(),
            absl::StatusCode::kFailedPrecondition);  // stale: no new worker joins it
  auto removed = Transport::RemoveStale(instance_);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_TRUE(*removed);
  EXPECT_TRUE(ListInstanceSegments(instance_).empty());
}

TEST_F(IpcProcesses, OwnerCleanExitRemovesSegment) {
  Peer owner({"own", "--instance", instance_});
  ASSERT_EQ(owner.ReadLine().rfind("ready", 0), 0u);
  EXPECT_EQ(ListInstanceSegments(instance_).size(), 1u);
  owner.CloseStdin();
  EXPECT_EQ(owner.Wait(), 0);
  EXPECT_TRUE(ListInstanceSegments(instance_).empty());
}

TEST_F(IpcProcesses, KilledOwnerIsReplacedByTheNextGateway) {
  {
    Peer owner({"own", "--instance", instance_});
    ASSERT_EQ(owner.ReadLine().rfind("ready", 0), 0u);
  }  // killed
  auto gw = CreateGateway();
  ASSERT_NE(gw, nullptr);
  EXPECT_NE(gw->replaced_reason(), "");
  Peer peer(PeerArgs("produce", 100, 3, 500));
  auto in = gw->Consumer(RingId::kGpuToGateway);
  ASSERT_TRUE(in.ok());
  ExpectStream(*in, 3, 0, 100, 500);
  EXPECT_EQ(peer.Wait(), 0);
}

}  // namespace
}  // namespace thermocline::ipc
