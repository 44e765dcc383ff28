// One instance's transport: a single segment `thermocline-<instance>-transport` holding the
// control block (epoch, per-process pid/state/heartbeat, ring descriptors) and the four rings
// gateway->gpu, gpu->gateway, gpu->cpu, cpu->gpu.
//
// The gateway creates it (Transport::Create) and removes it on destruction; the workers attach
// (Transport::Attach) and take their process slot. Ring descriptors are validated once at
// attach and copied into the process: later scribbles on the control block cannot move a ring.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shared/ipc/ring.h"
#include "shared/ipc/segment.h"

namespace thermocline::ipc {

enum class Role : uint32_t { kGateway = 0, kGpuWorker = 1, kCpuWorker = 2 };
inline constexpr int kNumRoles = 3;

enum class RingId : uint32_t { kGatewayToGpu = 0, kGpuToGateway = 1, kGpuToCpu = 2, kCpuToGpu = 3 };
inline constexpr int kNumRings = 4;

std::string_view RoleName(Role role);    // "gateway", "gpu_worker", "cpu_worker"
std::string_view RingName(RingId ring);  // "gateway->gpu", ...
Role ProducerOf(RingId ring);
Role ConsumerOf(RingId ring);

enum class ProcessState : uint32_t {
  kAbsent = 0,
  kStarting = 1,
  kReady = 2,
  kStopping = 3,
  kStopped = 4,
  kFailed = 5,
};
std::string_view ProcessStateName(ProcessState state);

// Bump whenever anything after the SegmentPreamble changes.
// 2: RingControl::generation; 3: ProcessSlot::progress_ns, ControlBlock::hang_timeout_ns.
inline constexpr uint32_t kTransportLayoutVersion = 3;
inline constexpr char kTransportSegment[] = "transport";

struct RingDescriptor {
  uint64_t offset;    // of the ring's RingControl from the segment base, 64-byte aligned
  uint64_t capacity;  // data bytes, a power of two
};

struct ProcessSlot {
  alignas(64) std::atomic<int32_t> pid;  // 0: none
  std::atomic<uint32_t> state;           // ProcessState
  std::atomic<uint64_t> start_ticks;     // with pid, identifies the process across pid reuse
  std::atomic<uint64_t> heartbeat_ns;    // MonotonicNs() of the last Heartbeat()
  std::atomic<uint64_t> epoch;           // epoch the process attached under
  // MonotonicNs() of the compute thread's last sign of progress (Transport::Progress). The
  // heartbeat comes from a thread of its own and says only that the process runs; this says
  // that the thread doing the work does: a frozen compute thread stops it while the heartbeat
  // goes on.
  std::atomic<uint64_t> progress_ns;
};

struct ControlBlock {
  SegmentPreamble preamble;
  // Bumped by the gateway when it restarts a worker; stamped on every message.
  alignas(64) std::atomic<uint64_t> epoch;
  // Set by the gateway: a worker whose compute thread shows no progress for this long is hung
  // (the gateway kills it; a gpu worker waiting on the cpu worker gives up its step). 0: never.
  std::atomic<uint64_t> hang_timeout_ns;
  uint32_t control_bytes;  // sizeof(ControlBlock)
  uint32_t ring_count;     // kNumRings
  RingDescriptor rings[kNumRings];
  ProcessSlot processes[kNumRoles];
};
static_assert(sizeof(ControlBlock) % 64 == 0);

struct TransportOptions {
  // Data capacity of each ring (indexed by RingId), powers of two. A message may take at most
  // half a ring (MaxPayloadBytes). Defaults fit a 4096-wide model with 256-row prefill chunks
  // and a 32k vocabulary at 16 logits rows.
  std::array<uint64_t, kNumRings> ring_capacity = {uint64_t{1} << 20, uint64_t{8} << 20,
                                                   uint64_t{16} << 20, uint64_t{16} << 20};
};

// Snapshot of one process slot.
struct ProcessInfo {
  int32_t pid = 0;
  ProcessState state = ProcessState::kAbsent;
  uint64_t heartbeat_ns = 0;
  uint64_t progress_ns = 0;
  uint64_t epoch = 0;
  bool alive = false;  // pid runs and is the process that took the slot
};

class Transport {
 public:
  // Gateway side: creates (or replaces a stale) segment for `instance` and takes the gateway
  // slot. FailedPrecondition when a live gateway owns the instance.
  static absl::StatusOr<std::unique_ptr<Transport>> Create(std::string_view instance,
                                                           const TransportOptions& options = {});
  // Worker side: attaches to the gateway's segment and takes `role`'s slot (FailedPrecondition
  // when a live process holds it). role must not be kGateway.
  static absl::StatusOr<std::unique_ptr<Transport>> Attach(std::string_view instance, Role role);
  // Gateway: removes the instance's segment if its owner is dead. Returns whether it did.
  static absl::StatusOr<bool> RemoveStale(std::string_view instance);

  // Marks the slot stopped; the gateway also removes the segment.
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  Role role() const { return role_; }
  const std::string& instance() const { return instance_; }
  const std::string& segment_name() const { return segment_->name(); }
  const SharedSegment& segment() const { return *segment_; }
  // Why Create replaced an existing segment ("" when it did not).
  const std::string& replaced_reason() const { return segment_->replaced_reason(); }

  uint64_t epoch() const { return control_->epoch.load(std::memory_order_acquire); }
  // Gateway only: starts a new epoch (before restarting a worker) and returns it.
  absl::StatusOr<uint64_t> BumpEpoch();

  // The producing (consuming) end of `ring`; only the role that produces (consumes) it may ask.
  // The epoch is the current one.
  absl::StatusOr<RingProducer> Producer(RingId ring, WaitPolicy wait = {});
  absl::StatusOr<RingConsumer> Consumer(RingId ring, WaitPolicy wait = {});
  // Gateway only, with both ends of the ring quiescent (their processes dead or not yet
  // started): empties the ring and clears its corrupt mark. The gateway's own ends of it adopt
  // the reset at their next call (ring.h).
  absl::Status ResetRing(RingId ring);
  // The rings marked corrupt (by either end) right now.
  std::vector<RingId> CorruptRings() const;

  void Heartbeat();
  // The calling process's compute thread made progress (took or finished work, or waited one
  // slice for a peer or for work): called from that thread only, at least every hang timeout.
  void Progress();
  // Nanoseconds since `role` last called Progress() (INT64_MAX when it never did; claiming the
  // slot counts as progress).
  int64_t ProgressAgeNs(Role role) const;
  // Gateway: the hang timeout every process reads (0: off). Workers: read it.
  absl::Status SetHangTimeout(absl::Duration timeout);
  absl::Duration hang_timeout() const;
  void SetState(ProcessState state);
  ProcessInfo Process(Role role) const;
  // Nanoseconds since `role` last called Heartbeat() (INT64_MAX when it never did).
  int64_t HeartbeatAgeNs(Role role) const;
  // Workers: whether the gateway that created the segment still runs.
  bool OwnerAlive() const { return segment_->OwnerAlive(); }

 private:
  Transport(std::unique_ptr<SharedSegment> segment, Role role, std::string instance);
  absl::Status ClaimSlot();
  void* RingRegion(RingId ring) const;

  std::unique_ptr<SharedSegment> segment_;
  ControlBlock* control_ = nullptr;
  Role role_;
  std::string instance_;
  bool claimed_ = false;  // we hold our role's slot (and so may mark it stopped)
  std::array<RingDescriptor, kNumRings> rings_{};  // validated private copy
};

// Bytes of a transport segment with these options.
uint64_t TransportSegmentBytes(const TransportOptions& options);

}  // namespace thermocline::ipc
