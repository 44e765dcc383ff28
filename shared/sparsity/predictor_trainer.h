// Training PowerInfer-style activation predictors (predictor.h) from a model's own FFN activity.
//
// 1. Collect: the dense model runs over corpus windows; an FfnObserver keeps, per layer and
//    token, the FFN input h (as f16) and the true active mask (as bits): ReLU models
//    relu(gate) > 0, SiLU models |silu(gate)| >= the layer's magnitude cut (activation_stats.h).
//    Tokens are split into train / calibration / test in blocks of kSplitBlockTokens
//    consecutive positions, so neighbouring (strongly correlated) tokens stay on one side.
// 2. Train, per layer: fc1 (dim -> rank) and fc2 (rank -> ffn_dim), ReLU between, no bias, by
//    Adam on binary cross-entropy of the logit (score - 1) whose positive term is weighted by
//    pos_weight (> 1 favours recall), learning rate cosine-decayed to 10% over the run. The
//    offset of 1 puts the calibrated thresholds well above 0 (the score has no bias term), which
//    lets step 4 fold them into one global threshold. Inputs are scaled to unit RMS per
//    dimension while training (deeper layers' dimensions differ in scale by orders of
//    magnitude) and the scale is folded into fc1's columns. The batch GEMMs run on the
//    thread pool through MatMul; every reduction has a fixed order, so the result depends only
//    on the options and the data, never on the thread count or timing.
// 3. Rank, when not given: candidates are trained in ascending order and the first one whose
//    calibration precision (at the recall target) is within rank_tolerance of the next
//    candidate's is kept, or the largest.
// 4. Threshold: on the calibration tokens, the largest threshold whose recall reaches the target
//    plus two standard errors of that recall (taken over blocks of tokens, which fire together),
//    so that the recall on unseen tokens still reaches the target.
//    If every layer's threshold has the same sign, each layer's fc2 is scaled so that one
//    global threshold, which is all PowerInfer reads, is exact for every layer; otherwise the
//    per-layer thresholds are stored too and the global one is the most permissive of them.
// 5. Report: recall, precision, predicted and true active shares per layer on the test tokens,
//    measured with the weights as stored (f16 by default).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shared/model/model.h"
#include "shared/sparsity/predictor.h"
#include "shared/util/thread_pool.h"

namespace thermocline {

inline constexpr int64_t kSplitBlockTokens = 64;

struct PredictorTrainerOptions {
  int64_t window = 256;  // positions per corpus window, BOS included
  // Samples kept per layer (memory: dim * 2 + ffn_dim / 8 bytes each); the corpus is cut to fit.
  int64_t max_samples_per_layer = 1 << 18;
  int64_t rank = 0;                      // 0: chosen per layer from rank_candidates
  std::vector<int64_t> rank_candidates;  // empty: DefaultRankCandidates
  float rank_tolerance = 0.02f;          // precision gain that justifies the next larger rank
  int epochs = 10;
  // Higher than the usual 1e-3: these small nets are step-limited, and 3e-3 trained better
  // predictors on every model measured (dim 64 to 512; docs/offline-pipeline.md).
  float learning_rate = 3e-3f;
  int64_t batch = 256;
  float pos_weight =
      0;  // weight of the positive (active) term; 0: sqrt((1 - p) / p), p = active share
  float recall_target = 0.95f;
  float holdout = 0.1f;  // share of tokens held out: half calibrates the threshold, half tests
  uint64_t seed = 1;
  GgmlType type = GgmlType::kF16;  // storage of fc1 / fc2
  // SiLU models: |silu(gate)| >= magnitude_cuts[layer] is active. Must be empty for ReLU models.
  std::vector<float> magnitude_cuts;
  bool progress = false;  // progress bars with ETA on stderr
};

// Checks option ranges against the model; errors name the option.
absl::Status ValidatePredictorTrainerOptions(const PredictorTrainerOptions& options,
                                             const ModelConfig& config);

// dim/16, dim/8, dim/4, dim/2, 3*dim/4, dim, rounded up to multiples of 16 (32 for quantized
// storage), at least 16, without duplicates. The search stops at the first candidate that adds
// less than rank_tolerance precision, so the large ones are trained only when the smaller keep
// paying (layer 1 of stories-relu260K, precision at recall 0.95 for ranks 16, 32, 48, 64:
// 0.34, 0.59, 0.86, 1.00; docs/offline-pipeline.md).
std::vector<int64_t> DefaultRankCandidates(const ModelConfig& config, GgmlType type);

enum class SampleSplit : uint8_t { kTrain = 0, kCalibration = 1, kTest = 2 };

// The split of the token at `index` in the sample stream: in every group of
// round(2 / holdout) blocks, one seeded block calibrates and another tests.
SampleSplit SplitOfSample(int64_t index, float holdout, uint64_t seed);

// (FFN input, active mask) pairs of one layer, in corpus order.
class LayerSamples {
 public:
  LayerSamples(int64_t dim, int64_t ffn_dim)
      : dim_(dim), ffn_dim_(ffn_dim), words_((ffn_dim + 63) / 64) {}

  void Reserve(int64_t n);
  // `mask`: words() 64-bit words, bit i of word i / 64 set when neuron i is active.
  void Add(const float* h, const uint64_t* mask, SampleSplit split);

  int64_t size() const { return static_cast<int64_t>(split_.size()); }
  int64_t dim() const { return dim_; }
  int64_t ffn_dim() const { return ffn_dim_; }
  int64_t words() const { return words_; }
  SampleSplit split(int64_t i) const { return static_cast<SampleSplit>(split_[i]); }
  const uint64_t* mask(int64_t i) const { return mask_.data() + i * words_; }
  bool active(int64_t i, int64_t neuron) const {
    return (mask(i)[neuron >> 6] >> (neuron & 63)) & 1;
  }
  void GetInput(int64_t i, float* h) const;  // h: [dim]
  int64_t bytes() const;

 private:
  int64_t dim_, ffn_dim_, words_;
  std::vector<uint16_t> h_;  // f16 [n][dim]
  std::vector<uint64_t> mask_;
  std::vector<uint8_t> split_;
};

// Runs the model over `tokens` in windows and returns one LayerSamples per layer.
absl::StatusOr<std::vector<LayerSamples>> CollectPredictorSamples(
    const Model& model, std::span<const int32_t> tokens,
    const PredictorTrainerOptions& options, ThreadPool& pool);

// Recall, precision and active shares of `set`'s layer on the samples of one split, or on every
// sample (nullopt: samples of text the predictors never saw, e.g. `--eval-corpus`).
PredictorLayerReport EvaluatePredictorLayer(const PredictorSet& set, int64_t layer,
                                            const LayerSamples& samples,
                                            std::optional<SampleSplit> split, ThreadPool& pool);

struct RankTrial {
  int64_t rank = 0;
  float calibration_precision = 0;  // at the calibrated threshold
  float threshold = 0;
  double final_loss = 0;  // mean training loss of the last epoch
};

struct LayerTrainingResult {
  PredictorWeights weights;       // f32, before any threshold folding
  float threshold = 0;            // calibrated for the recall target
  std::vector<RankTrial> trials;  // every rank trained, ascending; the chosen one is `weights`
};

// Trains one layer's predictor (steps 2-4 above, before folding). `on_steps(n)` reports n more
// optimizer steps done, or skipped when the rank search stops early, for progress bars; the
// calls add up to MaxTrainingSteps.
absl::StatusOr<LayerTrainingResult> TrainLayerPredictor(
    const LayerSamples& samples, const PredictorTrainerOptions& options, int64_t layer,
    ThreadPool& pool, const std::function<void(int64_t steps)>& on_steps = nullptr);

// Optimizer steps TrainLayerPredictor takes at most on `samples` (for progress totals).
int64_t MaxTrainingSteps(const LayerSamples& samples, const PredictorTrainerOptions& options,
                         int64_t n_ranks);

struct PredictorTrainingSummary {
  PredictorSet predictors;  // report filled with the test-split measurements
  std::vector<LayerTrainingResult> layers;
  int64_t train_samples = 0, calibration_samples = 0, test_samples = 0;
  bool folded = false;  // per-layer thresholds were folded into fc2 (one global threshold)
};

// Collects, trains every layer, calibrates, folds and evaluates (steps 1-5 above).
absl::StatusOr<PredictorTrainingSummary> TrainPredictors(const Model& model,
                                                         std::span<const int32_t> tokens,
                                                         const PredictorTrainerOptions& options,
                                                         ThreadPool& pool);

}  // namespace thermocline
