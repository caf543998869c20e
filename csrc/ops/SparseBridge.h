// Sparse ember tensors: COO (SparseTensorImpl, dispatch key
// SparsePrivateUse1) and the compressed layouts CSR/CSC/BSR/BSC
// (SparseCsrTensorImpl, SparseCsrPrivateUse1), whose component tensors
// (indices and values; compressed and plain indices and values) are dense
// ember tensors. An op on them runs CPU's sparse kernel on a CPU sparse
// tensor assembled from CPU aliases of the components, so no element is
// copied; a sparse CPU result becomes an ember sparse tensor over its
// components, adopted as ember memory like any dense result.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <functional>

namespace ember {

// COO or one of the compressed layouts.
bool is_sparse_layout(const at::Tensor& t);

using ComponentMap = std::function<at::Tensor(const at::Tensor&)>;

// The CPU sparse tensor over `alias`(component) for each component of the
// ember sparse tensor `ember`.
at::Tensor sparse_to_cpu(const at::Tensor& ember, const ComponentMap& alias);

// The ember sparse tensor over `adopt`(component) for each component of the
// CPU sparse tensor `cpu`.
at::Tensor sparse_from_cpu(const at::Tensor& cpu, const ComponentMap& adopt);

// After an in-place kernel on `cpu` (made by sparse_to_cpu from `ember`):
// `ember` takes its shape, components and coalesced flag.
void sparse_write_back(const at::Tensor& ember, const at::Tensor& cpu,
                       const ComponentMap& adopt);

// A COO ember tensor from ember components.
at::Tensor make_sparse_coo(int64_t sparse_dim, int64_t dense_dim,
                           c10::IntArrayRef size, const at::Tensor& indices,
                           const at::Tensor& values, bool coalesced);

// The SparsePrivateUse1 kernel of
// aten::_sparse_coo_tensor_with_dims_and_tensors.
at::Tensor sparse_coo_with_dims_and_tensors(
    int64_t sparse_dim, int64_t dense_dim, c10::SymIntArrayRef size,
    const at::Tensor& indices, const at::Tensor& values,
    std::optional<at::ScalarType> dtype, std::optional<c10::Layout> layout,
    std::optional<c10::Device> device, std::optional<bool> pin_memory,
    std::optional<bool> is_coalesced);

// aten::copy_ on sparse ember tensors (boxed). Between a sparse tensor on
// ember and one on another device (CPU), as CUDA copies: the source moves
// to the destination's device first, then the same-device copy runs (its
// checks and errors are the destination device's). Anything else: CPU's
// kernel through the delegation.
void sparse_copy_(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                  torch::jit::Stack* stack);

}  // namespace ember
