// Fused LSTM/GRU cells. ATen's RNN code sends PrivateUse1 tensors (like CUDA
// ones) to _thnn_fused_{lstm,gru}_cell, which only CUDA implements; these
// are those kernels written with ATen ops (each runs as a delegated CPU op).
// The fused formulation adds the biases separately, so results match CPU's
// unfused cells to rounding, not bit for bit.
#include <ATen/ops/cat.h>
#include <ATen/ops/zeros_like.h>

#include "ops/kernels/EmberKernels.h"

namespace ember::kernels {
namespace {

at::Tensor with_biases(at::Tensor gates,
                       const std::optional<at::Tensor>& bias) {
  if (bias.has_value() && bias->defined()) return gates.add(*bias);
  return gates;
}

at::Tensor or_zeros(const std::optional<at::Tensor>& grad,
                    const at::Tensor& like) {
  return grad.has_value() && grad->defined() ? *grad : at::zeros_like(like);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates,
    const at::Tensor& cx, const std::optional<at::Tensor>& input_bias,
    const std::optional<at::Tensor>& hidden_bias) {
  const at::Tensor gates = with_biases(
      with_biases(input_gates.add(hidden_gates), input_bias), hidden_bias);
  auto chunks = gates.chunk(4, 1);
  const at::Tensor in_gate = chunks[0].sigmoid();
  const at::Tensor forget_gate = chunks[1].sigmoid();
  const at::Tensor cell_gate = chunks[2].tanh();
  const at::Tensor out_gate = chunks[3].sigmoid();
  at::Tensor cy = forget_gate.mul(cx).add_(in_gate.mul(cell_gate));
  at::Tensor hy = out_gate.mul(cy.tanh());
  at::Tensor workspace =
      at::cat({in_gate, forget_gate, cell_gate, out_gate}, 1);
  return {hy, cy, workspace};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell_backward(
    const std::optional<at::Tensor>& grad_hy,
    const std::optional<at::Tensor>& grad_cy, const at::Tensor& cx,
    const at::Tensor& cy, const at::Tensor& workspace, bool has_bias) {
  auto gates = workspace.chunk(4, 1);
  const at::Tensor& in_gate = gates[0];
  const at::Tensor& forget_gate = gates[1];
  const at::Tensor& cell_gate = gates[2];
  const at::Tensor& out_gate = gates[3];
  const at::Tensor ghy = or_zeros(grad_hy, cy);
  const at::Tensor gcy = or_zeros(grad_cy, cy);
  const at::Tensor tanh_cy = cy.tanh();
  // d(loss)/d(cy), through hy = o * tanh(cy) and directly.
  const at::Tensor grad_c =
      ghy.mul(out_gate).mul(tanh_cy.mul(tanh_cy).neg_().add_(1)).add_(gcy);
  const at::Tensor d_in =
      grad_c.mul(cell_gate).mul(in_gate.mul(in_gate.neg().add_(1)));
  const at::Tensor d_forget =
      grad_c.mul(cx).mul(forget_gate.mul(forget_gate.neg().add_(1)));
  const at::Tensor d_cell =
      grad_c.mul(in_gate).mul(cell_gate.mul(cell_gate).neg_().add_(1));
  const at::Tensor d_out =
      ghy.mul(tanh_cy).mul(out_gate.mul(out_gate.neg().add_(1)));
  at::Tensor grad_gates = at::cat({d_in, d_forget, d_cell, d_out}, 1);
  at::Tensor grad_cx = grad_c.mul(forget_gate);
  at::Tensor grad_bias = has_bias ? grad_gates.sum(0) : at::Tensor();
  return {grad_gates, grad_cx, grad_bias};
}

std::tuple<at::Tensor, at::Tensor> fused_gru_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates,
    const at::Tensor& hx, const std::optional<at::Tensor>& input_bias,
    const std::optional<at::Tensor>& hidden_bias) {
  auto in_chunks = with_biases(input_gates, input_bias).chunk(3, 1);
  auto hid_chunks = with_biases(hidden_gates, hidden_bias).chunk(3, 1);
  const at::Tensor reset = in_chunks[0].add(hid_chunks[0]).sigmoid_();
  const at::Tensor update = in_chunks[1].add(hid_chunks[1]).sigmoid_();
  const at::Tensor& input_new = in_chunks[2];
  const at::Tensor& hidden_new = hid_chunks[2];
  const at::Tensor new_gate = input_new.add(reset.mul(hidden_new)).tanh_();
  at::Tensor hy = hx.sub(new_gate).mul_(update).add_(new_gate);
  at::Tensor workspace = at::cat({reset, update, input_new, hidden_new, hx}, 1);
  return {hy, workspace};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
fused_gru_cell_backward(const at::Tensor& grad_hy, const at::Tensor& workspace,
                        bool has_bias) {
  auto parts = workspace.chunk(5, 1);
  const at::Tensor& reset = parts[0];
  const at::Tensor& update = parts[1];
  const at::Tensor& input_new = parts[2];
  const at::Tensor& hidden_new = parts[3];
  const at::Tensor& hx = parts[4];
  const at::Tensor new_gate = input_new.add(reset.mul(hidden_new)).tanh_();
  const at::Tensor grad_hx = grad_hy.mul(update);
  const at::Tensor d_new = grad_hy.mul(update.neg().add_(1))
                               .mul_(new_gate.mul(new_gate).neg_().add_(1));
  const at::Tensor d_update =
      grad_hy.mul(hx.sub(new_gate)).mul_(update.mul(update.neg().add_(1)));
  const at::Tensor d_reset =
      d_new.mul(hidden_new).mul_(reset.mul(reset.neg().add_(1)));
  at::Tensor grad_input_gates = at::cat({d_reset, d_update, d_new}, 1);
  at::Tensor grad_hidden_gates =
      at::cat({d_reset, d_update, d_new.mul(reset)}, 1);
  at::Tensor grad_input_bias =
      has_bias ? grad_input_gates.sum(0) : at::Tensor();
  at::Tensor grad_hidden_bias =
      has_bias ? grad_hidden_gates.sum(0) : at::Tensor();
  return {grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias,
          grad_hidden_bias};
}

}  // namespace ember::kernels
