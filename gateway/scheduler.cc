#include "gateway/scheduler.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <numeric>
#include <span>

#include "absl/strings/str_cat.h"
#include "gateway/log.h"
#include "gateway/text_stream.h"
#include "shared/driver/supervisor.h"
#include "shared/util/status_macros.h"

namespace thermocline::gateway {
namespace {

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

// A pid is alive while /proc shows it in a state other than zombie: a killed worker stays a
// zombie until the engine reaps it, and that is exactly the window health must cover.
bool Alive(pid_t pid) {
  if (pid <= 0) return true;  // not known yet: nothing to say
  std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat;
  if (!std::getline(f, stat)) return false;
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return false;
  const char state = stat[paren + 2];
  return state != 'Z' && state != 'X';
}

}  // namespace

void Stream::Wait(absl::Duration timeout, std::vector<Event>* out) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] { return !events_.empty(); });
  while (!events_.empty()) {
    out->push_back(std::move(events_.front()));
    events_.pop_front();
  }
}

void Stream::Cancel(bool deadline_passed) {
  int live = kLive;
  cancelled_.compare_exchange_strong(live, deadline_passed ? kDeadline : kCancelled,
                                     std::memory_order_acq_rel);
}

absl::Status Stream::CancelReason(const char* where) const {
  return cancelled_.load(std::memory_order_acquire) == kDeadline
             ? absl::DeadlineExceededError(absl::StrCat("the deadline passed ", where))
             : absl::CancelledError(absl::StrCat("cancelled by the caller ", where));
}

void Stream::Push(Event event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(event));
  }
  cv_.notify_all();
}

size_t Stream::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.size();
}

void Stream::SetAbandonHook(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(mu_);
  abandon_hook_ = std::move(hook);
}

void Stream::Abandon() {
  std::function<void()> hook;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (abandoned_) return;
    abandoned_ = true;
    hook = std::move(abandon_hook_);
  }
  if (hook) hook();
}

struct Scheduler::Sequence {
  Sequence(Job j, const Tokenizer& tok)
      : job(std::move(j)), sampler(job.sampling), text(tok, job.stop), history(job.prompt) {
    if (job.grammar) {
      matcher.emplace(job.grammar);
      masks.emplace(job.grammar);
    }
  }
  Job job;
  std::optional<grammar::Matcher> matcher;  // structured output: where the text is
  std::optional<grammar::MaskComputer> masks;
  std::vector<uint8_t> mask;
  std::shared_ptr<Stream> stream = std::make_shared<Stream>();
  Sampler sampler;
  TextStream text;
  std::vector<int32_t> history;  // prompt + sampled tokens
  int32_t slot = -1;
  uint64_t id = 0;               // unique per sequence of this scheduler
  uint64_t fork_from = 0;        // the first choice's id while waiting to fork its prompt
  int32_t prefilled = 0;         // prompt positions submitted to the engine
  int32_t generated = 0;         // tokens streamed
  bool done = false;
  absl::Time started = absl::InfinitePast();      // first prompt position scheduled
  absl::Time first_token = absl::InfinitePast();
  absl::Time last_token = absl::InfinitePast();
  // Since when the sequence has been left out of the steps because its reader does not read
  // (InfiniteFuture: it is not).
  absl::Time stalled_since = absl::InfiniteFuture();
};

Scheduler::Scheduler(std::unique_ptr<ServingEngine> engine, const Tokenizer& tokenizer,
                     SchedulerOptions options, GatewayMetrics* metrics, HealthCallback health,
                     GiveUpCallback give_up)
    : engine_(std::move(engine)),
      tokenizer_(tokenizer),
      options_(options),
      metrics_(metrics),
      health_(std::move(health)),
      give_up_(std::move(give_up)),
      probe_slot_(options.kv_slots) {
  for (int32_t s = options_.kv_slots - 1; s >= 0; --s) free_slots_.push_back(s);
  const WorkerHealth h = engine_->health();
  seen_gpu_restarts_ = h.gpu_restarts;
  seen_cpu_restarts_ = h.cpu_restarts;
  PublishPids();
  UpdateGauges();
  thread_ = std::thread([this] { Loop(); });
  monitor_ = std::thread([this] { MonitorLoop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  monitor_.join();
}

pid_t Scheduler::worker_pid(ipc::Role role) const {
  return role == ipc::Role::kGpuWorker ? gpu_pid_.load() : cpu_pid_.load();
}

absl::StatusOr<std::shared_ptr<Stream>> Scheduler::Submit(Job job) {
  std::vector<Job> one;
  one.push_back(std::move(job));
  TC_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<Stream>> streams, SubmitAll(std::move(one)));
  return streams.front();
}

absl::StatusOr<std::vector<std::shared_ptr<Stream>>> Scheduler::SubmitAll(std::vector<Job> jobs) {
  std::vector<std::unique_ptr<Sequence>> seqs;
  std::vector<std::shared_ptr<Stream>> streams;
  for (Job& job : jobs) {
    seqs.push_back(std::make_unique<Sequence>(std::move(job), tokenizer_));
    streams.push_back(seqs.back()->stream);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ || draining_) return absl::UnavailableError("the gateway is shutting down");
    if (static_cast<int32_t>(waiting_.size() + seqs.size()) > options_.max_queue) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the queue is full: ", waiting_.size(), " requests wait (--max-queue ",
          options_.max_queue, ")", seqs.size() > 1 ? absl::StrCat(" and ", seqs.size(), " choices "
                                                                 "come together")
                                                   : "",
          "; retry later"));
    }
    for (auto& seq : seqs) waiting_.push_back(std::move(seq));
    idle_.store(false, std::memory_order_relaxed);
    if (metrics_) metrics_->SetWaiting(static_cast<int64_t>(waiting_.size()));
  }
  cv_.notify_all();
  return streams;
}

void Scheduler::PublishPids() {
  const WorkerHealth h = engine_->health();
  gpu_pid_.store(h.gpu_pid);
  cpu_pid_.store(h.cpu_pid);
}

void Scheduler::UpdateGauges() {
  if (!metrics_) return;
  const PrefixCacheStats pc = engine_->prefix_cache_stats();
  metrics_->SetPrefixCache(pc.hit_tokens, pc.query_tokens, pc.evictions, pc.cached_blocks);
  metrics_->SetRunning(static_cast<int64_t>(running_.size()));
  metrics_->SetKvSlotsUsed(options_.kv_slots - static_cast<int64_t>(free_slots_.size()),
                           options_.kv_slots);
}

void Scheduler::MonitorLoop() {
  // 20 ms, like the engine's own liveness checks: a death shows in health well before the
  // restart (immediate for the first one) completes on a loaded machine.
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, std::chrono::milliseconds(20), [&] { return stop_; })) {
    const pid_t gpu = gpu_pid_.load(), cpu = cpu_pid_.load();
    lock.unlock();
    std::string why;
    if (!Alive(gpu)) why = absl::StrCat("gpu_worker (pid ", gpu, ") is down");
    else if (!Alive(cpu)) why = absl::StrCat("cpu_worker (pid ", cpu, ") is down");
    lock.lock();
    if (!why.empty() && serving_.exchange(false)) {
      health_(false, why);
      if (metrics_) {
        metrics_->SetWorkerUp(Alive(gpu) ? "cpu_worker" : "gpu_worker", false);
      }
      // Idle, the engine would notice only at the next request: probe now.
      probe_requested_ = true;
      cv_.notify_all();
    }
  }
}

void Scheduler::NoteRestarts() {
  const WorkerHealth st = engine_->health();
  const bool restarted =
      st.gpu_restarts != seen_gpu_restarts_ || st.cpu_restarts != seen_cpu_restarts_;
  if (metrics_) {
    for (; seen_gpu_restarts_ < st.gpu_restarts; ++seen_gpu_restarts_) {
      metrics_->IncWorkerRestarts("gpu_worker");
    }
    for (; seen_cpu_restarts_ < st.cpu_restarts; ++seen_cpu_restarts_) {
      metrics_->IncWorkerRestarts("cpu_worker");
    }
  }
  seen_gpu_restarts_ = st.gpu_restarts;
  seen_cpu_restarts_ = st.cpu_restarts;
  if (restarted && serving_.exchange(false)) {
    // The engine restarted a worker faster than the monitor's 20 ms look: health and the log
    // still say it was down, then (below) serving again.
    health_(false, "a worker was restarted during the step");
  }
}

void Scheduler::NoteFailure(const absl::Status& status) {
  if (give_up_ && driver::IsGivenUp(status)) give_up_(status);
}

void Scheduler::NoteServing() {
  PublishPids();
  if (!serving_.exchange(true)) {
    health_(true, "");
    if (metrics_) {
      metrics_->SetWorkerUp("gpu_worker", true);
      metrics_->SetWorkerUp("cpu_worker", true);
    }
  }
}

void Scheduler::Probe() {
  // One prompt position on the reserved slot, no logits: enough for the engine to find the
  // dead worker, restart it and replay the running slots.
  std::vector<float> logits;
  const BatchEntry e{probe_slot_, 0, tokenizer_.bos(), false};
  absl::Status s = engine_->Run(std::span<const BatchEntry>(&e, 1), logits);
  engine_->ResetSlot(probe_slot_);
  NoteRestarts();
  if (!s.ok()) {
    Log(Level::kError, "probe_failed", {{"error", std::string(s.message())}});
    NoteFailure(s);
    return;
  }
  NoteServing();
}

void Scheduler::Loop() {
  while (true) {
    bool probe = false;
    bool end_now = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(100), [&] {
        return stop_ || probe_requested_ || end_streams_ || !running_.empty() ||
               (!waiting_.empty() && !free_slots_.empty());
      });
      if (stop_) break;
      probe = probe_requested_ && running_.empty();
      probe_requested_ = false;
      end_now = end_streams_;
      end_streams_ = false;
      // Requests cancelled while waiting never take a slot.
      for (auto it = waiting_.begin(); it != waiting_.end();) {
        if ((*it)->stream->cancelled()) {
          Fail(**it, (*it)->stream->CancelReason("while queued"));
          it = waiting_.erase(it);
        } else {
          ++it;
        }
      }
    }
    // Cancelled or deadline-expired sequences leave before the step, so their slots go to the
    // queue in this very step.
    for (auto& seq : running_) {
      if (seq->stream->cancelled()) {
        Fail(*seq, seq->stream->CancelReason("while running"));
        Retire(*seq);
      }
    }
    // A reader that has read nothing for stream_idle_timeout loses its sequence, and its call
    // is cancelled: its handler may be blocked in a write that nothing else would end.
    const absl::Time now = absl::Now();
    for (auto& seq : running_) {
      if (seq->done || options_.stream_idle_timeout <= absl::ZeroDuration() ||
          now - seq->stalled_since <= options_.stream_idle_timeout) {
        continue;
      }
      Log(Level::kWarn, "stream_abandoned",
          {{"request_id", seq->job.request_id},
           {"pending", static_cast<int64_t>(seq->stream->pending())}});
      Fail(*seq, absl::CancelledError(absl::StrCat(
                     "the caller read nothing for ",
                     absl::FormatDuration(options_.stream_idle_timeout),
                     " (--stream-idle-timeout) with ", seq->stream->pending(),
                     " messages waiting; the stream is ended and its slot freed")));
      seq->stream->Abandon();
      Retire(*seq);
    }
    if (end_now) {
      EndAll();
      continue;
    }
    std::erase_if(running_, [](const std::unique_ptr<Sequence>& s) { return s->done; });
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (!waiting_.empty() && !free_slots_.empty() &&
             static_cast<int32_t>(running_.size()) < options_.max_batch) {
        std::unique_ptr<Sequence> seq = std::move(waiting_.front());
        waiting_.pop_front();
        seq->slot = free_slots_.back();
        free_slots_.pop_back();
        seq->id = next_sequence_id_++;
        // A choice whose first choice is still prefilling the same prompt waits to fork it.
        if (options_.fork_choices && seq->job.share_group != 0) {
          for (const auto& other : running_) {
            if (other->job.share_group == seq->job.share_group && other->fork_from == 0 &&
                !other->done && other->prefilled < static_cast<int32_t>(other->job.prompt.size()) &&
                other->job.prompt == seq->job.prompt) {
              seq->fork_from = other->id;
              break;
            }
          }
        }
        // The prefix cache: the blocks of the longest cached prefix are mapped into the slot
        // and prefill starts after them.
        if (seq->fork_from == 0) seq->prefilled = engine_->ReusePrefix(seq->slot, seq->job.prompt);
        seq->started = absl::Now();
        if (metrics_) metrics_->ObserveQueueSeconds(Seconds(seq->started - seq->job.arrival));
        running_.push_back(std::move(seq));
      }
      if (metrics_) metrics_->SetWaiting(static_cast<int64_t>(waiting_.size()));
      idle_.store(running_.empty() && waiting_.empty(), std::memory_order_relaxed);
      if (draining_ && idle_.load(std::memory_order_relaxed)) cv_.notify_all();  // Drain waits
    }
    UpdateGauges();
    if (probe) Probe();
    if (!Step() && !running_.empty()) {
      // Every running sequence waits for its reader: nothing to compute until one reads (or
      // something else happens), so wait a little instead of spinning.
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(10), [&] {
        return stop_ || probe_requested_ || end_streams_ ||
               (!waiting_.empty() && !free_slots_.empty());
      });
    }
  }
  // Shutting down: every sequence still known ends, so no handler waits forever.
  EndAll();
}

void Scheduler::EndAll() {
  for (auto& seq : running_) {
    Finish(*seq, v1::FINISH_REASON_CANCELLED, "", -1);
    Retire(*seq);
  }
  running_.clear();
  UpdateGauges();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& seq : waiting_) Fail(*seq, absl::UnavailableError("the gateway is shutting down"));
  waiting_.clear();
  if (metrics_) metrics_->SetWaiting(0);
  idle_.store(true, std::memory_order_relaxed);
  cv_.notify_all();
}

void Scheduler::Drain(absl::Duration grace, absl::Duration boundary_wait) {
  std::unique_lock<std::mutex> lock(mu_);
  draining_ = true;
  const auto idle = [&] { return idle_.load(std::memory_order_relaxed); };
  // idle_ is written under mu_ by the loop, which notifies cv_ whenever it changes state.
  cv_.wait_for(lock, absl::ToChronoNanoseconds(grace), idle);
  if (idle()) return;
  end_streams_ = true;
  cv_.notify_all();
  cv_.wait_for(lock, absl::ToChronoNanoseconds(boundary_wait), idle);
}

void Scheduler::ReleaseOrphanedChoices() {
  for (auto& seq : running_) {
    if (seq->fork_from == 0 || seq->done) continue;
    const bool leader_waits = std::any_of(running_.begin(), running_.end(), [&](const auto& o) {
      return o->id == seq->fork_from && !o->done;
    });
    if (leader_waits) continue;
    seq->fork_from = 0;
    seq->prefilled = engine_->ReusePrefix(seq->slot, seq->job.prompt);
  }
}

void Scheduler::ForkChoices(Sequence& leader, std::span<const float> row) {
  const int32_t n = static_cast<int32_t>(leader.job.prompt.size());
  for (auto& seq : running_) {
    if (seq->fork_from != leader.id || seq->done) continue;
    seq->fork_from = 0;
    if (absl::Status s = engine_->ForkSlot(leader.slot, seq->slot, n); !s.ok()) {
      Log(Level::kWarn, "fork_failed", {{"request_id", seq->job.request_id},
                                        {"error", std::string(s.message())}});
      seq->prefilled = engine_->ReusePrefix(seq->slot, seq->job.prompt);
      continue;
    }
    seq->prefilled = n;
    // The same logits row, this choice's own sampler (and grammar mask): what its own prefill
    // would have given.
    const int32_t token = SampleNext(*seq, row);
    if (token < 0) continue;  // failed (and retired)
    seq->history.push_back(token);
    Emit(*seq, token, row);
    if (seq->done) Retire(*seq);
  }
}

bool Scheduler::Step() {
  if (running_.empty()) return false;
  ReleaseOrphanedChoices();
  std::vector<BatchEntry> batch;
  std::vector<Sequence*> rows;  // the sequence of each logits row, in order
  const absl::Time now = absl::Now();
  for (auto& seq : running_) {
    if (seq->fork_from != 0) continue;  // waits for its first choice's prompt
    if (seq->prefilled == static_cast<int32_t>(seq->job.prompt.size())) {
      if (seq->stream->pending() >= static_cast<size_t>(options_.max_pending_messages)) {
        if (seq->stalled_since == absl::InfiniteFuture()) seq->stalled_since = now;
        continue;
      }
      seq->stalled_since = absl::InfiniteFuture();
      batch.push_back({seq->slot, static_cast<int32_t>(seq->history.size() - 1),
                       seq->history.back(), true});
      rows.push_back(seq.get());
    }
  }
  // Chunked prefill: the oldest sequence still in its prompt gets up to prefill_chunk
  // positions; the logits of its last prompt position are the first token's.
  for (auto& seq : running_) {
    const int32_t n = static_cast<int32_t>(seq->job.prompt.size());
    if (seq->prefilled == n || seq->fork_from != 0) continue;
    const int32_t end = std::min(n, seq->prefilled + options_.prefill_chunk);
    for (int32_t p = seq->prefilled; p < end; ++p) {
      batch.push_back({seq->slot, p, seq->job.prompt[p], p == n - 1});
    }
    if (end == n) rows.push_back(seq.get());
    seq->prefilled = end;
    break;
  }
  if (batch.empty()) return false;  // every sequence waits for its reader
  if (metrics_) metrics_->ObserveBatchSize(static_cast<int64_t>(batch.size()));
  std::vector<float> logits;
  absl::Status status = engine_->Run(batch, logits);
  NoteRestarts();
  if (!status.ok()) {
    // The engine gave up (restart budget spent, a corrupt ring) or refused the step: every
    // sequence of the step ends with the reason; none can continue without its KV state.
    Log(Level::kError, "step_failed", {{"error", std::string(status.message())}});
    NoteFailure(status);
    const absl::Status reported =
        absl::IsUnavailable(status)
            ? status
            : absl::Status(status.code(), absl::StrCat("the step failed: ", status.message()));
    for (auto& seq : running_) {
      Fail(*seq, reported);
      Retire(*seq);
    }
    running_.clear();
    UpdateGauges();
    return true;
  }
  NoteServing();
  progress_.fetch_add(1, std::memory_order_relaxed);
  const int64_t vocab = engine_->vocab_size();
  for (size_t r = 0; r < rows.size(); ++r) {
    Sequence& seq = *rows[r];
    std::span<const float> row(logits.data() + r * vocab, static_cast<size_t>(vocab));
    // A non-finite row ends this request alone, with INTERNAL: the others in the batch go on.
    if (absl::Status finite = CheckFiniteLogits(row, static_cast<int64_t>(seq.history.size()) - 1);
        !finite.ok()) {
      Fail(seq, finite);
      Retire(seq);
      continue;
    }
    const bool prompt_done = seq.history.size() == seq.job.prompt.size();
    const int32_t token = SampleNext(seq, row);
    if (token < 0) continue;  // failed (and retired)
    seq.history.push_back(token);
    Emit(seq, token, row);
    // Before the first choice retires (its slot, and its blocks, would go): the others fork.
    if (prompt_done && seq.job.share_group != 0) ForkChoices(seq, row);
    if (seq.done) Retire(seq);
  }
  std::erase_if(running_, [](const std::unique_ptr<Sequence>& s) { return s->done; });
  UpdateGauges();
  return true;
}

v1::TokenLogprob LogprobsOf(std::span<const float> row, int32_t token, int32_t n,
                            const Tokenizer& tokenizer) {
  // log p_i = x_i - max - log(sum exp(x_j - max)); NaN logits count as -inf (never likely).
  float mx = -std::numeric_limits<float>::infinity();
  for (float x : row) {
    if (x > mx) mx = x;
  }
  double sum = 0;
  for (float x : row) {
    if (!std::isnan(x)) sum += std::exp(static_cast<double>(x) - mx);
  }
  const double log_z = mx + std::log(sum);
  auto lp = [&](int32_t id) {
    const float x = row[id];
    return std::isnan(x) ? -std::numeric_limits<float>::infinity()
                         : static_cast<float>(x - log_z);
  };
  v1::TokenLogprob out;
  out.set_token_id(token);
  out.set_logprob(lp(token));
  if (n > 0) {
    std::vector<int32_t> ids(row.size());
    std::iota(ids.begin(), ids.end(), 0);
    const size_t k = std::min<size_t>(static_cast<size_t>(n), ids.size());
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
      const float la = lp(a), lb = lp(b);
      return la != lb ? la > lb : a < b;
    });
    for (size_t i = 0; i < k; ++i) {
      v1::TopLogprob* t = out.add_top();
      t->set_token_id(ids[i]);
      t->set_text(tokenizer.Decode(std::span<const int32_t>(&ids[i], 1)));
      t->set_logprob(lp(ids[i]));
    }
  }
  return out;
}

int32_t Scheduler::SampleNext(Sequence& seq, std::span<const float> row) {
  std::span<const uint8_t> allowed;  // empty: no grammar, sampling exactly as without one
  if (seq.matcher) {
    if (!vocab_trie_) vocab_trie_ = std::make_unique<grammar::VocabTrie>(tokenizer_);
    // The tokens that end the sequence (never streamed) may come only where the text is whole.
    std::vector<int32_t> ends = seq.job.stop_token_ids;
    if (!seq.job.ignore_eos) ends.push_back(tokenizer_.eos());
    if (seq.masks->Compute(seq.matcher->state(), *vocab_trie_, &seq.mask, ends) == 0) {
      Fail(seq, absl::FailedPreconditionError(absl::StrCat(
                    "no token of the vocabulary continues the grammar after ", seq.generated,
                    " generated tokens: the grammar needs text this model cannot write")));
      Retire(seq);
      return -1;
    }
    allowed = seq.mask;
  }
  return seq.sampler.Sample(row, seq.history, allowed);
}

void Scheduler::Emit(Sequence& seq, int32_t token, std::span<const float> row) {
  const absl::Time now = absl::Now();
  const Job& job = seq.job;
  const bool stop_token =
      (token == tokenizer_.eos() && !job.ignore_eos) ||
      std::find(job.stop_token_ids.begin(), job.stop_token_ids.end(), token) !=
          job.stop_token_ids.end();
  if (stop_token) {
    // As in local generation: the end token is not part of the completion.
    Finish(seq, v1::FINISH_REASON_EOS, "", token);
    return;
  }
  ++seq.generated;
  if (metrics_) {
    metrics_->AddGeneratedTokens(1);
    if (seq.generated == 1) {
      metrics_->ObserveTtftSeconds(Seconds(now - job.arrival));
    } else {
      metrics_->ObserveInterTokenSeconds(Seconds(now - seq.last_token));
    }
  }
  if (seq.generated == 1) seq.first_token = now;
  seq.last_token = now;
  TextStream::Delta delta = seq.text.Push(token);
  Stream::Event ev;
  v1::TokenChunk* chunk = ev.message.mutable_chunk();
  chunk->add_token_ids(token);
  chunk->set_text(std::move(delta.text));
  if (job.logprobs) *chunk->add_logprobs() = LogprobsOf(row, token, job.top_logprobs, tokenizer_);
  seq.stream->Push(std::move(ev));
  // The mask allowed the token, so the matcher takes its bytes.
  const bool grammar_done = seq.matcher &&
                            seq.matcher->Accept(tokenizer_.TokenBytes(-1, token)) &&
                            seq.matcher->IsComplete();
  if (delta.stopped) {
    Finish(seq, v1::FINISH_REASON_STOP_SEQUENCE, delta.matched, -1);
  } else if (grammar_done) {
    Finish(seq, v1::FINISH_REASON_GRAMMAR, "", -1);
  } else if (seq.generated >= job.max_new_tokens) {
    Finish(seq, v1::FINISH_REASON_LENGTH, "", -1);
  }
}

void Scheduler::Finish(Sequence& seq, v1::FinishReason reason, const std::string& matched_stop,
                       int32_t matched_token) {
  if (seq.done) return;
  seq.done = true;
  const absl::Time now = absl::Now();
  Stream::Event ev;
  ev.last = true;
  v1::Final* f = ev.message.mutable_final();
  std::string rest = seq.text.Finish();
  if (seq.text.stopped() && reason != v1::FINISH_REASON_STOP_SEQUENCE) {
    // The flush completed a stop string (it was held back as a possible prefix until now).
    reason = v1::FINISH_REASON_STOP_SEQUENCE;
  }
  f->set_text(std::move(rest));
  f->set_finish_reason(reason);
  f->set_matched_stop(reason == v1::FINISH_REASON_STOP_SEQUENCE ? seq.text.matched()
                                                                  : matched_stop);
  f->set_matched_stop_token(matched_token);
  f->set_seed(seq.job.sampling.seed);
  f->set_request_id(seq.job.request_id);
  f->mutable_usage()->set_prompt_tokens(static_cast<int32_t>(seq.job.prompt.size()));
  f->mutable_usage()->set_completion_tokens(seq.generated);
  v1::Timings* t = f->mutable_timings();
  const absl::Time started = seq.started == absl::InfinitePast() ? now : seq.started;
  t->set_queue_seconds(Seconds(started - seq.job.arrival));
  if (seq.generated > 0) t->set_time_to_first_token_seconds(Seconds(seq.first_token - seq.job.arrival));
  if (seq.generated > 1) {
    const double d = Seconds(seq.last_token - seq.first_token);
    t->set_decode_tokens_per_second(d > 0 ? (seq.generated - 1) / d : 0);
  }
  t->set_total_seconds(Seconds(now - seq.job.arrival));
  if (metrics_) {
    metrics_->AddPromptTokens(static_cast<int64_t>(seq.job.prompt.size()));
    metrics_->ObserveE2eSeconds(Seconds(now - seq.job.arrival));
    static constexpr const char* kOutcome[] = {"unspecified", "eos", "length", "stop_sequence",
                                               "cancelled", "grammar"};
    metrics_->CountRequest(kOutcome[reason]);
  }
  Log(Level::kInfo, "request_done",
      {{"request_id", seq.job.request_id},
       {"finish", v1::FinishReason_Name(reason)},
       {"prompt_tokens", static_cast<int>(seq.job.prompt.size())},
       {"completion_tokens", seq.generated},
       {"seconds", Seconds(now - seq.job.arrival)}});
  seq.stream->Push(std::move(ev));
}

void Scheduler::Fail(Sequence& seq, const absl::Status& status) {
  if (seq.done) return;
  seq.done = true;
  if (metrics_) {
    metrics_->CountRequest(absl::IsCancelled(status)          ? "cancelled"
                           : absl::IsDeadlineExceeded(status) ? "deadline_exceeded"
                                                              : "error");
  }
  Log(Level::kInfo, "request_failed",
      {{"request_id", seq.job.request_id},
       {"code", absl::StatusCodeToString(status.code())},
       {"error", std::string(status.message())},
       {"completion_tokens", seq.generated}});
  Stream::Event ev;
  ev.error = status;
  ev.last = true;
  seq.stream->Push(std::move(ev));
}

void Scheduler::Retire(Sequence& seq) {
  if (seq.slot < 0) return;
  // The sequence is over: its slot is never replayed and goes to the next request.
  engine_->ResetSlot(seq.slot);
  free_slots_.push_back(seq.slot);
  seq.slot = -1;
}

}  // namespace thermocline::gateway
