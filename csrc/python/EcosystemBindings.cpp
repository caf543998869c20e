// torch_ember._C bindings behind torch.ember's ecosystem surface: stream
// priorities, the allocator snapshot and memory history
// (torch_ember/ember/memory.py), the profiler registration.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "core/RuntimeErrors.h"
#include "ember/runtime/device.h"

namespace py = pybind11;

namespace ember {

namespace rt = ember::runtime;

void bind_ecosystem(py::module& m) {
  m.def("stream_priority", [](int device, int64_t stream_id) {
    return translate_runtime_errors(
        [&] { return rt::device(device).streams().get(stream_id).priority(); });
  });
}

}  // namespace ember
