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

void parallel_tiles(int64_t n, c10::function_ref<void(int64_t)> fn,
                    bool needs_region) {
  if (n <= 0) return;
  if (n == 1 && !needs_region) {
    fn(0);  // plain loops: no team needed
    return;
  }
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

// Pointers for one tile: rows x cols elements, `stride` between rows
// (sum_rows) or between columns (sum_columns).
template <class In, class Acc>
struct TileLoopArgs {
  const In* a;
  const In* b;
  int64_t stride;
  int64_t rows;
  int64_t cols;
  const Acc* row_center;
  const Acc* column_center;
  const Acc* column_scale;
  Acc* out;
  int64_t out_stride;
};

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
void run_loops(const TileLoopArgs<In, Acc>& args, bool along_rows) {
#ifdef EMBER_HAVE_AVX2_LOOPS
  if (use_avx2()) {
    along_rows ? loops_avx2::sum_rows<M, In, Acc>(args)
               : loops_avx2::sum_columns<M, In, Acc>(args);
    return;
  }
#endif
  along_rows ? loops_default::sum_rows<M, In, Acc>(args)
             : loops_default::sum_columns<M, In, Acc>(args);
}

template <class Acc>
const Acc* pointer_or_null(const at::Tensor& t, int64_t offset) {
  return t.defined() ? t.const_data_ptr<Acc>() + offset : nullptr;
}

template <class In, class Acc>
bool tile_sum_typed(const TileInputs& in, const Tile& t, at::Tensor& partial,
                    TileMap map) {
  const at::Tensor& a = in.a;
  const int64_t s0 = a.stride(0);
  const int64_t s1 = a.stride(1);
  const bool along_rows = s1 == 1 || t.cn == 1;
  const bool along_columns = s0 == 1 && t.rn <= kOuterTileRows;
  if (!along_rows && !along_columns) return false;
  const int64_t offset = t.r0 * s0 + t.c0 * s1;
  TileLoopArgs<In, Acc> args{
      a.const_data_ptr<In>() + offset,
      in.b.defined() ? in.b.const_data_ptr<In>() + offset : nullptr,
      along_rows ? s0 : s1,
      t.rn,
      t.cn,
      pointer_or_null<Acc>(in.row_center, t.r0),
      pointer_or_null<Acc>(in.column_center, t.c0),
      pointer_or_null<Acc>(in.column_scale, t.c0),
      partial.mutable_data_ptr<Acc>() + t.r0 * partial.stride(0) +
          t.block * partial.stride(1),
      partial.stride(0)};
  switch (map) {
#define EMBER_TILE_CASE(M)                   \
  case M:                                    \
    run_loops<M, In, Acc>(args, along_rows); \
    break;
    EMBER_TILE_CASE(TileMap::kIdentity)
    EMBER_TILE_CASE(TileMap::kAbs)
    EMBER_TILE_CASE(TileMap::kSquare)
    EMBER_TILE_CASE(TileMap::kSquaredDeviation)
    EMBER_TILE_CASE(TileMap::kProduct)
    EMBER_TILE_CASE(TileMap::kSquaredDifference)
    EMBER_TILE_CASE(TileMap::kNormalizedProduct)
#undef EMBER_TILE_CASE
  }
  return true;
}

template <class Acc>
bool tile_sum_for(const TileInputs& in, const Tile& t, at::Tensor& partial,
                  TileMap map) {
  switch (in.a.scalar_type()) {
    case at::kFloat:
      return tile_sum_typed<float, Acc>(in, t, partial, map);
    case at::kDouble:
      return tile_sum_typed<double, Acc>(in, t, partial, map);
    case at::kBFloat16:
      return tile_sum_typed<c10::BFloat16, Acc>(in, t, partial, map);
    case at::kHalf:
      return tile_sum_typed<c10::Half, Acc>(in, t, partial, map);
    default:
      return false;
  }
}

bool usable_side_input(const at::Tensor& t, const at::Tensor& partial,
                       bool needed) {
  if (!needed) return true;
  return t.defined() && t.scalar_type() == partial.scalar_type() &&
         t.is_contiguous() && t.dim() == 1;
}

}  // namespace

at::Tensor tile_of(const at::Tensor& matrix, const Tile& t) {
  return matrix.narrow(0, t.r0, t.rn).narrow(1, t.c0, t.cn);
}

at::Tensor slot_of(const at::Tensor& partial, const Tile& t) {
  return partial.narrow(0, t.r0, t.rn).select(1, t.block);
}

bool native_tile_sum(const TileInputs& in, const Tile& t, at::Tensor& partial,
                     TileMap map) {
  const at::Tensor& a = in.a;
  if (a.dim() != 2 || partial.dim() != 2 || t.rn == 0 || t.cn == 0) {
    return false;
  }
  if (a.is_conj() || a.is_neg()) return false;
  const bool needs_b = map == TileMap::kProduct ||
                       map == TileMap::kSquaredDifference ||
                       map == TileMap::kNormalizedProduct;
  if (needs_b && (!in.b.defined() || in.b.scalar_type() != a.scalar_type() ||
                  in.b.sizes() != a.sizes() || in.b.strides() != a.strides() ||
                  in.b.is_conj() || in.b.is_neg())) {
    return false;
  }
  const bool needs_columns = map == TileMap::kNormalizedProduct;
  if (!usable_side_input(in.row_center, partial,
                         map == TileMap::kSquaredDeviation) ||
      !usable_side_input(in.column_center, partial, needs_columns) ||
      !usable_side_input(in.column_scale, partial, needs_columns)) {
    return false;
  }
  switch (partial.scalar_type()) {
    case at::kFloat:
      // float accumulation of double input would lose precision.
      if (a.scalar_type() == at::kDouble) return false;
      return tile_sum_for<float>(in, t, partial, map);
    case at::kDouble:
      return tile_sum_for<double>(in, t, partial, map);
    default:
      return false;
  }
}

bool native_tile_sum(const at::Tensor& matrix, const Tile& t,
                     at::Tensor& partial, TileMap map,
                     const at::Tensor& row_center) {
  TileInputs in;
  in.a = matrix;
  in.row_center = row_center;
  return native_tile_sum(in, t, partial, map);
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

namespace {

// Whether native_tile_sum handles every tile of `in` under tile_sums'
// geometry (`rows_geometry`: tiles of whole rows and long column blocks).
bool native_supported(const NativeSum& native, at::ScalarType acc,
                      bool rows_geometry) {
  const at::Tensor& a = native.inputs.a;
  if (a.dim() != 2) return false;
  const bool layout_ok = a.stride(1) == 1 || a.size(1) == 1 ||
                         (a.stride(0) == 1 && !rows_geometry) ||
                         (a.stride(0) == 1 && a.size(0) == 1);
  if (!layout_ok) return false;
  if (a.numel() == 0) return false;
  // native_tile_sum checks dtypes and side inputs before touching memory;
  // probe it with the 1x1 tile at the origin, into a scratch output.
  at::Tensor probe = at::empty({1, 1}, a.options().dtype(acc));
  return native_tile_sum(native.inputs, Tile{0, 1, 0, 1, 0}, probe, native.map);
}

}  // namespace

at::Tensor tile_sums(int64_t rows_total, int64_t cols_total,
                     bool columns_contiguous, const at::TensorOptions& options,
                     TileSum tile, const NativeSum* native) {
  // Tile geometry: a function of the shape (and which way memory runs).
  const bool rows_geometry = columns_contiguous || rows_total == 1;
  int64_t rows;
  int64_t cols;
  if (rows_geometry) {
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
  const at::ScalarType acc = c10::typeMetaToScalarType(options.dtype());

  at::Tensor partial = at::empty({rows_total, col_blocks}, options);
  if (cols_total == 0) {
    partial.zero_();
  } else if (rows_total > 0) {
    // Plain loops need no parallel region; ATen kernels do.
    const bool plain =
        native != nullptr && native_supported(*native, acc, rows_geometry);
    parallel_tiles(
        row_blocks * col_blocks,
        [&](int64_t index) {
          const int64_t i = index / col_blocks;
          const int64_t j = index % col_blocks;
          const Tile t{i * rows, std::min(rows, rows_total - i * rows),
                       j * cols, std::min(cols, cols_total - j * cols), j};
          if (!plain ||
              !native_tile_sum(native->inputs, t, partial, native->map)) {
            tile(t, partial);
          }
        },
        /*needs_region=*/!plain);
  }
  if (col_blocks == 1) return partial.select(1, 0);

  // Each row's partials, added in order by the plain row loop; rows in
  // fixed groups, on the calling thread unless there are many.
  at::Tensor total = at::empty({rows_total, 1}, options);
  const int64_t group = std::max<int64_t>(1, kTileElements / col_blocks);
  const int64_t groups = (rows_total + group - 1) / group;
  const auto combine = [&](int64_t g) {
    const int64_t r0 = g * group;
    const Tile t{r0, std::min(group, rows_total - r0), 0, col_blocks, 0};
    if (!native_tile_sum(partial, t, total, TileMap::kIdentity)) {
      at::Tensor out = total.narrow(0, t.r0, t.rn).select(1, 0);
      at::sum_out(out, partial.narrow(0, t.r0, t.rn), 1);
    }
  };
  const bool plain_combine = acc == at::kFloat || acc == at::kDouble;
  if (plain_combine && groups <= 4) {
    for (int64_t g = 0; g < groups; ++g) combine(g);
  } else {
    parallel_tiles(groups, combine, /*needs_region=*/!plain_combine);
  }
  return total.select(1, 0);
}

bool columns_contiguous(const at::Tensor& matrix) {
  return matrix.stride(1) <= matrix.stride(0) || matrix.size(0) == 1;
}

at::Tensor sum(const at::Tensor& x, at::IntArrayRef dims, bool keepdim,
               at::ScalarType out_dtype) {
  const RowLayout layout = row_layout(x, dims, keepdim);
  const at::Tensor m = layout.matrix(x);
  const at::ScalarType acc = accumulate_type(out_dtype);
  const NativeSum native{{m}, TileMap::kIdentity};
  at::Tensor total = tile_sums(
      layout.rows, layout.cols, columns_contiguous(m), x.options().dtype(acc),
      [&](const Tile& t, at::Tensor& partial) {
        at::Tensor out = slot_of(partial, t);
        at::sum_out(out, tile_of(m, t), 1, /*keepdim=*/false, acc);
      },
      &native);
  return total.to(out_dtype).reshape(layout.out_shape);
}

}  // namespace ember::deterministic
