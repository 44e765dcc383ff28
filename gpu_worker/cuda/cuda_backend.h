// The `cuda` backend of the GPU worker (docs/cuda.md): attention, the KV cache, norms,
// predictors, the hot FFN neurons and the output head in device memory; cuBLAS for the dense
// products, own kernels (kernels.h) for the rest. This header is all the worker sees of it and
// names no CUDA type: main.cc includes it only when the build has CUDA (THERMOCLINE_HAVE_CUDA).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu_worker/backend.h"
#include "shared/gguf/ggml_type.h"
#include "shared/model/model.h"
#include "shared/sparsity/partition.h"
#include "shared/sparsity/sparsity_mode.h"

namespace thermocline::gpu_worker {

struct CudaBackendOptions {
  int threads = 1;  // host threads for converting weights at load
  int32_t n_kv_slots = 4;
  int32_t context = 0;  // 0: the model's context length
  int32_t max_batch = 512;
  GgmlType kv_type = GgmlType::kF32;
  // Device memory the backend may use, in bytes; 0: whatever the device has free. The load is
  // refused (naming the bytes needed and the budget) when the plan does not fit.
  int64_t vram_budget = 0;
  int device = 0;
  std::function<void(const std::string&)> log;  // load-time report lines; may be empty
};

// Loads the model's device part onto the GPU. `model` must outlive the backend (token
// embeddings stay in its host mapping: each step gathers its rows on the host).
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const Model& model,
                                                           SparsityPlan plan, Partition partition,
                                                           const CudaBackendOptions& options);

// OK when a CUDA device is present and usable; otherwise why not.
absl::Status CudaAvailable();

struct CudaDeviceMemory {
  std::string name;
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};
// The device's name and its free and total memory now (cudaMemGetInfo), for the placement a
// caller plans when it is given none (shared/driver/default_placement.h).
absl::StatusOr<CudaDeviceMemory> QueryCudaDeviceMemory(int device);

}  // namespace thermocline::gpu_worker
