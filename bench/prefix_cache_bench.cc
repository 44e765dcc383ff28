// Time to first token of a prompt whose long prefix is in the prefix cache, against the same
// prompt cold, in one run on the same cache (shared/runtime/paged_runner.h: the block manager
// and paged KvCache the split engine drives, in this process).
//
// Each round: a cold prompt (a fresh random prefix, nothing cached) is prefilled in chunks as
// the gateway does (--chunk, 64 by default) up to the logits of its last position: that is its
// TTFT. Then a second prompt with the same prefix and another suffix: its whole cached blocks
// are mapped, only the rest is computed. Reports the median of both and cold / cached.
//
// Usage: prefix_cache_bench --model M.gguf [--prefix 500] [--suffix 20] [--rounds 5]
//                            [--threads 1] [--chunk 64]
// e.g. on `thermocline synth -o /tmp/m100.gguf --dim 768 --layers 12 --ffn 2048 --heads 12
// --kv-heads 4 --vocab 16000 --context 1024` (100M parameters).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "shared/model/model.h"
#include "shared/runtime/forward.h"
#include "shared/runtime/kv_cache.h"
#include "shared/runtime/paged_runner.h"
#include "shared/util/thread_pool.h"

using namespace thermocline;

namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds from submitting `prompt` to `slot` to having its last position's logits.
double Ttft(BatchRunner& r, int32_t slot, const std::vector<int32_t>& prompt, int chunk,
            int32_t* reused) {
  std::vector<float> logits;
  const auto t0 = std::chrono::steady_clock::now();
  *reused = r.ReusePrefix(slot, prompt);
  const int32_t n = static_cast<int32_t>(prompt.size());
  for (int32_t p = *reused; p < n; p += chunk) {
    std::vector<BatchEntry> b;
    for (int32_t q = p; q < std::min(n, p + chunk); ++q) b.push_back({slot, q, prompt[q], q == n - 1});
    if (absl::Status s = r.Run(b, logits); !s.ok()) {
      std::fprintf(stderr, "prefix_cache_bench: %s\n", std::string(s.message()).c_str());
      std::exit(1);
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string path;
  int prefix = 500, suffix = 20, rounds = 5, threads = 1, chunk = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    int* target = a == "--prefix" ? &prefix : a == "--suffix" ? &suffix : a == "--rounds" ? &rounds
                : a == "--threads" ? &threads : a == "--chunk" ? &chunk : nullptr;
    if (a == "--model") {
      path = argv[i + 1];
    } else if (target == nullptr || !absl::SimpleAtoi(argv[i + 1], target) || *target < 1) {
      std::fprintf(stderr, "prefix_cache_bench: bad option %s %s\n", a.c_str(), argv[i + 1]);
      return 2;
    }
  }
  if (path.empty()) {
    std::fprintf(stderr,
                 "usage: prefix_cache_bench --model M.gguf [--prefix 500] [--suffix 20] "
                 "[--rounds 5] [--threads 1] [--chunk 64]\n");
    return 2;
  }
  auto model = Model::Load(path);
  if (!model.ok()) {
    std::fprintf(stderr, "prefix_cache_bench: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  const ModelConfig& c = (*model)->config();
  const int64_t context = prefix + suffix + 1;
  if (context > c.context_length) {
    std::fprintf(stderr, "prefix_cache_bench: %lld positions exceed the model's context %lld\n",
                 static_cast<long long>(context), static_cast<long long>(c.context_length));
    return 2;
  }
  // Two slots and room for one cached prompt beyond them: what the gateway's default gives.
  const int32_t extra = static_cast<int32_t>(KvCache::BlocksFor(context));
  auto kv = KvCache::Create(c, 2, context, GgmlType::kF32, extra);
  if (!kv.ok()) {
    std::fprintf(stderr, "prefix_cache_bench: %s\n", std::string(kv.status().message()).c_str());
    return 1;
  }
  ThreadPool pool(threads);
  ForwardPass pass(**model, *kv, pool);
  PagedForwardRunner runner(pass, extra, true);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> id(3, static_cast<int32_t>(c.vocab_size) - 1);
  std::vector<double> cold, cached;
  int32_t reused_cold = 0, reused_cached = 0;
  for (int round = 0; round <= rounds; ++round) {  // round 0 warms up and is not counted
    std::vector<int32_t> a(prefix + suffix), b;
    for (int32_t& t : a) t = id(rng);
    b.assign(a.begin(), a.begin() + prefix);
    for (int i = 0; i < suffix; ++i) b.push_back(id(rng));
    const double tc = Ttft(runner, 0, a, chunk, &reused_cold);
    runner.ResetSlot(0);
    const double tw = Ttft(runner, 1, b, chunk, &reused_cached);
    runner.ResetSlot(1);
    if (round == 0) continue;
    cold.push_back(tc);
    cached.push_back(tw);
  }
  const double mc = Median(cold), mw = Median(cached);
  std::printf("model %s: %lld layers, dim %lld, %d threads; prompt %d + %d tokens, chunk %d\n",
              path.substr(path.find_last_of('/') + 1).c_str(), static_cast<long long>(c.n_layers),
              static_cast<long long>(c.dim), threads, prefix, suffix, chunk);
  std::printf("cold:   TTFT median %8.2f ms over %d rounds (reused %d positions)\n", mc * 1e3,
              rounds, reused_cold);
  std::printf("cached: TTFT median %8.2f ms over %d rounds (reused %d positions)\n", mw * 1e3,
              rounds, reused_cached);
  std::printf("ratio cold / cached: %.2fx\n", mc / mw);
  return 0;
}
