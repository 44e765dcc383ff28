#include "shared/driver/split_engine.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "shared/ipc/futex.h"
#include "shared/ipc/messages.h"
#include "shared/ipc/worker_flags.h"
#include "shared/util/logfmt.h"
#include "shared/util/status_macros.h"

namespace thermocline::driver {
namespace {

// Longest wait on a ring before liveness is checked again: keeps death detection well inside
// the 500 ms the design allows, at a cost of one waitpid per worker per slice.
constexpr absl::Duration kSlice = absl::Milliseconds(20);
// After the cpu_worker is found dead mid-step, how long the gpu_worker gets to abandon the step
// (it answers Unavailable) before the cpu_worker is replaced anyway. Replacing it first would
// leave the gpu_worker waiting for a partial sum that the new process never computes.
constexpr int64_t kPeerGraceNs = 2'000'000'000;

std::string Name(ipc::Role role) { return std::string(ipc::RoleName(role)); }

// Smallest power of two >= bytes, and at least `floor`.
uint64_t RingCapacity(uint64_t max_payload, uint64_t floor) {
  // A record may take half a ring (ipc::MaxPayloadBytes); 64 bytes cover the header and padding.
  const uint64_t need = 2 * (max_payload + 64);
  uint64_t c = floor;
  while (c < need) c *= 2;
  return c;
}

// The flags of one worker: the engine's options, with that worker's thread count. Only what
// `kind` takes is emitted, so the other worker's fields may stay set.
ipc::WorkerFlags WorkerFlagsOf(const SplitEngineOptions& o, ipc::WorkerKind kind) {
  ipc::WorkerFlags f;
  f.instance = o.instance;
  f.model_path = o.model_path;
  f.check_tensors = o.check_tensors;
  f.threads = kind == ipc::WorkerKind::kGpu ? o.gpu_threads : o.cpu_threads;
  f.plan_path = o.plan_path;
  if (o.plan_path.empty()) f.hot_fraction = o.hot_fraction;  // a plan wins, as in Create
  f.sparsity = o.sparsity;
  f.teal = o.teal;
  f.backend = o.gpu_backend;
  f.kv_slots = o.kv_slots;
  f.context = o.context;
  f.max_batch = o.max_batch;
  f.kv_type = o.kv_type;
  f.prefix_cache_blocks = o.prefix_cache_blocks;
  f.numa_node = o.numa_node;
  f.cpus = o.cpus;
  f.mlock = o.mlock;
  return f;
}

std::vector<std::string> Argv(const SplitEngineOptions& o, ipc::WorkerKind kind,
                              const std::vector<std::string>& extra) {
  std::vector<std::string> a = {o.bindir + "/" + ipc::WorkerProgram(kind)};
  const std::vector<std::string> flags = ipc::WorkerArgv(WorkerFlagsOf(o, kind), kind);
  a.insert(a.end(), flags.begin(), flags.end());
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

}  // namespace

absl::StatusOr<std::string> SelfBinDir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read /proc/self/exe: ", std::strerror(errno)));
  }
  std::string path(buf, static_cast<size_t>(n));
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

std::vector<std::string> GpuWorkerArgv(const SplitEngineOptions& o) {
  return Argv(o, ipc::WorkerKind::kGpu, o.extra_gpu_args);
}

std::vector<std::string> CpuWorkerArgv(const SplitEngineOptions& o) {
  return Argv(o, ipc::WorkerKind::kCpu, o.extra_cpu_args);
}

absl::StatusOr<std::unique_ptr<SplitEngine>> SplitEngine::Create(SplitEngineOptions o) {
  const ModelConfig& c = o.config;
  if (c.vocab_size <= 0 || c.dim <= 0 || c.ffn_dim <= 0 || c.context_length <= 0) {
    return absl::InvalidArgumentError("split: the model's config (vocab, dims, context) is unset");
  }
  if (o.model_path.empty()) return absl::InvalidArgumentError("split: no model path");
  if (!o.attach && o.plan_path.empty() == !o.hot_fraction.has_value()) {
    return absl::InvalidArgumentError(
        "split: give exactly one placement: a plan file or a hot fraction");
  }
  if (o.hot_fraction.has_value() && !(*o.hot_fraction >= 0 && *o.hot_fraction <= 1)) {
    return absl::InvalidArgumentError("split: the hot fraction must be in [0, 1]");
  }
  if (o.gpu_threads < 1 || o.cpu_threads < 1) {
    return absl::InvalidArgumentError("split: each worker needs at least one thread");
  }
  if (o.kv_slots < 1 || o.max_batch < 1 || o.max_logits_rows < 1) {
    return absl::InvalidArgumentError("split: kv slots, max batch and max logits rows must be >= 1");
  }
  if (o.prefix_cache_blocks < 0) {
    return absl::InvalidArgumentError("split: prefix cache blocks must be >= 0");
  }
  if (o.prefix_cache_blocks > 0 && o.gpu_backend != "host") {
    return absl::InvalidArgumentError(absl::StrCat(
        "split: the prefix cache needs a paged KV cache, which the ", o.gpu_backend,
        " backend does not have yet: use --prefix-cache-blocks 0 with it"));
  }
  if (o.context <= 0) o.context = static_cast<int32_t>(c.context_length);
  if (o.context > c.context_length) {
    return absl::InvalidArgumentError(absl::StrCat("split: context ", o.context,
                                                   " exceeds the model's ", c.context_length));
  }
  if (o.instance.empty()) {
    static std::atomic<int> counter{0};
    o.instance = absl::StrCat("gen-", getpid(), "-", counter++);
  }
  if (o.bindir.empty()) {
    TC_ASSIGN_OR_RETURN(o.bindir, SelfBinDir());
  }

  // Rings sized for the largest message each carries, never below the transport's defaults.
  const uint64_t rows = static_cast<uint64_t>(o.max_batch);
  const uint64_t dim = static_cast<uint64_t>(c.dim), ffn = static_cast<uint64_t>(c.ffn_dim);
  ipc::TransportOptions topt;
  auto& cap = topt.ring_capacity;
  // A Step may carry the table of every slot it writes (at most one per entry, and all slots).
  const uint64_t tables = std::min<uint64_t>(rows, static_cast<uint64_t>(o.kv_slots));
  const uint64_t per_slot = static_cast<uint64_t>(KvCache::BlocksFor(o.context));
  const uint64_t kv_words =
      o.prefix_cache_blocks > 0 ? 2 + tables * (3 + per_slot) + 2 * (rows + o.kv_slots) : 0;
  cap[0] = RingCapacity(ipc::StepBytes(rows, kv_words), cap[0]);
  cap[1] = RingCapacity(std::max<uint64_t>(
                            ipc::MatrixBytes(o.max_logits_rows, c.vocab_size),
                            8 + ipc::kMaxErrorMessageBytes),
                        cap[1]);
  // An activation: h rows x dim, plus at most every neuron of every row as a candidate (with
  // a per-row end offset), or in MoE layers (all cold neurons) the router's picks, or TEAL's
  // cuts; a partial: rows x dim.
  cap[2] = RingCapacity(
      std::max({ipc::ActivationBytes(rows, dim, rows * ffn, false),
                ipc::ActivationBytes(rows, dim, 0, true, static_cast<uint64_t>(c.n_experts_used)),
                ipc::ActivationBytes(rows, dim, 0, true, 0, true)}),
      cap[2]);
  cap[3] = RingCapacity(ipc::MatrixBytes(rows, dim), cap[3]);
  TC_ASSIGN_OR_RETURN(std::unique_ptr<ipc::Transport> transport,
                      ipc::Transport::Create(o.instance, topt));
  std::unique_ptr<SplitEngine> engine(new SplitEngine(std::move(o), std::move(transport)));
  TC_RETURN_IF_ERROR(engine->Init());
  return engine;
}

SplitEngine::SplitEngine(SplitEngineOptions options, std::unique_ptr<ipc::Transport> transport)
    : options_(std::move(options)),
      transport_(std::move(transport)),
      history_(options_.kv_slots, options_.context),
      blocks_(options_.kv_slots, options_.context, options_.prefix_cache_blocks,
              options_.prefix_cache_blocks > 0) {}

void SplitEngine::ReleaseSlot(int32_t slot) {
  history_.Release(slot);
  if (slot >= 0 && slot < options_.kv_slots) blocks_.Release(slot);
}

int32_t SplitEngine::ReusePrefix(int32_t slot, std::span<const int32_t> tokens) {
  if (slot < 0 || slot >= options_.kv_slots || !history_.tokens(slot).empty()) return 0;
  const int32_t n = blocks_.AttachPrefix(slot, tokens);
  history_.Adopt(slot, tokens.first(static_cast<size_t>(n)));
  return n;
}

absl::Status SplitEngine::ForkSlot(int32_t src, int32_t dst, int32_t n) {
  if (src < 0 || src >= options_.kv_slots || dst < 0 || dst >= options_.kv_slots) {
    return absl::InvalidArgumentError(absl::StrCat("split: fork of slot ", src, " into ", dst,
                                                   " outside [0, ", options_.kv_slots, ")"));
  }
  TC_RETURN_IF_ERROR(blocks_.Fork(src, dst, n));
  history_.Adopt(dst, std::span<const int32_t>(blocks_.tokens(dst)));
  return absl::OkStatus();
}

absl::Status SplitEngine::Init() {
  TC_ASSIGN_OR_RETURN(ipc::RingProducer out, transport_->Producer(ipc::RingId::kGatewayToGpu));
  TC_ASSIGN_OR_RETURN(ipc::RingConsumer in, transport_->Consumer(ipc::RingId::kGpuToGateway));
  to_gpu_.emplace(std::move(out));
  from_gpu_.emplace(std::move(in));
  if (!options_.log_path.empty()) {
    log_fd_ = open(options_.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd_ < 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "split: cannot open the worker log ", options_.log_path, ": ", std::strerror(errno)));
    }
  }
  // Before the workers start: what they load is what later restarts are compared with.
  for (const std::string* path : {&options_.model_path, &options_.plan_path}) {
    if (path->empty()) continue;
    absl::StatusOr<FileIdentity> id = IdentifyFile(*path);
    if (!id.ok()) {
      return absl::Status(id.status().code(), absl::StrCat("split: ", id.status().message()));
    }
    inputs_.emplace_back(*path, *id);
  }
  SupervisorOptions so;
  so.workers = {WorkerSpec{ipc::Role::kGpuWorker, GpuWorkerArgv(options_)},
                WorkerSpec{ipc::Role::kCpuWorker, CpuWorkerArgv(options_)}};
  so.attach = options_.attach;
  so.restart = options_.restart;
  so.ready_timeout = options_.ready_timeout;
  so.hang_timeout = options_.hang_timeout;
  so.output_fd = log_fd_;
  supervisor_ = std::make_unique<Supervisor>(*transport_, std::move(so));
  return supervisor_->Start();
}

SplitEngine::~SplitEngine() {
  if (supervisor_ != nullptr) {
    // The gpu_worker exits on Shutdown and passes it on to the cpu_worker (which has no ring
    // from the driver); without a live gpu_worker to ask, SIGTERM does it. The supervisor
    // escalates to SIGTERM and SIGKILL for whichever does not exit.
    bool asked = false;
    if (!supervisor_->attach() && supervisor_->pid(ipc::Role::kGpuWorker) != 0 &&
        to_gpu_.has_value()) {
      asked = ipc::SendShutdown(*to_gpu_, absl::Milliseconds(100)).ok();
    }
    supervisor_->Stop(absl::Seconds(2), asked);
    supervisor_.reset();
  }
  to_gpu_.reset();
  from_gpu_.reset();
  transport_.reset();  // removes the segment
  if (log_fd_ >= 0) close(log_fd_);
}

std::optional<SplitEngine::Failure> SplitEngine::DeadWorkers() {
  std::vector<WorkerDeath> deaths = supervisor_->Check();
  if (deaths.empty()) return std::nullopt;
  Failure f;
  std::vector<std::string> why;
  for (const WorkerDeath& d : deaths) {
    f.roles.push_back(d.role);
    why.push_back(absl::StrCat(Name(d.role), " ", d.why));
  }
  f.why = absl::StrJoin(why, "; ");
  return f;
}

absl::Status SplitEngine::Run(std::span<const BatchEntry> batch, std::vector<float>& logits) {
  logits.clear();
  if (batch.empty()) return absl::OkStatus();
  const int64_t vocab = options_.config.vocab_size;
  std::vector<ipc::StepEntry> entries;
  entries.reserve(batch.size());
  int64_t n_want = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const BatchEntry& b = batch[i];
    if (b.token < 0 || b.token >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("entry ", i, ": token ", b.token, " outside the vocabulary [0, ", vocab, ")"));
    }
    entries.push_back(ipc::StepEntry{b.slot, b.position, b.token,
                                     b.want_logits ? ipc::kEntryWantsLogits : 0u});
    n_want += b.want_logits ? 1 : 0;
  }
  TC_RETURN_IF_ERROR(history_.Validate(entries));
  logits.resize(static_cast<size_t>(n_want * vocab));
  // Steps of at most max_batch entries and max_logits_rows logits rows, in batch order: later
  // entries of a slot continue earlier ones, so order is all the split must keep.
  size_t begin = 0;
  int64_t rows_done = 0;
  while (begin < entries.size()) {
    size_t end = begin;
    int32_t want = 0;
    while (end < entries.size() && end - begin < static_cast<size_t>(options_.max_batch)) {
      const bool w = entries[end].flags & ipc::kEntryWantsLogits;
      if (w && want == options_.max_logits_rows) break;
      want += w ? 1 : 0;
      ++end;
    }
    // The KV blocks these entries write, decided here (the prefix cache) and sent with them.
    const auto chunk = batch.subspan(begin, end - begin);
    TC_ASSIGN_OR_RETURN(const KvPlan plan, blocks_.Prepare(chunk));
    TC_RETURN_IF_ERROR(Execute(std::span<const ipc::StepEntry>(entries).subspan(begin, end - begin),
                               plan, want, logits.data() + rows_done * vocab));
    blocks_.Commit(chunk);
    rows_done += want;
    begin = end;
  }
  return absl::OkStatus();
}

absl::Status SplitEngine::Execute(std::span<const ipc::StepEntry> entries, const KvPlan& plan,
                                  int32_t n_want, float* out) {
  bool resend = false;
  for (;;) {
    // A worker that died while idle is replaced before anything is sent to it.
    if (std::optional<Failure> dead = DeadWorkers()) TC_RETURN_IF_ERROR(Recover(*dead));
    if (replay_pending_) {
      std::optional<Failure> failure;
      TC_RETURN_IF_ERROR(Replay(&failure));
      if (failure.has_value()) {
        TC_RETURN_IF_ERROR(Recover(*failure));
        continue;
      }
      replay_pending_ = false;
    }
    if (resend) ++stats_.resent_steps;
    std::optional<Failure> failure;
    TC_RETURN_IF_ERROR(Attempt(entries, plan, n_want, out, &failure));
    if (!failure.has_value()) {
      history_.Apply(entries);
      return absl::OkStatus();
    }
    TC_RETURN_IF_ERROR(Recover(*failure));
    resend = true;
  }
}

absl::Status SplitEngine::Replay(std::optional<Failure>* failure) {
  for (const std::vector<ipc::StepEntry>& step : history_.ReplaySteps(options_.max_batch)) {
    // Each slot's table as it is now, holding what the replay has rebuilt so far: a block
    // shared by several slots is recomputed by each (the same tokens give the same values).
    KvPlan plan;
    if (blocks_.enabled()) {
      for (const ipc::StepEntry& e : step) {
        if (!plan.tables.empty() && plan.tables.back().slot == e.kv_slot) continue;
        plan.tables.push_back(blocks_.Table(e.kv_slot, e.position));
      }
    }
    TC_RETURN_IF_ERROR(Attempt(step, plan, 0, nullptr, failure));
    if (failure->has_value()) return absl::OkStatus();
    stats_.replayed_tokens += static_cast<int64_t>(step.size());
  }
  return absl::OkStatus();
}

absl::Status SplitEngine::Attempt(std::span<const ipc::StepEntry> entries, const KvPlan& plan,
                                  int32_t n_want, float* out, std::optional<Failure>* failure) {
  const uint64_t step_id = ++last_step_id_;
  for (;;) {
    absl::Status sent = blocks_.enabled()
                            ? ipc::SendStep(*to_gpu_, step_id, entries, kSlice, plan.tables,
                                            plan.copies)
                            : ipc::SendStep(*to_gpu_, step_id, entries, kSlice);
    if (sent.ok()) break;
    if (!absl::IsDeadlineExceeded(sent)) {
      return absl::Status(sent.code(), absl::StrCat("split: sending step ", step_id, " to the "
                                                    "gpu_worker: ", sent.message()));
    }
    // The ring is full: the gpu_worker is behind, or gone.
    if ((*failure = DeadWorkers()).has_value()) return absl::OkStatus();
  }
  if (options_.on_step_sent) options_.on_step_sent(step_id, stats_.steps);

  const int64_t deadline = ipc::MonotonicNs() + absl::ToInt64Nanoseconds(options_.step_timeout);
  int64_t cpu_dead_at = 0;
  for (;;) {
    absl::StatusOr<ipc::MessageView> m = from_gpu_->Peek(kSlice);
    if (!m.ok()) {
      if (!absl::IsDeadlineExceeded(m.status())) {
        return absl::Status(m.status().code(),
                            absl::StrCat("split: reading the gpu_worker's answer to step ",
                                         step_id, ": ", m.status().message()));
      }
      std::optional<Failure> dead = DeadWorkers();
      const int64_t now = ipc::MonotonicNs();
      if (dead.has_value()) {
        const bool gpu = std::find(dead->roles.begin(), dead->roles.end(),
                                   ipc::Role::kGpuWorker) != dead->roles.end();
        if (cpu_dead_at == 0) cpu_dead_at = now;
        // The gpu_worker's death loses the step at once. The cpu_worker's alone does not: the
        // gpu_worker answers it (Unavailable) and that answer, or a late completion, is waited
        // for a little.
        if (gpu || now - cpu_dead_at > kPeerGraceNs) {
          *failure = std::move(dead);
          return absl::OkStatus();
        }
      }
      if (now > deadline) {
        const std::string why =
            absl::StrCat("did not answer step ", step_id, " within ",
                         absl::FormatDuration(options_.step_timeout), "; killed as hung");
        supervisor_->Kill(ipc::Role::kGpuWorker, why);
        *failure = Failure{{ipc::Role::kGpuWorker}, absl::StrCat("gpu_worker ", why)};
        return absl::OkStatus();
      }
      continue;
    }
    const ipc::MessageHeader header = m->header;
    if (header.step_id != step_id) {
      // An answer to a step abandoned in this epoch (say, one sent just before a failure the
      // gpu_worker survived): nobody waits for it any more.
      ++stats_.stale_replies;
      TC_RETURN_IF_ERROR(from_gpu_->Release());
      continue;
    }
    if (header.message_kind() == ipc::MessageKind::kLogits) {
      ipc::MatrixLimits limits;
      limits.cols = static_cast<uint32_t>(options_.config.vocab_size);
      limits.max_rows = static_cast<uint32_t>(n_want);
      absl::StatusOr<ipc::MatrixView> v = ipc::DecodeLogits(*m, limits);
      absl::Status bad = v.ok() && v->rows != static_cast<uint32_t>(n_want)
                             ? absl::InvalidArgumentError(absl::StrCat(
                                   v->rows, " logits rows for ", n_want, " wanted"))
                             : v.status();
      if (bad.ok() && n_want > 0) std::copy(v->data.begin(), v->data.end(), out);
      TC_RETURN_IF_ERROR(from_gpu_->Release());
      if (!bad.ok()) {
        return absl::Status(bad.code(), absl::StrCat("split: the gpu_worker's answer to step ",
                                                     step_id, ": ", bad.message()));
      }
      ++stats_.steps;
      return absl::OkStatus();
    }
    if (header.message_kind() == ipc::MessageKind::kError) {
      absl::Status sender;
      absl::Status decoded = ipc::DecodeError(*m, &sender);
      TC_RETURN_IF_ERROR(from_gpu_->Release());
      TC_RETURN_IF_ERROR(decoded);
      if (absl::IsUnavailable(sender)) {
        // The cold half of the step was lost (the cpu_worker died or stopped answering). The
        // gpu_worker abandoned the step and kept its KV cache: replace the cpu_worker, resend.
        *failure = Failure{{ipc::Role::kCpuWorker},
                           absl::StrCat("cpu_worker lost step ", step_id, " (gpu_worker: ",
                                        sender.message(), ")")};
        return absl::OkStatus();
      }
      return absl::Status(sender.code(), absl::StrCat("gpu_worker, step ", step_id, ": ",
                                                      sender.message()));
    }
    const auto kind = header.message_kind();
    TC_RETURN_IF_ERROR(from_gpu_->Release());
    return absl::InvalidArgumentError(absl::StrCat("split: unexpected ",
                                                   std::string(ipc::MessageKindName(kind)),
                                                   " message from the gpu_worker"));
  }
}

absl::Status SplitEngine::Recover(const Failure& failure) {
  // Workers found dead by now are replaced in the same restart (one epoch bump).
  std::vector<ipc::Role> roles = failure.roles;
  std::string why = failure.why;
  if (std::optional<Failure> dead = DeadWorkers()) {
    for (ipc::Role r : dead->roles) {
      if (std::find(roles.begin(), roles.end(), r) == roles.end()) {
        roles.push_back(r);
        why += "; " + dead->why;
      }
    }
  }
  TC_RETURN_IF_ERROR(CheckInputsUnchanged(Failure{roles, why}));
  std::vector<ipc::Role> restarted;
  TC_ASSIGN_OR_RETURN(const uint64_t epoch, supervisor_->Restart(roles, &restarted));
  // More than asked when a ring was found corrupt meanwhile (then all were replaced).
  if (restarted.size() > roles.size()) why += "; a ring was marked corrupt: every worker replaced";
  roles = restarted;
  to_gpu_->set_epoch(epoch);
  from_gpu_->set_min_epoch(epoch);
  bool gpu = false;
  for (ipc::Role r : roles) {
    ++stats_.restarts;
    if (r == ipc::Role::kGpuWorker) {
      ++stats_.gpu_restarts;
      gpu = true;
    } else {
      ++stats_.cpu_restarts;
    }
  }
  // A new gpu_worker has empty KV caches: rebuild them before the next step. Cached blocks no
  // slot holds are forgotten (nothing replays them).
  if (gpu) {
    replay_pending_ = true;
    blocks_.DropUnreferenced();
  }
  if (options_.log_restarts) {
    Log(Level::kWarn, "worker_restarted",
        {{"instance", options_.instance}, {"why", why},
         {"epoch", static_cast<unsigned long long>(epoch)},
         {"replay_tokens", gpu ? static_cast<long long>(history_.total_tokens()) : 0LL}},
        "driver");
  }
  return absl::OkStatus();
}

absl::Status SplitEngine::CheckInputsUnchanged(const Failure& failure) const {
  for (const auto& [path, then] : inputs_) {
    absl::StatusOr<FileIdentity> now = IdentifyFile(path);
    std::string change;
    if (!now.ok()) {
      change = std::string(now.status().message());
    } else if (!(*now == then)) {
      change = DescribeFileChange(then, *now);
    }
    if (change.empty()) continue;
    absl::Status lost = absl::UnavailableError(absl::StrCat(
        failure.why, "; not restarted: ", path,
        " changed since the workers loaded it (", change,
        "), and a new worker would load other bytes than the one still running; restart the "
        "service to serve the new file"));
    lost.SetPayload(kGivenUpPayload, absl::Cord(path));
    return lost;
  }
  return absl::OkStatus();
}

}  // namespace thermocline::driver
