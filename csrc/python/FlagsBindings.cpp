// torch_ember._C.flags: get/set of every torch.backends.ember switch.
// Validation of names happens in Python (torch_ember/backends); values are
// checked here too so a bad value never reaches a kernel.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "core/RuntimeErrors.h"
#include "ember/runtime/device.h"
#include "flags/BackendFlags.h"
#include "flags/Environment.h"
#include "observe/OpLog.h"
#include "ops/kernels/tuning/Autotune.h"

namespace py = pybind11;

namespace ember {

namespace {
flags::BlasLibrary parse_blas(const std::string& name) {
  if (name == "default") return flags::BlasLibrary::kDefault;
  if (name == "mkl") return flags::BlasLibrary::kMkl;
  if (name == "onednn") return flags::BlasLibrary::kOneDnn;
  TORCH_CHECK_VALUE(false, "BLAS library must be one of 'default', 'mkl', ",
                    "'onednn', got '", name, "'");
}
flags::FallbackPolicy parse_fallback(const std::string& name) {
  if (name == "allow") return flags::FallbackPolicy::kAllow;
  if (name == "warn") return flags::FallbackPolicy::kWarn;
  if (name == "error") return flags::FallbackPolicy::kError;
  TORCH_CHECK_VALUE(false, flags::fallback_message("'" + name + "'"));
}
// Work already launched runs under the settings it was launched with: a
// switch changes only after every device's queued work has finished.
void finish_queued_work() {
  if (runtime::invalid_configuration() != nullptr) return;
  py::gil_scoped_release no_gil;
  translate_runtime_errors([] {
    for (int i = 0; i < runtime::device_count(); ++i) {
      runtime::device(i).synchronize();
    }
  });
}

// A setter that first lets queued work finish.
template <class R, class... A>
auto drained(R (*setter)(A...)) {
  return [setter](A... args) {
    finish_queued_work();
    return setter(args...);
  };
}
}  // namespace

py::dict benchmark_cache_info() {
  py::list choices;
  const auto entries = tuning::cache_entries();
  for (const auto& entry : entries) {
    py::dict d;
    d["op"] = entry.op;
    d["signature"] = entry.signature;
    d["algorithm"] = entry.algorithm;
    py::dict timings;
    for (const auto& [name, us] : entry.timings_us) timings[name.c_str()] = us;
    d["timings_us"] = timings;
    choices.append(d);
  }
  py::dict info;
  info["entries"] = entries.size();
  info["limit"] = flags::benchmark_limit();
  info["choices"] = choices;
  return info;
}

void bind_flags(py::module& parent) {
  parent.def("benchmark_cache_info", &benchmark_cache_info);
  parent.def("clear_benchmark_cache", &tuning::clear_cache);
  auto m = parent.def_submodule("flags", "torch.backends.ember switches");
  m.def("async_execution", &flags::async_execution);
  m.def("set_async_execution", drained(&flags::set_async_execution));
  m.def("fuse_elementwise", &flags::fuse_elementwise);
  m.def("set_fuse_elementwise", drained(&flags::set_fuse_elementwise));
  m.def("cpu_parity", &flags::cpu_parity);
  m.def("set_cpu_parity", drained(&flags::set_cpu_parity));
  m.def("deterministic", &flags::deterministic_flag);
  m.def("effective_deterministic", &flags::deterministic);
  m.def("set_deterministic", drained(&flags::set_deterministic));
  m.def("benchmark", &flags::benchmark);
  m.def("set_benchmark", drained(&flags::set_benchmark));
  m.def("benchmark_limit", &flags::benchmark_limit);
  m.def("set_benchmark_limit", drained(&flags::set_benchmark_limit));
  m.def("matmul_fp32_precision", &flags::matmul_fp32_precision_setting);
  m.def("set_matmul_fp32_precision",
        drained(&flags::set_matmul_fp32_precision));
  m.def("conv_fp32_precision", &flags::conv_fp32_precision_setting);
  m.def("set_conv_fp32_precision", drained(&flags::set_conv_fp32_precision));
  m.def("effective_matmul_fp32_precision",
        [] { return flags::to_string(flags::matmul_fp32_precision()); });
  m.def("effective_conv_fp32_precision",
        [] { return flags::to_string(flags::conv_fp32_precision()); });
  m.def("blas_library",
        [] { return std::string(flags::to_string(flags::blas_library())); });
  m.def("set_blas_library", [](const std::string& name) {
    finish_queued_work();
    flags::set_blas_library(parse_blas(name));
  });
  m.def("verbose", &flags::verbose_level);
  m.def("set_verbose", [](int level) {
    finish_queued_work();  // frees of finished work are logged at the old level
    flags::set_verbose_level(level);
    observe::sync_op_log();
  });
  observe::sync_op_log();  // EMBER_VERBOSE at start-up
  m.def("fallback",
        [] { return std::string(flags::to_string(flags::fallback_policy())); });
  m.def("set_fallback", [](const std::string& name) {
    finish_queued_work();
    flags::set_fallback_policy(parse_fallback(name));
  });
}

}  // namespace ember
