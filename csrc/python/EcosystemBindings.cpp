// torch_ember._C bindings behind torch.ember's ecosystem surface: stream
// priorities, the allocator snapshot and memory history
// (torch_ember/ember/memory.py), private memory pools (MemPool,
// use_mem_pool), raw allocations for interop (caching_allocator_alloc/delete).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/profiler/combined_traceback.h>
#include <torch/csrc/utils/pybind.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "core/EmberAllocator.h"
#include "core/ForkSafety.h"
#include "core/RuntimeErrors.h"
#include "ember/runtime/caching_allocator.h"
#include "ember/runtime/device.h"
#include "observe/MemoryEvents.h"
#include "ops/CpuAlias.h"
#include "ops/DeviceScope.h"

namespace py = pybind11;

// libtorch_python's symbolizer and Python frame gatherer, declared here:
// their header (torch/csrc/profiler/python/combined_traceback.h) needs
// nlohmann/json, which torch's wheel does not ship.
namespace torch {
TORCH_API std::vector<pybind11::object> py_symbolize(
    std::vector<CapturedTraceback*>& to_symbolize);
TORCH_PYTHON_API void installCapturedTracebackPython();
}  // namespace torch

namespace ember {

namespace rt = ember::runtime;

namespace {

using MempoolIdArg = std::pair<unsigned long long, unsigned long long>;

// The runtime's id of a MemPool id (0, n); ValueError for anything else
// (CUDA graph pools, (n, 0), do not exist on ember).
rt::PoolId runtime_pool(const MempoolIdArg& id) {
  TORCH_CHECK_VALUE(id.first == 0 && id.second != 0,
                    "ember: not a memory pool id: (", id.first, ", ", id.second,
                    "); MemPool ids are (0, n) with n >= 1");
  return id.second;
}

// Frames of each traceback as lists of {"filename", "line", "name"} dicts;
// an empty list where none was recorded.
std::vector<py::object> symbolize(
    const std::vector<std::shared_ptr<torch::CapturedTraceback>>& tracebacks) {
  std::vector<torch::CapturedTraceback*> present;
  for (const auto& t : tracebacks) {
    if (t) present.push_back(t.get());
  }
  std::vector<py::object> symbolized = torch::py_symbolize(present);
  std::vector<py::object> out;
  size_t next = 0;
  for (const auto& t : tracebacks) {
    out.push_back(t ? symbolized[next++] : py::list());
  }
  return out;
}

// torch.cuda.memory._snapshot()'s dict: {"segments": [...],
// "device_traces": [[...] per device]}.
py::dict memory_snapshot(bool include_traces) {
  py::list segments;
  py::list device_traces;
  const int count = rt::device_count();
  for (int device = 0; device < count; ++device) {
    const std::vector<rt::SegmentSnapshot> snapshot = translate_runtime_errors(
        [&] { return rt::device(device).allocator().snapshot(); });
    std::vector<std::shared_ptr<torch::CapturedTraceback>> contexts;
    for (const auto& segment : snapshot) {
      for (const auto& block : segment.blocks) {
        std::shared_ptr<torch::CapturedTraceback> context;
        if (block.allocated) {
          context = observe::allocation_context(device, block.address);
          // CPU kernels' blocks are recorded at their data, past a header.
          if (!context) {
            context = observe::allocation_context(
                device, block.address + rt::kAlignment);
          }
        }
        contexts.push_back(std::move(context));
      }
    }
    std::vector<py::object> frames = symbolize(contexts);
    size_t next = 0;
    for (const auto& segment : snapshot) {
      py::dict s;
      s["device"] = device;
      s["address"] = segment.address;
      s["total_size"] = segment.size;
      s["stream"] = 0;
      s["segment_type"] = segment.small ? "small" : "large";
      s["segment_pool_id"] = py::make_tuple(0, segment.pool);
      s["is_expandable"] = false;
      s["frames"] = py::list();
      py::list blocks;
      size_t allocated = 0;
      size_t requested = 0;
      for (const auto& block : segment.blocks) {
        py::dict b;
        b["address"] = block.address;
        b["size"] = block.size;
        b["requested_size"] = block.requested;
        b["state"] = block.allocated ? "active_allocated" : "inactive";
        b["frames"] = frames[next++];
        blocks.append(b);
        if (block.allocated) {
          allocated += block.size;
          requested += block.requested;
        }
      }
      s["allocated_size"] = allocated;
      s["active_size"] = allocated;
      s["requested_size"] = requested;
      s["blocks"] = blocks;
      segments.append(s);
    }
    py::list trace;
    if (include_traces) {
      const std::vector<observe::HistoryEntry> entries =
          observe::memory_history(device);
      std::vector<std::shared_ptr<torch::CapturedTraceback>> stacks;
      stacks.reserve(entries.size());
      for (const auto& e : entries) stacks.push_back(e.frames);
      std::vector<py::object> entry_frames = symbolize(stacks);
      for (size_t i = 0; i < entries.size(); ++i) {
        py::dict t;
        t["action"] = entries[i].action;
        t["addr"] = entries[i].address;
        t["size"] = entries[i].size;
        t["stream"] = 0;
        t["time_us"] = entries[i].time_us;
        t["frames"] = entry_frames[i];
        trace.append(t);
      }
    }
    device_traces.append(trace);
  }
  py::dict out;
  out["segments"] = segments;
  out["device_traces"] = device_traces;
  return out;
}

// caching_allocator_alloc/delete: the DataPtrs of raw allocations by pointer.
struct RawAllocations {
  ForkHeldMutex mutex;  // a leaf: allocations are made and freed outside it
  std::unordered_map<uintptr_t, c10::DataPtr> live;
};
RawAllocations& raw_allocations() {
  static auto* raw = new RawAllocations();
  return *raw;
}

}  // namespace

void bind_ecosystem(py::module& m) {
  m.def("stream_priority", [](int device, int64_t stream_id) {
    return translate_runtime_errors(
        [&] { return rt::device(device).streams().get(stream_id).priority(); });
  });
  // A CPU tensor over an ember tensor's bytes (zero-copy; keeps the ember
  // storage alive): what the "ember" c10d backend hands gloo.
  m.def("cpu_alias", [](const at::Tensor& tensor) {
    TORCH_CHECK(tensor.device().type() == c10::DeviceType::PrivateUse1,
                "cpu_alias expects an ember tensor, got one on ",
                tensor.device());
    // The host reads and writes through the alias: launched work on the
    // tensor's device must have finished.
    {
      py::gil_scoped_release no_gil;
      synchronize_for_host_read(tensor.device().index());
    }
    return cpu_alias(tensor);
  });
  m.def("memory_snapshot", &memory_snapshot, py::arg("include_traces") = true);
  m.def("record_memory_history",
        [](bool enabled, bool trace, bool stacks_on_alloc, bool stacks_on_free,
           bool cpp_frames, size_t max_entries, bool clear) {
          if (enabled) torch::installCapturedTracebackPython();
          observe::set_memory_history({enabled, trace, stacks_on_alloc,
                                       stacks_on_free, cpp_frames, max_entries},
                                      clear);
        });
  // Private pools (torch.ember.MemPool). Ids are c10's MempoolId_t as CUDA
  // gives user pools: (0, n), n counting from 1; the runtime keys a pool by n.
  m.def("_mempool_create", [](int device) {
    const rt::PoolId pool = new_pool_number();
    translate_runtime_errors(
        [&] { rt::device(device).allocator().create_pool(pool); });
    return py::make_tuple(0, pool);
  });
  m.def("_mempool_release", [](int device, const MempoolIdArg& id) {
    translate_runtime_errors(
        [&] { rt::device(device).allocator().release_pool(runtime_pool(id)); });
  });
  m.def("_mempool_use_count", [](int device, const MempoolIdArg& id) {
    return translate_runtime_errors([&] {
      return rt::device(device).allocator().pool_use_count(runtime_pool(id));
    });
  });
  m.def("_mempool_begin_allocate", [](int device, const MempoolIdArg& id) {
    translate_runtime_errors([&] {
      rt::device(device).allocator().begin_allocate_to_pool(runtime_pool(id));
    });
  });
  m.def("_mempool_end_allocate", [](int device, const MempoolIdArg& id) {
    translate_runtime_errors([&] {
      rt::device(device).allocator().end_allocate_to_pool(runtime_pool(id));
    });
  });
  m.def("_mempool_empty_cache", [](const MempoolIdArg& id) {
    const c10::MempoolId_t pool{id.first, id.second};
    runtime_pool(id);  // validates
    translate_runtime_errors([&] { device_allocator()->emptyCache(pool); });
  });
  m.def("raw_alloc", [](size_t nbytes, int device) -> uintptr_t {
    c10::DataPtr data =
        device_allocator()->allocate_on(static_cast<c10::DeviceIndex>(device),
                                        nbytes, c10::DeviceType::PrivateUse1);
    const auto ptr = reinterpret_cast<uintptr_t>(data.get());
    if (ptr == 0) return 0;
    RawAllocations& raw = raw_allocations();
    std::lock_guard<std::mutex> lock(raw.mutex);
    raw.live.emplace(ptr, std::move(data));
    return ptr;
  });
  m.def("raw_delete", [](uintptr_t ptr) {
    c10::DataPtr data;
    {
      RawAllocations& raw = raw_allocations();
      std::lock_guard<std::mutex> lock(raw.mutex);
      auto it = raw.live.find(ptr);
      TORCH_CHECK(it != raw.live.end(), "invalid device pointer: ", ptr);
      data = std::move(it->second);
      raw.live.erase(it);
    }
    // freed here, outside the lock
  });
}

}  // namespace ember
