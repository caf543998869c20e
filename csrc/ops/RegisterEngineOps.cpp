// Ops that talk to the execution engine rather than compute:
// Tensor.record_stream (implemented by the allocator adapter).
#include <torch/library.h>

#include "core/EmberAllocator.h"

namespace {

void record_stream(at::Tensor& self, c10::Stream stream) {
  ember::record_stream(self, stream);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("record_stream", TORCH_FN(record_stream));
}
