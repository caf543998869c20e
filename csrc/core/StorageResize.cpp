#include "core/StorageResize.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>

#include "core/EmberAllocator.h"
#include "core/RuntimeErrors.h"
#include "ember/runtime/device.h"

namespace ember {

void resize_storage_bytes(c10::StorageImpl* storage, size_t new_bytes) {
  TORCH_CHECK(storage->resizable(),
              "Trying to resize storage that is not resizable");
  // Allocate on the storage's own device, whatever device is current.
  const c10::Device device = storage->device();
  if (device.type() == c10::DeviceType::PrivateUse1 && storage->nbytes() > 0) {
    // The old bytes are copied here and then freed: work launched on the
    // device may still read or write them through its own pointers.
    translate_runtime_errors(
        [&] { runtime::device(device.index()).synchronize(); });
  }
  c10::DataPtr fresh =
      device.type() == c10::DeviceType::PrivateUse1
          ? device_allocator()->allocate_on(device.index(), new_bytes,
                                            c10::DeviceType::PrivateUse1)
          : storage->allocator()->allocate(new_bytes);
  const size_t keep = std::min(new_bytes, storage->nbytes());
  if (keep > 0) std::memcpy(fresh.get(), storage->data(), keep);
  storage->set_data_ptr_noswap(std::move(fresh));
  storage->set_nbytes(new_bytes);
}

}  // namespace ember
