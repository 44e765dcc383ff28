// The shared-memory ring in one process. Every ring lives in a heap block of exactly its size,
// so AddressSanitizer (in the Asan build) flags any access outside it, including the reads a
// damaged header could provoke.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "shared/ipc/ring.h"
#include "tests/helpers/ipc_payload.h"

namespace thermocline::ipc {
namespace {

using testing::CheckStreamMessage;
using testing::FillStreamMessage;

struct AlignedFree {
  void operator()(void* p) const { ::operator delete(p, std::align_val_t(64)); }
};

// A ring in its own heap block, optionally started at an arbitrary position (an empty ring
// whose head and tail both sit at `start`, as after that many bytes of traffic).
class TestRing {
 public:
  explicit TestRing(uint64_t capacity, uint64_t start = 0, WaitPolicy wait = {})
      : capacity_(capacity),
        bytes_(RingRegionBytes(capacity)),
        mem_(::operator new(bytes_, std::align_val_t(64))) {
    EXPECT_TRUE(InitRing(mem_.get(), bytes_, capacity).ok());
    ctl()->head.store(start);
    ctl()->tail.store(start);
    RingOptions options;
    options.name = "test";
    options.epoch = 1;
    options.wait = wait;
    auto p = RingProducer::Attach(mem_.get(), bytes_, capacity, options);
    auto c = RingConsumer::Attach(mem_.get(), bytes_, capacity, options);
    EXPECT_TRUE(p.ok()) << p.status();
    EXPECT_TRUE(c.ok()) << c.status();
    producer_ = std::make_unique<RingProducer>(std::move(*p));
    consumer_ = std::make_unique<RingConsumer>(std::move(*c));
  }

  RingProducer& producer() { return *producer_; }
  RingConsumer& consumer() { return *consumer_; }
  RingControl* ctl() { return static_cast<RingControl*>(mem_.get()); }
  std::byte* data() { return static_cast<std::byte*>(mem_.get()) + sizeof(RingControl); }
  void* region() { return mem_.get(); }
  uint64_t capacity() const { return capacity_; }
  uint64_t bytes() const { return bytes_; }

 private:
  uint64_t capacity_;
  uint64_t bytes_;
  std::unique_ptr<void, AlignedFree> mem_;
  std::unique_ptr<RingProducer> producer_;
  std::unique_ptr<RingConsumer> consumer_;
};

std::vector<std::byte> Pattern(uint64_t seed, uint64_t i, uint64_t size) {
  std::vector<std::byte> v(size);
  FillStreamMessage(seed, i, absl::Span<std::byte>(v));
  return v;
}

// Sends message i of a stream of fixed `size`, step_id i.
absl::Status SendPattern(RingProducer& p, uint64_t seed, uint64_t i, uint64_t size,
                         absl::Duration timeout = absl::InfiniteDuration()) {
  std::vector<std::byte> v = Pattern(seed, i, size);
  return p.Send(MessageInfo{MessageKind::kBytes, i, static_cast<uint32_t>(i % 7)}, v, timeout);
}

void ExpectPattern(RingConsumer& c, uint64_t seed, uint64_t i, uint64_t size) {
  auto m = c.Peek(absl::ZeroDuration());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->header.step_id, i);
  EXPECT_EQ(m->header.layer, i % 7);
  EXPECT_EQ(m->kind(), MessageKind::kBytes);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(m->payload.data()) % 8, 0u) << "payload not 8-aligned";
  std::vector<std::byte> want = Pattern(seed, i, size);
  ASSERT_EQ(m->payload.size(), size);
  EXPECT_TRUE(size == 0 || std::memcmp(m->payload.data(), want.data(), size) == 0);
  ASSERT_TRUE(c.Release().ok());
}

TEST(IpcRing, RoundTripKeepsHeaderFields) {
  TestRing r(1024);
  std::vector<std::byte> payload = Pattern(3, 0, 100);
  ASSERT_TRUE(r.producer().Send(MessageInfo{MessageKind::kActivation, 42, 7}, payload).ok());
  std::vector<std::byte> got;
  auto h = r.consumer().Receive(&got, absl::ZeroDuration());
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->magic, kMessageMagic);
  EXPECT_EQ(h->message_kind(), MessageKind::kActivation);
  EXPECT_EQ(h->step_id, 42u);
  EXPECT_EQ(h->layer, 7u);
  EXPECT_EQ(h->epoch, 1u);
  EXPECT_EQ(h->bytes, 100u);
  EXPECT_EQ(got, payload);
  EXPECT_EQ(r.consumer().received(), 1u);
  EXPECT_EQ(r.producer().sent(), 1u);
  EXPECT_EQ(r.consumer().Peek(absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

// Every payload size at every start offset of the buffer (and one lap later): the message
// arrives intact, and a second message after it too. Covers records that end exactly at the
// end of the buffer, that leave exactly a header's worth (an empty pad), that leave less than
// a header (implicit skip), and that need a pad.
TEST(IpcRing, EverySizeAtEveryOffset) {
  constexpr uint64_t kCap = 256;
  const uint64_t max = MaxPayloadBytes(kCap);
  for (uint64_t lap : {uint64_t{0}, kCap * 1000003}) {
    for (uint64_t offset = 0; offset < kCap; offset += 8) {
      for (uint64_t size = 0; size <= max; ++size) {
        TestRing r(kCap, lap + offset);
        ASSERT_TRUE(SendPattern(r.producer(), size, 0, size, absl::ZeroDuration()).ok())
            << "offset " << offset << " size " << size;
        // A second, complementary message may or may not fit behind the first; if not, the
        // ring must refuse it cleanly and take it once the first is gone.
        absl::Status second = SendPattern(r.producer(), size, 1, max - size, absl::ZeroDuration());
        ASSERT_TRUE(second.ok() || second.code() == absl::StatusCode::kDeadlineExceeded) << second;
        ExpectPattern(r.consumer(), size, 0, size);
        if (!second.ok()) {
          ASSERT_TRUE(SendPattern(r.producer(), size, 1, max - size, absl::ZeroDuration()).ok());
        }
        ExpectPattern(r.consumer(), size, 1, max - size);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

TEST(IpcRing, ExactFitAtEndOfBufferNeedsNoPad) {
  constexpr uint64_t kCap = 512;
  // 48-byte header + 80 bytes = 128: the record ends exactly at the end of the buffer.
  TestRing r(kCap, kCap - 128);
  ASSERT_TRUE(SendPattern(r.producer(), 1, 0, 80).ok());
  EXPECT_EQ(r.ctl()->head.load(), kCap);  // no pad: head lands exactly on the lap boundary
  ASSERT_TRUE(SendPattern(r.producer(), 1, 1, 8).ok());
  EXPECT_EQ(r.ctl()->head.load(), kCap + 56);  // the next record starts at offset 0
  ExpectPattern(r.consumer(), 1, 0, 80);
  ExpectPattern(r.consumer(), 1, 1, 8);
}

TEST(IpcRing, HeaderSizedRemainderGetsEmptyPad) {
  constexpr uint64_t kCap = 512;
  TestRing r(kCap, kCap - 48);
  ASSERT_TRUE(SendPattern(r.producer(), 2, 0, 16).ok());
  MessageHeader pad;
  std::memcpy(&pad, r.data() + kCap - 48, sizeof pad);
  EXPECT_EQ(pad.message_kind(), MessageKind::kPad);
  EXPECT_EQ(pad.bytes, 0u);
  EXPECT_EQ(r.ctl()->head.load(), kCap + 48 + 16);
  ExpectPattern(r.consumer(), 2, 0, 16);
}

TEST(IpcRing, SubHeaderRemainderIsSkippedImplicitly) {
  constexpr uint64_t kCap = 512;
  for (uint64_t rem = 8; rem < 48; rem += 8) {
    TestRing r(kCap, kCap - rem);
    ASSERT_TRUE(SendPattern(r.producer(), rem, 0, 24).ok());
    EXPECT_EQ(r.ctl()->head.load(), kCap + 48 + 24);
    ExpectPattern(r.consumer(), rem, 0, 24);
  }
}

TEST(IpcRing, FullRingRefusesThenAcceptsAfterRelease) {
  constexpr uint64_t kCap = 256;
  TestRing r(kCap);
  // Two records of exactly half the ring fill it completely.
  const uint64_t half = MaxPayloadBytes(kCap);
  ASSERT_TRUE(SendPattern(r.producer(), 5, 0, half).ok());
  ASSERT_TRUE(SendPattern(r.producer(), 5, 1, half).ok());
  EXPECT_EQ(r.ctl()->head.load() - r.ctl()->tail.load(), kCap);
  absl::Status full = SendPattern(r.producer(), 5, 2, 0, absl::ZeroDuration());
  EXPECT_EQ(full.code(), absl::StatusCode::kDeadlineExceeded) << full;
  full = SendPattern(r.producer(), 5, 2, 0, absl::Milliseconds(20));
  EXPECT_EQ(full.code(), absl::StatusCode::kDeadlineExceeded) << full;
  ExpectPattern(r.consumer(), 5, 0, half);
  ASSERT_TRUE(SendPattern(r.producer(), 5, 2, half, absl::ZeroDuration()).ok());
  ExpectPattern(r.consumer(), 5, 1, half);
  ExpectPattern(r.consumer(), 5, 2, half);
}

TEST(IpcRing, TooLargeMessageIsRejected) {
  TestRing r(256);
  EXPECT_EQ(r.producer().max_payload_bytes(), 128u - 48u);
  auto res = r.producer().Reserve(r.producer().max_payload_bytes() + 1);
  EXPECT_EQ(res.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(r.producer().Reserve(r.producer().max_payload_bytes()).ok());
}

TEST(IpcRing, ReserveCommitProtocol) {
  TestRing r(1024);
  RingProducer& p = r.producer();
  EXPECT_EQ(p.Commit(MessageInfo{}).code(), absl::StatusCode::kFailedPrecondition);
  auto a = p.Reserve(100);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % 8, 0u);
  EXPECT_EQ(p.Reserve(8).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(p.Commit(MessageInfo{}, 101).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p.Commit(MessageInfo{MessageKind::kPad, 0, 0}).code(),
            absl::StatusCode::kInvalidArgument);
  // Nothing is visible before Commit.
  EXPECT_EQ(r.consumer().Peek(absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  std::memset(a->data(), 0x5a, 100);
  ASSERT_TRUE(p.Commit(MessageInfo{MessageKind::kBytes, 9, 0}, 30).ok());  // shrink
  // Abort publishes nothing and frees the reservation.
  ASSERT_TRUE(p.Reserve(400).ok());
  p.Abort();
  ASSERT_TRUE(SendPattern(p, 6, 1, 40).ok());

  RingConsumer& c = r.consumer();
  EXPECT_EQ(c.Release().code(), absl::StatusCode::kFailedPrecondition);
  auto m1 = c.Peek(absl::ZeroDuration());
  auto m2 = c.Peek(absl::ZeroDuration());  // same message until Release
  ASSERT_TRUE(m1.ok() && m2.ok());
  EXPECT_EQ(m1->payload.data(), m2->payload.data());
  EXPECT_EQ(m1->payload.size(), 30u);
  EXPECT_EQ(m1->payload[29], std::byte{0x5a});
  ASSERT_TRUE(c.Release().ok());
  ExpectPattern(c, 6, 1, 40);
}

TEST(IpcRing, RandomTrafficMatchesModel) {
  // Bursts of sends and receives of random sizes against a queue model, on a ring small
  // enough to wrap every few messages.
  for (uint64_t cap : {uint64_t{256}, uint64_t{1024}, uint64_t{4096}}) {
    TestRing r(cap);
    std::mt19937_64 rng(cap);
    std::deque<std::pair<uint64_t, uint64_t>> model;  // (index, size)
    uint64_t next = 0;
    const uint64_t max = MaxPayloadBytes(cap);
    for (int round = 0; round < 20000; ++round) {
      if (rng() % 2 == 0) {
        uint64_t size = rng() % 3 == 0 ? rng() % (max + 1) : rng() % 33;
        absl::Status s = SendPattern(r.producer(), cap, next, size, absl::ZeroDuration());
        if (s.ok()) {
          model.emplace_back(next++, size);
        } else {
          ASSERT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
          ASSERT_FALSE(model.empty()) << "refused " << size << " bytes on an empty ring";
        }
      } else if (!model.empty()) {
        ExpectPattern(r.consumer(), cap, model.front().first, model.front().second);
        model.pop_front();
      } else {
        ASSERT_EQ(r.consumer().Peek(absl::ZeroDuration()).status().code(),
                  absl::StatusCode::kDeadlineExceeded);
      }
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(IpcRing, OlderEpochIsDroppedAndCounted) {
  TestRing r(4096);
  RingProducer& p = r.producer();
  RingConsumer& c = r.consumer();
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(SendPattern(p, 1, i, 10).ok());
  p.set_epoch(2);
  for (uint64_t i = 3; i < 5; ++i) ASSERT_TRUE(SendPattern(p, 1, i, 10).ok());
  c.set_min_epoch(2);
  ExpectPattern(c, 1, 3, 10);
  ExpectPattern(c, 1, 4, 10);
  EXPECT_EQ(c.dropped_stale(), 3u);
  EXPECT_EQ(r.ctl()->dropped_stale.load(), 3u);

  // A newer epoch raises the consumer's floor: a stale message after it is dropped too.
  p.set_epoch(5);
  ASSERT_TRUE(SendPattern(p, 1, 5, 10).ok());
  p.set_epoch(4);
  ASSERT_TRUE(SendPattern(p, 1, 6, 10).ok());
  p.set_epoch(5);
  ASSERT_TRUE(SendPattern(p, 1, 7, 10).ok());
  ExpectPattern(c, 1, 5, 10);
  EXPECT_EQ(c.min_epoch(), 5u);
  ExpectPattern(c, 1, 7, 10);
  EXPECT_EQ(c.dropped_stale(), 4u);
}

TEST(IpcRing, WaitTimesOutWithFutexAndWithSpinning) {
  for (WaitPolicy wait :
       {WaitPolicy{absl::ZeroDuration(), true}, WaitPolicy{absl::Microseconds(50), true},
        WaitPolicy{absl::Microseconds(50), false}}) {
    TestRing r(256, 0, wait);
    auto m = r.consumer().Peek(absl::Milliseconds(30));
    EXPECT_EQ(m.status().code(), absl::StatusCode::kDeadlineExceeded) << m.status();
    ASSERT_TRUE(SendPattern(r.producer(), 1, 0, 80).ok());
    ASSERT_TRUE(SendPattern(r.producer(), 1, 1, 80).ok());
    absl::Status s = SendPattern(r.producer(), 1, 2, 0, absl::Milliseconds(30));
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  }
}

TEST(IpcRing, SpinBudgetAdapts) {
  SpinBudget b(WaitPolicy{absl::Microseconds(20), true});
  EXPECT_EQ(b.ns(), 20000);
  b.Miss();
  EXPECT_EQ(b.ns(), 10000);
  for (int i = 0; i < 20; ++i) b.Miss();
  EXPECT_EQ(b.ns(), SpinBudget::kFloorNs);
  b.Hit();
  EXPECT_EQ(b.ns(), 2 * SpinBudget::kFloorNs);
  for (int i = 0; i < 100; ++i) b.Hit();
  EXPECT_EQ(b.ns(), 20000);
  SpinBudget none(WaitPolicy{absl::ZeroDuration(), true});
  none.Hit();
  EXPECT_EQ(none.ns(), 0);
  SpinBudget forever(WaitPolicy{absl::InfiniteDuration(), true});
  forever.Hit();
  EXPECT_GT(forever.ns(), int64_t{1} << 39);  // capped, and doubling it cannot overflow
}

// Two threads stream through a tiny ring with futex-only waiting (no spinning), so both sides
// sleep and wake each other constantly; a lost wakeup would show up as a timeout.
TEST(IpcRing, ThreadsStreamWithFutexWakeups) {
  for (WaitPolicy wait :
       {WaitPolicy{absl::ZeroDuration(), true}, WaitPolicy{absl::Microseconds(5), true}}) {
    TestRing r(512, 0, wait);
    constexpr uint64_t kCount = 20000;
    const uint64_t max = MaxPayloadBytes(512);
    absl::Status produced;
    std::thread producer([&] {
      for (uint64_t i = 0; i < kCount && produced.ok(); ++i) {
        uint64_t size = testing::StreamMessageSize(11, i, max);
        auto out = r.producer().Reserve(size, absl::Seconds(30));
        if (!out.ok()) {
          produced = out.status();
          break;
        }
        FillStreamMessage(11, i, *out);
        produced = r.producer().Commit(MessageInfo{MessageKind::kBytes, i, 0});
      }
    });
    for (uint64_t i = 0; i < kCount; ++i) {
      auto m = r.consumer().Peek(absl::Seconds(30));
      ASSERT_TRUE(m.ok()) << "message " << i << ": " << m.status();
      ASSERT_EQ(CheckStreamMessage(11, i, max, m->payload), "");
      ASSERT_EQ(m->header.step_id, i);
      ASSERT_TRUE(r.consumer().Release().ok());
    }
    producer.join();
    EXPECT_TRUE(produced.ok()) << produced;
  }
}

// --- Damage: every case must give DataLoss, never a crash or an out-of-bounds read. ----------

MessageHeader ValidHeaderAt(uint64_t pos, MessageKind kind, uint32_t bytes) {
  MessageHeader h;
  h.magic = kMessageMagic;
  h.kind = static_cast<uint16_t>(kind);
  h.bytes = bytes;
  h.epoch = 1;
  h.pos = pos;
  h.check = HeaderCheck(h);
  return h;
}

void WriteHeader(TestRing& r, uint64_t offset, const MessageHeader& h) {
  std::memcpy(r.data() + offset, &h, sizeof h);
}

void ExpectCorrupt(TestRing& r) {
  auto m = r.consumer().Peek(absl::ZeroDuration());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss) << m.status();
  // Sticky, and visible to the producer through the shared flag.
  EXPECT_EQ(r.consumer().Peek(absl::ZeroDuration()).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(r.producer().Reserve(8).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(r.ctl()->corrupt.load(), 1u);
}

TEST(IpcRingDamage, BadMagic) {
  TestRing r(1024);
  ASSERT_TRUE(SendPattern(r.producer(), 1, 0, 64).ok());
  MessageHeader h = ValidHeaderAt(0, MessageKind::kBytes, 64);
  h.magic ^= 1;
  h.check = HeaderCheck(h);
  WriteHeader(r, 0, h);
  ExpectCorrupt(r);
}

// A reset (InitRing over the damaged ring, what the gateway does once no worker is attached)
// clears the mark, and the ends already attached in this process carry on without being
// rebuilt: they adopt the reset positions at their next call.
TEST(IpcRingDamage, ResetRingIsAdoptedByAttachedEnds) {
  TestRing r(1024);
  ASSERT_TRUE(SendPattern(r.producer(), 1, 0, 64).ok());
  r.data()[12] ^= std::byte{0x40};
  ExpectCorrupt(r);
  const uint32_t before = r.ctl()->generation.load();
  ASSERT_TRUE(InitRing(r.region(), r.bytes(), r.capacity()).ok());
  EXPECT_EQ(r.ctl()->generation.load(), before + 1);
  EXPECT_EQ(r.ctl()->corrupt.load(), 0u);
  for (uint64_t i = 0; i < 40; ++i) {  // several laps of the reset ring
    ASSERT_TRUE(SendPattern(r.producer(), 2, i, 56).ok());
    ExpectPattern(r.consumer(), 2, i, 56);
  }
}

TEST(IpcRingDamage, BadCheckWord) {
  TestRing r(1024);
  ASSERT_TRUE(SendPattern(r.producer(), 1, 0, 64).ok());
  r.data()[12] ^= std::byte{0x40};  // flips a bit of `layer`
  ExpectCorrupt(r);
}

TEST(IpcRingDamage, LengthBeyondPublishedBytes) {
  TestRing r(1024);
  ASSERT_TRUE(SendPattern(r.producer(), 1, 0, 64).ok());
  WriteHeader(r, 0, ValidHeaderAt(0, MessageKind::kBytes, 72));  // 8 more than published
  ExpectCorrupt(r);
}

TEST(IpcRingDamage, LengthBeyondEndOfBuffer) {
  constexpr uint64_t kCap = 1024;
  TestRing r(kCap, kCap - 128);
  ASSERT_TRUE(SendPattern(r.producer(), 1, 0, 80).ok());
  ASSERT_TRUE(SendPattern(r.producer(), 1, 1, 80).ok());  // published bytes cover the wrap
  WriteHeader(r, kCap - 128, ValidHeaderAt(kCap - 128, MessageKind::kBytes, 200));
  ExpectCorrupt(r);
}

TEST(IpcRingDamage, HugeLength) {
  TestRing r(1024);
  ASSERT_TRUE(SendPattern(r.producer(), 1, 0, 64).ok());
  WriteHeader(r, 0, ValidHeaderAt(0, MessageKind::kBytes, 0xfffffff8u));
  ExpectCorrupt(r);
}

TEST(IpcRingDamage, UnknownKind) {
  TestRing r(1024);
  ASSERT_TRUE(SendPattern(r.producer(), 1, 0, 64).ok());
  WriteHeader(r, 0, ValidHeaderAt(0, static_cast<MessageKind>(999), 64));
  ExpectCorrupt(r);
}

TEST(IpcRingDamage, WrongPosition) {
  // A well-formed header from an earlier lap (position one capacity behind).
  TestRing r(1024, 4096);
  ASSERT_TRUE(SendPattern(r.producer(), 1, 0, 64).ok());
  WriteHeader(r, 0, ValidHeaderAt(4096 - 1024, MessageKind::kBytes, 64));
  ExpectCorrupt(r);
}

TEST(IpcRingDamage, PadOfWrongLength) {
  constexpr uint64_t kCap = 512;
  TestRing r(kCap, kCap - 64);
  ASSERT_TRUE(SendPattern(r.producer(), 1, 0, 32).ok());  // pad of 16 payload bytes, then 80
  WriteHeader(r, kCap - 64, ValidHeaderAt(kCap - 64, MessageKind::kPad, 8));
  ExpectCorrupt(r);
}

TEST(IpcRingDamage, HeadOutOfRange) {
  for (uint64_t head : {uint64_t{3}, uint64_t{1024 + 8}, ~uint64_t{7}}) {
    TestRing r(1024);
    ASSERT_TRUE(SendPattern(r.producer(), 1, 0, 64).ok());
    r.ctl()->head.store(head);
    ExpectCorrupt(r);
  }
}

TEST(IpcRingDamage, HeadInsideSkipZone) {
  constexpr uint64_t kCap = 512;
  TestRing r(kCap, kCap - 16);
  r.ctl()->head.store(kCap - 8);  // published half of a 16-byte implicit skip
  ExpectCorrupt(r);
}

TEST(IpcRingDamage, TailMovedBackwardOrPastHead) {
  for (uint64_t tail : {uint64_t{0}, uint64_t{4097}, uint64_t{8192}}) {
    TestRing r(1024, 4096);
    ASSERT_TRUE(SendPattern(r.producer(), 1, 0, 64).ok());
    ExpectPattern(r.consumer(), 1, 0, 64);
    r.ctl()->tail.store(tail);
    // The first fits within what the producer already knows to be free; the second makes it
    // read the tail, and judge it.
    ASSERT_TRUE(SendPattern(r.producer(), 1, 1, 460, absl::ZeroDuration()).ok());
    absl::Status s = SendPattern(r.producer(), 1, 2, 460, absl::ZeroDuration());
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  }
}

TEST(IpcRingDamage, AttachRejectsBadControlBlock) {
  TestRing r(1024);
  RingOptions o;
  EXPECT_EQ(RingConsumer::Attach(r.region(), r.bytes(), 2048, o).status().code(),
            absl::StatusCode::kInvalidArgument);  // region too small for the claimed capacity
  EXPECT_EQ(RingConsumer::Attach(r.region(), r.bytes(), 512, o).status().code(),
            absl::StatusCode::kDataLoss);  // control block disagrees
  EXPECT_EQ(RingProducer::Attach(static_cast<std::byte*>(r.region()) + 8, r.bytes() - 8, 512, o)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);  // misaligned
  EXPECT_EQ(RingProducer::Attach(r.region(), r.bytes(), 1000, o).status().code(),
            absl::StatusCode::kInvalidArgument);  // not a power of two
  r.ctl()->magic = 0;
  EXPECT_EQ(RingProducer::Attach(r.region(), r.bytes(), 1024, o).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(InitRing(r.region(), r.bytes(), 1024).ok(), true);
  r.ctl()->head.store(5000);  // more than a ring ahead of the tail
  EXPECT_EQ(RingConsumer::Attach(r.region(), r.bytes(), 1024, o).status().code(),
            absl::StatusCode::kDataLoss);
}

// Random damage to a ring with traffic in it: the consumer either gets well-formed messages
// (inside the buffer) or DataLoss, never anything else.
TEST(IpcRingDamage, RandomGarbage) {
  constexpr uint64_t kCap = 1024;
  std::mt19937_64 rng(2024);
  for (int trial = 0; trial < 3000; ++trial) {
    TestRing r(kCap, (rng() % 4096) * 8);
    int n = static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) {
      (void)SendPattern(r.producer(), 1, i, rng() % 200, absl::ZeroDuration());
    }
    switch (rng() % 4) {
      case 0:  // flip a few bytes of the data area
        for (int k = 0; k < 1 + static_cast<int>(rng() % 8); ++k) {
          r.data()[rng() % kCap] ^= std::byte(1 + rng() % 255);
        }
        break;
      case 1:  // overwrite the whole data area with noise
        for (uint64_t k = 0; k < kCap; ++k) r.data()[k] = std::byte(rng());
        break;
      case 2:  // a random head
        r.ctl()->head.store(r.ctl()->tail.load() + (rng() % (2 * kCap)));
        break;
      case 3:  // noise, with plausible headers planted at record boundaries
        for (uint64_t off = 0; off + 48 <= kCap; off += 8 * (1 + rng() % 16)) {
          MessageHeader h = ValidHeaderAt(r.ctl()->tail.load() + off,
                                          static_cast<MessageKind>(rng() % 70), rng() % 2048);
          WriteHeader(r, off, h);
        }
        break;
    }
    for (int k = 0; k < 20; ++k) {
      auto m = r.consumer().Peek(absl::ZeroDuration());
      if (!m.ok()) {
        ASSERT_TRUE(m.status().code() == absl::StatusCode::kDataLoss ||
                    m.status().code() == absl::StatusCode::kDeadlineExceeded)
            << m.status();
        break;
      }
      const std::byte* begin = r.data();
      ASSERT_GE(m->payload.data(), begin);
      ASSERT_LE(m->payload.data() + m->payload.size(), begin + kCap);
      // Touch every byte: ASan catches any escape from the block.
      volatile uint8_t sink = 0;
      for (std::byte b : m->payload) sink = sink ^ static_cast<uint8_t>(b);
      (void)sink;
      ASSERT_TRUE(r.consumer().Release().ok());
    }
  }
}

}  // namespace
}  // namespace thermocline::ipc
