// The other process of the ipc integration tests. It plays the owner (gateway) or the
// gpu_worker of an instance, and streams deterministic messages (tests/helpers/ipc_payload.h)
// so the test can check every byte. Modes:
//   own     --instance I                create the transport, print "ready", exit cleanly at
//                                       stdin EOF (the destructor removes the segment)
//   produce --instance I --count N      attach as gpu_worker, send N messages of stream
//           --seed S --max-bytes M      `seed` on gpu->gateway (N = 0: forever); with
//           [--dawdle-us D]             --dawdle-us, keep rewriting each payload for D us
//                                       between Reserve and Commit
//   stall   (produce's flags)           send N messages, reserve a max-bytes message, write
//                                       half of it, print "stalled" and wait to be killed
//   duplex  (produce's flags)           send N on gpu->gateway while receiving and checking N
//                                       of stream seed+1 on gateway->gpu
// Exit status: 0 success, 1 a message failed its check, 2 bad usage, 3 an ipc error.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "shared/ipc/futex.h"
#include "shared/ipc/ring.h"
#include "shared/ipc/transport.h"
#include "tests/helpers/ipc_payload.h"

namespace thermocline::ipc {
namespace {

// A live peer never waits this long; it bounds a hang to a test failure.
constexpr absl::Duration kOpTimeout = absl::Seconds(60);

struct Args {
  std::string mode;
  std::string instance;
  uint64_t count = 0;
  uint64_t seed = 1;
  uint64_t max_bytes = 1024;
  uint64_t dawdle_us = 0;  // busy time between Reserve and Commit: widens the torn-write window
};

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "ipc_peer: %s\n", s.ToString().c_str());
  return 3;
}

absl::Status Produce(RingProducer& ring, uint64_t seed, uint64_t count, uint64_t max_bytes,
                     uint64_t dawdle_us = 0) {
  for (uint64_t i = 0; count == 0 || i < count; ++i) {
    uint64_t size = testing::StreamMessageSize(seed, i, max_bytes);
    absl::StatusOr<absl::Span<std::byte>> out = ring.Reserve(size, kOpTimeout);
    if (!out.ok()) return out.status();
    testing::FillStreamMessage(seed, i, *out);
    if (dawdle_us > 0) {
      // Rewrite the payload byte by byte for a while: a kill now lands mid-write.
      int64_t until = MonotonicNs() + static_cast<int64_t>(dawdle_us) * 1000;
      while (MonotonicNs() < until) {
        for (std::byte& b : *out) b = static_cast<std::byte>(~static_cast<uint8_t>(b));
      }
      testing::FillStreamMessage(seed, i, *out);
    }
    absl::Status s =
        ring.Commit(MessageInfo{MessageKind::kBytes, i, static_cast<uint32_t>(i % 97)});
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

int RunOwn(const Args& a) {
  TransportOptions options;
  options.ring_capacity = {1 << 16, 1 << 16, 1 << 16, 1 << 16};
  auto t = Transport::Create(a.instance, options);
  if (!t.ok()) return Fail(t.status());
  std::printf("ready %d\n", static_cast<int>(getpid()));
  std::fflush(stdout);
  char buf[256];
  while (read(0, buf, sizeof buf) > 0) {
  }
  return 0;
}

int RunProduce(const Args& a, bool stall) {
  auto t = Transport::Attach(a.instance, Role::kGpuWorker);
  if (!t.ok()) return Fail(t.status());
  (*t)->SetState(ProcessState::kReady);
  auto ring = (*t)->Producer(RingId::kGpuToGateway);
  if (!ring.ok()) return Fail(ring.status());
  if (absl::Status s = Produce(*ring, a.seed, a.count, a.max_bytes, a.dawdle_us); !s.ok()) {
    return Fail(s);
  }
  if (stall) {
    uint64_t size = a.max_bytes;
    auto out = ring->Reserve(size, kOpTimeout);
    if (!out.ok()) return Fail(out.status());
    // Half of the real message, so that if it ever surfaced it would fail its checksum.
    testing::FillStreamMessage(a.seed, a.count, *out);
    std::memset(out->data() + size / 2, 0xab, size - size / 2);
    std::printf("stalled\n");
    std::fflush(stdout);
    for (;;) pause();
  }
  return 0;
}

int RunDuplex(const Args& a) {
  auto t = Transport::Attach(a.instance, Role::kGpuWorker);
  if (!t.ok()) return Fail(t.status());
  (*t)->SetState(ProcessState::kReady);
  auto out = (*t)->Producer(RingId::kGpuToGateway);
  if (!out.ok()) return Fail(out.status());
  auto in = (*t)->Consumer(RingId::kGatewayToGpu);
  if (!in.ok()) return Fail(in.status());
  absl::Status produced;
  std::thread producer([&] { produced = Produce(*out, a.seed, a.count, a.max_bytes); });
  int rc = 0;
  for (uint64_t i = 0; i < a.count; ++i) {
    auto m = in->Peek(kOpTimeout);
    if (!m.ok()) {
      rc = Fail(m.status());
      break;
    }
    std::string err = testing::CheckStreamMessage(a.seed + 1, i, a.max_bytes, m->payload);
    if (err.empty() && m->header.step_id != i) err = "out of order";
    if (!err.empty()) {
      std::fprintf(stderr, "ipc_peer: %s\n", err.c_str());
      rc = 1;
      break;
    }
    (void)in->Release();
  }
  producer.join();
  if (rc == 0 && !produced.ok()) rc = Fail(produced);
  return rc;
}

int Main(int argc, char** argv) {
  if (argc < 2) return 2;
  Args a;
  a.mode = argv[1];
  std::map<std::string, std::string> flags;
  for (int i = 2; i + 1 < argc; i += 2) flags[argv[i]] = argv[i + 1];
  a.instance = flags["--instance"];
  if (flags.count("--count")) a.count = std::strtoull(flags["--count"].c_str(), nullptr, 10);
  if (flags.count("--seed")) a.seed = std::strtoull(flags["--seed"].c_str(), nullptr, 10);
  if (flags.count("--max-bytes")) {
    a.max_bytes = std::strtoull(flags["--max-bytes"].c_str(), nullptr, 10);
  }
  if (flags.count("--dawdle-us")) {
    a.dawdle_us = std::strtoull(flags["--dawdle-us"].c_str(), nullptr, 10);
  }
  if (a.mode == "own") return RunOwn(a);
  if (a.mode == "produce") return RunProduce(a, false);
  if (a.mode == "stall") return RunProduce(a, true);
  if (a.mode == "duplex") return RunDuplex(a);
  std::fprintf(stderr, "ipc_peer: unknown mode %s\n", a.mode.c_str());
  return 2;
}

}  // namespace
}  // namespace thermocline::ipc

int main(int argc, char** argv) { return thermocline::ipc::Main(argc, argv); }
