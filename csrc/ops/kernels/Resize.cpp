// resize_ and the set_ family: metadata changes on ember tensors whose
// storage may have to grow. The storage grows before any metadata changes,
// so a failed (out of memory) resize leaves the tensor as it was.
#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>

#include "core/EmberAllocator.h"
#include "core/StorageResize.h"
#include "ops/kernels/EmberKernels.h"

namespace ember::kernels {
namespace {

void ensure_storage_holds(const at::Tensor& self, size_t needed_bytes,
                          int64_t numel) {
  if (numel == 0) return;  // nothing to hold; offset may point past the end
  c10::StorageImpl* storage = self.storage().unsafeGetStorageImpl();
  if (needed_bytes > storage->nbytes()) {
    resize_storage_bytes(storage, needed_bytes);
  }
}

int64_t numel_of(c10::IntArrayRef size) { return c10::multiply_integers(size); }

void check_ember_storage(const c10::Storage& storage) {
  TORCH_CHECK(storage.device_type() == c10::DeviceType::PrivateUse1,
              "Attempted to set the storage of an ember tensor to a storage "
              "on ",
              storage.device(), "; expected an ember storage");
}

}  // namespace

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  for (int64_t dim : size) {
    TORCH_CHECK(dim >= 0, "Trying to create tensor with negative dimension ",
                dim, ": ", size);
  }
  const size_t needed = at::detail::computeStorageNbytesContiguous(
      size, self.dtype().itemsize(), self.storage_offset());
  ensure_storage_holds(self, needed, numel_of(size));
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  // Same sizes: a no-op, strides included (as on CPU).
  if (self.sizes() != size) impl->set_sizes_contiguous(size);
  if (memory_format.has_value()) {
    TORCH_CHECK(*memory_format != c10::MemoryFormat::Preserve,
                "Unsupported memory format ", *memory_format);
    impl->empty_tensor_restride(*memory_format);
  }
  return self;
}

at::Tensor& set_storage_offset_(at::Tensor& self, c10::Storage source,
                                int64_t storage_offset, c10::IntArrayRef size,
                                c10::IntArrayRef stride) {
  check_ember_storage(source);
  at::native::checkSetStorage(self, source, storage_offset, size, stride);
  const size_t itemsize = self.dtype().itemsize();
  const size_t needed = stride.empty()
                            ? at::detail::computeStorageNbytesContiguous(
                                  size, itemsize, storage_offset)
                            : at::detail::computeStorageNbytes(
                                  size, stride, itemsize, storage_offset);
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  if (!self.storage().is_alias_of(source)) {
    impl->set_storage_keep_dtype(std::move(source));
  }
  ensure_storage_holds(self, needed, numel_of(size));
  if (stride.empty()) {
    impl->set_sizes_contiguous(size);
    impl->set_storage_offset(storage_offset);
  } else {
    impl->set_sizes_and_strides(size, stride, storage_offset);
  }
  return self;
}

at::Tensor& set_storage_(at::Tensor& self, c10::Storage source) {
  const int64_t numel =
      static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage_offset_(self, std::move(source), 0, {numel}, {});
}

at::Tensor& set_tensor_(at::Tensor& self, const at::Tensor& source) {
  if (self.unsafeGetTensorImpl() == source.unsafeGetTensorImpl()) return self;
  return set_storage_offset_(self, source.storage(), source.storage_offset(),
                             source.sizes(), source.strides());
}

at::Tensor& set_empty_(at::Tensor& self) {
  c10::Storage empty(
      c10::Storage::use_byte_size_t(), 0,
      device_allocator()->allocate_on(self.device().index(), 0,
                                      c10::DeviceType::PrivateUse1),
      device_allocator(), /*resizable=*/true);
  return set_storage_offset_(self, std::move(empty), 0, {0}, {});
}

}  // namespace ember::kernels
