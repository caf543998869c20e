#include "ops/CpuAlias.h"

#include <ATen/ops/empty_strided.h>
#include <c10/core/TensorImpl.h>

#include <string>

#include "core/EmberAllocator.h"
#include "ops/FallbackStats.h"

namespace ember {
namespace {

constexpr c10::DispatchKeySet kCpuKeys{c10::DispatchKey::CPU};
constexpr c10::DispatchKeySet kEmberKeys{c10::DispatchKey::PrivateUse1};

// TensorImpl derives its device from the storage; an alias must report CPU
// while keeping the ember StorageImpl, so it overrides device_opt_.
class CpuAliasImpl final : public c10::TensorImpl {
 public:
  CpuAliasImpl(c10::Storage storage, caffe2::TypeMeta dtype)
      : c10::TensorImpl(c10::TensorImpl::VIEW, std::move(storage), kCpuKeys,
                        dtype) {
    device_opt_ = c10::Device(c10::DeviceType::CPU);
  }
};

void copy_metadata(c10::TensorImpl* to, const at::Tensor& from) {
  to->set_sizes_and_strides(from.sizes(), from.strides(),
                            from.storage_offset());
  if (from.is_conj()) to->_set_conj(true);
  if (from.is_neg()) to->_set_neg(true);
  if (from.unsafeGetTensorImpl()->is_wrapped_number()) {
    to->set_wrapped_number(true);
  }
}

}  // namespace

at::Tensor cpu_alias(const at::Tensor& tensor) {
  if (!tensor.defined()) return tensor;
  auto impl = c10::make_intrusive<CpuAliasImpl>(tensor.storage(), tensor.dtype());
  copy_metadata(impl.get(), tensor);
  return at::Tensor(std::move(impl));
}

at::Tensor ember_tensor_over(c10::Storage storage, const at::Tensor& like,
                             bool is_view) {
  c10::intrusive_ptr<c10::TensorImpl> impl =
      is_view ? c10::make_intrusive<c10::TensorImpl>(
                    c10::TensorImpl::VIEW, std::move(storage), kEmberKeys,
                    like.dtype())
              : c10::make_intrusive<c10::TensorImpl>(std::move(storage),
                                                     kEmberKeys, like.dtype());
  copy_metadata(impl.get(), like);
  return at::Tensor(std::move(impl));
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

at::Tensor adopt_cpu_result(const at::Tensor& result, c10::DeviceIndex device,
                            std::string_view op) {
  if (!result.defined() || result.is_privateuseone()) return result;
  const c10::Storage& storage = result.storage();
  if (storage.device_type() == c10::DeviceType::PrivateUse1) {
    return ember_tensor_over(storage, result, /*is_view=*/true);
  }
  if (adopt_storage(storage.unsafeGetStorageImpl(), device)) {
    return ember_tensor_over(storage, result, /*is_view=*/false);
  }
  // The kernel handed back memory we did not allocate (a cached or
  // externally owned buffer): copy it, and say so.
  record_fallback_copy(std::string(op),
                       static_cast<int64_t>(result.nbytes()));
  at::Tensor copy = at::empty_strided(
      result.sizes(), result.strides(),
      result.options().device(c10::Device(c10::DeviceType::PrivateUse1, device)));
  cpu_alias(copy).copy_(result);
  return copy;
}

}  // namespace ember
