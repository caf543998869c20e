#include "observe/OpLog.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <pthread.h>

#include <chrono>
#include <cstdio>
#include <mutex>
#include <optional>
#include <sstream>

#include "flags/BackendFlags.h"
#include "observe/ExecutionPath.h"

namespace ember::observe {
namespace {

bool on_ember(const c10::IValue& value) {
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    return t.defined() && t.is_privateuseone();
  }
  if (value.isTensorList()) {
    for (const at::Tensor& t : value.toTensorList().vec()) {
      if (t.defined() && t.is_privateuseone()) return true;
    }
    return false;
  }
  if (value.isDevice()) {
    return value.toDevice().type() == c10::DeviceType::PrivateUse1;
  }
  return false;
}

void describe(std::ostringstream& out, const c10::IValue& value) {
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    if (!t.defined()) {
      out << "undefined";
      return;
    }
    out << c10::toString(t.scalar_type()) << t.sizes();
    if (!t.is_privateuseone()) out << "@" << t.device();
  } else if (value.isTensorList()) {
    out << "[";
    bool first = true;
    for (const at::Tensor& t : value.toTensorList().vec()) {
      if (!first) out << ", ";
      first = false;
      out << c10::toString(t.scalar_type()) << t.sizes();
    }
    out << "]";
  } else if (value.isNone()) {
    out << "None";
  } else if (value.isScalar() || value.isIntList() || value.isBool() ||
             value.isDevice() || value.isString()) {
    out << value;
  } else {
    out << value.tagKind();
  }
}

struct OpFrame : at::ObserverContext {
  std::chrono::steady_clock::time_point start;
  std::string arguments;
  ExecutionPath saved_path;
  const char* saved_route;
  int depth;
};

thread_local int t_depth = 0;

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  const auto inputs = fn.inputs();
  bool ember = false;
  for (const c10::IValue& value : inputs) ember = ember || on_ember(value);
  if (!ember) return nullptr;
  auto frame = std::make_unique<OpFrame>();
  std::ostringstream args;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (i > 0) args << ", ";
    describe(args, inputs[i]);
  }
  frame->arguments = args.str();
  frame->saved_path = t_path;
  frame->saved_route = t_route;
  frame->depth = t_depth++;
  t_path = ExecutionPath::kUnmarked;
  t_route = nullptr;
  frame->start = std::chrono::steady_clock::now();
  return frame;
}

const char* path_name(ExecutionPath path, const at::RecordFunction& fn) {
  switch (path) {
    case ExecutionPath::kNative:
      return "native";
    case ExecutionPath::kDelegated:
      return "delegated";
    case ExecutionPath::kCopied:
      return "copied";
    case ExecutionPath::kUnmarked:
      break;
  }
  // Unmarked: one of ember's own kernels (factories, views, copies) when
  // the op has an ember registration, else a composite of logged ops.
  const auto op = fn.operator_name();
  if (op.has_value()) {
    const auto handle = c10::Dispatcher::singleton().findOp(*op);
    if (handle.has_value() &&
        !handle->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) {
      return "composite";
    }
  }
  return "native";
}

std::mutex& output_mutex() {
  static std::mutex mutex;
  return mutex;
}

// fork(): a child must not inherit the output lock held by a thread it does
// not have (another thread printing a log line). A leaf: log lines are
// written outside the allocator's lock.
//
// The prepare step also builds the forking thread's RecordFunction state:
// PyTorch builds it on a thread's first op under a process-wide mutex, so a
// thread that forks before its first op would build it in the child, where
// that mutex may be held forever by a parent thread that was building its
// own (a child hung in its first op about once in eight forks taken while
// fresh threads started running ops).
void before_fork() {
  (void)at::getStepCallbacksUnlessEmpty(at::RecordScope::FUNCTION);
  output_mutex().lock();
}

const bool fork_handlers_installed = [] {
  return pthread_atfork(
             before_fork, [] { output_mutex().unlock(); },
             [] { output_mutex().unlock(); }) == 0;
}();

void on_end(const at::RecordFunction& fn, at::ObserverContext* context) {
  auto* frame = static_cast<OpFrame*>(context);
  if (frame == nullptr) return;
  const double us = std::chrono::duration<double, std::micro>(
                        std::chrono::steady_clock::now() - frame->start)
                        .count();
  const char* path = path_name(t_path, fn);
  const char* route = t_route;
  t_path = frame->saved_path;
  t_route = frame->saved_route;
  t_depth = frame->depth;
  std::lock_guard<std::mutex> lock(output_mutex());
  std::fprintf(stderr, "[ember] %*s%s(%s) %s%s%s %.1f us\n", 2 * frame->depth,
               "", fn.name(), frame->arguments.c_str(), path,
               route != nullptr ? " " : "", route != nullptr ? route : "", us);
}

std::mutex& install_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::optional<at::CallbackHandle> g_handle;

}  // namespace

void sync_op_log() {
  std::lock_guard<std::mutex> lock(install_mutex());
  const bool want = flags::verbose_level() > 0;
  if (want && !g_handle.has_value()) {
    g_handle =
        at::addGlobalCallback(at::RecordFunctionCallback(&on_start, &on_end)
                                  .needsInputs(true)
                                  .scopes({at::RecordScope::FUNCTION}));
  } else if (!want && g_handle.has_value()) {
    at::removeCallback(*g_handle);
    g_handle.reset();
  }
}

void log_allocation(int device, size_t bytes, const void* ptr) {
  std::lock_guard<std::mutex> lock(output_mutex());
  std::fprintf(stderr, "[ember] alloc ember:%d %zu bytes at %p\n", device,
               bytes, ptr);
}

void log_free(int device, const void* ptr) {
  std::lock_guard<std::mutex> lock(output_mutex());
  std::fprintf(stderr, "[ember] free ember:%d %p\n", device, ptr);
}

}  // namespace ember::observe
