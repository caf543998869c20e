// Copies into, out of and between ember devices, and reading one element
// back to the host. Both ends are host memory, so CPU's copy kernel does the
// work on aliases: any strides, dtype conversion and offset it supports.
#include <ATen/ops/_local_scalar_dense.h>

#include <string>

#include "graphs/GraphCapture.h"
#include "ops/CpuAlias.h"
#include "ops/DeviceScope.h"
#include "ops/LaunchStats.h"
#include "ops/kernels/EmberKernels.h"

namespace ember::kernels {
namespace {

at::Tensor host_view(const at::Tensor& t) {
  return t.is_privateuseone() ? cpu_alias(t) : t;
}

}  // namespace

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst,
                     bool non_blocking) {
  // From pinned host memory: queued on the stream (DeviceScope.h). Any
  // other non_blocking copy has completed on return, which satisfies its
  // contract.
  if (non_blocking && enqueue_pinned_upload(self, dst)) return dst;
  const c10::DeviceIndex device =
      dst.is_privateuseone() ? dst.device().index() : self.device().index();
  // Within one device: launched on the stream, like any other op (copy_
  // has made its checks; distinct storages cannot partially overlap).
  if (launch_async() && self.is_privateuseone() && dst.is_privateuseone() &&
      self.device() == dst.device() &&
      !self.storage().is_alias_of(dst.storage())) {
    launch_on_device(
        device, "aten::copy_",
        [src_cpu = cpu_alias(self), dst_cpu = cpu_alias(dst)]() mutable {
          dst_cpu.copy_(src_cpu);
        });
    static const std::string name = "aten::copy_";
    count_launch(name);
    return dst;
  }
  // Reading ember memory from the host or another device: a
  // synchronisation point for the work queued on the source device.
  if (self.is_privateuseone() &&
      (!dst.is_privateuseone() || self.device() != dst.device())) {
    synchronize_for_host_read(self.device().index());
  }
  at::Tensor src_host = host_view(self);
  at::Tensor dst_host = host_view(dst);
  if (self.is_privateuseone() && dst.is_privateuseone() &&
      self.device() == dst.device()) {
    // Within one device a graph may replay the copy.
    run_on_device_recorded(
        device, "aten::copy_", [&] { dst_host.copy_(src_host); },
        [&] {
          return [src = src_host, target = dst_host]() mutable {
            target.copy_(src);
          };
        });
    return dst;
  }
  if (capture::graph_for(device) != nullptr) [[unlikely]] {
    capture::refuse("aten::copy_",
                    "a copy between the host (or another device) and the "
                    "capturing device: a replay would read or write host "
                    "memory the program may have changed; copy into the "
                    "graph's static inputs before replay() instead");
  }
  run_on_device(device, [&] { dst_host.copy_(src_host); });
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, /*non_blocking=*/false);
}

c10::Scalar local_scalar_dense(const at::Tensor& self) {
  c10::Scalar value;
  // A synchronisation point: the value must reflect all queued work.
  runtime::device(self.device().index()).synchronize();
  run_on_device(self.device().index(),
                [&] { value = at::_local_scalar_dense(cpu_alias(self)); });
  return value;
}

}  // namespace ember::kernels
