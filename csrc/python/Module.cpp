// torch_ember._C: the Python face of the C++ core. Thin by design: every
// function forwards to the runtime or the glue layer.
#include <ATen/autocast_mode.h>
#include <ATen/ops/ones.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Event.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/utils/pybind.h>

#include "core/CpuAllocationCapture.h"
#include "core/EmberAllocator.h"
#include "core/EmberGenerator.h"
#include "core/EmberHooks.h"
#include "core/RuntimeErrors.h"
#include "ember/runtime/cpu_features.h"
#include "ember/runtime/device.h"
#include "flags/Environment.h"
#include "ops/FallbackStats.h"
#include "ops/RegisterEmberOps.h"
#include "ops/kernels/matmul/FastGemm.h"
#include "ops/kernels/matmul/PackedWeights.h"
#include "ops/kernels/tuning/Autotune.h"

namespace py = pybind11;

namespace ember {
void bind_flags(py::module& parent);        // FlagsBindings.cpp
void bind_ecosystem(py::module& m);         // EcosystemBindings.cpp
void bind_engine(py::module& m);            // EngineBindings.cpp
void bind_ipc(py::module& m);               // IpcBindings.cpp
void bind_compiled_kernels(py::module& m);  // CompiledKernelBindings.cpp
void bind_dynamo_builtins(py::module& m);   // DynamoBuiltins.cpp

namespace {

namespace rt = ember::runtime;

py::dict stat_dict(const rt::Stat& s) {
  py::dict d;
  d["current"] = s.current;
  d["peak"] = s.peak;
  d["allocated"] = s.allocated;
  d["freed"] = s.freed;
  return d;
}

// Nested dict in the layout of torch.cuda.memory_stats_as_nested_dict().
py::dict memory_stats(int device) {
  const rt::MemoryStats s = translate_runtime_errors([&] {
    // As after synchronous execution (EmberDeviceAllocator::getDeviceStats).
    py::gil_scoped_release no_gil;
    rt::device(device).streams().current().wait_quietly();
    return rt::device(device).allocator().stats();
  });
  auto with_pool = [](const rt::Stat& stat) {
    py::dict pools;
    pools["all"] = stat_dict(stat);
    return pools;
  };
  py::dict d;
  d["allocation"] = with_pool(s.allocation);
  d["segment"] = with_pool(s.segment);
  d["active"] = with_pool(s.active);
  d["inactive_split"] = with_pool(s.inactive_split);
  d["allocated_bytes"] = with_pool(s.allocated_bytes);
  d["reserved_bytes"] = with_pool(s.reserved_bytes);
  d["active_bytes"] = with_pool(s.active_bytes);
  d["inactive_split_bytes"] = with_pool(s.inactive_split_bytes);
  d["requested_bytes"] = with_pool(s.requested_bytes);
  d["num_alloc_retries"] = s.num_alloc_retries;
  d["num_ooms"] = s.num_ooms;
  d["num_device_alloc"] = s.num_device_alloc;
  d["num_device_free"] = s.num_device_free;
  // ember's own key: bytes of prepacked GEMM weights (included in
  // allocated_bytes); torch.ember.empty_cache() releases them.
  d["packed_weight_bytes"] =
      matmul::pack_cache_bytes_on(static_cast<c10::DeviceIndex>(device));
  return d;
}

py::dict device_properties(int device) {
  const rt::DeviceProperties p =
      translate_runtime_errors([&] { return rt::device(device).properties(); });
  py::dict d;
  d["name"] = p.name;
  d["index"] = p.index;
  d["cores"] = p.cores;
  d["core_ids"] = p.core_ids;
  d["numa_node"] = p.numa_node;
  d["total_memory"] = p.total_memory;
  d["isa"] = p.isa;
  return d;
}

py::dict cpu_features() {
  const rt::CpuFeatures& f = rt::cpu_features();
  py::dict d;
  d["vendor"] = f.vendor;
  d["model_name"] = f.model_name;
  d["sse4_2"] = f.sse4_2;
  d["avx"] = f.avx;
  d["avx2"] = f.avx2;
  d["fma"] = f.fma;
  d["f16c"] = f.f16c;
  d["avx512f"] = f.avx512f;
  d["avx512bw"] = f.avx512bw;
  d["avx512vl"] = f.avx512vl;
  d["avx512dq"] = f.avx512dq;
  d["avx512_bf16"] = f.avx512_bf16;
  d["avx512_vnni"] = f.avx512_vnni;
  d["avx512_fp16"] = f.avx512_fp16;
  d["avx_vnni"] = f.avx_vnni;
  d["amx_tile"] = f.amx_tile;
  d["amx_bf16"] = f.amx_bf16;
  d["amx_int8"] = f.amx_int8;
  d["best_isa"] = f.best_isa();
  return d;
}

py::dict fallback_stats_dict() {
  py::dict d;
  for (const auto& [op, count] : fallback_stats()) {
    py::dict entry;
    entry["copies"] = count.copies;
    entry["bytes"] = count.bytes;
    d[py::str(op)] = entry;
  }
  return d;
}

// The autograd engine runs ember backward nodes on its device threads. A
// device thread releases the last references of a finished backward a
// moment after the caller resumes; if the interpreter is finalizing by then
// and those references own Python objects, the thread is killed while
// taking the GIL and the process aborts. Run at exit (interpreter still
// alive, GIL released): one tiny backward per device, on tensors Python
// never saw, queues behind whatever the thread still holds.
void drain_autograd_device_threads() {
  if (rt::invalid_configuration() != nullptr) return;  // no device ever ran
  py::gil_scoped_release no_gil;
  at::AutoGradMode grad_mode(true);
  for (int device = 0; device < rt::device_count(); ++device) {
    at::Tensor x = at::ones({1}, at::TensorOptions().device(c10::Device(
                                     c10::DeviceType::PrivateUse1,
                                     static_cast<c10::DeviceIndex>(device))))
                       .requires_grad_(true);
    torch::autograd::grad({x.sum()}, {x});
  }
}

// The message of every invalid EMBER_* variable, one per line; empty when
// all are valid.
std::string configuration_error_message() {
  std::string message;
  for (const std::string& error : flags::environment_errors()) {
    if (!message.empty()) message += "\n";
    message += error;
  }
  return message;
}

// Wires the device into ATen. Never raises for a bad setting: an invalid
// EMBER_* value is handed to the runtime, which raises it at the first use
// of an ember device, so `import torch` keeps working for CPU-only code.
void initialize() {
  if (const std::string message = configuration_error_message();
      !message.empty()) {
    rt::report_invalid_configuration(message);
  }
  register_hooks();
  install_cpu_allocation_capture();
  register_cpu_kernel_delegation();
  at::autocast::set_autocast_dtype(at::kPrivateUse1, at::kBFloat16);
}

}  // namespace
}  // namespace ember

PYBIND11_MODULE(_C, m) {
  using namespace ember;
  m.doc() = "ember device backend (C++ core)";
  m.def("_initialize", &initialize);
  m.def("_drain_autograd_device_threads", &drain_autograd_device_threads);
  // The invalid-settings message ember raises at first use, or None.
  m.def("_configuration_error", []() -> std::optional<std::string> {
    if (const std::string* error = rt::invalid_configuration()) return *error;
    return std::nullopt;
  });
  m.def("device_count", [] {
    return translate_runtime_errors([] { return rt::device_count(); });
  });
  m.def("current_device", [] { return rt::current_device(); });
  m.def("set_device", [](int device) {
    translate_runtime_errors([&] { rt::set_current_device(device); });
  });
  m.def("synchronize", [](int device) {
    py::gil_scoped_release no_gil;  // queued work never needs the GIL
    translate_runtime_errors([&] { rt::device(device).synchronize(); });
  });
  // Host code about to touch ember memory directly (a compiled graph's C++
  // kernel that is not launched, compile/kernel_launch.py): waits for the
  // work queued on the current stream of its device (default: the current
  // device). One atomic load when nothing is queued.
  m.def(
      "wait_for_current_stream",
      [](std::optional<int> device) {
        rt::Stream* stream = translate_runtime_errors([&] {
          return &rt::device(device.value_or(rt::current_device()))
                      .streams()
                      .current();
        });
        if (stream->query()) return;
        py::gil_scoped_release no_gil;
        translate_runtime_errors([&] { stream->synchronize(); });
      },
      py::arg("device") = py::none());
  m.def("device_properties", &device_properties);
  m.def("cpu_features", &cpu_features);
  m.def("default_generator", [](int device) {
    return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(
        default_generator(static_cast<c10::DeviceIndex>(device))));
  });

  m.def("memory_stats", &memory_stats);
  m.def("empty_cache", [] {
    // Like torch.cuda.empty_cache freeing cuDNN's workspace: the autotuning
    // cache goes too.
    tuning::clear_cache();
    matmul::clear_pack_cache();
    translate_runtime_errors([] { device_allocator()->emptyCache(); });
  });
  m.def("pack_cache_info", [] {
    const matmul::PackCacheStats s = matmul::pack_cache_stats();
    py::dict d;
    d["entries"] = s.entries;
    d["bytes"] = s.bytes;
    d["limit"] = s.limit;
    d["hits"] = s.hits;
    d["packs"] = s.packs;
    d["invalidations"] = s.invalidations;
    d["evictions"] = s.evictions;
    d["admissions_refused"] = s.admissions_refused;
    d["library"] = matmul::tall_gemm_library();
    return d;
  });
  m.def("set_pack_cache_limit", &matmul::set_pack_cache_limit);
  m.def("reset_peak_memory_stats", [](int device) {
    device_allocator()->resetPeakStats(static_cast<c10::DeviceIndex>(device));
  });
  m.def("reset_accumulated_memory_stats", [](int device) {
    device_allocator()->resetAccumulatedStats(
        static_cast<c10::DeviceIndex>(device));
  });
  m.def("mem_get_info", [](int device) {
    return device_allocator()->getMemoryInfo(
        static_cast<c10::DeviceIndex>(device));
  });
  m.def("set_per_process_memory_fraction", [](double fraction, int device) {
    set_memory_fraction(fraction, static_cast<c10::DeviceIndex>(device));
  });
  m.def("memory_limit", [](int device) {
    return translate_runtime_errors(
        [&] { return rt::device(device).allocator().memory_limit(); });
  });

  // torch.Event.elapsed_time insists on the exact torch.Event type; this
  // accepts subclasses such as torch.ember.Event.
  m.def("event_elapsed_time", [](py::handle start, py::handle end) {
    TORCH_CHECK(THPEvent_Check(start.ptr()) && THPEvent_Check(end.ptr()),
                "expected both events to be torch.Event objects");
    const auto& a = reinterpret_cast<THPEvent*>(start.ptr())->event;
    const auto& b = reinterpret_cast<THPEvent*>(end.ptr())->event;
    return a.elapsedTime(b);
  });
  m.def("delegated_op_count", [] { return register_cpu_kernel_delegation(); });
  m.def("fallback_stats", &fallback_stats_dict);
  m.def("reset_fallback_stats", &reset_fallback_stats);
  m.def("strict_mode", &strict_mode);
  m.def("set_strict_mode", &set_strict_mode);
  bind_flags(m);
  bind_ecosystem(m);
  bind_engine(m);
  bind_ipc(m);
  bind_compiled_kernels(m);
  bind_dynamo_builtins(m);
}
