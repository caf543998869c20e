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
#include "ops/UnboxedDelegation.h"
#include "ops/kernels/DeterministicCommon.h"
#include "ops/kernels/DeterministicOps.h"
#include "ops/kernels/DeterministicReduce.h"
#include "ops/kernels/SerialScope.h"

namespace ember::kernels::deterministic {

namespace ops = at::_ops;
using unboxed::functional;
using namespace detail;  // NOLINT: the shared aliases of this kernel family

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

}  // namespace ember::kernels::deterministic
