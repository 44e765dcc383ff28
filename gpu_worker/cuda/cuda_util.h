// Status plumbing and RAII memory for the CUDA backend: every CUDA runtime and cuBLAS call goes
// through TC_CUDA / TC_CUBLAS, which turn a failure into an Internal status carrying the call's
// text, the error's name and its description (the worker logs it when the step or load fails).
// Only gpu_worker/cuda/ and tests/gpu/ include this header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shared/util/status_macros.h"

namespace thermocline::gpu_worker::cuda {

absl::Status CudaStatus(cudaError_t e, const char* call);
absl::Status CublasStatus(cublasStatus_t s, const char* call);

#define TC_CUDA(expr) TC_RETURN_IF_ERROR(::thermocline::gpu_worker::cuda::CudaStatus((expr), #expr))
#define TC_CUBLAS(expr) \
  TC_RETURN_IF_ERROR(::thermocline::gpu_worker::cuda::CublasStatus((expr), #expr))

// OK when a CUDA device can be used; else why not (no device, no driver, ...), for the worker's
// error message and for the GPU tests' skip message.
absl::Status CudaDeviceAvailable();

// n elements of T in device memory (cudaMalloc), or in pinned host memory (cudaHostAlloc:
// page-locked, so cudaMemcpyAsync to and from it is a DMA that overlaps compute).
template <typename T, bool kPinned = false>
class CudaArray {
 public:
  CudaArray() = default;
  CudaArray(CudaArray&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  CudaArray& operator=(CudaArray&& o) noexcept {
    if (this != &o) {
      Free();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  CudaArray(const CudaArray&) = delete;
  CudaArray& operator=(const CudaArray&) = delete;
  ~CudaArray() { Free(); }

  absl::Status Allocate(size_t n) {
    Free();
    if (n == 0) return absl::OkStatus();
    void* p = nullptr;
    if constexpr (kPinned) {
      TC_CUDA(cudaHostAlloc(&p, n * sizeof(T), cudaHostAllocDefault));
    } else {
      TC_CUDA(cudaMalloc(&p, n * sizeof(T)));
    }
    p_ = static_cast<T*>(p);
    n_ = n;
    return absl::OkStatus();
  }
  // Synchronous copies of the first n elements (load time and tests).
  absl::Status Upload(const T* src, size_t n) {
    TC_CUDA(cudaMemcpy(p_, src, n * sizeof(T), cudaMemcpyHostToDevice));
    return absl::OkStatus();
  }
  absl::Status Download(T* dst, size_t n) const {
    TC_CUDA(cudaMemcpy(dst, p_, n * sizeof(T), cudaMemcpyDeviceToHost));
    return absl::OkStatus();
  }

  T* get() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

 private:
  void Free() {
    // Errors while freeing are ignored: this runs in destructors, and a context that cannot free
    // has already failed a checked call that reported why.
    if (p_ == nullptr) return;
    if constexpr (kPinned) {
      cudaFreeHost(p_);
    } else {
      cudaFree(p_);
    }
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  size_t n_ = 0;
};
template <typename T>
using PinnedArray = CudaArray<T, true>;

// y[t][r] = beta * y[t][r] + sum_c W[r][c] x[t][c] for t < n, r < rows (row-major, ldy floats
// between rows of y): cuBLAS GemmEx with fp16 W and x, fp32 accumulation (CUBLAS_COMPUTE_32F)
// and fp32 y. W row-major [rows][cols] is cuBLAS's column-major [cols][rows], hence op(A) = T.
absl::Status GemmF16(cublasHandle_t handle, const uint16_t* w, int64_t rows, int64_t cols,
                     const uint16_t* x, int64_t n, float* y, int64_t ldy, float beta);

}  // namespace thermocline::gpu_worker::cuda
