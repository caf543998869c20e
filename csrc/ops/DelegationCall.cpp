#include "ops/DelegationCall.h"

#include <c10/util/Exception.h>

#include "core/RuntimeErrors.h"
#include "ops/DeviceScope.h"
#include "ops/SparseBridge.h"
#include "ops/StorageWrites.h"

namespace ember {

void DelegationCall::throw_device_mismatch(c10::Device a, c10::Device b) const {
  // Same type and wording as CUDA's check, plus the op.
  TORCH_CHECK(false,
              "Expected all tensors to be on the same device, but found at "
              "least two devices, ",
              a, " and ", b, "! (when checking arguments for ", op_name_, ")");
}

void DelegationCall::note_device(c10::Device device) {
  if (device_ < 0) {
    translate_runtime_errors(
        [&] { runtime::check_device_index(device.index()); });
    device_ = device.index();
  } else if (device.index() != device_) {
    throw_device_mismatch(c10::Device(c10::DeviceType::PrivateUse1, device_),
                          device);
  }
}

at::Tensor DelegationCall::alias_for(const at::Tensor& tensor) {
  // One tensor passed twice (x.add_(x), torch.add(x, y, out=x)) must reach
  // the CPU kernel as one tensor, or its read-write checks cannot see it.
  for (const Swap& swap : swapped_) {
    if (swap.original().unsafeGetTensorImpl() == tensor.unsafeGetTensorImpl()) {
      return swap.alias;
    }
  }
  if (is_sparse_layout(tensor)) {
    cpu_keys_ = cpu_keys_.add(tensor.layout() == at::kSparse
                                  ? c10::DispatchKey::SparseCPU
                                  : c10::DispatchKey::SparseCsrCPU);
    return sparse_to_cpu(tensor, [this](const at::Tensor& component) {
      return scope_.alias(component);
    });
  }
  return scope_.alias(tensor);
}

at::Tensor DelegationCall::swap_in(const at::Tensor& tensor,
                                   const at::Tensor* borrowed,
                                   at::Tensor&& owned, bool written) {
  if (!tensor.defined()) return at::Tensor();
  const c10::Device device = tensor.device();
  if (device.type() == c10::DeviceType::PrivateUse1) {
    note_device(device);
    at::Tensor alias = alias_for(tensor);
    // A few CPU kernels compute extra results only for inputs that require
    // grad (sparse.mm's reduce keeps its argmax for backward): the alias
    // says what the tensor says.
    if (tensor.requires_grad() && !alias.requires_grad()) [[unlikely]] {
      alias.set_requires_grad(true);
    }
    if (written) note_storage_write(tensor);
    swapped_.push_back({alias, borrowed, std::move(owned), written});
    return alias;
  }
  // A CPU tensor beside ember tensors is accepted where CUDA accepts it:
  // 0-dim read-only scalars, and host index tensors for indexing ops.
  const bool allowed = device.type() == c10::DeviceType::CPU && !written &&
                       (tensor.dim() == 0 || accepts_cpu_tensors_);
  if (!allowed && !foreign_.has_value()) foreign_ = device;
  return borrowed != nullptr ? *borrowed : std::move(owned);
}

at::Tensor DelegationCall::to_cpu(const at::Tensor& tensor, bool written) {
  return swap_in(tensor, &tensor, at::Tensor(), written);
}

at::Tensor DelegationCall::to_cpu(at::Tensor&& tensor, bool written) {
  // swap_in reads `tensor` only before it moves `owned` (the same object).
  return swap_in(tensor, nullptr, std::move(tensor), written);
}

void DelegationCall::settle() {
  if (device_ < 0) device_ = current_device_index();
  scope_.set_device(device_);
  if (foreign_.has_value()) {
    throw_device_mismatch(c10::Device(c10::DeviceType::PrivateUse1, device_),
                          *foreign_);
  }
}

at::Tensor DelegationCall::from_cpu(const at::Tensor& result) {
  if (!result.defined()) return result;
  for (const Swap& swap : swapped_) {
    if (swap.alias.unsafeGetTensorImpl() == result.unsafeGetTensorImpl()) {
      return swap.original();  // in-place / out= ops return their argument
    }
  }
  if (is_sparse_layout(result)) {
    return sparse_from_cpu(result, [this](const at::Tensor& component) {
      return adopt_cpu_result(component, scope_, op_name_);
    });
  }
  return adopt_cpu_result(result, scope_, op_name_);
}

void DelegationCall::write_back() {
  scope_.sync_back(op_name_);
  for (const Swap& swap : swapped_) {
    if (!swap.written) continue;
    const at::Tensor& original_tensor = swap.original();
    if (is_sparse_layout(original_tensor)) {
      sparse_write_back(original_tensor, swap.alias,
                        [this](const at::Tensor& component) {
                          return adopt_cpu_result(component, scope_, op_name_);
                        });
      continue;
    }
    c10::TensorImpl* original = original_tensor.unsafeGetTensorImpl();
    const at::Tensor& alias = swap.alias;
    const c10::Storage* ember = scope_.ember_storage_of(alias.storage());
    if (ember == nullptr) {
      // The kernel pointed the argument at other memory (set_).
      c10::Storage storage = alias.storage();
      TORCH_CHECK(adopt_storage(storage.unsafeGetStorageImpl(), device_),
                  op_name_,
                  " replaced the storage of an ember argument with foreign "
                  "memory; this op is not supported on ember");
      original->set_storage_keep_dtype(std::move(storage));
    } else if (!ember->is_alias_of(original_tensor.storage())) {
      original->set_storage_keep_dtype(*ember);
    }
    if (alias.is_conj() != original_tensor.is_conj()) {
      original->_set_conj(alias.is_conj());
    }
    if (alias.is_neg() != original_tensor.is_neg()) {
      original->_set_neg(alias.is_neg());
    }
    if (alias.sizes() != original_tensor.sizes() ||
        alias.strides() != original_tensor.strides() ||
        alias.storage_offset() != original_tensor.storage_offset()) {
      original->set_sizes_and_strides(alias.sizes(), alias.strides(),
                                      alias.storage_offset());
    }
  }
}

}  // namespace ember
