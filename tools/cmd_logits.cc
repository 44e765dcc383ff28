// `thermocline logits`: the logits of every position of a fixed token sequence, in llama.cpp's
// reference format (raw little-endian f32, [n_ids][n_vocab]), with a comparison against another
// engine's file and a greedy continuation. The tool behind the reference tests
// (../shared/models/archs, quants) and a user's check of a converted or quantized model.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "shared/driver/split_engine.h"
#include "shared/model/model.h"
#include "shared/runtime/forward.h"
#include "shared/runtime/generate.h"
#include "shared/sparsity/sparse_ffn.h"
#include "shared/sparsity/sparsity_options.h"
#include "shared/sparsity/sparsity_setup.h"
#include "shared/sparsity/teal.h"
#include "shared/sparsity/teal_options.h"
#include "tools/command.h"

namespace thermocline::tools {
namespace {

int Fail(const std::string& msg) {
  std::cerr << "thermocline logits: " << msg << "\n";
  return 1;
}

// "1,403,407" or "1 403 407": ids in [0, vocab).
absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& text, int64_t vocab) {
  std::vector<int32_t> ids;
  for (absl::string_view piece : absl::StrSplit(text, absl::ByAnyChar(", \t\n"), absl::SkipEmpty())) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(piece, &id)) {
      return absl::InvalidArgumentError(absl::StrCat("--ids: '", std::string(piece), "' is not an integer"));
    }
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("--ids: token ", id, " is not in [0, ", vocab, ") (the model's vocabulary)"));
    }
    ids.push_back(id);
  }
  if (ids.empty()) return absl::InvalidArgumentError("--ids: no token ids given");
  return ids;
}

absl::StatusOr<std::vector<float>> ReadF32(const std::string& path, size_t expected) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() != expected * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s has %d bytes; [n_ids][n_vocab] f32 logits need %d", path, bytes.size(),
        expected * sizeof(float)));
  }
  std::vector<float> v(expected);
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

int64_t Argmax(const float* x, int64_t n) {
  return std::max_element(x, x + n) - x;  // lowest id on ties, as llama.cpp's references
}

int RunLogits(const std::vector<std::string>& args) {
  std::string model_path, ids_text, out_path, compare_path, kv_type;
  int32_t greedy = 0;
  int threads = 0;
  SparsityFlags sf;
  TealFlags tf;
  bool split = false;
  double hot_fraction = 0;
  driver::SplitEngineOptions so;
  po::options_description opts("options");
  // clang-format off
  opts.add_options()
      ("model,m", po::value(&model_path)->required(), "model file (GGUF)")
      ("ids", po::value(&ids_text)->required(), "token ids, e.g. 1,403,407 (BOS is not added)")
      ("output,o", po::value(&out_path), "write every position's logits here: raw f32 [n_ids][n_vocab]")
      ("compare", po::value(&compare_path), "compare with another engine's logits file of that layout")
      ("greedy", po::value(&greedy)->default_value(0), "then continue N tokens greedily; prints their ids")
      ("threads", po::value(&threads)->default_value(1), "CPU threads (0 = all cores)")
      ("kv-type", po::value(&kv_type)->default_value("f32"), "KV cache element type: f32 or f16");
  // clang-format on
  AddSparsityOptions(opts, sf);
  AddTealOptions(opts, tf);
  po::options_description split_opts("split execution (docs/split.md)");
  split_opts.add_options()
      ("split", po::bool_switch(&split), "run the model in a gpu worker and a cpu worker process")
      ("hot-fraction", po::value(&hot_fraction), "share of each layer's FFN neurons on the gpu worker")
      ("plan", po::value(&so.plan_path), "or: placement from `thermocline plan`")
      ("bindir", po::value(&so.bindir), "directory of the worker executables (default: this one's)");
  opts.add(split_opts);
  po::positional_options_description pos;
  po::variables_map vm;
  int exit_code = 0;
  if (!ParseOptions("logits", "--model M.gguf --ids 1,403,407 [-o OUT.f32] [--compare REF.f32] [--greedy N]",
                    opts, pos, args, vm, exit_code)) {
    return exit_code;
  }
  if (threads < 0) return Fail("--threads must be >= 0");
  if (greedy < 0) return Fail("--greedy must be >= 0");
  if (kv_type != "f32" && kv_type != "f16") return Fail("--kv-type must be f32 or f16");
  if (split && vm.count("hot-fraction") == vm.count("plan")) {
    return Fail("--split needs exactly one of --hot-fraction F and --plan PLAN.gguf");
  }
  if (!split && (vm.count("hot-fraction") || vm.count("plan"))) {
    return Fail("--hot-fraction and --plan need --split");
  }

  auto model_or = Model::Load(model_path);
  if (!model_or.ok()) return Fail(std::string(model_or.status().message()));
  const Model& model = **model_or;
  const ModelConfig& c = model.config();
  auto ids = ParseIds(ids_text, c.vocab_size);
  if (!ids.ok()) return Fail(std::string(ids.status().message()));
  const int64_t n = static_cast<int64_t>(ids->size());
  const int64_t capacity = n + greedy;
  if (capacity > c.context_length) {
    return Fail(absl::StrFormat("%d ids + --greedy %d exceed the model's context of %d", n, greedy,
                                c.context_length));
  }

  // TEAL sparsifies decode positions only: the ids (one prompt) stay dense, --greedy steps not.
  auto setup = SparsitySetupFromFlags(model, sf, tf);
  if (!setup.ok()) return Fail(std::string(setup.status().message()));
  if (split) {
    if (absl::Status s = CheckSplitTealPlan(setup->teal); !s.ok())
      return Fail(std::string(s.message()));
  }
  // The runner: this process (any sparsity plan) or the two worker processes.
  ThreadPool pool(threads == 0 ? static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))
                               : threads);
  std::unique_ptr<KvCache> kv;
  LocalExecutors executors;
  std::unique_ptr<ForwardPass> pass;
  std::unique_ptr<ForwardPassRunner> local;
  std::unique_ptr<driver::SplitEngine> engine;
  BatchRunner* runner = nullptr;
  if (split) {
    so.model_path = model_path;
    so.config = c;
    so.sparsity = sf;
    so.teal = tf;
    so.kv_slots = 1;
    so.context = static_cast<int32_t>(capacity);
    so.kv_type = kv_type;
    so.max_logits_rows = static_cast<int32_t>(std::max<int64_t>(64, n));
    if (vm.count("hot-fraction")) so.hot_fraction = hot_fraction;
    auto e = driver::SplitEngine::Create(std::move(so));
    if (!e.ok()) return Fail(std::string(e.status().message()));
    engine = std::move(*e);
    runner = engine.get();
  } else {
    auto cache = KvCache::Create(c, 1, capacity, kv_type == "f16" ? GgmlType::kF16 : GgmlType::kF32);
    if (!cache.ok()) return Fail(std::string(cache.status().message()));
    kv = std::make_unique<KvCache>(std::move(*cache));
    auto built = BuildLocalExecutors(model, std::move(*setup), pool);
    if (!built.ok()) return Fail(std::string(built.status().message()));
    executors = std::move(*built);
    pass =
        std::make_unique<ForwardPass>(model, *kv, pool, executors.ffn.get(), executors.teal.get());
    local = std::make_unique<ForwardPassRunner>(*pass);
    runner = local.get();
  }

  std::vector<BatchEntry> batch(n);
  for (int64_t p = 0; p < n; ++p) batch[p] = {0, static_cast<int32_t>(p), (*ids)[p], true};
  std::vector<float> logits;
  if (absl::Status s = runner->Run(batch, logits); !s.ok()) return Fail(std::string(s.message()));
  const int64_t vocab = c.vocab_size;

  if (!out_path.empty()) {
    std::ofstream out(out_path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(logits.data()),
              static_cast<std::streamsize>(logits.size() * sizeof(float)));
    if (!out) return Fail("cannot write " + out_path);
  }
  if (!compare_path.empty()) {
    auto ref = ReadF32(compare_path, static_cast<size_t>(n * vocab));
    if (!ref.ok()) return Fail(std::string(ref.status().message()));
    double worst_abs = 0, worst_rel = 0;
    int agree = 0;
    std::printf("position  max|d|      max|d|/max|ref|  argmax (this / ref)\n");
    for (int64_t p = 0; p < n; ++p) {
      const float* a = logits.data() + p * vocab;
      const float* b = ref->data() + p * vocab;
      double d = 0, m = 0;
      for (int64_t i = 0; i < vocab; ++i) {
        d = std::max(d, static_cast<double>(std::abs(a[i] - b[i])));
        m = std::max(m, static_cast<double>(std::abs(b[i])));
      }
      const int64_t am = Argmax(a, vocab), bm = Argmax(b, vocab);
      agree += am == bm;
      worst_abs = std::max(worst_abs, d);
      worst_rel = std::max(worst_rel, d / std::max(m, 1e-30));
      std::printf("%8lld  %.3e   %.3e        %lld / %lld%s\n", static_cast<long long>(p), d,
                  d / std::max(m, 1e-30), static_cast<long long>(am), static_cast<long long>(bm),
                  am == bm ? "" : "  <- differs");
    }
    std::printf("overall: max|d| %.3e, max relative %.3e, argmax agrees at %d of %lld positions\n",
                worst_abs, worst_rel, agree, static_cast<long long>(n));
  }
  if (greedy > 0) {
    std::vector<int32_t> picks;
    int32_t next = static_cast<int32_t>(Argmax(logits.data() + (n - 1) * vocab, vocab));
    for (int32_t s = 0; s < greedy; ++s) {
      picks.push_back(next);
      if (s + 1 == greedy) break;
      BatchEntry e{0, static_cast<int32_t>(n + s), next, true};
      std::vector<float> step;
      if (absl::Status st = runner->Run({&e, 1}, step); !st.ok()) return Fail(std::string(st.message()));
      next = static_cast<int32_t>(Argmax(step.data(), vocab));
    }
    for (size_t i = 0; i < picks.size(); ++i) std::printf(i == 0 ? "%d" : " %d", picks[i]);
    std::printf("\n");
  }
  return 0;
}

static CommandRegistrar registrar({"logits",
                      "logits of every position of a token sequence; compare with another engine's",
                      &RunLogits});

}  // namespace
}  // namespace thermocline::tools
