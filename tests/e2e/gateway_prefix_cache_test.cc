// The prefix cache through the real gateway and its workers (docs/gateway.md#prefix-cache):
// a second request sharing a 200-token prefix computes only what follows the prefix's whole
// blocks (the hit/miss metrics) and streams exactly what a cold run streams; under a KV budget
// too small to keep every prefix, blocks are evicted and outputs stay exact; and a gpu worker
// killed while several streams hold the same cached blocks is replaced, every stream completing
// as undisturbed.
#include <signal.h>

#include <atomic>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tests/e2e/gateway_harness.h"

namespace thermocline::testing {
namespace {

// A token-id prompt: `prefix` tokens of one pattern, then `suffix` of another (stories260K has
// 512 ids; 3.. avoids its special ones).
std::vector<int32_t> Prompt(int prefix, int suffix, int variant) {
  std::vector<int32_t> ids;
  for (int i = 0; i < prefix; ++i) ids.push_back(3 + (i * 37) % 500);
  for (int i = 0; i < suffix; ++i) ids.push_back(3 + (i * 11 + variant * 101) % 500);
  return ids;
}

v1::GenerateRequest Ids(const std::vector<int32_t>& ids, int n) {
  v1::GenerateRequest r;
  for (int32_t id : ids) r.mutable_token_ids()->add_ids(id);
  r.set_max_new_tokens(n);
  r.set_temperature(0);
  r.set_ignore_eos(true);
  return r;
}

double Hits(const Gateway& gw) { return gw.Metric("thermocline_prefix_cache_hit_tokens_total"); }
double Misses(const Gateway& gw) { return gw.Metric("thermocline_prefix_cache_miss_tokens_total"); }

TEST(GatewayPrefixCache, SecondRequestPrefillsOnlyItsSuffixAndMatchesAColdRun) {
  const std::vector<int32_t> a = Prompt(200, 12, 1), b = Prompt(200, 9, 2);
  // Cold: a gateway without the cache.
  Completion cold;
  {
    Gateway off(absl::StrCat("e2e-prefix-off-", getpid()), {"--prefix-cache-blocks", "0"});
    cold = off.Generate(Ids(b, 24));
    ASSERT_TRUE(cold.status.ok()) << cold.status.error_message();
    EXPECT_EQ(Hits(off), 0);
  }
  Gateway gw(absl::StrCat("e2e-prefix-", getpid()));
  const Completion first = gw.Generate(Ids(a, 24));
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(Hits(gw), 0);
  EXPECT_EQ(Misses(gw), static_cast<double>(a.size()));
  const Completion second = gw.Generate(Ids(b, 24));
  ASSERT_TRUE(second.status.ok()) << second.status.error_message();
  // The 200 shared tokens are 12 whole blocks of 16 (192) and 8 more: those 192 come from the
  // cache, the rest of b is computed.
  EXPECT_EQ(Hits(gw), 192);
  EXPECT_EQ(Misses(gw), static_cast<double>(a.size() + b.size() - 192));
  // Under vLLM's name too (with its model_name label).
  const std::string scrape = ScrapeMetrics(gw.metrics_address());
  const size_t alias = scrape.find("\nvllm:prefix_cache_hits_total{");
  ASSERT_NE(alias, std::string::npos) << scrape;
  const size_t eol = scrape.find('\n', alias + 1);
  EXPECT_EQ(scrape.substr(scrape.rfind(' ', eol) + 1, eol - scrape.rfind(' ', eol) - 1), "192");
  EXPECT_EQ(second.ids, cold.ids);
  EXPECT_EQ(second.text, cold.text);
  EXPECT_EQ(second.final.usage().prompt_tokens(), static_cast<int>(b.size()));
  EXPECT_GE(gw.Metric("thermocline_prefix_cache_blocks"), 12);
}

TEST(GatewayPrefixCache, EvictsUnderASmallBudgetAndStaysExact) {
  // One slot (+ the probe slot) of 256 positions and 2 extra blocks: 34 blocks, so the 12-block
  // prefixes of several prompts cannot all stay.
  Gateway gw(absl::StrCat("e2e-prefix-evict-", getpid()),
             {"--kv-slots", "1", "--max-batch", "1", "--prefix-cache-blocks", "2"});
  std::vector<std::vector<int32_t>> prompts;
  for (int v = 0; v < 4; ++v) {
    std::vector<int32_t> p = Prompt(0, 200, 10 + v);
    p.push_back(7);
    prompts.push_back(p);
  }
  std::vector<Completion> firsts;
  for (const auto& p : prompts) {
    firsts.push_back(gw.Generate(Ids(p, 16)));
    ASSERT_TRUE(firsts.back().status.ok()) << firsts.back().status.error_message();
  }
  EXPECT_GT(gw.Metric("thermocline_prefix_cache_evictions_total"), 0)
      << ScrapeMetrics(gw.metrics_address());
  // Again, newest first: the last prompt's blocks are still cached, the first's were evicted;
  // both give exactly what they gave cold.
  for (int v = 3; v >= 0; --v) {
    const double hits = Hits(gw);
    const Completion again = gw.Generate(Ids(prompts[v], 16));
    ASSERT_TRUE(again.status.ok()) << again.status.error_message();
    EXPECT_EQ(again.ids, firsts[v].ids) << "prompt " << v;
    if (v == 3) {
      EXPECT_EQ(Hits(gw) - hits, 192);
    }
  }
}

TEST(GatewayPrefixCache, GpuWorkerKilledWhileStreamsShareBlocks) {
  Gateway gw(absl::StrCat("e2e-prefix-kill-", getpid()), {"--max-batch", "4"});
  std::vector<v1::GenerateRequest> reqs;
  for (int v = 0; v < 3; ++v) reqs.push_back(Ids(Prompt(100, 5 + v, v), 120));
  // Undisturbed, one at a time: the second and third already reuse the first's 96 positions.
  std::vector<Completion> undisturbed;
  for (const auto& r : reqs) undisturbed.push_back(gw.Generate(r));
  EXPECT_EQ(Hits(gw), 2 * 96);

  bool killed = false;
  const std::vector<Completion> got = GenerateKillingWorker(gw, reqs, "gpu_pid", &killed);
  ASSERT_TRUE(killed);
  for (size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE(i);
    ASSERT_TRUE(got[i].status.ok()) << got[i].status.error_message();
    EXPECT_EQ(got[i].ids, undisturbed[i].ids);
    EXPECT_EQ(got[i].chunks, static_cast<int>(got[i].ids.size()));
  }
  // All three streams held the first prompt's cached blocks when the worker died.
  EXPECT_EQ(Hits(gw), 5 * 96);
  // The driver's restart line: the new gpu worker was given the slots' tokens back.
  int replayed = 0;
  EXPECT_TRUE(absl::SimpleAtoi(gw.LogValue("worker_restarted", "replay_tokens"), &replayed))
      << gw.Log();
  EXPECT_GT(replayed, 0) << gw.Log();
  const Completion after = gw.Generate(reqs[1]);
  EXPECT_EQ(after.ids, undisturbed[1].ids);
}

// One call with n choices: each choice's token ids, by GenerateResponse.index.
std::vector<std::vector<int32_t>> Choices(Gateway& gw, const v1::GenerateRequest& req,
                                          grpc::Status* status, int* finals) {
  grpc::ClientContext ctx;
  auto reader = gw.stub().Generate(&ctx, req);
  std::vector<std::vector<int32_t>> ids(std::max(1, req.n()));
  v1::GenerateResponse resp;
  *finals = 0;
  while (reader->Read(&resp)) {
    if (resp.index() < 0 || resp.index() >= static_cast<int>(ids.size())) {
      ADD_FAILURE() << "index " << resp.index();
      continue;
    }
    for (int32_t id : resp.chunk().token_ids()) ids[resp.index()].push_back(id);
    if (resp.has_final()) ++*finals;
  }
  *status = reader->Finish();
  return ids;
}

TEST(GatewayPrefixCache, ThreeChoicesPrefillThePromptOnceAndMatchIndependentSeededRuns) {
  const std::vector<int32_t> prompt = Prompt(50, 0, 0);
  v1::GenerateRequest req = Ids(prompt, 20);
  req.set_temperature(0.9f);
  req.set_seed(42);
  // Independent runs, one request per seed, on a gateway without the cache.
  std::vector<std::vector<int32_t>> independent;
  {
    Gateway off(absl::StrCat("e2e-choices-off-", getpid()), {"--prefix-cache-blocks", "0"});
    for (int i = 0; i < 3; ++i) {
      v1::GenerateRequest one = req;
      one.set_seed(42 + i);
      const Completion c = off.Generate(one);
      ASSERT_TRUE(c.status.ok()) << c.status.error_message();
      independent.push_back(c.ids);
    }
    // Without the cache, n = 3 is three prefills, and the same outputs.
    req.set_n(3);
    grpc::Status st;
    int finals = 0;
    EXPECT_EQ(Choices(off, req, &st, &finals), independent);
    EXPECT_TRUE(st.ok()) << st.error_message();
  }
  EXPECT_NE(independent[0], independent[1]);  // the seeds do differ
  Gateway gw(absl::StrCat("e2e-choices-", getpid()));
  grpc::Status st;
  int finals = 0;
  const auto got = Choices(gw, req, &st, &finals);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(finals, 3);
  EXPECT_EQ(got, independent);
  // The prompt was computed once: the other two choices forked all 50 of its positions.
  EXPECT_EQ(Misses(gw), 50);
  EXPECT_EQ(Hits(gw), 100);
  // n out of range is refused, naming it.
  req.set_n(17);
  Choices(gw, req, &st, &finals);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("n (choices)"), std::string::npos) << st.error_message();
}

}  // namespace
}  // namespace thermocline::testing
