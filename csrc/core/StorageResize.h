// Growing or shrinking the bytes of an ember storage in place (used by
// resize_, storage.resize_ and CPU kernels resizing an out= argument).
#pragma once

#include <c10/core/StorageImpl.h>

namespace ember {

// Reallocates `storage` from its own allocator to exactly `new_bytes`,
// keeping the first min(old, new) bytes. Throws if it is not resizable.
void resize_storage_bytes(c10::StorageImpl* storage, size_t new_bytes);

}  // namespace ember
