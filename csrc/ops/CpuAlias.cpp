#include "ops/CpuAlias.h"

#include <ATen/ops/empty_strided.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <cstring>
#include <string>

#include "core/EmberAllocator.h"
#include "ops/FallbackStats.h"

namespace ember {
namespace {

constexpr c10::DispatchKeySet kCpuKeys{c10::DispatchKey::CPU};
constexpr c10::DispatchKeySet kEmberKeys{c10::DispatchKey::PrivateUse1};

// The alias DataPtr's context is the ember StorageImpl, with a reference
// held for as long as the alias lives.
void release_ember_storage(void* storage) {
  c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(storage));
}

c10::Storage make_alias_storage(const c10::Storage& ember) {
  c10::StorageImpl* impl = ember.unsafeGetStorageImpl();
  c10::raw::intrusive_ptr::incref(impl);
  c10::DataPtr data(const_cast<void*>(impl->data()), impl,
                    &release_ember_storage, c10::Device(c10::DeviceType::CPU));
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), impl->nbytes(), std::move(data),
      c10::GetCPUAllocator(), /*resizable=*/true));
}

void copy_metadata(c10::TensorImpl* to, const at::Tensor& from) {
  to->set_sizes_and_strides(from.sizes(), from.strides(),
                            from.storage_offset());
  if (from.is_conj()) to->_set_conj(true);
  if (from.is_neg()) to->_set_neg(true);
  if (from.unsafeGetTensorImpl()->is_wrapped_number()) {
    to->set_wrapped_number(true);
  }
}

at::Tensor tensor_over(c10::Storage storage, const at::Tensor& like,
                       c10::DispatchKeySet keys) {
  // A zero tensor (torch._efficientzerotensor) has no bytes; its ZeroTensor
  // key is what makes ops treat it as zeros, so it must be set from birth.
  if (like._is_zerotensor()) keys = keys.add(c10::DispatchKey::ZeroTensor);
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), keys,
                                                   like.dtype());
  copy_metadata(impl.get(), like);
  return at::Tensor(std::move(impl));
}

}  // namespace

at::Tensor AliasScope::alias(const at::Tensor& tensor) {
  if (!tensor.defined()) return tensor;
  const c10::Storage& ember = tensor.storage();
  for (const Entry& entry : storages_) {
    if (entry.ember.is_alias_of(ember)) {
      return tensor_over(entry.alias, tensor, kCpuKeys);
    }
  }
  c10::Storage alias_storage = make_alias_storage(ember);
  storages_.push_back({ember, alias_storage});
  return tensor_over(std::move(alias_storage), tensor, kCpuKeys);
}

const c10::Storage* AliasScope::ember_storage_of(
    const c10::Storage& cpu_storage) const {
  for (const Entry& entry : storages_) {
    if (entry.alias.unsafeGetStorageImpl() ==
        cpu_storage.unsafeGetStorageImpl()) {
      return &entry.ember;
    }
  }
  return nullptr;
}

void AliasScope::sync_back(std::string_view op) {
  for (Entry& entry : storages_) {
    c10::StorageImpl* alias = entry.alias.unsafeGetStorageImpl();
    c10::StorageImpl* ember = entry.ember.unsafeGetStorageImpl();
    if (alias->data() == ember->data() && alias->nbytes() == ember->nbytes()) {
      continue;  // untouched: the usual case
    }
    const c10::DeviceIndex device = ember->device().index();
    c10::DataPtr& moved = alias->mutable_data_ptr();
    if (moved.get() != nullptr && !pool_device_of(moved).has_value()) {
      // Reallocated outside our pool (should not happen under capture).
      record_fallback_copy(std::string(op),
                           static_cast<int64_t>(alias->nbytes()));
      c10::DataPtr fresh = device_allocator()->allocate_on(
          device, alias->nbytes(), c10::DeviceType::PrivateUse1);
      std::memcpy(fresh.get(), moved.get(), alias->nbytes());
      ember->set_data_ptr_noswap(std::move(fresh));
    } else {
      moved.unsafe_set_device(
          c10::Device(c10::DeviceType::PrivateUse1, device));
      ember->set_data_ptr_noswap(std::move(moved));
    }
    ember->set_nbytes(alias->nbytes());
  }
}

at::Tensor cpu_alias(const at::Tensor& tensor) {
  if (!tensor.defined()) return tensor;
  return tensor_over(make_alias_storage(tensor.storage()), tensor, kCpuKeys);
}

at::Tensor ember_tensor_over(c10::Storage storage, const at::Tensor& like) {
  return tensor_over(std::move(storage), like, kEmberKeys);
}

bool adopt_storage(c10::StorageImpl* storage,
                   c10::DeviceIndex device_if_empty) {
  c10::DataPtr& data = storage->mutable_data_ptr();
  c10::DeviceIndex device = device_if_empty;
  if (data.get() != nullptr) {
    const std::optional<c10::DeviceIndex> pool = pool_device_of(data);
    if (!pool.has_value()) return false;
    device = *pool;
  }
  data.unsafe_set_device(c10::Device(c10::DeviceType::PrivateUse1, device));
  storage->set_allocator(device_allocator());
  return true;
}

at::Tensor adopt_cpu_result(const at::Tensor& result, const AliasScope& scope,
                            std::string_view op) {
  if (!result.defined() || result.is_privateuseone()) return result;
  const c10::Storage& storage = result.storage();
  if (const c10::Storage* ember = scope.ember_storage_of(storage)) {
    return ember_tensor_over(*ember, result);  // a view of an input
  }
  if (storage.device_type() == c10::DeviceType::PrivateUse1) {
    return ember_tensor_over(storage, result);  // adopted for an earlier return
  }
  if (adopt_storage(storage.unsafeGetStorageImpl(), scope.device())) {
    return ember_tensor_over(storage, result);
  }
  // The kernel handed back memory we did not allocate (a cached or
  // externally owned buffer): copy it, and say so.
  record_fallback_copy(std::string(op), static_cast<int64_t>(result.nbytes()));
  at::Tensor copy =
      at::empty_strided(result.sizes(), result.strides(),
                        result.options().device(c10::Device(
                            c10::DeviceType::PrivateUse1, scope.device())));
  cpu_alias(copy).copy_(result);
  return copy;
}

}  // namespace ember
