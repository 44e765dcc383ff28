#include "shared/ipc/transport.h"

#include <unistd.h>

#include <algorithm>
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

constexpr uint64_t AlignUp(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

bool ValidCapacity(uint64_t c) {
  return c >= kMinRingCapacity && c <= kMaxRingCapacity && (c & (c - 1)) == 0;
}

// Rings start on page boundaries: large payloads then never share a page with another ring.
std::array<RingDescriptor, kNumRings> Layout(const TransportOptions& options) {
  std::array<RingDescriptor, kNumRings> rings{};
  uint64_t offset = AlignUp(sizeof(ControlBlock), 4096);
  for (int i = 0; i < kNumRings; ++i) {
    rings[i] = {offset, options.ring_capacity[i]};
    offset = AlignUp(offset + RingRegionBytes(options.ring_capacity[i]), 4096);
  }
  return rings;
}

}  // namespace

std::string_view RoleName(Role role) {
  switch (role) {
    case Role::kGateway:
      return "gateway";
    case Role::kGpuWorker:
      return "gpu_worker";
    case Role::kCpuWorker:
      return "cpu_worker";
  }
  return "unknown";
}

std::string_view RingName(RingId ring) {
  switch (ring) {
    case RingId::kGatewayToGpu:
      return "gateway->gpu";
    case RingId::kGpuToGateway:
      return "gpu->gateway";
    case RingId::kGpuToCpu:
      return "gpu->cpu";
    case RingId::kCpuToGpu:
      return "cpu->gpu";
  }
  return "unknown";
}

Role ProducerOf(RingId ring) {
  switch (ring) {
    case RingId::kGatewayToGpu:
      return Role::kGateway;
    case RingId::kGpuToGateway:
    case RingId::kGpuToCpu:
      return Role::kGpuWorker;
    case RingId::kCpuToGpu:
      return Role::kCpuWorker;
  }
  return Role::kGateway;
}

Role ConsumerOf(RingId ring) {
  switch (ring) {
    case RingId::kGatewayToGpu:
    case RingId::kCpuToGpu:
      return Role::kGpuWorker;
    case RingId::kGpuToGateway:
      return Role::kGateway;
    case RingId::kGpuToCpu:
      return Role::kCpuWorker;
  }
  return Role::kGateway;
}

std::string_view ProcessStateName(ProcessState state) {
  switch (state) {
    case ProcessState::kAbsent:
      return "absent";
    case ProcessState::kStarting:
      return "starting";
    case ProcessState::kReady:
      return "ready";
    case ProcessState::kStopping:
      return "stopping";
    case ProcessState::kStopped:
      return "stopped";
    case ProcessState::kFailed:
      return "failed";
  }
  return "unknown";
}

uint64_t TransportSegmentBytes(const TransportOptions& options) {
  auto rings = Layout(options);
  const RingDescriptor& last = rings[kNumRings - 1];
  return AlignUp(last.offset + RingRegionBytes(last.capacity), 4096);
}

Transport::Transport(std::unique_ptr<SharedSegment> segment, Role role, std::string instance)
    : segment_(std::move(segment)),
      control_(static_cast<ControlBlock*>(segment_->base())),
      role_(role),
      instance_(std::move(instance)) {}

Transport::~Transport() {
  if (!claimed_) return;
  ProcessSlot& slot = control_->processes[static_cast<int>(role_)];
  slot.state.store(static_cast<uint32_t>(ProcessState::kStopped), std::memory_order_release);
  int32_t self = static_cast<int32_t>(getpid());
  slot.pid.compare_exchange_strong(self, 0, std::memory_order_acq_rel);
  // segment_'s destructor unmaps, and removes the segment when we own it.
}

absl::StatusOr<std::unique_ptr<Transport>> Transport::Create(std::string_view instance,
                                                             const TransportOptions& options) {
  for (int i = 0; i < kNumRings; ++i) {
    if (!ValidCapacity(options.ring_capacity[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ring ", Av(RingName(static_cast<RingId>(i))), ": capacity ", options.ring_capacity[i],
          " is not a power of two in [", kMinRingCapacity, ", ", kMaxRingCapacity, "]"));
    }
  }
  const auto rings = Layout(options);
  const uint64_t bytes = TransportSegmentBytes(options);
  auto init = [&](void* base) -> absl::Status {
    auto* cb = reinterpret_cast<ControlBlock*>(base);
    // The preamble was written by SharedSegment; the rest is zeroed memory we now format.
    new (&cb->epoch) std::atomic<uint64_t>(1);
    new (&cb->hang_timeout_ns) std::atomic<uint64_t>(0);
    cb->control_bytes = sizeof(ControlBlock);
    cb->ring_count = kNumRings;
    for (int i = 0; i < kNumRings; ++i) {
      cb->rings[i] = rings[i];
      TC_RETURN_IF_ERROR(InitRing(static_cast<std::byte*>(base) + rings[i].offset,
                                  bytes - rings[i].offset, rings[i].capacity));
    }
    for (ProcessSlot& slot : cb->processes) new (&slot) ProcessSlot{};
    return absl::OkStatus();
  };
  TC_ASSIGN_OR_RETURN(
      std::unique_ptr<SharedSegment> segment,
      SharedSegment::Create(instance, kTransportSegment, bytes, kTransportLayoutVersion, init));
  std::unique_ptr<Transport> t(
      new Transport(std::move(segment), Role::kGateway, std::string(instance)));
  t->rings_ = rings;
  TC_RETURN_IF_ERROR(t->ClaimSlot());
  return t;
}

absl::StatusOr<std::unique_ptr<Transport>> Transport::Attach(std::string_view instance, Role role) {
  if (role != Role::kGpuWorker && role != Role::kCpuWorker) {
    return absl::InvalidArgumentError("Transport::Attach is for workers; the gateway creates");
  }
  TC_ASSIGN_OR_RETURN(std::unique_ptr<SharedSegment> segment,
                      SharedSegment::Attach(instance, kTransportSegment, kTransportLayoutVersion));
  const uint64_t size = segment->size();
  const std::string where = absl::StrCat("/dev/shm/", segment->name());
  if (size < sizeof(ControlBlock)) {
    return absl::DataLossError(absl::StrCat(where, ": ", size, " bytes, too small"));
  }
  const auto* cb = static_cast<const ControlBlock*>(segment->base());
  if (cb->control_bytes != sizeof(ControlBlock) || cb->ring_count != kNumRings) {
    return absl::DataLossError(absl::StrCat(where, ": control block of ", cb->control_bytes,
                                            " bytes with ", cb->ring_count, " rings"));
  }
  std::array<RingDescriptor, kNumRings> rings;
  std::memcpy(rings.data(), cb->rings, sizeof(cb->rings));
  for (int i = 0; i < kNumRings; ++i) {
    const RingDescriptor& d = rings[i];
    std::string ring = absl::StrCat(where, ": ring ", Av(RingName(static_cast<RingId>(i))));
    if (!ValidCapacity(d.capacity)) {
      return absl::DataLossError(absl::StrCat(ring, ": bad capacity ", d.capacity));
    }
    if (d.offset % 64 != 0 || d.offset < sizeof(ControlBlock) || d.offset > size ||
        RingRegionBytes(d.capacity) > size - d.offset) {
      return absl::DataLossError(absl::StrCat(ring, ": region at ", d.offset, " of ",
                                              RingRegionBytes(d.capacity),
                                              " bytes outside the segment of ", size));
    }
    for (int j = 0; j < i; ++j) {
      const RingDescriptor& e = rings[j];
      if (d.offset < e.offset + RingRegionBytes(e.capacity) &&
          e.offset < d.offset + RingRegionBytes(d.capacity)) {
        return absl::DataLossError(
            absl::StrCat(ring, ": overlaps ring ", Av(RingName(static_cast<RingId>(j)))));
      }
    }
  }
  std::unique_ptr<Transport> t(new Transport(std::move(segment), role, std::string(instance)));
  t->rings_ = rings;
  TC_RETURN_IF_ERROR(t->ClaimSlot());
  return t;
}

absl::StatusOr<bool> Transport::RemoveStale(std::string_view instance) {
  return SharedSegment::RemoveIfStale(instance, kTransportSegment);
}

absl::Status Transport::ClaimSlot() {
  ProcessSlot& slot = control_->processes[static_cast<int>(role_)];
  ProcessIdentity self = SelfIdentity();
  int32_t holder = slot.pid.load(std::memory_order_acquire);
  if (holder != 0 && holder != self.pid &&
      ProcessAlive(holder, slot.start_ticks.load(std::memory_order_relaxed))) {
    return absl::FailedPreconditionError(absl::StrCat("instance '", instance_, "': the ",
                                                      Av(RoleName(role_)),
                                                      " slot is held by live pid ", holder));
  }
  // Two processes racing for a dead holder's slot: only one CAS wins.
  if (!slot.pid.compare_exchange_strong(holder, self.pid, std::memory_order_acq_rel)) {
    return absl::FailedPreconditionError(absl::StrCat("instance '", instance_, "': the ",
                                                      Av(RoleName(role_)),
                                                      " slot was just taken by pid ", holder));
  }
  slot.start_ticks.store(self.start_ticks, std::memory_order_relaxed);
  slot.epoch.store(epoch(), std::memory_order_relaxed);
  slot.heartbeat_ns.store(static_cast<uint64_t>(MonotonicNs()), std::memory_order_relaxed);
  slot.progress_ns.store(static_cast<uint64_t>(MonotonicNs()), std::memory_order_relaxed);
  slot.state.store(static_cast<uint32_t>(ProcessState::kStarting), std::memory_order_release);
  claimed_ = true;
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Transport::BumpEpoch() {
  if (role_ != Role::kGateway) {
    return absl::FailedPreconditionError("only the gateway starts a new epoch");
  }
  return control_->epoch.fetch_add(1, std::memory_order_acq_rel) + 1;
}

void* Transport::RingRegion(RingId ring) const {
  return static_cast<std::byte*>(segment_->base()) + rings_[static_cast<int>(ring)].offset;
}

absl::StatusOr<RingProducer> Transport::Producer(RingId ring, WaitPolicy wait) {
  if (static_cast<uint32_t>(ring) >= kNumRings) return absl::InvalidArgumentError("bad ring id");
  if (ProducerOf(ring) != role_) {
    return absl::FailedPreconditionError(
        absl::StrCat(Av(RoleName(role_)), " does not produce on ", Av(RingName(ring))));
  }
  const RingDescriptor& d = rings_[static_cast<int>(ring)];
  RingOptions options;
  options.name = std::string(RingName(ring));
  options.epoch = epoch();
  options.wait = wait;
  return RingProducer::Attach(RingRegion(ring), RingRegionBytes(d.capacity), d.capacity,
                              std::move(options));
}

absl::StatusOr<RingConsumer> Transport::Consumer(RingId ring, WaitPolicy wait) {
  if (static_cast<uint32_t>(ring) >= kNumRings) return absl::InvalidArgumentError("bad ring id");
  if (ConsumerOf(ring) != role_) {
    return absl::FailedPreconditionError(
        absl::StrCat(Av(RoleName(role_)), " does not consume ", Av(RingName(ring))));
  }
  const RingDescriptor& d = rings_[static_cast<int>(ring)];
  RingOptions options;
  options.name = std::string(RingName(ring));
  options.epoch = epoch();
  options.wait = wait;
  return RingConsumer::Attach(RingRegion(ring), RingRegionBytes(d.capacity), d.capacity,
                              std::move(options));
}

absl::Status Transport::ResetRing(RingId ring) {
  if (role_ != Role::kGateway) return absl::FailedPreconditionError("only the gateway resets");
  if (static_cast<uint32_t>(ring) >= kNumRings) return absl::InvalidArgumentError("bad ring id");
  const RingDescriptor& d = rings_[static_cast<int>(ring)];
  return InitRing(RingRegion(ring), RingRegionBytes(d.capacity), d.capacity);
}

std::vector<RingId> Transport::CorruptRings() const {
  std::vector<RingId> out;
  for (int i = 0; i < kNumRings; ++i) {
    const auto* ctl = static_cast<const RingControl*>(RingRegion(static_cast<RingId>(i)));
    if (ctl->corrupt.load(std::memory_order_relaxed) != 0) out.push_back(static_cast<RingId>(i));
  }
  return out;
}

void Transport::Heartbeat() {
  control_->processes[static_cast<int>(role_)].heartbeat_ns.store(
      static_cast<uint64_t>(MonotonicNs()), std::memory_order_release);
}

void Transport::Progress() {
  control_->processes[static_cast<int>(role_)].progress_ns.store(
      static_cast<uint64_t>(MonotonicNs()), std::memory_order_release);
}

absl::Status Transport::SetHangTimeout(absl::Duration timeout) {
  if (role_ != Role::kGateway) return absl::FailedPreconditionError("only the gateway sets it");
  if (timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the hang timeout must be >= 0");
  }
  control_->hang_timeout_ns.store(static_cast<uint64_t>(absl::ToInt64Nanoseconds(timeout)),
                                  std::memory_order_release);
  return absl::OkStatus();
}

absl::Duration Transport::hang_timeout() const {
  const uint64_t ns = control_->hang_timeout_ns.load(std::memory_order_acquire);
  // Shared memory is not trusted: an absurd value (over a day) reads as off rather than as a
  // negative or overflowing duration.
  if (ns > uint64_t{86400} * 1000000000) return absl::ZeroDuration();
  return absl::Nanoseconds(static_cast<int64_t>(ns));
}

void Transport::SetState(ProcessState state) {
  control_->processes[static_cast<int>(role_)].state.store(static_cast<uint32_t>(state),
                                                           std::memory_order_release);
}

ProcessInfo Transport::Process(Role role) const {
  const ProcessSlot& slot = control_->processes[static_cast<int>(role)];
  ProcessInfo info;
  info.pid = slot.pid.load(std::memory_order_acquire);
  uint32_t state = slot.state.load(std::memory_order_acquire);
  info.state = state <= static_cast<uint32_t>(ProcessState::kFailed)
                   ? static_cast<ProcessState>(state)
                   : ProcessState::kFailed;  // an impossible value is a failure, not UB
  info.heartbeat_ns = slot.heartbeat_ns.load(std::memory_order_acquire);
  info.progress_ns = slot.progress_ns.load(std::memory_order_acquire);
  info.epoch = slot.epoch.load(std::memory_order_relaxed);
  info.alive = ProcessAlive(info.pid, slot.start_ticks.load(std::memory_order_relaxed));
  return info;
}

namespace {
int64_t AgeNs(const std::atomic<uint64_t>& stamp) {
  const uint64_t t = stamp.load(std::memory_order_acquire);
  const int64_t now = MonotonicNs();
  if (t == 0 || t > static_cast<uint64_t>(now)) {
    return t == 0 ? std::numeric_limits<int64_t>::max() : 0;
  }
  return now - static_cast<int64_t>(t);
}
}  // namespace

int64_t Transport::HeartbeatAgeNs(Role role) const {
  return AgeNs(control_->processes[static_cast<int>(role)].heartbeat_ns);
}

int64_t Transport::ProgressAgeNs(Role role) const {
  return AgeNs(control_->processes[static_cast<int>(role)].progress_ns);
}

}  // namespace thermocline::ipc
