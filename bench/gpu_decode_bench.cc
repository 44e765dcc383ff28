// Decode throughput of the CUDA backend, in one run: hybrid (thermocline-gpu-worker --backend
// cuda holding --hot-fraction of every layer's FFN neurons, thermocline-cpu-worker the rest)
// against CPU-only (the single-process engine on all --threads) and everything on the GPU
// (--backend cuda with every neuron hot). The same model, sparsity flags and greedy decode for
// all three; rounds alternate the configurations so that each sees the same machine state.
// Prints one table (median ms/token, tokens/s, speed-up over CPU-only) and whether the greedy
// tokens agree (the GPU computes in fp16/fp32 and may diverge from the CPU after a few tokens
// on a random model; the throughput is the measurement).
//
// scripts/gpu-check.sh runs it on the 7B-shape synthetic ReLU model (dim 4096,
// ffn 11008, 32 layers, Q4_0) with --hot-fraction 0.4: the share of FFN neurons a consumer
// GPU's budget holds next to attention and the KV cache.
//
// Usage: gpu_decode_bench --model M.gguf [--threads N] [--tokens 32] [--rounds 2]
//                         [--hot-fraction 0.4] [--vram-budget 0] [--sparsity exact]
//                         [--configs cpu,hybrid,gpu]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/decode_loop.h"
#include "shared/driver/split_engine.h"
#include "shared/model/model.h"
#include "shared/runtime/forward.h"
#include "shared/runtime/kv_cache.h"
#include "shared/sparsity/sparse_ffn.h"
#include "shared/sparsity/sparsity_mode.h"

using namespace thermocline;
using bench::Decode;
using bench::kPrompt;
using bench::Median;

namespace {

int Usage() {
  std::fprintf(stderr,
               "usage: gpu_decode_bench --model M.gguf [--threads N] [--tokens 32] [--rounds 2] "
               "[--hot-fraction 0.4] [--vram-budget 0] [--sparsity exact] "
               "[--configs cpu,hybrid,gpu]\n");
  return 2;
}

struct Config {
  std::string name;
  double hot = 0;
  std::unique_ptr<BatchRunner> runner;
  std::vector<double> times;
  std::vector<int32_t> tokens;  // first round's
  double load_s = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, vram_budget = "0", configs = "cpu,hybrid,gpu";
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int tokens = 32, rounds = 2;
  double hot = 0.4;
  SparsityFlags sf;
  sf.mode = "exact";
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
    } else if (a == "--vram-budget") {
      vram_budget = v;
    } else if (a == "--sparsity") {
      sf.mode = v;
    } else if (a == "--configs") {
      configs = v;
    } else {
      ok = false;
    }
    if (!ok) return Usage();
  }
  if (model_path.empty()) return Usage();
  auto fail = [](const std::string& what, const absl::Status& s) {
    std::fprintf(stderr, "gpu_decode_bench: %s: %s\n", what.c_str(), std::string(s.message()).c_str());
    return 1;
  };
  auto model = Model::Load(model_path);
  if (!model.ok()) return fail("load", model.status());
  const ModelConfig& c = (*model)->config();
  auto plan = SparsityPlanFromFlags(**model, sf);
  if (!plan.ok()) return fail("sparsity", plan.status());
  const int64_t context = std::min<int64_t>(c.context_length, kPrompt + tokens + 1);

  ThreadPool pool(threads);
  auto kv = KvCache::Create(c, 1, context, GgmlType::kF32);
  if (!kv.ok()) return fail("kv cache", kv.status());
  std::unique_ptr<SparseFfn> sparse;
  std::unique_ptr<ForwardPass> pass;
  std::vector<Config> runs;
  const std::vector<std::string> names = absl::StrSplit(configs, ',');
  for (const std::string& name : names) {
    Config cfg;
    cfg.name = name;
    const auto t0 = std::chrono::steady_clock::now();
    if (name == "cpu") {
      cfg.hot = 0;
      if (!plan->AllDense()) {
        auto made = SparseFfn::Create(**model, *plan, pool);
        if (!made.ok()) return fail("sparse ffn", made.status());
        sparse = std::move(*made);
      }
      pass = std::make_unique<ForwardPass>(**model, *kv, pool, sparse.get());
      cfg.runner = std::make_unique<ForwardPassRunner>(*pass);
    } else if (name == "hybrid" || name == "gpu") {
      cfg.hot = name == "gpu" ? 1.0 : hot;
      driver::SplitEngineOptions o;
      o.model_path = model_path;
      o.config = c;
      o.hot_fraction = cfg.hot;
      o.sparsity = sf;
      // The CPU worker computes the cold neurons on every core; the GPU worker's threads only
      // convert weights at load.
      o.gpu_threads = threads;
      o.cpu_threads = threads;
      o.kv_slots = 1;
      o.context = static_cast<int32_t>(context);
      o.max_batch = kPrompt;
      o.gpu_backend = "cuda";
      o.extra_gpu_args = {"--vram-budget", name == "gpu" ? "0" : vram_budget};
      o.ready_timeout = absl::Seconds(600);
      auto engine = driver::SplitEngine::Create(o);
      if (!engine.ok()) return fail(name + " workers", engine.status());
      cfg.runner = std::move(*engine);
    } else {
      return Usage();
    }
    cfg.load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%s ready in %.1f s\n", name.c_str(), cfg.load_s);
    std::fflush(stdout);
    runs.push_back(std::move(cfg));
  }
  std::printf("model %s: %s weights, dim %lld, ffn %lld, %lld layers; sparsity %s; %d threads\n",
              model_path.c_str(), (*model)->weight_type_name().c_str(),
              static_cast<long long>(c.dim), static_cast<long long>(c.ffn_dim),
              static_cast<long long>(c.n_layers), sf.mode.c_str(), threads);
  for (int r = 0; r < rounds; ++r) {
    for (Config& cfg : runs) {
      std::vector<int32_t> out;
      if (absl::Status s = Decode(*cfg.runner, tokens, cfg.times, out); !s.ok()) {
        return fail(cfg.name + " decode", s);
      }
      if (r == 0) cfg.tokens = out;
      std::printf("round %d: %s %.2f ms/token (median so far)\n", r + 1, cfg.name.c_str(),
                  1e3 * Median(cfg.times));
      std::fflush(stdout);
    }
  }
  double cpu_ms = 0;
  for (const Config& cfg : runs) {
    if (cfg.name == "cpu") cpu_ms = 1e3 * Median(cfg.times);
  }
  std::printf("\n%-8s %10s %14s %10s %12s %12s\n", "config", "hot frac", "median ms/tok", "tok/s",
              "vs cpu-only", "same tokens");
  for (const Config& cfg : runs) {
    const double ms = 1e3 * Median(cfg.times);
    const std::string speedup = cpu_ms > 0 ? std::to_string(cpu_ms / ms).substr(0, 5) + "x" : "-";
    const std::string same = runs.front().tokens == cfg.tokens ? "yes" : "no";
    std::printf("%-8s %10.2f %14.2f %10.2f %12s %12s\n", cfg.name.c_str(), cfg.hot, ms, 1e3 / ms,
                speedup.c_str(), same.c_str());
  }
  return 0;
}
