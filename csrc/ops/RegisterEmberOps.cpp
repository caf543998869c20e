// Where every aten op goes on ember. Registration only: each line maps an
// operator schema to its kernel; kernels live in ops/kernels/ and the
// default path in ops/CpuDelegation.cpp.
#include <ATen/native/transformers/attention.h>
#include <torch/library.h>

#include "ops/CpuDelegation.h"
#include "ops/SparseBridge.h"
#include "ops/kernels/EmberKernels.h"

namespace ember {

// Native kernels: what delegation to CPU cannot express.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(kernels::empty_memory_format));
  m.impl("empty_strided", TORCH_FN(kernels::empty_strided));
  m.impl("arange.start_out", TORCH_FN(kernels::arange_start_out));
  m.impl("as_strided", TORCH_FN(kernels::as_strided));
  m.impl("view", TORCH_FN(kernels::view));
  m.impl("_reshape_alias", TORCH_FN(kernels::reshape_alias));
  m.impl("resize_", TORCH_FN(kernels::resize_));
  m.impl("set_.source_Storage", TORCH_FN(kernels::set_storage_));
  m.impl("set_.source_Storage_storage_offset",
         TORCH_FN(kernels::set_storage_offset_));
  m.impl("set_.source_Tensor", TORCH_FN(kernels::set_tensor_));
  m.impl("set_", TORCH_FN(kernels::set_empty_));
  m.impl("_copy_from", TORCH_FN(kernels::copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(kernels::copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(kernels::local_scalar_dense));
  m.impl("native_dropout", TORCH_FN(kernels::native_dropout));
  m.impl("_thnn_fused_lstm_cell", TORCH_FN(kernels::fused_lstm_cell));
  m.impl("_thnn_fused_lstm_cell_backward_impl",
         TORCH_FN(kernels::fused_lstm_cell_backward));
  m.impl("_thnn_fused_gru_cell", TORCH_FN(kernels::fused_gru_cell));
  m.impl("_thnn_fused_gru_cell_backward",
         TORCH_FN(kernels::fused_gru_cell_backward));
  m.impl("mm", TORCH_FN(kernels::mm));
  m.impl("addmm", TORCH_FN(kernels::addmm));
  m.impl("bmm", TORCH_FN(kernels::bmm));
  m.impl("baddbmm", TORCH_FN(kernels::baddbmm));
  m.impl("mm.out", TORCH_FN(kernels::mm_out));
  m.impl("addmm.out", TORCH_FN(kernels::addmm_out));
  m.impl("bmm.out", TORCH_FN(kernels::bmm_out));
  m.impl("baddbmm.out", TORCH_FN(kernels::baddbmm_out));
  m.impl("convolution", TORCH_FN(kernels::convolution));
  m.impl("max_pool2d_with_indices", TORCH_FN(kernels::max_pool2d_with_indices));
  m.impl("_scaled_dot_product_flash_attention_for_cpu",
         TORCH_FN(kernels::flash_attention));
  m.impl("_has_compatible_shallow_copy_type",
         TORCH_FN(kernels::has_compatible_shallow_copy_type));
}

// Copies resolve conjugate/negative views themselves (the aliases carry the
// bits into CPU's copy); materialising them first would recurse into
// _copy_from forever.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

// Everything else: the CPU kernel on aliases of the ember tensors.
TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(
      torch::CppFunction::makeFromBoxedFunction<&cpu_delegation_fallback>());
}
// Sparse ember tensors: CPU's sparse kernels on sparse tensors over aliases
// of their components (ops/SparseBridge.h), except what needs ember's own.
TORCH_LIBRARY_IMPL(aten, SparsePrivateUse1, m) {
  m.impl("_sparse_coo_tensor_with_dims_and_tensors",
         TORCH_FN(sparse_coo_with_dims_and_tensors));
  m.impl("copy_", torch::CppFunction::makeFromBoxedFunction<&sparse_copy_>());
}
TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) {
  m.impl("copy_", torch::CppFunction::makeFromBoxedFunction<&sparse_copy_>());
}
TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(
      torch::CppFunction::makeFromBoxedFunction<&cpu_delegation_fallback>());
}
TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(
      torch::CppFunction::makeFromBoxedFunction<&cpu_delegation_fallback>());
}

}  // namespace ember

// scaled_dot_product_attention asks this stub which fused kernel to use.
namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub,
                              &ember::kernels::fused_sdp_choice)
}  // namespace at::native
