#include "shared/ipc/segment.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/interprocess/exceptions.hpp>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/permissions.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <new>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "shared/util/status_macros.h"

namespace thermocline::ipc {
namespace bip = boost::interprocess;

namespace {

// This Abseil build has its own string_view type; the public API uses std::string_view.
absl::string_view Av(std::string_view s) { return absl::string_view(s.data(), s.size()); }

constexpr char kPrefix[] = "thermocline-";
// How long a segment may sit unformatted (its creator between shm_open and publishing) before
// it is judged abandoned.
constexpr auto kInitGrace = std::chrono::milliseconds(1000);

// Boost.Interprocess reports through exceptions; they stop here.
absl::Status FromBoost(const bip::interprocess_exception& e, std::string_view what,
                       std::string_view name) {
  std::string msg = absl::StrCat(Av(what), " ", Av(name), ": ", e.what());
  switch (e.get_error_code()) {
    case bip::not_found_error:
      return absl::NotFoundError(msg);
    case bip::already_exists_error:
      return absl::AlreadyExistsError(msg);
    case bip::security_error:
      return absl::PermissionDeniedError(msg);
    case bip::out_of_space_error:
    case bip::out_of_memory_error:
    case bip::out_of_resource_error:
      return absl::ResourceExhaustedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

bool ValidWhat(std::string_view what) {
  if (what.empty() || what.size() > 32) return false;
  for (char c : what) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))) return false;
  }
  return true;
}

// State and start time (field 22) of /proc/<pid>/stat.
bool ReadProcStat(int32_t pid, char* state, uint64_t* start_ticks) {
  std::string path = absl::StrCat("/proc/", pid, "/stat");
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[1024];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return false;
  absl::string_view text(buf, static_cast<size_t>(n));
  // The command name may contain spaces and parentheses; fields resume after the last ')'.
  size_t paren = text.rfind(')');
  if (paren == absl::string_view::npos) return false;
  std::vector<absl::string_view> fields =
      absl::StrSplit(text.substr(paren + 1), ' ', absl::SkipEmpty());
  // fields[0] is field 3 (state), so field 22 (starttime) is fields[19].
  if (fields.size() < 20 || fields[0].empty()) return false;
  *state = fields[0][0];
  return absl::SimpleAtoi(fields[19], start_ticks);
}

enum class Verdict { kGone, kLive, kInitializing, kStale, kForeign };

// A name under /dev/shm held by another user (or not a plain file: a planted symlink) is never
// ours to read, trust or replace, whatever it contains: /dev/shm is writable by everyone, so
// anyone may create the predictable name of an instance before the service does.
std::string ForeignOwner(const struct stat& st) {
  if (!S_ISREG(st.st_mode)) return "is not a regular file";
  if (st.st_uid != geteuid()) {
    return absl::StrCat("belongs to uid ", st.st_uid, ", not to this user (uid ", geteuid(), ")");
  }
  return "";
}

absl::Status ForeignError(std::string_view name, const std::string& why) {
  return absl::PermissionDeniedError(absl::StrCat(
      "shared memory segment /dev/shm/", Av(name), " ", why,
      ": another user holds this instance's name; it is neither used nor replaced (remove it as "
      "its owner, or choose another --instance)"));
}

struct Probe {
  Verdict verdict = Verdict::kGone;
  std::string detail;
  int32_t pid = 0;
};

// Judges an existing segment by its preamble only (the one layout every build agrees on).
absl::StatusOr<Probe> ProbeSegment(const std::string& name) {
  Probe p;
  struct stat st {};
  if (lstat(absl::StrCat("/dev/shm/", name).c_str(), &st) != 0) {
    if (errno == ENOENT) return p;  // removed meanwhile
    return absl::InternalError(absl::StrCat("cannot stat /dev/shm/", name, ": ", std::strerror(errno)));
  }
  if (std::string why = ForeignOwner(st); !why.empty()) {
    p.verdict = Verdict::kForeign;
    p.detail = why;
    return p;
  }
  try {
    bip::shared_memory_object shm(bip::open_only, name.c_str(), bip::read_only);
    bip::offset_t size = 0;
    if (!shm.get_size(size)) return absl::InternalError(absl::StrCat("cannot stat ", name));
    if (size < static_cast<bip::offset_t>(sizeof(SegmentPreamble))) {
      p.verdict = Verdict::kInitializing;
      p.detail = absl::StrCat("only ", size, " bytes");
      return p;
    }
    bip::mapped_region region(shm, bip::read_only, 0, sizeof(SegmentPreamble));
    const auto* pre = static_cast<const SegmentPreamble*>(region.get_address());
    uint64_t magic = pre->magic.load(std::memory_order_acquire);
    p.pid = pre->owner_pid.load(std::memory_order_relaxed);
    uint64_t start = pre->owner_start_ticks.load(std::memory_order_relaxed);
    bool alive = ProcessAlive(p.pid, start);
    if (magic == 0) {
      if (p.pid != 0 && !alive) {
        p.verdict = Verdict::kStale;
        p.detail = absl::StrCat("creator pid ", p.pid, " died before finishing it");
      } else {
        p.verdict = Verdict::kInitializing;
        p.detail = "not yet published";
      }
    } else if (magic != kSegmentMagic) {
      p.verdict = Verdict::kStale;
      p.detail = absl::StrCat("not a Thermocline segment (magic 0x", absl::Hex(magic), ")");
    } else if (!alive) {
      p.verdict = Verdict::kStale;
      p.detail =
          p.pid == 0 ? std::string("owner exited") : absl::StrCat("owner pid ", p.pid, " is dead");
    } else {
      p.verdict = Verdict::kLive;
      p.detail =
          absl::StrCat("owned by live pid ", p.pid, " (layout version ", pre->layout_version, ")");
    }
    return p;
  } catch (const bip::interprocess_exception& e) {
    if (e.get_error_code() == bip::not_found_error) return p;  // removed meanwhile
    return FromBoost(e, "cannot inspect", name);
  }
}

// Probes until the verdict is final: a segment still being formatted gets kInitGrace, then is
// judged abandoned (its creator, alive or not, failed to publish it).
absl::StatusOr<Probe> JudgeSegment(const std::string& name) {
  auto give_up = std::chrono::steady_clock::now() + kInitGrace;
  for (;;) {
    TC_ASSIGN_OR_RETURN(Probe p, ProbeSegment(name));
    if (p.verdict != Verdict::kInitializing) return p;
    if (std::chrono::steady_clock::now() >= give_up) {
      p.verdict = Verdict::kStale;
      p.detail = absl::StrCat("never published (", p.detail, ")");
      return p;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

absl::Status ValidateInstanceName(std::string_view instance) {
  bool ok = !instance.empty() && instance.size() <= 64;
  for (char c : instance) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '_' || c == '-');
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid instance name '", Av(instance.substr(0, 80)), "': use 1 to 64 of [A-Za-z0-9_-]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> SegmentName(std::string_view instance, std::string_view what) {
  TC_RETURN_IF_ERROR(ValidateInstanceName(instance));
  if (!ValidWhat(what)) {
    return absl::InvalidArgumentError(absl::StrCat("invalid segment kind '", Av(what), "'"));
  }
  return absl::StrCat(kPrefix, Av(instance), "-", Av(what));
}

std::vector<std::string> ListInstanceSegments(std::string_view instance) {
  std::vector<std::string> out;
  if (!ValidateInstanceName(instance).ok()) return out;
  // Instance names may contain '-', so match the whole "<instance>-<what>" shape: the rest
  // after the prefix must be a valid `what`.
  std::string prefix = absl::StrCat(kPrefix, Av(instance), "-");
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, prefix) && ValidWhat(std::string_view(name).substr(prefix.size()))) {
      out.push_back(name);
    }
  }
  return out;
}

ProcessIdentity SelfIdentity() {
  ProcessIdentity id;
  id.pid = static_cast<int32_t>(getpid());
  char state;
  if (!ReadProcStat(id.pid, &state, &id.start_ticks)) id.start_ticks = 0;
  return id;
}

bool ProcessAlive(int32_t pid, uint64_t start_ticks) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  char state;
  uint64_t ticks;
  if (ReadProcStat(pid, &state, &ticks)) {
    if (state == 'Z' || state == 'X') return false;
    if (start_ticks != 0 && ticks != start_ticks) return false;  // pid reused
  }
  return true;
}

struct SharedSegment::Impl {
  std::string name;
  bip::shared_memory_object shm;
  bip::mapped_region region;
  bool owner = false;
  dev_t dev = 0;
  ino_t ino = 0;
  std::string replaced_reason;

  ~Impl() {
    if (!owner) return;
    auto* pre = static_cast<SegmentPreamble*>(region.get_address());
    // Attached workers that outlive us see "owner exited" rather than a live-looking pid.
    if (pre != nullptr) pre->owner_pid.store(0, std::memory_order_release);
    // Remove the name only if it still names our segment: after a (mistaken) replacement by
    // another creator, unlinking would delete theirs.
    int fd = shm_open(absl::StrCat("/", name).c_str(), O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) return;
    struct stat st;
    bool ours = fstat(fd, &st) == 0 && st.st_dev == dev && st.st_ino == ino;
    close(fd);
    if (ours) bip::shared_memory_object::remove(name.c_str());
  }
};

SharedSegment::SharedSegment(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SharedSegment::~SharedSegment() = default;

void* SharedSegment::base() const { return impl_->region.get_address(); }
uint64_t SharedSegment::size() const { return impl_->region.get_size(); }
bool SharedSegment::is_owner() const { return impl_->owner; }
const std::string& SharedSegment::name() const { return impl_->name; }
const std::string& SharedSegment::replaced_reason() const { return impl_->replaced_reason; }

bool SharedSegment::OwnerAlive() const {
  const SegmentPreamble& pre = preamble();
  return ProcessAlive(pre.owner_pid.load(std::memory_order_acquire),
                      pre.owner_start_ticks.load(std::memory_order_relaxed));
}

absl::StatusOr<std::unique_ptr<SharedSegment>> SharedSegment::Create(
    std::string_view instance, std::string_view what, uint64_t bytes, uint32_t layout_version,
    absl::FunctionRef<absl::Status(void* base)> init) {
  TC_ASSIGN_OR_RETURN(std::string name, SegmentName(instance, what));
  if (bytes < sizeof(SegmentPreamble) || bytes > (uint64_t{1} << 40)) {
    return absl::InvalidArgumentError(absl::StrCat("segment size ", bytes, " out of range"));
  }
  auto impl = std::make_unique<Impl>();
  impl->name = name;
  // Each round either creates the segment or removes a stale one; a live owner ends it. The
  // bound only matters if other processes keep recreating stale segments under our feet.
  for (int round = 0; round < 16; ++round) {
    bool exists = false;
    try {
      bip::permissions perm;
      perm.set_permissions(0600);
      bip::shared_memory_object shm(bip::create_only, name.c_str(), bip::read_write, perm);
      impl->shm.swap(shm);
    } catch (const bip::interprocess_exception& e) {
      if (e.get_error_code() != bip::already_exists_error) {
        return FromBoost(e, "cannot create", name);
      }
      exists = true;
    }
    if (exists) {
      TC_ASSIGN_OR_RETURN(Probe p, JudgeSegment(name));
      if (p.verdict == Verdict::kForeign) return ForeignError(name, p.detail);
      if (p.verdict == Verdict::kLive) {
        return absl::FailedPreconditionError(absl::StrCat(
            "instance '", Av(instance), "' is in use: shared memory segment /dev/shm/", name,
            " is ", p.detail, "; stop that process or choose another --instance"));
      }
      if (p.verdict == Verdict::kStale) {
        impl->replaced_reason = p.detail;
        bip::shared_memory_object::remove(name.c_str());
      }
      continue;
    }
    // We own the name now; any failure below must not leave it behind (Impl's destructor
    // removes it, once it knows the inode to check against).
    impl->owner = true;
    int fd = impl->shm.get_mapping_handle().handle;
    struct stat st;
    if (fstat(fd, &st) != 0) {
      bip::shared_memory_object::remove(name.c_str());
      return absl::InternalError(absl::StrCat("cannot stat /dev/shm/", name));
    }
    impl->dev = st.st_dev;
    impl->ino = st.st_ino;
    try {
      impl->shm.truncate(static_cast<bip::offset_t>(bytes));
      // tmpfs hands out pages lazily; reserving them now turns "/dev/shm is full" into an
      // error here instead of SIGBUS in whichever process first touches the page.
      int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
      if (rc != 0) {
        std::unique_ptr<Impl> cleanup = std::move(impl);  // removes the name
        return absl::ResourceExhaustedError(absl::StrCat(
            "cannot allocate ", bytes, " bytes for /dev/shm/", name, ": ", std::strerror(rc)));
      }
      bip::mapped_region region(impl->shm, bip::read_write, 0, bytes);
      impl->region.swap(region);
    } catch (const bip::interprocess_exception& e) {
      absl::Status s = FromBoost(e, "cannot size or map", name);
      impl.reset();
      return s;
    }
    auto* pre = new (impl->region.get_address()) SegmentPreamble;
    ProcessIdentity self = SelfIdentity();
    // Owner first, so a prober can tell "being formatted" from "creator died while formatting".
    pre->owner_start_ticks.store(self.start_ticks, std::memory_order_relaxed);
    pre->owner_pid.store(self.pid, std::memory_order_release);
    pre->layout_version = layout_version;
    pre->preamble_bytes = sizeof(SegmentPreamble);
    pre->segment_bytes = bytes;
    absl::Status s = init(impl->region.get_address());
    if (!s.ok()) return s;  // impl's destructor removes the name
    pre->magic.store(kSegmentMagic, std::memory_order_release);
    return std::unique_ptr<SharedSegment>(new SharedSegment(std::move(impl)));
  }
  return absl::UnavailableError(
      absl::StrCat("cannot create /dev/shm/", name, ": it keeps being recreated by others"));
}

absl::StatusOr<std::unique_ptr<SharedSegment>> SharedSegment::Attach(std::string_view instance,
                                                                     std::string_view what,
                                                                     uint32_t layout_version) {
  TC_ASSIGN_OR_RETURN(std::string name, SegmentName(instance, what));
  auto impl = std::make_unique<Impl>();
  impl->name = name;
  try {
    bip::shared_memory_object shm(bip::open_only, name.c_str(), bip::read_write);
    // The open file is what counts (the name may have been swapped since any earlier look).
    struct stat st {};
    if (fstat(shm.get_mapping_handle().handle, &st) != 0) {
      return absl::InternalError(absl::StrCat("cannot stat /dev/shm/", name));
    }
    if (std::string why = ForeignOwner(st); !why.empty()) return ForeignError(name, why);
    bip::offset_t size = 0;
    if (!shm.get_size(size)) return absl::InternalError(absl::StrCat("cannot stat ", name));
    if (size < static_cast<bip::offset_t>(sizeof(SegmentPreamble))) {
      return absl::UnavailableError(
          absl::StrCat("/dev/shm/", name, " is still being created (", size, " bytes)"));
    }
    bip::mapped_region region(shm, bip::read_write, 0, static_cast<size_t>(size));
    impl->shm.swap(shm);
    impl->region.swap(region);
  } catch (const bip::interprocess_exception& e) {
    if (e.get_error_code() == bip::not_found_error) {
      return absl::NotFoundError(absl::StrCat("instance '", Av(instance),
                                              "' has no segment /dev/shm/", name,
                                              " (is its gateway running?)"));
    }
    // Another user's 0600 segment cannot even be opened: say whose it is.
    struct stat st {};
    if (lstat(absl::StrCat("/dev/shm/", name).c_str(), &st) == 0) {
      if (std::string why = ForeignOwner(st); !why.empty()) return ForeignError(name, why);
    }
    return FromBoost(e, "cannot attach to", name);
  }
  const auto* pre = static_cast<const SegmentPreamble*>(impl->region.get_address());
  uint64_t magic = pre->magic.load(std::memory_order_acquire);
  if (magic == 0) {
    return absl::UnavailableError(absl::StrCat("/dev/shm/", name, " is still being formatted"));
  }
  if (magic != kSegmentMagic) {
    return absl::FailedPreconditionError(absl::StrCat(
        "/dev/shm/", name, " is not a Thermocline segment (magic 0x", absl::Hex(magic), ")"));
  }
  if (pre->layout_version != layout_version) {
    return absl::FailedPreconditionError(absl::StrCat(
        "/dev/shm/", name, " has layout version ", pre->layout_version, ", this build speaks ",
        layout_version, ": the gateway and workers come from different builds"));
  }
  if (pre->preamble_bytes != sizeof(SegmentPreamble) ||
      pre->segment_bytes != impl->region.get_size()) {
    return absl::DataLossError(absl::StrCat("/dev/shm/", name, " says it has ", pre->segment_bytes,
                                            " bytes but has ", impl->region.get_size()));
  }
  // A leftover of a dead owner would accept the attach and then never answer.
  const int32_t owner = pre->owner_pid.load(std::memory_order_acquire);
  if (!ProcessAlive(owner, pre->owner_start_ticks.load(std::memory_order_relaxed))) {
    return absl::FailedPreconditionError(
        absl::StrCat("/dev/shm/", name, " is stale: its owner (pid ", owner, ") is gone"));
  }
  return std::unique_ptr<SharedSegment>(new SharedSegment(std::move(impl)));
}

absl::StatusOr<bool> SharedSegment::RemoveIfStale(std::string_view instance,
                                                  std::string_view what) {
  TC_ASSIGN_OR_RETURN(std::string name, SegmentName(instance, what));
  TC_ASSIGN_OR_RETURN(Probe p, JudgeSegment(name));
  if (p.verdict == Verdict::kForeign) return ForeignError(name, p.detail);
  if (p.verdict != Verdict::kStale) return false;
  return bip::shared_memory_object::remove(name.c_str());
}

}  // namespace thermocline::ipc
