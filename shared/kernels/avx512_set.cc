// The avx512 kernel family's table. Compiled without AVX-512 flags: it only copies function
// pointers, and it runs only after the run-time check (matmul.cc calls it at kAvx512).
#include "shared/kernels/matmul_kernels.h"

namespace thermocline::matmul_internal {

const KernelSet& Avx512Kernels() {
  static const KernelSet set = [] {
    // The avx2 family's entries are the starting point; every *_avx512.cc file below replaces
    // the slots it has kernels for.
    KernelSet s = Avx2Kernels(CpuHasAvxVnni());
    s.name = "avx512";
    FillKQuantAvx512(s);
    FillInterleavedAvx512(s);
    FillRowAvx512(s);
    s.int_axpy = IntAxpyTable(&IntAxpyQ4_0Avx512);
    return s;
  }();
  return set;
}

}  // namespace thermocline::matmul_internal
