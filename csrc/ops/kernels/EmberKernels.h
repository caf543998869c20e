// ember's native kernels: the ops the CPU delegation cannot express
// (allocation, views of ember storage, resize, copies across devices,
// reading a scalar) and the ones where semantics require our own code
// (random ops that must draw from the ember generator). Registration lives
// in ops/RegisterEmberOps.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>
#include <c10/core/Storage.h>

#include <optional>
#include <tuple>

namespace ember::kernels {

// Factories.cpp
at::Tensor empty_memory_format(c10::IntArrayRef size,
                               std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout,
                               std::optional<c10::Device> device,
                               std::optional<bool> pin_memory,
                               std::optional<c10::MemoryFormat> memory_format);
// arange's out= form. With asynchronous execution on, the values (which
// depend only on the host's scalars) are computed at the call by CPU's
// kernel into a host tensor, the result is resized at the call and the copy
// into it is launched: creating a position index does not wait for the
// stream. Otherwise, and for very long ranges, the synchronous delegation.
at::Tensor& arange_start_out(const at::Scalar& start, const at::Scalar& end,
                             const at::Scalar& step, at::Tensor& out);

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device,
                         std::optional<bool> pin_memory);

// Views.cpp
at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size,
                      c10::IntArrayRef stride,
                      std::optional<int64_t> storage_offset);
at::Tensor view(const at::Tensor& self, c10::IntArrayRef size);
at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size,
                         c10::IntArrayRef stride);

// Resize.cpp
const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format);
at::Tensor& set_storage_offset_(at::Tensor& self, c10::Storage source,
                                int64_t storage_offset, c10::IntArrayRef size,
                                c10::IntArrayRef stride);
at::Tensor& set_storage_(at::Tensor& self, c10::Storage source);
at::Tensor& set_tensor_(at::Tensor& self, const at::Tensor& source);
at::Tensor& set_empty_(at::Tensor& self);

// Copy.cpp
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst,
                     bool non_blocking);
at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst);
c10::Scalar local_scalar_dense(const at::Tensor& self);

// Random.cpp
std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input,
                                                  double p,
                                                  std::optional<bool> train);

// Matmul.cpp: CPU's kernels, or ember's GemmEngine when a
// torch.backends.ember switch applies.
at::Tensor mm(const at::Tensor& a, const at::Tensor& b);
at::Tensor addmm(const at::Tensor& self, const at::Tensor& a,
                 const at::Tensor& b, const at::Scalar& beta,
                 const at::Scalar& alpha);
at::Tensor bmm(const at::Tensor& a, const at::Tensor& b);
at::Tensor baddbmm(const at::Tensor& self, const at::Tensor& a,
                   const at::Tensor& b, const at::Scalar& beta,
                   const at::Scalar& alpha);
at::Tensor& mm_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out);
at::Tensor& addmm_out(const at::Tensor& self, const at::Tensor& a,
                      const at::Tensor& b, const at::Scalar& beta,
                      const at::Scalar& alpha, at::Tensor& out);
at::Tensor& bmm_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out);
at::Tensor& baddbmm_out(const at::Tensor& self, const at::Tensor& a,
                        const at::Tensor& b, const at::Scalar& beta,
                        const at::Scalar& alpha, at::Tensor& out);

// Convolution.cpp: CPU's convolution, or ember's algorithm choice under
// conv.fp32_precision / benchmark.
at::Tensor convolution(const at::Tensor& input, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias,
                       c10::SymIntArrayRef stride, c10::SymIntArrayRef padding,
                       c10::SymIntArrayRef dilation, bool transposed,
                       c10::SymIntArrayRef output_padding, c10::SymInt groups);

// Attention.cpp
int64_t fused_sdp_choice(const at::Tensor& query, const at::Tensor& key,
                         const at::Tensor& value,
                         const std::optional<at::Tensor>& attn_mask,
                         double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa);
std::tuple<at::Tensor, at::Tensor> flash_attention(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    double dropout_p, bool is_causal,
    const std::optional<at::Tensor>& attn_mask, std::optional<double> scale);

// elementwise/Arithmetic.cpp: ember's loop over flat fp32 operands.
at::Tensor add(const at::Tensor& self, const at::Tensor& other,
               const at::Scalar& alpha);
// In place; joins a held convolution (ConvEpilogue.h) where it can.
at::Tensor& add_(at::Tensor& self, const at::Tensor& other,
                 const at::Scalar& alpha);
at::Tensor sub(const at::Tensor& self, const at::Tensor& other,
               const at::Scalar& alpha);
at::Tensor mul(const at::Tensor& self, const at::Tensor& other);
at::Tensor div(const at::Tensor& self, const at::Tensor& other);
at::Tensor relu(const at::Tensor& self);
// elementwise/Activations.cpp: ember's vector kernels by default.
at::Tensor tanh(const at::Tensor& self);
at::Tensor gelu(const at::Tensor& self, c10::string_view approximate);
// elementwise/Argmax.cpp: ember's row kernel over the last dimension.
at::Tensor argmax(const at::Tensor& self, std::optional<int64_t> dim,
                  bool keepdim);

// pooling/MaxPool.cpp: ember's vector kernel by default.
std::tuple<at::Tensor, at::Tensor> max_pool2d_with_indices(
    const at::Tensor& self, c10::IntArrayRef kernel_size,
    c10::IntArrayRef stride, c10::IntArrayRef padding,
    c10::IntArrayRef dilation, bool ceil_mode);

// ShallowCopy.cpp
bool has_compatible_shallow_copy_type(const at::Tensor& self,
                                      const at::Tensor& from);

// RecurrentCells.cpp
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates,
    const at::Tensor& cx, const std::optional<at::Tensor>& input_bias,
    const std::optional<at::Tensor>& hidden_bias);
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell_backward(
    const std::optional<at::Tensor>& grad_hy,
    const std::optional<at::Tensor>& grad_cy, const at::Tensor& cx,
    const at::Tensor& cy, const at::Tensor& workspace, bool has_bias);
std::tuple<at::Tensor, at::Tensor> fused_gru_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates,
    const at::Tensor& hx, const std::optional<at::Tensor>& input_bias,
    const std::optional<at::Tensor>& hidden_bias);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
fused_gru_cell_backward(const at::Tensor& grad_hy, const at::Tensor& workspace,
                        bool has_bias);

}  // namespace ember::kernels
