// cat, index_select and indexing by integer tensors on ember, launched on
// the stream (ops/LaunchedOps.h): the result's layout comes from CPU's own
// rules (cat's and index's structured meta functions; index_select's
// contiguous result of the input's shape with the selected dimension
// resized), and the worker runs CPU's out= kernel into it (a cat of contiguous
// inputs of the result's dtype: row copies split over the device's threads,
// cat_rows). Anything else (host tensors among the inputs, async execution off,
// a meta check that fails) takes the synchronous CPU delegation, which raises
// CPU's errors.
#include <ATen/Parallel.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat_meta_dispatch.h>
#include <ATen/ops/cat_ops.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index_meta_dispatch.h>
#include <ATen/ops/index_ops.h>
#include <ATen/ops/index_select_ops.h>
#include <c10/util/DimVector.h>
#include <c10/util/accumulate.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "ops/CpuAlias.h"
#include "ops/DelegationCall.h"
#include "ops/LaunchedOps.h"
#include "ops/UnboxedDelegation.h"
#include "ops/kernels/ParallelChunks.h"

namespace ember::kernels {
namespace {

constexpr c10::DispatchKeySet kCpu{c10::DispatchKey::CPU};

// cat of contiguous inputs into a contiguous result of their dtype, as
// copies of whole rows: each input contributes one block of bytes per index
// of the dimensions before `dim`. Rows are split between the launching
// thread count's threads by run_chunk_loop (no OpenMP team on a stream
// worker: ParallelChunks.h); a byte copy is the same whoever runs it.
// False, having done nothing, for any other call.
bool cat_rows(const std::vector<at::Tensor>& inputs, int64_t dim,
              const at::Tensor& out) {
  const at::ScalarType dtype = out.scalar_type();
  if (!unboxed::plain_contiguous(out, dtype) || out.numel() == 0) return false;
  const int64_t d = at::maybe_wrap_dim(dim, out.dim());
  const int64_t outer =
      c10::multiply_integers(out.sizes().begin(), out.sizes().begin() + d);
  const int64_t row_bytes = out.nbytes() / outer;
  struct Block {
    const char* src;
    int64_t offset;  // in a result row
    int64_t bytes;   // per row
  };
  std::vector<Block> blocks;
  int64_t offset = 0;
  for (const at::Tensor& t : inputs) {
    if (!unboxed::plain_contiguous(t, dtype)) return false;
    if (t.numel() == 0) continue;  // includes legacy 1-D empties
    const int64_t bytes = static_cast<int64_t>(t.nbytes()) / outer;
    blocks.push_back(
        {static_cast<const char*>(t.const_data_ptr()), offset, bytes});
    offset += bytes;
  }
  if (offset != row_bytes) return false;
  char* dst = static_cast<char*>(out.mutable_data_ptr());
  // Chunks of about 64 KiB of rows; below two chunks, one thread.
  constexpr int64_t kChunkBytes = 64 * 1024;
  const int64_t rows_per_chunk = std::max<int64_t>(1, kChunkBytes / row_bytes);
  const int64_t chunks = (outer + rows_per_chunk - 1) / rows_per_chunk;
  const int threads = static_cast<int>(
      std::min<int64_t>(chunks, std::max(1, at::get_num_threads())));
  kernels::run_chunk_loop(chunks, threads, [&](int64_t chunk) {
    const int64_t end = std::min(outer, (chunk + 1) * rows_per_chunk);
    for (int64_t row = chunk * rows_per_chunk; row < end; ++row) {
      for (const Block& b : blocks) {
        std::memcpy(dst + row * row_bytes + b.offset, b.src + row * b.bytes,
                    static_cast<size_t>(b.bytes));
      }
    }
  });
  return true;
}

at::Tensor cat(const at::ITensorListRef& tensors, int64_t dim) {
  using Op = at::_ops::cat;
  const auto sync = [&] {
    static const c10::OperatorHandle op =
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::cat", "");
    const std::vector<at::Tensor> list(tensors.begin(), tensors.end());
    return unboxed::boxed(op, list, dim).back().toTensor();
  };
  if (!launch_async()) return sync();
  at::Tensor out;
  {
    DelegationCall call(unboxed::op_name<Op>(), /*accepts_cpu_tensors=*/false);
    std::vector<at::Tensor> inputs;
    inputs.reserve(tensors.size());
    for (const at::Tensor& t : tensors) {
      if (!t.is_privateuseone()) return sync();
      inputs.push_back(call.to_cpu(t, false));
    }
    call.settle();
    at::Tensor meta;
    try {
      meta = at::meta::cat(c10::ArrayRef<at::Tensor>(inputs), dim);
    } catch (const std::exception&) {
      return sync();
    }
    out = unboxed::empty_like_meta(meta, call.device());
    if (!launch_on_device(
            call.device(), unboxed::op_name<Op>().c_str(),
            [inputs = std::move(inputs), dim,
             out_cpu = cpu_alias(out)]() mutable {
              if (cat_rows(inputs, dim, out_cpu)) return;
              run_split_free([&] {
                at::_ops::cat_out::redispatch(
                    kCpu, c10::ArrayRef<at::Tensor>(inputs), dim, out_cpu);
              });
            },
            out.numel())) {
      return out;
    }
  }
  count_launch(unboxed::op_name<Op>());
  return out;
}

at::Tensor index_select(const at::Tensor& self, int64_t dim,
                        const at::Tensor& index) {
  using Op = at::_ops::index_select;
  const auto sync = [&] {
    return unboxed::functional<Op, const at::Tensor&, int64_t,
                               const at::Tensor&>(self, dim, index);
  };
  if (!launch_async() || !index.is_privateuseone() || self.dim() == 0 ||
      index.dim() > 1 ||
      (index.scalar_type() != at::kLong && index.scalar_type() != at::kInt)) {
    return sync();
  }
  const int64_t d = at::maybe_wrap_dim(dim, self.dim());
  at::Tensor out;
  {
    DelegationCall call(unboxed::op_name<Op>(), /*accepts_cpu_tensors=*/false);
    at::Tensor self_cpu = call.to_cpu(self, false);
    at::Tensor index_cpu = call.to_cpu(index, false);
    call.settle();
    // CPU's result: contiguous, the input's shape with `dim` resized to the
    // number of indices. (Indices out of range are reported by the kernel,
    // asynchronously, as CUDA reports them.)
    c10::DimVector sizes(self.sizes().begin(), self.sizes().end());
    sizes[d] = index.numel();
    out = at::empty(sizes, self.options());
    if (!launch_on_device(
            call.device(), unboxed::op_name<Op>().c_str(),
            [self_cpu, d, index_cpu, out_cpu = cpu_alias(out)]() mutable {
              run_split_free([&] {
                at::_ops::index_select_out::redispatch(kCpu, self_cpu, d,
                                                       index_cpu, out_cpu);
              });
            },
            out.numel())) {
      return out;
    }
  }
  count_launch(unboxed::op_name<Op>());
  return out;
}

// x[..., idx] with integer index tensors (transformers' Falcon splits its
// fused QKV with one-element list indices, twice a layer and step). The
// result's shape follows from the indices' shapes alone; their values are
// read when the kernel runs (an index out of range is an asynchronous
// error, as CUDA's device-side assert). Boolean and byte indices select a
// data-dependent count, and host indices are read at the call: both stay
// synchronous.
at::Tensor index_tensor(const at::Tensor& self,
                        const c10::List<std::optional<at::Tensor>>& indices) {
  using Op = at::_ops::index_Tensor;
  const auto sync = [&] {
    static const c10::OperatorHandle op =
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::index", "Tensor");
    return unboxed::boxed(op, self, indices).back().toTensor();
  };
  if (!launch_async() || !self.is_privateuseone()) return sync();
  for (const std::optional<at::Tensor>& index : indices) {
    if (!index.has_value() || !index->defined()) continue;
    if (!index->is_privateuseone() || (index->scalar_type() != at::kLong &&
                                       index->scalar_type() != at::kInt)) {
      return sync();
    }
  }
  // Held here: the call references its arguments until it ends, and a
  // c10::List hands out its elements as temporaries.
  const std::vector<std::optional<at::Tensor>> held = indices.vec();
  at::Tensor out;
  {
    DelegationCall call(unboxed::op_name<Op>(), /*accepts_cpu_tensors=*/false);
    at::Tensor self_cpu = call.to_cpu(self, false);
    c10::List<std::optional<at::Tensor>> indices_cpu;
    indices_cpu.reserve(held.size());
    for (const std::optional<at::Tensor>& index : held) {
      indices_cpu.push_back(
          index.has_value() && index->defined()
              ? std::optional<at::Tensor>(call.to_cpu(*index, false))
              : std::nullopt);
    }
    call.settle();
    at::Tensor meta;
    try {
      meta = at::meta::index(self_cpu, indices_cpu);
    } catch (const std::exception&) {
      return sync();
    }
    out = unboxed::empty_like_meta(meta, call.device());
    if (!launch_on_device(
            call.device(), unboxed::op_name<Op>().c_str(),
            [self_cpu, indices_cpu = std::move(indices_cpu),
             out_cpu = cpu_alias(out)]() mutable {
              run_split_free([&] {
                at::_ops::index_Tensor_out::redispatch(kCpu, self_cpu,
                                                       indices_cpu, out_cpu);
              });
            },
            out.numel())) {
      return out;
    }
  }
  count_launch(unboxed::op_name<Op>());
  return out;
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("index.Tensor", TORCH_FN(index_tensor));
  m.impl("cat", TORCH_FN(cat));
  m.impl("index_select", TORCH_FN(index_select));
}

}  // namespace
}  // namespace ember::kernels
