// Events (see stream.h): markers in a stream's queue. Recording on an idle
// stream completes at once; otherwise the worker completes the marker when
// it reaches it. A cross-stream wait is a marker that blocks the waiting
// stream's worker until the event completes; the host does not wait.
#include <chrono>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "ember/runtime/graph.h"
#include "ember/runtime/stream.h"
#include "stream_internal.h"

namespace ember::runtime {

void Event::record(Stream& stream) {
  stream.submit_held();  // the event follows it
  auto state = std::make_shared<EventState>();
  device_index_ = stream.device_index();
  stream_ = &stream;
  captured_in_.reset();
  {
    std::lock_guard<std::mutex> lock(stream.mutex_);
    if (stream.capture_ != nullptr) [[unlikely]] {
      captured_in_ = stream.capture_;
      captured_at_ = captured_in_->submitted_by(&stream);
    }
    if (!stream.work_queued() || stream.worker_ == nullptr) {
      state->time = Clock::now();
      state->done.store(true, std::memory_order_release);
    } else {
      stream.push(Stream::Item{"event record",
                               [state] {
                                 state->time = Clock::now();
                                 state->done.store(true,
                                                   std::memory_order_release);
                               },
                               true});
    }
  }
  state_ = std::move(state);
  (void)enable_timing_;
}

bool Event::query() const {
  return state_ == nullptr || state_->done.load(std::memory_order_acquire);
}

void Event::synchronize() const {
  if (state_ == nullptr) return;
  Stream::note_host_wait();
  if (!state_->done.load(std::memory_order_acquire)) stream_->wait_for(*state_);
  std::unique_lock<std::mutex> lock(stream_->mutex_);
  stream_->raise_pending_error(lock);
}

void Event::block(Stream& stream) const {
  stream.submit_held();  // launched before the wait: not held behind it
  if (captured_in_ != nullptr && captured_in_->capturing()) [[unlikely]] {
    // Cross-stream capture: a stream outside any capture joins this one
    // (fork); the origin waiting on a joined stream's event joins it back.
    CapturedGraph* current = stream.capture();
    Stream* origin = captured_in_->origin();
    if (current == nullptr && origin != nullptr) {
      stream.join_capture(captured_in_, *origin);
    } else if (current == captured_in_.get() && &stream == origin) {
      captured_in_->note_joined_back(stream_, captured_at_);
    }
  }
  if (state_ == nullptr || state_->done.load(std::memory_order_acquire) ||
      stream_ == &stream) {
    return;  // nothing to wait for, or already ordered by the stream
  }
  check_not_forked_broken();
  Stream* source = stream_;
  std::shared_ptr<EventState> state = state_;
  std::lock_guard<std::mutex> lock(stream.mutex_);
  if (stream.shut_down_) return;  // exiting: work runs inline, in order
  stream.push(Stream::Item{
      "wait_event", [source, state] { source->wait_for(*state); }, true});
}

double Event::elapsed_ms(const Event& end) const {
  if (!enable_timing_ || !end.enable_timing_) {
    throw std::logic_error(
        "Both events must be created with enable_timing=True to measure "
        "elapsed time");
  }
  if (!recorded() || !end.recorded()) {
    throw std::logic_error(
        "Both events must be recorded before calculating elapsed time");
  }
  if (device_index_ != end.device_index_) {
    throw std::logic_error("Events were recorded on different devices (ember:" +
                           std::to_string(device_index_) + " and ember:" +
                           std::to_string(end.device_index_) + ")");
  }
  if (!query() || !end.query()) {
    throw std::logic_error(
        "Both events must be completed before calculating elapsed time "
        "(synchronize the end event first)");
  }
  return std::chrono::duration<double, std::milli>(end.state_->time -
                                                   state_->time)
      .count();
}

}  // namespace ember::runtime
