#include "core/EmberPinnedAllocator.h"

#include <c10/util/Exception.h>

#include <cstring>
#include <new>

#include "ember/runtime/pinned_memory.h"

namespace ember {
namespace {

namespace rt = ember::runtime;

void free_pinned(void* ptr) { rt::pinned_free(ptr); }

class EmberPinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = nullptr;
    try {
      ptr = rt::pinned_allocate(nbytes);
    } catch (const std::bad_alloc&) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, "ember: cannot allocate ",
                       nbytes, " bytes of pinned host memory");
    }
    // CPU memory: pinned tensors are CPU tensors.
    return {ptr, ptr, &free_pinned, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }
  void copy_data(void* dest, const void* src, size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

}  // namespace

c10::Allocator* pinned_memory_allocator() {
  static EmberPinnedAllocator allocator;
  return &allocator;
}

bool is_pinned_ptr(const void* ptr) { return rt::is_pinned(ptr); }

}  // namespace ember
