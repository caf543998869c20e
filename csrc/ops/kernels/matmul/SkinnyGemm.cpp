#include "ops/kernels/matmul/SkinnyGemm.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "ember/runtime/cpu_features.h"
#include "ops/kernels/ParallelChunks.h"
#include "ops/kernels/matmul/PanelTile.h"

namespace ember::matmul {
namespace {

constexpr int64_t kGroupPanels = 4;   // most panels a micro-kernel call covers
constexpr int64_t kMaxBlockRows = 6;  // rows per call: 6 x 4 accumulators

int64_t panel_count(int64_t n) { return (n + kPanelWidth - 1) / kPanelWidth; }
int64_t even(int64_t k) { return (k + 1) / 2 * 2; }

uint16_t to_bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (bits >> 16) | 0x40;  // NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

// A run of panels: pointers to the first panel, the distance between panels
// (in elements of the packed type) and how many columns are real.
template <class Element>
struct PanelRun {
  const Element* first;
  int64_t panel_stride;
  int64_t columns;
};

template <int kRows, int kPanels>
__attribute__((target("avx512f"))) inline void zero_block(
    __m512 (&acc)[kRows][kPanels]) {
#pragma GCC unroll 6
  for (int i = 0; i < kRows; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < kPanels; ++j) acc[i][j] = _mm512_setzero_ps();
  }
}

// The epilogue both precisions share: bias, then a masked store per row.
template <int kRows, int kPanels>
__attribute__((target("avx512f"))) inline void store_block(
    __m512 (&acc)[kRows][kPanels], const float* bias, float* c, int64_t ldc,
    int64_t columns) {
#pragma GCC unroll 4
  for (int j = 0; j < kPanels; ++j) {
    const __mmask16 mask = column_mask(columns - j * 16);
    const __m512 b = bias != nullptr
                         ? _mm512_maskz_loadu_ps(mask, bias + j * 16)
                         : _mm512_setzero_ps();
#pragma GCC unroll 6
    for (int i = 0; i < kRows; ++i) {
      _mm512_mask_storeu_ps(c + i * ldc + j * 16, mask,
                            _mm512_add_ps(acc[i][j], b));
    }
  }
}

template <int kRows, int kPanels>
__attribute__((target("avx512f"))) void block_f32(
    const float* a, int64_t lda, int64_t k, PanelRun<float> run,
    PrefetchRun prefetch, const float* bias, float* c, int64_t ldc) {
  __m512 acc[kRows][kPanels];
  accumulate_panel_tile<kRows, kPanels>(a, lda, k, run.first, run.panel_stride,
                                        acc, prefetch);
  store_block<kRows, kPanels>(acc, bias, c, ldc, run.columns);
}

// Stores an AVX2 tile of block_f32_avx2: bias per column, tail columns
// masked.
struct ColumnBiasStore {
  const float* bias;
  float* c;
  int64_t ldc;
  int64_t columns;

  template <int kRows, int kHalves>
  __attribute__((target("avx2,fma"))) void operator()(
      __m256 (&acc)[kRows][kHalves], int row0, int panel0) const {
#pragma GCC unroll 8
    for (int j = 0; j < kHalves; ++j) {
      const int64_t col = (panel0 * 2 + j) * 8;
      const int64_t live = std::clamp<int64_t>(columns - col, 0, 8);
      if (live == 0) break;
      const __m256i mask = lane_mask(live);
      const __m256 b = bias != nullptr ? load_lanes(bias + col, live, mask)
                                       : _mm256_setzero_ps();
#pragma GCC unroll 6
      for (int i = 0; i < kRows; ++i) {
        store_lanes(c + (row0 + i) * ldc + col, live, mask,
                    _mm256_add_ps(acc[i][j], b));
      }
    }
  }
};

// block_f32 for AVX2 + FMA CPUs (the same bits).
template <int kRows, int kPanels>
__attribute__((target("avx2,fma"))) void block_f32_avx2(
    const float* a, int64_t lda, int64_t k, PanelRun<float> run,
    PrefetchRun prefetch, const float* bias, float* c, int64_t ldc) {
  ColumnBiasStore store{bias, c, ldc, run.columns};
  for_avx2_subtiles<kRows, kPanels>(
      F32PanelTiles{a, lda, k, run.first, run.panel_stride}, prefetch, store);
}

// bf16 panels on AVX2 + FMA (no bf16 arithmetic): each 32-byte load of a
// pair step holds 8 columns' (even k, odd k) bf16 pairs, widened to fp32 by a
// shift (even) and a mask (odd); A's pairs likewise. A product of two bf16
// values is exact in fp32, so each fused multiply-add rounds once, odd k
// before even as VDPBF16PS's definition orders them (denormals are kept,
// where VDPBF16PS flushes them). The weights stream at half fp32's bytes.
struct Bf16PanelTiles {
  const uint32_t* a_pairs;
  int64_t lda_pairs;
  int64_t k_pairs;
  const uint16_t* panel0;
  int64_t panel_stride;

  template <int kRows, int kPanels>
  __attribute__((target("avx2,fma"), always_inline)) void accumulate(
      int row0, int panel, PrefetchRun prefetch,
      __m256 (&acc)[kRows][2 * kPanels]) const {
    const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
    const uint16_t* first = panel0 + panel * panel_stride;
    zero_tile_avx2(acc);
    for (int64_t kp = 0; kp < k_pairs; ++kp) {
      if (kp < prefetch.lines) {
        _mm_prefetch(prefetch.first + kp * 64, _MM_HINT_T1);
      }
#pragma GCC unroll 8
      for (int j = 0; j < 2 * kPanels; ++j) {
        const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(
            first + (j / 2) * panel_stride + kp * 32 + (j % 2) * 16));
        const __m256 w_even = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
        const __m256 w_odd = _mm256_castsi256_ps(_mm256_and_si256(w, high));
#pragma GCC unroll 6
        for (int i = 0; i < kRows; ++i) {
          const __m256i x = _mm256_set1_epi32(
              static_cast<int>(a_pairs[(row0 + i) * lda_pairs + kp]));
          acc[i][j] = _mm256_fmadd_ps(
              _mm256_castsi256_ps(_mm256_and_si256(x, high)), w_odd, acc[i][j]);
          acc[i][j] = _mm256_fmadd_ps(
              _mm256_castsi256_ps(_mm256_slli_epi32(x, 16)), w_even, acc[i][j]);
        }
      }
    }
  }
};

template <int kRows, int kPanels>
__attribute__((target("avx2,fma"))) void block_bf16_avx2(
    const uint32_t* a_pairs, int64_t lda_pairs, int64_t k_pairs,
    PanelRun<uint16_t> run, PrefetchRun prefetch, const float* bias, float* c,
    int64_t ldc) {
  ColumnBiasStore store{bias, c, ldc, run.columns};
  for_avx2_subtiles<kRows, kPanels>(
      Bf16PanelTiles{a_pairs, lda_pairs, k_pairs, run.first, run.panel_stride},
      prefetch, store);
}

// `a_pairs`: A rounded to bf16, rows of k/2 pairs (lo = even k).
template <int kRows, int kPanels>
__attribute__((target("avx512f,avx512bf16"))) void block_bf16(
    const uint32_t* a_pairs, int64_t lda_pairs, int64_t k_pairs,
    PanelRun<uint16_t> run, PrefetchRun prefetch, const float* bias, float* c,
    int64_t ldc) {
  __m512 acc[kRows][kPanels];
  zero_block<kRows, kPanels>(acc);
  for (int64_t kp = 0; kp < k_pairs; ++kp) {
    if (kp < prefetch.lines) {
      _mm_prefetch(prefetch.first + kp * 64, _MM_HINT_T1);
    }
    __m512i w[kPanels];
#pragma GCC unroll 4
    for (int j = 0; j < kPanels; ++j) {
      w[j] = _mm512_load_si512(run.first + j * run.panel_stride + kp * 32);
    }
#pragma GCC unroll 6
    for (int i = 0; i < kRows; ++i) {
      const __m512i x =
          _mm512_set1_epi32(static_cast<int>(a_pairs[i * lda_pairs + kp]));
#pragma GCC unroll 4
      for (int j = 0; j < kPanels; ++j) {
        acc[i][j] = _mm512_dpbf16_ps(acc[i][j], reinterpret_cast<__m512bh>(x),
                                     reinterpret_cast<__m512bh>(w[j]));
      }
    }
  }
  store_block<kRows, kPanels>(acc, bias, c, ldc, run.columns);
}

// Micro-kernels by (rows, panels), chosen at run time from a table.
template <class Fn, template <int, int> class Make>
struct KernelTable {
  Fn table[kMaxBlockRows][kGroupPanels];
  KernelTable() { fill<1>(); }
  template <int R>
  void fill() {
    table[R - 1][0] = Make<R, 1>::fn;
    table[R - 1][1] = Make<R, 2>::fn;
    table[R - 1][2] = Make<R, 3>::fn;
    table[R - 1][3] = Make<R, 4>::fn;
    if constexpr (R < kMaxBlockRows) fill<R + 1>();
  }
};

using F32Block = void (*)(const float*, int64_t, int64_t, PanelRun<float>,
                          PrefetchRun, const float*, float*, int64_t);
using Bf16Block = void (*)(const uint32_t*, int64_t, int64_t,
                           PanelRun<uint16_t>, PrefetchRun, const float*,
                           float*, int64_t);
template <int R, int P>
struct MakeF32 {
  static constexpr F32Block fn = &block_f32<R, P>;
};
template <int R, int P>
struct MakeF32Avx2 {
  static constexpr F32Block fn = &block_f32_avx2<R, P>;
};
template <int R, int P>
struct MakeBf16 {
  static constexpr Bf16Block fn = &block_bf16<R, P>;
};
template <int R, int P>
struct MakeBf16Avx2 {
  static constexpr Bf16Block fn = &block_bf16_avx2<R, P>;
};

// Panels per group of the tall GEMM, for panels of `panel_bytes`: each
// block of A's rows streams the whole group, so the group should fit the core's
// L2 and be reread from there by the next block. On Zen 3 (512 KB L2) a K=3072
// group of 4 panels is 768 KB: 2 panels ran the tall GEMMs at 173-185 GFLOP/s
// against 154-172 in one session's paired rounds (within 3% either way in
// another's, on a quieter host). Grouping only splits the work: every
// output keeps its one-task sum over K, so no bit depends on it.
int64_t group_panels(int64_t panel_bytes) {
  static const auto l2 = static_cast<int64_t>(runtime::l2_cache_bytes());
  if (l2 <= 0 || panel_bytes <= 0) return kGroupPanels;
  return std::clamp<int64_t>(l2 / panel_bytes, 1, kGroupPanels);
}

// Runs body(group, row0, row1, next_group) over every panel group of B and
// rows of A; next_group is the group the same thread takes up next (-1:
// none, or the same group), whose panels body may prefetch. Up to
// kSkinnyMaxRows rows, the groups go in chunks of about 256 KB of B; small
// problems stay on one thread (waking helpers costs more than streaming a
// few hundred KB). Taller A: a task per group, and when the groups are too
// few for the threads (a narrow B), slices of rows too, ordered group by
// group so a thread's consecutive tasks share a group's panels; each thread
// takes one contiguous run of tasks, so it knows which group comes next.
// Each output is one task's whole sum over K, so the split never changes a
// bit. Threads as ParallelChunks.h chooses them (a chunk team on a stream
// worker, whose regions would wait for a thread the host displaced).
template <class Body>
void for_panel_groups(int64_t n, int64_t m, int64_t group,
                      int64_t bytes_per_group, Body&& body) {
  const int64_t groups = (panel_count(n) + group - 1) / group;
  const int64_t threads = kernels::loop_threads();
  if (m <= kSkinnyMaxRows) {
    constexpr int64_t kBytesPerTask = 256 * 1024;
    const int64_t grain = std::max<int64_t>(
        1, kBytesPerTask / std::max<int64_t>(1, bytes_per_group));
    const int64_t chunks = (groups + grain - 1) / grain;
    kernels::run_chunk_loop(chunks, static_cast<int>(std::min(threads, chunks)),
                            [&](int64_t chunk) {
                              const int64_t end =
                                  std::min(groups, (chunk + 1) * grain);
                              for (int64_t g = chunk * grain; g < end; ++g)
                                body(g, 0, m, int64_t{-1});
                            });
    return;
  }
  const int64_t blocks = (m + kMaxBlockRows - 1) / kMaxBlockRows;
  int64_t slices = 1;
  while (groups * slices < 4 * threads && slices < blocks) slices *= 2;
  const int64_t slice_rows = (blocks + slices - 1) / slices * kMaxBlockRows;
  slices = (m + slice_rows - 1) / slice_rows;
  const int64_t tasks = groups * slices;
  const int64_t runs = std::min(threads, tasks);
  kernels::run_chunk_loop(runs, static_cast<int>(runs), [&](int64_t r) {
    const int64_t begin = tasks * r / runs;
    const int64_t end = tasks * (r + 1) / runs;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t row0 = t % slices * slice_rows;
      const int64_t group = t / slices;
      const int64_t next = t + 1 < end && (t + 1) / slices != group
                               ? (t + 1) / slices
                               : int64_t{-1};
      body(group, row0, std::min(m, row0 + slice_rows), next);
    }
  });
}

// The panels of group `next` (none if -1), handed out to the row blocks of
// the task before it, a slice of lines per block: every k step of a panel
// is one 64-byte line in both precisions. Only where the group is one
// contiguous run (panels of exactly k steps).
struct NextPanels {
  const char* first = nullptr;
  int64_t lines = 0;
  int64_t blocks = 1;

  template <class BElement>
  NextPanels(const BElement* b, int64_t panel_stride, int64_t k, int64_t panels,
             int64_t group, int64_t next, int64_t rows)
      : blocks((rows + kMaxBlockRows - 1) / kMaxBlockRows) {
    const bool contiguous =
        panel_stride * static_cast<int64_t>(sizeof(BElement)) == k * 64;
    if (next < 0 || !contiguous) return;
    const int64_t p0 = next * group;
    first = reinterpret_cast<const char*>(b + p0 * panel_stride);
    lines = std::min(group, panels - p0) * k;
  }

  PrefetchRun lines_for_block(int64_t block) const {
    if (lines == 0) return {};
    const int64_t begin = lines * block / blocks;
    return {first + begin * 64, lines * (block + 1) / blocks - begin};
  }
};

// C = A @ B (+ bias) by `kernels` (a KernelTable of either precision):
// every panel group of B against A's rows in blocks of up to 6, each
// kernel call given A's rows (row stride lda, k of A's elements per row),
// B's panels of the group and C's columns of the group.
template <class Table, class AElement, class BElement>
void run_panel_blocks(const Table& kernels, const AElement* a, int64_t lda,
                      int64_t m, int64_t k, const BElement* b, int64_t n,
                      int64_t panel_stride, const float* bias, float* c,
                      int64_t ldc) {
  const int64_t panels = panel_count(n);
  const int64_t panel_bytes =
      panel_stride * static_cast<int64_t>(sizeof(BElement));
  // Up to kSkinnyMaxRows rows a panel is reread by at most 3 row blocks:
  // the groups stay at their widest there (decode streams each panel once).
  const int64_t group =
      m > kSkinnyMaxRows ? group_panels(panel_bytes) : kGroupPanels;
  for_panel_groups(
      n, m, group, panel_bytes * group,
      [&](int64_t g, int64_t row0, int64_t row1, int64_t next) {
        const int64_t p0 = g * group;
        const int64_t np = std::min(group, panels - p0);
        const int64_t col0 = p0 * kPanelWidth;
        const PanelRun<BElement> run{b + p0 * panel_stride, panel_stride,
                                     std::min(n - col0, np * kPanelWidth)};
        // The next group's panels, spread over this task's
        // row blocks.
        const NextPanels ahead(b, panel_stride, k, panels, group, next,
                               row1 - row0);
        for (int64_t r = row0; r < row1; r += kMaxBlockRows) {
          const int64_t rows = std::min(kMaxBlockRows, row1 - r);
          kernels.table[rows - 1][np - 1](
              a + r * lda, lda, k, run,
              ahead.lines_for_block((r - row0) / kMaxBlockRows),
              bias ? bias + col0 : nullptr, c + r * ldc + col0, ldc);
        }
      });
}

}  // namespace

size_t PanelPackedF32::bytes(int64_t k, int64_t n) {
  return static_cast<size_t>(panel_count(n) * k * kPanelWidth) * sizeof(float);
}

size_t PanelPackedBf16::bytes(int64_t k, int64_t n) {
  return static_cast<size_t>(panel_count(n) * even(k) * kPanelWidth) *
         sizeof(uint16_t);
}

void pack_panels_f32(const float* b, int64_t k, int64_t n, int64_t stride_k,
                     int64_t stride_n, float* dst) {
  at::parallel_for(0, panel_count(n), 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      float* panel = dst + p * k * kPanelWidth;
      for (int64_t kk = 0; kk < k; ++kk) {
        for (int64_t j = 0; j < kPanelWidth; ++j) {
          const int64_t col = p * kPanelWidth + j;
          panel[kk * kPanelWidth + j] =
              col < n ? b[kk * stride_k + col * stride_n] : 0.0f;
        }
      }
    }
  });
}

namespace {

template <class Source, class ToBf16>
void pack_bf16_panels(const Source* b, int64_t k, int64_t n, int64_t stride_k,
                      int64_t stride_n, uint16_t* dst, ToBf16 to_bits) {
  const int64_t k2 = even(k);
  at::parallel_for(0, panel_count(n), 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      uint16_t* panel = dst + p * k2 * kPanelWidth;
      for (int64_t kk = 0; kk < k2; ++kk) {
        for (int64_t j = 0; j < kPanelWidth; ++j) {
          const int64_t col = p * kPanelWidth + j;
          const bool inside = col < n && kk < k;
          // [pair][column][2]: row kk goes to slot kk % 2 of pair kk / 2.
          panel[(kk / 2) * 2 * kPanelWidth + j * 2 + kk % 2] =
              inside ? to_bits(b[kk * stride_k + col * stride_n]) : 0;
        }
      }
    }
  });
}

}  // namespace

void pack_panels_bf16(const float* b, int64_t k, int64_t n, int64_t stride_k,
                      int64_t stride_n, uint16_t* dst) {
  pack_bf16_panels(b, k, n, stride_k, stride_n, dst, to_bf16);
}

void pack_panels_bf16(const uint16_t* b, int64_t k, int64_t n, int64_t stride_k,
                      int64_t stride_n, uint16_t* dst) {
  pack_bf16_panels(b, k, n, stride_k, stride_n, dst,
                   [](uint16_t bits) { return bits; });
}

bool skinny_f32_supported() { return panel_tiles_supported(); }

namespace {
// VDPBF16PS on bf16 panels; AVX2 + FMA CPUs widen them to fp32 instead.
bool native_bf16_panels() {
  static const bool supported =
      runtime::cpu_features().avx512f && runtime::cpu_features().avx512_bf16;
  return supported;
}
}  // namespace

bool skinny_bf16_supported() {
  return native_bf16_panels() || panel_tiles_supported();
}

void skinny_gemm_f32(const float* a, int64_t lda, int64_t m,
                     const PanelPackedF32& b, const float* bias, float* c,
                     int64_t ldc) {
  static const KernelTable<F32Block, MakeF32> avx512;
  static const KernelTable<F32Block, MakeF32Avx2> avx2;
  const int64_t panel_stride =
      b.panel_stride != 0 ? b.panel_stride : b.k * kPanelWidth;
  if (avx512_panel_tiles()) {
    run_panel_blocks(avx512, a, lda, m, b.k, b.data, b.n, panel_stride, bias, c,
                     ldc);
  } else {
    run_panel_blocks(avx2, a, lda, m, b.k, b.data, b.n, panel_stride, bias, c,
                     ldc);
  }
}

namespace {

// C (fp32) = A @ B + bias, A given as bf16 pairs: rows of k_pairs 32-bit
// words, the even k in the low half.
void skinny_gemm_bf16_pairs(const uint32_t* a_pairs, int64_t m,
                            const PanelPackedBf16& b, const float* bias,
                            float* c, int64_t ldc) {
  static const KernelTable<Bf16Block, MakeBf16> native;
  static const KernelTable<Bf16Block, MakeBf16Avx2> avx2;
  const int64_t k_pairs = even(b.k) / 2;
  const int64_t panel_stride = k_pairs * 2 * kPanelWidth;
  if (native_bf16_panels()) {
    run_panel_blocks(native, a_pairs, k_pairs, m, k_pairs, b.data, b.n,
                     panel_stride, bias, c, ldc);
  } else {
    run_panel_blocks(avx2, a_pairs, k_pairs, m, k_pairs, b.data, b.n,
                     panel_stride, bias, c, ldc);
  }
}

// A's rows as bf16 pairs (at most 16 rows, once per call).
template <class Element, class ToBf16>
std::vector<uint32_t> pairs_of(const Element* a, int64_t lda, int64_t m,
                               int64_t k, ToBf16 to_bits) {
  const int64_t k_pairs = even(k) / 2;
  std::vector<uint32_t> a_pairs(static_cast<size_t>(m * k_pairs));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t kp = 0; kp < k_pairs; ++kp) {
      const int64_t k0 = 2 * kp;
      const uint32_t lo = to_bits(a[i * lda + k0]);
      const uint32_t hi = k0 + 1 < k ? to_bits(a[i * lda + k0 + 1]) : 0u;
      a_pairs[i * k_pairs + kp] = lo | (hi << 16);
    }
  }
  return a_pairs;
}

float from_bf16(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

}  // namespace

void skinny_gemm_bf16(const float* a, int64_t lda, int64_t m,
                      const PanelPackedBf16& b, const float* bias, float* c,
                      int64_t ldc) {
  const std::vector<uint32_t> a_pairs = pairs_of(a, lda, m, b.k, to_bf16);
  skinny_gemm_bf16_pairs(a_pairs.data(), m, b, bias, c, ldc);
}

void skinny_gemm_bf16(const uint16_t* a, int64_t lda, int64_t m,
                      const PanelPackedBf16& b, const uint16_t* bias,
                      uint16_t* c, int64_t ldc) {
  const std::vector<uint32_t> a_pairs =
      pairs_of(a, lda, m, b.k, [](uint16_t bits) { return bits; });
  std::vector<float> bias_f32;
  if (bias != nullptr) {
    bias_f32.resize(static_cast<size_t>(b.n));
    for (int64_t j = 0; j < b.n; ++j) bias_f32[j] = from_bf16(bias[j]);
  }
  std::vector<float> c_f32(static_cast<size_t>(m * b.n));
  skinny_gemm_bf16_pairs(a_pairs.data(), m, b,
                         bias != nullptr ? bias_f32.data() : nullptr,
                         c_f32.data(), b.n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < b.n; ++j)
      c[i * ldc + j] = to_bf16(c_f32[i * b.n + j]);
  }
}

}  // namespace ember::matmul
