// The gateway scheduler's policy (gateway/scheduler.h, docs/gateway.md#scheduling) in one
// process, against a fake engine: continuous batching, chunked prefill interleaved with decode,
// FIFO admission, the queue bound, cancellation at the step boundary with the slot reset before
// reuse, what a failed step ends, finish reasons, Drain, and the health signals. The e2e tests
// reach the same code only through real worker processes, where none of this is observable
// step by step.
#include "gateway/scheduler.h"
#include "gateway/service.h"

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <future>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/cord.h"
#include "gateway/serving_engine.h"
#include "gtest/gtest.h"
#include "shared/driver/supervisor.h"

namespace thermocline::gateway {
namespace {

// Safety net only: a scheduler that never answers fails the test instead of hanging it.
constexpr auto kSafety = std::chrono::seconds(60);

// <unk> <s> </s>, then the 256 byte tokens: token 3 + b spells byte b.
const Tokenizer& TestTokenizer() {
  static const Tokenizer* tok = [] {
    std::vector<std::string> p = {"<unk>", "<s>", "</s>"};
    std::vector<TokenType> t = {TokenType::kUnknown, TokenType::kControl, TokenType::kControl};
    for (int b = 0; b < 256; ++b) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
      p.push_back(buf);
      t.push_back(TokenType::kByte);
    }
    std::vector<float> scores(p.size(), 0.0f);
    auto made = Tokenizer::FromVocab(p, scores, t, /*bos=*/1, /*eos=*/2, /*unk=*/0);
    if (!made.ok()) std::abort();
    return new Tokenizer(*std::move(made));
  }();
  return *tok;
}
int32_t Byte(char c) { return 3 + static_cast<unsigned char>(c); }

// Deterministic engine: the logits of an entry peak at (token + 1) % vocab, so greedy sampling
// continues the byte sequence. Records every Run and ResetSlot in order, checks that each
// slot's positions are contiguous from its last reset (a slot reused without ResetSlot fails
// here), and can block Runs until the test releases them or fail one with a given status.
class FakeEngine final : public ServingEngine {
 public:
  struct Call {
    bool reset = false;              // ResetSlot(slot); otherwise Run(batch)
    int32_t slot = -1;
    std::vector<BatchEntry> batch;
  };

  FakeEngine(int64_t vocab, int32_t slots, WorkerHealth health)
      : vocab_(vocab), next_pos_(static_cast<size_t>(slots), 0), health_(health) {}

  absl::Status Run(std::span<const BatchEntry> batch, std::vector<float>& logits) override {
    std::unique_lock<std::mutex> lock(mu_);
    calls_.push_back({false, -1, std::vector<BatchEntry>(batch.begin(), batch.end())});
    const int64_t index = ++runs_;
    cv_.notify_all();
    if (!cv_.wait_for(lock, kSafety, [&] { return open_ || released_ >= index; })) {
      ADD_FAILURE() << "run " << index << " was never released";
    }
    if (batch.empty()) {
      ADD_FAILURE() << "empty batch";
      return absl::InvalidArgumentError("empty batch");
    }
    size_t want = 0;
    for (const BatchEntry& e : batch) {
      if (e.slot < 0 || e.slot >= static_cast<int32_t>(next_pos_.size())) {
        ADD_FAILURE() << "slot " << e.slot << " out of range";
        return absl::InvalidArgumentError("slot out of range");
      }
      if (e.position != next_pos_[e.slot]) {
        ADD_FAILURE() << "slot " << e.slot << " got position " << e.position << ", expected "
                      << next_pos_[e.slot];
        return absl::InvalidArgumentError("non-contiguous position");
      }
      ++next_pos_[e.slot];
      if (e.want_logits) ++want;
    }
    if (auto it = failures_.find(index); it != failures_.end()) return it->second;
    if (health_after_.count(index)) health_ = health_after_[index];
    logits.assign(want * static_cast<size_t>(vocab_), 0.0f);
    size_t row = 0;
    for (const BatchEntry& e : batch) {
      if (!e.want_logits) continue;
      logits[row * static_cast<size_t>(vocab_) + static_cast<size_t>((e.token + 1) % vocab_)] =
          e.token == poison_ ? std::numeric_limits<float>::quiet_NaN() : 1.0f;
      ++row;
    }
    return absl::OkStatus();
  }
  int64_t vocab_size() const override { return vocab_; }
  int64_t context() const override { return 1 << 20; }
  void ResetSlot(int32_t slot) override {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back({true, slot, {}});
    if (slot >= 0 && slot < static_cast<int32_t>(next_pos_.size())) next_pos_[slot] = 0;
  }
  WorkerHealth health() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return health_;
  }
  // With forks allowed, dst continues from src's first n positions (as a paged engine shares
  // them); else FailedPrecondition, as an engine without the prefix cache answers.
  absl::Status ForkSlot(int32_t src, int32_t dst, int32_t n) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!forks_) return absl::FailedPreconditionError("no forks");
    if (next_pos_[dst] != 0 || next_pos_[src] < n) {
      ADD_FAILURE() << "fork of " << n << " from slot " << src << " at " << next_pos_[src]
                    << " into slot " << dst << " at " << next_pos_[dst];
      return absl::InvalidArgumentError("bad fork");
    }
    next_pos_[dst] = n;
    ++forks_done_;
    return absl::OkStatus();
  }
  void AllowForks() { Set([&] { forks_ = true; }); }
  int forks_done() const {
    std::lock_guard<std::mutex> lock(mu_);
    return forks_done_;
  }

  // Test side.
  void Gate() { Set([&] { open_ = false; }); }
  void Open() { Set([&] { open_ = true; }); }
  void ReleaseRun(int64_t index) { Set([&] { released_ = std::max(released_, index); }); }
  void FailRun(int64_t index, absl::Status status) { Set([&] { failures_[index] = status; }); }
  // Rows after this token hold a NaN (a model whose weights or activations are not finite).
  void PoisonToken(int32_t token) { Set([&] { poison_ = token; }); }
  void SetHealthAfterRun(int64_t index, WorkerHealth h) { Set([&] { health_after_[index] = h; }); }
  void SetHealth(WorkerHealth h) { Set([&] { health_ = h; }); }
  // Waits until `n` Runs have been entered (the n-th one is blocked when gated).
  bool WaitForRuns(int64_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kSafety, [&] { return runs_ >= n; });
  }
  std::vector<Call> calls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  std::vector<std::vector<BatchEntry>> runs() const {
    std::vector<std::vector<BatchEntry>> out;
    for (const Call& c : calls()) {
      if (!c.reset) out.push_back(c.batch);
    }
    return out;
  }

 private:
  template <typename F>
  void Set(F f) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      f();
    }
    cv_.notify_all();
  }

  const int64_t vocab_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int32_t> next_pos_;
  std::vector<Call> calls_;
  int64_t runs_ = 0, released_ = 0;
  bool open_ = true;
  std::map<int64_t, absl::Status> failures_;
  int32_t poison_ = -1;
  std::map<int64_t, WorkerHealth> health_after_;
  WorkerHealth health_;
  bool forks_ = false;
  int forks_done_ = 0;
};

// Everything a stream delivered.
struct Outcome {
  std::vector<int32_t> tokens;
  std::string text;  // chunk texts + the Final's text
  std::optional<v1::Final> final;
  absl::Status error;
  bool ended = false;
};

void Absorb(Outcome& o, Stream::Event& e) {
  if (!e.error.ok()) {
    o.error = e.error;
  } else if (e.message.has_chunk()) {
    for (int32_t id : e.message.chunk().token_ids()) o.tokens.push_back(id);
    o.text += e.message.chunk().text();
  } else if (e.message.has_final()) {
    o.final = e.message.final();
    o.text += e.message.final().text();
  }
  if (e.last) o.ended = true;
}

Outcome Collect(Stream& s) {
  Outcome o;
  const auto give_up = std::chrono::steady_clock::now() + kSafety;
  while (!o.ended && std::chrono::steady_clock::now() < give_up) {
    std::vector<Stream::Event> events;
    s.Wait(absl::Milliseconds(100), &events);
    for (Stream::Event& e : events) Absorb(o, e);
  }
  EXPECT_TRUE(o.ended) << "the stream never ended";
  return o;
}

Job MakeJob(std::vector<int32_t> prompt, int32_t max_new_tokens) {
  Job j;
  j.prompt = std::move(prompt);
  j.max_new_tokens = max_new_tokens;
  j.sampling.temperature = 0;  // greedy: the fake's peak is the token
  j.arrival = absl::Now();
  return j;
}

std::vector<int32_t> Bytes(const std::string& s) {
  std::vector<int32_t> out;
  for (char c : s) out.push_back(Byte(c));
  return out;
}

// Index of the first Run holding (position, token), or -1.
int FirstRunWith(const std::vector<std::vector<BatchEntry>>& runs, int32_t position,
                 int32_t token) {
  for (size_t r = 0; r < runs.size(); ++r) {
    for (const BatchEntry& e : runs[r]) {
      if (e.position == position && e.token == token) return static_cast<int>(r);
    }
  }
  return -1;
}

// A scheduler over a FakeEngine with kv_slots + 1 slots; the fake is opened before the
// scheduler stops, so that no Run stays blocked.
struct Harness {
  explicit Harness(SchedulerOptions options, WorkerHealth health = {}, GiveUpCallback give_up = {})
      : options(options) {
    auto engine = std::make_unique<FakeEngine>(TestTokenizer().vocab_size(),
                                               options.kv_slots + 1, health);
    fake = engine.get();
    scheduler = std::make_unique<Scheduler>(
        std::move(engine), TestTokenizer(), options, nullptr,
        [this](bool serving, const std::string& why) {
          {
            std::lock_guard<std::mutex> lock(mu);
            health_calls.emplace_back(serving, why);
          }
          cv.notify_all();
        },
        std::move(give_up));
  }
  ~Harness() {
    fake->Open();
    scheduler.reset();
  }
  std::shared_ptr<Stream> Submit(Job job) {
    auto s = scheduler->Submit(std::move(job));
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : std::make_shared<Stream>();
  }
  bool WaitForHealthCalls(size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, kSafety, [&] { return health_calls.size() >= n; });
  }
  std::vector<std::pair<bool, std::string>> HealthCalls() {
    std::lock_guard<std::mutex> lock(mu);
    return health_calls;
  }

  SchedulerOptions options;
  FakeEngine* fake = nullptr;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<bool, std::string>> health_calls;
  std::unique_ptr<Scheduler> scheduler;
};

SchedulerOptions Options(int32_t max_batch, int32_t kv_slots, int32_t prefill_chunk = 64,
                         int32_t max_queue = 16) {
  SchedulerOptions o;
  o.max_batch = max_batch;
  o.kv_slots = kv_slots;
  o.prefill_chunk = prefill_chunk;
  o.max_queue = max_queue;
  return o;
}

TEST(SchedulerPolicy, ThirdRequestStartsInTheStepAfterOneEnds) {
  Harness h(Options(/*max_batch=*/2, /*kv_slots=*/3));
  h.fake->Gate();
  auto a = h.Submit(MakeJob(Bytes("a"), 2));  // a -> b c
  ASSERT_TRUE(h.fake->WaitForRuns(1));
  // Both wait while A's first step is held, so the rest of the schedule is fixed.
  auto b = h.Submit(MakeJob(Bytes("m"), 6));  // m -> n..s
  auto c = h.Submit(MakeJob(Bytes("x"), 6));  // x -> y..~
  h.fake->Open();
  const Outcome oa = Collect(*a), ob = Collect(*b), oc = Collect(*c);
  ASSERT_TRUE(oa.final && ob.final && oc.final);
  EXPECT_EQ(oa.text, "bc");
  EXPECT_EQ(ob.text, "nopqrs");
  EXPECT_EQ(oc.text, "yz{|}~");

  const auto runs = h.fake->runs();
  for (const auto& run : runs) {
    std::vector<int32_t> slots;
    for (const BatchEntry& e : run) slots.push_back(e.slot);
    std::sort(slots.begin(), slots.end());
    slots.erase(std::unique(slots.begin(), slots.end()), slots.end());
    EXPECT_LE(slots.size(), 2u) << "more sequences than max_batch in one step";
  }
  const int a_last = FirstRunWith(runs, 1, Byte('b'));  // A's last decode entry
  const int b_first = FirstRunWith(runs, 0, Byte('m'));
  const int c_first = FirstRunWith(runs, 0, Byte('x'));
  ASSERT_GE(a_last, 0);
  EXPECT_EQ(b_first, 1) << "B was queued at the first boundary with a batch place free";
  EXPECT_EQ(c_first, a_last + 1) << "C must start in the step right after A's last one";
}

TEST(SchedulerPolicy, ChunkedPrefillKeepsDecodeEntriesInEveryStep) {
  Harness h(Options(/*max_batch=*/4, /*kv_slots=*/4, /*prefill_chunk=*/4));
  h.fake->Gate();
  auto a = h.Submit(MakeJob(Bytes("a"), 20));
  ASSERT_TRUE(h.fake->WaitForRuns(1));
  auto b = h.Submit(MakeJob(Bytes("ABCDEFGHIJ"), 3));  // 10 positions: chunks 4, 4, 2
  auto c = h.Submit(MakeJob(Bytes("012345"), 2));      // 6 positions: chunks 4, 2
  h.fake->Open();
  const Outcome oa = Collect(*a), ob = Collect(*b), oc = Collect(*c);
  ASSERT_TRUE(oa.final && ob.final && oc.final);
  EXPECT_EQ(ob.text, "KLM");
  EXPECT_EQ(oc.text, "67");
  EXPECT_EQ(oa.tokens.size(), 20u);

  const auto runs = h.fake->runs();
  ASSERT_GE(runs.size(), 20u);
  const int32_t a_slot = runs[0][0].slot;
  // A is in every step of its life, one position each, never stalled by a prompt.
  for (int r = 0; r < 20; ++r) {
    int n = 0;
    for (const BatchEntry& e : runs[r]) {
      if (e.slot != a_slot) continue;
      ++n;
      EXPECT_EQ(e.position, r);
      EXPECT_TRUE(e.want_logits);
    }
    EXPECT_EQ(n, 1) << "run " << r;
  }
  // Prompt entries (B's prompt is A..J, C's 0..5; no generated token is one of those): at
  // most prefill_chunk per step, one sequence per step, the oldest first.
  const std::string prompt_bytes = "ABCDEFGHIJ012345";
  auto is_prompt = [&](const BatchEntry& e) {
    return std::any_of(prompt_bytes.begin(), prompt_bytes.end(),
                       [&](char ch) { return e.token == Byte(ch); });
  };
  std::vector<std::pair<int32_t, std::vector<int32_t>>> prefills;  // (slot, positions) per run
  for (size_t r = 0; r < runs.size(); ++r) {
    std::vector<int32_t> positions;
    int32_t slot = -1;
    for (const BatchEntry& e : runs[r]) {
      if (!is_prompt(e)) continue;
      if (slot == -1) slot = e.slot;
      EXPECT_EQ(e.slot, slot) << "two prompts in one step (run " << r << ")";
      positions.push_back(e.position);
    }
    if (!positions.empty()) prefills.emplace_back(slot, positions);
  }
  ASSERT_EQ(prefills.size(), 5u);
  using P = std::vector<int32_t>;
  EXPECT_EQ(prefills[0].second, (P{0, 1, 2, 3}));
  EXPECT_EQ(prefills[1].second, (P{4, 5, 6, 7}));
  EXPECT_EQ(prefills[2].second, (P{8, 9}));
  EXPECT_EQ(prefills[3].second, (P{0, 1, 2, 3}));
  EXPECT_EQ(prefills[4].second, (P{4, 5}));
  EXPECT_EQ(prefills[0].first, prefills[2].first);  // B's whole prompt before C's
  EXPECT_NE(prefills[2].first, prefills[3].first);
  EXPECT_EQ(FirstRunWith(runs, 0, Byte('A')), 1);
  EXPECT_EQ(FirstRunWith(runs, 0, Byte('0')), 4);
  // Only a prompt's last position wants logits.
  for (const auto& run : runs) {
    for (const BatchEntry& e : run) {
      if (e.token == Byte('I') || e.token == Byte('4')) {
        EXPECT_FALSE(e.want_logits);
      }
      if (e.token == Byte('J') || e.token == Byte('5')) {
        EXPECT_TRUE(e.want_logits);
      }
    }
  }
}

// Non-finite logits end their own request with INTERNAL (never a silent token 0); a request
// decoding in the same steps completes.
TEST(SchedulerPolicy, NonFiniteLogitsFailOnlyTheirRequest) {
  Harness h(Options(/*max_batch=*/2, /*kv_slots=*/2));
  h.fake->PoisonToken(Byte('q'));
  h.fake->Gate();
  auto good = h.Submit(MakeJob(Bytes("a"), 4));  // a -> b c d e
  ASSERT_TRUE(h.fake->WaitForRuns(1));
  auto bad = h.Submit(MakeJob(Bytes("pq"), 4));  // the row after 'q' is NaN
  h.fake->Open();
  const Outcome og = Collect(*good), ob = Collect(*bad);
  ASSERT_TRUE(og.final.has_value()) << og.error;
  EXPECT_EQ(og.text, "bcde");
  EXPECT_FALSE(ob.final.has_value());
  EXPECT_EQ(ob.error.code(), absl::StatusCode::kInternal) << ob.error;
  EXPECT_NE(ob.error.message().find("not finite"), std::string::npos) << ob.error;
  EXPECT_TRUE(ob.tokens.empty());
}

TEST(SchedulerPolicy, AdmissionIsFifo) {
  Harness h(Options(/*max_batch=*/1, /*kv_slots=*/1));
  h.fake->Gate();
  auto a = h.Submit(MakeJob(Bytes("a"), 2));
  ASSERT_TRUE(h.fake->WaitForRuns(1));
  auto b = h.Submit(MakeJob(Bytes("m"), 2));
  auto c = h.Submit(MakeJob(Bytes("x"), 2));
  auto d = h.Submit(MakeJob(Bytes("5"), 2));
  h.fake->Open();
  for (auto* s : {&a, &b, &c, &d}) {
    const Outcome o = Collect(**s);
    EXPECT_TRUE(o.final.has_value());
  }
  const auto runs = h.fake->runs();
  const int ra = FirstRunWith(runs, 0, Byte('a')), rb = FirstRunWith(runs, 0, Byte('m')),
            rc = FirstRunWith(runs, 0, Byte('x')), rd = FirstRunWith(runs, 0, Byte('5'));
  EXPECT_LT(ra, rb);
  EXPECT_LT(rb, rc);
  EXPECT_LT(rc, rd);
}

TEST(SchedulerPolicy, FullQueueIsResourceExhausted) {
  Harness h(Options(/*max_batch=*/1, /*kv_slots=*/1, 64, /*max_queue=*/1));
  h.fake->Gate();
  auto a = h.Submit(MakeJob(Bytes("a"), 2));
  ASSERT_TRUE(h.fake->WaitForRuns(1));  // A holds the slot: B waits in the queue
  auto b = h.Submit(MakeJob(Bytes("m"), 2));
  auto c = h.scheduler->Submit(MakeJob(Bytes("q"), 2));
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(c.status())) << c.status();
  EXPECT_NE(c.status().message().find("queue is full"), std::string::npos) << c.status();
  h.fake->Open();
  EXPECT_TRUE(Collect(*a).final.has_value());
  EXPECT_TRUE(Collect(*b).final.has_value());
  // Room again once the queue emptied.
  EXPECT_TRUE(Collect(*h.Submit(MakeJob(Bytes("x"), 2))).final.has_value());
  EXPECT_EQ(FirstRunWith(h.fake->runs(), 0, Byte('q')), -1);  // the refused one never ran
}

TEST(SchedulerPolicy, CancelledStreamFreesAndResetsItsSlotAtTheNextBoundary) {
  Harness h(Options(/*max_batch=*/1, /*kv_slots=*/1));
  h.fake->Gate();
  auto a = h.Submit(MakeJob(Bytes("a"), 1000));
  ASSERT_TRUE(h.fake->WaitForRuns(1));
  auto b = h.Submit(MakeJob(Bytes("m"), 2));
  h.fake->ReleaseRun(1);
  ASSERT_TRUE(h.fake->WaitForRuns(2));  // A's first decode step, held
  a->Cancel();
  h.fake->ReleaseRun(2);
  ASSERT_TRUE(h.fake->WaitForRuns(3));
  const auto calls = h.fake->calls();
  // Run(A prefill), Run(A decode), ResetSlot(0), Run(B prefill on the same slot).
  ASSERT_EQ(calls.size(), 4u);
  EXPECT_TRUE(calls[2].reset);
  EXPECT_EQ(calls[2].slot, calls[1].batch[0].slot);
  ASSERT_FALSE(calls[3].reset);
  ASSERT_EQ(calls[3].batch.size(), 1u);
  EXPECT_EQ(calls[3].batch[0].slot, calls[1].batch[0].slot);
  EXPECT_EQ(calls[3].batch[0].token, Byte('m'));
  EXPECT_EQ(calls[3].batch[0].position, 0);
  h.fake->Open();
  const Outcome oa = Collect(*a);
  EXPECT_TRUE(absl::IsCancelled(oa.error)) << oa.error;
  EXPECT_NE(oa.error.message().find("while running"), std::string::npos) << oa.error;
  EXPECT_EQ(oa.tokens, Bytes("bc"));  // the two steps that ran were streamed
  const Outcome ob = Collect(*b);
  ASSERT_TRUE(ob.final.has_value());
  EXPECT_EQ(ob.text, "no");
}

TEST(SchedulerPolicy, RequestWhoseDeadlinePassesInTheQueueNeverTakesASlot) {
  Harness h(Options(/*max_batch=*/1, /*kv_slots=*/1));
  h.fake->Gate();
  auto a = h.Submit(MakeJob(Bytes("a"), 2));
  ASSERT_TRUE(h.fake->WaitForRuns(1));
  auto b = h.Submit(MakeJob(Bytes("m"), 2));
  auto c = h.Submit(MakeJob(Bytes("x"), 2));
  b->Cancel(/*deadline_passed=*/true);
  h.fake->Open();
  const Outcome ob = Collect(*b);
  EXPECT_TRUE(absl::IsDeadlineExceeded(ob.error)) << ob.error;
  EXPECT_NE(ob.error.message().find("while queued"), std::string::npos) << ob.error;
  EXPECT_TRUE(ob.tokens.empty());
  EXPECT_TRUE(Collect(*a).final.has_value());
  EXPECT_TRUE(Collect(*c).final.has_value());
  EXPECT_EQ(FirstRunWith(h.fake->runs(), 0, Byte('m')), -1);
}

// docs/gateway.md#supervision: a failed step ends every running sequence with its status
// (UNAVAILABLE as the engine said it, other codes with "the step failed: "); queued requests
// are not part of it and run afterwards on reset slots; a spent restart budget calls give_up.
void FailedStep(absl::Status failure, const std::string& reported, bool gives_up) {
  int give_ups = 0;
  absl::Status given;
  Harness h(Options(/*max_batch=*/2, /*kv_slots=*/2), {}, [&](const absl::Status& s) {
    ++give_ups;
    given = s;
  });
  h.fake->Gate();
  auto a = h.Submit(MakeJob(Bytes("a"), 100));
  ASSERT_TRUE(h.fake->WaitForRuns(1));
  auto b = h.Submit(MakeJob(Bytes("m"), 100));
  auto c = h.Submit(MakeJob(Bytes("x"), 2));  // beyond max_batch: queued
  h.fake->FailRun(2, failure);
  h.fake->Open();
  const Outcome oa = Collect(*a), ob = Collect(*b), oc = Collect(*c);
  for (const Outcome* o : {&oa, &ob}) {
    EXPECT_EQ(o->error.code(), failure.code()) << o->error;
    EXPECT_EQ(o->error.message(), reported);
    EXPECT_FALSE(o->final.has_value());
  }
  ASSERT_TRUE(oc.final.has_value()) << oc.error;
  EXPECT_EQ(oc.text, "yz");
  const auto runs = h.fake->runs();
  ASSERT_GE(runs.size(), 3u);
  EXPECT_EQ(runs[1].size(), 2u);  // A's decode and B's prompt: the failed step
  EXPECT_EQ(FirstRunWith(runs, 0, Byte('x')), 2);
  EXPECT_EQ(give_ups, gives_up ? 1 : 0);
  if (gives_up) {
    EXPECT_TRUE(driver::IsGivenUp(given));
  }
}

TEST(SchedulerPolicy, FailedStepEndsTheRunningSequencesNotTheQueuedOnes) {
  FailedStep(absl::InternalError("boom"), "the step failed: boom", false);
}

TEST(SchedulerPolicy, SpentRestartBudgetFailsTheStepAsIsAndGivesUp) {
  absl::Status s = absl::UnavailableError("gpu_worker keeps dying");
  s.SetPayload(driver::kGivenUpPayload, absl::Cord("1"));
  FailedStep(s, "gpu_worker keeps dying", true);
}

TEST(SchedulerPolicy, FinishReasons) {
  Harness h(Options(/*max_batch=*/4, /*kv_slots=*/4));
  Job length = MakeJob(Bytes("a"), 3);
  Job stop = MakeJob(Bytes("a"), 10);
  stop.stop = {"de"};
  Job stop_token = MakeJob(Bytes("a"), 10);
  stop_token.stop_token_ids = {Byte('d')};
  Job eos = MakeJob({1}, 10);  // next token: 2, the EOS
  Job ignore = MakeJob({1}, 3);
  ignore.ignore_eos = true;

  const Outcome ol = Collect(*h.Submit(length));
  ASSERT_TRUE(ol.final.has_value());
  EXPECT_EQ(ol.final->finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(ol.tokens, Bytes("bcd"));
  EXPECT_EQ(ol.final->usage().completion_tokens(), 3);

  const Outcome os = Collect(*h.Submit(stop));
  ASSERT_TRUE(os.final.has_value());
  EXPECT_EQ(os.final->finish_reason(), v1::FINISH_REASON_STOP_SEQUENCE);
  EXPECT_EQ(os.final->matched_stop(), "de");
  EXPECT_EQ(os.tokens, Bytes("bcde"));  // the token completing the stop string is streamed
  EXPECT_EQ(os.text, "bc");             // its text is not

  const Outcome ot = Collect(*h.Submit(stop_token));
  ASSERT_TRUE(ot.final.has_value());
  EXPECT_EQ(ot.final->finish_reason(), v1::FINISH_REASON_EOS);
  EXPECT_EQ(ot.final->matched_stop_token(), Byte('d'));
  EXPECT_EQ(ot.tokens, Bytes("bc"));  // the end token is neither streamed nor counted
  EXPECT_EQ(ot.final->usage().completion_tokens(), 2);

  const Outcome oe = Collect(*h.Submit(eos));
  ASSERT_TRUE(oe.final.has_value());
  EXPECT_EQ(oe.final->finish_reason(), v1::FINISH_REASON_EOS);
  EXPECT_EQ(oe.final->matched_stop_token(), 2);
  EXPECT_TRUE(oe.tokens.empty());

  const Outcome oi = Collect(*h.Submit(ignore));
  ASSERT_TRUE(oi.final.has_value());
  EXPECT_EQ(oi.final->finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(oi.tokens, (std::vector<int32_t>{2, 3, 4}));
}

TEST(SchedulerPolicy, DrainLetsRequestsFinishWithinTheGraceThenRefuses) {
  Harness h(Options(/*max_batch=*/1, /*kv_slots=*/1));
  auto a = h.Submit(MakeJob(Bytes("a"), 5));
  auto b = h.Submit(MakeJob(Bytes("m"), 5));
  h.scheduler->Drain(absl::Seconds(60), absl::Seconds(5));
  for (auto* s : {&a, &b}) {
    const Outcome o = Collect(**s);
    ASSERT_TRUE(o.final.has_value()) << o.error;
    EXPECT_EQ(o.final->finish_reason(), v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(o.tokens.size(), 5u);
  }
  auto late = h.scheduler->Submit(MakeJob(Bytes("x"), 2));
  EXPECT_TRUE(absl::IsUnavailable(late.status())) << late.status();
}

TEST(SchedulerPolicy, DrainPastTheGraceCancelsRunningAndFailsQueued) {
  Harness h(Options(/*max_batch=*/1, /*kv_slots=*/1));
  // Runs until ended: no length limit, and the tokens' cycle through the EOS id is ignored.
  Job endless = MakeJob(Bytes("a"), std::numeric_limits<int32_t>::max());
  endless.ignore_eos = true;
  auto a = h.Submit(endless);
  ASSERT_TRUE(h.fake->WaitForRuns(1));
  auto b = h.Submit(MakeJob(Bytes("m"), 2));
  h.scheduler->Drain(absl::ZeroDuration(), absl::Seconds(60));
  const Outcome oa = Collect(*a), ob = Collect(*b);
  ASSERT_TRUE(oa.final.has_value()) << oa.error;
  EXPECT_EQ(oa.final->finish_reason(), v1::FINISH_REASON_CANCELLED);
  EXPECT_EQ(oa.final->usage().completion_tokens(), static_cast<int32_t>(oa.tokens.size()));
  EXPECT_TRUE(absl::IsUnavailable(ob.error)) << ob.error;
  EXPECT_NE(ob.error.message().find("shutting down"), std::string::npos) << ob.error;
  EXPECT_EQ(FirstRunWith(h.fake->runs(), 0, Byte('m')), -1);
  EXPECT_TRUE(absl::IsUnavailable(h.scheduler->Submit(MakeJob(Bytes("x"), 2)).status()));
}

TEST(SchedulerPolicy, DrainReturnsWhenAStepDoesNotComeBack) {
  Harness h(Options(/*max_batch=*/1, /*kv_slots=*/1));
  h.fake->Gate();
  auto a = h.Submit(MakeJob(Bytes("a"), 100));
  ASSERT_TRUE(h.fake->WaitForRuns(1));  // held: the step is wedged
  auto drained = std::async(std::launch::async, [&] {
    h.scheduler->Drain(absl::ZeroDuration(), absl::Milliseconds(50));
  });
  ASSERT_EQ(drained.wait_for(kSafety), std::future_status::ready);
  std::vector<Stream::Event> events;
  a->Wait(absl::ZeroDuration(), &events);
  EXPECT_TRUE(events.empty());  // the step never came back: nothing was sent
  h.fake->Open();  // it comes back: the next boundary ends the stream
  const Outcome oa = Collect(*a);
  ASSERT_TRUE(oa.final.has_value()) << oa.error;
  EXPECT_EQ(oa.final->finish_reason(), v1::FINISH_REASON_CANCELLED);
  EXPECT_EQ(oa.tokens, Bytes("b"));
}

TEST(SchedulerPolicy, RestartDuringAStepFlipsHealthDownThenUp) {
  Harness h(Options(/*max_batch=*/1, /*kv_slots=*/1));
  WorkerHealth restarted;
  restarted.cpu_restarts = 1;
  h.fake->SetHealthAfterRun(2, restarted);
  EXPECT_TRUE(Collect(*h.Submit(MakeJob(Bytes("a"), 4))).final.has_value());
  ASSERT_TRUE(h.WaitForHealthCalls(2));
  const auto calls = h.HealthCalls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_FALSE(calls[0].first);
  EXPECT_NE(calls[0].second.find("restarted"), std::string::npos) << calls[0].second;
  EXPECT_TRUE(calls[1].first);
}

TEST(SchedulerPolicy, DeadWorkerWhileIdleIsProbedOnTheProbeSlot) {
  // A child that exits and is not reaped yet: a zombie, which the monitor counts as dead.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  WorkerHealth dead;
  dead.gpu_pid = child;
  {
    Harness h(Options(/*max_batch=*/1, /*kv_slots=*/2), dead);
    h.fake->Gate();
    ASSERT_TRUE(h.fake->WaitForRuns(1));  // the probe, held
    WorkerHealth alive;
    alive.gpu_pid = getpid();
    h.fake->SetHealth(alive);  // the "restarted" worker
    h.fake->Open();
    ASSERT_TRUE(h.WaitForHealthCalls(2));
    const auto health = h.HealthCalls();
    EXPECT_FALSE(health[0].first);
    EXPECT_NE(health[0].second.find("gpu_worker (pid " + std::to_string(child) + ") is down"),
              std::string::npos)
        << health[0].second;
    EXPECT_TRUE(health[1].first);
    const auto calls = h.fake->calls();
    ASSERT_GE(calls.size(), 2u);
    ASSERT_EQ(calls[0].batch.size(), 1u);
    const BatchEntry& probe = calls[0].batch[0];
    EXPECT_EQ(probe.slot, 2);  // kv_slots: the probe slot
    EXPECT_EQ(probe.position, 0);
    EXPECT_EQ(probe.token, TestTokenizer().bos());
    EXPECT_FALSE(probe.want_logits);
    EXPECT_TRUE(calls[1].reset);
    EXPECT_EQ(calls[1].slot, 2);
  }
  int status = 0;
  waitpid(child, &status, 0);
}

}  // namespace
}  // namespace thermocline::gateway

namespace thermocline::gateway {
namespace {

// Backpressure: a stream nobody reads stops being decoded once max_pending_messages wait on it
// (its buffer stays bounded: before, it was generated to the end and buffered), while a stream
// that is read runs to its end; after stream_idle_timeout the unread one ends CANCELLED, its
// abandon hook runs (the handler cancels its call there) and its slot is free again.
TEST(SchedulerBackpressure, AReaderThatDoesNotReadPausesOnlyItsSequenceThenIsCancelled) {
  SchedulerOptions o;
  o.max_batch = 2;
  o.kv_slots = 2;
  o.max_pending_messages = 4;
  o.stream_idle_timeout = absl::Milliseconds(500);
  Harness h(o);
  std::atomic<bool> abandoned{false};
  std::shared_ptr<Stream> unread = h.Submit(MakeJob(Bytes("a"), 200));
  unread->SetAbandonHook([&] { abandoned.store(true); });
  const Outcome read = Collect(*h.Submit(MakeJob(Bytes("b"), 100)));
  EXPECT_EQ(read.tokens.size(), 100u) << "the reading stream was held up";
  // Nothing read yet: the events waiting are bounded by max_pending_messages.
  EXPECT_LE(unread->pending(), static_cast<size_t>(o.max_pending_messages) + 1);
  // Still not reading: the scheduler gives it up once it has been paused for the timeout.
  const auto give_up = std::chrono::steady_clock::now() + kSafety;
  while (!abandoned.load() && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(abandoned.load()) << "the handler was never told to cancel its call";
  const Outcome gone = Collect(*unread);
  EXPECT_EQ(gone.error.code(), absl::StatusCode::kCancelled) << gone.error;
  EXPECT_NE(std::string(gone.error.message()).find("--stream-idle-timeout"), std::string::npos)
      << gone.error;
  EXPECT_LE(gone.tokens.size(), static_cast<size_t>(o.max_pending_messages));
  EXPECT_FALSE(gone.final.has_value());
  // Its slot went back: two more requests run (they would wait forever on a leaked slot).
  EXPECT_EQ(Collect(*h.Submit(MakeJob(Bytes("c"), 3))).tokens.size(), 3u);
  EXPECT_EQ(Collect(*h.Submit(MakeJob(Bytes("d"), 3))).tokens.size(), 3u);
}

// n > 1 choices of one prompt (Job::share_group, queued together): with forks the prompt is
// run once, the other choices fork it and take their first token from the same row; without,
// each choice runs the prompt itself. Either way every choice streams the same greedy text.
void RunChoices(bool forks) {
  SchedulerOptions o = Options(/*max_batch=*/4, /*kv_slots=*/4, /*prefill_chunk=*/4);
  o.fork_choices = true;
  Harness h(o);
  if (forks) h.fake->AllowForks();
  std::vector<Job> jobs;
  for (int i = 0; i < 3; ++i) {
    Job j = MakeJob(Bytes("abcdefghij"), 5);  // 10 prompt positions, 3 chunks
    j.share_group = 7;
    jobs.push_back(j);
  }
  auto streams = h.scheduler->SubmitAll(jobs);
  ASSERT_TRUE(streams.ok()) << streams.status();
  for (auto& s : *streams) {
    const Outcome out = Collect(*s);
    ASSERT_TRUE(out.final.has_value()) << out.error;
    EXPECT_EQ(out.text, "klmno");
  }
  int prompt_entries = 0;
  for (const auto& run : h.fake->runs()) {
    for (const BatchEntry& e : run) prompt_entries += e.position < 10 ? 1 : 0;
  }
  EXPECT_EQ(prompt_entries, forks ? 10 : 30);
  EXPECT_EQ(h.fake->forks_done(), forks ? 2 : 0);
}

TEST(SchedulerPolicy, ChoicesForkTheFirstChoicesPrompt) { RunChoices(true); }
TEST(SchedulerPolicy, ChoicesPrefillThemselvesWhenTheEngineCannotFork) { RunChoices(false); }

// Structured output: the mask decides where the fake's peak is not allowed (greedy then takes
// the lowest allowed id among the equal rest), the sequence ends with FINISH_REASON_GRAMMAR once
// nothing can follow, EOS is allowed only where the text is whole, and a request without a
// grammar in the same batch decodes as before.
TEST(SchedulerPolicy, GrammarMasksTheSamplingAndEndsTheSequence) {
  Harness h(Options(/*max_batch=*/4, /*kv_slots=*/4));
  auto grammar_of = [](const char* text) {
    absl::StatusOr<grammar::Grammar> g = grammar::ParseGbnf(text);
    EXPECT_TRUE(g.ok()) << g.status();
    return std::make_shared<const grammar::Grammar>(*std::move(g));
  };
  Job done = MakeJob(Bytes("a"), 10);
  done.grammar = grammar_of("root ::= \"b\" [0-9] \"x\"\n");  // b, then 0 (not c), then x
  Job open = MakeJob(Bytes("a"), 10);
  open.grammar = grammar_of("root ::= \"b\" \"c\"*\n");  // after bc: EOS (id 2) < c
  Job forever = MakeJob(Bytes("a"), 5);
  forever.grammar = open.grammar;
  forever.ignore_eos = true;  // no end token: c until max_new_tokens
  auto a = h.Submit(std::move(done));
  auto b = h.Submit(std::move(open));
  auto c = h.Submit(std::move(forever));
  auto plain = h.Submit(MakeJob(Bytes("a"), 4));
  const Outcome oa = Collect(*a), ob = Collect(*b), oc = Collect(*c), op = Collect(*plain);
  ASSERT_TRUE(oa.final && ob.final && oc.final && op.final);
  EXPECT_EQ(oa.text, "b0x");
  EXPECT_EQ(oa.final->finish_reason(), v1::FINISH_REASON_GRAMMAR);
  EXPECT_EQ(ob.text, "bc");
  EXPECT_EQ(ob.final->finish_reason(), v1::FINISH_REASON_EOS);
  EXPECT_EQ(oc.text, "bcccc");
  EXPECT_EQ(oc.final->finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(op.text, "bcde");
  EXPECT_EQ(op.final->finish_reason(), v1::FINISH_REASON_LENGTH);
}

// n > 1 choices with a grammar: the forked choices take their first token from the leader's
// row through their own mask too (the fake's peak there is "k", which the grammar forbids).
TEST(SchedulerPolicy, ForkedChoicesSampleTheirFirstTokenThroughTheGrammar) {
  SchedulerOptions o = Options(/*max_batch=*/4, /*kv_slots=*/4, /*prefill_chunk=*/4);
  o.fork_choices = true;
  Harness h(o);
  h.fake->AllowForks();
  absl::StatusOr<grammar::Grammar> g = grammar::ParseGbnf("root ::= \"x\" \"y\" \"z\"\n");
  ASSERT_TRUE(g.ok()) << g.status();
  auto shared = std::make_shared<const grammar::Grammar>(*std::move(g));
  std::vector<Job> jobs;
  for (int i = 0; i < 3; ++i) {
    Job j = MakeJob(Bytes("abcdefghij"), 8);
    j.share_group = 9;
    j.grammar = shared;
    jobs.push_back(j);
  }
  auto streams = h.scheduler->SubmitAll(jobs);
  ASSERT_TRUE(streams.ok()) << streams.status();
  for (auto& s : *streams) {
    const Outcome out = Collect(*s);
    ASSERT_TRUE(out.final.has_value()) << out.error;
    EXPECT_EQ(out.text, "xyz");
    EXPECT_EQ(out.final->finish_reason(), v1::FINISH_REASON_GRAMMAR);
  }
  EXPECT_EQ(h.fake->forks_done(), 2);
}

// How a cancelled call is classified: a deadline up to kDeadlineClockSlack ahead of the clock
// reading (gRPC fires it on its own clock) has passed; one further ahead has not, so a caller
// that cancels well before its deadline is still counted as cancelled.
TEST(DeadlineHasPassed, CountsADeadlineWithinTheClockSlackAsPassed) {
  const auto now = std::chrono::system_clock::now();
  EXPECT_TRUE(DeadlineHasPassed(now - std::chrono::seconds(1), now));
  EXPECT_TRUE(DeadlineHasPassed(now, now));
  EXPECT_TRUE(DeadlineHasPassed(now + std::chrono::microseconds(200), now));
  EXPECT_TRUE(DeadlineHasPassed(now + kDeadlineClockSlack, now));
  EXPECT_FALSE(DeadlineHasPassed(now + kDeadlineClockSlack + std::chrono::milliseconds(1), now));
  EXPECT_FALSE(DeadlineHasPassed(now + std::chrono::seconds(5), now));
  EXPECT_FALSE(DeadlineHasPassed(std::chrono::system_clock::time_point::max(), now));
}

}  // namespace

}  // namespace thermocline::gateway
