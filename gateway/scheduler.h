// The gateway's scheduler: one thread owns the engine (a ServingEngine: the split engine in
// production, gateway/split_serving_engine.h; a fake in tests/unit/scheduler_policy_test.cc) and
// runs continuous batching over its KV slots (docs/gateway.md#scheduling).
//
// Each step holds one decode entry per running sequence that has finished its prompt, plus up to
// `prefill_chunk` prompt positions of the oldest sequence still prefilling, so a long prompt
// never stalls the streams already decoding. Admission is FIFO: a waiting request takes a free
// slot as soon as one exists and fewer than `max_batch` sequences run. A request whose caller
// cancelled (or whose deadline passed) leaves at the next step boundary and its slot is released
// in the engine at once (ResetSlot), so the next queued request starts in the same step.
// A step the engine fails ends every running sequence with its status; queued requests are
// untouched and are admitted at the next boundary.
//
// Sampling, logprobs and text (stop strings, UTF-8) happen here per sequence; the gRPC handler
// only forwards the finished GenerateResponse messages (Stream) to its caller.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gateway/metrics.h"
#include "gateway/serving_engine.h"
#include "shared/grammar/gbnf.h"
#include "shared/grammar/matcher.h"
#include "shared/grammar/token_mask.h"
#include "shared/ipc/transport.h"
#include "shared/runtime/sampler.h"
#include "shared/tokenizer/tokenizer.h"
#include "thermocline/v1/generation.pb.h"

namespace thermocline::gateway {

// Choices (n) of one request at most, on gRPC as on HTTP (gateway/openai_json.cc's limit).
inline constexpr int32_t kMaxChoices = 16;

// A validated generation request (gateway/validate.h builds it from the proto).
struct Job {
  std::vector<int32_t> prompt;  // token ids; from text: BOS/EOS as the vocabulary says
  int32_t max_new_tokens = 0;
  SamplingParams sampling;      // seed already drawn when the caller gave none
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool logprobs = false;
  int32_t top_logprobs = 0;
  std::string request_id;
  absl::Time arrival;
  // Nonzero: this job is one of the n > 1 choices of one request (same prompt, own seed), all
  // with this value. The scheduler prefills the prompt once, for the first choice admitted, and
  // forks its KV blocks into the others (docs/gateway.md#prefix-cache).
  uint64_t share_group = 0;
  // Structured output (grammar or json_schema, compiled at validation); null: none.
  std::shared_ptr<const grammar::Grammar> grammar;
};

// The handler's end of one request: the messages to send, in order, and at the end either a
// Final message or an error status.
class Stream {
 public:
  struct Event {
    v1::GenerateResponse message;
    absl::Status error;   // not OK: end the call with this status (no message)
    bool last = false;    // after this event nothing more comes
  };
  // Waits up to `timeout` for events and moves them into *out (appends).
  void Wait(absl::Duration timeout, std::vector<Event>* out);
  // The caller is gone (deadline_passed: its deadline expired): the scheduler drops the
  // sequence at the next step boundary and frees its slot.
  void Cancel(bool deadline_passed = false);
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire) != kLive; }
  // Why, for the logs and metrics: CANCELLED or DEADLINE_EXCEEDED.
  absl::Status CancelReason(const char* where) const;

  // Called (once, on the scheduler's thread) when the scheduler gives the stream up while its
  // handler may be blocked writing to a reader that reads nothing: the handler sets it to
  // cancel its call (ServerContext::TryCancel), which unblocks the write. Set before the
  // first Wait.
  void SetAbandonHook(std::function<void()> hook);

  // Scheduler side.
  void Push(Event event);
  // Events pushed and not yet taken by Wait: what a reader that does not read lets pile up.
  size_t pending() const;
  // Runs the abandon hook (if any), once.
  void Abandon();

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> events_;
  std::function<void()> abandon_hook_;
  bool abandoned_ = false;
  enum State : int { kLive, kCancelled, kDeadline };
  std::atomic<int> cancelled_{kLive};
};

struct SchedulerOptions {
  int32_t max_batch = 4;      // sequences decoded together
  int32_t max_queue = 64;     // requests waiting for a slot; beyond: RESOURCE_EXHAUSTED
  int32_t kv_slots = 4;       // slots for sequences (the engine has one more: the probe slot)
  int32_t prefill_chunk = 64; // prompt positions per step
  // Backpressure: a sequence whose caller has this many messages not yet taken off its stream
  // (a reader that does not read: HTTP/2 window 0) is left out of the steps, so that it
  // generates nothing more and its buffer stays bounded; the other sequences go on.
  int32_t max_pending_messages = 16;
  // A sequence left out that long is ended (CANCELLED, its call cancelled, its slot freed).
  // Zero: never (the caller's own deadline still applies).
  absl::Duration stream_idle_timeout = absl::Seconds(60);
  // The engine shares KV blocks (the prefix cache is on): choices of one request fork the
  // first one's prompt instead of each prefilling it.
  bool fork_choices = false;
};

// Health as the scheduler sees it: called with false when a worker is down or recovering and
// with true once a step succeeded again.
using HealthCallback = std::function<void(bool serving, const std::string& why)>;
// Called (on the scheduler's thread) when the engine gave up on a worker: its restart budget is
// spent, so the instance will not come back by itself.
using GiveUpCallback = std::function<void(const absl::Status& why)>;

class Scheduler {
 public:
  // `engine` must have kv_slots + 1 slots (the last one is used to probe a dead worker while
  // idle, so that recovery does not wait for the next request). `metrics` may be null.
  Scheduler(std::unique_ptr<ServingEngine> engine, const Tokenizer& tokenizer,
            SchedulerOptions options, GatewayMetrics* metrics, HealthCallback health,
            GiveUpCallback give_up = {});
  // Stops the thread; sequences still running get FINISH_REASON_CANCELLED.
  ~Scheduler();

  // Queues a request. RESOURCE_EXHAUSTED when max_queue requests already wait; UNAVAILABLE
  // once Drain began.
  absl::StatusOr<std::shared_ptr<Stream>> Submit(Job job);
  // The n choices of one request, queued together (all or none), so that they are admitted
  // together and the first one's prompt is forked into the others.
  absl::StatusOr<std::vector<std::shared_ptr<Stream>>> SubmitAll(std::vector<Job> jobs);

  // Shutdown (SIGTERM): new requests are refused at once; running and queued ones get `grace`
  // to end by themselves; then, at the next step boundary, running streams end with a Final of
  // FINISH_REASON_CANCELLED (what the proto promises) and queued ones with UNAVAILABLE (they
  // never started: a client may retry elsewhere). Returns once every stream has its last
  // message, or after `grace` + `boundary_wait` when a step does not come back (a wedged step:
  // gRPC's shutdown deadline then cancels the calls).
  void Drain(absl::Duration grace, absl::Duration boundary_wait);

  // Steps completed so far (the watchdog pings while this moves).
  uint64_t progress() const { return progress_.load(std::memory_order_relaxed); }
  // True while nothing runs or waits (the watchdog also pings then).
  bool idle() const { return idle_.load(std::memory_order_relaxed); }
  // Worker pids as of the last step (0 before the first).
  pid_t worker_pid(ipc::Role role) const;

 private:
  struct Sequence;
  void Loop();
  void MonitorLoop();
  // Builds and runs one step over `running_`; returns false when there was nothing to run.
  bool Step();
  void Emit(Sequence& seq, int32_t token, std::span<const float> row);
  // seq's next token from `row`, under its grammar's mask when it has one (the grammar's
  // continuations; its end tokens only where the text is whole): every sampling of a sequence
  // goes through here. -1 when the grammar allows no token: the sequence is then failed and
  // retired.
  int32_t SampleNext(Sequence& seq, std::span<const float> row);
  void Finish(Sequence& seq, v1::FinishReason reason, const std::string& matched_stop,
              int32_t matched_token);
  void Fail(Sequence& seq, const absl::Status& status);
  void Retire(Sequence& seq);
  // Choices waiting for a fork whose first choice is gone (ended, failed) prefill themselves.
  void ReleaseOrphanedChoices();
  // The first choice's prompt is done (its logits row `row`): the others waiting on it fork
  // its KV blocks and sample their first token from the same row.
  void ForkChoices(Sequence& leader, std::span<const float> row);
  // Ends every running sequence with FINISH_REASON_CANCELLED and every queued one with
  // UNAVAILABLE (shutdown).
  void EndAll();
  void Probe();
  // After every engine Run: counts the engine's restarts into the metrics (and flags health
  // down if the monitor missed a quick one); NoteServing after a successful Run.
  void NoteRestarts();
  // After a failed engine Run: tells give_up_ when the restart budget is spent.
  void NoteFailure(const absl::Status& status);
  void NoteServing();
  void PublishPids();
  void UpdateGauges();

  std::unique_ptr<ServingEngine> engine_;
  const Tokenizer& tokenizer_;
  const SchedulerOptions options_;
  GatewayMetrics* metrics_;
  HealthCallback health_;
  GiveUpCallback give_up_;
  const int32_t probe_slot_;

  std::mutex mu_;  // guards waiting_, stop_, probe_requested_
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  bool stop_ = false;
  bool probe_requested_ = false;
  bool draining_ = false;      // Submit refuses
  bool end_streams_ = false;   // the loop ends every sequence at the next boundary

  // Scheduler thread only.
  std::vector<std::unique_ptr<Sequence>> running_;
  std::vector<int32_t> free_slots_;
  uint64_t next_sequence_id_ = 1;
  std::unique_ptr<grammar::VocabTrie> vocab_trie_;  // built for the first grammar request
  int64_t seen_gpu_restarts_ = 0, seen_cpu_restarts_ = 0;

  std::atomic<uint64_t> progress_{0};
  std::atomic<bool> idle_{true};
  std::atomic<pid_t> gpu_pid_{0}, cpu_pid_{0};
  std::atomic<bool> serving_{true};
  std::thread thread_;
  std::thread monitor_;
};

// Natural-log softmax of `row` at `token` and the `n` most likely tokens (most likely first,
// lowest id first on ties). Exposed for tests.
v1::TokenLogprob LogprobsOf(std::span<const float> row, int32_t token, int32_t n,
                            const Tokenizer& tokenizer);

}  // namespace thermocline::gateway
