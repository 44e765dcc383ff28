#include "gpu_worker/host/host_backend.h"

#include "absl/strings/str_cat.h"
#include "shared/util/status_macros.h"

namespace thermocline::gpu_worker {

HostBackend::HostBackend(const Model& model, KvCache kv, int threads)
    : model_(model), kv_(std::move(kv)), pool_(threads) {}

absl::StatusOr<std::unique_ptr<HostBackend>> HostBackend::Create(
    const Model& model, SparsityPlan plan, Partition partition,
    const HostBackendOptions& options) {
  const ModelConfig& c = model.config();
  const int64_t context = options.context > 0 ? options.context : c.context_length;
  if (options.n_kv_slots < 1) return absl::InvalidArgumentError("--kv-slots must be >= 1");
  if (options.max_batch < 1) return absl::InvalidArgumentError("--max-batch must be >= 1");
  if (options.threads < 1) return absl::InvalidArgumentError("--threads must be >= 1");
  if (context > c.context_length) {
    return absl::InvalidArgumentError(absl::StrCat("--context ", context,
                                                   " exceeds the model's context length ",
                                                   c.context_length));
  }
  if (options.prefix_cache_blocks < 0) {
    return absl::InvalidArgumentError("--prefix-cache-blocks must be >= 0");
  }
  TC_ASSIGN_OR_RETURN(KvCache kv, KvCache::Create(c, options.n_kv_slots, context, options.kv_type,
                                                  options.prefix_cache_blocks));
  std::unique_ptr<HostBackend> b(new HostBackend(model, std::move(kv), options.threads));
  std::optional<TealPlan> teal_ffn;
  if (options.teal && options.teal->ffn) teal_ffn = options.teal;
  TC_ASSIGN_OR_RETURN(
      b->ffn_, SplitFfn::Create(model, std::move(plan), std::move(partition), b->pool_, teal_ffn));
  if (options.teal) {
    // Attention's projections here; the FFN's are the split FFN's (TealFfnPart).
    TealPlan attention = *options.teal;
    attention.ffn = false;
    TC_ASSIGN_OR_RETURN(b->teal_, TealLinear::Create(model, std::move(attention), b->pool_));
  }
  b->pass_ = std::make_unique<ForwardPass>(model, b->kv_, b->pool_, b->ffn_.get(), b->teal_.get());
  b->limits_ = BackendLimits{options.n_kv_slots, static_cast<int32_t>(context), options.max_batch,
                             static_cast<int32_t>(c.vocab_size)};
  if (options.prefix_cache_blocks > 0) {
    b->limits_.n_kv_blocks = static_cast<int32_t>(b->kv_.n_blocks());
    b->limits_.blocks_per_slot = static_cast<int32_t>(b->kv_.blocks_per_slot());
  }
  return b;
}

absl::Status HostBackend::StartStep(std::span<const BatchEntry> batch, ColdLink& cold) {
  if (batch.empty() || static_cast<int64_t>(batch.size()) > limits_.max_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("step of ", batch.size(), " entries, outside [1, ", limits_.max_batch, "]"));
  }
  batch_.assign(batch.begin(), batch.end());
  cold_ = &cold;
  return absl::OkStatus();
}

absl::Status HostBackend::FinishStep(std::vector<float>* logits) {
  if (cold_ == nullptr) return absl::FailedPreconditionError("FinishStep without StartStep");
  // Only TEAL over the FFN reads the decode rows here (ForwardPass marks them for attention's).
  decode_.clear();
  if (ffn_->teal_ffn()) DecodeRows(batch_, decode_);
  ffn_->BeginStep(cold_, decode_);
  absl::Status run = pass_->Run(batch_, *logits);
  absl::Status ffn = ffn_->EndStep();
  cold_ = nullptr;
  // The FFN's error explains a failed step better than anything after it.
  if (!ffn.ok()) return ffn;
  return run;
}

}  // namespace thermocline::gpu_worker
