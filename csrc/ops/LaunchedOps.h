// Asynchronous ("launched") forms of the unboxed delegation
// (ops/UnboxedDelegation.h), for ops whose result layout ember knows before
// the kernel runs. The calling thread checks the arguments, works out the
// result's sizes, strides and dtype from ATen's C++ meta function of the op
// (the structured kernel's own shape logic: the same checks and errors as
// the CPU kernel), allocates the result on the device and queues the CPU
// kernel's out= form on the current stream; the stream's worker runs it.
//
// Anything that does not fit falls back to the synchronous delegation, which
// then produces the result or the error exactly as before: async execution
// off, an argument that is a host tensor the kernel would read later (other
// than a 0-dim scalar, which is copied), or a meta function that raises.
//
// Use: m.impl("add.Tensor", TORCH_FN((launched<ops::add_Tensor, ops::add_out,
//                                     meta::Add, ARGS...>)));
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/WrapDimMinimal.h>

#include <algorithm>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "ops/DeviceScope.h"
#include "ops/LaunchStats.h"
#include "ops/StorageWrites.h"
#include "ops/UnboxedDelegation.h"

namespace ember::unboxed {

// A tensor argument for queued work: its CPU alias. A host tensor is kept
// only if it is a 0-dim scalar (copied, so a later write by the caller
// cannot reach the kernel); any other makes the call synchronous.
inline at::Tensor keep(DelegationCall& call, const at::Tensor& t,
                       bool& launchable) {
  if (!t.defined() || t.is_privateuseone()) return call.to_cpu(t, false);
  at::Tensor host = call.to_cpu(t, false);  // device checks
  if (host.dim() != 0) {
    launchable = false;
    return host;
  }
  return host.unsafeGetTensorImpl()->is_wrapped_number() ? host : host.clone();
}
inline std::optional<at::Tensor> keep(DelegationCall& call,
                                      const std::optional<at::Tensor>& t,
                                      bool& launchable) {
  if (!t.has_value()) return std::nullopt;
  return keep(call, *t, launchable);
}
template <class T>
kept_t<T> keep(DelegationCall&, const T& value, bool&) {
  return own(value);
}

// Contiguous memory of `dtype` with no lazy conj/neg bit: what a kernel
// that reads raw memory (ember's own, an ATen stub) can take as it is.
inline bool plain_contiguous(const at::Tensor& t, at::ScalarType dtype) {
  return t.scalar_type() == dtype && t.is_contiguous() && !t.is_conj() &&
         !t.is_neg();
}

// A fresh ember tensor laid out as `meta` (the meta function's result).
at::Tensor empty_like_meta(const at::Tensor& meta, c10::DeviceIndex device);

// The CPU kernel of an out= overload, as launched work runs it. kSplitFree:
// its bits do not depend on its thread count, so a stream worker runs it on
// one thread (run_split_free). Only kernels whose vector and scalar loops
// compute the same bits qualify (mul, div, relu, argmax): measured 1 vs 2
// threads, CPU's fp32 tanh, tanh-GELU, add with alpha != 1 and softmax
// over an inner dimension differ (a split moves elements between a
// vector body and a scalar tail), and sums follow the split.
template <class OutOp, bool SplitFree = false>
struct OutForm {
  static constexpr bool kSplitFree = SplitFree;
  template <class... A>
  static void run(at::Tensor& out, const A&... args) {
    OutOp::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), args..., out);
  }
};
template <class OutOp>
using SplitFreeOutForm = OutForm<OutOp, /*SplitFree=*/true>;

// The out= form of a kernel ATen never splits below `kMaxNumel` result
// elements but may still run in a multi-thread region there: on a stream
// worker such calls take one thread (run_split_free), the same bits. CPU's
// fp32 erf GELU is oneDNN's eltwise, which opens a region at any size: an
// 8x8 GELU launched on the worker took 83-97 us against 9 us on one thread
// (2-core Zen 3 host); ATen's own GELU loop (bf16) splits only above 6144
// elements, and oneDNN's fp32 one gave the same bits on 1, 2 and 3 threads
// at every size measured (1 to 65536).
template <class OutOp, int64_t kMaxNumel>
struct SmallSplitFreeOutForm {
  template <class... A>
  static void run(at::Tensor& out, const A&... args) {
    const auto kernel = [&] {
      OutOp::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), args...,
                        out);
    };
    if (out.numel() <= kMaxNumel) {
      run_split_free(kernel);
    } else {
      kernel();
    }
  }
};

// The out= form of _softmax and _log_softmax. Along the last dimension
// CPU's kernel gives each row wholly to one thread, so its bits do not
// depend on the split (checked at 1, 2, 3 and 7 threads in
// tests/test_async_worker_pool.py), and a call below inline_result_numel()
// elements, which a stream worker runs, takes one thread there: a
// multi-thread region on the worker wakes the worker's own OpenMP pool
// (run_split_free), which made an 8x8 softmax cost 38-46 us instead of 3
// (2-core Zen 4 host). Up to kSerialRowsNumel elements one thread runs it
// wherever it runs: at the call too, the host team's region cost more than
// the rows (softmax launched at the call, 2-core Zen 3 host, medians: 8x8
// 5.9 -> 4.4 us, 16x128 6.5 -> 4.4, 12x340 8.6 -> 5.3; at 32x512 one
// thread was slower, 20.1 against 13.1). Other dims, and larger calls, as
// OutForm.
inline constexpr int64_t kSerialRowsNumel = 4096;
template <class OutOp>
struct RowwiseOutForm {
  static void run(at::Tensor& out, const at::Tensor& self, int64_t dim,
                  bool half_to_float) {
    const auto kernel = [&] {
      OutOp::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), self, dim,
                        half_to_float, out);
    };
    const bool along_rows =
        self.dim() > 0 &&
        c10::maybe_wrap_dim(dim, self.dim()) == self.dim() - 1;
    if (along_rows && out.numel() <= kSerialRowsNumel) {
      const kernels::SerialScope one_thread;
      kernel();
    } else if (along_rows && out.numel() < inline_result_numel()) {
      run_split_free(kernel);
    } else {
      kernel();
    }
  }
};

// The largest tensor argument and the first ember device among them, for
// tiny_work_at_call.
struct TinyScan {
  int64_t numel = 0;
  std::optional<c10::DeviceIndex> device;
  void add(const at::Tensor& t) {
    if (!t.defined()) return;
    numel = std::max(numel, t.numel());
    if (!device && t.is_privateuseone()) device = t.device().index();
  }
  void add(const std::optional<at::Tensor>& t) {
    if (t.has_value()) add(*t);
  }
  template <class T>
  void add(const T&) {}
};

// Whether a launched op over these arguments runs its synchronous form now:
// tensor operands of at most kTinyWorkNumel elements on an idle stream
// (idle_stream_for_tiny_work). A broadcast of tiny operands may give a
// larger result, which on an idle stream runs at the call anyway from
// inline_result_numel() elements up.
template <class... Args>
bool tiny_work_at_call(const Args&... args) {
  TinyScan scan;
  (scan.add(args), ...);
  return scan.device && scan.numel <= kTinyWorkNumel &&
         idle_stream_for_tiny_work(*scan.device, scan.numel) != nullptr;
}

// Whether a launched kernel form declares itself split-free (kSplitFree).
template <class Kernel>
constexpr bool split_free() {
  if constexpr (requires { Kernel::kSplitFree; }) {
    return Kernel::kSplitFree;
  } else {
    return false;
  }
}

// An op returning one new tensor. `Kernel::run(out, args...)` computes it
// into `out` (OutForm<its out= overload>, usually), `Meta::infer(args...)`
// returns the result's layout as a meta tensor.
template <class Op, class Kernel, class Meta, class... Args>
at::Tensor launched(Args... args) {
  // Synchronous, while a graph may capture: the same out= form runs at the
  // call and is recorded, so a replay writes the captured result in place.
  const bool recording = !launch_async() && capture::underway();
  if ((!launch_async() && !recording) || tiny_work_at_call(args...)) {
    return functional<Op, Args...>(args...);
  }
  at::Tensor out;
  {
    DelegationCall call(op_name<Op>(), /*accepts_cpu_tensors=*/false);
    bool launchable = true;
    std::tuple<kept_t<Args>...> kept{keep(call, args, launchable)...};
    call.settle();
    if (!launchable) return functional<Op, Args...>(args...);
    at::Tensor meta;
    try {
      meta = std::apply([](const auto&... a) { return Meta::infer(use(a)...); },
                        kept);
    } catch (const std::exception&) {
      // The synchronous kernel raises the error itself, in its own words.
      return functional<Op, Args...>(args...);
    }
    const c10::DeviceIndex device = call.device();
    out = empty_like_meta(meta, device);
    auto work = [kept = std::move(kept), out_cpu = cpu_alias(out)] {
      const auto run = [&] {
        std::apply(
            [&](const auto&... a) {
              Kernel::run(const_cast<at::Tensor&>(out_cpu), use(a)...);
            },
            kept);
      };
      // Complex products take other formulas in vector and scalar loops.
      if constexpr (split_free<Kernel>()) {
        out_cpu.is_complex() ? run() : run_split_free(run);
      } else {
        run();
      }
    };
    if (recording) {
      run_on_device_recorded(
          device, op_name<Op>(), [&] { work(); }, [&] { return work; });
      return out;
    }
    if (!launch_on_device(device, op_name<Op>().c_str(), std::move(work),
                          out.numel())) {
      return out;
    }
  }
  count_launch(op_name<Op>());
  return out;
}

// Reports the writes of a result made by make_out() (one tensor, or a tuple
// of them): it may be an out= argument (StorageWrites.h).
inline void note_result_writes(const at::Tensor& t) { note_storage_write(t); }
template <class... Ts>
void note_result_writes(const std::tuple<Ts...>& t) {
  std::apply([](const auto&... items) { (note_storage_write(items), ...); }, t);
}

// The element count of a result (one tensor, or the first of a tuple).
inline int64_t result_numel(const at::Tensor& t) { return t.numel(); }
template <class... Ts>
int64_t result_numel(const std::tuple<Ts...>& t) {
  return std::get<0>(t).numel();
}

// The CPU aliases of a result (one tensor, or a tuple of them).
inline at::Tensor cpu_aliases(const at::Tensor& t) { return cpu_alias(t); }
template <class... Ts>
std::tuple<Ts...> cpu_aliases(const std::tuple<Ts...>& t) {
  return std::apply(
      [](const auto&... items) {
        return std::tuple<Ts...>(cpu_alias(items)...);
      },
      t);
}

// launch_into's synchronous form while a graph may be capturing: the
// kernel runs at the call into the result, and a capturing stream records
// it (its arguments kept for replay as the synchronous paths keep them).
template <class Out, class MakeOut, class Kernel, class... Args>
Out record_into(const std::string& name, MakeOut&& make_out, Kernel kernel,
                const Args&... args) {
  DelegationCall call(name, /*accepts_cpu_tensors=*/false);
  std::tuple<std::decay_t<decltype(to_cpu(call, args, false))>...> cpu_args{
      to_cpu(call, args, false)...};
  call.settle();
  Out out = make_out();
  note_result_writes(out);
  const auto out_cpu = cpu_aliases(out);
  run_on_device_recorded(
      call.device(), name,
      [&] {
        std::apply([&](const auto&... a) { kernel(out_cpu, a...); }, cpu_args);
      },
      [&] {
        return [kernel, kept = replay_args(name, cpu_args, args...), out_cpu] {
          std::apply([&](const auto&... a) { kernel(out_cpu, use(a)...); },
                     kept);
        };
      });
  return out;
}

// ember's own op work whose results ember allocates before it runs (a GEMM,
// a convolution, a norm or pooling of known output shape). `make_out()`
// gives the result on the device (allocated on the calling thread, or an
// out= argument; a tensor or a tuple of them) and `kernel(out_aliases,
// args...)` writes it, where it may copy a kernel's fresh result in when
// the library allocates its own (oneDNN's packed GEMM):
//  - with asynchronous execution on, the kernel is queued (launched);
//  - while the current stream captures a graph (asynchronous execution
//    off), it runs at the call and the graph records the same kernel into
//    the same result, so a replay writes the captured output in place
//    instead of copying a fresh result into it.
// Returns nullopt, having done nothing, where neither applies (the caller
// then runs its synchronous form), under verbose output, or where a host
// tensor argument would be read later. `name` (static storage) names the work
// in launch_stats(), errors and graph dumps.
template <class MakeOut, class Kernel, class... Args>
auto launch_into(const std::string& name, MakeOut&& make_out, Kernel kernel,
                 const Args&... args)
    -> std::optional<std::decay_t<decltype(make_out())>> {
  using Out = std::decay_t<decltype(make_out())>;
  // Verbose output names the kernel route each call takes, which only a
  // call that runs there can report: verbose calls stay synchronous (as the
  // GEMM engine's do).
  if (!launch_async() || flags::verbose_level() > 0) {
    if (!capture::underway()) return std::nullopt;
    return record_into<Out>(name, std::forward<MakeOut>(make_out),
                            std::move(kernel), args...);
  }
  Out out;
  {
    DelegationCall call(name, /*accepts_cpu_tensors=*/false);
    bool launchable = true;
    std::tuple<kept_t<Args>...> kept{keep(call, args, launchable)...};
    call.settle();
    if (!launchable) return std::nullopt;
    out = make_out();
    note_result_writes(out);
    if (!launch_on_device(
            call.device(), name.c_str(),
            [kept = std::move(kept), kernel = std::move(kernel),
             out_cpu = cpu_aliases(out)] {
              std::apply([&](const auto&... a) { kernel(out_cpu, use(a)...); },
                         kept);
            },
            result_numel(out))) {
      return out;
    }
  }
  count_launch(name);
  return out;
}

// An op that writes into its first argument. `Meta::infer(self,
// args...)` runs the op's in-place meta function on the alias of self (its
// checks: shapes, dtype casting, overlap), raising what the CPU kernel would.
// `work_numel`: the elements the kernel writes, which decides whether it
// runs at the call on an idle stream (launch_on_device); self's size where
// the op writes all of self.
template <class Op, class Meta, class... Args>
at::Tensor& launched_inplace_writing(int64_t work_numel, at::Tensor& self,
                                     Args... args) {
  if (!launch_async() ||
      (self.is_privateuseone() &&
       idle_stream_for_tiny_work(self.device().index(), work_numel))) {
    return inplace<Op, Args...>(self, args...);
  }
  {
    DelegationCall call(op_name<Op>(), /*accepts_cpu_tensors=*/false);
    at::Tensor self_cpu = call.to_cpu(self, /*written=*/true);
    bool launchable = true;
    std::tuple<kept_t<Args>...> kept{keep(call, args, launchable)...};
    call.settle();
    if (!launchable) return inplace<Op, Args...>(self, args...);
    try {
      std::apply([&](const auto&... a) { Meta::infer(self_cpu, use(a)...); },
                 kept);
    } catch (const std::exception&) {
      return inplace<Op, Args...>(self, args...);
    }
    const bool queued = launch_on_device(
        call.device(), op_name<Op>().c_str(),
        [kept = std::move(kept), self_cpu]() mutable {
          std::apply(
              [&](const auto&... a) {
                Op::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU),
                               self_cpu, use(a)...);
              },
              kept);
        },
        work_numel);
    if (!queued) return self;
  }
  count_launch(op_name<Op>());
  return self;
}

template <class Op, class Meta, class... Args>
at::Tensor& launched_inplace(at::Tensor& self, Args... args) {
  return launched_inplace_writing<Op, Meta, Args...>(self.numel(), self,
                                                     args...);
}

}  // namespace ember::unboxed
