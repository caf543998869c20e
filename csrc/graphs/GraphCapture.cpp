#include "graphs/GraphCapture.h"

#include <c10/util/Exception.h>

#include <mutex>
#include <string>
#include <unordered_set>

#include "core/ForkSafety.h"
#include "ember/runtime/device.h"
#include "ops/CpuAlias.h"

namespace ember::capture {

runtime::CapturedGraph* graph_for(c10::DeviceIndex device) {
  if (!underway()) return nullptr;
  return runtime::device(device).streams().current().capture();
}

const char* interned(std::string_view name) {
  static ForkHeldMutex mutex;
  static std::unordered_set<std::string> names;
  std::lock_guard<std::mutex> lock(mutex);
  return names.emplace(name).first->c_str();
}

void refuse(std::string_view op, std::string_view reason) {
  TORCH_CHECK(false, "ember graph capture: ", op, " cannot be captured (",
              reason,
              "). Run it before capture_begin or after capture_end, or keep "
              "it out of the graphed region.");
}

void store_result(const at::Tensor& captured, const at::Tensor& fresh) {
  if (!captured.defined() || !fresh.defined()) return;
  if (fresh.is_same(captured) || (fresh.data_ptr() == captured.data_ptr() &&
                                  fresh.sizes() == captured.sizes() &&
                                  fresh.strides() == captured.strides())) {
    return;
  }
  const_cast<at::Tensor&>(captured).copy_(fresh);
}

void store_result(const c10::IValue& captured, const c10::IValue& fresh) {
  if (captured.isTensor() && fresh.isTensor()) {
    store_result(captured.toTensor(), fresh.toTensor());
  } else if (captured.isTensorList() && fresh.isTensorList()) {
    const auto a = captured.toTensorList();
    const auto b = fresh.toTensorList();
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      store_result(at::Tensor(a.get(i)), at::Tensor(b.get(i)));
    }
  }
}

at::Tensor keep_for_replay(const at::Tensor& original, const at::Tensor& alias,
                           std::string_view op) {
  if (!original.defined() || original.is_privateuseone()) return alias;
  if (original.dim() != 0) {
    refuse(op,
           "it reads a host (CPU) tensor, which a replay would read again "
           "at whatever it holds then; copy it to ember before capture");
  }
  return alias.clone();
}

namespace {
// An inference tensor has none: its writes are seen by the storage watch.
int64_t version_of(const at::Tensor& t) {
  if (t.is_inference()) return 0;
  return static_cast<int64_t>(
      t.unsafeGetTensorImpl()->version_counter().current_version());
}
}  // namespace

WatchedWeight WatchedWeight::of(const at::Tensor& weight) {
  if (!underway()) return {};
  return {weight, cpu_alias(weight), version_of(weight),
          StorageWriteWatch(weight)};
}

bool WatchedWeight::written_since() const {
  return weight.defined() &&
         (version_of(weight) != version || writes.written());
}

}  // namespace ember::capture
