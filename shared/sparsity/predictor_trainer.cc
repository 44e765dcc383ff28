#include "shared/sparsity/predictor_trainer.h"
#include "shared/sparsity/profiler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "shared/runtime/corpus.h"
#include "shared/runtime/ffn.h"
#include "shared/runtime/forward.h"
#include "shared/runtime/kv_cache.h"
#include "shared/util/fp16.h"
#include "shared/util/progress.h"
#include "shared/util/status_macros.h"

namespace thermocline {
namespace {

constexpr float kAdamBeta1 = 0.9f;
constexpr float kAdamBeta2 = 0.999f;
constexpr float kAdamEps = 1e-8f;
constexpr float kFinalLrShare = 0.1f;  // the cosine schedule ends at this share of --lr
// z of the margin added to the recall target on the calibration tokens: one-sided 99.87% per
// layer, so that every layer of a model reaches the target on unseen tokens together (a union
// bound over the layers; 2 sigmas left one layer in ~20 short of it once the predictors read the
// unnormalised ffn_inp, whose scale varies more from token to token than ffn_norm's output).
constexpr double kRecallMarginSigmas = 3.0;
// The loss sees logit = score - kScoreOffset. The score has no bias, so without an offset the
// calibrated thresholds sit near 0 with either sign, and thresholds of mixed signs cannot be
// folded into one global threshold (see TrainPredictors); the offset moves them well above 0.
constexpr float kScoreOffset = 1.0f;
// Element-wise passes give each thread at least this many elements: below it, waking threads
// costs more than the pass.
constexpr int64_t kMinElemsPerThread = 1 << 15;

uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A counter-based generator: portable, so a seed gives the same predictors on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(Mix(seed)) {}
  uint64_t Next() { return Mix(state_++); }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }  // [0, 1)
  float Normal() {
    const double u1 = 1.0 - Uniform(), u2 = Uniform();  // u1 in (0, 1]
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
  }

 private:
  uint64_t state_;
};

uint64_t StreamSeed(uint64_t seed, int64_t layer, int64_t rank, uint64_t purpose) {
  return Mix(Mix(Mix(seed) ^ static_cast<uint64_t>(layer)) ^ static_cast<uint64_t>(rank)) ^
         Mix(purpose);
}

MatrixView F32View(const float* data, int64_t rows, int64_t cols) {
  MatrixView m;
  m.type = GgmlType::kF32;
  m.rows = rows;
  m.cols = cols;
  m.data = reinterpret_cast<const uint8_t*>(data);
  m.row_bytes = cols * static_cast<int64_t>(sizeof(float));
  return m;
}

// dst[c][r] = src[r][c] for a [rows][cols] matrix, in tiles so that both sides stay in cache
// lines, split over the pool by output rows.
void Transpose(const float* src, int64_t rows, int64_t cols, float* dst, ThreadPool& pool) {
  constexpr int64_t kTile = 16;
  pool.ParallelFor(
      cols,
      [&](int64_t c0, int64_t c1) {
        for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
          const int64_t r1 = std::min(rows, r0 + kTile);
          for (int64_t cb = c0; cb < c1; cb += kTile) {
            const int64_t ce = std::min(c1, cb + kTile);
            for (int64_t r = r0; r < r1; ++r) {
              for (int64_t c = cb; c < ce; ++c) dst[c * rows + r] = src[r * cols + c];
            }
          }
        }
      },
      std::max<int64_t>(kTile, kMinElemsPerThread / std::max<int64_t>(1, rows)));
}

// The MLP being trained and everything one step needs, sized for `batch` samples.
struct Trainee {
  int64_t dim, rank, ffn, batch;
  std::vector<float> w1, w2;          // [rank][dim], [ffn][rank]
  std::vector<float> m1, v1, m2, v2;  // Adam moments
  std::vector<float> input_scale;     // [dim], applied to inputs before fc1
  std::vector<float> x, xt, z1, a, at, z2, g2t, w2t, da, dz1t, dw1, dw2;
  std::vector<double> row_loss;

  Trainee(int64_t d, int64_t r, int64_t n, int64_t b) : dim(d), rank(r), ffn(n), batch(b) {
    w1.resize(r * d);
    w2.resize(n * r);
    m1.assign(r * d, 0);
    v1.assign(r * d, 0);
    m2.assign(n * r, 0);
    v2.assign(n * r, 0);
    x.resize(b * d);
    xt.resize(d * b);
    z1.resize(b * r);
    a.resize(b * r);
    at.resize(r * b);
    z2.resize(b * n);
    g2t.resize(n * b);
    w2t.resize(r * n);
    da.resize(b * r);
    dz1t.resize(r * b);
    dw1.resize(r * d);
    dw2.resize(n * r);
    row_loss.resize(b);
  }

  // He initialization for fc1 (a ReLU follows); fc2 scaled so initial scores have unit variance.
  void Init(uint64_t seed) {
    Rng rng(seed);
    const float s1 = std::sqrt(2.0f / static_cast<float>(dim));
    for (float& w : w1) w = rng.Normal() * s1;
    const float s2 = std::sqrt(1.0f / static_cast<float>(rank));
    for (float& w : w2) w = rng.Normal() * s2;
  }

  // z2[b][0..ffn) = scores of the first nb samples in x.
  void Forward(int64_t nb, ThreadPool& pool) {
    MatMul(F32View(w1.data(), rank, dim), x.data(), nb, dim, z1.data(), rank, pool);
    for (int64_t i = 0; i < nb * rank; ++i) a[i] = std::max(z1[i], 0.0f);
    MatMul(F32View(w2.data(), ffn, rank), a.data(), nb, rank, z2.data(), ffn, pool);
  }

  // One Adam step on the first nb samples of x (masks of samples `ids`). Returns the mean loss
  // when want_loss, else 0.
  double Step(const LayerSamples& s, const int64_t* ids, int64_t nb, float pos_weight, float lr,
              int64_t t, bool want_loss, ThreadPool& pool) {
    Forward(nb, pool);
    // dL/dz of the weighted BCE, averaged over the batch (summed over neurons), written in
    // place of z2: active (y = 1): pos_weight * (sigmoid(z) - 1); inactive: sigmoid(z). One
    // exp(-|z|) gives both sigmoid and softplus; the loss itself is only summed when asked for
    // (log1p would otherwise cost as much as the GEMMs).
    const float inv_b = 1.0f / static_cast<float>(nb);
    const int64_t loss_grain = std::max<int64_t>(1, kMinElemsPerThread / 8 / ffn);
    pool.ParallelFor(
        nb,
        [&](int64_t b0, int64_t b1) {
          for (int64_t b = b0; b < b1; ++b) {
            float* z = z2.data() + b * ffn;
            const uint64_t* mask = s.mask(ids[b]);
            double loss = 0;
            for (int64_t i = 0; i < ffn; ++i) {
              const float logit = z[i] - kScoreOffset;
              const float e = std::exp(-std::abs(logit));
              const float sigmoid = logit >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
              const bool active = (mask[i >> 6] >> (i & 63)) & 1;
              if (want_loss) {
                // softplus(x) = max(x, 0) + log1p(e); softplus(-x) = softplus(x) - x.
                const float sp = std::max(logit, 0.0f) + std::log1p(e);
                loss += active ? pos_weight * (sp - logit) : sp;
              }
              z[i] = (active ? pos_weight * (sigmoid - 1.0f) : sigmoid) * inv_b;
            }
            row_loss[b] = loss / static_cast<double>(ffn);
          }
        },
        loss_grain);
    const float* g2 = z2.data();
    // dW2[i][k] = sum_b g2[b][i] a[b][k]: rows of a^T dotted with rows of g2^T.
    Transpose(g2, nb, ffn, g2t.data(), pool);
    Transpose(a.data(), nb, rank, at.data(), pool);
    MatMul(F32View(at.data(), rank, nb), g2t.data(), ffn, nb, dw2.data(), rank, pool);
    // dA[b][k] = sum_i g2[b][i] w2[i][k], then through the ReLU.
    Transpose(w2.data(), ffn, rank, w2t.data(), pool);
    MatMul(F32View(w2t.data(), rank, ffn), g2, nb, ffn, da.data(), rank, pool);
    for (int64_t b = 0; b < nb; ++b) {
      for (int64_t k = 0; k < rank; ++k) {
        dz1t[k * nb + b] = z1[b * rank + k] > 0 ? da[b * rank + k] : 0.0f;
      }
    }
    // dW1[k][j] = sum_b dz1[b][k] x[b][j]: rows of x^T dotted with rows of dz1^T.
    Transpose(x.data(), nb, dim, xt.data(), pool);
    MatMul(F32View(xt.data(), dim, nb), dz1t.data(), rank, nb, dw1.data(), dim, pool);

    const float c1 = 1.0f - std::pow(kAdamBeta1, static_cast<float>(t));
    const float c2 = 1.0f - std::pow(kAdamBeta2, static_cast<float>(t));
    const float step = lr * std::sqrt(c2) / c1;
    auto adam = [&](std::vector<float>& w, std::vector<float>& m, std::vector<float>& v,
                    const std::vector<float>& g) {
      pool.ParallelFor(
          static_cast<int64_t>(w.size()),
          [&](int64_t i0, int64_t i1) {
            for (int64_t i = i0; i < i1; ++i) {
              m[i] = kAdamBeta1 * m[i] + (1 - kAdamBeta1) * g[i];
              v[i] = kAdamBeta2 * v[i] + (1 - kAdamBeta2) * g[i] * g[i];
              w[i] -= step * m[i] / (std::sqrt(v[i]) + kAdamEps);
            }
          },
          kMinElemsPerThread);
    };
    adam(w1, m1, v1, dw1);
    adam(w2, m2, v2, dw2);
    double loss = 0;
    for (int64_t b = 0; b < nb; ++b) loss += row_loss[b];
    return loss / static_cast<double>(nb);
  }
};

// Inputs of samples `ids` into x [nb][dim], each dimension multiplied by scale[j] when given.
void GatherInputs(const LayerSamples& s, const int64_t* ids, int64_t nb, float* x,
                  const std::vector<float>* scale = nullptr) {
  const int64_t d = s.dim();
  for (int64_t b = 0; b < nb; ++b) {
    float* row = x + b * d;
    s.GetInput(ids[b], row);
    if (scale != nullptr) {
      for (int64_t j = 0; j < d; ++j) row[j] *= (*scale)[j];
    }
  }
}

// 1 / RMS of each input dimension over `ids`. The net trains on inputs scaled by it, since the
// dimensions of h differ in scale by orders of magnitude in deeper layers (which leaves Adam
// badly conditioned); the scale folds into fc1's columns afterwards, as there is no bias.
std::vector<float> InputScale(const LayerSamples& s, const std::vector<int64_t>& ids) {
  const int64_t d = s.dim();
  std::vector<double> sum(d, 0);
  std::vector<float> h(d);
  for (int64_t i : ids) {
    s.GetInput(i, h.data());
    for (int64_t j = 0; j < d; ++j) sum[j] += static_cast<double>(h[j]) * h[j];
  }
  std::vector<float> scale(d);
  for (int64_t j = 0; j < d; ++j) {
    const double rms = std::sqrt(sum[j] / std::max<size_t>(1, ids.size()));
    scale[j] = rms > 1e-12 ? static_cast<float>(1.0 / rms) : 1.0f;
  }
  return scale;
}

std::vector<int64_t> IndicesOf(const LayerSamples& s, SampleSplit split) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < s.size(); ++i) {
    if (s.split(i) == split) out.push_back(i);
  }
  return out;
}

struct ScoredPositive {
  float score;
  int32_t block;  // which calibration block (kSplitBlockTokens consecutive tokens) it came from
};

// The largest threshold at which at least `target` plus a margin of the positive scores pass;
// for a layer with no positives, one above every score (nothing predicted). The margin is
// kRecallMarginSigmas standard errors of the calibration recall, so that recall on unseen tokens
// still reaches the target. Neurons of one token, and neighbouring tokens, fire together, so the
// error is taken over blocks (the ratio estimator's), and never below the binomial one.
float ThresholdForRecall(std::vector<ScoredPositive>& positives, int64_t n_blocks, float max_score,
                         double target) {
  const int64_t p = static_cast<int64_t>(positives.size());
  if (p == 0) return max_score + std::max(1e-3f, std::abs(max_score) * 0.01f);
  std::sort(positives.begin(), positives.end(),
            [](const ScoredPositive& a, const ScoredPositive& b) { return a.score > b.score; });
  // The m-th largest score: every positive at or above it passes, so recall >= m / p >= goal.
  auto threshold_for = [&](double goal) {
    const int64_t m = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(goal * p)), 1, p);
    return positives[m - 1].score;
  };
  const float t0 = threshold_for(target);
  double se = std::sqrt(target * (1 - target) / static_cast<double>(p));
  if (n_blocks > 1) {
    std::vector<double> pos(n_blocks, 0), hit(n_blocks, 0);
    for (const ScoredPositive& q : positives) {
      pos[q.block] += 1;
      hit[q.block] += q.score >= t0;
    }
    double total_hit = 0;
    for (double h : hit) total_hit += h;
    const double recall = total_hit / static_cast<double>(p);
    double ss = 0;
    for (int64_t b = 0; b < n_blocks; ++b) ss += std::pow(hit[b] - recall * pos[b], 2);
    const double mean_pos = static_cast<double>(p) / static_cast<double>(n_blocks);
    se = std::max(se, std::sqrt(ss / static_cast<double>((n_blocks - 1) * n_blocks)) / mean_pos);
  }
  return threshold_for(std::min(1.0, target + kRecallMarginSigmas * se));
}

struct Calibration {
  float threshold = 0;
  float precision = 0;
};

// Threshold and precision of the float MLP on the calibration samples (two passes, so memory
// stays at one batch of scores).
Calibration Calibrate(Trainee& net, const LayerSamples& s, const std::vector<int64_t>& ids,
                      float recall_target, ThreadPool& pool) {
  std::vector<ScoredPositive> positives;
  float max_score = -std::numeric_limits<float>::max();
  const int64_t n = s.ffn_dim();
  // ids ascend, so a new block starts wherever the block number changes.
  std::vector<int32_t> block_of(ids.size());
  int32_t n_blocks = 0;
  for (size_t j = 0; j < ids.size(); ++j) {
    if (j == 0 || ids[j] / kSplitBlockTokens != ids[j - 1] / kSplitBlockTokens) ++n_blocks;
    block_of[j] = n_blocks - 1;
  }
  for (size_t b0 = 0; b0 < ids.size(); b0 += net.batch) {
    const int64_t nb = std::min<int64_t>(net.batch, ids.size() - b0);
    GatherInputs(s, ids.data() + b0, nb, net.x.data(), &net.input_scale);
    net.Forward(nb, pool);
    for (int64_t b = 0; b < nb; ++b) {
      const float* z = net.z2.data() + b * n;
      for (int64_t i = 0; i < n; ++i) {
        max_score = std::max(max_score, z[i]);
        if (s.active(ids[b0 + b], i)) positives.push_back({z[i], block_of[b0 + b]});
      }
    }
  }
  Calibration c;
  c.threshold = ThresholdForRecall(positives, n_blocks, max_score, recall_target);
  int64_t predicted = 0, hits = 0;
  for (size_t b0 = 0; b0 < ids.size(); b0 += net.batch) {
    const int64_t nb = std::min<int64_t>(net.batch, ids.size() - b0);
    GatherInputs(s, ids.data() + b0, nb, net.x.data(), &net.input_scale);
    net.Forward(nb, pool);
    for (int64_t b = 0; b < nb; ++b) {
      const float* z = net.z2.data() + b * n;
      for (int64_t i = 0; i < n; ++i) {
        if (z[i] >= c.threshold) {
          ++predicted;
          hits += s.active(ids[b0 + b], i);
        }
      }
    }
  }
  c.precision = predicted > 0 ? static_cast<float>(hits) / predicted : 1.0f;
  return c;
}

float AutoPosWeight(const LayerSamples& s, const std::vector<int64_t>& train) {
  int64_t active = 0;
  for (int64_t i : train) {
    const uint64_t* m = s.mask(i);
    for (int64_t w = 0; w < s.words(); ++w) active += __builtin_popcountll(m[w]);
  }
  const double p = static_cast<double>(active) / (static_cast<double>(train.size()) * s.ffn_dim());
  if (p <= 0 || p >= 1) return 1.0f;
  return static_cast<float>(std::clamp(std::sqrt((1 - p) / p), 1.0, 30.0));
}

int64_t StepsPerEpoch(int64_t n_train, int64_t batch) { return (n_train + batch - 1) / batch; }

// The ranks TrainLayerPredictor tries, ascending and without duplicates.
std::vector<int64_t> RanksToTry(const PredictorTrainerOptions& options) {
  if (options.rank > 0) return {options.rank};
  std::vector<int64_t> ranks = options.rank_candidates;
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return ranks;
}

}  // namespace

absl::Status ValidatePredictorTrainerOptions(const PredictorTrainerOptions& o,
                                             const ModelConfig& config) {
  auto bad = [](const std::string& msg) { return absl::InvalidArgumentError(msg); };
  if (o.window < 2 || o.window > config.context_length) {
    return bad(absl::StrCat("--window ", o.window, " must be in [2, ", config.context_length,
                            "] (the model's context)"));
  }
  if (o.max_samples_per_layer < o.window) {
    return bad(absl::StrCat("--max-samples ", o.max_samples_per_layer,
                            " must be at least one window (", o.window, ")"));
  }
  const int64_t block = TypeTraits(o.type).block_size;
  if (config.dim % block != 0) {
    return bad(absl::StrCat("--type ", std::string(TypeTraits(o.type).name),
                            " needs the model dim (", config.dim, ") to be a multiple of ", block));
  }
  auto check_rank = [&](int64_t r) -> absl::Status {
    if (r <= 0 || r > 65536 || r % block != 0) {
      return bad(absl::StrCat("rank ", r, " must be in [1, 65536]",
                              block > 1 ? absl::StrCat(" and a multiple of ", block, " for --type ",
                                                       std::string(TypeTraits(o.type).name))
                                        : ""));
    }
    return absl::OkStatus();
  };
  if (o.rank != 0) TC_RETURN_IF_ERROR(check_rank(o.rank));
  for (int64_t r : o.rank_candidates) TC_RETURN_IF_ERROR(check_rank(r));
  if (!(o.rank_tolerance >= 0 && o.rank_tolerance <= 1)) {
    return bad("--rank-tolerance must be in [0, 1]");
  }
  if (o.epochs < 1 || o.epochs > 100000) return bad("--epochs must be in [1, 100000]");
  if (!(o.learning_rate > 0 && o.learning_rate < 1)) return bad("--lr must be in (0, 1)");
  if (o.batch < 1 || o.batch > 65536) return bad("--batch must be in [1, 65536]");
  if (!(o.pos_weight == 0 || (o.pos_weight > 0 && o.pos_weight <= 1e4))) {
    return bad("--pos-weight must be 0 (auto) or in (0, 10000]");
  }
  if (!(o.recall_target > 0 && o.recall_target < 1)) {
    return bad("--recall-target must be in (0, 1)");
  }
  if (!(o.holdout > 0 && o.holdout <= 0.5f)) return bad("--holdout must be in (0, 0.5]");
  if (IsReluFamily(config.activation)) {
    if (!o.magnitude_cuts.empty()) {
      return bad(
          "magnitude cuts (--stats) apply to SiLU models; this model is ReLU-gated, where "
          "a neuron is active when relu(gate) > 0");
    }
  } else {
    if (static_cast<int64_t>(o.magnitude_cuts.size()) != config.n_layers) {
      return bad(
          absl::StrCat("this SiLU model needs one activation cut per layer (--stats from "
                       "`thermocline profile`); got ",
                       o.magnitude_cuts.size(), " for ", config.n_layers, " layers"));
    }
    for (size_t l = 0; l < o.magnitude_cuts.size(); ++l) {
      if (!(o.magnitude_cuts[l] >= 0 && std::isfinite(o.magnitude_cuts[l]))) {
        return bad(absl::StrCat("the activation cut of layer ", l, " is not a finite value >= 0"));
      }
    }
  }
  return absl::OkStatus();
}

std::vector<int64_t> DefaultRankCandidates(const ModelConfig& config, GgmlType type) {
  const int64_t step = TypeTraits(type).block_size > 1 ? 32 : 16;
  std::vector<int64_t> out;
  // Sixteenths of dim: 1, 2, 4, 8, then 12 and 16 (full rank), which a predictor of a
  // ReLU-gated model may need: relu(gate) > 0 is a sign test of a linear map of dim inputs.
  for (int64_t sixteenths : {1, 2, 4, 8, 12, 16}) {
    const int64_t r =
        std::max(step, (config.dim * sixteenths / 16 + step - 1) / step * step);
    if (out.empty() || out.back() != r) out.push_back(r);
  }
  return out;
}

SampleSplit SplitOfSample(int64_t index, float holdout, uint64_t seed) {
  const int64_t group_blocks = std::max<int64_t>(2, std::llround(2.0 / holdout));
  const int64_t block = index / kSplitBlockTokens;
  const int64_t group = block / group_blocks, pos = block % group_blocks;
  const uint64_t h = Mix(Mix(seed) ^ static_cast<uint64_t>(group));
  const int64_t calibration = static_cast<int64_t>(h % group_blocks);
  const int64_t test =
      (calibration + 1 + static_cast<int64_t>((h >> 32) % (group_blocks - 1))) % group_blocks;
  if (pos == calibration) return SampleSplit::kCalibration;
  if (pos == test) return SampleSplit::kTest;
  return SampleSplit::kTrain;
}

void LayerSamples::Reserve(int64_t n) {
  h_.reserve(n * dim_);
  mask_.reserve(n * words_);
  split_.reserve(n);
}

void LayerSamples::Add(const float* h, const uint64_t* mask, SampleSplit split) {
  const size_t at = h_.size();
  h_.resize(at + dim_);
  for (int64_t j = 0; j < dim_; ++j) h_[at + j] = Fp32ToFp16(h[j]);
  mask_.insert(mask_.end(), mask, mask + words_);
  split_.push_back(static_cast<uint8_t>(split));
}

void LayerSamples::GetInput(int64_t i, float* h) const {
  const uint16_t* src = h_.data() + i * dim_;
  for (int64_t j = 0; j < dim_; ++j) h[j] = Fp16ToFp32(src[j]);
}

int64_t LayerSamples::bytes() const {
  return static_cast<int64_t>(h_.size() * sizeof(uint16_t) + mask_.size() * sizeof(uint64_t) +
                              split_.size());
}

namespace {

// Keeps (predictor input, active mask) of every token the dense FFN sees, up to the cap. The
// input is what the predictors read at run time (FfnExecutor::Compute's predictor_input:
// PowerInfer's ffn_inp for the llama family), so trained files stay interchangeable with
// PowerInfer's.
class SampleCollector final : public FfnObserver {
 public:
  SampleCollector(const ModelConfig& config, const PredictorTrainerOptions& o, int64_t expected)
      : config_(config), options_(o), mask_((config.ffn_dim + 63) / 64) {
    layers_.reserve(config.n_layers);
    for (int64_t l = 0; l < config.n_layers; ++l) {
      layers_.emplace_back(config.dim, config.ffn_dim);
      layers_.back().Reserve(expected);
    }
  }

  void OnPredictorInput(int64_t /*layer*/, const float* x, int64_t /*n_tokens*/) override {
    input_ = x;
  }

  void OnFfn(int64_t layer, const float* /*h*/, const float* gate, const float* /*up*/,
             int64_t n_tokens) override {
    LayerSamples& s = layers_[layer];
    const float* x = input_;
    const int64_t nf = config_.ffn_dim;
    const bool relu = IsReluFamily(config_.activation);
    const float cut = relu ? 0.0f : options_.magnitude_cuts[layer];
    for (int64_t t = 0; t < n_tokens; ++t) {
      if (s.size() >= options_.max_samples_per_layer) return;
      std::fill(mask_.begin(), mask_.end(), 0);
      const float* g = gate + t * nf;
      for (int64_t i = 0; i < nf; ++i) {
        const bool active = relu ? g[i] > 0.0f : ActivationMagnitude(config_.activation, g[i]) >= cut;
        if (active) mask_[i >> 6] |= uint64_t{1} << (i & 63);
      }
      s.Add(x + t * config_.dim, mask_.data(),
            SplitOfSample(s.size(), options_.holdout, options_.seed));
    }
  }

  std::vector<LayerSamples> Take() { return std::move(layers_); }

 private:
  const ModelConfig& config_;
  const PredictorTrainerOptions& options_;
  std::vector<uint64_t> mask_;
  std::vector<LayerSamples> layers_;
  const float* input_ = nullptr;  // this layer's predictor input, from OnPredictorInput
};

}  // namespace

absl::StatusOr<std::vector<LayerSamples>> CollectPredictorSamples(
    const Model& model, std::span<const int32_t> tokens,
    const PredictorTrainerOptions& options, ThreadPool& pool) {
  const ModelConfig& config = model.config();
  TC_RETURN_IF_ERROR(ValidatePredictorTrainerOptions(options, config));
  // Run only the windows whose samples will be kept.
  const int64_t per_window = options.window - 1;
  const int64_t max_windows = options.max_samples_per_layer / options.window;
  const int64_t n_windows =
      std::min<int64_t>(static_cast<int64_t>(tokens.size()) / per_window, max_windows);
  if (n_windows < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the corpus has ", tokens.size(), " tokens, fewer than one window of ", per_window));
  }
  tokens = tokens.first(n_windows * per_window);
  TC_ASSIGN_OR_RETURN(KvCache kv, KvCache::Create(config, 1, options.window, GgmlType::kF32));
  DenseFfn ffn(model, pool);
  SampleCollector collector(config, options, n_windows * options.window);
  ffn.set_observer(&collector);
  ForwardPass pass(model, kv, pool, &ffn);
  CorpusWindowOptions wo;
  wo.window = options.window;
  wo.want_logits = false;
  wo.batch = options.window;
  if (options.progress) wo.progress_label = "train-predictor: collecting";
  TC_RETURN_IF_ERROR(RunCorpusWindows(pass, tokens, wo, [](auto, auto) {}).status());
  std::vector<LayerSamples> samples = collector.Take();
  int64_t counts[3] = {0, 0, 0};
  for (int64_t i = 0; i < samples[0].size(); ++i) ++counts[static_cast<int>(samples[0].split(i))];
  if (counts[1] == 0 || counts[2] == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "too few tokens to hold out calibration and test tokens: ", samples[0].size(),
        " samples, --holdout ", options.holdout, " (held-out tokens come in blocks of ",
        kSplitBlockTokens, "; use more --tokens or a larger --holdout)"));
  }
  return samples;
}

PredictorLayerReport EvaluatePredictorLayer(const PredictorSet& set, int64_t layer,
                                            const LayerSamples& s,
                                            std::optional<SampleSplit> split, ThreadPool& pool) {
  constexpr int64_t kChunk = 256;
  const int64_t n = s.ffn_dim();
  std::vector<int64_t> ids;
  if (split) {
    ids = IndicesOf(s, *split);
  } else {
    ids.resize(s.size());
    std::iota(ids.begin(), ids.end(), 0);
  }
  std::vector<float> x(kChunk * s.dim()), scores(kChunk * n);
  const float t = set.layer_threshold(layer);
  int64_t tp = 0, fp = 0, fn = 0;
  for (size_t b0 = 0; b0 < ids.size(); b0 += kChunk) {
    const int64_t nb = std::min<int64_t>(kChunk, ids.size() - b0);
    GatherInputs(s, ids.data() + b0, nb, x.data());
    set.Scores(layer, x.data(), nb, scores.data(), pool);
    for (int64_t b = 0; b < nb; ++b) {
      for (int64_t i = 0; i < n; ++i) {
        const bool predicted = scores[b * n + i] >= t;
        const bool active = s.active(ids[b0 + b], i);
        tp += predicted && active;
        fp += predicted && !active;
        fn += !predicted && active;
      }
    }
  }
  const double total = static_cast<double>(ids.size()) * n;
  PredictorLayerReport r;
  r.recall = tp + fn > 0 ? static_cast<float>(static_cast<double>(tp) / (tp + fn)) : 1.0f;
  r.precision = tp + fp > 0 ? static_cast<float>(static_cast<double>(tp) / (tp + fp)) : 1.0f;
  r.predicted_active = total > 0 ? static_cast<float>((tp + fp) / total) : 0.0f;
  r.true_active = total > 0 ? static_cast<float>((tp + fn) / total) : 0.0f;
  return r;
}

int64_t MaxTrainingSteps(const LayerSamples& samples, const PredictorTrainerOptions& options,
                         int64_t n_ranks) {
  int64_t n_train = 0;
  for (int64_t i = 0; i < samples.size(); ++i) n_train += samples.split(i) == SampleSplit::kTrain;
  return n_ranks * options.epochs * StepsPerEpoch(n_train, options.batch);
}

absl::StatusOr<LayerTrainingResult> TrainLayerPredictor(
    const LayerSamples& samples, const PredictorTrainerOptions& options, int64_t layer,
    ThreadPool& pool, const std::function<void(int64_t steps)>& on_steps) {
  const std::vector<int64_t> train = IndicesOf(samples, SampleSplit::kTrain);
  const std::vector<int64_t> calibration = IndicesOf(samples, SampleSplit::kCalibration);
  if (train.empty() || calibration.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", layer, ": no training or calibration samples"));
  }
  const std::vector<int64_t> ranks = RanksToTry(options);
  if (ranks.empty()) return absl::InvalidArgumentError("no rank candidates");
  const float pos_weight =
      options.pos_weight > 0 ? options.pos_weight : AutoPosWeight(samples, train);
  const int64_t batch = std::min<int64_t>(options.batch, static_cast<int64_t>(train.size()));
  const int64_t steps_per_epoch = StepsPerEpoch(static_cast<int64_t>(train.size()), batch);
  const int64_t total_steps = steps_per_epoch * options.epochs;

  const std::vector<float> input_scale = InputScale(samples, train);
  LayerTrainingResult result;
  std::unique_ptr<Trainee> best;
  for (size_t c = 0; c < ranks.size(); ++c) {
    auto net = std::make_unique<Trainee>(samples.dim(), ranks[c], samples.ffn_dim(), batch);
    net->input_scale = input_scale;
    net->Init(StreamSeed(options.seed, layer, ranks[c], 1));
    std::vector<int64_t> order = train;
    double epoch_loss = 0;
    int64_t t = 0;
    for (int e = 0; e < options.epochs; ++e) {
      Rng rng(StreamSeed(options.seed, layer, ranks[c], 100 + e));
      for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.Next() % i]);
      epoch_loss = 0;
      for (int64_t s = 0; s < steps_per_epoch; ++s) {
        const int64_t b0 = s * batch;
        const int64_t nb = std::min<int64_t>(batch, static_cast<int64_t>(order.size()) - b0);
        GatherInputs(samples, order.data() + b0, nb, net->x.data(), &net->input_scale);
        const double progress = static_cast<double>(t) / static_cast<double>(total_steps);
        const float lr = options.learning_rate *
                         (kFinalLrShare + (1 - kFinalLrShare) * 0.5f *
                                              static_cast<float>(1 + std::cos(M_PI * progress)));
        ++t;
        epoch_loss += net->Step(samples, order.data() + b0, nb, pos_weight, lr, t,
                                /*want_loss=*/e + 1 == options.epochs, pool) *
                      nb;
      }
      epoch_loss /= static_cast<double>(order.size());
      if (!std::isfinite(epoch_loss)) {
        return absl::InternalError(
            absl::StrCat("layer ", layer, " rank ", ranks[c],
                         ": the training loss diverged (try a smaller --lr)"));
      }
      if (on_steps) on_steps(steps_per_epoch);
    }
    const Calibration cal = Calibrate(*net, samples, calibration, options.recall_target, pool);
    result.trials.push_back({ranks[c], cal.precision, cal.threshold, epoch_loss});
    // Keep the previous (smaller) rank when this one adds too little precision.
    if (c > 0 &&
        cal.precision - result.trials[c - 1].calibration_precision < options.rank_tolerance) {
      if (on_steps) on_steps(static_cast<int64_t>(ranks.size() - 1 - c) * total_steps);
      break;
    }
    best = std::move(net);
    result.threshold = cal.threshold;
  }
  result.weights.rank = best->rank;
  for (int64_t k = 0; k < best->rank; ++k) {
    for (int64_t j = 0; j < best->dim; ++j) best->w1[k * best->dim + j] *= input_scale[j];
  }
  result.weights.fc1 = std::move(best->w1);
  result.weights.fc2 = std::move(best->w2);
  return result;
}

absl::StatusOr<PredictorTrainingSummary> TrainPredictors(const Model& model,
                                                         std::span<const int32_t> tokens,
                                                         const PredictorTrainerOptions& options,
                                                         ThreadPool& pool) {
  const ModelConfig& config = model.config();
  PredictorTrainerOptions o = options;
  if (o.rank == 0 && o.rank_candidates.empty()) {
    o.rank_candidates = DefaultRankCandidates(config, o.type);
  }
  TC_ASSIGN_OR_RETURN(std::vector<LayerSamples> samples,
                      CollectPredictorSamples(model, tokens, o, pool));
  PredictorTrainingSummary summary;
  for (int64_t i = 0; i < samples[0].size(); ++i) {
    switch (samples[0].split(i)) {
      case SampleSplit::kTrain:
        ++summary.train_samples;
        break;
      case SampleSplit::kCalibration:
        ++summary.calibration_samples;
        break;
      case SampleSplit::kTest:
        ++summary.test_samples;
        break;
    }
  }

  const int64_t n_ranks = static_cast<int64_t>(RanksToTry(o).size());
  std::unique_ptr<ProgressBar> bar;
  int64_t done = 0;
  if (o.progress) {
    bar = std::make_unique<ProgressBar>("train-predictor: training",
                                        MaxTrainingSteps(samples[0], o, n_ranks) * config.n_layers,
                                        "steps");
  }
  for (int64_t l = 0; l < config.n_layers; ++l) {
    TC_ASSIGN_OR_RETURN(LayerTrainingResult r,
                        TrainLayerPredictor(samples[l], o, l, pool, [&](int64_t steps) {
                          done += steps;
                          if (bar)
                            bar->Update(done, absl::StrCat("layer ", l + 1, "/", config.n_layers));
                        }));
    summary.layers.push_back(std::move(r));
  }
  if (bar) bar->Finish();

  // One global threshold when every layer's can be reached by scaling fc2 by a positive factor
  // (the score is linear in fc2); the geometric mean keeps the factors near 1.
  std::vector<float> thresholds;
  for (const LayerTrainingResult& r : summary.layers) thresholds.push_back(r.threshold);
  const bool all_positive =
      std::all_of(thresholds.begin(), thresholds.end(), [](float t) { return t > 1e-6f; });
  const bool all_negative =
      std::all_of(thresholds.begin(), thresholds.end(), [](float t) { return t < -1e-6f; });
  float lo = std::numeric_limits<float>::max(), hi = 0;
  for (float t : thresholds) {
    lo = std::min(lo, std::abs(t));
    hi = std::max(hi, std::abs(t));
  }
  std::vector<PredictorWeights> weights;
  for (LayerTrainingResult& r : summary.layers) weights.push_back(r.weights);
  float global;
  if ((all_positive || all_negative) && hi <= lo * 1e4f) {
    double log_sum = 0;
    for (float t : thresholds) log_sum += std::log(std::abs(t));
    global = static_cast<float>((all_positive ? 1 : -1) * std::exp(log_sum / thresholds.size()));
    for (int64_t l = 0; l < config.n_layers; ++l) {
      const float scale = global / thresholds[l];
      for (float& w : weights[l].fc2) w *= scale;
    }
    summary.folded = true;
    TC_ASSIGN_OR_RETURN(summary.predictors,
                        PredictorSet::FromWeights(weights, config, o.type, global));
  } else {
    // PowerInfer reads only the global threshold: the most permissive keeps every layer's
    // recall at or above the target there, at some cost in precision.
    global = *std::min_element(thresholds.begin(), thresholds.end());
    TC_ASSIGN_OR_RETURN(summary.predictors,
                        PredictorSet::FromWeights(weights, config, o.type, global));
    TC_RETURN_IF_ERROR(summary.predictors.set_layer_thresholds(thresholds));
  }

  PredictorReport report;
  report.training_tokens = summary.train_samples;
  report.recall_target = o.recall_target;
  report.criterion = IsReluFamily(config.activation) ? "relu" : "magnitude";
  for (int64_t l = 0; l < config.n_layers; ++l) {
    report.layers.push_back(
        EvaluatePredictorLayer(summary.predictors, l, samples[l], SampleSplit::kTest, pool));
  }
  summary.predictors.set_report(std::move(report));
  return summary;
}

}  // namespace thermocline
