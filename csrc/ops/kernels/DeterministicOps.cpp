#include "ops/kernels/DeterministicOps.h"

#include <ATen/Context.h>
#include <ATen/ExpandUtils.h>
#include <ATen/TensorOperators.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/core/Reduction.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_softmax.h>
#include <ATen/ops/_softmax_backward_data.h>
#include <ATen/ops/_softmax_backward_data_ops.h>
#include <ATen/ops/_softmax_ops.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/complex.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_ops.h>
#include <ATen/ops/imag.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/linalg_vector_norm_ops.h>
#include <ATen/ops/mean_ops.h>
#include <ATen/ops/mse_loss.h>
#include <ATen/ops/mse_loss_ops.h>
#include <ATen/ops/nansum_ops.h>
#include <ATen/ops/native_group_norm.h>
#include <ATen/ops/native_group_norm_backward.h>
#include <ATen/ops/native_group_norm_backward_ops.h>
#include <ATen/ops/native_group_norm_ops.h>
#include <ATen/ops/native_layer_norm_backward.h>
#include <ATen/ops/native_layer_norm_backward_ops.h>
#include <ATen/ops/norm_ops.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/real.h>
#include <ATen/ops/result_type.h>
#include <ATen/ops/std_mean_ops.h>
#include <ATen/ops/std_ops.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/sum_ops.h>
#include <ATen/ops/var_mean_ops.h>
#include <ATen/ops/var_ops.h>
#include <ATen/record_function.h>

#include <cmath>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/CpuAllocationCapture.h"
#include "flags/BackendFlags.h"
#include "ops/CpuDelegation.h"
#include "ops/DelegationCall.h"
#include "ops/DeviceScope.h"
#include "ops/LaunchedOps.h"
#include "ops/UnboxedDelegation.h"
#include "ops/kernels/DeterministicCommon.h"
#include "ops/kernels/DeterministicReduce.h"
#include "ops/kernels/OpLayouts.h"
#include "ops/kernels/SerialScope.h"

namespace ember::kernels::deterministic {
namespace {

namespace ops = at::_ops;
using unboxed::functional;
using namespace detail;  // NOLINT: the shared aliases of this kernel family

// --- reductions on CPU tensors ---------------------------------------------

at::Tensor mean_cpu(const at::Tensor& x, at::IntArrayRef dims, bool keepdim,
                    at::ScalarType out) {
  const at::ScalarType acc = fixed::accumulate_type(out);
  at::Tensor total = fixed::sum(x, dims, keepdim, acc);
  total.div_(static_cast<double>(fixed::reduced_count(x, dims)));
  return total.to(out);
}

// Two passes: the mean, then the sum of squared deviations from it (each
// tile subtracts its rows' means, so no full-size temporary).
std::pair<at::Tensor, at::Tensor> var_mean_cpu(const at::Tensor& x,
                                               at::IntArrayRef dims,
                                               double correction,
                                               bool keepdim) {
  if (x.is_complex()) {
    auto [var_re, mean_re] =
        var_mean_cpu(at::real(x), dims, correction, keepdim);
    auto [var_im, mean_im] =
        var_mean_cpu(at::imag(x), dims, correction, keepdim);
    return {var_re.add_(var_im), at::complex(mean_re, mean_im)};
  }
  const at::ScalarType acc = fixed::accumulate_type(x.scalar_type());
  const fixed::RowLayout layout = fixed::row_layout(x, dims, keepdim);
  const at::Tensor m = layout.matrix(x);
  const bool along = fixed::columns_contiguous(m);
  const auto options = x.options().dtype(acc);
  const auto count = static_cast<double>(layout.cols);
  const fixed::NativeSum plain_sum{{m}, fixed::TileMap::kIdentity};
  at::Tensor mean = fixed::tile_sums(
                        layout.rows, layout.cols, along, options,
                        [&](const fixed::Tile& t, at::Tensor& partial) {
                          at::Tensor out = fixed::slot_of(partial, t);
                          at::sum_out(out, fixed::tile_of(m, t), 1, false, acc);
                        },
                        &plain_sum)
                        .div_(count)
                        .contiguous();
  const fixed::NativeSum squared_deviations{{m, {}, mean},
                                            fixed::TileMap::kSquaredDeviation};
  at::Tensor var = fixed::tile_sums(
                       layout.rows, layout.cols, along, options,
                       [&](const fixed::Tile& t, at::Tensor& partial) {
                         at::Tensor out = fixed::slot_of(partial, t);
                         at::Tensor deviation =
                             fixed::tile_of(m, t).to(acc) -
                             mean.narrow(0, t.r0, t.rn).unsqueeze(1);
                         at::sum_out(out, deviation.mul_(deviation), 1);
                       },
                       &squared_deviations)
                       .div_(std::max(0.0, count - correction));
  return {var.to(x.scalar_type()).reshape(layout.out_shape),
          mean.to(x.scalar_type()).reshape(layout.out_shape)};
}

double correction_of(OptScalar correction) {
  return correction.has_value() ? correction->toDouble() : 1.0;
}

}  // namespace

// --- reductions -------------------------------------------------------------

at::Tensor sum(T self, OptDims dim, bool keepdim, OptDtype dtype) {
  const at::ScalarType out = dtype.value_or(
      at::isIntegralType(self.scalar_type(), /*includeBool=*/true)
          ? at::kLong
          : self.scalar_type());
  if (!flags::deterministic() || !rounds(out)) {
    return unboxed::launched<ops::sum_dim_IntList,
                             unboxed::OutForm<ops::sum_IntList_out>,
                             layouts::SumDim, T, OptDims, bool, OptDtype>(
        self, dim, keepdim, dtype);
  }
  return on_aliases(
      "ember::deterministic::sum",
      [&](const at::Tensor& x) {
        return fixed::sum(x, dims_of(x, dim), keepdim, out);
      },
      self);
}

at::Tensor mean(T self, OptDims dim, bool keepdim, OptDtype dtype) {
  const at::ScalarType out = dtype.value_or(self.scalar_type());
  if (!flags::deterministic() || !rounds(out) || !rounds(self.scalar_type())) {
    return unboxed::launched<ops::mean_dim, unboxed::OutForm<ops::mean_out>,
                             layouts::MeanDim, T, OptDims, bool, OptDtype>(
        self, dim, keepdim, dtype);
  }
  return on_aliases(
      "ember::deterministic::mean",
      [&](const at::Tensor& x) {
        return mean_cpu(x, dims_of(x, dim), keepdim, out);
      },
      self);
}

at::Tensor var(T self, OptDims dim, OptScalar correction, bool keepdim) {
  if (!flags::deterministic() || !rounds(self.scalar_type())) {
    return functional<ops::var_correction, T, OptDims, OptScalar, bool>(
        self, dim, correction, keepdim);
  }
  return on_aliases(
      "ember::deterministic::var",
      [&](const at::Tensor& x) {
        return var_mean_cpu(x, dims_of(x, dim), correction_of(correction),
                            keepdim)
            .first;
      },
      self);
}

at::Tensor std_dev(T self, OptDims dim, OptScalar correction, bool keepdim) {
  if (!flags::deterministic() || !rounds(self.scalar_type())) {
    return functional<ops::std_correction, T, OptDims, OptScalar, bool>(
        self, dim, correction, keepdim);
  }
  return on_aliases(
      "ember::deterministic::std",
      [&](const at::Tensor& x) {
        return var_mean_cpu(x, dims_of(x, dim), correction_of(correction),
                            keepdim)
            .first.sqrt_();
      },
      self);
}

std::tuple<at::Tensor, at::Tensor> var_mean(T self, OptDims dim,
                                            OptScalar correction,
                                            bool keepdim) {
  if (!flags::deterministic() || !rounds(self.scalar_type())) {
    return functional<ops::var_mean_correction, T, OptDims, OptScalar, bool>(
        self, dim, correction, keepdim);
  }
  return on_aliases(
      "ember::deterministic::var_mean",
      [&](const at::Tensor& x) {
        auto [v, m] = var_mean_cpu(x, dims_of(x, dim),
                                   correction_of(correction), keepdim);
        return std::tuple<at::Tensor, at::Tensor>(v, m);
      },
      self);
}

std::tuple<at::Tensor, at::Tensor> std_mean(T self, OptDims dim,
                                            OptScalar correction,
                                            bool keepdim) {
  if (!flags::deterministic() || !rounds(self.scalar_type())) {
    return functional<ops::std_mean_correction, T, OptDims, OptScalar, bool>(
        self, dim, correction, keepdim);
  }
  return on_aliases(
      "ember::deterministic::std_mean",
      [&](const at::Tensor& x) {
        auto [v, m] = var_mean_cpu(x, dims_of(x, dim),
                                   correction_of(correction), keepdim);
        return std::tuple<at::Tensor, at::Tensor>(v.sqrt_(), m);
      },
      self);
}

at::Tensor linalg_vector_norm(T self, const at::Scalar& ord, OptDims dim,
                              bool keepdim, OptDtype dtype) {
  const double p = ord.toDouble();
  // max/min (ord = +-inf) are exact in any order.
  if (!flags::deterministic() || std::isinf(p) ||
      !rounds(dtype.value_or(self.scalar_type()))) {
    return functional<ops::linalg_vector_norm, T, const at::Scalar&, OptDims,
                      bool, OptDtype>(self, ord, dim, keepdim, dtype);
  }
  return on_aliases(
      "ember::deterministic::linalg_vector_norm",
      [&](const at::Tensor& x_in) {
        // Per tile ATen's norm, raised to the p-th power; the powers are
        // summed in a fixed order and the root taken once.
        const at::Tensor x = dtype.has_value() ? x_in.to(*dtype) : x_in;
        const at::ScalarType out = c10::toRealValueType(x.scalar_type());
        const at::ScalarType acc = fixed::accumulate_type(out);
        const std::optional<at::ScalarType> tile_dtype =
            !x.is_complex() && x.scalar_type() != acc
                ? std::optional<at::ScalarType>(acc)
                : std::nullopt;
        const bool powered = p != 0 && p != 1;
        std::optional<fixed::TileMap> native_map;
        if (!x.is_complex() && p == 1) native_map = fixed::TileMap::kAbs;
        if (!x.is_complex() && p == 2) native_map = fixed::TileMap::kSquare;
        const fixed::RowLayout layout =
            fixed::row_layout(x, dims_of(x, dim), keepdim);
        const at::Tensor m = layout.matrix(x);
        // |x| or x*x summed by plain loops (p = 1, 2).
        const fixed::NativeSum plain{
            {m}, native_map.value_or(fixed::TileMap::kIdentity)};
        at::Tensor total = fixed::tile_sums(
            layout.rows, layout.cols, fixed::columns_contiguous(m),
            x.options().dtype(acc),
            [&](const fixed::Tile& t, at::Tensor& partial) {
              at::Tensor part = fixed::slot_of(partial, t);
              at::linalg_vector_norm_out(part, fixed::tile_of(m, t), ord, 1,
                                         false, tile_dtype);
              if (powered) part.pow_(p);
            },
            native_map.has_value() ? &plain : nullptr);
        if (p == 2) {
          total.sqrt_();
        } else if (powered) {
          // pow's vector and scalar paths round differently, and ATen's
          // thread split decides which elements take which: serially.
          fixed::run_serially([&] { total.pow_(1.0 / p); });
        }
        return total.to(out).reshape(layout.out_shape);
      },
      self);
}

at::Tensor nansum(T self, OptDims dim, bool keepdim, OptDtype dtype) {
  const at::ScalarType out = dtype.value_or(self.scalar_type());
  if (!flags::deterministic() || !rounds(out) || !rounds(self.scalar_type())) {
    return functional<ops::nansum, T, OptDims, bool, OptDtype>(self, dim,
                                                               keepdim, dtype);
  }
  return on_aliases(
      "ember::deterministic::nansum",
      [&](const at::Tensor& x) {
        return fixed::sum(x.masked_fill(x.isnan(), 0), dims_of(x, dim), keepdim,
                          out);
      },
      self);
}

at::Tensor norm(T self, const std::optional<at::Scalar>& p, at::IntArrayRef dim,
                bool keepdim) {
  if (!flags::deterministic()) {
    return functional<ops::norm_ScalarOpt_dim, T,
                      const std::optional<at::Scalar>&, at::IntArrayRef, bool>(
        self, p, dim, keepdim);
  }
  return kernels::deterministic::linalg_vector_norm(self, p.value_or(2), dim,
                                                    keepdim, std::nullopt);
}

at::Tensor mse_loss(T self, T target, int64_t reduction) {
  if (!flags::deterministic() || reduction == at::Reduction::None ||
      !rounds(self.scalar_type())) {
    return functional<ops::mse_loss, T, T, int64_t>(self, target, reduction);
  }
  return on_aliases(
      "ember::deterministic::mse_loss",
      [&](const at::Tensor& x, const at::Tensor& y) {
        const auto shape = at::infer_size(x.sizes(), y.sizes());
        const at::ScalarType dtype = at::result_type(x, y);
        const at::ScalarType acc = fixed::accumulate_type(dtype);
        const at::Tensor a = x.expand(shape).reshape({1, -1});
        const at::Tensor b = y.expand(shape).reshape({1, -1});
        const fixed::NativeSum plain{{a, b},
                                     fixed::TileMap::kSquaredDifference};
        at::Tensor total = fixed::tile_sums(
            1, a.size(1), true, x.options().dtype(acc),
            [&](const fixed::Tile& t, at::Tensor& partial) {
              at::Tensor out = fixed::slot_of(partial, t);
              at::Tensor d =
                  fixed::tile_of(a, t).to(acc) - fixed::tile_of(b, t).to(acc);
              at::sum_out(out, d.mul_(d), 1);
            },
            &plain);
        if (reduction == at::Reduction::Mean) {
          total.div_(static_cast<double>(a.size(1)));
        }
        return total.to(dtype).reshape({});
      },
      self, target);
}

// --- softmax ----------------------------------------------------------------

namespace {

// Elements after `dim`: 1 when the softmax runs along contiguous rows, the
// case ATen parallelises by whole rows (thread-count independent).
int64_t inner_size(const at::Tensor& x, int64_t dim) {
  if (x.dim() == 0) return 1;
  const int64_t d = at::maybe_wrap_dim(dim, x.dim());
  int64_t inner = 1;
  for (int64_t i = d + 1; i < x.dim(); ++i) inner *= x.size(i);
  return inner;
}

// `x` with `dim` moved last and made contiguous: rows ATen reduces whole.
at::Tensor rows_along(const at::Tensor& x, int64_t dim) {
  return x.movedim(dim, -1).contiguous();
}

}  // namespace

at::Tensor softmax(T self, int64_t dim, bool half_to_float) {
  if (!flags::deterministic() || inner_size(self, dim) == 1) {
    return unboxed::launched<ops::_softmax,
                             unboxed::RowwiseOutForm<ops::_softmax_out>,
                             layouts::Softmax, T, int64_t, bool>(self, dim,
                                                                 half_to_float);
  }
  return on_aliases(
      "ember::deterministic::_softmax",
      [&](const at::Tensor& x) {
        const int64_t d = at::maybe_wrap_dim(dim, x.dim());
        return at::_softmax(rows_along(x, d), -1, half_to_float)
            .movedim(-1, d)
            .contiguous();
      },
      self);
}

at::Tensor softmax_backward_data(T grad_output, T output, int64_t dim,
                                 at::ScalarType input_dtype) {
  if (!flags::deterministic() || inner_size(output, dim) == 1) {
    return functional<ops::_softmax_backward_data, T, T, int64_t,
                      at::ScalarType>(grad_output, output, dim, input_dtype);
  }
  return on_aliases(
      "ember::deterministic::_softmax_backward_data",
      [&](const at::Tensor& grad, const at::Tensor& out) {
        const int64_t d = at::maybe_wrap_dim(dim, out.dim());
        return at::_softmax_backward_data(rows_along(grad, d),
                                          rows_along(out, d), -1, input_dtype)
            .movedim(-1, d)
            .contiguous();
      },
      grad_output, output);
}

at::Tensor gelu(T self, c10::string_view approximate) {
  if (!flags::deterministic() || approximate != "tanh") {
    // ATen's GELU_MIN_ELEMENTS_FOR_MULTI_THREADING: below it no split.
    return unboxed::launched<
        ops::gelu, unboxed::SmallSplitFreeOutForm<ops::gelu_out, 6144>,
        layouts::Gelu, T, c10::string_view>(self, approximate);
  }
  return on_aliases(
      "ember::deterministic::gelu",
      [&](const at::Tensor& x) {
        at::Tensor y;
        fixed::run_serially([&] { y = at::gelu(x, approximate); });
        return y;
      },
      self);
}

}  // namespace ember::kernels::deterministic
