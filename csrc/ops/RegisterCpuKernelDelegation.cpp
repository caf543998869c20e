// ATen gives many ops both a CPU kernel and a device-generic composite
// (CompositeExplicitAutograd[NonFunctional]). Without an ember kernel the
// dispatcher picks the composite, which is a different algorithm (results
// not bitwise equal to CPU) and often two dispatches instead of one (a
// functional op lowered to empty + out=). So at load time every such op is
// pointed at the CPU delegation explicitly: on ember, the exact CPU kernel
// runs.
#include <torch/library.h>

#include <memory>
#include <string>

#include "ops/CpuDelegation.h"
#include "ops/RegisterEmberOps.h"

namespace ember {
namespace {

bool resolves_to_composite(const c10::OperatorHandle& op) {
  using c10::DispatchKey;
  // CompositeImplicitAutograd counts too: an op that also has a CPU kernel
  // gets no decomposition on CPU (nor its autograd), and so none on ember.
  return !op.hasKernelForDispatchKey(DispatchKey::PrivateUse1) &&
         op.hasKernelForDispatchKey(DispatchKey::CPU) &&
         (op.hasKernelForDispatchKey(DispatchKey::CompositeExplicitAutograd) ||
          op.hasKernelForDispatchKey(
              DispatchKey::CompositeExplicitAutogradNonFunctional) ||
          op.hasKernelForDispatchKey(DispatchKey::CompositeImplicitAutograd));
}

// Ops whose composite must stay: they allocate on the target device or move
// data between devices, which only the composite does right.
bool keep_composite(const std::string& name) {
  return name.rfind("_nested", 0) == 0 || name.rfind("_to_copy", 0) == 0 ||
         name == "copy_" || name == "clone" || name == "lift_fresh";
}

// Composites that cannot run on a PrivateUse1 tensor: they route it to a
// *_overrideable stub, call a DispatchStub with the tensor's device type,
// or check the device type outright; or the kernel they call tells
// arguments apart by C++ object address, which a boxed call loses (addr_
// passes `self` as both input and out=, and CPU's addr refuses a
// broadcast `self` only when the two are one object). Delegating the whole
// composite runs CPU's path on aliases instead.
bool delegate_whole_composite(const std::string& name) {
  return name == "convolution" || name == "convolution_backward" ||
         name == "_convolution" || name == "_convolution.deprecated" ||
         name == "conj_physical_" || name == "mode" || name == "mode.values" ||
         name == "addr_";
}

// Ops with a kernel for CPU's sparse layouts also have a device-generic
// composite, and a dispatcher without a sparse ember kernel picks it over
// the sparse fallback (it raises for most: is_coalesced, _indices, ...).
// Each is pointed at the delegation for ember's sparse key, which runs CPU's
// sparse kernel (ops/SparseBridge.h). _to_copy keeps its composite: it moves
// the components between devices.
int register_sparse_delegation(c10::DispatchKey cpu_key,
                               c10::DispatchKey ember_key,
                               std::unique_ptr<torch::Library>& library) {
  library = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                             ember_key, __FILE__, __LINE__);
  int registered = 0;
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    const std::string base = name.name.substr(6);
    if (base.rfind("_to_copy", 0) == 0) continue;
    const std::optional<c10::OperatorHandle> op = dispatcher.findOp(name);
    if (!op.has_value() || !op->hasKernelForDispatchKey(cpu_key) ||
        op->hasKernelForDispatchKey(ember_key)) {
      continue;
    }
    const std::string schema_name =
        name.overload_name.empty() ? base : base + "." + name.overload_name;
    library->impl(
        schema_name.c_str(),
        torch::CppFunction::makeFromBoxedFunction<&cpu_delegation_fallback>());
    ++registered;
  }
  return registered;
}

}  // namespace

int register_cpu_kernel_delegation() {
  static std::unique_ptr<torch::Library> library;
  static std::unique_ptr<torch::Library> sparse_library;
  static std::unique_ptr<torch::Library> compressed_library;
  static int registered = -1;
  if (registered >= 0) return registered;
  library = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                             c10::DispatchKey::PrivateUse1,
                                             __FILE__, __LINE__);
  registered = 0;
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    const std::string base = name.name.substr(6);
    if (keep_composite(base)) continue;
    const std::optional<c10::OperatorHandle> op = dispatcher.findOp(name);
    if (!op.has_value()) continue;
    const std::string schema_name =
        name.overload_name.empty() ? base : base + "." + name.overload_name;
    if (!resolves_to_composite(*op) &&
        !(delegate_whole_composite(schema_name) &&
          !op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1))) {
      continue;
    }
    library->impl(
        schema_name.c_str(),
        torch::CppFunction::makeFromBoxedFunction<&cpu_delegation_fallback>());
    ++registered;
  }
  registered += register_sparse_delegation(c10::DispatchKey::SparseCPU,
                                           c10::DispatchKey::SparsePrivateUse1,
                                           sparse_library);
  registered += register_sparse_delegation(
      c10::DispatchKey::SparseCsrCPU, c10::DispatchKey::SparseCsrPrivateUse1,
      compressed_library);
  return registered;
}

}  // namespace ember
