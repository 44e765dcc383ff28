#include "shared/ipc/ring.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "shared/ipc/futex.h"
#include "shared/util/status_macros.h"

namespace thermocline::ipc {
namespace {

// This Abseil build has its own string_view type; the public API uses std::string_view.
absl::string_view Av(std::string_view s) { return absl::string_view(s.data(), s.size()); }

constexpr uint64_t Align8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }

bool IsPowerOfTwo(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

int64_t DeadlineAfter(absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) return std::numeric_limits<int64_t>::max();
  int64_t now = MonotonicNs();
  if (timeout <= absl::ZeroDuration()) return now;
  int64_t ns = absl::ToInt64Nanoseconds(timeout);
  return ns > std::numeric_limits<int64_t>::max() - now ? std::numeric_limits<int64_t>::max()
                                                        : now + ns;
}

// Checks the shared control block before either side trusts its capacity.
absl::Status ValidateRegion(const void* region, uint64_t region_bytes, uint64_t capacity,
                            const std::string& name) {
  if (region == nullptr || reinterpret_cast<uintptr_t>(region) % alignof(RingControl) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("ring ", name, ": region not 64-byte aligned"));
  }
  if (!IsPowerOfTwo(capacity) || capacity < kMinRingCapacity || capacity > kMaxRingCapacity) {
    return absl::InvalidArgumentError(absl::StrCat("ring ", name, ": capacity ", capacity,
                                                   " is not a power of two in [", kMinRingCapacity,
                                                   ", ", kMaxRingCapacity, "]"));
  }
  if (region_bytes < RingRegionBytes(capacity)) {
    return absl::InvalidArgumentError(absl::StrCat("ring ", name, ": region of ", region_bytes,
                                                   " bytes is too small for capacity ", capacity));
  }
  const auto* ctl = static_cast<const RingControl*>(region);
  uint64_t magic, cap;
  std::memcpy(&magic, &ctl->magic, sizeof magic);
  std::memcpy(&cap, &ctl->capacity, sizeof cap);
  if (magic != kRingMagic) {
    return absl::DataLossError(absl::StrCat("ring ", name, ": bad magic 0x", absl::Hex(magic)));
  }
  if (cap != capacity) {
    return absl::DataLossError(absl::StrCat("ring ", name, ": control block says capacity ", cap,
                                            ", layout says ", capacity));
  }
  return absl::OkStatus();
}

}  // namespace

bool IsSendableKind(uint16_t kind) {
  switch (static_cast<MessageKind>(kind)) {
    case MessageKind::kHello:
    case MessageKind::kShutdown:
    case MessageKind::kError:
    case MessageKind::kStep:
    case MessageKind::kActivation:
    case MessageKind::kPartial:
    case MessageKind::kLogits:
    case MessageKind::kBytes:
      return true;
    case MessageKind::kPad:
      return false;
  }
  return false;
}

std::string_view MessageKindName(MessageKind kind) {
  switch (kind) {
    case MessageKind::kPad:
      return "Pad";
    case MessageKind::kHello:
      return "Hello";
    case MessageKind::kShutdown:
      return "Shutdown";
    case MessageKind::kError:
      return "Error";
    case MessageKind::kStep:
      return "Step";
    case MessageKind::kActivation:
      return "Activation";
    case MessageKind::kPartial:
      return "Partial";
    case MessageKind::kLogits:
      return "Logits";
    case MessageKind::kBytes:
      return "Bytes";
  }
  return "unknown";
}

uint32_t HeaderCheck(const MessageHeader& h) {
  static_assert(offsetof(MessageHeader, check) == 40);
  uint64_t w[5];
  std::memcpy(w, &h, sizeof w);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (uint64_t v : w) {
    x = (x ^ v) * 0xff51afd7ed558ccdull;
    x ^= x >> 33;
  }
  return static_cast<uint32_t>(x ^ (x >> 32));
}

SpinBudget::SpinBudget(const WaitPolicy& policy) {
  // Infinite spins (futex off) never consult the budget; keep the arithmetic finite anyway.
  max_ns_ = std::min<int64_t>(absl::ToInt64Nanoseconds(std::max(policy.spin, absl::ZeroDuration())),
                              int64_t{1} << 40);
  floor_ns_ = std::min(max_ns_, kFloorNs);
  ns_ = max_ns_;
}

absl::Status InitRing(void* region, uint64_t region_bytes, uint64_t capacity) {
  if (region == nullptr || reinterpret_cast<uintptr_t>(region) % alignof(RingControl) != 0) {
    return absl::InvalidArgumentError("InitRing: region not 64-byte aligned");
  }
  if (!IsPowerOfTwo(capacity) || capacity < kMinRingCapacity || capacity > kMaxRingCapacity) {
    return absl::InvalidArgumentError(absl::StrCat("InitRing: capacity ", capacity,
                                                   " is not a power of two in [", kMinRingCapacity,
                                                   ", ", kMaxRingCapacity, "]"));
  }
  if (region_bytes < RingRegionBytes(capacity)) {
    return absl::InvalidArgumentError("InitRing: region too small");
  }
  // The generation survives the reformat, one higher (a fresh segment's bytes are zero; any
  // other starting value works as well, only the change is looked at).
  uint32_t generation = 0;
  std::memcpy(&generation,
              static_cast<const std::byte*>(region) + offsetof(RingControl, generation),
              sizeof generation);
  auto* ctl = new (region) RingControl;
  ctl->magic = kRingMagic;
  ctl->generation.store(generation + 1, std::memory_order_relaxed);
  ctl->capacity = capacity;
  ctl->corrupt.store(0, std::memory_order_relaxed);
  ctl->head.store(0, std::memory_order_relaxed);
  ctl->data_futex.store(0, std::memory_order_relaxed);
  ctl->producer_waiting.store(0, std::memory_order_relaxed);
  ctl->committed.store(0, std::memory_order_relaxed);
  ctl->tail.store(0, std::memory_order_relaxed);
  ctl->space_futex.store(0, std::memory_order_relaxed);
  ctl->consumer_waiting.store(0, std::memory_order_relaxed);
  ctl->dropped_stale.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Producer

absl::StatusOr<RingProducer> RingProducer::Attach(void* region, uint64_t region_bytes,
                                                  uint64_t expected_capacity, RingOptions options) {
  TC_RETURN_IF_ERROR(ValidateRegion(region, region_bytes, expected_capacity, options.name));
  RingProducer p;
  p.ctl_ = static_cast<RingControl*>(region);
  p.data_ = static_cast<std::byte*>(region) + sizeof(RingControl);
  p.capacity_ = expected_capacity;
  p.epoch_ = options.epoch;
  p.wait_ = options.wait;
  p.spin_ = SpinBudget(options.wait);
  p.name_ = std::move(options.name);
  p.generation_ = p.ctl_->generation.load(std::memory_order_acquire);
  TC_RETURN_IF_ERROR(p.CheckCorrupt());
  uint64_t head = p.ctl_->head.load(std::memory_order_acquire);
  uint64_t tail = p.ctl_->tail.load(std::memory_order_acquire);
  if (head % 8 != 0 || tail % 8 != 0 || tail > head || head - tail > p.capacity_) {
    return p.Corrupt(absl::StrCat("head ", head, " / tail ", tail, " inconsistent"));
  }
  p.head_ = head;
  p.cached_tail_ = tail;
  return p;
}

RingProducer::RingProducer(RingProducer&& o) noexcept { *this = std::move(o); }

RingProducer& RingProducer::operator=(RingProducer&& o) noexcept {
  ctl_ = std::exchange(o.ctl_, nullptr);
  data_ = std::exchange(o.data_, nullptr);
  capacity_ = o.capacity_;
  head_ = o.head_;
  cached_tail_ = o.cached_tail_;
  epoch_ = o.epoch_;
  wait_ = o.wait_;
  spin_ = o.spin_;
  name_ = std::move(o.name_);
  generation_ = o.generation_;
  corrupt_ = o.corrupt_;
  pending_ = std::exchange(o.pending_, false);
  pending_pos_ = o.pending_pos_;
  pending_bytes_ = o.pending_bytes_;
  sent_ = o.sent_;
  return *this;
}

absl::Status RingProducer::Corrupt(std::string_view what) {
  corrupt_ = true;
  if (ctl_ != nullptr) ctl_->corrupt.store(1, std::memory_order_relaxed);
  return absl::DataLossError(absl::StrCat("ring ", name_, " corrupt: ", Av(what)));
}

absl::Status RingProducer::CheckCorrupt() {
  if (ctl_ == nullptr) return absl::FailedPreconditionError("ring producer moved from");
  if (const uint32_t g = ctl_->generation.load(std::memory_order_acquire); g != generation_) {
    // Reset by the gateway while no peer was attached: start over where the reset left it.
    generation_ = g;
    head_ = ctl_->head.load(std::memory_order_acquire);
    cached_tail_ = ctl_->tail.load(std::memory_order_acquire);
    corrupt_ = false;
    pending_ = false;
  }
  if (corrupt_ || ctl_->corrupt.load(std::memory_order_relaxed) != 0) {
    corrupt_ = true;
    return absl::DataLossError(absl::StrCat("ring ", name_, " is marked corrupt"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> RingProducer::LoadTail() {
  // The consumer never moves tail past a head we published, nor back.
  uint64_t tail = ctl_->tail.load(std::memory_order_acquire);
  if (tail % 8 != 0 || tail > head_ || head_ - tail > capacity_ || tail < cached_tail_) {
    return Corrupt(absl::StrCat("tail ", tail, " outside [", cached_tail_, ", ", head_, "]"));
  }
  cached_tail_ = tail;
  return tail;
}

absl::Status RingProducer::WaitForSpace(uint64_t need, int64_t deadline_ns) {
  auto has_space = [&]() -> absl::StatusOr<bool> {
    TC_ASSIGN_OR_RETURN(uint64_t tail, LoadTail());
    return head_ + need - tail <= capacity_;
  };
  const int64_t spin_until = MonotonicNs() + spin_.ns();
  for (uint32_t i = 0;; ++i) {
    TC_ASSIGN_OR_RETURN(bool ok, has_space());
    if (ok) {
      if (i > 0) spin_.Hit();
      return absl::OkStatus();
    }
    // The clock is read on the first round (so a zero spin or timeout costs no spinning) and
    // then every 8 rounds (a PAUSE can take over 40 ns, and the budget may be 0.5 us).
    if ((i & 7) == 0) {
      int64_t now = MonotonicNs();
      if (now >= deadline_ns) {
        return absl::DeadlineExceededError(
            absl::StrCat("ring ", name_, ": no space for ", need, " bytes"));
      }
      if (wait_.futex && now >= spin_until) {
        spin_.Miss();
        break;
      }
      TC_RETURN_IF_ERROR(CheckCorrupt());
    }
    CpuRelax();
  }
  // Sleep. Dekker-style handshake with RingConsumer::PublishTail: we announce the wait, read
  // the futex word, then re-check; the consumer moves tail, then checks the flag. The seq_cst
  // fences on both sides guarantee one of us sees the other's store, and the futex word makes
  // a wake between our re-check and the syscall turn the wait into an immediate return.
  for (;;) {
    ctl_->producer_waiting.store(1, std::memory_order_relaxed);
    uint32_t seen = ctl_->space_futex.load(std::memory_order_acquire);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    absl::StatusOr<bool> ok = has_space();
    if (!ok.ok() || *ok) {
      ctl_->producer_waiting.store(0, std::memory_order_relaxed);
      return ok.status();
    }
    if (absl::Status s = CheckCorrupt(); !s.ok()) {
      ctl_->producer_waiting.store(0, std::memory_order_relaxed);
      return s;
    }
    int64_t now = MonotonicNs();
    if (now >= deadline_ns) {
      ctl_->producer_waiting.store(0, std::memory_order_relaxed);
      return absl::DeadlineExceededError(
          absl::StrCat("ring ", name_, ": no space for ", need, " bytes"));
    }
    int64_t left = deadline_ns - now;
    FutexWait(&ctl_->space_futex, seen,
              deadline_ns == std::numeric_limits<int64_t>::max() ? -1 : left);
  }
}

void RingProducer::WritePad(uint64_t pos, uint64_t to_end) {
  MessageHeader h;
  h.magic = kMessageMagic;
  h.kind = static_cast<uint16_t>(MessageKind::kPad);
  h.bytes = static_cast<uint32_t>(to_end - kHeaderBytes);
  h.epoch = epoch_;
  h.pos = pos;
  h.check = HeaderCheck(h);
  std::memcpy(data_ + (pos & (capacity_ - 1)), &h, sizeof h);
}

absl::StatusOr<absl::Span<std::byte>> RingProducer::Reserve(uint64_t bytes,
                                                            absl::Duration timeout) {
  TC_RETURN_IF_ERROR(CheckCorrupt());
  if (pending_) {
    return absl::FailedPreconditionError(
        absl::StrCat("ring ", name_, ": Reserve while a reservation is pending"));
  }
  if (bytes > max_payload_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("ring ", name_, ": message of ", bytes,
                                                   " bytes exceeds the maximum of ",
                                                   max_payload_bytes()));
  }
  const uint64_t record = kHeaderBytes + Align8(bytes);
  const uint64_t to_end = capacity_ - (head_ & (capacity_ - 1));
  const uint64_t skip = record <= to_end ? 0 : to_end;
  const uint64_t need = skip + record;
  if (head_ + need - cached_tail_ > capacity_) {
    TC_RETURN_IF_ERROR(WaitForSpace(need, DeadlineAfter(timeout)));
  }
  if (skip >= kHeaderBytes) WritePad(head_, skip);
  pending_ = true;
  pending_pos_ = head_ + skip;
  pending_bytes_ = bytes;
  return absl::Span<std::byte>(data_ + (pending_pos_ & (capacity_ - 1)) + kHeaderBytes, bytes);
}

absl::Status RingProducer::Commit(const MessageInfo& info) { return Commit(info, pending_bytes_); }

absl::Status RingProducer::Commit(const MessageInfo& info, uint64_t bytes_used) {
  if (ctl_ == nullptr) return absl::FailedPreconditionError("ring producer moved from");
  if (!pending_) {
    return absl::FailedPreconditionError(absl::StrCat("ring ", name_, ": Commit without Reserve"));
  }
  if (bytes_used > pending_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("ring ", name_, ": commit of ", bytes_used,
                                                   " bytes exceeds the reservation of ",
                                                   pending_bytes_));
  }
  if (!IsSendableKind(static_cast<uint16_t>(info.kind))) {
    return absl::InvalidArgumentError(absl::StrCat("ring ", name_, ": message kind ",
                                                   static_cast<int>(info.kind), " not sendable"));
  }
  MessageHeader h;
  h.magic = kMessageMagic;
  h.kind = static_cast<uint16_t>(info.kind);
  h.bytes = static_cast<uint32_t>(bytes_used);
  h.layer = info.layer;
  h.epoch = epoch_;
  h.step_id = info.step_id;
  h.pos = pending_pos_;
  h.check = HeaderCheck(h);
  std::memcpy(data_ + (pending_pos_ & (capacity_ - 1)), &h, sizeof h);
  pending_ = false;
  head_ = pending_pos_ + kHeaderBytes + Align8(bytes_used);
  // The release store is the only publication: header and payload above happen-before any
  // consumer read that observes this head.
  ctl_->head.store(head_, std::memory_order_release);
  ctl_->committed.store(++sent_, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (ctl_->consumer_waiting.load(std::memory_order_relaxed) != 0) {
    ctl_->data_futex.fetch_add(1, std::memory_order_release);
    FutexWake(&ctl_->data_futex, 1);
  }
  return absl::OkStatus();
}

void RingProducer::Abort() { pending_ = false; }

absl::Status RingProducer::Send(const MessageInfo& info, absl::Span<const std::byte> payload,
                                absl::Duration timeout) {
  TC_ASSIGN_OR_RETURN(absl::Span<std::byte> dst, Reserve(payload.size(), timeout));
  if (!payload.empty()) std::memcpy(dst.data(), payload.data(), payload.size());
  absl::Status s = Commit(info);
  if (!s.ok()) Abort();
  return s;
}

// ---------------------------------------------------------------------------------------------
// Consumer

absl::StatusOr<RingConsumer> RingConsumer::Attach(void* region, uint64_t region_bytes,
                                                  uint64_t expected_capacity, RingOptions options) {
  TC_RETURN_IF_ERROR(ValidateRegion(region, region_bytes, expected_capacity, options.name));
  RingConsumer c;
  c.ctl_ = static_cast<RingControl*>(region);
  c.data_ = static_cast<const std::byte*>(region) + sizeof(RingControl);
  c.capacity_ = expected_capacity;
  c.min_epoch_ = options.epoch;
  c.wait_ = options.wait;
  c.spin_ = SpinBudget(options.wait);
  c.name_ = std::move(options.name);
  c.generation_ = c.ctl_->generation.load(std::memory_order_acquire);
  TC_RETURN_IF_ERROR(c.CheckCorrupt());
  uint64_t tail = c.ctl_->tail.load(std::memory_order_acquire);
  uint64_t head = c.ctl_->head.load(std::memory_order_acquire);
  if (head % 8 != 0 || tail % 8 != 0 || tail > head || head - tail > c.capacity_) {
    return c.Corrupt(absl::StrCat("head ", head, " / tail ", tail, " inconsistent"), tail);
  }
  c.tail_ = tail;
  c.cached_head_ = head;
  return c;
}

RingConsumer::RingConsumer(RingConsumer&& o) noexcept { *this = std::move(o); }

RingConsumer& RingConsumer::operator=(RingConsumer&& o) noexcept {
  ctl_ = std::exchange(o.ctl_, nullptr);
  data_ = std::exchange(o.data_, nullptr);
  capacity_ = o.capacity_;
  tail_ = o.tail_;
  cached_head_ = o.cached_head_;
  min_epoch_ = o.min_epoch_;
  wait_ = o.wait_;
  spin_ = o.spin_;
  name_ = std::move(o.name_);
  generation_ = o.generation_;
  corrupt_ = o.corrupt_;
  peeked_ = std::exchange(o.peeked_, false);
  peeked_end_ = o.peeked_end_;
  peeked_view_ = o.peeked_view_;
  received_ = o.received_;
  dropped_stale_ = o.dropped_stale_;
  return *this;
}

absl::Status RingConsumer::Corrupt(std::string_view what, uint64_t pos) {
  corrupt_ = true;
  peeked_ = false;
  if (ctl_ != nullptr) ctl_->corrupt.store(1, std::memory_order_relaxed);
  return absl::DataLossError(
      absl::StrCat("ring ", name_, " corrupt at position ", pos, ": ", Av(what)));
}

absl::Status RingConsumer::CheckCorrupt() {
  if (ctl_ == nullptr) return absl::FailedPreconditionError("ring consumer moved from");
  if (const uint32_t g = ctl_->generation.load(std::memory_order_acquire); g != generation_) {
    // As RingProducer::CheckCorrupt.
    generation_ = g;
    tail_ = ctl_->tail.load(std::memory_order_acquire);
    cached_head_ = ctl_->head.load(std::memory_order_acquire);
    corrupt_ = false;
    peeked_ = false;
  }
  if (corrupt_ || ctl_->corrupt.load(std::memory_order_relaxed) != 0) {
    corrupt_ = true;
    return absl::DataLossError(absl::StrCat("ring ", name_, " is marked corrupt"));
  }
  return absl::OkStatus();
}

absl::Status RingConsumer::LoadHead() {
  uint64_t head = ctl_->head.load(std::memory_order_acquire);
  // The producer only moves head forward, and never more than a ring ahead of what we freed.
  if (head % 8 != 0 || head < cached_head_ || head < tail_ || head - tail_ > capacity_) {
    return Corrupt(absl::StrCat("head ", head, " outside [", std::max(cached_head_, tail_), ", ",
                                tail_ + capacity_, "]"),
                   tail_);
  }
  cached_head_ = head;
  return absl::OkStatus();
}

void RingConsumer::PublishTail() {
  ctl_->tail.store(tail_, std::memory_order_release);
  // Pairs with the fence in RingProducer::WaitForSpace (see the comment there).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (ctl_->producer_waiting.load(std::memory_order_relaxed) != 0) {
    ctl_->space_futex.fetch_add(1, std::memory_order_release);
    FutexWake(&ctl_->space_futex, 1);
  }
}

absl::Status RingConsumer::WaitForData(int64_t deadline_ns) {
  const int64_t spin_until = MonotonicNs() + spin_.ns();
  for (uint32_t i = 0;; ++i) {
    TC_RETURN_IF_ERROR(LoadHead());
    if (cached_head_ != tail_) {
      if (i > 0) spin_.Hit();
      return absl::OkStatus();
    }
    if ((i & 7) == 0) {  // as in RingProducer::WaitForSpace
      int64_t now = MonotonicNs();
      if (now >= deadline_ns) {
        return absl::DeadlineExceededError(absl::StrCat("ring ", name_, ": no message"));
      }
      if (wait_.futex && now >= spin_until) {
        spin_.Miss();
        break;
      }
      TC_RETURN_IF_ERROR(CheckCorrupt());
    }
    CpuRelax();
  }
  // Mirror image of RingProducer::WaitForSpace.
  for (;;) {
    ctl_->consumer_waiting.store(1, std::memory_order_relaxed);
    uint32_t seen = ctl_->data_futex.load(std::memory_order_acquire);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    absl::Status s = LoadHead();
    if (s.ok()) s = CheckCorrupt();
    if (!s.ok() || cached_head_ != tail_) {
      ctl_->consumer_waiting.store(0, std::memory_order_relaxed);
      return s;
    }
    int64_t now = MonotonicNs();
    if (now >= deadline_ns) {
      ctl_->consumer_waiting.store(0, std::memory_order_relaxed);
      return absl::DeadlineExceededError(absl::StrCat("ring ", name_, ": no message"));
    }
    FutexWait(&ctl_->data_futex, seen,
              deadline_ns == std::numeric_limits<int64_t>::max() ? -1 : deadline_ns - now);
  }
}

absl::StatusOr<MessageView> RingConsumer::Peek(absl::Duration timeout) {
  TC_RETURN_IF_ERROR(CheckCorrupt());
  if (peeked_) return peeked_view_;
  int64_t deadline = -1;  // computed on first need: polling a busy ring reads no clock
  for (;;) {
    if (cached_head_ == tail_) {
      TC_RETURN_IF_ERROR(LoadHead());
      if (cached_head_ == tail_) {
        if (deadline < 0) deadline = DeadlineAfter(timeout);
        TC_RETURN_IF_ERROR(WaitForData(deadline));
      }
    }
    const uint64_t avail = cached_head_ - tail_;
    const uint64_t offset = tail_ & (capacity_ - 1);
    const uint64_t to_end = capacity_ - offset;
    if (to_end < kHeaderBytes) {
      // Too little room for a header: the producer skipped to the start, and published the
      // skip only together with the record after it.
      if (avail < to_end + kHeaderBytes) {
        return Corrupt(absl::StrCat("head ", cached_head_, " ends inside the ", to_end,
                                    "-byte skip at the end of the buffer"),
                       tail_);
      }
      tail_ += to_end;
      continue;
    }
    if (avail < kHeaderBytes) {
      return Corrupt(absl::StrCat("only ", avail, " bytes published, less than a header"), tail_);
    }
    // Copy the header out once; everything below judges the copy, never shared memory again.
    MessageHeader h;
    std::memcpy(&h, data_ + offset, sizeof h);
    if (h.magic != kMessageMagic) {
      return Corrupt(absl::StrCat("bad message magic 0x", absl::Hex(h.magic)), tail_);
    }
    if (h.check != HeaderCheck(h)) return Corrupt("header check word mismatch", tail_);
    if (h.pos != tail_) {
      return Corrupt(absl::StrCat("header claims position ", h.pos), tail_);
    }
    if (h.kind == static_cast<uint16_t>(MessageKind::kPad)) {
      if (h.bytes != to_end - kHeaderBytes || avail < to_end + kHeaderBytes) {
        return Corrupt(absl::StrCat("pad of ", h.bytes, " bytes with ", to_end,
                                    " bytes to the end and ", avail, " published"),
                       tail_);
      }
      tail_ += to_end;
      continue;
    }
    if (!IsSendableKind(h.kind)) {
      return Corrupt(absl::StrCat("unknown message kind ", h.kind), tail_);
    }
    const uint64_t record = kHeaderBytes + Align8(h.bytes);
    if (record > to_end || record > avail || h.bytes > MaxPayloadBytes(capacity_)) {
      return Corrupt(absl::StrCat("message of ", h.bytes, " bytes overruns (", to_end,
                                  " bytes to the end, ", avail, " published)"),
                     tail_);
    }
    if (h.epoch < min_epoch_) {
      tail_ += record;
      ++dropped_stale_;
      ctl_->dropped_stale.store(dropped_stale_, std::memory_order_relaxed);
      PublishTail();
      continue;
    }
    min_epoch_ = h.epoch;
    peeked_ = true;
    peeked_end_ = tail_ + record;
    peeked_view_.header = h;
    peeked_view_.payload = absl::Span<const std::byte>(data_ + offset + kHeaderBytes, h.bytes);
    return peeked_view_;
  }
}

absl::Status RingConsumer::Release() {
  if (ctl_ == nullptr) return absl::FailedPreconditionError("ring consumer moved from");
  if (!peeked_) {
    return absl::FailedPreconditionError(absl::StrCat("ring ", name_, ": Release without Peek"));
  }
  peeked_ = false;
  tail_ = peeked_end_;
  ++received_;
  PublishTail();
  return absl::OkStatus();
}

absl::StatusOr<MessageHeader> RingConsumer::Receive(std::vector<std::byte>* payload,
                                                    absl::Duration timeout) {
  TC_ASSIGN_OR_RETURN(MessageView view, Peek(timeout));
  payload->resize(view.payload.size());
  if (!view.payload.empty()) {
    std::memcpy(payload->data(), view.payload.data(), view.payload.size());
  }
  TC_RETURN_IF_ERROR(Release());
  return view.header;
}

}  // namespace thermocline::ipc
