#include "gpu_worker/cuda/cuda_util.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace thermocline::gpu_worker::cuda {

absl::Status CudaStatus(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("CUDA: ", call, " failed: ", cudaGetErrorName(e), " (",
                                          cudaGetErrorString(e), ")"));
}

absl::Status CublasStatus(cublasStatus_t s, const char* call) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuBLAS: ", call, " failed: ", cublasGetStatusName(s),
                                          " (", cublasGetStatusString(s), ")"));
}

absl::Status CudaDeviceAvailable() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("cudaGetDeviceCount: ", cudaGetErrorName(e), " (",
                                               cudaGetErrorString(e), ")"));
  }
  if (n == 0) return absl::UnavailableError("cudaGetDeviceCount found 0 devices");
  return absl::OkStatus();
}

absl::Status GemmF16(cublasHandle_t handle, const uint16_t* w, int64_t rows, int64_t cols,
                     const uint16_t* x, int64_t n, float* y, int64_t ldy, float beta) {
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  if (rows > kMax || cols > kMax || n > kMax || ldy > kMax) {
    return absl::InvalidArgumentError(absl::StrCat("GemmF16: shape ", rows, "x", cols, " x ", n,
                                                   " exceeds cuBLAS's int dimensions"));
  }
  if (n == 0) return absl::OkStatus();
  const float alpha = 1.0f;
  TC_CUBLAS(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows),
                         static_cast<int>(n), static_cast<int>(cols), &alpha, w, CUDA_R_16F,
                         static_cast<int>(cols), x, CUDA_R_16F, static_cast<int>(cols), &beta, y,
                         CUDA_R_32F, static_cast<int>(ldy), CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

}  // namespace thermocline::gpu_worker::cuda
