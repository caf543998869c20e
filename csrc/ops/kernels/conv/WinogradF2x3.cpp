#include "ops/kernels/conv/WinogradF2x3.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>

#include "ops/kernels/AlignedFloats.h"
#include "ops/kernels/matmul/ChannelGemm.h"

namespace ember::conv {
namespace {

using kernels::AlignedFloats;

constexpr int64_t kLanes = 16;  // tiles per vector: one zmm of fp32

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

__mmask16 lanes(int64_t live) {
  return live >= kLanes ? __mmask16(0xFFFF)
                        : static_cast<__mmask16>((1u << live) - 1u);
}

// One image plane with its zero border, laid out so that every load the
// input transform makes (32 floats from any tile's column) stays inside.
struct PaddedPlane {
  int64_t rows = 0, stride = 0;

  explicit PaddedPlane(const WinogradGeometry& g)
      : rows(2 * g.tiles_h() + 2),
        stride(2 * round_up(g.tiles_w(), kLanes) + 2 + kLanes) {}

  int64_t floats() const { return rows * stride; }

  void fill(const float* plane, const WinogradGeometry& g, float* out) const {
    std::fill(out, out + floats(), 0.0f);
    for (int64_t y = 0; y < g.height; ++y) {
      const int64_t row = y + g.pad_h;
      if (row >= rows) break;
      const int64_t columns =
          std::min<int64_t>(g.width, stride - g.pad_w - kLanes);
      std::copy(plane + y * g.width, plane + y * g.width + columns,
                out + row * stride + g.pad_w);
    }
  }
};

// V[xi][c][tile] = (B^T d B)[xi] for the tiles of one padded plane, 16 tiles
// of a tile row at a time: a row of d for 16 tiles is the padded row's
// even- and odd-indexed floats (deinterleaved by permutes).
__attribute__((target("avx512f"))) void transform_input_plane(
    const float* padded, int64_t stride, const WinogradGeometry& g,
    int64_t first_tile, int64_t position_stride, float* v) {
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12,
                                        10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13,
                                       11, 9, 7, 5, 3, 1);
  const int64_t tiles_w = g.tiles_w();
  for (int64_t ty = 0; ty < g.tiles_h(); ++ty) {
    for (int64_t t0 = 0; t0 < tiles_w; t0 += kLanes) {
      __m512 d[4][4];
      for (int i = 0; i < 4; ++i) {
        const float* row = padded + (2 * ty + i) * stride + 2 * t0;
        const __m512 a = _mm512_loadu_ps(row);
        const __m512 b = _mm512_loadu_ps(row + kLanes);
        const __m512 c = _mm512_loadu_ps(row + 2);
        const __m512 e = _mm512_loadu_ps(row + 2 + kLanes);
        d[i][0] = _mm512_permutex2var_ps(a, even, b);
        d[i][1] = _mm512_permutex2var_ps(a, odd, b);
        d[i][2] = _mm512_permutex2var_ps(c, even, e);
        d[i][3] = _mm512_permutex2var_ps(c, odd, e);
      }
      __m512 t[4][4];
      for (int j = 0; j < 4; ++j) {  // B^T d
        t[0][j] = _mm512_sub_ps(d[0][j], d[2][j]);
        t[1][j] = _mm512_add_ps(d[1][j], d[2][j]);
        t[2][j] = _mm512_sub_ps(d[2][j], d[1][j]);
        t[3][j] = _mm512_sub_ps(d[1][j], d[3][j]);
      }
      const __mmask16 mask = lanes(tiles_w - t0);
      float* out = v + first_tile + ty * tiles_w + t0;
      for (int i = 0; i < 4; ++i) {  // (B^T d) B
        const __m512 row[4] = {
            _mm512_sub_ps(t[i][0], t[i][2]), _mm512_add_ps(t[i][1], t[i][2]),
            _mm512_sub_ps(t[i][2], t[i][1]), _mm512_sub_ps(t[i][1], t[i][3])};
        for (int j = 0; j < 4; ++j) {
          _mm512_mask_storeu_ps(out + (4 * i + j) * position_stride, mask,
                                row[j]);
        }
      }
    }
  }
}

// The output plane of an epilogue (k: its output channel, plane_at: its
// place in out's layout counted from image 0).
struct PlaneEpilogue {
  const matmul::ChannelEpilogue* steps = nullptr;
  int64_t k = 0;
  int64_t plane_at = 0;
};

// Up to 32 values of an output row: stored, and/or given to the epilogue.
__attribute__((target("avx512f"))) void store_row(float* row, __m512 low,
                                                  __m512 high, int64_t columns,
                                                  const PlaneEpilogue& e,
                                                  int64_t row_at) {
  if (e.steps == nullptr || e.steps->store_product) {
    _mm512_mask_storeu_ps(row, lanes(columns), low);
    if (columns > kLanes) {
      _mm512_mask_storeu_ps(row + kLanes, lanes(columns - kLanes), high);
    }
  }
  if (e.steps != nullptr) {
    alignas(64) float values[2 * kLanes];
    _mm512_store_ps(values, low);
    _mm512_store_ps(values + kLanes, high);
    matmul::apply_channel_epilogue(*e.steps, values, 2 * kLanes, row_at, 0, e.k,
                                   1, std::min(columns, 2 * kLanes));
  }
}

// out plane of one (image, output channel) = A^T M A (+ bias), then the
// epilogue's steps: 16 tiles at a time; each output row's two columns per
// tile are interleaved by permutes into 32 consecutive floats.
__attribute__((target("avx512f"))) void transform_output_plane(
    const float* m, int64_t position_stride, const WinogradGeometry& g,
    int64_t first_tile, float bias, float* out, const PlaneEpilogue& e) {
  const __m512i low =
      _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i high = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11,
                                        26, 10, 25, 9, 24, 8);
  const int64_t tiles_w = g.tiles_w(), out_h = g.out_h(), out_w = g.out_w();
  const __m512 b = _mm512_set1_ps(bias);
  for (int64_t ty = 0; ty < g.tiles_h(); ++ty) {
    for (int64_t t0 = 0; t0 < tiles_w; t0 += kLanes) {
      const __mmask16 mask = lanes(tiles_w - t0);
      const float* in = m + first_tile + ty * tiles_w + t0;
      __m512 s[2][4];
      for (int j = 0; j < 4; ++j) {  // A^T M
        const __m512 m0 = _mm512_maskz_loadu_ps(mask, in + j * position_stride);
        const __m512 m1 =
            _mm512_maskz_loadu_ps(mask, in + (4 + j) * position_stride);
        const __m512 m2 =
            _mm512_maskz_loadu_ps(mask, in + (8 + j) * position_stride);
        const __m512 m3 =
            _mm512_maskz_loadu_ps(mask, in + (12 + j) * position_stride);
        s[0][j] = _mm512_add_ps(_mm512_add_ps(m0, m1), m2);
        s[1][j] = _mm512_sub_ps(_mm512_sub_ps(m1, m2), m3);
      }
      const int64_t columns = out_w - 2 * t0;
      for (int r = 0; r < 2; ++r) {  // (A^T M) A
        const int64_t y = 2 * ty + r;
        if (y >= out_h) break;
        const __m512 left = _mm512_add_ps(
            _mm512_add_ps(_mm512_add_ps(s[r][0], s[r][1]), s[r][2]), b);
        const __m512 right = _mm512_add_ps(
            _mm512_sub_ps(_mm512_sub_ps(s[r][1], s[r][2]), s[r][3]), b);
        store_row(out + y * out_w + 2 * t0,
                  _mm512_permutex2var_ps(left, low, right),
                  _mm512_permutex2var_ps(left, high, right), columns, e,
                  e.plane_at + y * out_w + 2 * t0);
      }
    }
  }
}

// Images are transformed and multiplied in groups of at most this many
// floats of V and M together (8 MiB; ResNet-50's largest layer needs 1.6 M
// per image), at least one image per group. The calling thread keeps its
// buffers that size for the next call: freed and faulted in again on every
// call, a 100 MiB buffer made a 224x224 layer 8x slower than oneDNN.
constexpr int64_t kKeptFloats = winograd_group_floats;

}  // namespace

bool winograd_supported() {
  static const bool supported = __builtin_cpu_supports("avx512f");
  return supported;
}

void winograd_transform_filter(const float* weight, int64_t out_channels,
                               int64_t channels, float* filter) {
  const int64_t plane = out_channels * channels;
  for (int64_t k = 0; k < out_channels; ++k) {
    for (int64_t c = 0; c < channels; ++c) {
      const float* w = weight + (k * channels + c) * 9;
      // G g (4 x 3), then (G g) G^T (4 x 4), in double: one rounding.
      double gg[4][3];
      for (int j = 0; j < 3; ++j) {
        const double w0 = w[j], w1 = w[3 + j], w2 = w[6 + j];
        gg[0][j] = w0;
        gg[1][j] = 0.5 * (w0 + w1 + w2);
        gg[2][j] = 0.5 * (w0 - w1 + w2);
        gg[3][j] = w2;
      }
      for (int i = 0; i < 4; ++i) {
        const double u[4] = {gg[i][0], 0.5 * (gg[i][0] + gg[i][1] + gg[i][2]),
                             0.5 * (gg[i][0] - gg[i][1] + gg[i][2]), gg[i][2]};
        for (int j = 0; j < 4; ++j) {
          filter[(4 * i + j) * plane + k * channels + c] =
              static_cast<float>(u[j]);
        }
      }
    }
  }
}

namespace {

// One group of images, all three steps.
// out_at: out's place counted from image 0 (the epilogue's addresses).
void winograd_group(const WinogradGeometry& g, const float* input,
                    const float* filter, const float* bias, float* out,
                    const matmul::ChannelEpilogue* epilogue, int64_t out_at) {
  const int64_t tiles = g.tiles();
  const int64_t tiles_per_image = g.tiles_h() * g.tiles_w();
  const int64_t c_count = g.channels, k_count = g.out_channels;
  thread_local AlignedFloats v_buffer, m_buffer;
  // Rows of 16 positions: V is 16 x C x P, M 16 x K x P.
  float* v = v_buffer.resize(16 * c_count * tiles);
  float* m = m_buffer.resize(16 * k_count * tiles);
  const PaddedPlane padded(g);
  const int64_t in_plane = g.height * g.width;
  at::parallel_for(0, g.images * c_count, 1, [&](int64_t begin, int64_t end) {
    thread_local AlignedFloats plane_buffer;
    float* plane = plane_buffer.resize(padded.floats());
    for (int64_t task = begin; task < end; ++task) {
      const int64_t image = task / c_count, c = task % c_count;
      padded.fill(input + task * in_plane, g, plane);
      transform_input_plane(plane, padded.stride, g,
                            c * tiles + image * tiles_per_image,
                            c_count * tiles, v);
    }
  });
  for (int xi = 0; xi < 16; ++xi) {
    matmul::ChannelGemmArgs args;
    args.w = filter + xi * k_count * c_count;
    args.ldw = c_count;
    args.x = v + xi * c_count * tiles;
    args.ldx = tiles;
    args.out = m + xi * k_count * tiles;
    args.ldo = tiles;
    args.m = k_count;
    args.k = c_count;
    args.n = tiles;
    matmul::channel_gemm_f32(args);
  }
  const int64_t out_plane = g.out_h() * g.out_w();
  at::parallel_for(0, g.images * k_count, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t image = task / k_count, k = task % k_count;
      transform_output_plane(
          m, k_count * tiles, g, k * tiles + image * tiles_per_image,
          bias != nullptr ? bias[k] : 0.0f, out + task * out_plane,
          PlaneEpilogue{epilogue, k, out_at + task * out_plane});
    }
  });
  v_buffer.release_above(kKeptFloats);
  m_buffer.release_above(kKeptFloats);
}

}  // namespace

int64_t winograd_buffer_floats(const WinogradGeometry& g, int64_t images) {
  return 16 * (g.channels + g.out_channels) * g.tiles_h() * g.tiles_w() *
         images;
}

void winograd_conv(const WinogradGeometry& g, const float* input,
                   const float* filter, const float* bias, float* out,
                   const matmul::ChannelEpilogue* epilogue) {
  if (epilogue != nullptr && epilogue->count == 0) epilogue = nullptr;
  // Images go through in groups whose transformed tiles (V and M) take at
  // most kGroupFloats, one image at least.
  const int64_t group = std::clamp<int64_t>(
      winograd_group_floats /
          std::max<int64_t>(1, winograd_buffer_floats(g, 1)),
      1, g.images);
  const int64_t in_image = g.channels * g.height * g.width;
  const int64_t out_image = g.out_channels * g.out_h() * g.out_w();
  for (int64_t first = 0; first < g.images; first += group) {
    WinogradGeometry part = g;
    part.images = std::min(group, g.images - first);
    winograd_group(part, input + first * in_image, filter, bias,
                   out + first * out_image, epilogue, first * out_image);
  }
}

}  // namespace ember::conv
