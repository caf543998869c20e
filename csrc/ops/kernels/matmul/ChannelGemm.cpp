#include "ops/kernels/matmul/ChannelGemm.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "ops/kernels/AlignedFloats.h"
#include "ops/kernels/matmul/PanelTile.h"

// GCC 12 reports its own intrinsics' deliberately undefined register
// operands (inside _mm512_reduce_add_ps) as uninitialised.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace ember::matmul {
namespace {

constexpr int64_t kWidth = 16;  // pixels per panel: one zmm of fp32
constexpr int kMaxPanels = 3;   // panels per micro-kernel call
constexpr int kMaxRows = 8;     // weight rows per micro-kernel call
constexpr int64_t kGroupColumns = kMaxPanels * kWidth;
// Up to this many pixels past the last full panel (ResNet's 7x7 = 3 x 16 +
// 1) are dot products of weight rows with the packed pixel columns instead
// of a panel that would be mostly padding.
constexpr int64_t kMaxDotColumns = 4;

// kRows x (kPanels * 16) outputs: per k, kPanels panel loads and kRows
// weight broadcasts feed kRows * kPanels FMAs (8 x 3 = 24 accumulators).
template <int kRows, int kPanels>
__attribute__((target("avx512f"))) void block(const float* w, int64_t ldw,
                                              int64_t k, const float* panels,
                                              PrefetchRun prefetch,
                                              const float* bias, float* out,
                                              int64_t ldo, int64_t columns) {
  __m512 acc[kRows][kPanels];
  accumulate_panel_tile<kRows, kPanels>(w, ldw, k, panels, k * kWidth, acc,
                                        prefetch);
#pragma GCC unroll 8
  for (int i = 0; i < kRows; ++i) {
    const __m512 b =
        bias != nullptr ? _mm512_set1_ps(bias[i]) : _mm512_setzero_ps();
#pragma GCC unroll 3
    for (int j = 0; j < kPanels; ++j) {
      _mm512_mask_storeu_ps(out + i * ldo + j * kWidth,
                            column_mask(columns - j * kWidth),
                            _mm512_add_ps(acc[i][j], b));
    }
  }
}

// Stores an AVX2 tile of block_avx2: bias per row, tail columns masked.
struct RowBiasStore {
  const float* bias;
  float* out;
  int64_t ldo;
  int64_t columns;

  template <int kRows, int kHalves>
  __attribute__((target("avx2,fma"))) void operator()(
      __m256 (&acc)[kRows][kHalves], int row0, int panel0) const {
#pragma GCC unroll 6
    for (int i = 0; i < kRows; ++i) {
      const __m256 b = bias != nullptr ? _mm256_set1_ps(bias[row0 + i])
                                       : _mm256_setzero_ps();
#pragma GCC unroll 6
      for (int j = 0; j < kHalves; ++j) {
        const int64_t col = (panel0 * 2 + j) * 8;
        const int64_t live = std::clamp<int64_t>(columns - col, 0, 8);
        if (live == 0) break;
        store_lanes(out + (row0 + i) * ldo + col, live, lane_mask(live),
                    _mm256_add_ps(acc[i][j], b));
      }
    }
  }
};

// block for AVX2 + FMA CPUs (the same bits).
template <int kRows, int kPanels>
__attribute__((target("avx2,fma"))) void block_avx2(
    const float* w, int64_t ldw, int64_t k, const float* panels,
    PrefetchRun prefetch, const float* bias, float* out, int64_t ldo,
    int64_t columns) {
  RowBiasStore store{bias, out, ldo, columns};
  for_avx2_subtiles<kRows, kPanels>(
      F32PanelTiles{w, ldw, k, panels, k * kWidth}, prefetch, store);
}

using Block = void (*)(const float*, int64_t, int64_t, const float*,
                       PrefetchRun, const float*, float*, int64_t, int64_t);

template <int R, int P>
struct Avx512Block {
  static constexpr Block fn = &block<R, P>;
};
template <int R, int P>
struct Avx2Block {
  static constexpr Block fn = &block_avx2<R, P>;
};

// Make<rows, panels>::fn for every rows <= 8, panels <= 3.
template <template <int, int> class Make>
struct BlockTable {
  Block table[kMaxRows][kMaxPanels];
  BlockTable() { fill<1>(); }
  template <int R>
  void fill() {
    table[R - 1][0] = Make<R, 1>::fn;
    table[R - 1][1] = Make<R, 2>::fn;
    table[R - 1][2] = Make<R, 3>::fn;
    if constexpr (R < kMaxRows) fill<R + 1>();
  }
};

// Columns [n0, n0 + columns) of x's k rows as panels [panel][k][16], zero
// past the last column, in a 64-byte aligned per-thread buffer.
__attribute__((target("avx512f"))) void pack_columns(const float* x,
                                                     int64_t ldx, int64_t k,
                                                     int64_t columns,
                                                     float* panels) {
  for (int64_t j = 0; j * kWidth < columns; ++j) {
    const __mmask16 mask = column_mask(columns - j * kWidth);
    const float* src = x + j * kWidth;
    float* dst = panels + j * k * kWidth;
    for (int64_t kk = 0; kk < k; ++kk) {
      _mm512_store_ps(dst + kk * kWidth,
                      _mm512_maskz_loadu_ps(mask, src + kk * ldx));
    }
  }
}

// pack_columns for AVX2 CPUs: each 16-column row in two masked halves.
__attribute__((target("avx2"))) void pack_columns_avx2(const float* x,
                                                       int64_t ldx, int64_t k,
                                                       int64_t columns,
                                                       float* panels) {
  for (int64_t j = 0; j * kWidth < columns; ++j) {
    const int64_t live = columns - j * kWidth;
    const __m256i low = lane_mask(std::min<int64_t>(live, 8));
    const __m256i high = lane_mask(std::clamp<int64_t>(live - 8, 0, 8));
    const float* src = x + j * kWidth;
    float* dst = panels + j * k * kWidth;
    for (int64_t kk = 0; kk < k; ++kk) {
      _mm256_store_ps(dst + kk * kWidth,
                      _mm256_maskload_ps(src + kk * ldx, low));
      _mm256_store_ps(dst + kk * kWidth + 8,
                      _mm256_maskload_ps(src + kk * ldx + 8, high));
    }
  }
}

// out[i][c] = w[i] . columns[c] (+ bias[i]) for kRows rows and kColumns
// pixel columns packed contiguously (k floats each): a weight row's
// 16-element slices are loaded once for all columns, each sum reduced in a
// fixed order at the end.
template <int kRows, int kColumns>
__attribute__((target("avx512f"))) void dot_block(const float* w, int64_t ldw,
                                                  int64_t k,
                                                  const float* columns,
                                                  const float* bias, float* out,
                                                  int64_t ldo) {
  __m512 acc[kRows][kColumns];
#pragma GCC unroll 4
  for (int i = 0; i < kRows; ++i) {
#pragma GCC unroll 4
    for (int c = 0; c < kColumns; ++c) acc[i][c] = _mm512_setzero_ps();
  }
  for (int64_t k0 = 0; k0 < k; k0 += kWidth) {
    const __mmask16 mask = column_mask(k - k0);
    __m512 x[kColumns];
#pragma GCC unroll 4
    for (int c = 0; c < kColumns; ++c) {
      x[c] = _mm512_maskz_loadu_ps(mask, columns + c * k + k0);
    }
#pragma GCC unroll 4
    for (int i = 0; i < kRows; ++i) {
      const __m512 weights = _mm512_maskz_loadu_ps(mask, w + i * ldw + k0);
#pragma GCC unroll 4
      for (int c = 0; c < kColumns; ++c) {
        acc[i][c] = _mm512_fmadd_ps(weights, x[c], acc[i][c]);
      }
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < kRows; ++i) {
#pragma GCC unroll 4
    for (int c = 0; c < kColumns; ++c) {
      out[i * ldo + c] =
          _mm512_reduce_add_ps(acc[i][c]) + (bias != nullptr ? bias[i] : 0.0f);
    }
  }
}

// dot_block for AVX2 + FMA CPUs (the same bits): each sum's 16 lanes kept
// as two 8-lane halves, reduced in _mm512_reduce_add_ps's order (upper half
// onto lower, then 128-bit halves, then pairs: kernels::reduce_add_8). A
// half wholly past k is skipped: the AVX-512 form adds 0 x 0 there, which
// leaves a sum that started at +0 unchanged.
template <int kRows, int kColumns>
__attribute__((target("avx2,fma"))) void dot_block_avx2(
    const float* w, int64_t ldw, int64_t k, const float* columns,
    const float* bias, float* out, int64_t ldo) {
  __m256 acc[kRows][kColumns][2];
#pragma GCC unroll 4
  for (int i = 0; i < kRows; ++i) {
#pragma GCC unroll 4
    for (int c = 0; c < kColumns; ++c) {
      acc[i][c][0] = acc[i][c][1] = _mm256_setzero_ps();
    }
  }
  for (int64_t k0 = 0; k0 < k; k0 += kWidth) {
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const int64_t at = k0 + 8 * h;
      const int64_t live = k - at;
      if (live <= 0) break;
      const __m256i mask = lane_mask(live);
      __m256 x[kColumns];
#pragma GCC unroll 4
      for (int c = 0; c < kColumns; ++c) {
        x[c] = load_lanes(columns + c * k + at, live, mask);
      }
#pragma GCC unroll 4
      for (int i = 0; i < kRows; ++i) {
        const __m256 weights = load_lanes(w + i * ldw + at, live, mask);
#pragma GCC unroll 4
        for (int c = 0; c < kColumns; ++c) {
          acc[i][c][h] = _mm256_fmadd_ps(weights, x[c], acc[i][c][h]);
        }
      }
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < kRows; ++i) {
#pragma GCC unroll 4
    for (int c = 0; c < kColumns; ++c) {
      out[i * ldo + c] =
          kernels::reduce_add_8(_mm256_add_ps(acc[i][c][1], acc[i][c][0])) +
          (bias != nullptr ? bias[i] : 0.0f);
    }
  }
}

using DotBlock = void (*)(const float*, int64_t, int64_t, const float*,
                          const float*, float*, int64_t);

// Rows [r0, r1) of the last `count` pixel columns (packed in `columns`).
void dot_rows(const float* w, int64_t ldw, int64_t k, const float* columns,
              int64_t count, const float* bias, float* out, int64_t ldo,
              int64_t r0, int64_t r1) {
  static constexpr DotBlock four_rows[kMaxDotColumns] = {
      &dot_block<4, 1>, &dot_block<4, 2>, &dot_block<4, 3>, &dot_block<4, 4>};
  static constexpr DotBlock one_row[kMaxDotColumns] = {
      &dot_block<1, 1>, &dot_block<1, 2>, &dot_block<1, 3>, &dot_block<1, 4>};
  // AVX2 holds two registers a sum: at most 8 sums a call (of 16 ymm).
  static constexpr int kAvx2Rows[kMaxDotColumns] = {4, 2, 1, 1};
  static constexpr DotBlock avx2_rows[kMaxDotColumns] = {
      &dot_block_avx2<4, 1>, &dot_block_avx2<2, 2>, &dot_block_avx2<1, 3>,
      &dot_block_avx2<1, 4>};
  static constexpr DotBlock avx2_one_row[kMaxDotColumns] = {
      &dot_block_avx2<1, 1>, &dot_block_avx2<1, 2>, &dot_block_avx2<1, 3>,
      &dot_block_avx2<1, 4>};
  const bool avx512 = avx512_panel_tiles();
  const int64_t block = avx512 ? 4 : kAvx2Rows[count - 1];
  for (int64_t r = r0; r < r1;) {
    const bool whole = r + block <= r1;
    const DotBlock kernel = avx512
                                ? (whole ? four_rows : one_row)[count - 1]
                                : (whole ? avx2_rows : avx2_one_row)[count - 1];
    kernel(w + r * ldw, ldw, k, columns, bias != nullptr ? bias + r : nullptr,
           out + r * ldo, ldo);
    r += whole ? block : 1;
  }
}

// `count` pixel columns of x's k rows, each stored contiguously (k floats).
void pack_dot_columns(const float* x, int64_t ldx, int64_t k, int64_t count,
                      float* columns) {
  for (int64_t kk = 0; kk < k; ++kk) {
    for (int64_t c = 0; c < count; ++c) columns[c * k + kk] = x[kk * ldx + c];
  }
}

// A thread's panel buffer and the first element of the columns it holds.
struct PanelBuffer {
  kernels::AlignedFloats storage;
  const float* source = nullptr;
};

// A block's product where the epilogue does not store it: kMaxRows rows of
// a pixel group and its dot-product tail, in cache.
constexpr int64_t kScratchColumns = kGroupColumns + kMaxDotColumns;
static_assert(kScratchColumns == kChannelEpilogueColumns);

// A place in the work order: global pixel group (image-major) and row block.
struct WorkPlace {
  int64_t group = 0;
  int64_t block = 0;
  bool operator<(const WorkPlace& o) const {
    return group != o.group ? group < o.group : block < o.block;
  }
};

// The product's work in order: every pixel group of every image, each
// group's row blocks in turn (consecutive blocks share the group's packed
// panels). Threads take runs of it of equal cost (a block's columns, the
// last panel's padding included, times its rows), not equal counts of
// groups: a plane's last group is often a single panel (ResNet's 28x28 and
// 14x14 images are 16 groups + 1 panel and 4 + 1 panel), and an even split
// by count gave one of two threads 15 panel rows to the other's 11. Only
// which thread computes a block changes, never its sums.
struct WorkOrder {
  int64_t groups;  // all images'
  int64_t groups_per_image;
  int64_t row_blocks;
  int64_t panel_columns;  // per image
  int64_t dot_columns;

  // Columns of a group's panels (padding included) and dot products.
  int64_t group_cost(int64_t group_in_image) const {
    const int64_t columns =
        std::min(kGroupColumns, panel_columns - group_in_image * kGroupColumns);
    const int64_t dots =
        group_in_image == groups_per_image - 1 ? dot_columns : 0;
    return (columns + kWidth - 1) / kWidth * kWidth + dots;
  }

  // Where run `run` of `runs` equal-cost runs starts (run == runs: the end).
  WorkPlace start_of_run(int64_t run, int64_t runs) const {
    if (run >= runs) return {groups, 0};
    const int64_t rows = row_blocks * kMaxRows;  // the last block as full
    const int64_t full = group_cost(0) * rows;
    const int64_t last = group_cost(groups_per_image - 1) * rows;
    const int64_t per_image = (groups_per_image - 1) * full + last;
    const int64_t images = groups / groups_per_image;
    const int64_t target = images * per_image * run / runs;
    const int64_t rest = target % per_image;
    const int64_t group = std::min(rest / full, groups_per_image - 1);
    const int64_t block_cost = group_cost(group) * kMaxRows;
    const int64_t into = rest - group * full;
    WorkPlace place{target / per_image * groups_per_image + group,
                    (into + block_cost / 2) / block_cost};
    if (place.block >= row_blocks) place = {place.group + 1, 0};
    return place;
  }
};

}  // namespace

namespace {

// A row's columns stay in registers through every step; the step's kind is
// decided once per row.
__attribute__((target("avx512f"))) void apply_channel_epilogue_avx512(
    const ChannelEpilogue& e, const float* product, int64_t ld, int64_t at,
    int64_t ldo, int64_t row0, int64_t rows, int64_t columns) {
  using Kind = ChannelEpilogueStep::Kind;
  constexpr int kVectors = (kScratchColumns + kWidth - 1) / kWidth;
  const int vectors = static_cast<int>((columns + kWidth - 1) / kWidth);
  // Whole vectors take plain loads and stores (masked ones cost more).
  const int full = static_cast<int>(columns / kWidth);
  __mmask16 mask[kVectors];
  for (int j = 0; j < kVectors; ++j)
    mask[j] = column_mask(columns - j * kWidth);
  for (int64_t i = 0; i < rows; ++i) {
    const float* p = product + i * ld;
    const int64_t row_at = at + i * ldo;
    __m512 v[kVectors];
#pragma GCC unroll 4
    for (int j = 0; j < kVectors; ++j) {
      if (j < vectors) {
        v[j] = j < full ? _mm512_loadu_ps(p + j * kWidth)
                        : _mm512_maskz_loadu_ps(mask[j], p + j * kWidth);
      }
    }
    for (int s = 0; s < e.count; ++s) {
      const ChannelEpilogueStep& step = e.steps[s];
      switch (step.kind) {
        case Kind::kAffine: {  // batch norm's kernel: multiply, then add
          const __m512 scale = _mm512_set1_ps(step.scale[row0 + i]);
          const __m512 shift = _mm512_set1_ps(step.shift[row0 + i]);
#pragma GCC unroll 4
          for (int j = 0; j < kVectors; ++j) {
            if (j < vectors) {
              v[j] = _mm512_add_ps(_mm512_mul_ps(v[j], scale), shift);
            }
          }
          break;
        }
        case Kind::kAdd: {
          const float* addend = step.addend + row_at;
#pragma GCC unroll 4
          for (int j = 0; j < kVectors; ++j) {
            if (j < vectors) {
              v[j] = _mm512_add_ps(
                  v[j], j < full ? _mm512_loadu_ps(addend + j * kWidth)
                                 : _mm512_maskz_loadu_ps(mask[j],
                                                         addend + j * kWidth));
            }
          }
          break;
        }
        case Kind::kRelu: {  // CPU's clamp_min(x, 0): max(0, x)
#pragma GCC unroll 4
          for (int j = 0; j < kVectors; ++j) {
            if (j < vectors) v[j] = _mm512_max_ps(_mm512_setzero_ps(), v[j]);
          }
          break;
        }
      }
      if (step.out != nullptr) {
        float* out = step.out + row_at;
#pragma GCC unroll 4
        for (int j = 0; j < kVectors; ++j) {
          if (j < full) {
            _mm512_storeu_ps(out + j * kWidth, v[j]);
          } else if (j < vectors) {
            _mm512_mask_storeu_ps(out + j * kWidth, mask[j], v[j]);
          }
        }
      }
    }
  }
}

// The same steps for AVX2 + FMA CPUs, 8 columns a vector. kAffine is one
// fused multiply-add there, as CPU's AVX2 batch-norm kernel computes it
// (elementwise/ChannelAffine.cpp): each step keeps its op's bits on either
// ISA.
__attribute__((target("avx2,fma"))) void apply_channel_epilogue_avx2(
    const ChannelEpilogue& e, const float* product, int64_t ld, int64_t at,
    int64_t ldo, int64_t row0, int64_t rows, int64_t columns) {
  using Kind = ChannelEpilogueStep::Kind;
  constexpr int kVectors = (kScratchColumns + 7) / 8;
  const int vectors = static_cast<int>((columns + 7) / 8);
  __m256i mask[kVectors];
#pragma GCC unroll 8
  for (int j = 0; j < kVectors; ++j) mask[j] = lane_mask(columns - j * 8);
  for (int64_t i = 0; i < rows; ++i) {
    const float* p = product + i * ld;
    const int64_t row_at = at + i * ldo;
    // Unrolled over the block's vectors (guarded by `vectors`) so they stay
    // in registers through the steps.
    __m256 v[kVectors];
#pragma GCC unroll 8
    for (int j = 0; j < kVectors; ++j) {
      if (j < vectors) v[j] = load_lanes(p + j * 8, columns - j * 8, mask[j]);
    }
    for (int s = 0; s < e.count; ++s) {
      const ChannelEpilogueStep& step = e.steps[s];
      switch (step.kind) {
        case Kind::kAffine: {
          const __m256 scale = _mm256_set1_ps(step.scale[row0 + i]);
          const __m256 shift = _mm256_set1_ps(step.shift[row0 + i]);
#pragma GCC unroll 8
          for (int j = 0; j < kVectors; ++j) {
            if (j < vectors) v[j] = _mm256_fmadd_ps(v[j], scale, shift);
          }
          break;
        }
        case Kind::kAdd: {
          const float* addend = step.addend + row_at;
#pragma GCC unroll 8
          for (int j = 0; j < kVectors; ++j) {
            if (j < vectors) {
              v[j] = _mm256_add_ps(
                  v[j], load_lanes(addend + j * 8, columns - j * 8, mask[j]));
            }
          }
          break;
        }
        case Kind::kRelu: {
#pragma GCC unroll 8
          for (int j = 0; j < kVectors; ++j) {
            if (j < vectors) v[j] = _mm256_max_ps(_mm256_setzero_ps(), v[j]);
          }
          break;
        }
      }
      if (step.out != nullptr) {
        float* out = step.out + row_at;
#pragma GCC unroll 8
        for (int j = 0; j < kVectors; ++j) {
          if (j < vectors)
            store_lanes(out + j * 8, columns - j * 8, mask[j], v[j]);
        }
      }
    }
  }
}

}  // namespace

void apply_channel_epilogue(const ChannelEpilogue& e, const float* product,
                            int64_t ld, int64_t at, int64_t ldo, int64_t row0,
                            int64_t rows, int64_t columns) {
  if (avx512_panel_tiles()) {
    apply_channel_epilogue_avx512(e, product, ld, at, ldo, row0, rows, columns);
  } else {
    apply_channel_epilogue_avx2(e, product, ld, at, ldo, row0, rows, columns);
  }
}

bool channel_gemm_supported() { return panel_tiles_supported(); }

bool channel_epilogues_supported() { return panel_tiles_supported(); }

void channel_gemm_f32(const ChannelGemmArgs& a) {
  if (a.m == 0 || a.n == 0 || a.images == 0) return;
  static const BlockTable<Avx512Block> avx512_kernels;
  static const BlockTable<Avx2Block> avx2_kernels;
  const bool avx512 = avx512_panel_tiles();
  const auto& kernels = avx512 ? avx512_kernels.table : avx2_kernels.table;
  const auto pack = avx512 ? &pack_columns : &pack_columns_avx2;
  const ChannelEpilogue* epilogue =
      a.epilogue != nullptr && a.epilogue->count > 0 ? a.epilogue : nullptr;
  // Pixels past the last full panel taken by dot products (none when the
  // image is narrower than one panel or the rest needs a panel anyway).
  const int64_t dot_columns =
      a.n > kWidth && a.n % kWidth <= kMaxDotColumns ? a.n % kWidth : 0;
  const int64_t panel_columns = a.n - dot_columns;
  const int64_t groups = (panel_columns + kGroupColumns - 1) / kGroupColumns;
  const int64_t row_blocks = (a.m + kMaxRows - 1) / kMaxRows;
  const WorkOrder order{a.images * groups, groups, row_blocks, panel_columns,
                        dot_columns};
  const int64_t threads = at::get_num_threads();
  // One run of the work order per thread, of equal cost (see WorkOrder).
  at::parallel_for(0, threads, 1, [&](int64_t first_run, int64_t end_run) {
    thread_local PanelBuffer buffer;
    // The buffer may hold another call's panels at the same address.
    buffer.source = nullptr;
    float* panels = buffer.storage.resize(
        a.k * (kGroupColumns + kMaxDotColumns) + kMaxRows * kScratchColumns);
    float* dot_panel = panels + a.k * kGroupColumns;
    float* scratch = dot_panel + a.k * kMaxDotColumns;
    const WorkPlace from = order.start_of_run(first_run, threads);
    const WorkPlace to = order.start_of_run(end_run, threads);
    for (WorkPlace at = from; at < to; at = {at.group + 1, 0}) {
      const int64_t image = at.group / groups;
      const int64_t group = at.group % groups;
      const int64_t n0 = group * kGroupColumns;
      const int64_t columns = std::min(kGroupColumns, panel_columns - n0);
      const float* x = a.x + image * a.x_image_stride + n0;
      const int64_t dots = group == groups - 1 ? dot_columns : 0;
      if (buffer.source != x) {
        pack(x, a.ldx, a.k, columns, panels);
        if (dots > 0)
          pack_dot_columns(x + columns, a.ldx, a.k, dots, dot_panel);
        buffer.source = x;
      }
      const int64_t np = (columns + kWidth - 1) / kWidth;
      const int64_t out_at = image * a.out_image_stride + n0;
      float* out = a.out + out_at;
      const int64_t block_end = at.group == to.group ? to.block : row_blocks;
      for (int64_t b = at.block; b < block_end; ++b) {
        const int64_t r = b * kMaxRows;
        const int64_t rows = std::min<int64_t>(kMaxRows, a.m - r);
        // The weight rows of the next block (a small image's weight is
        // read from memory once, by the block that needs it: fetching
        // them a block ahead overlaps that read with this block's FMAs).
        const int64_t next_rows =
            std::min<int64_t>(kMaxRows, a.m - r - kMaxRows);
        const PrefetchRun ahead =
            a.ldw == a.k && next_rows > 0
                ? PrefetchRun{reinterpret_cast<const char*>(
                                  a.w + (r + kMaxRows) * a.ldw),
                              next_rows * a.k * 4 / 64}
                : PrefetchRun{};
        const float* bias = a.bias != nullptr ? a.bias + r : nullptr;
        const bool scratch_product =
            epilogue != nullptr && !epilogue->store_product;
        float* product = scratch_product ? scratch : out + r * a.ldo;
        const int64_t ld = scratch_product ? kScratchColumns : a.ldo;
        kernels[rows - 1][np - 1](a.w + r * a.ldw, a.ldw, a.k, panels, ahead,
                                  bias, product, ld, columns);
        // The block's tail columns too (then its steps while in cache).
        if (dots > 0) {
          dot_rows(a.w + r * a.ldw, a.ldw, a.k, dot_panel, dots, bias,
                   product + columns, ld, 0, rows);
        }
        if (epilogue != nullptr) {
          apply_channel_epilogue(*epilogue, product, ld, out_at + r * a.ldo,
                                 a.ldo, r, rows, columns + dots);
        }
      }
    }
  });
}

}  // namespace ember::matmul
