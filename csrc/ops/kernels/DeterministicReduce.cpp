#include "ops/kernels/DeterministicReduce.h"

#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sum.h>
#include <c10/util/irange.h>

#include <algorithm>
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
      const int64_t r0 = i * rows;
      const int64_t c0 = j * cols;
      at::Tensor out =
          partial.narrow(0, r0, std::min(rows, rows_total - r0)).select(1, j);
      tile(out, r0, std::min(rows, rows_total - r0), c0,
           std::min(cols, cols_total - c0));
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
      [&](at::Tensor& out, int64_t r0, int64_t rn, int64_t c0, int64_t cn) {
        at::sum_out(out, m.narrow(0, r0, rn).narrow(1, c0, cn), 1,
                    /*keepdim=*/false, acc);
      });
  return total.to(out_dtype).reshape(layout.out_shape);
}

}  // namespace ember::deterministic
