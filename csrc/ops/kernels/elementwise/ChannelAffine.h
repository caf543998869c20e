// out = in * scale[c] + shift[c] per channel c over fp32 images: batch
// norm's inference transform (scale and shift folded from the running
// statistics, the weight and the bias). One pass over the data, AVX-512F
// or AVX2 + FMA (the same bits); plain C++, no torch types.
#pragma once

#include <cstdint>

namespace ember::kernels {

// Whether this CPU runs the kernels below (AVX-512F, or AVX2 + FMA).
bool channel_affine_supported();

// Batch norm's inference terms per channel, as CPU folds them:
// scale = weight / sqrt(var + eps), shift = bias - mean * scale (weight,
// bias: null for none). Bitwise CPU's (see the definition).
void fold_batch_norm_f32(const float* mean, const float* var,
                         const float* weight, const float* bias, float eps,
                         int64_t channels, float* scale, float* shift);

// Planes: [outer][channels][inner] (NCHW and other contiguous layouts).
// `in` and `out` may be the same array.
void channel_affine_planes_f32(const float* in, float* out, int64_t outer,
                               int64_t channels, int64_t inner,
                               const float* scale, const float* shift);

// Rows: [rows][channels] (channels-last images).
void channel_affine_rows_f32(const float* in, float* out, int64_t rows,
                             int64_t channels, const float* scale,
                             const float* shift);

}  // namespace ember::kernels
