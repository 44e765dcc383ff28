// Decode throughput of the sparsity modes against each mode's own memory-bandwidth floor,
// measured in one run.
//
// A decode step must read the weights it uses once, so a mode's tokens/s is at most
//   read bandwidth / bytes that mode reads per token.
// Dense reads every weight. Exact reads attention, the output head and every gate row, plus up
// and down rows of the neurons that fire. Predicted reads the predictors instead of the gate,
// and gate, up and down rows of the predicted neurons only. The FFN share of each count comes
// from what SparseFfn actually ran for that very token.
//
// The floor is timed token by token: right after each decode step the pool reads that step's
// byte count from a buffer far larger than the last-level cache (TimeParallelRead), with the
// same threads. On a shared machine, time slices lost to other processes hit the step and its
// floor alike. "ratio" is the median read time over the median step time; "best" is the fastest
// read over the fastest step. tok/s is the plain mean.
//
// Predicted mode uses --predictor P.gguf when given. Without one it builds a random low-rank
// predictor of --predictor-rank, per layer calibrated on the prompt's FFN inputs to predict
// --predicted-over times as many neurons as exact ran (a recall-biased predictor's candidate
// count; exact must run first, else 0.5 of the neurons is assumed): the speed of a trained
// predictor of that size, not its accuracy.
//
// Usage: sparse_decode_bench --model M.gguf [--model ...] [--threads 2] [--tokens 32]
//          [--modes dense,exact,predicted] [--predictor P.gguf] [--predictor-rank 256]
//          [--predicted-over 1.25]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "shared/model/model.h"
#include "shared/runtime/forward.h"
#include "shared/sparsity/predictor.h"
#include "shared/sparsity/sparse_ffn.h"
#include "shared/util/cpu_features.h"
#include "shared/util/membw.h"
#include "shared/util/thread_pool.h"

using namespace thermocline;

namespace {

struct Options {
  std::vector<std::string> models;
  std::vector<int> threads = {2};
  int tokens = 32;
  std::vector<SparsityMode> modes = {SparsityMode::kDense, SparsityMode::kExact,
                                     SparsityMode::kPredicted};
  std::string predictor_path;
  int64_t predictor_rank = 256;
  double predicted_over = 1.25;
};

constexpr int kPrompt = 16;

int64_t Bytes(const MatrixView& m) { return m.rows * m.row_bytes; }

// Collects each layer's FFN inputs while the prompt runs densely.
class InputRecorder final : public FfnObserver {
 public:
  InputRecorder(int64_t n_layers, int64_t dim) : dim_(dim), h_(n_layers) {}
  void OnFfn(int64_t layer, const float* h, const float*, const float*,
             int64_t n_tokens) override {
    h_[layer].insert(h_[layer].end(), h, h + n_tokens * dim_);
  }
  const std::vector<float>& inputs(int64_t layer) const { return h_[layer]; }

 private:
  int64_t dim_;
  std::vector<std::vector<float>> h_;
};

// A random rank-r predictor whose per-layer thresholds make it pick `fraction[l]` of the
// neurons on the recorded inputs.
absl::StatusOr<PredictorSet> SpeedProxyPredictor(const Model& model, int64_t rank,
                                                 const InputRecorder& rec,
                                                 const std::vector<double>& fraction,
                                                 ThreadPool& pool) {
  const ModelConfig& c = model.config();
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<PredictorWeights> layers(c.n_layers);
  for (PredictorWeights& p : layers) {
    p.rank = rank;
    p.fc1.resize(rank * c.dim);
    p.fc2.resize(c.ffn_dim * rank);
    for (float& v : p.fc1) v = normal(rng);
    for (float& v : p.fc2) v = normal(rng);
  }
  auto set = PredictorSet::FromWeights(layers, c, GgmlType::kF16);
  if (!set.ok()) return set.status();
  std::vector<float> thresholds(c.n_layers);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::vector<float>& h = rec.inputs(l);
    const int64_t n = static_cast<int64_t>(h.size()) / c.dim;
    std::vector<float> scores(n * c.ffn_dim);
    set->Scores(l, h.data(), n, scores.data(), pool);
    const double f = std::clamp(fraction[l], 0.0, 1.0);
    const size_t k = std::min(scores.size() - 1, static_cast<size_t>((1 - f) * scores.size()));
    std::nth_element(scores.begin(), scores.begin() + k, scores.end());
    thresholds[l] = scores[k];
  }
  if (absl::Status s = set->set_layer_thresholds(std::move(thresholds)); !s.ok()) return s;
  return set;
}

bool ParseArgs(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--model" && has_value) {
      o.models.push_back(argv[++i]);
    } else if (a == "--threads" && has_value) {
      if (!bench::ParseThreadList(argv[++i], o.threads)) return false;
    } else if (a == "--tokens" && has_value) {
      if (!absl::SimpleAtoi(argv[++i], &o.tokens) || o.tokens <= 0) return false;
    } else if (a == "--modes" && has_value) {
      o.modes.clear();
      for (auto part : absl::StrSplit(argv[++i], ',')) {
        auto m = ParseSparsityMode(std::string(part));
        if (!m || *m == SparsityMode::kThreshold) return false;
        o.modes.push_back(*m);
      }
    } else if (a == "--predictor" && has_value) {
      o.predictor_path = argv[++i];
    } else if (a == "--predictor-rank" && has_value) {
      if (!absl::SimpleAtoi(argv[++i], &o.predictor_rank) || o.predictor_rank <= 0) return false;
    } else if (a == "--predicted-over" && has_value) {
      if (!absl::SimpleAtod(argv[++i], &o.predicted_over) || o.predicted_over <= 0) return false;
    } else {
      return false;
    }
  }
  return !o.models.empty();
}

double Median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "sparse_decode_bench: %s\n", std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!ParseArgs(argc, argv, o)) {
    std::fprintf(stderr,
                 "usage: sparse_decode_bench --model M.gguf [--model ...] [--threads 2] "
                 "[--tokens 32] [--modes dense,exact,predicted] [--predictor P.gguf] "
                 "[--predictor-rank 256] [--predicted-over 1.25]\n");
    return 2;
  }
  std::printf("kernels: %s\n", bench::KernelFamily());
  std::printf("%-24s %5s %-9s %3s %9s %9s %9s %8s %7s %7s %7s %7s\n", "model", "type", "mode",
              "thr", "MB/token", "read GB/s", "floor t/s", "tok/s", "ratio", "best", "active",
              "cand");
  for (const std::string& path : o.models) {
    auto model = Model::Load(path);
    if (!model.ok()) return Fail(model.status());
    // `dense` is the product's dense mode, which multiplies the FFN from its interleaved copy
    // (as decode_bench); the sparse modes gather from the row layout, which stays.
    if (std::find(o.modes.begin(), o.modes.end(), SparsityMode::kDense) != o.modes.end()) {
      if (absl::Status s = (*model)->InterleaveDenseFfn(); !s.ok()) return Fail(s);
    }
    const Model& m = **model;
    const ModelConfig& c = m.config();
    int64_t dense_ffn = 0;
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const LayerWeights& w = m.layer(l);
      dense_ffn += Bytes(w.gate) + Bytes(w.up) + Bytes(w.has_down_t ? w.down_t : w.down);
    }
    const double non_ffn = static_cast<double>(m.decode_bytes_per_token() - dense_ffn);
    auto kv = KvCache::Create(c, 1, kPrompt + o.tokens + 1, GgmlType::kF32);
    if (!kv.ok()) return Fail(kv.status());
    // Attention also reads the KV cache: every position so far, keys and values.
    const double kv_bytes = 2.0 * c.n_layers * c.kv_dim * 4 * (kPrompt + o.tokens);
    // The floor's buffer: the most any mode reads per token (dense; predicted adds its
    // predictors, hence the margin), far above the last-level cache for models worth timing.
    const size_t floor_bytes =
        (static_cast<size_t>(m.decode_bytes_per_token() + kv_bytes) * 5 / 4 + 4095) / 4096 * 4096;
    // On huge pages, as the decode's weights are (bench_util.h).
    const bench::Buffer floor_pages = bench::Allocate(floor_bytes);
    uint8_t* floor_buf = floor_pages.data();
    if (floor_buf == nullptr) return Fail(absl::ResourceExhaustedError("floor buffer"));
    std::memset(floor_buf, 1, floor_bytes);
    std::vector<BatchEntry> prompt;
    for (int p = 0; p < kPrompt; ++p) prompt.push_back({0, p, 3 + (p * 7) % 200, p == kPrompt - 1});
    std::shared_ptr<const PredictorSet> loaded;
    if (!o.predictor_path.empty()) {
      auto set = PredictorSet::Load(o.predictor_path, c);
      if (!set.ok()) return Fail(set.status());
      loaded = std::make_shared<const PredictorSet>(std::move(*set));
    }
    for (int nt : o.threads) {
      ThreadPool pool(nt);
      std::vector<double> exact_active(c.n_layers, 0.5);
      for (SparsityMode mode : o.modes) {
        double cand_sum = 0, active_sum = 0;
        std::vector<double> exact_active_sum(c.n_layers, 0);
        SparsityPlan plan = SparsityPlan::Uniform(mode, c.n_layers);
        if (mode == SparsityMode::kPredicted) {
          plan.predictors = loaded;
          if (!plan.predictors) {
            InputRecorder rec(c.n_layers, c.dim);
            DenseFfn observed(m, pool);
            observed.set_observer(&rec);
            ForwardPass calib(m, *kv, pool, &observed);
            std::vector<float> logits;
            kv->Reset(0);
            if (absl::Status s = calib.Run(prompt, logits); !s.ok()) return Fail(s);
            std::vector<double> fraction(c.n_layers);
            for (int64_t l = 0; l < c.n_layers; ++l)
              fraction[l] = exact_active[l] * o.predicted_over;
            auto set = SpeedProxyPredictor(m, o.predictor_rank, rec, fraction, pool);
            if (!set.ok()) return Fail(set.status());
            plan.predictors = std::make_shared<const PredictorSet>(std::move(*set));
          }
        }
        std::unique_ptr<SparseFfn> sparse;
        if (mode != SparsityMode::kDense) {
          auto made = SparseFfn::Create(m, plan, pool);
          if (!made.ok()) return Fail(made.status());
          sparse = std::move(*made);
        }
        ForwardPass pass(m, *kv, pool, sparse.get());
        std::vector<float> logits;
        kv->Reset(0);
        if (absl::Status s = pass.Run(prompt, logits); !s.ok()) return Fail(s);
        if (sparse) sparse->ResetActivity();
        std::vector<double> step_s, read_s;
        double total_s = 0, total_bytes = 0;
        for (int i = 0; i < o.tokens; ++i) {
          BatchEntry e{0, kPrompt + i, 3 + (i * 13) % 200, true};
          const auto t0 = std::chrono::steady_clock::now();
          if (absl::Status s = pass.Run(std::span<const BatchEntry>(&e, 1), logits); !s.ok()) {
            return Fail(s);
          }
          step_s.push_back(
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
          // This step's bytes: its FFN reads from the activity counts, then reset for the next.
          const double ffn = sparse ? sparse->FfnBytesPerToken() : static_cast<double>(dense_ffn);
          const double kv_step = 2.0 * c.n_layers * c.kv_dim * 4 * (kPrompt + i + 1);
          const double bytes = non_ffn + kv_step + ffn;
          if (sparse) {
            for (int64_t l = 0; l < c.n_layers; ++l) {
              const LayerActivity& a = sparse->activity()[l];
              cand_sum += static_cast<double>(a.candidates);
              active_sum += static_cast<double>(a.active);
              if (mode == SparsityMode::kExact)
                exact_active_sum[l] += static_cast<double>(a.active);
            }
            sparse->ResetActivity();
          }
          read_s.push_back(TimeParallelRead(
              pool, floor_buf, std::min(floor_bytes, static_cast<size_t>(bytes) / 32 * 32)));
          total_s += step_s.back();
          total_bytes += bytes;
        }
        const double bytes = total_bytes / o.tokens;
        const double tps = o.tokens / total_s;
        const double med_read = Median(read_s), med_step = Median(step_s);
        const double bw = bytes / med_read / 1e9, floor = 1 / med_read;
        const double best = *std::min_element(read_s.begin(), read_s.end()) /
                            *std::min_element(step_s.begin(), step_s.end());
        const double neurons = static_cast<double>(o.tokens) * c.n_layers * c.ffn_dim;
        const double active = sparse ? active_sum / neurons : 1;
        const double cand = sparse ? cand_sum / neurons : 1;
        if (mode == SparsityMode::kExact) {
          for (int64_t l = 0; l < c.n_layers; ++l) {
            exact_active[l] = exact_active_sum[l] / (static_cast<double>(o.tokens) * c.ffn_dim);
          }
        }
        const std::string name = path.substr(path.find_last_of('/') + 1);
        std::printf("%-24s %5s %-9s %3d %9.1f %9.2f %9.2f %8.2f %7.3f %7.3f %7.3f %7.3f\n",
                    name.c_str(), m.weight_type_name().c_str(),
                    std::string(SparsityModeName(mode)).c_str(), nt, bytes / 1e6, bw, floor, tps,
                    med_read / med_step, best, active, cand);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
