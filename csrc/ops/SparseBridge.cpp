#include "ops/SparseBridge.h"

#include <ATen/SparseCsrTensorUtils.h>
#include <ATen/SparseTensorImpl.h>
#include <ATen/native/SparseTensorUtils.h>
#include <ATen/ops/_sparse_compressed_tensor_unsafe.h>
#include <ATen/ops/_sparse_coo_tensor_unsafe.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "ops/CpuDelegation.h"

namespace ember {
namespace {

bool is_compressed(c10::Layout layout) {
  return layout == at::kSparseCsr || layout == at::kSparseCsc ||
         layout == at::kSparseBsr || layout == at::kSparseBsc;
}

struct Compressed {
  at::Tensor compressed, plain, values;
};

// Read from the impl: the accessor ops (crow_indices, ...) dispatch back
// to the delegation that asks for them.
Compressed components_of(const at::Tensor& t) {
  const at::SparseCsrTensorImpl* impl = at::sparse_csr::get_sparse_csr_impl(t);
  return {impl->compressed_indices(), impl->plain_indices(), impl->values()};
}

at::Tensor compressed_over(const Compressed& c, const at::Tensor& like,
                           c10::Device device) {
  return at::_sparse_compressed_tensor_unsafe(
      c.compressed, c.plain, c.values, like.sizes(),
      c.values.options().layout(like.layout()).device(device));
}

}  // namespace

bool is_sparse_layout(const at::Tensor& t) {
  return t.layout() == at::kSparse || is_compressed(t.layout());
}

at::Tensor make_sparse_coo(int64_t sparse_dim, int64_t dense_dim,
                           c10::IntArrayRef size, const at::Tensor& indices,
                           const at::Tensor& values, bool coalesced) {
  // The new tensor's placeholder components are made on the current device:
  // make it the components' device.
  const c10::DeviceGuard guard(values.device());
  at::Tensor t = at::detail::make_tensor<at::SparseTensorImpl>(
      c10::DispatchKeySet(c10::DispatchKey::SparsePrivateUse1), values.dtype());
  at::SparseTensorImpl* impl = at::sparse::get_sparse_impl(t);
  impl->resize_(sparse_dim, dense_dim, size);
  impl->set_indices_and_values_unsafe(indices, values);
  impl->set_coalesced(coalesced);
  return t;
}

at::Tensor sparse_to_cpu(const at::Tensor& ember, const ComponentMap& alias) {
  if (ember.layout() == at::kSparse) {
    const at::SparseTensorImpl* impl = at::sparse::get_sparse_impl(ember);
    const at::Tensor values = alias(impl->values());
    return at::_sparse_coo_tensor_unsafe(
        alias(impl->indices()), values, ember.sizes(),
        values.options().layout(at::kSparse), impl->coalesced());
  }
  const Compressed c = components_of(ember);
  return compressed_over({alias(c.compressed), alias(c.plain), alias(c.values)},
                         ember, c10::Device(c10::DeviceType::CPU));
}

at::Tensor sparse_from_cpu(const at::Tensor& cpu, const ComponentMap& adopt) {
  if (cpu.layout() == at::kSparse) {
    const at::SparseTensorImpl* impl = at::sparse::get_sparse_impl(cpu);
    return make_sparse_coo(impl->sparse_dim(), impl->dense_dim(), cpu.sizes(),
                           adopt(impl->indices()), adopt(impl->values()),
                           impl->coalesced());
  }
  const Compressed c = components_of(cpu);
  Compressed on_ember{adopt(c.compressed), adopt(c.plain), adopt(c.values)};
  return compressed_over(on_ember, cpu, on_ember.values.device());
}

void sparse_write_back(const at::Tensor& ember, const at::Tensor& cpu,
                       const ComponentMap& adopt) {
  if (cpu.layout() == at::kSparse) {
    const at::SparseTensorImpl* from = at::sparse::get_sparse_impl(cpu);
    at::SparseTensorImpl* to = at::sparse::get_sparse_impl(ember);
    const c10::DeviceGuard guard(ember.device());
    to->raw_resize_(from->sparse_dim(), from->dense_dim(), cpu.sizes());
    to->set_indices_and_values_unsafe(adopt(from->indices()),
                                      adopt(from->values()));
    to->set_coalesced(from->coalesced());
    return;
  }
  const Compressed c = components_of(cpu);
  at::sparse_csr::get_sparse_csr_impl(ember)->set_member_tensors(
      adopt(c.compressed), adopt(c.plain), adopt(c.values), cpu.sizes());
}

at::Tensor sparse_coo_with_dims_and_tensors(
    int64_t sparse_dim, int64_t dense_dim, c10::SymIntArrayRef size,
    const at::Tensor& indices, const at::Tensor& values,
    std::optional<at::ScalarType> /*dtype*/,
    std::optional<c10::Layout> /*layout*/, std::optional<c10::Device> device,
    std::optional<bool> /*pin_memory*/, std::optional<bool> is_coalesced) {
  TORCH_CHECK(!device.has_value() || device->type() == values.device().type(),
              "sparse tensor components are on ", values.device(),
              " but the tensor is asked for on ", *device);
  return make_sparse_coo(sparse_dim, dense_dim, C10_AS_INTARRAYREF_SLOW(size),
                         indices, values, is_coalesced.value_or(false));
}

void sparse_copy_(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                  torch::jit::Stack* stack) {
  const size_t n = stack->size();
  const at::Tensor self = (*stack)[n - 3].toTensor();
  const at::Tensor src = (*stack)[n - 2].toTensor();
  const bool non_blocking = (*stack)[n - 1].toBool();
  if (self.device() == src.device() || !is_sparse_layout(self) ||
      !is_sparse_layout(src)) {
    cpu_delegation_fallback(op, keys, stack);
    return;
  }
  self.copy_(src.to(self.device(), non_blocking), non_blocking);
  torch::jit::drop(*stack, 3);
  stack->emplace_back(self);
}

}  // namespace ember
