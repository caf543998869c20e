// Whether `param.data = tensor` may swap one tensor's implementation for
// another's. c10's own answer lists CPU, CUDA and the other in-tree dense
// backends but not PrivateUse1, which made Module.to("ember") replace every
// parameter (breaking optimizers built before the move, and lazy modules).
// ember tensors are dense strided tensors like CPU's, so they pair as CUDA's
// do.
#include "ops/kernels/EmberKernels.h"

namespace ember::kernels {
namespace {

bool dense_cpu_or_ember(const at::Tensor& t) {
  return t.layout() == c10::kStrided && !t.is_quantized() && !t.is_nested() &&
         (t.device().is_cpu() || t.device().is_privateuseone());
}

}  // namespace

bool has_compatible_shallow_copy_type(const at::Tensor& self,
                                      const at::Tensor& from) {
  if (dense_cpu_or_ember(self) && dense_cpu_or_ember(from)) return true;
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(
      from.key_set());
}

}  // namespace ember::kernels
