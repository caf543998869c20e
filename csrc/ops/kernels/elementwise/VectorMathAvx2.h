// The AVX2 + FMA forms of VectorMath.h's kernels, for CPUs without AVX-512
// (AMD Zen 3, Intel client cores). Same contracts as VectorMath.h, and the
// AVX-512 forms' bits (the same operations lane by lane, sums over the same
// 16 lanes reduced in the same order), except tanh and GELU: there an exact
// division replaces the refined rcp14 estimate AVX2 lacks, so those may
// differ from the AVX-512 forms' in the last bit (never run to run).
// VectorMath.cpp dispatches to these; nothing else calls them.
#pragma once

#include <cstdint>

namespace ember::kernels::avx2 {

void tanh_f32(const float* in, float* out, int64_t n);
void tanh_bf16(const uint16_t* in, uint16_t* out, int64_t n);
void gelu_tanh_f32(const float* in, float* out, int64_t n);
void gelu_tanh_bf16(const uint16_t* in, uint16_t* out, int64_t n);
float max_f32(const float* row, int64_t n);
float add_max_f32(float* row, const float* addend, int64_t n);
float exp_shifted_sum_f32(float* row, int64_t n, float shift);
void scale_f32(const float* in, float factor, float* out, int64_t n);
float dot_f32(const float* a, const float* b, int64_t n);
void weighted_row_sum_f32(const float* weights, int64_t n, const float* rows,
                          int64_t row_stride, float* out, int64_t width);

}  // namespace ember::kernels::avx2
