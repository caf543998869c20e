// Graph capture on the op side (torch.ember graphs; the engine's part is
// runtime/graph.h). While the current stream of a device captures, every
// unit of op work submitted to it must be recorded in a form that can run
// again on the stream's worker with no host work:
//  - launched work (DeviceScope.h: launch_on_device) is recorded by the
//    stream itself: its closure already owns its arguments and writes into
//    results allocated before it runs;
//  - ops with a launched form record it also when they run synchronously
//    (ops/LaunchedOps.h): their kernel writes the captured result in place;
//  - other synchronous work is recorded by the delegation paths that can
//    give a replayable form (run_on_device_recorded): the op's CPU kernel
//    called again on the same aliases, its fresh results copied into the
//    tensors capture returned;
//  - anything else refuses with a RuntimeError naming the op, so a graph
//    never replays a partial program.
// Capture also runs the work once, so tensors hold real values afterwards.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <atomic>
#include <string_view>

#include "ember/runtime/graph.h"
#include "ops/StorageWrites.h"

namespace ember::capture {

// Captures in progress in the process: the check every op makes first.
inline std::atomic<int> g_captures_underway{0};
inline bool underway() {
  return g_captures_underway.load(std::memory_order_relaxed) != 0;
}

// The graph the current stream of `device` records into, or nullptr.
runtime::CapturedGraph* graph_for(c10::DeviceIndex device);

// A stable C string for a unit's name (op names of the boxed path live in
// per-thread tables).
const char* interned(std::string_view name);

// Raises the RuntimeError for op work that cannot be recorded.
[[noreturn]] void refuse(std::string_view op, std::string_view reason);

// A replayed op's result into the tensor (or list) that capture returned,
// unless the kernel wrote it there already (in-place, out=, a view).
void store_result(const at::Tensor& captured, const at::Tensor& fresh);
void store_result(const c10::IValue& captured, const c10::IValue& fresh);

// An argument a replay may keep: a host tensor with elements is refused (a
// graph would read its memory at every replay, after the program may have
// changed or freed it: CUDA refuses pageable host reads during capture);
// a 0-dim host tensor is a scalar, copied now.
at::Tensor keep_for_replay(const at::Tensor& original, const at::Tensor& alias,
                           std::string_view op);

// A weight that a captured kernel reads through a pack (a copy taken when
// it was packed): its version at capture, so a replay can tell whether the
// weight was written since and compute from its memory instead. Empty
// (nothing watched) unless a capture is underway.
struct WatchedWeight {
  at::Tensor weight;      // the ember tensor
  at::Tensor weight_cpu;  // its CPU alias, for the unpacked route
  int64_t version = 0;
  StorageWriteWatch writes;  // through aliases with counters of their own

  static WatchedWeight of(const at::Tensor& weight);
  bool written_since() const;
};

}  // namespace ember::capture
