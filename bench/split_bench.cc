// Decode throughput of the split (thermocline-gpu-worker + thermocline-cpu-worker, driven by the
// SplitEngine through shared-memory rings) against the single-process engine, in one run, with
// the same thread total on both sides (split: the gpu worker gets ceil(T/2) threads, the cpu
// worker floor(T/2), at least 1 each). Rounds alternate local and split so that both see the
// same machine state; each round decodes --tokens tokens after an 8-token prompt, and each
// step is timed alone. Prints the median and best ms/token of each side, their ratio
// (split / local: the figure of merit), the split overhead, the memory-bandwidth floor of a
// token (decode_bench's: weight bytes / read bandwidth), and the ring hops a split step costs:
// 1 + n_layers round trips (Step/Logits, then an Activation/Partial per layer). The cost of one
// hop is bench/ring_bench's 8 KiB round trip (p50/p99 between two processes); it is not
// measured again here.
//
// TEAL (--teal-sparsity T [--teal-profile P]) runs on both sides: on attention with an FFN
// mode, on every projection with --sparsity teal (the split then needs the profile).
//
// Usage: split_bench --model M.gguf [--threads 2] [--tokens 16] [--rounds 3]
//                    [--hot-fraction 0.5] [--sparsity dense|exact|threshold|predicted|teal
//                    [--stats S --target-sparsity T --predictor P]]
//                    [--teal-sparsity T [--teal-profile P]]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench/decode_loop.h"
#include "shared/driver/split_engine.h"
#include "shared/model/model.h"
#include "shared/runtime/forward.h"
#include "shared/runtime/kv_cache.h"
#include "shared/sparsity/sparse_ffn.h"
#include "shared/sparsity/sparsity_mode.h"
#include "shared/sparsity/sparsity_setup.h"
#include "shared/sparsity/teal.h"
#include "shared/sparsity/teal_profile.h"
#include "shared/util/cpu_features.h"
#include "shared/util/membw.h"

using namespace thermocline;
using bench::Decode;
using bench::kPrompt;
using bench::Median;

namespace {

int Usage() {
  std::fprintf(stderr,
               "usage: split_bench --model M.gguf [--threads 2] [--tokens 16] [--rounds 3] "
               "[--hot-fraction 0.5] [--sparsity MODE [--stats S] [--target-sparsity T] "
               "[--predictor P]] [--teal-sparsity T [--teal-profile P]]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path;
  int threads = 2, tokens = 16, rounds = 3;
  double hot = 0.5;
  SparsityFlags sf;
  TealFlags tf;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return Usage();
    const char* v = argv[++i];
    bool ok = true;
    if (a == "--model") {
      model_path = v;
    } else if (a == "--threads") {
      ok = absl::SimpleAtoi(v, &threads) && threads >= 1;
    } else if (a == "--tokens") {
      ok = absl::SimpleAtoi(v, &tokens) && tokens >= 1;
    } else if (a == "--rounds") {
      ok = absl::SimpleAtoi(v, &rounds) && rounds >= 1;
    } else if (a == "--hot-fraction") {
      ok = absl::SimpleAtod(v, &hot) && hot >= 0 && hot <= 1;
    } else if (a == "--sparsity") {
      sf.mode = v;
    } else if (a == "--stats") {
      sf.stats_path = v;
    } else if (a == "--target-sparsity") {
      float t;
      ok = absl::SimpleAtof(v, &t);
      sf.target_sparsity = t;
    } else if (a == "--predictor") {
      sf.predictor_path = v;
    } else if (a == "--teal-sparsity") {
      float t;
      ok = absl::SimpleAtof(v, &t);
      tf.sparsity = t;
    } else if (a == "--teal-profile") {
      tf.profile_path = v;
    } else {
      ok = false;
    }
    if (!ok) return Usage();
  }
  if (model_path.empty()) return Usage();
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "split_bench: %s\n", std::string(s.message()).c_str());
    return 1;
  };

  auto model = Model::Load(model_path);
  if (!model.ok()) return fail(model.status());
  const ModelConfig& c = (*model)->config();
  auto setup = SparsitySetupFromFlags(**model, sf, tf);
  if (!setup.ok()) return fail(setup.status());
  const int64_t context = std::min<int64_t>(c.context_length, kPrompt + tokens + 1);

  // Single process: one pool of T threads.
  ThreadPool pool(threads);
  auto kv = KvCache::Create(c, 1, context, GgmlType::kF32);
  if (!kv.ok()) return fail(kv.status());
  auto executors = BuildLocalExecutors(**model, std::move(*setup), pool);
  if (!executors.ok()) return fail(executors.status());
  ForwardPass pass(**model, *kv, pool, executors->ffn.get(), executors->teal.get());
  ForwardPassRunner local(pass);

  // Split: the same thread total over the two workers.
  driver::SplitEngineOptions o;
  o.model_path = model_path;
  o.config = c;
  o.hot_fraction = hot;
  o.sparsity = sf;
  o.teal = tf;
  o.gpu_threads = std::max(1, threads - threads / 2);
  o.cpu_threads = std::max(1, threads / 2);
  o.kv_slots = 1;
  o.context = static_cast<int32_t>(context);
  const auto load0 = std::chrono::steady_clock::now();
  auto split = driver::SplitEngine::Create(o);
  if (!split.ok()) return fail(split.status());
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load0).count();

  std::printf(
      "model %s (%s weights, %lld layers), kernels %s, sparsity %s, TEAL %s, hot fraction %.2f\n",
      model_path.c_str(), (*model)->weight_type_name().c_str(), static_cast<long long>(c.n_layers),
      SimdLevelName(DetectSimdLevel()), sf.mode.c_str(),
      tf.sparsity ? absl::StrCat(*tf.sparsity,
                                 tf.profile_path.empty() ? " (per-token share)" : " (calibrated)")
                        .c_str()
                  : "off",
      hot);
  std::printf("threads: local %d; split gpu worker %d + cpu worker %d; workers ready in %.1f s\n",
              threads, o.gpu_threads, o.cpu_threads, load_s);
  std::vector<double> t_local, t_split;
  std::vector<int32_t> tok_local, tok_split;
  for (int r = 0; r < rounds; ++r) {
    std::vector<int32_t> a, b;
    if (absl::Status s = Decode(local, tokens, t_local, a); !s.ok()) return fail(s);
    if (absl::Status s = Decode(**split, tokens, t_split, b); !s.ok()) return fail(s);
    if (r == 0) {
      tok_local = a;
      tok_split = b;
    }
    std::printf("round %d: local %.2f ms/token, split %.2f ms/token (medians so far)\n", r + 1,
                1e3 * Median(t_local), 1e3 * Median(t_split));
    std::fflush(stdout);
  }
  const double bw = MeasureReadBandwidthGBs(pool);
  const double floor_ms = 1e3 * static_cast<double>((*model)->decode_bytes_per_token()) / (bw * 1e9);
  const double ml = Median(t_local), ms = Median(t_split);
  const double bl = *std::min_element(t_local.begin(), t_local.end());
  const double bs = *std::min_element(t_split.begin(), t_split.end());
  std::printf("\n%-8s %14s %12s %10s\n", "side", "median ms/tok", "best ms/tok", "tok/s");
  std::printf("%-8s %14.2f %12.2f %10.2f\n", "local", 1e3 * ml, 1e3 * bl, 1 / ml);
  std::printf("%-8s %14.2f %12.2f %10.2f\n", "split", 1e3 * ms, 1e3 * bs, 1 / ms);
  std::printf("split / local time: median %.3f, best %.3f; split overhead %.1f%% (target <= 10%%)\n",
              ms / ml, bs / bl, 100 * (ms / ml - 1));
  std::printf("floor: %.2f ms/token (%.1f MB of weights at %.2f GB/s read, %d threads)\n", floor_ms,
              (*model)->decode_bytes_per_token() / 1e6, bw, threads);
  std::printf("ring hops per split step: %lld round trips (1 Step/Logits + %lld Activation/Partial);"
              " see ring_bench for one 8 KiB round trip\n",
              static_cast<long long>(1 + c.n_layers), static_cast<long long>(c.n_layers));
  std::printf("same greedy tokens: %s; restarts during the run: %lld\n",
              tok_local == tok_split ? "yes" : "NO", static_cast<long long>((*split)->stats().restarts));
  return 0;
}
