// Segment and transport lifecycle: names, permissions, ownership, stale segments left by dead
// owners or other builds, validation at attach, process slots and epochs.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/ipc/segment.h"
#include "shared/ipc/transport.h"

namespace thermocline::ipc {
namespace {

std::string UniqueInstance(const char* tag) {
  static int counter = 0;
  return "ipcseg-" + std::to_string(getpid()) + "-" + tag + "-" + std::to_string(counter++);
}

std::string ShmPath(const std::string& instance) {
  return "/dev/shm/thermocline-" + instance + "-transport";
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

TransportOptions Small() {
  TransportOptions o;
  o.ring_capacity = {4096, 4096, 8192, 8192};
  return o;
}

// Runs `body` in a forked child that then vanishes without running destructors, like a
// process killed with SIGKILL. Returns the child's pid, reaped unless `reap` is false.
template <typename F>
pid_t InDyingChild(F body, bool reap = true) {
  pid_t pid = fork();
  if (pid == 0) {
    body();
    _exit(0);
  }
  if (reap) waitpid(pid, nullptr, 0);
  return pid;
}

// Removes whatever a test left, even after a failed assertion.
struct Cleanup {
  std::string instance;
  ~Cleanup() {
    for (const std::string& name : ListInstanceSegments(instance)) {
      shm_unlink(("/" + name).c_str());
    }
  }
};

TEST(IpcSegment, InstanceNames) {
  for (const std::string& ok :
       std::vector<std::string>{"default", "A-z_09", std::string(64, 'x'), "0"}) {
    EXPECT_TRUE(ValidateInstanceName(ok).ok()) << ok;
  }
  for (std::string bad :
       {std::string(), std::string(65, 'x'), std::string("a/b"), std::string("a.b"),
        std::string("a b"), std::string("\xc3\xa4"), std::string("..")}) {
    EXPECT_EQ(ValidateInstanceName(bad).code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(Transport::Create(bad, Small()).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(Transport::Attach(bad, Role::kGpuWorker).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(*SegmentName("inst", "transport"), "thermocline-inst-transport");
  EXPECT_FALSE(SegmentName("inst", "a-b").ok());
}

TEST(IpcSegment, CreatedWithMode0600AndRemovedOnDestruction) {
  std::string instance = UniqueInstance("mode");
  Cleanup cleanup{instance};
  mode_t old = umask(0);  // the mode must not depend on the caller's umask
  auto t = Transport::Create(instance, Small());
  umask(old);
  ASSERT_TRUE(t.ok()) << t.status();
  struct stat st;
  ASSERT_EQ(stat(ShmPath(instance).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_uid, getuid());
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), TransportSegmentBytes(Small()));
  EXPECT_EQ((*t)->replaced_reason(), "");
  EXPECT_EQ(ListInstanceSegments(instance).size(), 1u);
  t->reset();
  EXPECT_FALSE(Exists(ShmPath(instance)));
  EXPECT_TRUE(ListInstanceSegments(instance).empty());
}

TEST(IpcSegment, LiveOwnerIsRefused) {
  std::string instance = UniqueInstance("live");
  Cleanup cleanup{instance};
  auto first = Transport::Create(instance, Small());
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = Transport::Create(instance, Small());
  ASSERT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  std::string msg(second.status().message());
  EXPECT_NE(msg.find("in use"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(getpid())), std::string::npos) << msg;
  EXPECT_EQ(Transport::RemoveStale(instance).value_or(true), false);
  // The refusal left the first owner's segment alone.
  EXPECT_TRUE(Exists(ShmPath(instance)));
  EXPECT_TRUE(Transport::Attach(instance, Role::kGpuWorker).ok());
}

TEST(IpcSegment, DeadOwnersSegmentIsReplaced) {
  std::string instance = UniqueInstance("dead");
  Cleanup cleanup{instance};
  pid_t child = InDyingChild([&] { (void)Transport::Create(instance, Small())->release(); });
  ASSERT_TRUE(Exists(ShmPath(instance)));
  auto w = Transport::Attach(instance, Role::kGpuWorker);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kFailedPrecondition) << w.status();
  EXPECT_NE(std::string(w.status().message()).find("stale"), std::string::npos) << w.status();
  auto t = Transport::Create(instance, Small());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_NE((*t)->replaced_reason().find("pid " + std::to_string(child) + " is dead"),
            std::string::npos)
      << (*t)->replaced_reason();
  EXPECT_EQ((*t)->epoch(), 1u);
  EXPECT_TRUE(Transport::Attach(instance, Role::kCpuWorker).ok());
  t->reset();
  EXPECT_FALSE(Exists(ShmPath(instance)));
}

TEST(IpcSegment, ZombieOwnerCountsAsDead) {
  std::string instance = UniqueInstance("zombie");
  Cleanup cleanup{instance};
  pid_t child = InDyingChild([&] { (void)Transport::Create(instance, Small())->release(); },
                             /*reap=*/false);
  // Wait for the child to exit without reaping it.
  siginfo_t info;
  ASSERT_EQ(waitid(P_PID, child, &info, WEXITED | WNOWAIT), 0);
  auto t = Transport::Create(instance, Small());
  EXPECT_TRUE(t.ok()) << t.status();
  waitpid(child, nullptr, 0);
}

TEST(IpcSegment, ForeignSegmentIsReplaced) {
  std::string instance = UniqueInstance("foreign");
  Cleanup cleanup{instance};
  int fd = shm_open(("/thermocline-" + instance + "-transport").c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  std::string junk(8192, '\x77');
  ASSERT_EQ(write(fd, junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
  close(fd);
  EXPECT_EQ(Transport::Attach(instance, Role::kGpuWorker).status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto t = Transport::Create(instance, Small());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_NE((*t)->replaced_reason().find("not a Thermocline segment"), std::string::npos)
      << (*t)->replaced_reason();
}

// Another local user creates the predictable name first: a valid-looking live segment (made
// here, then given to uid 65534) and a junk file. Neither is attached to, replaced or removed;
// each refusal names the owner. Only root can hand a file to another uid.
TEST(IpcSegment, SegmentOfAnotherUserIsRefusedNamingItsOwner) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a segment to another uid";
  constexpr uid_t kOther = 65534;
  {
    std::string instance = UniqueInstance("squat");
    Cleanup cleanup{instance};
    auto mine = Transport::Create(instance, Small());
    ASSERT_TRUE(mine.ok()) << mine.status();
    ASSERT_EQ(chown(ShmPath(instance).c_str(), kOther, kOther), 0);
    auto attached = Transport::Attach(instance, Role::kGpuWorker);
    EXPECT_EQ(attached.status().code(), absl::StatusCode::kPermissionDenied) << attached.status();
    EXPECT_NE(attached.status().message().find("uid 65534"), std::string::npos)
        << attached.status();
  }
  {
    std::string instance = UniqueInstance("squatjunk");
    Cleanup cleanup{instance};
    int fd = shm_open(("/thermocline-" + instance + "-transport").c_str(), O_CREAT | O_RDWR, 0666);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(fchown(fd, kOther, kOther), 0);
    close(fd);
    auto created = Transport::Create(instance, Small());
    EXPECT_EQ(created.status().code(), absl::StatusCode::kPermissionDenied) << created.status();
    EXPECT_NE(created.status().message().find("uid 65534"), std::string::npos)
        << created.status();
    EXPECT_NE(created.status().message().find("another user"), std::string::npos);
    EXPECT_EQ(Transport::RemoveStale(instance).status().code(),
              absl::StatusCode::kPermissionDenied);
    EXPECT_TRUE(Exists(ShmPath(instance))) << "another user's file was removed";
  }
}

TEST(IpcSegment, UnpublishedSegmentIsReplacedAfterGrace) {
  std::string instance = UniqueInstance("empty");
  Cleanup cleanup{instance};
  int fd = shm_open(("/thermocline-" + instance + "-transport").c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  close(fd);
  EXPECT_EQ(Transport::Attach(instance, Role::kGpuWorker).status().code(),
            absl::StatusCode::kUnavailable);
  auto t = Transport::Create(instance, Small());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_NE((*t)->replaced_reason().find("never published"), std::string::npos)
      << (*t)->replaced_reason();
}

TEST(IpcSegment, OtherLayoutVersion) {
  std::string instance = UniqueInstance("version");
  Cleanup cleanup{instance};
  auto noop = [](void*) { return absl::OkStatus(); };
  {
    // Live owner from another build: refused, and workers of this build will not attach.
    auto other = SharedSegment::Create(instance, kTransportSegment, 4096, 999, noop);
    ASSERT_TRUE(other.ok()) << other.status();
    auto t = Transport::Create(instance, Small());
    EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition) << t.status();
    auto w = Transport::Attach(instance, Role::kGpuWorker);
    EXPECT_EQ(w.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(std::string(w.status().message()).find("layout version 999"), std::string::npos)
        << w.status();
  }
  // Dead owner from another build: replaced.
  InDyingChild([&] {
    (void)SharedSegment::Create(instance, kTransportSegment, 4096, 999, noop)->release();
  });
  auto t = Transport::Create(instance, Small());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_NE((*t)->replaced_reason(), "");
}

TEST(IpcSegment, RemoveStale) {
  std::string instance = UniqueInstance("rmstale");
  Cleanup cleanup{instance};
  EXPECT_EQ(Transport::RemoveStale(instance).value_or(true), false);  // nothing there
  InDyingChild([&] { (void)Transport::Create(instance, Small())->release(); });
  ASSERT_EQ(ListInstanceSegments(instance).size(), 1u);
  EXPECT_EQ(Transport::RemoveStale(instance).value_or(false), true);
  EXPECT_TRUE(ListInstanceSegments(instance).empty());
}

TEST(IpcSegment, InstancesDoNotTouchEachOther) {
  std::string a = UniqueInstance("pair");
  std::string b = a + "-b";  // a prefix of the other's name must not confuse anything
  Cleanup ca{a}, cb{b};
  auto ta = Transport::Create(a, Small());
  auto tb = Transport::Create(b, Small());
  ASSERT_TRUE(ta.ok() && tb.ok());
  EXPECT_EQ(ListInstanceSegments(a), std::vector<std::string>{"thermocline-" + a + "-transport"});
  EXPECT_EQ(ListInstanceSegments(b), std::vector<std::string>{"thermocline-" + b + "-transport"});
  auto wa = Transport::Attach(a, Role::kGpuWorker);
  auto wb = Transport::Attach(b, Role::kGpuWorker);
  ASSERT_TRUE(wa.ok() && wb.ok());
  auto pa = (*ta)->Producer(RingId::kGatewayToGpu);
  ASSERT_TRUE(pa.ok());
  ASSERT_TRUE(pa->Send(MessageInfo{MessageKind::kBytes, 1, 0}, {}).ok());
  auto ca_ring = (*wa)->Consumer(RingId::kGatewayToGpu);
  auto cb_ring = (*wb)->Consumer(RingId::kGatewayToGpu);
  ASSERT_TRUE(ca_ring.ok() && cb_ring.ok());
  EXPECT_TRUE(ca_ring->Peek(absl::ZeroDuration()).ok());
  EXPECT_EQ(cb_ring->Peek(absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  (*ta)->BumpEpoch().IgnoreError();
  EXPECT_EQ((*tb)->epoch(), 1u);
  ta->reset();
  EXPECT_TRUE(ListInstanceSegments(a).empty());
  EXPECT_EQ(ListInstanceSegments(b).size(), 1u);
}

TEST(IpcTransport, AttachNeedsAGateway) {
  std::string instance = UniqueInstance("absent");
  auto w = Transport::Attach(instance, Role::kGpuWorker);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(w.status().message()).find("gateway"), std::string::npos);
  Cleanup cleanup{instance};
  auto t = Transport::Create(instance, Small());
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(Transport::Attach(instance, Role::kGateway).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(IpcTransport, RolesRingsAndEpochs) {
  std::string instance = UniqueInstance("roles");
  Cleanup cleanup{instance};
  auto gw = Transport::Create(instance, Small());
  ASSERT_TRUE(gw.ok()) << gw.status();
  auto gpu = Transport::Attach(instance, Role::kGpuWorker);
  auto cpu = Transport::Attach(instance, Role::kCpuWorker);
  ASSERT_TRUE(gpu.ok() && cpu.ok());

  // Each role gets exactly its own ends.
  struct End {
    Transport* t;
    RingId ring;
    bool produce;
    bool allowed;
  };
  for (const End& e : std::vector<End>{
           {gw->get(), RingId::kGatewayToGpu, true, true},
           {gw->get(), RingId::kGpuToGateway, false, true},
           {gw->get(), RingId::kGpuToCpu, true, false},
           {gw->get(), RingId::kGatewayToGpu, false, false},
           {gpu->get(), RingId::kGpuToGateway, true, true},
           {gpu->get(), RingId::kGpuToCpu, true, true},
           {gpu->get(), RingId::kCpuToGpu, false, true},
           {gpu->get(), RingId::kGatewayToGpu, false, true},
           {gpu->get(), RingId::kCpuToGpu, true, false},
           {cpu->get(), RingId::kCpuToGpu, true, true},
           {cpu->get(), RingId::kGpuToCpu, false, true},
           {cpu->get(), RingId::kGpuToGateway, false, false},
       }) {
    absl::Status s = e.produce ? e.t->Producer(e.ring).status() : e.t->Consumer(e.ring).status();
    EXPECT_EQ(s.ok(), e.allowed) << RoleName(e.t->role()) << " " << RingName(e.ring) << ": " << s;
  }

  auto to_cpu = (*gpu)->Producer(RingId::kGpuToCpu);
  auto from_gpu = (*cpu)->Consumer(RingId::kGpuToCpu);
  ASSERT_TRUE(to_cpu.ok() && from_gpu.ok());
  EXPECT_EQ(to_cpu->capacity(), 8192u);
  ASSERT_TRUE(to_cpu->Send(MessageInfo{MessageKind::kBytes, 1, 0}, {}).ok());

  // A restart: the gateway starts epoch 2; the old epoch's message is dropped by a consumer
  // that learned the new epoch, and a new producer stamps it.
  EXPECT_EQ((*gpu)->BumpEpoch().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*(*gw)->BumpEpoch(), 2u);
  EXPECT_EQ((*cpu)->epoch(), 2u);
  auto to_cpu2 = (*gpu)->Producer(RingId::kGpuToCpu);
  ASSERT_TRUE(to_cpu2.ok());
  EXPECT_EQ(to_cpu2->epoch(), 2u);
  ASSERT_TRUE(to_cpu2->Send(MessageInfo{MessageKind::kBytes, 2, 0}, {}).ok());
  from_gpu->set_min_epoch((*cpu)->epoch());
  auto m = from_gpu->Peek(absl::ZeroDuration());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->header.step_id, 2u);
  EXPECT_EQ(m->header.epoch, 2u);
  EXPECT_EQ(from_gpu->dropped_stale(), 1u);
}

TEST(IpcTransport, ProcessSlotsHeartbeatsAndStates) {
  std::string instance = UniqueInstance("slots");
  Cleanup cleanup{instance};
  auto gw = Transport::Create(instance, Small());
  ASSERT_TRUE(gw.ok());
  EXPECT_EQ((*gw)->Process(Role::kGpuWorker).state, ProcessState::kAbsent);
  EXPECT_EQ((*gw)->HeartbeatAgeNs(Role::kGpuWorker), INT64_MAX);
  {
    auto gpu = Transport::Attach(instance, Role::kGpuWorker);
    ASSERT_TRUE(gpu.ok());
    (*gpu)->SetState(ProcessState::kReady);
    (*gpu)->Heartbeat();
    ProcessInfo p = (*gw)->Process(Role::kGpuWorker);
    EXPECT_EQ(p.pid, getpid());
    EXPECT_EQ(p.state, ProcessState::kReady);
    EXPECT_TRUE(p.alive);
    EXPECT_EQ(p.epoch, 1u);
    EXPECT_GE((*gw)->HeartbeatAgeNs(Role::kGpuWorker), 0);
    EXPECT_LT((*gw)->HeartbeatAgeNs(Role::kGpuWorker), INT64_MAX);
    EXPECT_TRUE((*gpu)->OwnerAlive());
  }
  ProcessInfo p = (*gw)->Process(Role::kGpuWorker);
  EXPECT_EQ(p.state, ProcessState::kStopped);
  EXPECT_EQ(p.pid, 0);
  EXPECT_FALSE(p.alive);

  // A slot held by a live process is refused; once that process dies it is taken over.
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t child = fork();
  if (child == 0) {
    auto w = Transport::Attach(instance, Role::kCpuWorker);
    char c = w.ok() ? 'y' : 'n';
    (void)!write(ready[1], &c, 1);
    for (;;) pause();
  }
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  close(ready[0]);
  close(ready[1]);
  ASSERT_EQ(c, 'y');
  auto refused = Transport::Attach(instance, Role::kCpuWorker);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(refused.status().message()).find(std::to_string(child)), std::string::npos);
  EXPECT_TRUE((*gw)->Process(Role::kCpuWorker).alive);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_FALSE((*gw)->Process(Role::kCpuWorker).alive);
  EXPECT_TRUE(Transport::Attach(instance, Role::kCpuWorker).ok());
}

TEST(IpcTransport, WorkerSeesOwnerExit) {
  std::string instance = UniqueInstance("owner");
  Cleanup cleanup{instance};
  auto gw = Transport::Create(instance, Small());
  ASSERT_TRUE(gw.ok());
  auto gpu = Transport::Attach(instance, Role::kGpuWorker);
  ASSERT_TRUE(gpu.ok());
  EXPECT_TRUE((*gpu)->OwnerAlive());
  gw->reset();
  EXPECT_FALSE((*gpu)->OwnerAlive());  // its mapping stays valid; the name is gone
  EXPECT_FALSE(Exists(ShmPath(instance)));
}

TEST(IpcTransport, AttachRejectsDamagedControlBlock) {
  std::string instance = UniqueInstance("damage");
  Cleanup cleanup{instance};
  auto gw = Transport::Create(instance, Small());
  ASSERT_TRUE(gw.ok());
  auto* cb = static_cast<ControlBlock*>((*gw)->segment().base());
  const uint64_t size = (*gw)->segment().size();
  RingDescriptor saved[kNumRings];
  std::memcpy(saved, cb->rings, sizeof saved);
  auto restore = [&] {
    std::memcpy(cb->rings, saved, sizeof saved);
    cb->ring_count = kNumRings;
  };
  auto expect_rejected = [&](const char* what) {
    auto w = Transport::Attach(instance, Role::kGpuWorker);
    EXPECT_EQ(w.status().code(), absl::StatusCode::kDataLoss) << what << ": " << w.status();
    restore();
  };
  cb->ring_count = 7;
  expect_rejected("ring count");
  cb->rings[1].capacity = 3000;
  expect_rejected("capacity not a power of two");
  cb->rings[2].offset = size - 64;
  expect_rejected("ring past the end");
  cb->rings[3].offset = ~uint64_t{63};
  expect_rejected("offset overflow");
  cb->rings[1].offset = cb->rings[0].offset + 64;
  expect_rejected("overlap");
  cb->rings[0].offset = 64;
  expect_rejected("ring over the control block");

  // A clobbered ring control block is caught when the ring is opened.
  auto gpu = Transport::Attach(instance, Role::kGpuWorker);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto* ring = reinterpret_cast<RingControl*>(static_cast<std::byte*>((*gw)->segment().base()) +
                                              cb->rings[0].offset);
  ring->capacity = 1 << 20;
  EXPECT_EQ((*gpu)->Consumer(RingId::kGatewayToGpu).status().code(), absl::StatusCode::kDataLoss);
  // The gateway can reformat it once both ends are quiescent.
  ASSERT_TRUE((*gw)->ResetRing(RingId::kGatewayToGpu).ok());
  EXPECT_TRUE((*gpu)->Consumer(RingId::kGatewayToGpu).ok());
}

}  // namespace
}  // namespace thermocline::ipc
