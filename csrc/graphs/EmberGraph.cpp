#include "graphs/EmberGraph.h"

#include <c10/util/Exception.h>

#include <fstream>
#include <sstream>

#include "core/EmberAllocator.h"
#include "core/EmberGenerator.h"
#include "core/RuntimeErrors.h"
#include "ember/runtime/device.h"
#include "flags/BackendFlags.h"
#include "graphs/GraphCapture.h"
#include "ops/DeviceScope.h"

namespace ember {
namespace rt = ember::runtime;

EmberGraphImpl::EmberGraphImpl(const at::GraphImplArgs& /*args*/) {}

EmberGraphImpl::~EmberGraphImpl() {
  try {
    if (capturing_) capture_end();
    reset();
  } catch (...) {
    // Destruction never throws; a failed capture was reported already.
  }
}

namespace {

rt::CaptureMode runtime_mode(at::GraphCaptureMode mode) {
  switch (mode) {
    case at::GraphCaptureMode::ThreadLocal:
      return rt::CaptureMode::kThreadLocal;
    case at::GraphCaptureMode::Relaxed:
      return rt::CaptureMode::kRelaxed;
    case at::GraphCaptureMode::Default:  // torch.cuda.graph's default
    case at::GraphCaptureMode::Global:
      break;
  }
  return rt::CaptureMode::kGlobal;
}

}  // namespace

void EmberGraphImpl::capture_begin(at::MempoolId_t pool,
                                   at::GraphCaptureMode mode) {
  TORCH_CHECK(!capturing_, "This EmberGraph is already capturing");
  TORCH_CHECK(graph_ == nullptr,
              "This EmberGraph instance already owns a captured graph. To "
              "capture a new graph, create a new instance or call reset() "
              "first.");
  TORCH_CHECK_VALUE(pool.first == 0, "ember: not a graph pool id: (",
                    pool.first, ", ", pool.second, "); pools are (0, n)");
  const int device = rt::current_device();
  rt::Stream& stream = rt::device(device).streams().current();
  TORCH_CHECK(stream.id() != rt::kDefaultStreamId,
              "ember graphs must be captured on a non-default stream. "
              "(However, after capture, it's ok to replay them on the default "
              "stream.) torch.ember.graph(...) makes a side stream for you.");
  const uint64_t number = pool.second != 0 ? pool.second : new_pool_number();
  rt::CachingAllocator& allocator = rt::device(device).allocator();
  translate_runtime_errors([&] {
    allocator.create_pool(number);  // the graph's use of it
    allocator.begin_allocate_to_pool(number);
  });
  rng_state_ = at::Tensor(
      default_generator(static_cast<c10::DeviceIndex>(device)).get_state());
  auto graph = std::make_shared<rt::CapturedGraph>();
  try {
    translate_runtime_errors(
        [&] { stream.begin_capture(graph, runtime_mode(mode)); });
  } catch (...) {
    allocator.end_allocate_to_pool(number);
    allocator.release_pool(number);
    throw;
  }
  capture::g_captures_underway.fetch_add(1, std::memory_order_relaxed);
  device_ = device;
  stream_ = stream.id();
  graph_ = std::move(graph);
  pool_ = number;
  mode_ = runtime_mode(mode);
  begin_thread_ = std::this_thread::get_id();
  writes_ = std::make_shared<StorageWriteRecording>();
  writes_->begin();
  capturing_ = true;
}

void EmberGraphImpl::end_capture_state() {
  rt::Device& device = rt::device(device_);
  std::shared_ptr<rt::CapturedGraph> ended =
      device.streams().get(stream_).end_capture();
  capture::g_captures_underway.fetch_sub(1, std::memory_order_relaxed);
  capturing_ = false;
  writes_->end();
  device.allocator().end_allocate_to_pool(pool_);
  at::Generator generator =
      default_generator(static_cast<c10::DeviceIndex>(device_));
  generator.set_state(rng_state_);
  rng_state_ = at::Tensor();
  (void)ended;
}

void EmberGraphImpl::capture_end() {
  TORCH_CHECK(capturing_,
              "capture_end() called on an EmberGraph that is not "
              "capturing (call capture_begin first)");
  // The capture stays underway: the graph pool's allocation route belongs
  // to the thread that began it and ends only there (CUDA's relaxed mode
  // may end a capture elsewhere; ember's routes are per thread).
  TORCH_CHECK(std::this_thread::get_id() == begin_thread_,
              "ember: capture_end() must run on the thread that called "
              "capture_begin() (capture_error_mode \"",
              rt::capture_mode_name(mode_),
              "\"; ember routes a capture's allocations per thread, in every "
              "mode). The capture is still underway.");
  const rt::StreamId current =
      rt::device(rt::current_device()).streams().current().id();
  const bool same_stream =
      rt::current_device() == device_ && current == stream_;
  std::vector<rt::Stream*> unjoined = graph_->unjoined();
  end_capture_state();
  if (!unjoined.empty()) {
    graph_->clear();  // invalidated, as CUDA's unjoined capture
    std::ostringstream ids;
    for (const rt::Stream* s : unjoined) ids << " " << s->id();
    TORCH_CHECK(false, "Capture ended with work on stream(s)", ids.str(),
                " of ember:", device_,
                " that joined it (they waited on an event recorded during "
                "the capture) and were not joined back: record an event on "
                "each after its last work and make the capturing stream "
                "wait on it before capture_end()");
  }
  TORCH_CHECK(same_stream,
              "Capture must end on the same stream it began on "
              "(device ",
              device_, ", stream ", stream_, ").");
  // The capture's own run of the work finishes before the graph is used.
  translate_runtime_errors(
      [&] { rt::device(device_).streams().get(stream_).synchronize(); });
  TORCH_CHECK(graph_->size() > 0,
              "ember graph capture recorded no work: nothing ran on the "
              "capturing stream between capture_begin and capture_end");
}

void EmberGraphImpl::replay() {
  TORCH_CHECK(!capturing_, "replay() of an EmberGraph that is still capturing");
  TORCH_CHECK(graph_ != nullptr && graph_->size() > 0,
              "replay() of an EmberGraph with no captured graph (capture "
              "first, or the graph was reset)");
  rt::Stream& stream = rt::device(device_).streams().current();
  // Reported at the call, as an eager op's writes are: a GEMM called after
  // it on the host sees its weight written and reads the weight's memory in
  // stream order (after the replay) instead of a stale pack.
  writes_->report();
  // With asynchronous execution off (the default on one core) the replay
  // runs on the calling thread, as every op then does: a hand-off to the
  // worker would cost more than the host work it saves.
  translate_runtime_errors([&] {
    stream.submit_held();  // its state decides
    // Queued as one unit, except where an eager op would run at the call:
    // on an idle stream whose worker sleeps, the worker's wake-up (~150 us
    // on a halted vCPU) costs more than a small replay (a batch-1 MLP's,
    // ~12 us), and the host only waits for it.
    if (flags::async_execution() && !runs_at_call(stream, /*result_numel=*/0)) {
      graph_->replay(stream);
    } else {
      // Each recorded unit sets its launching thread count (a device's
      // cores): set back afterwards, as for launched work run at the call.
      RestoreThreadCount restore;
      graph_->replay_inline(stream);
    }
  });
}

void EmberGraphImpl::reset() {
  if (capturing_) end_capture_state();
  if (graph_ != nullptr) {
    // Queued replays keep their units; the graph's own hold goes now.
    graph_->clear();
    graph_.reset();
  }
  writes_.reset();
  if (pool_ != 0) {
    rt::CachingAllocator& allocator = rt::device(device_).allocator();
    allocator.release_pool(pool_);
    rt::device(device_).streams().collect_finished();
    allocator.empty_cache(pool_);
    pool_ = 0;
  }
}

at::MempoolId_t EmberGraphImpl::pool() const {
  TORCH_CHECK(pool_ != 0, "pool() of an EmberGraph that has not captured");
  return {0, pool_};
}

void EmberGraphImpl::debug_dump(const std::string& path) {
  TORCH_CHECK(debug_, "debug_dump needs enable_debug_mode() before capture");
  std::ofstream out(path);
  TORCH_CHECK(out.good(), "cannot write ", path);
  for (const std::string& name : unit_names()) out << name << "\n";
}

std::vector<std::string> EmberGraphImpl::unit_names() const {
  return graph_ == nullptr ? std::vector<std::string>{} : graph_->names();
}

}  // namespace ember

// torch.accelerator.Graph finds the implementation by the device type's
// upper-case name.
namespace at {
REGISTER_GRAPH_IMPL(EMBER, ember::EmberGraphImpl);
}  // namespace at
