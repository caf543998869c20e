// Which of ATen's oneDNN entry points this CPU may call. On x86, ATen's
// mkldnn_matmul (every dtype, fp32 included), its bf16 weight reorder and
// its bf16 convolution refuse CPUs without AVX512BW/VL/DQ (its bf16 device
// check also accepts AVX_NE_CONVERT, which ember leaves to ATen's other
// paths): AVX2-only CPUs such as AMD Zen 3 take ATen's or ember's kernels.
#pragma once

#include "ember/runtime/cpu_features.h"

namespace ember::kernels {

inline bool onednn_bf16_supported() {
  static const bool supported = [] {
    const runtime::CpuFeatures& f = runtime::cpu_features();
    return f.avx512bw && f.avx512vl && f.avx512dq;
  }();
  return supported;
}

}  // namespace ember::kernels
