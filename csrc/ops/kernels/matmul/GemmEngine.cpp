#include "ops/kernels/matmul/GemmEngine.h"

#include <ATen/Parallel.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/native/CPUBlas.h>
#include <ATen/ops/add.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/baddbmm.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mul.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <sstream>
#include <vector>

#include "flags/BackendFlags.h"
#include "observe/ExecutionPath.h"
#include "ops/kernels/AlignedFloats.h"
#include "ops/kernels/OneDnnSupport.h"
#include "ops/kernels/SerialScope.h"
#include "ops/kernels/matmul/SkinnyGemm.h"
#include "ops/kernels/tuning/Autotune.h"

// Exported by libtorch_cpu (TORCH_API), but its header is not installed:
// result = beta * result + alpha * (mat1 @ mat2) through oneDNN.
namespace at::native {
TORCH_API void mkldnn_matmul(const at::Tensor& mat1, const at::Tensor& mat2,
                             const at::Tensor& result, float beta, float alpha);
}  // namespace at::native

namespace ember::matmul {
namespace {

// Inside a tile the libraries must see one thread: oneDNN sizes its K-split
// from omp_get_max_threads() even where the region is nested and runs
// serially, which would tie the summation order to the thread count.
using OneOmpThread = kernels::SerialScope;

using flags::Fp32Precision;

// kPanels: ember's panel kernel on a pack made for the call, where the CPU
// has no oneDNN matmul (AVX2-only CPUs). Its sums are the packed route's,
// so a weight's first, unpacked call gives the bits of its packed calls.
enum class Library { kAten, kOneDnn, kPanels };

const char* library_name(Library library) {
  // ATen's CPU path for fp32/fp64 is MKL's GEMM in this build.
  switch (library) {
    case Library::kAten:
      return "mkl";
    case Library::kOneDnn:
      return "onednn";
    case Library::kPanels:
      break;
  }
  return "panels";
}

thread_local std::string t_last_route;

bool is_reduced(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
}

// oneDNN takes float, bf16 and fp16 operands; everything else stays on ATen.
bool onednn_supports(const at::Tensor& a) {
  return a.scalar_type() == at::kFloat || is_reduced(a);
}

Fp32Precision precision_for(const at::Tensor& a);

// The libraries that can run this call under the current precision.
std::vector<Library> candidates_for(const at::Tensor& a, Fp32Precision p) {
  // An empty inner dimension: oneDNN leaves the output unwritten, where the
  // product is zero (and addmm's result beta * self).
  if (!onednn_supports(a) || a.size(-1) == 0) return {Library::kAten};
  // oneDNN's single-row matmul with a summed bias (addmm, M == 1, K >= 2048)
  // writes hundreds of bytes past a scratch buffer it allocates (found with
  // EMBER_DEBUG_HEAP=1): single-row products stay on ATen's path, unless
  // only oneDNN offers the precision asked for (it then takes no bias sum).
  const bool single_row = a.size(-2) == 1;
  if (single_row &&
      (a.scalar_type() != at::kFloat || p == Fp32Precision::kIeee)) {
    return {Library::kAten};
  }
  if (a.scalar_type() == at::kFloat && p != Fp32Precision::kIeee) {
    // bf16 operands with an fp32 result: only oneDNN offers that product
    // (ATen's bf16 GEMM and brgemm entry points, not mkldnn_matmul).
    return {Library::kOneDnn};
  }
  if (!kernels::onednn_bf16_supported()) {
    const bool panels =
        a.scalar_type() == at::kFloat && a.dim() == 2 && skinny_f32_supported();
    if (!panels) return {Library::kAten};
    return {Library::kAten, Library::kPanels};
  }
  return {Library::kAten, Library::kOneDnn};
}

// --- one GEMM, no tiling ---------------------------------------------------

void aten_gemm(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
               const at::Tensor& self, const at::Scalar& beta,
               const at::Scalar& alpha) {
  // Below autograd: the operands may require grad (their out= forms would
  // refuse them), and the engine runs inside the op's own kernel.
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  const bool batched = a.dim() == 3;
  if (self.defined()) {
    batched
        ? at::baddbmm_out(const_cast<at::Tensor&>(out), self, a, b, beta, alpha)
        : at::addmm_out(const_cast<at::Tensor&>(out), self, a, b, beta, alpha);
  } else {
    batched ? at::bmm_out(const_cast<at::Tensor&>(out), a, b)
            : at::mm_out(const_cast<at::Tensor&>(out), a, b);
  }
}

// Each output tile is computed by one serial GEMM over the whole K, so every
// element's sum has the same order whatever the thread count. Tile sizes are
// constants, never derived from the number of threads.
constexpr int64_t kTileRows = 256;
constexpr int64_t kTileCols = 256;

// bf16 operands, fp32 accumulation and result: ATen's brgemm entry point,
// which runs oneDNN's bf16 x bf16 -> f32 GEMM (row-major, C (+)= A @ B).
void bf16_products(const at::Tensor& out,
                   const std::vector<std::pair<at::Tensor, at::Tensor>>& terms,
                   bool accumulate) {
  // brgemm is a serial micro-kernel entry: parallelise over fixed output
  // tiles (which also makes the result independent of the thread count).
  const bool batched = out.dim() == 3;
  const int64_t batches = batched ? out.size(0) : 1;
  const int64_t rows = out.size(-2);
  const int64_t cols = out.size(-1);
  const int64_t row_tiles = (rows + kTileRows - 1) / kTileRows;
  const int64_t col_tiles = (cols + kTileCols - 1) / kTileCols;
  const int64_t tiles = batches * row_tiles * col_tiles;
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t batch = tile / (row_tiles * col_tiles);
      const int64_t r = (tile / col_tiles) % row_tiles * kTileRows;
      const int64_t c = tile % col_tiles * kTileCols;
      const at::Tensor o = batched ? out[batch] : out;
      bool add = accumulate;
      for (const auto& [lhs_full, rhs_full] : terms) {
        const at::Tensor lhs = batched ? lhs_full[batch] : lhs_full;
        const at::Tensor rhs = batched ? rhs_full[batch] : rhs_full;
        at::native::cpublas::brgemm(
            std::min(kTileRows, rows - r), std::min(kTileCols, cols - c),
            lhs.size(1), lhs.stride(0), rhs.stride(0), o.stride(0), add,
            lhs.const_data_ptr<at::BFloat16>() + r * lhs.stride(0),
            rhs.const_data_ptr<at::BFloat16>() + c,
            o.mutable_data_ptr<float>() + r * o.stride(0) + c,
            /*is_vnni=*/false);
        add = true;
      }
    }
  });
}

void onednn_gemm(const at::Tensor& out, const at::Tensor& a,
                 const at::Tensor& b, const at::Tensor& self,
                 const at::Scalar& beta, const at::Scalar& alpha,
                 Fp32Precision precision, bool exact_products) {
  const bool has_self = self.defined() && beta.toDouble() != 0.0;
  if (a.scalar_type() != at::kFloat || precision == Fp32Precision::kIeee) {
    // out = beta * out + alpha * (a @ b), with out seeded from self.
    at::Tensor target = out.is_contiguous() ? out : at::empty_like(out);
    if (has_self) target.copy_(self.expand_as(target));
    at::native::mkldnn_matmul(
        a, b, target, has_self ? static_cast<float>(beta.toDouble()) : 0.0f,
        static_cast<float>(alpha.toDouble()));
    if (!target.is_same(out)) out.copy_(target);
    return;
  }
  auto bf16 = [](const at::Tensor& t) {
    return t.to(at::kBFloat16).contiguous();
  };
  at::Tensor product;
  bool accumulated = false;
  if (precision == Fp32Precision::kBf16) {
    // ATen's bf16 GEMM (oneDNN, fp32 accumulation, bf16 result): measured
    // 4x faster here than the bf16 -> fp32 entry point below.
    product =
        (a.dim() == 3 ? at::bmm(bf16(a), bf16(b)) : at::mm(bf16(a), bf16(b)))
            .to(at::kFloat);
  } else {
    // bf16x3: x = hi + lo with hi = bf16(x), lo = bf16(x - hi); the dropped
    // lo*lo term is ~2^-16 of each product. Small terms first, for accuracy.
    // Needs an fp32 result for each term, hence the bf16 -> fp32 kernel.
    const at::Tensor a_hi = bf16(a);
    const at::Tensor b_hi = bf16(b);
    const at::Tensor a_lo = bf16(a.sub(a_hi.to(at::kFloat)));
    const at::Tensor b_lo = bf16(b.sub(b_hi.to(at::kFloat)));
    const bool direct = out.is_contiguous() && alpha.toDouble() == 1.0;
    product = direct ? out : at::empty(out.sizes(), out.options());
    if (direct && has_self) {
      product.copy_(self.expand_as(product));
      if (beta.toDouble() != 1.0) product.mul_(beta);
    }
    if (exact_products) {
      // The same three products on the fp32 GEMM, where each bf16 x bf16
      // product is exact: used under determinism, because the bf16 -> fp32
      // kernel's results were measured to depend on the thread count.
      bool add = direct && has_self;
      for (const auto& [lhs, rhs] :
           {std::pair{a_lo, b_hi}, std::pair{a_hi, b_lo},
            std::pair{a_hi, b_hi}}) {
        const at::Tensor l = lhs.to(at::kFloat), r = rhs.to(at::kFloat);
        add ? at::addmm_out(product, product, l, r) : at::mm_out(product, l, r);
        add = true;
      }
    } else {
      bf16_products(product, {{a_lo, b_hi}, {a_hi, b_lo}, {a_hi, b_hi}},
                    /*accumulate=*/direct && has_self);
    }
    accumulated = direct;
  }
  if (accumulated) return;
  if (has_self) {
    // out = beta * self + alpha * product
    at::add_out(const_cast<at::Tensor&>(out), self.mul(beta), product, alpha);
  } else if (alpha.toDouble() == 1.0) {
    out.copy_(product);
  } else {
    at::mul_out(const_cast<at::Tensor&>(out), product, alpha);
  }
}

// out = beta * self + alpha * (a @ b) by the panel kernel (2-D fp32), B
// packed for this call. A [N] bias with beta = alpha = 1 is the kernel's
// own (added after the sum, as the packed addmm route adds it).
void panels_gemm(const at::Tensor& out, const at::Tensor& a,
                 const at::Tensor& b, const at::Tensor& self,
                 const at::Scalar& beta, const at::Scalar& alpha) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  const bool has_self = self.defined() && beta.toDouble() != 0.0;
  const bool unit = beta.toDouble() == 1.0 && alpha.toDouble() == 1.0;
  const bool kernel_bias = has_self && unit && self.numel() == n &&
                           self.dim() >= 1 && self.dim() <= 2 &&
                           self.stride(-1) == 1 &&
                           self.scalar_type() == at::kFloat;
  const bool direct = (!has_self || kernel_bias) && alpha.toDouble() == 1.0 &&
                      out.stride(1) == 1 && (m == 1 || out.stride(0) >= n);
  kernels::AlignedFloats packed;
  float* panels = packed.resize(
      static_cast<int64_t>(PanelPackedF32::bytes(k, n) / sizeof(float)));
  pack_panels_f32(b.const_data_ptr<float>(), k, n, b.stride(0), b.stride(1),
                  panels);
  const at::Tensor lhs = a.stride(1) == 1 ? a : a.contiguous();
  const at::Tensor product = direct ? out : at::empty({m, n}, out.options());
  skinny_gemm_f32(lhs.const_data_ptr<float>(), lhs.stride(0), m,
                  PanelPackedF32{panels, k, n},
                  kernel_bias ? self.const_data_ptr<float>() : nullptr,
                  product.mutable_data_ptr<float>(), product.stride(0));
  if (direct) return;
  if (has_self) {
    at::add_out(const_cast<at::Tensor&>(out), self.mul(beta), product, alpha);
  } else {
    at::mul_out(const_cast<at::Tensor&>(out), product, alpha);
  }
}

void gemm_once(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
               const at::Tensor& self, const at::Scalar& beta,
               const at::Scalar& alpha, Library library,
               Fp32Precision precision, bool deterministic) {
  if (library == Library::kAten) {
    aten_gemm(out, a, b, self, beta, alpha);
  } else if (library == Library::kPanels) {
    panels_gemm(out, a, b, self, beta, alpha);
  } else {
    onednn_gemm(out, a, b, self, beta, alpha, precision, deterministic);
  }
}

// --- determinism: a fixed tiling of the output -----------------------------

void gemm_tiled(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                const at::Tensor& self, const at::Scalar& beta,
                const at::Scalar& alpha, Library library,
                Fp32Precision precision) {
  const bool batched = a.dim() == 3;
  const int64_t batches = batched ? out.size(0) : 1;
  const int64_t rows = out.size(-2);
  const int64_t cols = out.size(-1);
  const int64_t row_tiles =
      std::max<int64_t>(1, (rows + kTileRows - 1) / kTileRows);
  const int64_t col_tiles =
      std::max<int64_t>(1, (cols + kTileCols - 1) / kTileCols);
  const int64_t tiles = batches * row_tiles * col_tiles;
  const at::Tensor self_full = self.defined() ? self.expand_as(out) : self;
  // At least two tasks, so that with more than one thread the tiles always
  // run inside a parallel region, where MKL and oneDNN run serially (one
  // task alone would run outside it and could split K across threads).
  at::parallel_for(
      0, std::max<int64_t>(tiles, 2), 1, [&](int64_t begin, int64_t end) {
        for (int64_t tile = begin; tile < std::min(end, tiles); ++tile) {
          const int64_t batch = tile / (row_tiles * col_tiles);
          const int64_t r = (tile / col_tiles) % row_tiles * kTileRows;
          const int64_t c = tile % col_tiles * kTileCols;
          const int64_t nr = std::min(kTileRows, rows - r);
          const int64_t nc = std::min(kTileCols, cols - c);
          at::Tensor o = batched ? out[batch] : out;
          at::Tensor lhs = batched ? a[batch] : a;
          at::Tensor rhs = batched ? b[batch] : b;
          at::Tensor s = self_full.defined()
                             ? (batched ? self_full[batch] : self_full)
                             : self_full;
          o = o.narrow(0, r, nr).narrow(1, c, nc);
          lhs = lhs.narrow(0, r, nr);
          rhs = rhs.narrow(1, c, nc);
          if (s.defined()) s = s.narrow(0, r, nr).narrow(1, c, nc);
          // The tile always goes through the 2-D entry point.
          const OneOmpThread serial;
          gemm_once(o, lhs, rhs, s, beta, alpha, library, precision, true);
        }
      });
}

void run(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
         const at::Tensor& self, const at::Scalar& beta,
         const at::Scalar& alpha, Library library, Fp32Precision precision,
         bool deterministic) {
  // The panel kernel's sums do not depend on the thread count: no tiling.
  if (deterministic && library != Library::kPanels) {
    gemm_tiled(out, a, b, self, beta, alpha, library, precision);
  } else {
    gemm_once(out, a, b, self, beta, alpha, library, precision, false);
  }
}

std::string signature(const at::Tensor& a, const at::Tensor& b,
                      const at::Tensor& self, const at::Scalar& beta,
                      Fp32Precision precision, bool deterministic) {
  std::ostringstream s;
  s << c10::toString(a.scalar_type()) << " a" << a.sizes() << a.strides()
    << " b" << b.sizes() << b.strides();
  if (self.defined() && beta.toDouble() != 0.0) {
    s << " self" << self.sizes() << self.strides();
  }
  s << " " << flags::to_string(precision) << (deterministic ? " tiled" : "");
  return s.str();
}

Fp32Precision precision_for(const at::Tensor& a) {
  if (a.scalar_type() != at::kFloat) return Fp32Precision::kIeee;
  return flags::matmul_fp32_precision();
}

}  // namespace

bool engine_applies(const at::Tensor& a) {
  if (flags::deterministic()) return true;
  if (!onednn_supports(a)) return false;
  if (flags::benchmark()) return true;
  if (a.scalar_type() != at::kFloat) return false;
  // Outside CPU parity, fp32 GEMMs default to oneDNN (2x MKL's fp32 GEMM on
  // the AMD CPUs measured; see BENCHMARKS.md).
  if (!flags::cpu_parity()) return true;
  return flags::blas_library() == flags::BlasLibrary::kOneDnn ||
         precision_for(a) != Fp32Precision::kIeee;
}

void gemm(const char* op, const at::Tensor& out, const at::Tensor& a,
          const at::Tensor& b, const at::Tensor& self, const at::Scalar& beta,
          const at::Scalar& alpha) {
  const Fp32Precision precision = precision_for(a);
  const bool deterministic = flags::deterministic();
  const std::vector<Library> candidates = candidates_for(a, precision);
  Library library = candidates.front();
  if (candidates.size() > 1 && flags::benchmark()) {
    tuning::Key key(op);
    key.add(static_cast<int64_t>(a.scalar_type()))
        .add(a.sizes())
        .add(a.strides())
        .add(b.sizes())
        .add(b.strides())
        .add(static_cast<int64_t>(precision))
        .add(deterministic ? 1 : 0);
    if (self.defined() && beta.toDouble() != 0.0) {
      key.add(self.sizes()).add(self.strides());
    }
    std::optional<size_t> cached = tuning::lookup(key);
    if (!cached.has_value()) {
      // Candidates write into scratch: addmm's accumulation must see the
      // original `out` once, in the final run below.
      const at::Tensor scratch = at::empty_like(out);
      std::vector<tuning::Candidate> timed;
      for (Library candidate : candidates) {
        timed.push_back({library_name(candidate), [&, candidate] {
                           run(scratch, a, b, self, beta, alpha, candidate,
                               precision, deterministic);
                         }});
      }
      cached = tuning::tune(
          key, signature(a, b, self, beta, precision, deterministic), timed);
    }
    library = candidates[*cached];
  } else if (candidates.size() > 1) {
    const flags::BlasLibrary blas = flags::blas_library();
    const bool onednn =
        blas == flags::BlasLibrary::kOneDnn ||
        (blas == flags::BlasLibrary::kDefault && !flags::cpu_parity());
    // The library ember prefers here: oneDNN, or where the CPU has no
    // oneDNN matmul, the panel kernel.
    library = onednn ? candidates.back() : Library::kAten;
  }
  if (flags::verbose_level() > 0) {
    t_last_route = std::string(library_name(library)) + "/" +
                   flags::to_string(precision) +
                   (deterministic ? "/tiled" : "");
    observe::mark_path(observe::ExecutionPath::kNative, t_last_route.c_str());
  } else {
    observe::mark_path(observe::ExecutionPath::kNative);
  }
  run(out, a, b, self, beta, alpha, library, precision, deterministic);
}

const std::string& last_route() { return t_last_route; }

}  // namespace ember::matmul
