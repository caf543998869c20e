// ember's own vectorised transcendental functions over fp32 arrays, for the
// ops where ATen's (SLEEF's 1-ulp variants) cost a profile's worth of time:
// tanh ran at ~9 cycles per element in GPT-2's GELU. Accuracy is a few ulp
// (checked against float64 in tests/test_elementwise.py), far inside the
// tolerances PyTorch's own device tests use for float32.
#pragma once

#include <cstdint>

namespace ember::kernels {

// Whether the vector kernels can run here (AVX-512F, or AVX2 + FMA:
// VectorMathAvx2.h).
bool vector_math_supported();

// out[i] = tanh(in[i]) for i < n; `in` and `out` may be the same array.
void tanh_f32(const float* in, float* out, int64_t n);
// The same over bf16 values (raw bits): computed in fp32 and rounded to the
// nearest bf16 (ties to even), as CPU's bf16 kernels compute.
void tanh_bf16(const uint16_t* in, uint16_t* out, int64_t n);

// out[i] = gelu(in[i], approximate="tanh") = x (1 + tanh(u)) / 2, u =
// sqrt(2/pi) (x + 0.044715 x^3), to a few ulp of the result on both sides
// of 0 (CPU's kernel: ~5x the time); bf16 as tanh_bf16. The erf form stays
// CPU's: a vector erfc with relative accuracy took more instructions than
// ATen's (43 vs 37 cycles per 16 floats in L2 on an Intel Xeon).
void gelu_tanh_f32(const float* in, float* out, int64_t n);
void gelu_tanh_bf16(const uint16_t* in, uint16_t* out, int64_t n);

// Softmax pieces over one row of n floats (n >= 1):
// the largest value (-inf for an all -inf row; NaN if any is NaN),
float max_f32(const float* row, int64_t n);
// the same after row[i] += addend[i] (an additive mask) in the same pass,
float add_max_f32(float* row, const float* addend, int64_t n);
// row[i] = exp(row[i] - shift) in place; returns the sum of the results.
float exp_shifted_sum_f32(float* row, int64_t n, float shift);

// out[i] = in[i] * factor for i < n; `in` and `out` may be the same array.
void scale_f32(const float* in, float factor, float* out, int64_t n);

// Level-1 pieces for one-row attention (decode):
// sum of a[i] * b[i] for i < n,
float dot_f32(const float* a, const float* b, int64_t n);
// out[c] = sum over j < n of weights[j] * rows[j * row_stride + c], for
// c < width (accumulated in registers, 64 columns at a time).
void weighted_row_sum_f32(const float* weights, int64_t n, const float* rows,
                          int64_t row_stride, float* out, int64_t width);

}  // namespace ember::kernels
