// Round-trip latency of the shared-memory transport between two processes, against hardware
// references measured in the same run.
//
//   ring_bench [--messages=100000] [--bytes=8192] [--waits=spin,hybrid,futex] [--pin]
//
// The bench is the gateway: it creates an instance, spawns itself as the gpu_worker, and
// ping-pongs `bytes`-byte messages through gateway->gpu and back through gpu->gateway (the
// echo copies the payload from one ring into the other, as a worker turning an input into an
// output would). One sample = Send + wait for the echo + Release. Wait policies:
//   spin    both sides spin until the message arrives (lowest latency, burns a core each)
//   hybrid  spin 20 us, then futex sleep (the default WaitPolicy)
//   futex   sleep on the futex at once (every hop pays a wake-up)
// References: memcpy of `bytes`; a cross-core round trip of one cache line between two threads
// (the floor any two-core handshake pays); a ring round trip in one thread (send + receive,
// two copies, no other core); and the ping-pong through two rings between two threads of one
// process (spin).
// Targets (issue 4): two-process p50 <= 5 us, p99 <= 50 us.
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "shared/ipc/futex.h"
#include "shared/ipc/ring.h"
#include "shared/ipc/transport.h"

extern char** environ;

namespace thermocline::ipc {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(20);

struct Options {
  uint64_t messages = 100000;
  uint64_t bytes = 8192;
  std::vector<std::string> waits = {"spin", "hybrid", "futex"};
  bool pin = false;
};

WaitPolicy PolicyNamed(std::string_view name) {
  if (name == "spin") return WaitPolicy{absl::InfiniteDuration(), false};
  if (name == "futex") return WaitPolicy{absl::ZeroDuration(), true};
  return WaitPolicy{};  // hybrid
}

void Pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu % static_cast<int>(std::thread::hardware_concurrency()), &set);
  sched_setaffinity(0, sizeof set, &set);
}

struct Stats {
  double p50 = 0, p99 = 0, p999 = 0, max = 0, mean = 0;
};

Stats Summarize(std::vector<int64_t> ns) {
  Stats s;
  if (ns.empty()) return s;
  std::sort(ns.begin(), ns.end());
  auto at = [&](double q) {
    return ns[std::min(ns.size() - 1, static_cast<size_t>(q * static_cast<double>(ns.size())))] /
           1000.0;
  };
  s.p50 = at(0.50);
  s.p99 = at(0.99);
  s.p999 = at(0.999);
  s.max = ns.back() / 1000.0;
  double sum = 0;
  for (int64_t v : ns) sum += static_cast<double>(v);
  s.mean = sum / static_cast<double>(ns.size()) / 1000.0;
  return s;
}

void PrintRow(const char* what, const Stats& s) {
  std::printf("  %-44s %9.3f %9.3f %9.3f %9.3f %9.3f\n", what, s.p50, s.p99, s.p999, s.max, s.mean);
}

// --- child: the echoing gpu_worker ----------------------------------------------------------

int Child(const std::string& instance, const std::string& wait, bool pin) {
  if (pin) Pin(1);
  auto t = Transport::Attach(instance, Role::kGpuWorker);
  if (!t.ok()) {
    std::fprintf(stderr, "ring_bench child: %s\n", t.status().ToString().c_str());
    return 1;
  }
  WaitPolicy policy = PolicyNamed(wait);
  auto in = (*t)->Consumer(RingId::kGatewayToGpu, policy);
  auto out = (*t)->Producer(RingId::kGpuToGateway, policy);
  if (!in.ok() || !out.ok()) {
    std::fprintf(stderr, "ring_bench child: %s\n",
                 (!in.ok() ? in.status() : out.status()).ToString().c_str());
    return 1;
  }
  for (;;) {
    auto m = in->Peek(absl::Seconds(60));
    if (!m.ok()) {
      std::fprintf(stderr, "ring_bench child: %s\n", m.status().ToString().c_str());
      return 1;
    }
    if (m->kind() == MessageKind::kShutdown) return 0;
    auto dst = out->Reserve(m->payload.size(), kTimeout);
    if (!dst.ok()) {
      std::fprintf(stderr, "ring_bench child: %s\n", dst.status().ToString().c_str());
      return 1;
    }
    std::memcpy(dst->data(), m->payload.data(), m->payload.size());
    absl::Status st = out->Commit(MessageInfo{MessageKind::kBytes, m->header.step_id, 0});
    if (st.ok()) st = in->Release();
    if (!st.ok()) {
      std::fprintf(stderr, "ring_bench child: %s\n", st.ToString().c_str());
      return 1;
    }
  }
}

// --- references ------------------------------------------------------------------------------

Stats MemcpyReference(uint64_t bytes, uint64_t samples) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  std::vector<int64_t> ns;
  ns.reserve(samples);
  constexpr int kInner = 16;  // one copy is near the clock's resolution
  for (uint64_t i = 0; i < samples; ++i) {
    int64_t t0 = MonotonicNs();
    for (int k = 0; k < kInner; ++k) {
      std::memcpy(k % 2 ? a.data() : b.data(), k % 2 ? b.data() : a.data(), bytes);
      asm volatile("" ::: "memory");
    }
    ns.push_back((MonotonicNs() - t0) / kInner);
  }
  return Summarize(std::move(ns));
}

Stats CacheLineReference(uint64_t samples, bool pin) {
  alignas(64) std::atomic<uint64_t> ping{0};
  alignas(64) std::atomic<uint64_t> pong{0};
  std::thread echo([&] {
    if (pin) Pin(1);
    for (uint64_t i = 1; i <= samples; ++i) {
      while (ping.load(std::memory_order_acquire) != i) CpuRelax();
      pong.store(i, std::memory_order_release);
    }
  });
  std::vector<int64_t> ns;
  ns.reserve(samples);
  for (uint64_t i = 1; i <= samples; ++i) {
    int64_t t0 = MonotonicNs();
    ping.store(i, std::memory_order_release);
    while (pong.load(std::memory_order_acquire) != i) CpuRelax();
    ns.push_back(MonotonicNs() - t0);
  }
  echo.join();
  return Summarize(std::move(ns));
}

struct HeapRing {
  explicit HeapRing(uint64_t capacity)
      : bytes(RingRegionBytes(capacity)), mem(::operator new(bytes, std::align_val_t(64))) {
    (void)InitRing(mem, bytes, capacity);
  }
  ~HeapRing() { ::operator delete(mem, std::align_val_t(64)); }
  RingProducer Producer(WaitPolicy w) {
    RingOptions o;
    o.wait = w;
    return *RingProducer::Attach(mem, bytes, bytes - sizeof(RingControl), o);
  }
  RingConsumer Consumer(WaitPolicy w) {
    RingOptions o;
    o.wait = w;
    return *RingConsumer::Attach(mem, bytes, bytes - sizeof(RingControl), o);
  }
  uint64_t bytes;
  void* mem;
};

Stats SameThreadRing(uint64_t bytes, uint64_t samples) {
  HeapRing ring(1 << 20);
  RingProducer p = ring.Producer({});
  RingConsumer c = ring.Consumer({});
  std::vector<std::byte> msg(bytes, std::byte{1}), got;
  std::vector<int64_t> ns;
  ns.reserve(samples);
  for (uint64_t i = 0; i < samples; ++i) {
    int64_t t0 = MonotonicNs();
    (void)p.Send(MessageInfo{MessageKind::kBytes, i, 0}, msg);
    (void)c.Receive(&got);
    ns.push_back(MonotonicNs() - t0);
  }
  return Summarize(std::move(ns));
}

// The same ping-pong as between processes, with the echo on a thread of this process.
Stats TwoThreadRings(uint64_t bytes, uint64_t samples, bool pin) {
  HeapRing there(1 << 20), back(1 << 20);
  WaitPolicy spin = PolicyNamed("spin");
  std::thread echo([&] {
    if (pin) Pin(1);
    RingConsumer in = there.Consumer(spin);
    RingProducer out = back.Producer(spin);
    for (uint64_t i = 0; i < samples; ++i) {
      auto m = in.Peek(kTimeout);
      if (!m.ok()) return;
      auto dst = out.Reserve(m->payload.size(), kTimeout);
      if (!dst.ok()) return;
      std::memcpy(dst->data(), m->payload.data(), m->payload.size());
      (void)out.Commit(MessageInfo{});
      (void)in.Release();
    }
  });
  RingProducer out = there.Producer(spin);
  RingConsumer in = back.Consumer(spin);
  std::vector<std::byte> msg(bytes, std::byte{1});
  std::vector<int64_t> ns;
  ns.reserve(samples);
  for (uint64_t i = 0; i < samples; ++i) {
    int64_t t0 = MonotonicNs();
    (void)out.Send(MessageInfo{MessageKind::kBytes, i, 0}, msg);
    if (!in.Peek(kTimeout).ok()) break;
    (void)in.Release();
    ns.push_back(MonotonicNs() - t0);
  }
  echo.join();
  return Summarize(std::move(ns));
}

// --- the measurement -------------------------------------------------------------------------

bool TwoProcesses(const Options& o, const std::string& wait, Stats* stats) {
  std::string instance = "ringbench-" + std::to_string(getpid());
  TransportOptions topts;
  topts.ring_capacity = {1 << 20, 1 << 20, 1 << 12, 1 << 12};
  auto t = Transport::Create(instance, topts);
  if (!t.ok()) {
    std::fprintf(stderr, "ring_bench: %s\n", t.status().ToString().c_str());
    return false;
  }
  std::string self = "/proc/self/exe";
  std::vector<std::string> args = {self, "--child", instance, wait, o.pin ? "pin" : "nopin"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid;
  if (posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), environ) != 0) return false;
  WaitPolicy policy = PolicyNamed(wait);
  auto out = (*t)->Producer(RingId::kGatewayToGpu, policy);
  auto in = (*t)->Consumer(RingId::kGpuToGateway, policy);
  std::vector<std::byte> msg(o.bytes);
  for (uint64_t k = 0; k < o.bytes; ++k) msg[k] = std::byte(k * 131);
  const uint64_t warmup = std::min<uint64_t>(o.messages / 10, 10000);
  std::vector<int64_t> ns;
  ns.reserve(o.messages);
  bool ok = out.ok() && in.ok();
  for (uint64_t i = 0; ok && i < warmup + o.messages; ++i) {
    int64_t t0 = MonotonicNs();
    ok = out->Send(MessageInfo{MessageKind::kBytes, i, 0}, msg, kTimeout).ok();
    auto m = ok ? in->Peek(kTimeout) : absl::StatusOr<MessageView>(absl::CancelledError());
    ok = ok && m.ok() && m->header.step_id == i && m->payload.size() == o.bytes &&
         m->payload[o.bytes - 1] == msg[o.bytes - 1];
    ok = ok && in->Release().ok();
    int64_t t1 = MonotonicNs();
    if (i >= warmup) ns.push_back(t1 - t0);
  }
  if (out.ok()) (void)out->Send(MessageInfo{MessageKind::kShutdown, 0, 0}, {}, kTimeout);
  int status = 0;
  if (!ok) kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  if (!ok) {
    std::fprintf(stderr, "ring_bench: round trip failed (%s wait)\n", wait.c_str());
    return false;
  }
  *stats = Summarize(std::move(ns));
  return true;
}

int Main(int argc, char** argv) {
  if (argc == 5 && std::string_view(argv[1]) == "--child") {
    return Child(argv[2], argv[3], std::string_view(argv[4]) == "pin");
  }
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    auto value = [&](std::string_view key) -> const char* {
      return a.substr(0, key.size()) == key ? argv[i] + key.size() : nullptr;
    };
    if (const char* v = value("--messages=")) {
      o.messages = std::strtoull(v, nullptr, 10);
    } else if (const char* v = value("--bytes=")) {
      o.bytes = std::strtoull(v, nullptr, 10);
    } else if (const char* v = value("--waits=")) {
      o.waits.clear();
      std::string_view s = v;
      while (!s.empty()) {
        size_t comma = s.find(',');
        o.waits.emplace_back(s.substr(0, comma));
        if (comma == std::string_view::npos) break;
        s.remove_prefix(comma + 1);
      }
    } else if (a == "--pin") {
      o.pin = true;
    } else {
      std::fprintf(stderr,
                   "usage: ring_bench [--messages=100000] [--bytes=8192] "
                   "[--waits=spin,hybrid,futex] [--pin]\n");
      return 2;
    }
  }
  if (o.bytes > MaxPayloadBytes(1 << 20) || o.messages == 0) {
    std::fprintf(stderr, "ring_bench: --bytes must be <= %llu and --messages > 0\n",
                 static_cast<unsigned long long>(MaxPayloadBytes(1 << 20)));
    return 2;
  }
  if (o.pin) Pin(0);
  std::printf("ring_bench: %llu round trips of %llu bytes, %u hardware threads%s\n",
              static_cast<unsigned long long>(o.messages), static_cast<unsigned long long>(o.bytes),
              std::thread::hardware_concurrency(), o.pin ? ", pinned to cpus 0 and 1" : "");
  std::printf("  %-44s %9s %9s %9s %9s %9s\n", "microseconds", "p50", "p99", "p99.9", "max",
              "mean");
  const uint64_t ref_samples = std::min<uint64_t>(o.messages, 100000);
  Stats copy = MemcpyReference(o.bytes, ref_samples);
  PrintRow(("reference: memcpy " + std::to_string(o.bytes) + " B").c_str(), copy);
  Stats line = CacheLineReference(ref_samples, o.pin);
  PrintRow("reference: cache-line round trip, 2 threads", line);
  Stats same = SameThreadRing(o.bytes, ref_samples);
  PrintRow("reference: ring send+receive, 1 thread", same);
  Stats threads = TwoThreadRings(o.bytes, ref_samples, o.pin);
  PrintRow("ring round trip, 2 threads (spin)", threads);
  int rc = 0;
  for (const std::string& wait : o.waits) {
    Stats s;
    if (!TwoProcesses(o, wait, &s)) {
      rc = 1;
      continue;
    }
    PrintRow(("ring round trip, 2 processes (" + wait + ")").c_str(), s);
    std::printf(
        "    vs cache-line floor: p50 x%.1f; vs memcpy: p50 x%.1f; targets p50 <= 5 us %s, "
        "p99 <= 50 us %s\n",
        s.p50 / std::max(line.p50, 1e-3), s.p50 / std::max(copy.p50, 1e-3),
        s.p50 <= 5.0 ? "met" : "MISSED", s.p99 <= 50.0 ? "met" : "MISSED");
  }
  return rc;
}

}  // namespace
}  // namespace thermocline::ipc

int main(int argc, char** argv) { return thermocline::ipc::Main(argc, argv); }
