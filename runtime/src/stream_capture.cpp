// Graph capture on streams (see stream.h and graph.h): a stream records
// its launches into a CapturedGraph instead of running them, streams that
// wait on a capturing stream's events join its capture, and device-wide
// waits that a capture forbids are refused.
#include <string>
#include <thread>
#include <vector>

#include "ember/runtime/graph.h"
#include "ember/runtime/stream.h"
#include "stream_internal.h"

namespace ember::runtime {

namespace {

// Streams capturing a graph, process-wide: synchronize_all must reach a
// capturing stream (to refuse the wait) even when nothing was ever queued.
std::atomic<int> capturing_streams{0};
// Of those, the ones whose capture forbids device-wide waits from every
// thread (CaptureMode::kGlobal).
std::atomic<int> global_mode_captures{0};

// A stream starts (+1) or stops (-1) capturing in `mode`.
void count_capture(CaptureMode mode, int delta) {
  if (mode == CaptureMode::kGlobal) {
    global_mode_captures.fetch_add(delta, std::memory_order_release);
  }
  capturing_streams.fetch_add(delta, std::memory_order_release);
}

}  // namespace

bool any_stream_capturing() {
  return capturing_streams.load(std::memory_order_acquire) != 0;
}

void Stream::begin_capture(std::shared_ptr<CapturedGraph> graph,
                           CaptureMode mode) {
  submit_held();  // launched before the capture: not part of the graph
  std::lock_guard<std::mutex> lock(mutex_);
  if (capture_ != nullptr) {
    throw CaptureError("stream " + std::to_string(id_) + " of device " +
                       std::to_string(device_index_) +
                       " is already capturing a graph");
  }
  graph->set_capturing(true, this);
  capture_ = std::move(graph);
  capture_mode_ = mode;
  capture_thread_ = std::this_thread::get_id();
  capture_raw_.store(capture_.get(), std::memory_order_release);
  count_capture(mode, +1);
}

std::shared_ptr<CapturedGraph> Stream::end_capture() {
  submit_held();  // recorded into the graph it was launched in
  std::shared_ptr<CapturedGraph> graph;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    capture_raw_.store(nullptr, std::memory_order_release);
    if (capture_ != nullptr) {
      capture_->set_capturing(false);
      count_capture(capture_mode_, -1);
    }
    graph = std::move(capture_);
  }
  // Outside this stream's lock: Event::block takes a joiner's lock and then
  // reads the origin's.
  if (graph != nullptr) {
    for (Stream* joined : graph->joined()) joined->leave_capture(graph.get());
  }
  return graph;
}

void Stream::join_capture(std::shared_ptr<CapturedGraph> graph,
                          Stream& origin) {
  CaptureMode mode;
  std::thread::id thread;
  {
    std::lock_guard<std::mutex> lock(origin.mutex_);
    mode = origin.capture_mode_;
    thread = origin.capture_thread_;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (capture_ != nullptr) return;  // already in a capture
  graph->add_joined(this);
  capture_ = std::move(graph);
  capture_mode_ = mode;
  capture_thread_ = thread;
  capture_raw_.store(capture_.get(), std::memory_order_release);
  count_capture(mode, +1);
}

void Stream::leave_capture(const CapturedGraph* graph) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (capture_.get() != graph) return;
  capture_raw_.store(nullptr, std::memory_order_release);
  count_capture(capture_mode_, -1);
  capture_.reset();
}

std::optional<CaptureMode> Stream::capture_forbidding_wait() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (capture_ == nullptr) return std::nullopt;
  const bool forbids = capture_mode_ == CaptureMode::kGlobal ||
                       (capture_mode_ == CaptureMode::kThreadLocal &&
                        capture_thread_ == std::this_thread::get_id());
  return forbids ? std::optional<CaptureMode>(capture_mode_) : std::nullopt;
}

void StreamPool::refuse_wait_during_capture(
    const std::vector<Stream*>& streams) const {
  if (!any_stream_capturing()) return;
  const auto refuse = [](const std::string& where, CaptureMode mode) {
    throw CaptureError(
        "operation not permitted when stream is capturing: a device-wide "
        "wait while " +
        where + " captures a graph with capture_error_mode=\"" +
        capture_mode_name(mode) +
        "\" (end the capture first, or capture with \"relaxed\")");
  };
  for (Stream* stream : streams) {
    if (const auto mode = stream->capture_forbidding_wait()) {
      refuse("stream " + std::to_string(stream->id()) + " of device " +
                 std::to_string(stream->device_index()),
             *mode);
    }
  }
  // A global-mode capture forbids the wait whatever device it is on.
  if (global_mode_captures.load(std::memory_order_acquire) > 0) {
    refuse("a stream of another device", CaptureMode::kGlobal);
  }
}

}  // namespace ember::runtime
