// The pinned host allocator ember gives ATen (PrivateUse1 hooks'
// getPinnedMemoryAllocator): page-locked CPU memory from the runtime
// (runtime/pinned_memory.h) for pin_memory() and pin_memory=True tensors.
#pragma once

#include <c10/core/Allocator.h>

namespace ember {

c10::Allocator* pinned_memory_allocator();
bool is_pinned_ptr(const void* ptr);

}  // namespace ember
