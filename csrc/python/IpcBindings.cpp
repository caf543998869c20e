// torch_ember._C bindings of zero-copy IPC (core/EmberIpc.h) for
// torch_ember/ember/ipc.py, and the switch that makes a device's new
// segments anonymous private memory (tests, measurements).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>

#include "core/EmberIpc.h"
#include "core/RuntimeErrors.h"
#include "ember/runtime/device.h"

namespace py = pybind11;

namespace ember {

void bind_ipc(py::module& m) {
  namespace rt = ember::runtime;
  // (segment_fd, segment_size, offset, nbytes, device, counter_fd,
  // counter_offset) of the tensor's storage, or None when it must be copied.
  m.def("_ipc_share", [](const at::Tensor& tensor) -> py::object {
    const std::optional<SharedStorageHandle> h =
        share_storage(tensor.storage());
    if (!h) return py::none();
    return py::make_tuple(h->segment_fd, h->segment_size, h->offset, h->nbytes,
                          h->device, h->counter_fd, h->counter_offset);
  });
  m.def("_ipc_open",
        [](int segment_fd, size_t segment_size, size_t offset, size_t nbytes,
           int device, int counter_fd, size_t counter_offset) {
          return open_shared_storage({segment_fd, segment_size, offset, nbytes,
                                      device, counter_fd, counter_offset});
        });
  m.def("_ipc_collect", [] { return collect_shared_storages(); });
  m.def("_ipc_stats", [] {
    const IpcStats s = ipc_stats();
    py::dict d;
    d["shares_held"] = s.shares_held;
    d["shares_sent"] = s.shares_sent;
    d["mappings_open"] = s.mappings_open;
    d["mapped_bytes"] = s.mapped_bytes;
    d["mappings_opened"] = s.mappings_opened;
    return d;
  });
  m.def("_set_shared_segments", [](int device, bool shared) {
    translate_runtime_errors(
        [&] { rt::device(device).allocator().set_shared_segments(shared); });
  });
  m.def("_unshareable_segments", [](int device) {
    return translate_runtime_errors([&] {
      return rt::device(device).allocator().stats().num_unshareable_segments;
    });
  });
}

}  // namespace ember
