// The kernel families the kernel tests run over (every SIMD level the build has; a family this
// CPU cannot run skips, saying so), a fixture that selects one and restores the previous one,
// and the small helpers those tests share.
#pragma once

#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/gguf/matrix_view.h"
#include "shared/kernels/dispatch.h"
#include "shared/kernels/matmul.h"
#include "shared/util/cpu_features.h"
#include "shared/util/thread_pool.h"

namespace thermocline::testing {

// A kernel family: SIMD level plus, for AVX2, whether quantized block sums use AVX-VNNI.
struct KernelFamily {
  SimdLevel level;
  bool vnni;
  const char* name;
};
inline constexpr KernelFamily kKernelFamilies[] = {{SimdLevel::kPortable, false, "portable"},
                                                   {SimdLevel::kAvx2, false, "avx2"},
                                                   {SimdLevel::kAvx2, true, "avx2_vnni"}};

inline void PrintTo(const KernelFamily& f, std::ostream* os) { *os << f.name; }

// For INSTANTIATE_TEST_SUITE_P(..., ::testing::ValuesIn(kKernelFamilies), KernelFamilyName).
inline std::string KernelFamilyName(const ::testing::TestParamInfo<KernelFamily>& info) {
  return info.param.name;
}

class KernelFamilyTest : public ::testing::TestWithParam<KernelFamily> {
 protected:
  void SetUp() override {
    saved_level_ = ActiveKernelSimdLevel();
    saved_vnni_ = ActiveKernelUsesVnni();
    if (!SetSimdLevelForTesting(GetParam().level, GetParam().vnni)) {
      GTEST_SKIP() << "this CPU cannot run " << GetParam().name;
    }
  }
  void TearDown() override { SetSimdLevelForTesting(saved_level_, saved_vnni_); }

 private:
  SimdLevel saved_level_ = SimdLevel::kPortable;
  bool saved_vnni_ = false;
};

// W x for n_tokens tokens of x (stride w.cols) through MatMul on a pool of `threads`; the
// output is prefilled with -1 so that an unwritten entry shows.
inline std::vector<float> MultiplyOnPool(const MatrixView& w, const std::vector<float>& x,
                                         int64_t n_tokens, int threads) {
  ThreadPool pool(threads);
  std::vector<float> y(n_tokens * w.rows, -1.0f);
  MatMul(w, x.data(), n_tokens, w.cols, y.data(), w.rows, pool);
  return y;
}

inline bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace thermocline::testing
