// Turns the runtime's plain C++ exceptions into the c10 errors PyTorch maps
// to the same Python types CUDA raises (OutOfMemoryError, RuntimeError,
// ValueError).
#pragma once

#include <c10/util/Exception.h>

#include "ember/runtime/caching_allocator.h"
#include "ember/runtime/device.h"
#include "ember/runtime/graph.h"

namespace ember {

template <class Fn>
decltype(auto) translate_runtime_errors(Fn&& fn) {
  try {
    return fn();
  } catch (const runtime::OutOfMemory& e) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
  } catch (const runtime::InvalidDevice& e) {
    TORCH_CHECK(false, e.what());
  } catch (const runtime::InvalidConfiguration& e) {
    TORCH_CHECK(false, e.what());
  } catch (const runtime::AsyncError& e) {
    TORCH_CHECK(false, e.what());
  } catch (const runtime::ForkedWithWorkInFlight& e) {
    TORCH_CHECK(false, e.what());
  } catch (const runtime::CaptureError& e) {
    TORCH_CHECK(false, e.what());
  }
}

}  // namespace ember
