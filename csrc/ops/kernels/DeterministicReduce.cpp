#include "ops/kernels/DeterministicReduce.h"

#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sum.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

namespace ember::deterministic {

void parallel_tiles(int64_t n, c10::function_ref<void(int64_t)> fn) {
  if (n <= 0) return;
  // One byte per call; at least two, so that with more than one thread
  // even a single call runs inside a parallel region.
  const int64_t slots = std::max<int64_t>(n, 2);
  const at::Tensor slot = at::empty({slots}, at::TensorOptions(at::kByte));
  const char* base = static_cast<const char*>(slot.const_data_ptr());
  at::TensorIterator iter =
      at::TensorIteratorConfig().add_const_input(slot).build();
  iter.for_each(
      [&](char** data, const int64_t* strides, int64_t size0, int64_t size1) {
        // Tiles work on plain CPU tensors that need no autograd.
        at::AutoDispatchBelowADInplaceOrView below_autograd;
        for (const auto j : c10::irange(size1)) {
          for (const auto i : c10::irange(size0)) {
            const int64_t index =
                data[0] + j * strides[1] + i * strides[0] - base;
            if (index < n) fn(index);
          }
        }
      },
      /*grain_size=*/1);
}

void run_serially(c10::function_ref<void()> fn) {
  parallel_tiles(1, [&](int64_t) { fn(); });
}

namespace {

constexpr int64_t kLanes = 32;

}  // namespace

// The loops, for any x86-64 and for AVX2 machines (same arithmetic).
#define EMBER_TILE_NS loops_default
#define EMBER_TILE_ATTR __attribute__((optimize("O3", "fp-contract=off")))
#include "ops/kernels/DeterministicTileLoops.h"
#undef EMBER_TILE_NS
#undef EMBER_TILE_ATTR
#if defined(__x86_64__) && defined(__GNUC__)
#define EMBER_HAVE_AVX2_LOOPS 1
#define EMBER_TILE_NS loops_avx2
#define EMBER_TILE_ATTR \
  __attribute__((target("avx2"), optimize("O3", "fp-contract=off")))
#include "ops/kernels/DeterministicTileLoops.h"
#undef EMBER_TILE_NS
#undef EMBER_TILE_ATTR
#endif

namespace {

bool use_avx2() {
#ifdef EMBER_HAVE_AVX2_LOOPS
  static const bool supported = __builtin_cpu_supports("avx2");
  return supported;
#else
  return false;
#endif
}

template <TileMap M, class In, class Acc>
void sum_rows(const In* data, int64_t row_stride, int64_t rows, int64_t cols,
              const Acc* center, Acc* out, int64_t out_stride) {
#ifdef EMBER_HAVE_AVX2_LOOPS
  if (use_avx2()) {
    loops_avx2::sum_rows<M, In, Acc>(data, row_stride, rows, cols, center, out,
                                     out_stride);
    return;
  }
#endif
  loops_default::sum_rows<M, In, Acc>(data, row_stride, rows, cols, center, out,
                                      out_stride);
}

template <TileMap M, class In, class Acc>
void sum_columns(const In* data, int64_t col_stride, int64_t rows, int64_t cols,
                 const Acc* center, Acc* out, int64_t out_stride) {
#ifdef EMBER_HAVE_AVX2_LOOPS
  if (use_avx2()) {
    loops_avx2::sum_columns<M, In, Acc>(data, col_stride, rows, cols, center,
                                        out, out_stride);
    return;
  }
#endif
  loops_default::sum_columns<M, In, Acc>(data, col_stride, rows, cols, center,
                                         out, out_stride);
}

template <class In, class Acc>
bool tile_sum_typed(const at::Tensor& matrix, const Tile& t,
                    at::Tensor& partial, TileMap map,
                    const at::Tensor& center) {
  const int64_t s0 = matrix.stride(0);
  const int64_t s1 = matrix.stride(1);
  const bool along_rows = s1 == 1 || t.cn == 1;
  const bool along_columns = s0 == 1 && t.rn <= kOuterTileRows;
  if (!along_rows && !along_columns) return false;
  const In* data = matrix.const_data_ptr<In>() + t.r0 * s0 + t.c0 * s1;
  Acc* out = partial.mutable_data_ptr<Acc>() + t.r0 * partial.stride(0) +
             t.block * partial.stride(1);
  const Acc* ctr =
      center.defined() ? center.const_data_ptr<Acc>() + t.r0 : nullptr;
  const auto run = [&](auto m) {
    constexpr TileMap M = decltype(m)::value;
    if (along_rows) {
      sum_rows<M, In, Acc>(data, s0, t.rn, t.cn, ctr, out, partial.stride(0));
    } else {
      sum_columns<M, In, Acc>(data, s1, t.rn, t.cn, ctr, out,
                              partial.stride(0));
    }
  };
  switch (map) {
    case TileMap::kIdentity:
      run(std::integral_constant<TileMap, TileMap::kIdentity>());
      break;
    case TileMap::kAbs:
      run(std::integral_constant<TileMap, TileMap::kAbs>());
      break;
    case TileMap::kSquare:
      run(std::integral_constant<TileMap, TileMap::kSquare>());
      break;
    case TileMap::kSquaredDeviation:
      run(std::integral_constant<TileMap, TileMap::kSquaredDeviation>());
      break;
  }
  return true;
}

template <class Acc>
bool tile_sum_for(const at::Tensor& matrix, const Tile& t, at::Tensor& partial,
                  TileMap map, const at::Tensor& center) {
  switch (matrix.scalar_type()) {
    case at::kFloat:
      return tile_sum_typed<float, Acc>(matrix, t, partial, map, center);
    case at::kDouble:
      return tile_sum_typed<double, Acc>(matrix, t, partial, map, center);
    case at::kBFloat16:
      return tile_sum_typed<c10::BFloat16, Acc>(matrix, t, partial, map,
                                                center);
    case at::kHalf:
      return tile_sum_typed<c10::Half, Acc>(matrix, t, partial, map, center);
    default:
      return false;
  }
}

}  // namespace

at::Tensor tile_of(const at::Tensor& matrix, const Tile& t) {
  return matrix.narrow(0, t.r0, t.rn).narrow(1, t.c0, t.cn);
}

at::Tensor slot_of(const at::Tensor& partial, const Tile& t) {
  return partial.narrow(0, t.r0, t.rn).select(1, t.block);
}

bool native_tile_sum(const at::Tensor& matrix, const Tile& t,
                     at::Tensor& partial, TileMap map,
                     const at::Tensor& center) {
  if (matrix.dim() != 2 || partial.dim() != 2 || t.rn == 0 || t.cn == 0) {
    return false;
  }
  if (center.defined() && (center.scalar_type() != partial.scalar_type() ||
                           !center.is_contiguous())) {
    return false;
  }
  if (map == TileMap::kSquaredDeviation && !center.defined()) return false;
  if (matrix.is_conj() || matrix.is_neg()) return false;
  switch (partial.scalar_type()) {
    case at::kFloat:
      // float accumulation of double input would lose precision.
      if (matrix.scalar_type() == at::kDouble) return false;
      return tile_sum_for<float>(matrix, t, partial, map, center);
    case at::kDouble:
      return tile_sum_for<double>(matrix, t, partial, map, center);
    default:
      return false;
  }
}

at::ScalarType accumulate_type(at::ScalarType dtype) {
  if (dtype == at::kBFloat16 || dtype == at::kHalf) return at::kFloat;
  if (dtype == at::kComplexHalf) return at::kComplexFloat;
  return dtype;
}

c10::SmallVector<int64_t, 8> wrap_dims(const at::Tensor& x,
                                       at::OptionalIntArrayRef dims) {
  c10::SmallVector<int64_t, 8> wrapped;
  const int64_t ndim = x.dim();
  if (!dims.has_value() || dims->empty()) {
    for (const auto d : c10::irange(ndim)) wrapped.push_back(d);
    return wrapped;
  }
  for (const int64_t d : *dims) {
    wrapped.push_back(at::maybe_wrap_dim(d, std::max<int64_t>(ndim, 1)));
  }
  std::sort(wrapped.begin(), wrapped.end());
  wrapped.erase(std::unique(wrapped.begin(), wrapped.end()), wrapped.end());
  return wrapped;
}

int64_t reduced_count(const at::Tensor& x, at::IntArrayRef dims) {
  if (x.dim() == 0) return 1;
  int64_t count = 1;
  for (const int64_t d : wrap_dims(x, dims)) count *= x.size(d);
  return count;
}

RowLayout row_layout(const at::Tensor& x, at::IntArrayRef dims_in,
                     bool keepdim) {
  const auto dims = wrap_dims(x, dims_in);
  RowLayout layout;
  std::vector<bool> reduced(std::max<int64_t>(x.dim(), 1), false);
  for (const int64_t d : dims) reduced[d] = true;
  for (const auto d : c10::irange(x.dim())) {
    if (reduced[d]) {
      if (keepdim) layout.out_shape.push_back(1);
      continue;
    }
    layout.order.push_back(d);
    layout.out_shape.push_back(x.size(d));
    layout.rows *= x.size(d);
  }
  for (const int64_t d : dims) {
    layout.order.push_back(d);
    layout.cols *= x.size(d);
  }
  return layout;
}

at::Tensor RowLayout::matrix(const at::Tensor& x) const {
  if (x.dim() == 0) return x.reshape({1, 1});
  return x.permute(order).reshape({rows, cols});
}

at::Tensor tile_sums(int64_t rows_total, int64_t cols_total,
                     bool columns_contiguous, const at::TensorOptions& options,
                     TileSum tile) {
  // Tile geometry: a function of the shape (and which way memory runs).
  int64_t rows;
  int64_t cols;
  if (columns_contiguous || rows_total == 1) {
    cols = std::max<int64_t>(1, std::min(cols_total, kTileElements));
    rows = std::max<int64_t>(1, kTileElements / cols);
  } else {
    // Reducing across rows of contiguous kept elements: tiles span a run
    // of kept elements and as many reduced columns as fit.
    rows = std::min(rows_total, kOuterTileRows);
    cols = std::max<int64_t>(1, std::min(cols_total, kTileElements / rows));
  }
  const int64_t col_blocks =
      std::max<int64_t>(1, (cols_total + cols - 1) / cols);
  const int64_t row_blocks = (rows_total + rows - 1) / rows;

  at::Tensor partial = at::empty({rows_total, col_blocks}, options);
  if (cols_total == 0) {
    partial.zero_();
  } else {
    parallel_tiles(row_blocks * col_blocks, [&](int64_t index) {
      const int64_t i = index / col_blocks;
      const int64_t j = index % col_blocks;
      const Tile t{i * rows, std::min(rows, rows_total - i * rows), j * cols,
                   std::min(cols, cols_total - j * cols), j};
      tile(t, partial);
    });
  }
  if (col_blocks == 1) return partial.select(1, 0);

  // Each row's partials, added serially; rows in fixed groups.
  at::Tensor total = at::empty({rows_total}, options);
  const int64_t group = std::max<int64_t>(1, kTileElements / col_blocks);
  parallel_tiles((rows_total + group - 1) / group, [&](int64_t g) {
    const int64_t r0 = g * group;
    const int64_t rn = std::min(group, rows_total - r0);
    at::Tensor out = total.narrow(0, r0, rn);
    at::sum_out(out, partial.narrow(0, r0, rn), 1);
  });
  return total;
}

bool columns_contiguous(const at::Tensor& matrix) {
  return matrix.stride(1) <= matrix.stride(0) || matrix.size(0) == 1;
}

at::Tensor sum(const at::Tensor& x, at::IntArrayRef dims, bool keepdim,
               at::ScalarType out_dtype) {
  const RowLayout layout = row_layout(x, dims, keepdim);
  const at::Tensor m = layout.matrix(x);
  const at::ScalarType acc = accumulate_type(out_dtype);
  at::Tensor total = tile_sums(
      layout.rows, layout.cols, columns_contiguous(m), x.options().dtype(acc),
      [&](const Tile& t, at::Tensor& partial) {
        if (!native_tile_sum(m, t, partial, TileMap::kIdentity)) {
          at::Tensor out = slot_of(partial, t);
          at::sum_out(out, tile_of(m, t), 1, /*keepdim=*/false, acc);
        }
      });
  return total.to(out_dtype).reshape(layout.out_shape);
}

}  // namespace ember::deterministic
