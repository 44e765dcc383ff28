#include "gpu_worker/cuda/cuda_backend.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"
#include "gpu_worker/cuda/cuda_util.h"
#include "gpu_worker/cuda/kernels.h"
#include "shared/ipc/futex.h"
#include "shared/kernels/matmul.h"
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

template <typename T>
absl::StatusOr<CudaArray<T>> UploadVector(const std::vector<T>& v) {
  CudaArray<T> d;
  TC_RETURN_IF_ERROR(d.Allocate(v.size()));
  TC_RETURN_IF_ERROR(d.Upload(v.data(), v.size()));
  return d;
}

bool IsQuantized(GgmlType t) { return t == GgmlType::kQ8_0 || t == GgmlType::kQ4_0; }

// How the hot rows of a layer are stored: the file's own blocks when gate, up and down rows
// share a quantized type (the kernels read Q8_0/Q4_0 directly), else fp16.
HotWeights HotKind(const MatrixView& gate, const MatrixView& up, const MatrixView& down_t) {
  if (gate.type == up.type && gate.type == down_t.type) {
    if (gate.type == GgmlType::kQ8_0) return HotWeights::kQ8_0;
    if (gate.type == GgmlType::kQ4_0) return HotWeights::kQ4_0;
  }
  return HotWeights::kF16;
}

int64_t HotRowBytes(HotWeights kind, int64_t dim) {
  switch (kind) {
    case HotWeights::kQ8_0:
      return RowBytes(GgmlType::kQ8_0, dim);
    case HotWeights::kQ4_0:
      return RowBytes(GgmlType::kQ4_0, dim);
    case HotWeights::kF16:
      break;
  }
  return dim * 2;
}

// The rows `ids` of m in `kind`'s storage, back to back.
std::vector<uint8_t> GatherHotRows(const MatrixView& m, const std::vector<int32_t>& ids,
                                   HotWeights kind, ThreadPool& pool) {
  const int64_t n = static_cast<int64_t>(ids.size());
  if (kind == HotWeights::kF16) {
    std::vector<uint16_t> h = RowsToF16(m, ids.data(), n, pool);
    std::vector<uint8_t> out(h.size() * 2);
    std::memcpy(out.data(), h.data(), out.size());
    return out;
  }
  std::vector<uint8_t> out(n * m.row_bytes);
  for (int64_t k = 0; k < n; ++k) std::memcpy(out.data() + k * m.row_bytes, m.row(ids[k]), m.row_bytes);
  return out;
}

struct DeviceLayer {
  CudaArray<float> attn_norm, ffn_norm;
  CudaArray<uint16_t> wq, wk, wv, wo;
  // Hot FFN rows, compacted: row k belongs to neuron partition.hot[k].
  HotWeights kind = HotWeights::kF16;
  int64_t n_hot = 0, row_bytes = 0;
  CudaArray<uint8_t> gate, up, down;
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

 private:
  MemoryPlan Plan() const;
  absl::Status Validate(std::span<const BatchEntry> batch) const;
  absl::Status RunStep(std::vector<float>* logits);
  absl::Status Layer(int64_t l, int64_t n);
  absl::Status Ffn(int64_t l, int64_t n);

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
  CudaArray<uint16_t> output_;
  CudaArray<float> output_norm_;
  CudaArray<uint8_t> k_cache_, v_cache_;
  KvDesc kv_;
  std::vector<int64_t> length_;  // valid positions per slot

  // Scratch, sized for max_batch rows.
  CudaArray<float> x_, q_, k_, v_, att_, h_, y_hot_, y_cold_, pred_mid_, scores_, att_scores_,
      coeff_, logits_;
  CudaArray<uint16_t> xh_, atth_, hh_, pred_mid_h_;
  CudaArray<int32_t> slots_, positions_, row_map_, hot_idx_, hot_count_, cold_ids_, cold_count_,
      packed_;
  CudaArray<uint32_t> row_end_, stats_;
  // Pinned staging: the ColdLink takes host spans and copies them into (or out of) the ring, so
  // the DMA targets these buffers rather than the ring itself (docs/cuda.md, "Host copies").
  PinnedArray<float> x_pin_, h_pin_, y_cold_pin_, logits_pin_;
  PinnedArray<int32_t> ids_pin_, step_pin_;  // step_pin_: slots, positions, row map
  PinnedArray<uint32_t> row_end_pin_, stats_pin_;

  std::vector<BatchEntry> batch_;
  ColdLink* cold_ = nullptr;
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
  p.attention = c.n_layers * 2 * (2 * c.dim * c.dim + 2 * c.kv_dim * c.dim);
  p.head = 2 * c.vocab_size * c.dim;
  p.norms = 4 * (2 * c.n_layers * c.dim + c.dim);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = model_.layer(l);
    const MatrixView& down = w.has_down_t ? w.down_t : w.down;
    const int64_t n_hot = static_cast<int64_t>(partition_.layers[l].hot.size());
    // DownRows keeps the model's type for down_t (a transposed quantized copy is requantized
    // to the same type), so the kind follows from gate, up and down's types.
    const HotWeights kind = HotKind(w.gate, w.up, down);
    p.hot_ffn += n_hot * 3 * HotRowBytes(kind, c.dim) + 4 * n_hot;
    if (plan_.mode(l) == SparsityMode::kPredicted) {
      const int64_t rank = plan_.predictors->layer(l).rank;
      p.predictors += 2 * (rank * c.dim + c.ffn_dim * rank) + 4 * c.ffn_dim;
    }
  }
  const int64_t kv_elem = options_.kv_type == GgmlType::kF16 ? 2 : 4;
  p.kv = 2 * c.n_layers * options_.n_kv_slots * context_ * c.kv_dim * kv_elem;
  int64_t max_hot = 0;
  for (const LayerPartition& lp : partition_.layers) {
    max_hot = std::max<int64_t>(max_hot, static_cast<int64_t>(lp.hot.size()));
  }
  p.scratch = 4 * b * (7 * c.dim + 2 * c.kv_dim + max_rank_ + 5 * c.ffn_dim + max_hot +
                       c.vocab_size + c.n_heads * context_ + 8) +
              2 * b * (3 * c.dim + max_rank_) + 8 * c.n_layers;
  return p;
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
    TC_ASSIGN_OR_RETURN(d.ffn_norm, UploadVector(w.ffn_norm));
    TC_ASSIGN_OR_RETURN(d.wq, UploadF16(w.wq, pool));
    TC_ASSIGN_OR_RETURN(d.wk, UploadF16(w.wk, pool));
    TC_ASSIGN_OR_RETURN(d.wv, UploadF16(w.wv, pool));
    TC_ASSIGN_OR_RETURN(d.wo, UploadF16(w.wo, pool));
    const LayerPartition& part = partition_.layers[l];
    d.n_hot = static_cast<int64_t>(part.hot.size());
    if (d.n_hot > 0) {
      TC_ASSIGN_OR_RETURN(DownRows down, DownRows::ForLayer(model_, l, std::nullopt, pool));
      d.kind = HotKind(w.gate, w.up, down.view());
      d.row_bytes = HotRowBytes(d.kind, c.dim);
      TC_ASSIGN_OR_RETURN(d.gate, UploadVector(GatherHotRows(w.gate, part.hot, d.kind, pool)));
      TC_ASSIGN_OR_RETURN(d.up, UploadVector(GatherHotRows(w.up, part.hot, d.kind, pool)));
      TC_ASSIGN_OR_RETURN(d.down, UploadVector(GatherHotRows(down.view(), part.hot, d.kind, pool)));
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
  TC_ASSIGN_OR_RETURN(output_, UploadF16(model_.output(), pool));
  TC_ASSIGN_OR_RETURN(output_norm_, UploadVector(model_.output_norm()));

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
  for (CudaArray<float>* a : {&x_, &q_, &att_, &h_, &y_hot_, &y_cold_}) {
    TC_RETURN_IF_ERROR(a->Allocate(b * c.dim));
  }
  TC_RETURN_IF_ERROR(k_.Allocate(b * c.kv_dim));
  TC_RETURN_IF_ERROR(v_.Allocate(b * c.kv_dim));
  TC_RETURN_IF_ERROR(pred_mid_.Allocate(b * max_rank_));
  TC_RETURN_IF_ERROR(pred_mid_h_.Allocate(b * max_rank_));
  TC_RETURN_IF_ERROR(scores_.Allocate(b * c.ffn_dim));
  TC_RETURN_IF_ERROR(att_scores_.Allocate(b * c.n_heads * context_));
  TC_RETURN_IF_ERROR(coeff_.Allocate(b * std::max<int64_t>(max_hot, 1)));
  TC_RETURN_IF_ERROR(logits_.Allocate(b * c.vocab_size));
  for (CudaArray<uint16_t>* a : {&xh_, &atth_, &hh_}) TC_RETURN_IF_ERROR(a->Allocate(b * c.dim));
  for (CudaArray<int32_t>* a : {&slots_, &positions_, &row_map_, &hot_count_, &cold_count_}) {
    TC_RETURN_IF_ERROR(a->Allocate(b));
  }
  for (CudaArray<int32_t>* a : {&hot_idx_, &cold_ids_, &packed_}) {
    TC_RETURN_IF_ERROR(a->Allocate(b * c.ffn_dim));
  }
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
  const int64_t n = static_cast<int64_t>(batch_.size()), dim = c.dim;
  mark_ns_ = ipc::MonotonicNs();
  // Token embeddings stay in host memory: gathering n rows here and uploading them costs n * dim
  // floats per step, against vocab * dim of device memory (docs/cuda.md).
  int32_t* step = step_pin_.get();
  int64_t n_out = 0;
  for (int64_t e = 0; e < n; ++e) {
    DequantizeMatrixRow(model_.token_embd(), batch_[e].token, x_pin_.get() + e * dim);
    step[e] = batch_[e].slot;
    step[n + e] = batch_[e].position;
    if (batch_[e].want_logits) step[2 * n + n_out++] = static_cast<int32_t>(e);
  }
  TC_CUDA(cudaMemcpyAsync(x_.get(), x_pin_.get(), n * dim * sizeof(float), cudaMemcpyHostToDevice, compute_));
  TC_CUDA(cudaMemcpyAsync(slots_.get(), step, n * sizeof(int32_t), cudaMemcpyHostToDevice, compute_));
  TC_CUDA(cudaMemcpyAsync(positions_.get(), step + n, n * sizeof(int32_t), cudaMemcpyHostToDevice, compute_));
  if (n_out > 0) {
    TC_CUDA(cudaMemcpyAsync(row_map_.get(), step + 2 * n, n_out * sizeof(int32_t), cudaMemcpyHostToDevice, compute_));
  }
  TC_CUDA(cudaMemsetAsync(stats_.get(), 0, stats_.bytes(), compute_));
  for (int64_t l = 0; l < c.n_layers; ++l) TC_RETURN_IF_ERROR(Layer(l, n));

  TC_CUDA(LaunchRmsNorm(x_.get(), output_norm_.get(), row_map_.get(), n_out, dim, c.rms_eps,
                        nullptr, xh_.get(), compute_));
  TC_RETURN_IF_ERROR(GemmF16(blas_, output_.get(), c.vocab_size, dim, xh_.get(), n_out,
                             logits_.get(), c.vocab_size, 0.0f));
  TC_CUDA(cudaMemcpyAsync(logits_pin_.get(), logits_.get(), n_out * c.vocab_size * sizeof(float),
                          cudaMemcpyDeviceToHost, compute_));
  TC_CUDA(cudaMemcpyAsync(stats_pin_.get(), stats_.get(), stats_.bytes(), cudaMemcpyDeviceToHost, compute_));
  TC_CUDA(cudaStreamSynchronize(compute_));
  // The step happened: only now do the slots' lengths move (a failed step keeps them).
  for (const BatchEntry& e : batch_) length_[e.slot] = e.position + 1;
  logits->assign(logits_pin_.get(), logits_pin_.get() + n_out * c.vocab_size);
  if (metrics_ != nullptr) {
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const uint64_t capacity = static_cast<uint64_t>(n) * layers_[l].n_hot;
      metrics_->AddNeurons(stats_pin_.get()[2 * l], stats_pin_.get()[2 * l + 1], capacity);
    }
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Layer(int64_t l, int64_t n) {
  const ModelConfig& c = model_.config();
  const DeviceLayer& d = layers_[l];
  const int64_t dim = c.dim, kvd = c.kv_dim;
  TC_CUDA(LaunchRmsNorm(x_.get(), d.attn_norm.get(), nullptr, n, dim, c.rms_eps, nullptr,
                        xh_.get(), compute_));
  TC_RETURN_IF_ERROR(GemmF16(blas_, d.wq.get(), dim, dim, xh_.get(), n, q_.get(), dim, 0.0f));
  TC_RETURN_IF_ERROR(GemmF16(blas_, d.wk.get(), kvd, dim, xh_.get(), n, k_.get(), kvd, 0.0f));
  TC_RETURN_IF_ERROR(GemmF16(blas_, d.wv.get(), kvd, dim, xh_.get(), n, v_.get(), kvd, 0.0f));
  TC_CUDA(LaunchRope(q_.get(), n, dim, c.n_heads, c.head_dim, c.rope_dim, positions_.get(),
                     c.rope_freq_base, compute_));
  TC_CUDA(LaunchRope(k_.get(), n, kvd, c.n_kv_heads, c.head_dim, c.rope_dim, positions_.get(),
                     c.rope_freq_base, compute_));
  // Every entry's keys are stored before any entry attends (ForwardPass's rule).
  TC_CUDA(LaunchKvStore(kv_, l, k_.get(), v_.get(), slots_.get(), positions_.get(), n, compute_));
  TC_CUDA(LaunchAttention(kv_, l, q_.get(), slots_.get(), positions_.get(), n, c.n_heads,
                          c.n_kv_heads, c.head_dim, att_scores_.get(), att_.get(), compute_));
  TC_CUDA(LaunchToHalf(att_.get(), n * dim, false, atth_.get(), compute_));
  // x += wo . att: beta = 1 makes the residual add part of the GEMM.
  TC_RETURN_IF_ERROR(GemmF16(blas_, d.wo.get(), dim, dim, atth_.get(), n, x_.get(), dim, 1.0f));
  TC_CUDA(LaunchRmsNorm(x_.get(), d.ffn_norm.get(), nullptr, n, dim, c.rms_eps, h_.get(),
                        hh_.get(), compute_));
  TC_RETURN_IF_ERROR(Ffn(l, n));
  if (metrics_ != nullptr) {
    // Host time since the previous layer's FFN: for layers with a cold round trip this is the
    // layer's wall time (the host waits for the partial); for wholly hot layers, enqueue time.
    const int64_t now = ipc::MonotonicNs();
    metrics_->AddLayerNs(l, static_cast<uint64_t>(std::max<int64_t>(0, now - mark_ns_)));
    mark_ns_ = now;
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Ffn(int64_t l, int64_t n) {
  const ModelConfig& c = model_.config();
  const DeviceLayer& d = layers_[l];
  const LayerPartition& part = partition_.layers[l];
  const int64_t dim = c.dim, ffn = c.ffn_dim;
  const bool predicted = plan_.mode(l) == SparsityMode::kPredicted;
  const bool has_cold = !part.cold.empty();

  if (predicted) {
    // The predictors read ffn_inp, the residual stream x before ffn_norm (PowerInfer's input);
    // xh_ (the attention norm's half copy) is free again once attention is done.
    TC_CUDA(LaunchToHalf(x_.get(), n * dim, false, xh_.get(), compute_));
    TC_RETURN_IF_ERROR(GemmF16(blas_, d.fc1.get(), d.rank, dim, xh_.get(), n, pred_mid_.get(), d.rank, 0.0f));
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
    TC_CUDA(cudaMemcpyAsync(h_pin_.get(), h_.get(), n * dim * sizeof(float), cudaMemcpyDeviceToHost, copy_));
    if (predicted) {
      TC_CUDA(cudaMemcpyAsync(row_end_pin_.get(), row_end_.get(), n * sizeof(uint32_t), cudaMemcpyDeviceToHost, copy_));
    }
    TC_CUDA(cudaEventRecord(copied_, copy_));
  }

  const NeuronFilter filter = plan_.FilterFor(l, c.activation);
  HotFfnArgs a;
  a.weights = d.kind;
  a.gate = d.gate.get();
  a.up = d.up.get();
  a.down = d.down.get();
  a.row_bytes = d.row_bytes;
  a.dim = dim;
  a.relu = c.activation == FfnActivation::kRelu;
  a.filter = filter.kind == NeuronFilter::Kind::kNone       ? 0
             : filter.kind == NeuronFilter::Kind::kPositive ? 1
                                                            : 2;
  a.cut = filter.cut;
  a.coeff_cut = filter.coeff_cut;
  if (predicted) {
    a.idx = hot_idx_.get();
    a.idx_stride = ffn;
    a.counts = hot_count_.get();
  } else {
    a.idx = d.hot_iota.get();
    a.idx_stride = 0;
    a.fixed_count = static_cast<int32_t>(d.n_hot);
  }
  a.max_count = d.n_hot;
  a.h = h_.get();
  a.rows = n;
  a.coeff = coeff_.get();
  a.stats = stats_.get() + 2 * l;
  a.y = y_hot_.get();
  TC_CUDA(LaunchHotFfn(a, compute_));

  bool sent = false;
  if (has_cold) {
    TC_CUDA(cudaEventSynchronize(copied_));
    ColdRequest request;
    request.layer = l;
    request.rows = n;
    request.dim = dim;
    request.h = std::span<const float>(h_pin_.get(), n * dim);
    request.all_cold = !predicted;
    int64_t total = 0;
    if (predicted) {
      total = row_end_pin_.get()[n - 1];
      if (total > n * ffn) {
        return absl::InternalError(absl::StrCat("cuda backend: layer ", l, ": ", total,
                                                " cold candidates for ", n, " rows"));
      }
      if (total > 0) {
        TC_CUDA(cudaMemcpyAsync(ids_pin_.get(), packed_.get(), total * sizeof(int32_t), cudaMemcpyDeviceToHost, copy_));
        TC_CUDA(cudaStreamSynchronize(copy_));
      }
      request.row_end = std::span<const uint32_t>(row_end_pin_.get(), n);
      request.ids = std::span<const int32_t>(ids_pin_.get(), total);
    }
    if (!predicted || total > 0) {
      TC_RETURN_IF_ERROR(cold_->SendCold(request));
      sent = true;
      if (metrics_ != nullptr) metrics_->AddActivation();
    }
  }
  if (!sent) {
    TC_CUDA(LaunchMerge(x_.get(), y_hot_.get(), nullptr, n * dim, compute_));
    return absl::OkStatus();
  }
  const int64_t wait_start = ipc::MonotonicNs();
  TC_RETURN_IF_ERROR(cold_->ReceiveCold(l, std::span<float>(y_cold_pin_.get(), n * dim)));
  if (metrics_ != nullptr) {
    metrics_->AddRingWait(static_cast<uint64_t>(std::max<int64_t>(0, ipc::MonotonicNs() - wait_start)));
  }
  TC_CUDA(cudaMemcpyAsync(y_cold_.get(), y_cold_pin_.get(), n * dim * sizeof(float), cudaMemcpyHostToDevice, copy_));
  TC_CUDA(cudaEventRecord(cold_in_, copy_));
  TC_CUDA(cudaStreamWaitEvent(compute_, cold_in_, 0));
  TC_CUDA(LaunchMerge(x_.get(), y_hot_.get(), y_cold_.get(), n * dim, compute_));
  return absl::OkStatus();
}

}  // namespace
}  // namespace cuda

namespace {

// The layer features the device kernels execute today: the llama block (RMSNorm, RoPE on
// adjacent pairs without scaling, SwiGLU/ReLU-gated FFN, no biases). Any other feature of the
// model description is refused by name before anything is allocated, so a model never runs
// wrongly on the device; the host backend runs every architecture.
absl::Status CheckDeviceFeatures(const Model& model) {
  const ModelConfig& c = model.config();
  std::vector<std::string> missing;
  auto need = [&](bool ok, const char* what) {
    if (!ok) missing.push_back(what);
  };
  const ArchSpec* a = c.arch;
  need(a == nullptr || a->norm == NormKind::kRms, "LayerNorm");
  need(a == nullptr || a->rope == RopeStyle::kNorm, "NeoX RoPE");
  need(a == nullptr || (!a->parallel_block && a->attn_norm && a->ffn_norm), "parallel or norm-less blocks");
  need(a == nullptr || (!a->post_attn_norm && !a->post_ffn_norm), "post-norms");
  need(a == nullptr || !a->embed_scale, "embedding scaling");
  need(c.rope_scaling.kind == RopeScaling::Kind::kNone && model.rope_freqs().empty(),
       "RoPE scaling (rope_freqs, linear, YaRN)");
  need(c.q_dim == c.dim, "a head size other than dim / heads");
  need(c.attn_softcap == 0 && c.final_softcap == 0, "soft-capping");
  need(!c.moe(), "mixture of experts");
  need(c.activation == FfnActivation::kSilu || c.activation == FfnActivation::kRelu,
       "GELU or dReLU activations");
  bool biases = false, qk_norm = false, window = false, gated = true;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = model.layer(l);
    biases |= !w.bq.empty() || !w.bk.empty() || !w.bv.empty() || !w.bo.empty() ||
              !w.up_b.empty() || !w.down_b.empty();
    qk_norm |= !w.q_norm.empty();
    window |= c.layers[l].sliding_window > 0;
    gated &= !w.gate.empty();
  }
  need(!biases, "projection biases");
  need(!qk_norm, "q/k norms");
  need(!window, "sliding-window attention");
  need(gated, "FFNs without a gate");
  if (missing.empty()) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(
      "the cuda backend does not run this ", c.arch_name(), " model yet (it needs: ",
      absl::StrJoin(missing, ", "), "); use --backend host"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const Model& model,
                                                           SparsityPlan plan, Partition partition,
                                                           const CudaBackendOptions& options) {
  TC_RETURN_IF_ERROR(CheckDeviceFeatures(model));
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
