// <immintrin.h> for the *_avx512.cc files. GCC 12's AVX-512 intrinsics start many results from
// _mm512_undefined_*(), a self-initialized variable that its -W(maybe-)uninitialized then flags
// wherever they are inlined (GCC bug 105593, fixed in 13), failing -Werror builds; the warnings
// are turned off for the header's own code only (diagnostic pragmas follow source locations),
// so they still apply to ours. Include this before anything that includes <immintrin.h>.
#pragma once

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
