// A growable float buffer whose first element is 64-byte aligned (one cache
// line, one zmm): scratch for the kernels that pack operands into panels
// and load them with aligned AVX-512 loads (channel GEMM, attention).
#pragma once

#include <cstdint>
#include <vector>

namespace ember::kernels {

class AlignedFloats {
 public:
  // At least `n` floats from the returned (aligned) address; the contents
  // are kept only while the size does not grow.
  float* resize(int64_t n) {
    storage_.resize(static_cast<size_t>(n + kLineFloats));
    const auto address = reinterpret_cast<uintptr_t>(storage_.data());
    return storage_.data() + ((64 - address % 64) % 64) / sizeof(float);
  }

  // Frees the buffer when it holds more than `n` floats (a thread-lived
  // buffer that one large call grew need not keep that memory).
  void release_above(int64_t n) {
    if (static_cast<int64_t>(storage_.size()) > n + kLineFloats) {
      std::vector<float>().swap(storage_);
    }
  }

 private:
  static constexpr int64_t kLineFloats = 64 / sizeof(float);
  std::vector<float> storage_;
};

}  // namespace ember::kernels
