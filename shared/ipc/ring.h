// Single-producer/single-consumer ring of variable-size messages in shared memory.
//
// The ring is a RingControl block followed by `capacity` data bytes (a power of two). Positions
// are monotonic byte counts (never wrapped); the byte of position p is data[p % capacity]. Each
// message is one contiguous record: a 48-byte MessageHeader and its payload padded to 8 bytes,
// so payloads are 8-byte aligned. A record that would cross the end of the data area is
// preceded by a pad record (kind kPad) that fills the rest of the buffer, or by nothing when
// fewer than 48 bytes remain (both sides skip such a tail implicitly).
//
// Publication: the producer writes header and payload, then release-stores `head`; the consumer
// acquire-loads `head` and reads only below it. A producer that dies before Commit() therefore
// never exposes its bytes. The consumer frees space by release-storing `tail`.
//
// Nothing read from the ring is trusted: head/tail are checked against each other and the
// capacity, every header (magic, check word, position, kind, length, contiguity) is checked
// before its payload is exposed, and a violation marks the ring corrupt (DataLoss from then on)
// instead of reading out of bounds. See docs/ipc.md for the ordering argument.
//
// Reset: InitRing over a live ring (Transport::ResetRing, by the gateway, only while no other
// process is attached) empties it, clears the corrupt mark and bumps `generation`; this
// process's own ends see the new generation at their next call and start over from the reset
// positions, so the gateway recovers from a corrupt ring without rebuilding its ring objects.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace thermocline::ipc {

enum class MessageKind : uint16_t {
  kPad = 0,  // ring-internal: skip to the start of the data area; never returned to callers
  kHello = 1,
  kShutdown = 2,
  kError = 3,
  kStep = 16,
  kActivation = 17,
  kPartial = 18,
  kLogits = 19,
  kBytes = 64,  // opaque payload (tests, benchmarks)
};

// True for every kind a caller may send (all of the above except kPad).
bool IsSendableKind(uint16_t kind);
std::string_view MessageKindName(MessageKind kind);

inline constexpr uint32_t kMessageMagic = 0x534d4354;  // "TCMS" little-endian

// The record header as laid out in the ring.
struct MessageHeader {
  uint32_t magic = 0;
  uint16_t kind = 0;
  uint16_t flags = 0;  // reserved, 0
  uint32_t bytes = 0;  // payload bytes, without padding
  uint32_t layer = 0;
  uint64_t epoch = 0;
  uint64_t step_id = 0;
  uint64_t pos = 0;    // ring position of this record: rejects stale bytes from an earlier lap
  uint32_t check = 0;  // HeaderCheck() of the fields above: rejects scribbled headers
  uint32_t reserved = 0;

  MessageKind message_kind() const { return static_cast<MessageKind>(kind); }
};
static_assert(sizeof(MessageHeader) == 48);
inline constexpr uint64_t kHeaderBytes = sizeof(MessageHeader);

uint32_t HeaderCheck(const MessageHeader& h);

// What the sender chooses; the ring fills in magic, epoch, bytes, pos and check.
struct MessageInfo {
  MessageKind kind = MessageKind::kBytes;
  uint64_t step_id = 0;
  uint32_t layer = 0;
};

inline constexpr uint64_t kRingMagic = 0x474e495243540001ull;  // "\1\0TCRING"
inline constexpr uint64_t kMinRingCapacity = 256;
inline constexpr uint64_t kMaxRingCapacity = uint64_t{1} << 32;

// Shared ring state. Each cache line has one writer, so the producer's and consumer's updates
// never false-share.
struct RingControl {
  // Written by InitRing (and by the other side only to flag corruption).
  alignas(64) uint64_t magic;
  uint64_t capacity;
  std::atomic<uint32_t> corrupt;
  std::atomic<uint32_t> generation;  // bumped by every InitRing (see Reset above)
  // Written only by the producer.
  alignas(64) std::atomic<uint64_t> head;
  std::atomic<uint32_t> data_futex;        // bumped to wake a consumer sleeping on it
  std::atomic<uint32_t> producer_waiting;  // producer is (about to be) asleep on space_futex
  std::atomic<uint64_t> committed;         // messages published, for metrics
  // Written only by the consumer.
  alignas(64) std::atomic<uint64_t> tail;
  std::atomic<uint32_t> space_futex;       // bumped to wake a producer sleeping on it
  std::atomic<uint32_t> consumer_waiting;  // consumer is (about to be) asleep on data_futex
  std::atomic<uint64_t> dropped_stale;     // older-epoch messages dropped, for metrics
};
static_assert(sizeof(RingControl) == 192);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

// Bytes of a ring region (control block + data) of the given capacity.
constexpr uint64_t RingRegionBytes(uint64_t capacity) { return sizeof(RingControl) + capacity; }
// Largest payload a ring of this capacity carries: a record may take at most half the ring, so
// that a message always fits once the ring is empty, wherever the write position is.
constexpr uint64_t MaxPayloadBytes(uint64_t capacity) { return capacity / 2 - kHeaderBytes; }

// Formats an empty ring in `region` (64-byte aligned, at least RingRegionBytes(capacity)), or
// resets one (its generation goes up by one). capacity: a power of two in [kMinRingCapacity,
// kMaxRingCapacity].
absl::Status InitRing(void* region, uint64_t region_bytes, uint64_t capacity);

// How a side waits for its peer: spin for up to `spin`, then sleep on the futex (when
// `futex`), else keep spinning until the deadline.
//
// With the futex, the spin is adaptive: a wait that had to sleep halves the next spin (down to
// 0.5 us), one that ended while spinning lengthens it by 0.5 us (up to `spin`). Spinning only pays while the
// peer runs on another core; on a machine with no idle core the kernel may queue the peer on
// the spinner's own core, and a fixed spin would then add its whole length to every hop.
struct WaitPolicy {
  absl::Duration spin = absl::Microseconds(20);
  bool futex = true;
};

// The current spin length of one ring end (see WaitPolicy).
class SpinBudget {
 public:
  static constexpr int64_t kFloorNs = 500;
  explicit SpinBudget(const WaitPolicy& policy = {});
  int64_t ns() const { return ns_; }
  void Hit() { ns_ = std::min(max_ns_, ns_ + floor_ns_); }
  void Miss() { ns_ = std::max(floor_ns_, ns_ / 2); }

 private:
  int64_t max_ns_ = 0;
  int64_t floor_ns_ = 0;
  int64_t ns_ = 0;
};

struct RingOptions {
  std::string name = "ring";  // for error messages, e.g. "gpu->cpu"
  uint64_t epoch = 0;         // producer: stamped on messages; consumer: older ones are dropped
  WaitPolicy wait;
};

class RingProducer {
 public:
  // Attaches to a ring formatted by InitRing. expected_capacity comes from the caller's own
  // validated layout; the ring's copy must agree. Resumes at the published head, so a
  // restarted producer overwrites whatever a dead one had reserved but not committed.
  static absl::StatusOr<RingProducer> Attach(void* region, uint64_t region_bytes,
                                             uint64_t expected_capacity, RingOptions options);

  RingProducer(RingProducer&& other) noexcept;
  RingProducer& operator=(RingProducer&& other) noexcept;
  RingProducer(const RingProducer&) = delete;
  RingProducer& operator=(const RingProducer&) = delete;

  // Reserves a contiguous, 8-byte aligned payload area of `bytes` in the ring, waiting up to
  // `timeout` for the consumer to free space (DeadlineExceeded after). Nothing is visible to
  // the consumer until Commit(). InvalidArgument when bytes > max_payload_bytes().
  absl::StatusOr<absl::Span<std::byte>> Reserve(uint64_t bytes,
                                                absl::Duration timeout = absl::InfiniteDuration());
  // Publishes the reserved message with its first `bytes_used` (<= reserved) payload bytes.
  absl::Status Commit(const MessageInfo& info, uint64_t bytes_used);
  // Commits the whole reservation.
  absl::Status Commit(const MessageInfo& info);
  // Gives up the reservation; nothing is published.
  void Abort();
  // Reserve + copy + Commit.
  absl::Status Send(const MessageInfo& info, absl::Span<const std::byte> payload,
                    absl::Duration timeout = absl::InfiniteDuration());

  uint64_t epoch() const { return epoch_; }
  void set_epoch(uint64_t epoch) { epoch_ = epoch; }
  uint64_t capacity() const { return capacity_; }
  uint64_t max_payload_bytes() const { return MaxPayloadBytes(capacity_); }
  uint64_t sent() const { return sent_; }
  const std::string& name() const { return name_; }

 private:
  RingProducer() = default;
  absl::Status Corrupt(std::string_view what);
  absl::Status CheckCorrupt();
  absl::StatusOr<uint64_t> LoadTail();
  absl::Status WaitForSpace(uint64_t need, int64_t deadline_ns);
  void WritePad(uint64_t pos, uint64_t to_end);

  RingControl* ctl_ = nullptr;
  std::byte* data_ = nullptr;
  uint64_t capacity_ = 0;
  uint64_t head_ = 0;         // our published head (we are its only writer)
  uint64_t cached_tail_ = 0;  // last validated tail; refreshed only when space looks short
  uint64_t epoch_ = 0;
  WaitPolicy wait_;
  SpinBudget spin_;
  std::string name_;
  uint32_t generation_ = 0;  // of the ring when our positions were taken
  bool corrupt_ = false;
  bool pending_ = false;
  uint64_t pending_pos_ = 0;    // record position of the reservation
  uint64_t pending_bytes_ = 0;  // reserved payload bytes
  uint64_t sent_ = 0;
};

// A message as seen by the consumer: the header copied out of the ring (stable), the payload in
// place. The payload is valid until Release(); decoders must read each count from it once and
// validate the copy, since a misbehaving producer could still write to shared memory.
struct MessageView {
  MessageHeader header;
  absl::Span<const std::byte> payload;

  MessageKind kind() const { return header.message_kind(); }
};

class RingConsumer {
 public:
  // Attaches to a ring formatted by InitRing; resumes at the published tail.
  static absl::StatusOr<RingConsumer> Attach(void* region, uint64_t region_bytes,
                                             uint64_t expected_capacity, RingOptions options);

  RingConsumer(RingConsumer&& other) noexcept;
  RingConsumer& operator=(RingConsumer&& other) noexcept;
  RingConsumer(const RingConsumer&) = delete;
  RingConsumer& operator=(const RingConsumer&) = delete;

  // The oldest message of the current (or a newer) epoch, waiting up to `timeout` for one
  // (DeadlineExceeded after; a zero timeout polls). Messages of an older epoch are released
  // and counted on the way; a newer epoch becomes the current one. Calling Peek again before
  // Release returns the same message. DataLoss when the ring is corrupt.
  absl::StatusOr<MessageView> Peek(absl::Duration timeout = absl::InfiniteDuration());
  // Frees the message returned by Peek.
  absl::Status Release();
  // Peek + copy the payload into *payload (resized) + Release.
  absl::StatusOr<MessageHeader> Receive(std::vector<std::byte>* payload,
                                        absl::Duration timeout = absl::InfiniteDuration());

  uint64_t min_epoch() const { return min_epoch_; }
  void set_min_epoch(uint64_t epoch) { min_epoch_ = epoch; }
  uint64_t capacity() const { return capacity_; }
  uint64_t received() const { return received_; }
  uint64_t dropped_stale() const { return dropped_stale_; }
  const std::string& name() const { return name_; }

 private:
  RingConsumer() = default;
  absl::Status Corrupt(std::string_view what, uint64_t pos);
  absl::Status CheckCorrupt();
  absl::Status LoadHead();
  absl::Status WaitForData(int64_t deadline_ns);
  void PublishTail();

  RingControl* ctl_ = nullptr;
  const std::byte* data_ = nullptr;
  uint64_t capacity_ = 0;
  uint64_t tail_ = 0;         // next position to read (may run ahead of the published tail)
  uint64_t cached_head_ = 0;  // last validated head
  uint64_t min_epoch_ = 0;
  WaitPolicy wait_;
  SpinBudget spin_;
  std::string name_;
  uint32_t generation_ = 0;  // of the ring when our positions were taken
  bool corrupt_ = false;
  bool peeked_ = false;
  uint64_t peeked_end_ = 0;
  MessageView peeked_view_;
  uint64_t received_ = 0;
  uint64_t dropped_stale_ = 0;
};

}  // namespace thermocline::ipc
