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
#include <ATen/ops/std_mean_ops.h>
#include <ATen/ops/std_ops.h>
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
#include "ops/UnboxedDelegation.h"
#include "ops/kernels/DeterministicReduce.h"
#include "ops/kernels/SerialScope.h"

namespace ember::kernels::deterministic {
namespace {

namespace ops = at::_ops;
namespace fixed = ember::deterministic;
using unboxed::functional;
using OptDims = at::OptionalIntArrayRef;
using OptDtype = std::optional<at::ScalarType>;
using OptScalar = const std::optional<at::Scalar>&;

// Runs `body` on CPU aliases of the ember tensor arguments, the way
// unboxed::functional runs the CPU kernel (same device checks, same
// allocation capture, results adopted as ember tensors).
template <class Body, class... Tensors>
auto on_aliases(const char* name, Body&& body, const Tensors&... tensors) {
  DelegationCall call(name, /*accepts_cpu_tensors=*/false);
  std::tuple<std::decay_t<decltype(unboxed::to_cpu(call, tensors, false))>...>
      cpu{unboxed::to_cpu(call, tensors, false)...};
  call.settle();
  using Result = decltype(std::apply(body, cpu));
  Result result;
  const c10::DeviceIndex device = call.device();
  run_on_device(device, [&] {
    CpuAllocationCapture capture(device);
    RECORD_FUNCTION(name, c10::ArrayRef<const c10::IValue>{});
    result = std::apply(body, cpu);
  });
  return unboxed::from_cpu(call, result);
}

// Floating and complex reductions round; integer ones do not, so ATen's
// order is as good as any.
bool rounds(at::ScalarType dtype) {
  return at::isFloatingType(dtype) || at::isComplexType(dtype);
}

c10::SmallVector<int64_t, 8> dims_of(const at::Tensor& x, OptDims dim) {
  return fixed::wrap_dims(x, dim);
}

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
    return functional<ops::sum_dim_IntList, T, OptDims, bool, OptDtype>(
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
    return functional<ops::mean_dim, T, OptDims, bool, OptDtype>(
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
    return functional<ops::_softmax, T, int64_t, bool>(self, dim,
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
    return functional<ops::gelu, T, c10::string_view>(self, approximate);
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

// --- layer norm / group norm -------------------------------------------------

Tensor3 layer_norm_backward(T grad_out, T input,
                            c10::SymIntArrayRef normalized_shape, T mean,
                            T rstd, OptT weight, OptT bias,
                            std::array<bool, 3> output_mask) {
  if (!flags::deterministic() || !(output_mask[1] || output_mask[2])) {
    return functional<ops::native_layer_norm_backward, T, T,
                      c10::SymIntArrayRef, T, T, OptT, OptT,
                      std::array<bool, 3>>(grad_out, input, normalized_shape,
                                           mean, rstd, weight, bias,
                                           output_mask);
  }
  return on_aliases(
      "ember::deterministic::native_layer_norm_backward",
      [&](const at::Tensor& dy, const at::Tensor& x, const at::Tensor& mu,
          const at::Tensor& rs, const std::optional<at::Tensor>& w,
          const std::optional<at::Tensor>& b) {
        // The input gradient is per row in ATen (thread-count independent);
        // the weight and bias gradients sum over rows, in a fixed order here.
        at::Tensor dx;
        if (output_mask[0]) {
          dx = std::get<0>(at::native_layer_norm_backward_symint(
              dy, x, normalized_shape, mu, rs, w, b, {true, false, false}));
        }
        const int64_t axis =
            x.dim() - static_cast<int64_t>(normalized_shape.size());
        const int64_t cols = c10::multiply_integers(x.sizes().slice(axis));
        const int64_t rows = c10::multiply_integers(x.sizes().slice(0, axis));
        const at::ScalarType acc = fixed::accumulate_type(x.scalar_type());
        const auto options = x.options().dtype(acc);
        // Features as rows, the normalised rows as reduced columns (views).
        const at::Tensor dy_t = dy.reshape({rows, cols}).t();
        const at::Tensor x_t = x.reshape({rows, cols}).t();
        const at::Tensor mu_t = mu.reshape({1, rows}).to(acc);
        const at::Tensor rs_t = rs.reshape({1, rows}).to(acc);
        const bool along = fixed::columns_contiguous(x_t);
        const bool has_w = w.has_value() && w->defined();
        const bool has_b = b.has_value() && b->defined();
        at::Tensor dw;
        at::Tensor db;
        if (output_mask[1] && has_w) {
          // (x - mean) * rstd * dy, per normalised row (a column here).
          fixed::NativeSum normalized{{x_t, dy_t},
                                      fixed::TileMap::kNormalizedProduct};
          normalized.inputs.column_center = mu_t.reshape({rows}).contiguous();
          normalized.inputs.column_scale = rs_t.reshape({rows}).contiguous();
          dw = fixed::tile_sums(
                   cols, rows, along, options,
                   [&](const fixed::Tile& t, at::Tensor& partial) {
                     at::Tensor out = fixed::slot_of(partial, t);
                     at::Tensor xhat = fixed::tile_of(x_t, t).to(acc) -
                                       mu_t.narrow(1, t.c0, t.cn);
                     xhat.mul_(rs_t.narrow(1, t.c0, t.cn))
                         .mul_(fixed::tile_of(dy_t, t));
                     at::sum_out(out, xhat, 1);
                   },
                   &normalized)
                   .to(w->scalar_type())
                   .reshape(w->sizes());
        }
        if (output_mask[2] && (has_b || has_w)) {
          const at::Tensor& like = has_b ? *b : *w;
          const fixed::NativeSum plain_dy{{dy_t}, fixed::TileMap::kIdentity};
          db = fixed::tile_sums(
                   cols, rows, along, options,
                   [&](const fixed::Tile& t, at::Tensor& partial) {
                     at::Tensor out = fixed::slot_of(partial, t);
                     at::sum_out(out, fixed::tile_of(dy_t, t), 1, false, acc);
                   },
                   &plain_dy)
                   .to(like.scalar_type())
                   .reshape(like.sizes());
        }
        return Tensor3(dx, dw, db);
      },
      grad_out, input, mean, rstd, weight, bias);
}

Tensor3 group_norm(T input, OptT weight, OptT bias, c10::SymInt N,
                   c10::SymInt C, c10::SymInt HxW, int64_t group, double eps) {
  // ATen's kernel for contiguous input computes each group's moments
  // serially (thread-count independent); its channels-last kernel splits
  // the moments between threads.
  if (!flags::deterministic() || input.is_contiguous()) {
    return functional<ops::native_group_norm, T, OptT, OptT, c10::SymInt,
                      c10::SymInt, c10::SymInt, int64_t, double>(
        input, weight, bias, N, C, HxW, group, eps);
  }
  return on_aliases(
      "ember::deterministic::native_group_norm",
      [&](const at::Tensor& x, const std::optional<at::Tensor>& w,
          const std::optional<at::Tensor>& b) {
        // ATen's channels-last kernel, serially (cheaper than transposing
        // to and from the contiguous kernel's layout).
        Tensor3 result;
        fixed::run_serially([&] {
          result = at::native_group_norm_symint(x, w, b, N, C, HxW, group, eps);
        });
        return result;
      },
      input, weight, bias);
}

Tensor3 group_norm_backward(T grad_out, T input, T mean, T rstd, OptT weight,
                            c10::SymInt N, c10::SymInt C, c10::SymInt HxW,
                            int64_t group, std::array<bool, 3> output_mask) {
  if (!flags::deterministic() || input.numel() == 0) {
    return functional<ops::native_group_norm_backward, T, T, T, T, OptT,
                      c10::SymInt, c10::SymInt, c10::SymInt, int64_t,
                      std::array<bool, 3>>(grad_out, input, mean, rstd, weight,
                                           N, C, HxW, group, output_mask);
  }
  if (!input.is_contiguous()) {
    // Channels-last: ATen's kernel, serially (its every output splits by
    // thread; the formulas below would transpose both inputs).
    return on_aliases(
        "ember::deterministic::native_group_norm_backward",
        [&](const at::Tensor& dY, const at::Tensor& X, const at::Tensor& mu,
            const at::Tensor& rs, const std::optional<at::Tensor>& w) {
          Tensor3 result;
          fixed::run_serially([&] {
            result = at::native_group_norm_backward_symint(
                dY, X, mu, rs, w, N, C, HxW, group, output_mask);
          });
          return result;
        },
        grad_out, input, mean, rstd, weight);
  }
  return on_aliases(
      "ember::deterministic::native_group_norm_backward",
      [&](const at::Tensor& dY, const at::Tensor& X, const at::Tensor& mu,
          const at::Tensor& rs, const std::optional<at::Tensor>& w) {
        // ATen's formulas, with every sum in a fixed order:
        //   ds[n,c] = sum_hw dy*x, db[n,c] = sum_hw dy,
        //   dgamma[c] = sum_n (ds - db*mean) * rstd, dbeta[c] = sum_n db,
        //   dx = rstd*gamma*dy + c2*x + c3 per group.
        const int64_t n = N.guard_int(__FILE__, __LINE__);
        const int64_t c = C.guard_int(__FILE__, __LINE__);
        const int64_t hw = HxW.guard_int(__FILE__, __LINE__);
        const int64_t g = group;
        const int64_t d = c / g;
        const at::ScalarType acc = fixed::accumulate_type(X.scalar_type());
        const at::Tensor x = X.reshape({n * c, hw});
        const at::Tensor dy = dY.reshape({n * c, hw});
        const bool along = fixed::columns_contiguous(x);
        const auto options = X.options().dtype(acc);
        const fixed::NativeSum products{{dy, x}, fixed::TileMap::kProduct};
        const fixed::NativeSum plain_dy{{dy}, fixed::TileMap::kIdentity};
        const at::Tensor ds =
            fixed::tile_sums(
                n * c, hw, along, options,
                [&](const fixed::Tile& t, at::Tensor& partial) {
                  at::Tensor out = fixed::slot_of(partial, t);
                  at::Tensor p = fixed::tile_of(dy, t).to(acc);
                  p = p.mul(fixed::tile_of(x, t));
                  at::sum_out(out, p, 1);
                },
                &products)
                .reshape({n, c});
        const at::Tensor db =
            fixed::tile_sums(
                n * c, hw, along, options,
                [&](const fixed::Tile& t, at::Tensor& partial) {
                  at::Tensor out = fixed::slot_of(partial, t);
                  at::sum_out(out, fixed::tile_of(dy, t), 1, false, acc);
                },
                &plain_dy)
                .reshape({n, c});
        const at::Tensor m = mu.to(acc).reshape({n, g, 1});
        const at::Tensor r = rs.to(acc).reshape({n, g, 1});
        const bool has_w = w.has_value() && w->defined();
        const at::Tensor gamma =
            has_w ? w->to(acc).reshape({1, g, d})
                  : at::ones({1, g, d}, x.options().dtype(acc));
        at::Tensor dx;
        at::Tensor dgamma;
        at::Tensor dbeta;
        if (output_mask[0]) {
          const at::Tensor ds_g =
              fixed::sum(ds.reshape({n, g, d}) * gamma, {2}, true, acc);
          const at::Tensor db_g =
              fixed::sum(db.reshape({n, g, d}) * gamma, {2}, true, acc);
          const double s = 1.0 / static_cast<double>(d * hw);
          const at::Tensor c1 = (r * gamma).reshape({n, c, 1});
          const at::Tensor c2 = (db_g * m - ds_g) * r * r * r * s;
          const at::Tensor c3 = -c2 * m - db_g * r * s;
          dx = ((dY.to(acc).reshape({n, c, hw}) * c1).reshape({n, g, d * hw}) +
                X.to(acc).reshape({n, g, d * hw}) * c2 + c3)
                   .reshape(X.sizes())
                   .to(X.scalar_type())
                   .contiguous(X.suggest_memory_format());
        }
        const at::ScalarType param_dtype =
            has_w ? w->scalar_type() : X.scalar_type();
        if (output_mask[1]) {
          dgamma = fixed::sum(
                       (ds.reshape({n, g, d}) - db.reshape({n, g, d}) * m) * r,
                       {0}, false, acc)
                       .reshape({c})
                       .to(param_dtype);
        }
        if (output_mask[2]) {
          dbeta = fixed::sum(db, {0}, false, acc).to(param_dtype);
        }
        return Tensor3(dx, dgamma, dbeta);
      },
      grad_out, input, mean, rstd, weight);
}

// --- boxed: serial delegation and alerts -----------------------------------

void single_threaded_when_deterministic(const c10::OperatorHandle& op,
                                        c10::DispatchKeySet keys,
                                        torch::jit::Stack* stack) {
  if (!flags::deterministic()) {
    cpu_delegation_fallback(op, keys, stack);
    return;
  }
  const SerialScope one_thread;
  cpu_delegation_fallback(op, keys, stack);
}

void serial_when_deterministic(const c10::OperatorHandle& op,
                               c10::DispatchKeySet keys,
                               torch::jit::Stack* stack) {
  if (!flags::deterministic()) {
    cpu_delegation_fallback(op, keys, stack);
    return;
  }
  // Stream::run executes inline on this thread, so the CPU kernel runs
  // inside the serial region.
  RECORD_FUNCTION("ember::deterministic::serial",
                  c10::ArrayRef<const c10::IValue>{});
  fixed::run_serially([&] { cpu_delegation_fallback(op, keys, stack); });
}

namespace {

// The out= overload of an elementwise op (sigmoid -> sigmoid.out,
// pow.Tensor_Scalar -> pow.Tensor_Scalar_out, sigmoid_backward ->
// sigmoid_backward.grad_input), if it takes the same arguments plus `out`.
std::optional<c10::OperatorHandle> out_overload(const c10::OperatorHandle& op) {
  static std::mutex mutex;
  static std::unordered_map<std::string, std::optional<c10::OperatorHandle>>
      cache;
  const auto& schema = op.schema();
  const std::string key = schema.name() + "." + schema.overload_name();
  std::lock_guard<std::mutex> lock(mutex);
  const auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  std::optional<c10::OperatorHandle> found;
  const std::string base = schema.overload_name();
  for (const std::string& overload :
       {base.empty() ? std::string("out") : base + "_out",
        std::string("grad_input")}) {
    auto candidate =
        c10::Dispatcher::singleton().findOp({schema.name(), overload});
    if (candidate.has_value() && candidate->schema().arguments().size() ==
                                     schema.arguments().size() + 1) {
      found = candidate;
      break;
    }
  }
  cache.emplace(key, found);
  return found;
}

// Elements per chunk of a chunked elementwise op: a multiple of every
// vector width, so only the last chunk has a scalar tail.
constexpr int64_t kElementwiseChunk = 65536;

}  // namespace

void elementwise_when_deterministic(const c10::OperatorHandle& op,
                                    c10::DispatchKeySet keys,
                                    torch::jit::Stack* stack) {
  if (!flags::deterministic()) {
    cpu_delegation_fallback(op, keys, stack);
    return;
  }
  // Chunkable: every tensor argument contiguous, of one floating dtype and
  // one shape; no complex scalar (the result keeps the inputs' dtype).
  const size_t count = op.schema().arguments().size();
  const size_t first = stack->size() - count;
  at::Tensor like;
  bool chunkable = true;
  for (size_t i = first; i < stack->size() && chunkable; ++i) {
    const c10::IValue& v = (*stack)[i];
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!like.defined()) like = t;
      chunkable = t.is_floating_point() && t.is_contiguous() &&
                  t.scalar_type() == like.scalar_type() &&
                  t.sizes() == like.sizes() && !t.is_conj() && !t.is_neg();
    } else if (v.isScalar()) {
      chunkable = !v.toScalar().isComplex();
    } else if (!(v.isNone() || v.isBool() || v.isInt() || v.isDouble() ||
                 v.isString())) {
      chunkable = false;
    }
  }
  const auto out_op =
      chunkable && like.defined() && like.numel() > kElementwiseChunk
          ? out_overload(op)
          : std::nullopt;
  if (!out_op.has_value()) {
    serial_when_deterministic(op, keys, stack);
    return;
  }
  RECORD_FUNCTION("ember::deterministic::elementwise",
                  c10::ArrayRef<const c10::IValue>{});
  // ATen's kernel on fixed chunks of the flattened tensors, in parallel:
  // each chunk runs serially, so every element takes the same (vector or
  // scalar) path whatever the thread count.
  at::Tensor out = at::empty_like(like, at::MemoryFormat::Contiguous);
  DelegationCall call(op.schema().name(), /*accepts_cpu_tensors=*/false);
  // (The aliases borrow the stack's tensors, which stay until the end.)
  std::vector<c10::IValue> arguments;
  arguments.reserve(count);
  for (size_t i = first; i < stack->size(); ++i) {
    const c10::IValue& v = (*stack)[i];
    arguments.emplace_back(
        v.isTensor()
            ? c10::IValue(call.to_cpu(v.toTensor(), false).reshape({-1}))
            : v);
  }
  const at::Tensor out_cpu = call.to_cpu(out, true).reshape({-1});
  call.settle();
  const int64_t numel = like.numel();
  const int64_t chunks = (numel + kElementwiseChunk - 1) / kElementwiseChunk;
  const c10::DeviceIndex device = call.device();
  run_on_device(device, [&] {
    CpuAllocationCapture capture(device);
    fixed::parallel_tiles(chunks, [&](int64_t chunk) {
      const int64_t start = chunk * kElementwiseChunk;
      const int64_t length = std::min(kElementwiseChunk, numel - start);
      torch::jit::Stack local;
      local.reserve(arguments.size() + 1);
      for (const c10::IValue& v : arguments) {
        local.emplace_back(
            v.isTensor() ? c10::IValue(v.toTensor().narrow(0, start, length))
                         : v);
      }
      local.emplace_back(out_cpu.narrow(0, start, length));
      out_op->redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU),
                              &local);
    });
  });
  torch::jit::drop(*stack, count);
  stack->emplace_back(out);
}

void put_(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
          torch::jit::Stack* stack) {
  // put_(self, index, source, accumulate): accumulate is last.
  const bool accumulate = stack->back().toBool();
  if (flags::deterministic() && !accumulate &&
      !at::globalContext().deterministicAlgorithms()) {
    // (Under use_deterministic_algorithms the CPU kernel alerts itself.)
    flags::alert_not_deterministic("put_");
  }
  serial_when_deterministic(op, keys, stack);
}

void loss_reduction(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                    torch::jit::Stack* stack) {
  if (!flags::deterministic()) {
    cpu_delegation_fallback(op, keys, stack);
    return;
  }
  const auto& arguments = op.schema().arguments();
  const size_t first = stack->size() - arguments.size();
  size_t index = 0;
  while (index < arguments.size() && arguments[index].name() != "reduction") {
    ++index;
  }
  TORCH_INTERNAL_ASSERT(index < arguments.size(), op.schema().name(),
                        " has no reduction argument");
  c10::IValue& reduction = (*stack)[first + index];
  const int64_t mode = reduction.toInt();
  if (mode == at::Reduction::None) {
    cpu_delegation_fallback(op, keys, stack);
    return;
  }
  RECORD_FUNCTION("ember::deterministic::loss_reduction",
                  c10::ArrayRef<const c10::IValue>{});
  reduction = c10::IValue(static_cast<int64_t>(at::Reduction::None));
  cpu_delegation_fallback(op, keys, stack);
  // The elementwise loss (an ember tensor), reduced by ember's kernels.
  const at::Tensor unreduced = stack->back().toTensor();
  stack->pop_back();
  stack->emplace_back(mode == at::Reduction::Mean ? unreduced.mean()
                                                  : unreduced.sum());
}

void reduction_out(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                   torch::jit::Stack* stack) {
  if (!flags::deterministic()) {
    cpu_delegation_fallback(op, keys, stack);
    return;
  }
  // sum.IntList_out -> sum.dim_IntList, mean.out -> mean.dim, ...: the
  // functional overload takes the same arguments minus `out`.
  static const std::unordered_map<std::string, std::string> functional_of = {
      {"aten::sum.IntList_out", "dim_IntList"},
      {"aten::mean.out", "dim"},
      {"aten::nansum.out", ""},
      {"aten::var.correction_out", "correction"},
      {"aten::std.correction_out", "correction"},
      {"aten::linalg_vector_norm.out", ""},
      {"aten::norm.out", "ScalarOpt_dim"},
  };
  const auto& schema = op.schema();
  const std::string name = schema.name() + "." + schema.overload_name();
  const auto it = functional_of.find(name);
  TORCH_INTERNAL_ASSERT(it != functional_of.end(), name,
                        " has no functional form here");
  const c10::OperatorHandle functional_op =
      c10::Dispatcher::singleton().findSchemaOrThrow(schema.name().c_str(),
                                                     it->second.c_str());
  at::Tensor out = stack->back().toTensor();
  stack->pop_back();
  functional_op.callBoxed(stack);  // below autograd: ember's kernel
  const at::Tensor result = stack->back().toTensor();
  stack->pop_back();
  at::native::resize_output(out, result.sizes());
  out.copy_(result);
  stack->emplace_back(out);
}

void alert_when_deterministic(const c10::OperatorHandle& op,
                              c10::DispatchKeySet keys,
                              torch::jit::Stack* stack) {
  if (flags::deterministic()) {
    static thread_local std::string name;
    name = op.schema().name();
    if (name.rfind("aten::", 0) == 0) name = name.substr(6);
    flags::alert_not_deterministic(name.c_str());
  }
  cpu_delegation_fallback(op, keys, stack);
}

}  // namespace ember::kernels::deterministic
