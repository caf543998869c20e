// torch_ember._C.launch_cpp_kernel: Inductor's generated C++ kernels on
// ember, launched on the device's stream as ember's own ops are.
//
// A generated kernel is an `extern "C" void kernel(...)` taking raw pointers
// and int64 sizes. The compiled code's wrapper used to wait for the stream
// and call it on the host, so a compiled model lost the host/worker overlap
// that eager execution has. Launched, it runs on the stream's worker in
// order with the extern kernels (ATen ops) around it; the tensors it touches
// are kept alive until it has run. Pointer and int64 arguments are passed
// in integer registers and on the stack alike (System V x86-64 ABI), so the
// kernel is called through a function type of N 64-bit words; a kernel with
// any other argument (a float scalar) is not launched.
#include <ATen/DeviceAccelerator.h>
#include <ATen/core/Tensor.h>
#include <omp.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/RuntimeErrors.h"
#include "ember/runtime/device.h"
#include "graphs/GraphCapture.h"
#include "ops/DeviceScope.h"
#include "ops/LaunchStats.h"
#include "ops/StorageWrites.h"

namespace py = pybind11;

namespace ember {
namespace {

namespace rt = ember::runtime;

using Word = uint64_t;
constexpr std::size_t kMaxKernelArgs = 32;

template <std::size_t... I>
void call_with_words(void* fn, const Word* words, std::index_sequence<I...>) {
  using Kernel = void (*)(decltype((void)I, Word{})...);
  reinterpret_cast<Kernel>(fn)(words[I]...);
}

template <std::size_t N>
void call_n(void* fn, const Word* words) {
  call_with_words(fn, words, std::make_index_sequence<N>{});
}

using Caller = void (*)(void*, const Word*);

template <std::size_t... N>
constexpr std::array<Caller, sizeof...(N)> make_callers(
    std::index_sequence<N...>) {
  return {&call_n<N>...};
}

// kCallers[n] calls a kernel of n word arguments.
constexpr auto kCallers =
    make_callers(std::make_index_sequence<kMaxKernelArgs + 1>{});

struct KernelCall {
  void* fn;
  std::vector<Word> words;
  std::vector<at::Tensor> tensors;  // their memory outlives the kernel's run
  // Elements of its largest tensor argument: the size launch_on_device's
  // at-call rule reads (a kernel's arguments do not say which are outputs).
  int64_t largest_numel = 0;
  // Generated kernels parallelise with OpenMP, whose regions end at a
  // barrier every team thread must reach. On the worker, the host thread
  // runs Python on one of the device's cores meanwhile: a team as large as
  // the device would wait at each barrier for a thread the host displaced
  // (the batch-1 MLP's kernel took 215 us instead of 50). The team leaves
  // that core to the host; LaunchedWork sets the count back for the next
  // op. Run at the call, the host is the team's master and keeps it whole.
  void operator()() const {
    if (rt::in_stream_worker()) {
      omp_set_num_threads(std::max(1, omp_get_max_threads() - 1));
    }
    kCallers[words.size()](fn, words.data());
  }
};

// The kernel's arguments as words, or nothing if one is neither an ember
// tensor of `device` nor an int.
std::optional<KernelCall> kernel_call(void* fn, const py::tuple& args,
                                      c10::DeviceIndex device) {
  if (args.size() > kMaxKernelArgs) return std::nullopt;
  KernelCall call{fn, {}, {}};
  call.words.reserve(args.size());
  for (const py::handle arg : args) {
    if (THPVariable_Check(arg.ptr())) {
      const at::Tensor& t = THPVariable_Unpack(arg.ptr());
      if (!t.defined() || !t.is_privateuseone() || t.device().index() != device)
        return std::nullopt;
      call.words.push_back(reinterpret_cast<uintptr_t>(t.data_ptr()));
      call.largest_numel = std::max(call.largest_numel, t.numel());
      call.tensors.push_back(t);
    } else if (PyLong_CheckExact(arg.ptr())) {
      int overflow = 0;
      const long long value =
          PyLong_AsLongLongAndOverflow(arg.ptr(), &overflow);
      if (overflow != 0) return std::nullopt;
      call.words.push_back(static_cast<Word>(value));
    } else {
      return std::nullopt;
    }
  }
  return call;
}

// Reports the writes of a kernel to the ember tensors among `args` at the
// positions `written` lists (its non-const pointer arguments; None: all of
// them), as ember's ops report theirs: its raw stores reach the weights a
// compiled step updates in place, which no version counter sees in an
// inference tensor, nor in a graph's replay (ops/StorageWrites.h).
void note_kernel_writes(const py::tuple& args, const py::object& written) {
  const auto note = [&](size_t i) {
    if (i < args.size() && THPVariable_Check(args[i].ptr())) {
      const at::Tensor& t = THPVariable_Unpack(args[i].ptr());
      if (t.defined() && t.is_privateuseone()) note_storage_write(t);
    }
  };
  if (written.is_none()) {
    for (size_t i = 0; i < args.size(); ++i) note(i);
    return;
  }
  for (const py::handle index : written) note(index.cast<size_t>());
}

// torch.accelerator.current_stream(device) for an ember device, as a
// builtin: Dynamo's compiled code looks the current stream up on every call
// (torch_ember/compile/dynamo_streams.py), and a Python function there is
// entered through Dynamo's frame hook each time.
c10::Stream current_stream_of(const at::Device& device) {
  if (!device.is_privateuseone()) {
    throw py::value_error(
        c10::DeviceTypeName(device.type(), /*lower_case=*/true) +
        " doesn't match the current accelerator ember.");
  }
  return at::accelerator::getCurrentStream(
      device.has_index() ? device.index()
                         : static_cast<c10::DeviceIndex>(rt::current_device()));
}

}  // namespace

void bind_compiled_kernels(py::module& m) {
  m.def("_current_stream_of", &current_stream_of, py::arg("device"),
        "torch.accelerator.current_stream(device) for an ember device.");
  m.def("note_kernel_writes", &note_kernel_writes, py::arg("args"),
        py::arg("written"),
        "Reports a generated kernel's writes to its ember tensor arguments "
        "(positions `written`, or all of them for None) run on the host.");
  m.def(
      "launch_cpp_kernel",
      [](std::optional<int> device, const std::string& name, uintptr_t address,
         const py::tuple& args, const py::object& written) {
        if (address == 0) return false;
        const auto index = static_cast<c10::DeviceIndex>(
            device.value_or(rt::current_device()));
        // A capturing stream records the launch (its graph replays the
        // kernel), whichever engine runs ops.
        const bool capturing =
            capture::underway() && capture::graph_for(index) != nullptr;
        if (!launch_async() && !capturing) return false;
        std::optional<KernelCall> call =
            kernel_call(reinterpret_cast<void*>(address), args, index);
        if (!call) return false;
        note_kernel_writes(args, written);
        const char* kept = capture::interned(name);
        // Sized as eager ops are: a kernel over a whole activation (a
        // ResNet's fused bias + ReLU) runs at the call on an idle stream,
        // so a compiled CNN's kernels and its convolutions (at the call by
        // the same rule) stay on the host's OpenMP team. Queued between
        // them, the worker's team and the host's both lived, and libgomp
        // throttles every barrier when its threads outnumber the cores
        // (ResNet-50 compiled, 2 cores: 38-46 ms queued, 29-32 at the call).
        const int64_t size = call->largest_numel;
        bool queued = false;
        translate_runtime_errors([&] {
          queued = launch_on_device(index, kept, std::move(*call), size);
        });
        if (queued) count_launch(kept);
        return true;
      },
      py::arg("device"), py::arg("name"), py::arg("address"), py::arg("args"),
      py::arg("written") = py::none(),
      "Queues a generated C++ kernel (its address, its pointer and int "
      "arguments) on the current stream of an ember device (recorded there "
      "when that stream captures a graph). False, with nothing queued, when "
      "it cannot be launched: asynchronous execution off and no capture, or "
      "an argument that is not an ember tensor of that device or an int.");
}

}  // namespace ember
