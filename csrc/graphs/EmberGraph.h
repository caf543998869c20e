// torch.ember graphs: ember's implementation of PyTorch's accelerator graph
// interface (at::GraphImplInterface), so torch.accelerator.Graph and
// torch.ember.EmberGraph capture and replay ember work.
//
// capture_begin, on the current stream of the current device (never the
// default stream, as CUDA): the stream starts recording (runtime/graph.h),
// the calling thread's allocations on the device go to the graph's private
// pool, and the device generator's state is saved. Capture runs the work
// once while recording it; capture_end restores the generator state (so
// capture consumes no random numbers: replays draw them as the eager steps
// would). replay queues every recorded unit on the current stream as one
// unit of work, having reported the storages the capture wrote (in place:
// a weight an optimizer step updates) as written, so that ember's caches of
// them (packed weights) see the replay's writes. reset drops the units and
// the graph's use of its pool.
#pragma once

#include <ATen/core/GraphImplInterface.h>
#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ember/runtime/graph.h"
#include "ember/runtime/stream.h"
#include "ops/StorageWrites.h"

namespace ember {

class EmberGraphImpl final : public at::GraphImplInterface {
 public:
  explicit EmberGraphImpl(const at::GraphImplArgs& args = {});
  ~EmberGraphImpl() override;

  void capture_begin(
      at::MempoolId_t pool = {0, 0},
      at::GraphCaptureMode mode = at::GraphCaptureMode::Default) override;
  void capture_end() override;
  void instantiate() override {}  // a recorded graph is ready to replay
  void replay() override;
  void reset() override;
  at::MempoolId_t pool() const override;
  void enable_debug_mode() override { debug_ = true; }
  // Writes the recorded units' names, one per line.
  void debug_dump(const std::string& path) override;

  // Recorded units (tests, debugging).
  std::vector<std::string> unit_names() const;

 private:
  void end_capture_state();

  int device_ = -1;
  runtime::StreamId stream_ = -1;
  std::shared_ptr<runtime::CapturedGraph> graph_;
  uint64_t pool_ = 0;  // the private pool's number; 0: none yet
  bool capturing_ = false;
  runtime::CaptureMode mode_ = runtime::CaptureMode::kGlobal;
  std::thread::id
      begin_thread_;  // capture_end must come from it unless relaxed
  bool debug_ = false;
  at::Tensor rng_state_;  // the generator's state at capture_begin
  // The storages the capture wrote (recorded on the capturing thread).
  std::shared_ptr<StorageWriteRecording> writes_;
};

}  // namespace ember
