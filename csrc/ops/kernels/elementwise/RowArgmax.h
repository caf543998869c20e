// The index of a row's largest value, vectorised (AVX-512F): CPU's argmax
// over the last dimension compares one element at a time (a GPT-2
// vocabulary row of 50257: ~44 us in fp32, ~180 us in bf16 on a Zen 4 core).
// The answer is CPU's exactly: the first index of the maximum, a NaN
// counting as larger than any number (the first NaN wins), -0.0 equal to
// 0.0; bf16 values compared as the fp32 values they are.
#pragma once

#include <cstdint>

namespace ember::kernels {

// Whether this CPU runs the kernels (AVX-512F; elsewhere CPU's argmax,
// whose ~44 us per GPT-2 vocabulary row is ~0.2% of a decode step).
bool row_argmax_supported();

// Rows of at most this many elements (lane indices are 32-bit).
inline constexpr int64_t kRowArgmaxMaxLength = int64_t{1} << 31;

// out[r] = argmax of row r (rows of `n` contiguous elements, n >= 1,
// n < kRowArgmaxMaxLength), rows split across the calling thread's OpenMP
// team when there is enough work.
void row_argmax_f32(const float* rows, int64_t row_count, int64_t n,
                    int64_t* out);
void row_argmax_bf16(const uint16_t* rows, int64_t row_count, int64_t n,
                     int64_t* out);

}  // namespace ember::kernels
