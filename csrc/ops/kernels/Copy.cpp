// Copies into, out of and between ember devices, and reading one element
// back to the host. Both ends are host memory, so CPU's copy kernel does the
// work on aliases: any strides, dtype conversion and offset it supports.
// Between NCHW and channels-last fp32 images ember's layout transpose does
// it instead (the same bytes, 4-15x faster than CPU's strided copy).
#include <ATen/MemoryOverlap.h>
#include <ATen/ops/_local_scalar_dense.h>

#include <string>

#include "ember/runtime/cpu_features.h"
#include "flags/BackendFlags.h"
#include "graphs/GraphCapture.h"
#include "ops/CpuAlias.h"
#include "ops/DeviceScope.h"
#include "ops/LaunchStats.h"
#include "ops/StorageWrites.h"
#include "ops/kernels/EmberKernels.h"
#include "ops/kernels/LayoutTranspose.h"

namespace ember::kernels {
namespace {

at::Tensor host_view(const at::Tensor& t) {
  return t.is_privateuseone() ? cpu_alias(t) : t;
}

// Exactly one of the two dense 4-D layouts (a tensor with C == 1 or
// H * W == 1 is both, and needs no re-layout).
bool only_nchw(const at::Tensor& t) {
  return t.is_contiguous() && !t.is_contiguous(at::MemoryFormat::ChannelsLast);
}
bool only_channels_last(const at::Tensor& t) {
  return t.is_contiguous(at::MemoryFormat::ChannelsLast) && !t.is_contiguous();
}

// Whether two dense tensors share bytes. Compared by address: CPU aliases
// of the same ember memory have distinct storages.
bool overlaps(const at::Tensor& a, const at::Tensor& b) {
  const auto* a0 = static_cast<const char*>(a.const_data_ptr());
  const auto* b0 = static_cast<const char*>(b.const_data_ptr());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

// dst.copy_(src) on host tensors; an fp32 NCHW <-> channels-last copy of
// the same sizes runs ember's register transposes.
void host_copy(at::Tensor& dst, const at::Tensor& src) {
  static const bool transposes = layout_transposes_supported();
  const bool plain = !transposes || flags::cpu_parity() || src.dim() != 4 ||
                     src.scalar_type() != at::kFloat ||
                     dst.scalar_type() != at::kFloat ||
                     src.sizes() != dst.sizes() || src.is_conj() ||
                     src.is_neg() || dst.is_conj() || dst.is_neg();
  if (!plain && !overlaps(src, dst)) {
    const int64_t n = src.size(0), c = src.size(1),
                  hw = src.size(2) * src.size(3);
    if (only_channels_last(src) && only_nchw(dst)) {
      channels_last_to_contiguous(src.const_data_ptr<float>(),
                                  dst.mutable_data_ptr<float>(), n, c, hw);
      return;
    }
    if (only_nchw(src) && only_channels_last(dst)) {
      contiguous_to_channels_last(src.const_data_ptr<float>(),
                                  dst.mutable_data_ptr<float>(), n, c, hw);
      return;
    }
  }
  dst.copy_(src);
}

}  // namespace

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst,
                     bool non_blocking) {
  if (dst.is_privateuseone()) note_storage_write(dst);
  // Names this op in launch_stats() (a wait for the queue) and heap reports:
  // a copy is no delegated op.
  const observe::CurrentOpScope current_op("aten::copy_");
  // From pinned host memory: queued on the stream (DeviceScope.h). Any
  // other non_blocking copy has completed on return, which satisfies its
  // contract.
  if (non_blocking && enqueue_pinned_upload(self, dst)) return dst;
  if (enqueue_staged_upload(self, dst)) return dst;
  const c10::DeviceIndex device =
      dst.is_privateuseone() ? dst.device().index() : self.device().index();
  // CPU's copy_ refuses a source that partially overlaps its destination
  // (TensorIterator's check). The kernels below run on CPU aliases, whose
  // storages are distinct, so the check is made here on the ember tensors.
  if (self.is_privateuseone() && dst.is_privateuseone() &&
      self.device() == dst.device()) {
    at::assert_no_partial_overlap(dst, self);
  }
  // Within one device: launched on the stream, like any other op (copy_
  // has made its checks; distinct storages cannot partially overlap).
  if (launch_async() && self.is_privateuseone() && dst.is_privateuseone() &&
      self.device() == dst.device() &&
      !self.storage().is_alias_of(dst.storage())) {
    const bool queued = launch_on_device(
        device, "aten::copy_",
        [src_cpu = cpu_alias(self), dst_cpu = cpu_alias(dst)]() mutable {
          run_split_free([&] { host_copy(dst_cpu, src_cpu); });
        },
        dst.numel());
    static const std::string name = "aten::copy_";
    if (queued) count_launch(name);
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
        device, "aten::copy_", [&] { host_copy(dst_host, src_host); },
        [&] {
          return [src = src_host, target = dst_host]() mutable {
            host_copy(target, src);
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
  run_on_device(device, [&] { host_copy(dst_host, src_host); });
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
