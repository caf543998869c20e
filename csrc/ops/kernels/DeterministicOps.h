// ember's deterministic mode (torch.backends.ember.deterministic, or
// torch.use_deterministic_algorithms(True); C++: flags::deterministic()).
//
// Each kernel here is the op's PrivateUse1 kernel. With the mode off it is
// exactly the unboxed CPU delegation (ops/UnboxedDelegation.h), bit for bit
// and at the same cost plus one flag read. With the mode on it computes the
// op with a reduction order fixed by the shape (ops/kernels/
// DeterministicReduce.h), so results are bitwise identical across runs and
// across torch.set_num_threads values. Each deterministic call shows in the
// profiler as "ember::deterministic::<op>".
//
// Ops whose ATen CPU kernel is already independent of the thread count
// (log_softmax, layer_norm forward, cumsum, index_add, scatter_add,
// embedding_bag and their backwards, softmax over the last dim) have no
// kernel here; docs/determinism.md lists them and tests/test_deterministic.py
// checks them. Registration: ops/RegisterDeterministicOps.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/Scalar.h>
#include <c10/core/SymInt.h>

#include <array>
#include <optional>
#include <tuple>

namespace ember::kernels::deterministic {

using T = const at::Tensor&;
using OptT = const std::optional<at::Tensor>&;
using Tensor3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// Reductions.
at::Tensor sum(T self, at::OptionalIntArrayRef dim, bool keepdim,
               std::optional<at::ScalarType> dtype);
at::Tensor mean(T self, at::OptionalIntArrayRef dim, bool keepdim,
                std::optional<at::ScalarType> dtype);
at::Tensor var(T self, at::OptionalIntArrayRef dim,
               const std::optional<at::Scalar>& correction, bool keepdim);
at::Tensor std_dev(T self, at::OptionalIntArrayRef dim,
                   const std::optional<at::Scalar>& correction, bool keepdim);
std::tuple<at::Tensor, at::Tensor> var_mean(
    T self, at::OptionalIntArrayRef dim,
    const std::optional<at::Scalar>& correction, bool keepdim);
std::tuple<at::Tensor, at::Tensor> std_mean(
    T self, at::OptionalIntArrayRef dim,
    const std::optional<at::Scalar>& correction, bool keepdim);
at::Tensor linalg_vector_norm(T self, const at::Scalar& ord,
                              at::OptionalIntArrayRef dim, bool keepdim,
                              std::optional<at::ScalarType> dtype);
at::Tensor nansum(T self, at::OptionalIntArrayRef dim, bool keepdim,
                  std::optional<at::ScalarType> dtype);
at::Tensor norm(T self, const std::optional<at::Scalar>& p, at::IntArrayRef dim,
                bool keepdim);
at::Tensor mse_loss(T self, T target, int64_t reduction);

// Softmax over a dim other than the last (ATen's kernel for that case
// splits rows between threads mid-vector). _softmax is registered in
// ops/kernels/HotOps.cpp: that registration must point here.
at::Tensor softmax(T self, int64_t dim, bool half_to_float);
at::Tensor softmax_backward_data(T grad_output, T output, int64_t dim,
                                 at::ScalarType input_dtype);

// gelu(approximate="tanh"), whose vector and scalar loops round
// differently: run serially. Also registered in ops/kernels/HotOps.cpp,
// which must point here.
at::Tensor gelu(T self, c10::string_view approximate);

// Normalisation layers.
Tensor3 layer_norm_backward(T grad_out, T input,
                            c10::SymIntArrayRef normalized_shape, T mean,
                            T rstd, OptT weight, OptT bias,
                            std::array<bool, 3> output_mask);
Tensor3 group_norm(T input, OptT weight, OptT bias, c10::SymInt N,
                   c10::SymInt C, c10::SymInt HxW, int64_t group, double eps);
Tensor3 group_norm_backward(T grad_out, T input, T mean, T rstd, OptT weight,
                            c10::SymInt N, c10::SymInt C, c10::SymInt HxW,
                            int64_t group, std::array<bool, 3> output_mask);

// Boxed: the CPU delegation, run serially in deterministic mode (ops whose
// CPU kernel is order-dependent only through its thread split or atomics:
// index_put with accumulate, index_copy with repeated indices, put_).
void serial_when_deterministic(const c10::OperatorHandle& op,
                               c10::DispatchKeySet keys,
                               torch::jit::Stack* stack);
// Boxed: the CPU delegation with every library on one thread in
// deterministic mode (SerialScope): for kernels that split their
// summations by thread inside oneDNN or MKL (convolution backward, LAPACK
// factorisations), which no ATen parallel region reaches.
void single_threaded_when_deterministic(const c10::OperatorHandle& op,
                                        c10::DispatchKeySet keys,
                                        torch::jit::Stack* stack);
// Elementwise ops whose vector and scalar loops round differently (ATen's
// thread split decides which elements take the scalar tail): ATen's kernel
// (its out= form) on fixed 65536-element chunks, in parallel; serially
// when the arguments do not allow chunking.
void elementwise_when_deterministic(const c10::OperatorHandle& op,
                                    c10::DispatchKeySet keys,
                                    torch::jit::Stack* stack);
// put_: accumulate=True runs serially; accumulate=False with repeated
// indices has no deterministic definition (CPU and CUDA raise too).
void put_(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
          torch::jit::Stack* stack);
// Losses whose CPU kernel reduces inside: the unreduced loss from the CPU
// kernel, then ember's fixed-order mean or sum.
void loss_reduction(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                    torch::jit::Stack* stack);
// out= forms of the reductions above: the functional kernel, copied out.
void reduction_out(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                   torch::jit::Stack* stack);
// Ops ember cannot make deterministic (their CPU library splits work by
// thread count internally): raise / warn under the mode, then delegate.
void alert_when_deterministic(const c10::OperatorHandle& op,
                              c10::DispatchKeySet keys,
                              torch::jit::Stack* stack);

}  // namespace ember::kernels::deterministic
