#include "gpu_worker/cuda/cuda_backend.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"
#include "gpu_worker/cuda/cuda_util.h"
#include "gpu_worker/cuda/kernels.h"
#include "shared/ipc/futex.h"
#include "shared/kernels/matmul.h"
#include "shared/runtime/ffn.h"
#include "shared/runtime/layer_program.h"
#include "shared/runtime/ops.h"
#include "shared/sparsity/neuron_ffn.h"
#include "shared/util/fp16.h"
#include "shared/util/thread_pool.h"

namespace thermocline::gpu_worker {
namespace cuda {
namespace {

// Rows [0, n) of `m` (or rows ids[0..n) when ids is set) as fp16, converted on the pool: the
// dense products run in cuBLAS with fp16 inputs, whatever the file stores (docs/cuda.md).
std::vector<uint16_t> RowsToF16(const MatrixView& m, const int32_t* ids, int64_t n,
                                ThreadPool& pool) {
  std::vector<uint16_t> out(n * m.cols);
  pool.Run([&](int tid, int nth) {
    std::vector<float> row(m.cols);
    for (int64_t r = tid; r < n; r += nth) {
      DequantizeMatrixRow(m, ids ? ids[r] : r, row.data());
      uint16_t* o = out.data() + r * m.cols;
      for (int64_t c = 0; c < m.cols; ++c) o[c] = Fp32ToFp16(row[c]);
    }
  });
  return out;
}

absl::StatusOr<CudaArray<uint16_t>> UploadF16(const MatrixView& m, ThreadPool& pool) {
  const std::vector<uint16_t> h = RowsToF16(m, nullptr, m.rows, pool);
  CudaArray<uint16_t> d;
  TC_RETURN_IF_ERROR(d.Allocate(h.size()));
  TC_RETURN_IF_ERROR(d.Upload(h.data(), h.size()));
  return d;
}

// An empty vector (an absent norm or bias) stays an empty array: a null pointer, no copy.
template <typename T>
absl::StatusOr<CudaArray<T>> UploadVector(const std::vector<T>& v) {
  CudaArray<T> d;
  if (v.empty()) return d;
  TC_RETURN_IF_ERROR(d.Allocate(v.size()));
  TC_RETURN_IF_ERROR(d.Upload(v.data(), v.size()));
  return d;
}

// The block types the hot FFN kernels read as the file stores them (block_decode.h); rows of
// any other type are converted to fp16 at load.
WeightFormat NativeKind(GgmlType t) {
  switch (t) {
    case GgmlType::kQ8_0:
      return WeightFormat::kQ8_0;
    case GgmlType::kQ4_0:
      return WeightFormat::kQ4_0;
    case GgmlType::kQ4_1:
      return WeightFormat::kQ4_1;
    case GgmlType::kQ5_0:
      return WeightFormat::kQ5_0;
    case GgmlType::kQ5_1:
      return WeightFormat::kQ5_1;
    case GgmlType::kQ2_K:
      return WeightFormat::kQ2_K;
    case GgmlType::kQ3_K:
      return WeightFormat::kQ3_K;
    case GgmlType::kQ4_K:
      return WeightFormat::kQ4_K;
    case GgmlType::kQ5_K:
      return WeightFormat::kQ5_K;
    case GgmlType::kQ6_K:
      return WeightFormat::kQ6_K;
    case GgmlType::kIQ4_NL:
      return WeightFormat::kIQ4_NL;
    case GgmlType::kIQ4_XS:
      return WeightFormat::kIQ4_XS;
    default:
      return WeightFormat::kF16;
  }
}

// How a layer's hot rows are stored: gate and up (one kernel reads both) in their own blocks
// when they share a type, down rows in theirs (Q4_K_M files: q4_K gate/up, q6_K or q5_0 down).
struct HotKinds {
  WeightFormat gate_up = WeightFormat::kF16, down = WeightFormat::kF16;
};
HotKinds KindsOf(const MatrixView& gate, const MatrixView& up, const MatrixView& down_t) {
  HotKinds k;
  if (gate.empty() || gate.type == up.type) k.gate_up = NativeKind(up.type);
  k.down = NativeKind(down_t.type);
  return k;
}

// Bytes of one stored row of `dim` values of `type` in `kind`'s storage.
int64_t HotRowBytes(WeightFormat kind, GgmlType type, int64_t dim) {
  return kind == WeightFormat::kF16 ? dim * 2 : RowBytes(type, dim);
}

// kernels.h names the activations without arch.h (it is plain C++17 for nvcc), by the same
// numbers.
static_assert(static_cast<int>(HotAct::kSilu) == static_cast<int>(FfnActivation::kSilu) &&
              static_cast<int>(HotAct::kRelu) == static_cast<int>(FfnActivation::kRelu) &&
              static_cast<int>(HotAct::kGelu) == static_cast<int>(FfnActivation::kGelu) &&
              static_cast<int>(HotAct::kDrelu) == static_cast<int>(FfnActivation::kDrelu));
HotAct ToHotAct(FfnActivation a) { return static_cast<HotAct>(static_cast<int>(a)); }

// The rows `ids` of m in `kind`'s storage, back to back.
std::vector<uint8_t> GatherHotRows(const MatrixView& m, const std::vector<int32_t>& ids,
                                   WeightFormat kind, ThreadPool& pool) {
  const int64_t n = static_cast<int64_t>(ids.size());
  if (kind == WeightFormat::kF16) {
    std::vector<uint16_t> h = RowsToF16(m, ids.data(), n, pool);
    std::vector<uint8_t> out(h.size() * 2);
    std::memcpy(out.data(), h.data(), out.size());
    return out;
  }
  std::vector<uint8_t> out(n * m.row_bytes);
  for (int64_t k = 0; k < n; ++k) std::memcpy(out.data() + k * m.row_bytes, m.row(ids[k]), m.row_bytes);
  return out;
}

// A dense matrix on the device: the file's own blocks where block_decode.h reads them (a
// decode-sized product is one BlockGemv kernel; a prompt-sized one converts row chunks to fp16
// for cuBLAS), else fp16.
struct DeviceMatrix {
  WeightFormat format = WeightFormat::kF16;
  int64_t rows = 0, cols = 0, row_bytes = 0;
  CudaArray<uint8_t> data;
  const uint16_t* half() const { return reinterpret_cast<const uint16_t*>(data.get()); }
};

// Up to this many tokens a product over a matrix in blocks is one BlockGemv kernel (each row read
// once for all of them); above, cuBLAS over fp16 chunks.
constexpr int64_t kGemvTokens = 8;

// Bytes m takes on the device.
int64_t DeviceBytes(const MatrixView& m) {
  const WeightFormat f = NativeKind(m.type);
  return m.rows * HotRowBytes(f, m.type, m.cols);
}

absl::StatusOr<DeviceMatrix> UploadMatrix(const MatrixView& m, ThreadPool& pool) {
  DeviceMatrix d;
  d.format = NativeKind(m.type);
  d.rows = m.rows;
  d.cols = m.cols;
  d.row_bytes = HotRowBytes(d.format, m.type, m.cols);
  std::vector<int32_t> all(m.rows);
  for (int64_t r = 0; r < m.rows; ++r) all[r] = static_cast<int32_t>(r);
  TC_ASSIGN_OR_RETURN(d.data, UploadVector(GatherHotRows(m, all, d.format, pool)));
  return d;
}

struct DeviceLayer {
  // Norms and biases as the model description has them (model.h LayerWeights); an absent one
  // is an empty array (null pointer), and the layer program never asks for it.
  CudaArray<float> attn_norm, attn_norm_b, ffn_norm, ffn_norm_b, post_attn_norm, post_ffn_norm;
  CudaArray<float> q_norm, k_norm;
  int64_t q_norm_span = 0, k_norm_span = 0;
  CudaArray<float> bq, bk, bv, bo;
  DeviceMatrix wq, wk, wv, wo;
  // Hot FFN rows, compacted: row k belongs to neuron partition.hot[k]; no gate rows in an FFN
  // without a gate.
  HotKinds kinds;
  int64_t n_hot = 0, row_bytes = 0, down_row_bytes = 0;
  CudaArray<uint8_t> gate, up, down;
  CudaArray<float> up_b;    // the hot neurons' up biases, compacted like the rows
  CudaArray<float> down_b;  // [dim], added once to the merged hot + cold output
  // MoE layers: every expert's hot rows, then the shared expert's whole (it stays here, as in
  // the host backend), back to back; expert e's are rows [expert_begin[e], expert_begin[e + 1]).
  bool moe = false;
  std::vector<int64_t> expert_begin;
  int64_t shared_begin = 0, shared_rows = 0;
  CudaArray<float> row_cut;  // threshold MoE layers: [n_hot][2] (cut, coefficient cut)
  CudaArray<int32_t> hot_iota;  // 0..n_hot-1: every hot neuron is a candidate
  // Predicted layers: hot_slot[i] = compact hot index of neuron i, or -1 when cold; the predictor.
  CudaArray<int32_t> hot_slot;
  CudaArray<uint16_t> fc1, fc2;
  int64_t rank = 0;
};

// Device bytes of the whole plan, itemized for the refusal message and the load report.
struct MemoryPlan {
  int64_t attention = 0, head = 0, norms = 0, predictors = 0, hot_ffn = 0, kv = 0, scratch = 0;
  int64_t total() const { return attention + head + norms + predictors + hot_ffn + kv + scratch; }
  std::string ToString() const {
    auto mib = [](int64_t b) { return absl::StrFormat("%.1f MiB", b / 1048576.0); };
    return absl::StrCat("attention ", mib(attention), ", output head ", mib(head), ", norms ",
                        mib(norms), ", predictors ", mib(predictors), ", hot FFN ", mib(hot_ffn),
                        ", KV cache ", mib(kv), ", scratch ", mib(scratch));
  }
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(const Model& model, SparsityPlan plan, Partition partition,
              const CudaBackendOptions& options)
      : model_(model), plan_(std::move(plan)), partition_(std::move(partition)), options_(options) {}
  ~CudaBackend() override;

  absl::Status Init();

  std::string_view name() const override { return "cuda"; }
  const BackendLimits& limits() const override { return limits_; }
  // Records the batch; FinishStep enqueues and runs it. Every layer with cold neurons blocks the
  // host on the cold round trip anyway, so splitting the enqueue across the two calls would buy
  // nothing; within a layer the device keeps computing while the host waits (docs/cuda.md).
  absl::Status StartStep(std::span<const BatchEntry> batch, ColdLink& cold) override;
  absl::Status FinishStep(std::vector<float>* logits) override;
  void SetMetrics(ipc::WorkerMetricsWriter* metrics) override { metrics_ = metrics; }

  // ---- the layer program's operations (shared/runtime/layer_program.h) on device buffers ----
  // Each enqueues on compute_; only Ffn (the cold round trip) and Head wait.
  absl::Status Embed(float scale);
  absl::Status Norm(int64_t l, NormWeights which, NormKind kind, Act in, Act out);
  absl::Status Project(int64_t l, Projection p, Act in, Act out);
  absl::Status ProjectQkv(int64_t l, Act in) {
    TC_RETURN_IF_ERROR(Project(l, Projection::kQ, in, Act::kQ));
    TC_RETURN_IF_ERROR(Project(l, Projection::kK, in, Act::kK));
    return Project(l, Projection::kV, in, Act::kV);
  }
  absl::Status AddBias(int64_t l, Projection p, Act a);
  absl::Status HeadNorm(int64_t l, NormWeights which, Act a);
  absl::Status RopeAndStore(int64_t l);
  absl::Status Attend(int64_t l, Act out);
  absl::Status Ffn(int64_t l, Act in, Act predictor_in, Act out);
  absl::Status AddResidual(Act a);
  absl::Status AddResidual(Act a, Act b);
  absl::StatusOr<bool> LayerDone(int64_t l);
  absl::Status Head(NormKind kind, float final_softcap);

 private:
  MemoryPlan Plan() const;
  // fp16 elements of wscratch_: the largest attention matrix, when some dense matrix keeps its
  // blocks; 0 otherwise.
  int64_t WeightScratchElems() const;
  absl::Status Validate(std::span<const BatchEntry> batch) const;
  absl::Status RunStep(std::vector<float>* logits);
  // An MoE layer's device part: the hot rows of the experts and the shared expert.
  absl::Status InitMoeLayer(int64_t l, ThreadPool& pool);
  // Ffn of an MoE layer: routing on the host (RouteExperts, as the host backend), then every
  // row's picked experts' hot rows and the shared expert as one candidate list, each candidate
  // weighted by its expert's router weight (or the shared gate).
  absl::Status MoeFfn(int64_t l, Act in, Act out);
  // The cold round trip of layer l over h_pin_ (already on the host), its partial added to y,
  // then the down bias. `request` is sent when set.
  absl::Status FinishCold(int64_t l, const ColdRequest* request, float* y);
  // The hot FFN's arguments every layer shares: layer l's rows, the filter, h, y and the
  // scratch; the caller sets the candidates (idx, counts or fixed_count, scale).
  HotFfnArgs HotArgs(int64_t l, const NeuronFilter& filter, const float* h, float* y);
  // The f32 buffer of an activation, its width, and its fp16 copy for cuBLAS (null for those
  // no product reads). Half() converts on first use after the f32 values changed.
  float* F32(Act a) const;
  int64_t Width(Act a) const;
  uint16_t* HalfBuffer(Act a) const;
  absl::StatusOr<const uint16_t*> Half(Act a);
  // y[t][r] = W x[t] for n rows (ldy = m.rows); x in f32 and, for fp16 and prompt-sized
  // products, fp16 (x_half).
  absl::Status Product(const DeviceMatrix& m, const float* x, const uint16_t* x_half, int64_t n,
                       float* y);
  void Wrote(Act a) { half_ok_[static_cast<int>(a)] = false; }

  const Model& model_;
  SparsityPlan plan_;
  Partition partition_;
  CudaBackendOptions options_;
  BackendLimits limits_;
  int64_t context_ = 0, max_rank_ = 0;
  ipc::WorkerMetricsWriter* metrics_ = nullptr;

  cudaStream_t compute_ = nullptr;  // every kernel and GEMM
  cudaStream_t copy_ = nullptr;     // h and the cold ids out, y_cold in
  cudaEvent_t ffn_in_ = nullptr, copied_ = nullptr, cold_in_ = nullptr;
  cublasHandle_t blas_ = nullptr;

  std::vector<DeviceLayer> layers_;
  DeviceMatrix output_;
  CudaArray<float> output_norm_, output_norm_b_;
  CudaArray<float> rope_freqs_;
  RopeDesc rope_;  // the model's RoPE; the base is set per layer
  CudaArray<uint8_t> k_cache_, v_cache_;
  KvDesc kv_;
  std::vector<int64_t> length_;  // valid positions per slot

  // Scratch, sized for max_batch rows. Activations (Act): x_ kX, h_ kNormed, q_/k_/v_, att_
  // kAtt, ao_ kAttnOut, y_hot_ kFfnOut (the hot FFN's output, the cold partial added to it).
  CudaArray<float> x_, q_, k_, v_, att_, h_, ao_, y_hot_, y_cold_, pred_mid_, scores_,
      att_scores_, coeff_, logits_;
  CudaArray<uint16_t> xh_, atth_, hh_, pred_mid_h_;
  // Quantized dense matrices as fp16, a chunk of rows at a time, for prompt-sized products.
  CudaArray<uint16_t> wscratch_;
  int64_t wscratch_elems_ = 0;
  CudaArray<int32_t> slots_, positions_, row_map_, hot_idx_, hot_count_, cold_ids_, cold_count_,
      packed_;
  CudaArray<uint32_t> row_end_, stats_;
  // Pinned staging: the ColdLink takes host spans and copies them into (or out of) the ring, so
  // the DMA targets these buffers rather than the ring itself (docs/cuda.md, "Host copies").
  PinnedArray<float> x_pin_, h_pin_, y_cold_pin_, logits_pin_;
  PinnedArray<int32_t> ids_pin_, step_pin_;  // step_pin_: slots, positions, row map
  PinnedArray<uint32_t> row_end_pin_, stats_pin_;

  // MoE: routing on the host, candidate lists staged in pinned memory for the device.
  ThreadPool route_pool_{1};
  std::vector<float> route_probs_, pick_w_;
  std::vector<int32_t> picks_;
  CudaArray<float> cand_scale_;
  PinnedArray<int32_t> cand_pin_, count_pin_;
  PinnedArray<float> scale_pin_;
  int64_t max_cand_ = 0;  // the most candidates a row can have in any layer

  std::vector<BatchEntry> batch_;
  ColdLink* cold_ = nullptr;
  int64_t n_ = 0, n_out_ = 0;  // the running step's rows, and those that want logits
  bool half_ok_[8] = {};       // by Act: its fp16 copy holds its current values
  int64_t mark_ns_ = 0;
};

CudaBackend::~CudaBackend() {
  // Pending work must finish before its buffers are freed by the members' destructors; errors
  // here have nowhere to go and the process is tearing the backend down.
  if (compute_) cudaStreamSynchronize(compute_);
  if (copy_) cudaStreamSynchronize(copy_);
  if (blas_) cublasDestroy(blas_);
  for (cudaEvent_t e : {ffn_in_, copied_, cold_in_}) {
    if (e) cudaEventDestroy(e);
  }
  if (compute_) cudaStreamDestroy(compute_);
  if (copy_) cudaStreamDestroy(copy_);
}

MemoryPlan CudaBackend::Plan() const {
  const ModelConfig& c = model_.config();
  MemoryPlan p;
  const int64_t b = options_.max_batch;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = model_.layer(l);
    p.attention += DeviceBytes(w.wq) + DeviceBytes(w.wk) + DeviceBytes(w.wv) + DeviceBytes(w.wo);
  }
  p.head = DeviceBytes(model_.output());
  p.norms = 4 * (2 * c.dim + static_cast<int64_t>(model_.rope_freqs().size()));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = model_.layer(l);
    for (const std::vector<float>* v :
         {&w.attn_norm, &w.attn_norm_b, &w.ffn_norm, &w.ffn_norm_b, &w.post_attn_norm,
          &w.post_ffn_norm, &w.q_norm, &w.k_norm, &w.bq, &w.bk, &w.bv, &w.bo, &w.down_b}) {
      p.norms += 4 * static_cast<int64_t>(v->size());
    }
    if (c.layers[l].moe) continue;  // below, with the MoE scratch
    const MatrixView& down = w.has_down_t ? w.down_t : w.down;
    const int64_t n_hot = static_cast<int64_t>(partition_.layers[l].hot.size());
    // DownRows keeps the model's type for down_t (a transposed quantized copy is requantized
    // to the same type), so the kind follows from gate, up and down's types.
    const HotKinds kinds = KindsOf(w.gate, w.up, down);
    const int64_t gate_up = w.gate.empty() ? 1 : 2;
    p.hot_ffn += n_hot * (gate_up * HotRowBytes(kinds.gate_up, w.up.type, c.dim) +
                          HotRowBytes(kinds.down, down.type, c.dim)) +
                 4 * n_hot;
    if (!w.up_b.empty()) p.hot_ffn += 4 * n_hot;
    if (plan_.mode(l) == SparsityMode::kPredicted) {
      const int64_t rank = plan_.predictors->layer(l).rank;
      p.predictors += 2 * (rank * c.dim + c.ffn_dim * rank) + 4 * c.ffn_dim;
    }
  }
  const int64_t kv_elem = options_.kv_type == GgmlType::kF16 ? 2 : 4;
  p.kv = 2 * c.n_layers * options_.n_kv_slots * context_ * c.kv_dim * kv_elem;
  int64_t max_hot = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    int64_t rows = static_cast<int64_t>(partition_.layers[l].hot.size());
    if (c.layers[l].moe) rows += c.shared_expert_ffn_dim;
    max_hot = std::max(max_hot, rows);
  }
  if (c.moe()) {
    // MoE shares hot_idx_ and adds a weight per candidate (device and pinned) and its indices
    // pinned.
    p.scratch += 4 * b * 3 * std::max<int64_t>(max_hot, 1);
    for (int64_t l = 0; l < c.n_layers; ++l) {
      if (!c.layers[l].moe) continue;
      const LayerWeights& w = model_.layer(l);
      const LayerPartition& part = partition_.layers[l];
      const HotKinds k = KindsOf(w.experts[0].gate, w.experts[0].up, w.experts[0].down);
      p.hot_ffn += static_cast<int64_t>(part.hot.size()) *
                   (2 * HotRowBytes(k.gate_up, w.experts[0].up.type, c.dim) +
                    HotRowBytes(k.down, w.experts[0].down.type, c.dim));
      if (!w.shared.up.empty()) {
        p.hot_ffn += c.shared_expert_ffn_dim * 3 * c.dim * 2;  // an upper bound: fp16
      }
      if (plan_.mode(l) == SparsityMode::kThreshold) {
        p.hot_ffn += 8 * (static_cast<int64_t>(part.hot.size()) + c.shared_expert_ffn_dim);
      }
    }
  }
  // The allocations of Init, per row of the batch: f32, fp16 and int32 buffers (added to the
  // MoE scratch above).
  p.scratch += 4 * b * (5 * c.dim + 2 * c.q_dim + 2 * c.kv_dim + max_rank_ + c.ffn_dim +
                       c.n_heads * context_ + std::max<int64_t>(max_hot, 1) + c.vocab_size) +
              2 * b * (2 * c.dim + c.q_dim + max_rank_) + 4 * b * (6 + 3 * c.ffn_dim) +
              8 * c.n_layers + 2 * WeightScratchElems();
  return p;
}

int64_t CudaBackend::WeightScratchElems() const {
  const ModelConfig& c = model_.config();
  bool blocks = NativeKind(model_.output().type) != WeightFormat::kF16;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = model_.layer(l);
    for (const MatrixView* m : {&w.wq, &w.wk, &w.wv, &w.wo}) {
      blocks |= NativeKind(m->type) != WeightFormat::kF16;
    }
  }
  if (!blocks) return 0;
  return std::max({c.q_dim, c.kv_dim, c.dim}) * std::max(c.dim, c.q_dim);
}

absl::Status CudaBackend::Init() {
  const ModelConfig& c = model_.config();
  context_ = options_.context > 0 ? options_.context : c.context_length;
  if (options_.n_kv_slots < 1) return absl::InvalidArgumentError("--kv-slots must be >= 1");
  if (options_.max_batch < 1) return absl::InvalidArgumentError("--max-batch must be >= 1");
  if (options_.threads < 1) return absl::InvalidArgumentError("--threads must be >= 1");
  if (options_.vram_budget < 0) return absl::InvalidArgumentError("--vram-budget must be >= 0");
  if (context_ > c.context_length) {
    return absl::InvalidArgumentError(absl::StrCat("--context ", context_,
                                                   " exceeds the model's context length ",
                                                   c.context_length));
  }
  if (options_.kv_type != GgmlType::kF32 && options_.kv_type != GgmlType::kF16) {
    return absl::InvalidArgumentError("the CUDA backend's KV cache is f32 or f16");
  }
  if (c.dim % 32 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the CUDA backend needs a model dim that is a multiple of 32 (its FFN kernels read rows "
        "in blocks of 32); this model's dim is ",
        c.dim));
  }
  TC_RETURN_IF_ERROR(plan_.Validate(c));
  if (static_cast<int64_t>(partition_.layers.size()) != c.n_layers) {
    return absl::InvalidArgumentError("cuda backend: partition and model disagree on layers");
  }
  for (int64_t l = 0; l < c.n_layers; ++l) {
    if (plan_.mode(l) == SparsityMode::kPredicted) {
      max_rank_ = std::max(max_rank_, plan_.predictors->layer(l).rank);
    }
  }

  TC_RETURN_IF_ERROR(CudaAvailable());
  TC_CUDA(cudaSetDevice(options_.device));
  size_t free_b = 0, total_b = 0;
  TC_CUDA(cudaMemGetInfo(&free_b, &total_b));
  const MemoryPlan mp = Plan();
  const int64_t budget = options_.vram_budget > 0 ? options_.vram_budget : static_cast<int64_t>(free_b);
  if (mp.total() > budget) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the CUDA backend needs %d bytes (%.1f MiB) of device memory but --vram-budget%s is %d "
        "bytes (%.1f MiB): %s. Lower the hot fraction (--hot-fraction / a smaller plan), "
        "--kv-slots, --context or --max-batch",
        mp.total(), mp.total() / 1048576.0, options_.vram_budget > 0 ? "" : " (the device's free memory)",
        budget, budget / 1048576.0, mp.ToString()));
  }
  if (mp.total() > static_cast<int64_t>(free_b)) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the CUDA backend needs %d bytes of device memory; the budget allows it but the device "
        "has only %d bytes free (%s)",
        mp.total(), static_cast<int64_t>(free_b), mp.ToString()));
  }

  TC_CUDA(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
  TC_CUDA(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
  for (cudaEvent_t* e : {&ffn_in_, &copied_, &cold_in_}) {
    TC_CUDA(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  }
  TC_CUBLAS(cublasCreate(&blas_));
  TC_CUBLAS(cublasSetStream(blas_, compute_));

  ThreadPool pool(options_.threads);
  layers_.resize(c.n_layers);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = model_.layer(l);
    DeviceLayer& d = layers_[l];
    TC_ASSIGN_OR_RETURN(d.attn_norm, UploadVector(w.attn_norm));
    TC_ASSIGN_OR_RETURN(d.attn_norm_b, UploadVector(w.attn_norm_b));
    TC_ASSIGN_OR_RETURN(d.ffn_norm, UploadVector(w.ffn_norm));
    TC_ASSIGN_OR_RETURN(d.ffn_norm_b, UploadVector(w.ffn_norm_b));
    TC_ASSIGN_OR_RETURN(d.post_attn_norm, UploadVector(w.post_attn_norm));
    TC_ASSIGN_OR_RETURN(d.post_ffn_norm, UploadVector(w.post_ffn_norm));
    TC_ASSIGN_OR_RETURN(d.q_norm, UploadVector(w.q_norm));
    TC_ASSIGN_OR_RETURN(d.k_norm, UploadVector(w.k_norm));
    d.q_norm_span = static_cast<int64_t>(w.q_norm.size());
    d.k_norm_span = static_cast<int64_t>(w.k_norm.size());
    TC_ASSIGN_OR_RETURN(d.bq, UploadVector(w.bq));
    TC_ASSIGN_OR_RETURN(d.bk, UploadVector(w.bk));
    TC_ASSIGN_OR_RETURN(d.bv, UploadVector(w.bv));
    TC_ASSIGN_OR_RETURN(d.bo, UploadVector(w.bo));
    TC_ASSIGN_OR_RETURN(d.down_b, UploadVector(w.down_b));
    TC_ASSIGN_OR_RETURN(d.wq, UploadMatrix(w.wq, pool));
    TC_ASSIGN_OR_RETURN(d.wk, UploadMatrix(w.wk, pool));
    TC_ASSIGN_OR_RETURN(d.wv, UploadMatrix(w.wv, pool));
    TC_ASSIGN_OR_RETURN(d.wo, UploadMatrix(w.wo, pool));
    const LayerPartition& part = partition_.layers[l];
    if (c.layers[l].moe) {
      TC_RETURN_IF_ERROR(InitMoeLayer(l, pool));
      continue;
    }
    d.n_hot = static_cast<int64_t>(part.hot.size());
    if (d.n_hot > 0) {
      TC_ASSIGN_OR_RETURN(DownRows down, DownRows::ForLayer(model_, l, std::nullopt, pool));
      d.kinds = KindsOf(w.gate, w.up, down.view());
      d.row_bytes = HotRowBytes(d.kinds.gate_up, w.up.type, c.dim);
      d.down_row_bytes = HotRowBytes(d.kinds.down, down.view().type, c.dim);
      if (!w.gate.empty()) {
        TC_ASSIGN_OR_RETURN(d.gate,
                            UploadVector(GatherHotRows(w.gate, part.hot, d.kinds.gate_up, pool)));
      }
      TC_ASSIGN_OR_RETURN(d.up, UploadVector(GatherHotRows(w.up, part.hot, d.kinds.gate_up, pool)));
      if (!w.up_b.empty()) {
        std::vector<float> up_b(d.n_hot);
        for (int64_t k = 0; k < d.n_hot; ++k) up_b[k] = w.up_b[part.hot[k]];
        TC_ASSIGN_OR_RETURN(d.up_b, UploadVector(up_b));
      }
      TC_ASSIGN_OR_RETURN(d.down,
                          UploadVector(GatherHotRows(down.view(), part.hot, d.kinds.down, pool)));
      std::vector<int32_t> iota(d.n_hot);
      for (int64_t k = 0; k < d.n_hot; ++k) iota[k] = static_cast<int32_t>(k);
      TC_ASSIGN_OR_RETURN(d.hot_iota, UploadVector(iota));
    }
    if (plan_.mode(l) == SparsityMode::kPredicted) {
      std::vector<int32_t> slot(c.ffn_dim, -1);
      for (int64_t k = 0; k < d.n_hot; ++k) slot[part.hot[k]] = static_cast<int32_t>(k);
      TC_ASSIGN_OR_RETURN(d.hot_slot, UploadVector(slot));
      const LayerPredictor& p = plan_.predictors->layer(l);
      d.rank = p.rank;
      TC_ASSIGN_OR_RETURN(d.fc1, UploadF16(p.fc1, pool));
      TC_ASSIGN_OR_RETURN(d.fc2, UploadF16(p.fc2, pool));
    }
  }
  TC_ASSIGN_OR_RETURN(output_, UploadMatrix(model_.output(), pool));
  TC_ASSIGN_OR_RETURN(output_norm_, UploadVector(model_.output_norm()));
  TC_ASSIGN_OR_RETURN(output_norm_b_, UploadVector(model_.output_norm_b()));
  TC_ASSIGN_OR_RETURN(rope_freqs_, UploadVector(model_.rope_freqs()));
  const RopeParams rope = ModelRope(model_);
  rope_.head_dim = rope.head_dim;
  rope_.rope_dim = rope.rope_dim;
  rope_.neox = rope.neox;
  rope_.freq_scale = rope.freq_scale;
  rope_.ext_factor = rope.ext_factor;
  rope_.attn_factor = rope.attn_factor;
  rope_.corr_low = rope.corr_low;
  rope_.corr_high = rope.corr_high;
  rope_.freq_factors = rope.freq_factors != nullptr ? rope_freqs_.get() : nullptr;

  kv_.f16 = options_.kv_type == GgmlType::kF16;
  kv_.n_slots = options_.n_kv_slots;
  kv_.capacity = context_;
  kv_.kv_dim = c.kv_dim;
  const int64_t kv_bytes = c.n_layers * kv_.n_slots * context_ * c.kv_dim * (kv_.f16 ? 2 : 4);
  TC_RETURN_IF_ERROR(k_cache_.Allocate(kv_bytes));
  TC_RETURN_IF_ERROR(v_cache_.Allocate(kv_bytes));
  kv_.k = k_cache_.get();
  kv_.v = v_cache_.get();
  length_.assign(options_.n_kv_slots, 0);

  const int64_t b = options_.max_batch;
  int64_t max_hot = 0;
  for (const DeviceLayer& d : layers_) max_hot = std::max(max_hot, d.n_hot);
  for (CudaArray<float>* a : {&x_, &h_, &ao_, &y_hot_, &y_cold_}) {
    TC_RETURN_IF_ERROR(a->Allocate(b * c.dim));
  }
  TC_RETURN_IF_ERROR(q_.Allocate(b * c.q_dim));
  TC_RETURN_IF_ERROR(att_.Allocate(b * c.q_dim));
  TC_RETURN_IF_ERROR(k_.Allocate(b * c.kv_dim));
  TC_RETURN_IF_ERROR(v_.Allocate(b * c.kv_dim));
  TC_RETURN_IF_ERROR(pred_mid_.Allocate(b * max_rank_));
  TC_RETURN_IF_ERROR(pred_mid_h_.Allocate(b * max_rank_));
  TC_RETURN_IF_ERROR(scores_.Allocate(b * c.ffn_dim));
  TC_RETURN_IF_ERROR(att_scores_.Allocate(b * c.n_heads * context_));
  TC_RETURN_IF_ERROR(coeff_.Allocate(b * std::max<int64_t>(max_hot, 1)));
  if (c.moe()) {
    max_cand_ = std::max<int64_t>(max_hot, 1);
    TC_RETURN_IF_ERROR(cand_scale_.Allocate(b * max_cand_));
    TC_RETURN_IF_ERROR(cand_pin_.Allocate(b * max_cand_));
    TC_RETURN_IF_ERROR(scale_pin_.Allocate(b * max_cand_));
    TC_RETURN_IF_ERROR(count_pin_.Allocate(b));
  }
  TC_RETURN_IF_ERROR(logits_.Allocate(b * c.vocab_size));
  for (CudaArray<uint16_t>* a : {&xh_, &hh_}) TC_RETURN_IF_ERROR(a->Allocate(b * c.dim));
  TC_RETURN_IF_ERROR(atth_.Allocate(b * c.q_dim));
  wscratch_elems_ = WeightScratchElems();
  TC_RETURN_IF_ERROR(wscratch_.Allocate(wscratch_elems_));
  for (CudaArray<int32_t>* a : {&slots_, &positions_, &row_map_, &hot_count_, &cold_count_}) {
    TC_RETURN_IF_ERROR(a->Allocate(b));
  }
  for (CudaArray<int32_t>* a : {&cold_ids_, &packed_}) {
    TC_RETURN_IF_ERROR(a->Allocate(b * c.ffn_dim));
  }
  TC_RETURN_IF_ERROR(hot_idx_.Allocate(b * std::max(c.ffn_dim, max_cand_)));
  TC_RETURN_IF_ERROR(row_end_.Allocate(b));
  TC_RETURN_IF_ERROR(stats_.Allocate(2 * c.n_layers));
  TC_RETURN_IF_ERROR(x_pin_.Allocate(b * c.dim));
  TC_RETURN_IF_ERROR(h_pin_.Allocate(b * c.dim));
  TC_RETURN_IF_ERROR(y_cold_pin_.Allocate(b * c.dim));
  TC_RETURN_IF_ERROR(logits_pin_.Allocate(b * c.vocab_size));
  TC_RETURN_IF_ERROR(ids_pin_.Allocate(b * c.ffn_dim));
  TC_RETURN_IF_ERROR(step_pin_.Allocate(3 * b));
  TC_RETURN_IF_ERROR(row_end_pin_.Allocate(b));
  TC_RETURN_IF_ERROR(stats_pin_.Allocate(2 * c.n_layers));

  limits_ = BackendLimits{options_.n_kv_slots, static_cast<int32_t>(context_), options_.max_batch,
                          static_cast<int32_t>(c.vocab_size)};
  if (options_.log) {
    cudaDeviceProp prop{};
    TC_CUDA(cudaGetDeviceProperties(&prop, options_.device));
    options_.log(absl::StrFormat("cuda backend on %s: %.1f MiB of device memory (%s), budget %.1f MiB",
                                 prop.name, mp.total() / 1048576.0, mp.ToString(),
                                 budget / 1048576.0));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::InitMoeLayer(int64_t l, ThreadPool& pool) {
  const ModelConfig& c = model_.config();
  const LayerWeights& w = model_.layer(l);
  const LayerPartition& part = partition_.layers[l];
  DeviceLayer& d = layers_[l];
  const SparsityMode mode = plan_.mode(l);
  if (mode == SparsityMode::kPredicted) {
    // SparsityPlan::Validate refuses predictors in MoE layers before we get here.
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", l, " is a mixture-of-experts layer: predicted mode has no predictors for experts"));
  }
  d.moe = true;
  const int64_t n_exp = static_cast<int64_t>(w.experts.size());
  const bool shared = !w.shared.up.empty();
  // Gate and up of every expert share one tensor's type, and so do their downs; the shared
  // expert is its own tensors: where its type differs, both go as fp16.
  TC_ASSIGN_OR_RETURN(DownRows down0, DownRows::ForMatrix(w.experts[0].down, std::nullopt, pool));
  d.kinds = KindsOf(w.experts[0].gate, w.experts[0].up, down0.view());
  std::optional<DownRows> shared_down;
  if (shared) {
    TC_ASSIGN_OR_RETURN(shared_down, DownRows::ForMatrix(w.shared.down, std::nullopt, pool));
    const HotKinds sk = KindsOf(w.shared.gate, w.shared.up, shared_down->view());
    if (sk.gate_up != d.kinds.gate_up) d.kinds.gate_up = WeightFormat::kF16;
    if (sk.down != d.kinds.down) d.kinds.down = WeightFormat::kF16;
  }
  d.row_bytes = HotRowBytes(d.kinds.gate_up, w.experts[0].up.type, c.dim);
  d.down_row_bytes = HotRowBytes(d.kinds.down, down0.view().type, c.dim);
  std::vector<uint8_t> gate, up, down;
  auto append = [](std::vector<uint8_t>& to, const std::vector<uint8_t>& rows) {
    to.insert(to.end(), rows.begin(), rows.end());
  };
  d.expert_begin.assign(n_exp + 1, 0);
  for (int64_t e = 0; e < n_exp; ++e) {
    std::vector<int32_t> ids;
    for (int32_t id : ExpertSlice(part.hot, e, c.ffn_dim)) {
      ids.push_back(static_cast<int32_t>(id - e * c.ffn_dim));
    }
    d.expert_begin[e + 1] = d.expert_begin[e] + static_cast<int64_t>(ids.size());
    if (ids.empty()) continue;
    const FfnWeights& x = w.experts[e];
    TC_ASSIGN_OR_RETURN(DownRows down_e, DownRows::ForMatrix(x.down, std::nullopt, pool));
    append(gate, GatherHotRows(x.gate, ids, d.kinds.gate_up, pool));
    append(up, GatherHotRows(x.up, ids, d.kinds.gate_up, pool));
    append(down, GatherHotRows(down_e.view(), ids, d.kinds.down, pool));
  }
  d.shared_begin = d.expert_begin[n_exp];
  if (shared) {
    d.shared_rows = c.shared_expert_ffn_dim;
    std::vector<int32_t> all(d.shared_rows);
    for (int64_t i = 0; i < d.shared_rows; ++i) all[i] = static_cast<int32_t>(i);
    append(gate, GatherHotRows(w.shared.gate, all, d.kinds.gate_up, pool));
    append(up, GatherHotRows(w.shared.up, all, d.kinds.gate_up, pool));
    append(down, GatherHotRows(shared_down->view(), all, d.kinds.down, pool));
  }
  d.n_hot = d.shared_begin + d.shared_rows;
  if (mode == SparsityMode::kThreshold) {
    // Each expert's rows carry that expert's cuts; the shared expert keeps every neuron (the
    // plan's SharedExpertFilter), which cut 0 / coefficient cut 0 does.
    std::vector<float> cuts(2 * d.n_hot, 0.0f);
    for (int64_t e = 0; e < n_exp; ++e) {
      const NeuronFilter f = plan_.FilterFor(l, c.activation, e);
      for (int64_t q = d.expert_begin[e]; q < d.expert_begin[e + 1]; ++q) {
        cuts[2 * q] = f.cut;
        cuts[2 * q + 1] = f.coeff_cut;
      }
    }
    TC_ASSIGN_OR_RETURN(d.row_cut, UploadVector(cuts));
  }
  TC_ASSIGN_OR_RETURN(d.gate, UploadVector(gate));
  TC_ASSIGN_OR_RETURN(d.up, UploadVector(up));
  TC_ASSIGN_OR_RETURN(d.down, UploadVector(down));
  return absl::OkStatus();
}

absl::Status CudaBackend::MoeFfn(int64_t l, Act in, Act out) {
  const ModelConfig& c = model_.config();
  const LayerWeights& w = model_.layer(l);
  const DeviceLayer& d = layers_[l];
  const int64_t n = n_, dim = c.dim, k = c.n_experts_used, stride = max_cand_;
  float* h = F32(in);
  float* y = F32(out);
  // h to the host: the router runs there with the host backend's own RouteExperts (the same
  // picks and weights for the same h), and the cold side needs h anyway. The wait also means
  // the previous layer's uploads from the pinned buffers below are done.
  TC_CUDA(cudaMemcpyAsync(h_pin_.get(), h, n * dim * sizeof(float), cudaMemcpyDeviceToHost, compute_));
  TC_CUDA(cudaStreamSynchronize(compute_));
  RouteExperts(c, w, h_pin_.get(), n, route_pool_, route_probs_, picks_, pick_w_);
  int32_t* idx = cand_pin_.get();
  float* scale = scale_pin_.get();
  int32_t* count = count_pin_.get();
  for (int64_t t = 0; t < n; ++t) {
    int64_t m = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = picks_[t * k + j];
      for (int64_t q = d.expert_begin[e]; q < d.expert_begin[e + 1]; ++q, ++m) {
        idx[t * stride + m] = static_cast<int32_t>(q);
        scale[t * stride + m] = pick_w_[t * k + j];
      }
    }
    if (d.shared_rows > 0) {
      const float g = SharedExpertGate(w, h_pin_.get() + t * dim);
      for (int64_t q = 0; q < d.shared_rows; ++q, ++m) {
        idx[t * stride + m] = static_cast<int32_t>(d.shared_begin + q);
        scale[t * stride + m] = g;
      }
    }
    count[t] = static_cast<int32_t>(m);
  }
  TC_CUDA(cudaMemcpyAsync(hot_idx_.get(), idx, n * stride * sizeof(int32_t), cudaMemcpyHostToDevice, compute_));
  TC_CUDA(cudaMemcpyAsync(cand_scale_.get(), scale, n * stride * sizeof(float), cudaMemcpyHostToDevice, compute_));
  TC_CUDA(cudaMemcpyAsync(hot_count_.get(), count, n * sizeof(int32_t), cudaMemcpyHostToDevice, compute_));

  // Dense or exact: one filter for every expert and the shared one; threshold: the filter's
  // kind from expert 0, each row's cuts from row_cut.
  HotFfnArgs a = HotArgs(l, plan_.FilterFor(l, c.activation, 0), h, y);
  a.row_cut = d.row_cut.get();
  a.idx = hot_idx_.get();
  a.idx_stride = stride;
  a.scale = cand_scale_.get();
  a.counts = hot_count_.get();
  TC_CUDA(LaunchHotFfn(a, compute_));
  Wrote(out);

  if (partition_.layers[l].cold.empty()) return FinishCold(l, nullptr, y);
  ColdRequest request;
  request.layer = l;
  request.rows = n;
  request.dim = dim;
  request.h = std::span<const float>(h_pin_.get(), n * dim);
  request.all_cold = true;
  request.picks = k;
  request.experts = picks_;
  request.expert_weights = pick_w_;
  return FinishCold(l, &request, y);
}

HotFfnArgs CudaBackend::HotArgs(int64_t l, const NeuronFilter& filter, const float* h, float* y) {
  const ModelConfig& c = model_.config();
  const DeviceLayer& d = layers_[l];
  HotFfnArgs a;
  a.weights = d.kinds.gate_up;
  a.down_weights = d.kinds.down;
  a.gate = d.gate.get();  // null in an FFN without a gate
  a.up = d.up.get();
  a.down = d.down.get();
  a.up_b = d.up_b.get();
  a.row_bytes = d.row_bytes;
  a.down_row_bytes = d.down_row_bytes;
  a.dim = c.dim;
  a.act = ToHotAct(c.activation);
  a.filter = filter.kind == NeuronFilter::Kind::kNone       ? 0
             : filter.kind == NeuronFilter::Kind::kPositive ? 1
                                                            : 2;
  a.cut = filter.cut;
  a.coeff_cut = filter.coeff_cut;
  a.max_count = d.n_hot;
  a.h = h;
  a.rows = n_;
  a.coeff = coeff_.get();
  a.stats = stats_.get() + 2 * l;
  a.y = y;
  return a;
}

absl::Status CudaBackend::FinishCold(int64_t l, const ColdRequest* request, float* y) {
  const ModelConfig& c = model_.config();
  const int64_t n = n_, dim = c.dim;
  if (request != nullptr) {
    TC_RETURN_IF_ERROR(cold_->SendCold(*request));
    if (metrics_ != nullptr) metrics_->AddActivation();
    const int64_t wait_start = ipc::MonotonicNs();
    TC_RETURN_IF_ERROR(cold_->ReceiveCold(l, std::span<float>(y_cold_pin_.get(), n * dim)));
    if (metrics_ != nullptr) {
      metrics_->AddRingWait(static_cast<uint64_t>(std::max<int64_t>(0, ipc::MonotonicNs() - wait_start)));
    }
    TC_CUDA(cudaMemcpyAsync(y_cold_.get(), y_cold_pin_.get(), n * dim * sizeof(float), cudaMemcpyHostToDevice, copy_));
    TC_CUDA(cudaEventRecord(cold_in_, copy_));
    TC_CUDA(cudaStreamWaitEvent(compute_, cold_in_, 0));
    // hot + cold, as the host split FFN sums them.
    TC_CUDA(LaunchMerge(y, y_cold_.get(), nullptr, n * dim, compute_));
  }
  // The down bias once, on the merged output (the host split FFN's order).
  const DeviceLayer& d = layers_[l];
  if (d.down_b.get() != nullptr) TC_CUDA(LaunchAddBias(y, d.down_b.get(), n, dim, compute_));
  return absl::OkStatus();
}

absl::Status CudaBackend::Validate(std::span<const BatchEntry> batch) const {
  const ModelConfig& c = model_.config();
  if (batch.empty() || static_cast<int64_t>(batch.size()) > limits_.max_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("step of ", batch.size(), " entries, outside [1, ", limits_.max_batch, "]"));
  }
  std::vector<int64_t> length = length_;
  for (size_t i = 0; i < batch.size(); ++i) {
    const BatchEntry& e = batch[i];
    if (e.slot < 0 || e.slot >= options_.n_kv_slots) {
      return absl::InvalidArgumentError(absl::StrCat("entry ", i, ": slot ", e.slot,
                                                     " is not in [0, ", options_.n_kv_slots, ")"));
    }
    if (e.token < 0 || e.token >= c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("entry ", i, ": token ", e.token, " is not in [0, ", c.vocab_size, ")"));
    }
    if (e.position < 0 || e.position >= context_) {
      return absl::OutOfRangeError(absl::StrCat("entry ", i, ": position ", e.position,
                                                " is outside the KV cache capacity ", context_));
    }
    if (e.position > length[e.slot]) {
      return absl::InvalidArgumentError(absl::StrCat("entry ", i, ": position ", e.position,
                                                     " skips ahead of slot ", e.slot,
                                                     " which holds ", length[e.slot],
                                                     " positions"));
    }
    length[e.slot] = e.position + 1;
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::StartStep(std::span<const BatchEntry> batch, ColdLink& cold) {
  TC_RETURN_IF_ERROR(Validate(batch));
  batch_.assign(batch.begin(), batch.end());
  cold_ = &cold;
  return absl::OkStatus();
}

absl::Status CudaBackend::FinishStep(std::vector<float>* logits) {
  if (cold_ == nullptr) return absl::FailedPreconditionError("FinishStep without StartStep");
  absl::Status s = RunStep(logits);
  cold_ = nullptr;
  if (!s.ok()) {
    // Leave nothing of the abandoned step in flight: the next step reuses every buffer. A
    // failure here means the context is broken; the step's own error says more.
    cudaStreamSynchronize(copy_);
    cudaStreamSynchronize(compute_);
  }
  return s;
}

absl::Status CudaBackend::RunStep(std::vector<float>* logits) {
  const ModelConfig& c = model_.config();
  n_ = static_cast<int64_t>(batch_.size());
  mark_ns_ = ipc::MonotonicNs();
  for (bool& ok : half_ok_) ok = false;
  int32_t* step = step_pin_.get();
  n_out_ = 0;
  for (int64_t e = 0; e < n_; ++e) {
    step[e] = batch_[e].slot;
    step[n_ + e] = batch_[e].position;
    if (batch_[e].want_logits) step[2 * n_ + n_out_++] = static_cast<int32_t>(e);
  }
  TC_CUDA(cudaMemcpyAsync(slots_.get(), step, n_ * sizeof(int32_t), cudaMemcpyHostToDevice, compute_));
  TC_CUDA(cudaMemcpyAsync(positions_.get(), step + n_, n_ * sizeof(int32_t), cudaMemcpyHostToDevice, compute_));
  if (n_out_ > 0) {
    TC_CUDA(cudaMemcpyAsync(row_map_.get(), step + 2 * n_, n_out_ * sizeof(int32_t), cudaMemcpyHostToDevice, compute_));
  }
  TC_CUDA(cudaMemsetAsync(stats_.get(), 0, stats_.bytes(), compute_));
  TC_ASSIGN_OR_RETURN(const bool complete, RunModel(model_, *this));
  if (!complete) return absl::InternalError("cuda backend: the step stopped before its head");

  // Head left the logits and the neuron counts in pinned memory and waited for them.
  // The step happened: only now do the slots' lengths move (a failed step keeps them).
  for (const BatchEntry& e : batch_) length_[e.slot] = e.position + 1;
  logits->assign(logits_pin_.get(), logits_pin_.get() + n_out_ * c.vocab_size);
  if (metrics_ != nullptr) {
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const uint64_t capacity = static_cast<uint64_t>(n_) * layers_[l].n_hot;
      metrics_->AddNeurons(stats_pin_.get()[2 * l], stats_pin_.get()[2 * l + 1], capacity);
    }
  }
  return absl::OkStatus();
}

float* CudaBackend::F32(Act a) const {
  switch (a) {
    case Act::kX:
      return x_.get();
    case Act::kNormed:
      return h_.get();
    case Act::kQ:
      return q_.get();
    case Act::kK:
      return k_.get();
    case Act::kV:
      return v_.get();
    case Act::kAtt:
      return att_.get();
    case Act::kAttnOut:
      return ao_.get();
    case Act::kFfnOut:
      return y_hot_.get();
  }
  return nullptr;
}

int64_t CudaBackend::Width(Act a) const { return ActWidth(model_.config(), a); }

uint16_t* CudaBackend::HalfBuffer(Act a) const {
  switch (a) {
    case Act::kX:
      return xh_.get();
    case Act::kNormed:
      return hh_.get();
    case Act::kAtt:
      return atth_.get();
    default:
      return nullptr;
  }
}

absl::StatusOr<const uint16_t*> CudaBackend::Half(Act a) {
  uint16_t* half = HalfBuffer(a);
  if (half == nullptr) {
    return absl::InternalError(absl::StrCat("cuda backend: activation ", static_cast<int>(a),
                                            " has no fp16 copy for a product"));
  }
  if (!half_ok_[static_cast<int>(a)]) {
    TC_CUDA(LaunchToHalf(F32(a), n_ * Width(a), false, half, compute_));
    half_ok_[static_cast<int>(a)] = true;
  }
  return half;
}

absl::Status CudaBackend::Embed(float scale) {
  const int64_t dim = model_.config().dim;
  // Token embeddings stay in host memory: gathering n rows here and uploading them costs n * dim
  // floats per step, against vocab * dim of device memory (docs/cuda.md).
  for (int64_t e = 0; e < n_; ++e) {
    float* x = x_pin_.get() + e * dim;
    DequantizeMatrixRow(model_.token_embd(), batch_[e].token, x);
    if (scale != 1.0f) {
      for (int64_t i = 0; i < dim; ++i) x[i] *= scale;
    }
  }
  TC_CUDA(cudaMemcpyAsync(x_.get(), x_pin_.get(), n_ * dim * sizeof(float), cudaMemcpyHostToDevice, compute_));
  Wrote(Act::kX);
  return absl::OkStatus();
}

absl::Status CudaBackend::Norm(int64_t l, NormWeights which, NormKind kind, Act in, Act out) {
  const ModelConfig& c = model_.config();
  const DeviceLayer& d = layers_[l];
  const float* w = nullptr;
  const float* b = nullptr;
  switch (which) {
    case NormWeights::kAttn:
      w = d.attn_norm.get();
      b = d.attn_norm_b.get();
      break;
    case NormWeights::kFfn:
      w = d.ffn_norm.get();
      b = d.ffn_norm_b.get();
      break;
    case NormWeights::kPostAttn:
      w = d.post_attn_norm.get();
      break;
    case NormWeights::kPostFfn:
      w = d.post_ffn_norm.get();
      break;
    case NormWeights::kQ:
    case NormWeights::kK:
      return absl::InternalError("cuda backend: a q/k norm is a HeadNorm");
  }
  // The fp16 copy comes with the norm: the products that read it are next.
  uint16_t* half = HalfBuffer(out);
  if (kind == NormKind::kLayer) {
    TC_CUDA(LaunchLayerNorm(F32(in), w, b, nullptr, n_, c.dim, c.rms_eps, F32(out), half, compute_));
  } else {
    TC_CUDA(LaunchRmsNorm(F32(in), w, nullptr, n_, c.dim, c.rms_eps, F32(out), half, compute_));
  }
  half_ok_[static_cast<int>(out)] = half != nullptr;
  return absl::OkStatus();
}

absl::Status CudaBackend::Project(int64_t l, Projection p, Act in, Act out) {
  const DeviceLayer& d = layers_[l];
  if (p != Projection::kQ && p != Projection::kK && p != Projection::kV && p != Projection::kO) {
    return absl::InternalError("cuda backend: an FFN product outside the FFN");
  }
  const DeviceMatrix& w = p == Projection::kQ   ? d.wq
                          : p == Projection::kK ? d.wk
                          : p == Projection::kV ? d.wv
                                                : d.wo;
  const uint16_t* x_half = nullptr;
  if (w.format == WeightFormat::kF16 || n_ > kGemvTokens) {
    TC_ASSIGN_OR_RETURN(x_half, Half(in));
  }
  TC_RETURN_IF_ERROR(Product(w, F32(in), x_half, n_, F32(out)));
  Wrote(out);
  return absl::OkStatus();
}

absl::Status CudaBackend::Product(const DeviceMatrix& m, const float* x, const uint16_t* x_half,
                                  int64_t n, float* y) {
  if (m.format == WeightFormat::kF16) {
    return GemmF16(blas_, m.half(), m.rows, m.cols, x_half, n, y, m.rows, 0.0f);
  }
  if (n <= kGemvTokens) {
    TC_CUDA(LaunchBlockGemv(m.format, m.data.get(), m.row_bytes, m.rows, m.cols, x, n, y, m.rows,
                            compute_));
    return absl::OkStatus();
  }
  // Chunks of rows through the fp16 scratch; the stream orders each chunk's GEMM before the
  // next chunk's conversion overwrites it.
  const int64_t chunk = std::max<int64_t>(1, wscratch_elems_ / m.cols);
  for (int64_t r0 = 0; r0 < m.rows; r0 += chunk) {
    const int64_t nr = std::min(chunk, m.rows - r0);
    TC_CUDA(LaunchBlockToHalf(m.format, m.data.get() + r0 * m.row_bytes, m.row_bytes, nr, m.cols,
                              wscratch_.get(), compute_));
    TC_RETURN_IF_ERROR(GemmF16(blas_, wscratch_.get(), nr, m.cols, x_half, n, y + r0, m.rows, 0.0f));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::AddBias(int64_t l, Projection p, Act a) {
  const DeviceLayer& d = layers_[l];
  const float* b = p == Projection::kQ   ? d.bq.get()
                   : p == Projection::kK ? d.bk.get()
                   : p == Projection::kV ? d.bv.get()
                                         : d.bo.get();
  TC_CUDA(LaunchAddBias(F32(a), b, n_, Width(a), compute_));
  Wrote(a);
  return absl::OkStatus();
}

absl::Status CudaBackend::HeadNorm(int64_t l, NormWeights which, Act a) {
  const DeviceLayer& d = layers_[l];
  const bool q = which == NormWeights::kQ;
  const float* w = q ? d.q_norm.get() : d.k_norm.get();
  const int64_t span = q ? d.q_norm_span : d.k_norm_span;
  // Each span of a row is its own RMSNorm row: rows * (width / span) of them, back to back.
  TC_CUDA(LaunchRmsNorm(F32(a), w, nullptr, n_ * (Width(a) / span), span, model_.config().rms_eps,
                        F32(a), nullptr, compute_));
  Wrote(a);
  return absl::OkStatus();
}

absl::Status CudaBackend::RopeAndStore(int64_t l) {
  const ModelConfig& c = model_.config();
  RopeDesc rope = rope_;
  rope.base = LayerRopeBase(c, l);
  TC_CUDA(LaunchRopeExt(q_.get(), n_, c.q_dim, c.n_heads, rope, positions_.get(), compute_));
  TC_CUDA(LaunchRopeExt(k_.get(), n_, c.kv_dim, c.n_kv_heads, rope, positions_.get(), compute_));
  TC_CUDA(LaunchKvStore(kv_, l, k_.get(), v_.get(), slots_.get(), positions_.get(), n_, compute_));
  Wrote(Act::kQ);
  Wrote(Act::kK);
  return absl::OkStatus();
}

absl::Status CudaBackend::Attend(int64_t l, Act out) {
  const ModelConfig& c = model_.config();
  AttentionDesc att;
  att.n_heads = c.n_heads;
  att.n_kv_heads = c.n_kv_heads;
  att.head_dim = c.head_dim;
  att.scale = c.attn_scale;
  att.softcap = c.attn_softcap;
  att.window = c.layers.empty() ? 0 : c.layers[l].sliding_window;
  TC_CUDA(LaunchAttention(kv_, l, q_.get(), slots_.get(), positions_.get(), n_, att,
                          att_scores_.get(), F32(out), compute_));
  Wrote(out);
  return absl::OkStatus();
}

absl::Status CudaBackend::AddResidual(Act a) {
  TC_CUDA(LaunchMerge(x_.get(), F32(a), nullptr, n_ * model_.config().dim, compute_));
  Wrote(Act::kX);
  return absl::OkStatus();
}

absl::Status CudaBackend::AddResidual(Act a, Act b) {
  TC_CUDA(LaunchMerge(x_.get(), F32(a), F32(b), n_ * model_.config().dim, compute_));
  Wrote(Act::kX);
  return absl::OkStatus();
}

absl::StatusOr<bool> CudaBackend::LayerDone(int64_t l) {
  if (metrics_ != nullptr) {
    // Host time since the previous layer's end: for layers with a cold round trip this is the
    // layer's wall time (the host waits for the partial); for wholly hot layers, enqueue time.
    const int64_t now = ipc::MonotonicNs();
    metrics_->AddLayerNs(l, static_cast<uint64_t>(std::max<int64_t>(0, now - mark_ns_)));
    mark_ns_ = now;
  }
  return true;
}

absl::Status CudaBackend::Head(NormKind kind, float final_softcap) {
  const ModelConfig& c = model_.config();
  // Only the rows that want logits (row_map_) are normed, into h_ and the fp16 copy xh_.
  if (kind == NormKind::kLayer) {
    TC_CUDA(LaunchLayerNorm(x_.get(), output_norm_.get(), output_norm_b_.get(), row_map_.get(),
                            n_out_, c.dim, c.rms_eps, h_.get(), xh_.get(), compute_));
  } else {
    TC_CUDA(LaunchRmsNorm(x_.get(), output_norm_.get(), row_map_.get(), n_out_, c.dim, c.rms_eps,
                          h_.get(), xh_.get(), compute_));
  }
  Wrote(Act::kX);  // xh_ and h_ now hold the normed rows
  Wrote(Act::kNormed);
  TC_RETURN_IF_ERROR(Product(output_, h_.get(), xh_.get(), n_out_, logits_.get()));
  TC_CUDA(cudaMemcpyAsync(logits_pin_.get(), logits_.get(), n_out_ * c.vocab_size * sizeof(float),
                          cudaMemcpyDeviceToHost, compute_));
  TC_CUDA(cudaMemcpyAsync(stats_pin_.get(), stats_.get(), stats_.bytes(), cudaMemcpyDeviceToHost, compute_));
  TC_CUDA(cudaStreamSynchronize(compute_));
  // gemma2's final soft-cap on the host, with ops.h's own function: vocab floats per row.
  if (final_softcap > 0.0f) SoftCap(logits_pin_.get(), n_out_ * c.vocab_size, final_softcap);
  return absl::OkStatus();
}

absl::Status CudaBackend::Ffn(int64_t l, Act in, Act predictor_in, Act out) {
  const ModelConfig& c = model_.config();
  const DeviceLayer& d = layers_[l];
  if (d.moe) return MoeFfn(l, in, out);
  const LayerPartition& part = partition_.layers[l];
  const int64_t n = n_, dim = c.dim, ffn = c.ffn_dim;
  const bool predicted = plan_.mode(l) == SparsityMode::kPredicted;
  const bool has_cold = !part.cold.empty();
  float* h = F32(in);
  float* y = F32(out);

  if (predicted) {
    // The predictors read what PowerInfer's graph feeds them (layer_program.h chooses it).
    TC_ASSIGN_OR_RETURN(const uint16_t* xin, Half(predictor_in));
    TC_RETURN_IF_ERROR(GemmF16(blas_, d.fc1.get(), d.rank, dim, xin, n, pred_mid_.get(), d.rank, 0.0f));
    TC_CUDA(LaunchToHalf(pred_mid_.get(), n * d.rank, true, pred_mid_h_.get(), compute_));
    TC_RETURN_IF_ERROR(GemmF16(blas_, d.fc2.get(), ffn, d.rank, pred_mid_h_.get(), n, scores_.get(), ffn, 0.0f));
    TC_CUDA(LaunchPredictSelect(scores_.get(), n, ffn, plan_.predictors->layer_threshold(l),
                                d.hot_slot.get(), hot_idx_.get(), hot_count_.get(),
                                cold_ids_.get(), cold_count_.get(), compute_));
    if (has_cold) {
      TC_CUDA(LaunchPackCold(cold_ids_.get(), cold_count_.get(), n, ffn, packed_.get(),
                             row_end_.get(), compute_));
    }
  }
  // The cold inputs leave first, on the copy stream, while the hot FFN is enqueued behind them.
  if (has_cold) {
    TC_CUDA(cudaEventRecord(ffn_in_, compute_));
    TC_CUDA(cudaStreamWaitEvent(copy_, ffn_in_, 0));
    TC_CUDA(cudaMemcpyAsync(h_pin_.get(), h, n * dim * sizeof(float), cudaMemcpyDeviceToHost, copy_));
    if (predicted) {
      TC_CUDA(cudaMemcpyAsync(row_end_pin_.get(), row_end_.get(), n * sizeof(uint32_t), cudaMemcpyDeviceToHost, copy_));
    }
    TC_CUDA(cudaEventRecord(copied_, copy_));
  }

  HotFfnArgs a = HotArgs(l, plan_.FilterFor(l, c.activation), h, y);
  if (predicted) {
    a.idx = hot_idx_.get();
    a.idx_stride = ffn;
    a.counts = hot_count_.get();
  } else {
    a.idx = d.hot_iota.get();
    a.idx_stride = 0;
    a.fixed_count = static_cast<int32_t>(d.n_hot);
  }
  TC_CUDA(LaunchHotFfn(a, compute_));
  Wrote(out);

  if (!has_cold) return FinishCold(l, nullptr, y);
  TC_CUDA(cudaEventSynchronize(copied_));
  ColdRequest request;
  request.layer = l;
  request.rows = n;
  request.dim = dim;
  request.h = std::span<const float>(h_pin_.get(), n * dim);
  request.all_cold = !predicted;
  if (predicted) {
    const int64_t total = row_end_pin_.get()[n - 1];
    if (total > n * ffn) {
      return absl::InternalError(absl::StrCat("cuda backend: layer ", l, ": ", total,
                                              " cold candidates for ", n, " rows"));
    }
    // No cold candidate in any row: no round trip.
    if (total == 0) return FinishCold(l, nullptr, y);
    TC_CUDA(cudaMemcpyAsync(ids_pin_.get(), packed_.get(), total * sizeof(int32_t), cudaMemcpyDeviceToHost, copy_));
    TC_CUDA(cudaStreamSynchronize(copy_));
    request.row_end = std::span<const uint32_t>(row_end_pin_.get(), n);
    request.ids = std::span<const int32_t>(ids_pin_.get(), total);
  }
  return FinishCold(l, &request, y);
}

}  // namespace
}  // namespace cuda

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const Model& model,
                                                           SparsityPlan plan, Partition partition,
                                                           const CudaBackendOptions& options) {
  auto b = std::make_unique<cuda::CudaBackend>(model, std::move(plan), std::move(partition), options);
  TC_RETURN_IF_ERROR(b->Init());
  return std::unique_ptr<Backend>(std::move(b));
}

absl::Status CudaAvailable() { return cuda::CudaDeviceAvailable(); }

absl::StatusOr<CudaDeviceMemory> QueryCudaDeviceMemory(int device) {
  TC_RETURN_IF_ERROR(CudaAvailable());
  cudaDeviceProp prop{};
  TC_CUDA(cudaGetDeviceProperties(&prop, device));
  TC_CUDA(cudaSetDevice(device));
  size_t free_b = 0, total_b = 0;
  TC_CUDA(cudaMemGetInfo(&free_b, &total_b));
  CudaDeviceMemory m;
  m.name = prop.name;
  m.free_bytes = static_cast<int64_t>(free_b);
  m.total_bytes = static_cast<int64_t>(total_b);
  return m;
}

}  // namespace thermocline::gpu_worker
