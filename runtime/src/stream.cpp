// Streams and events. Execution is synchronous (see stream.h), so the only
// state here is bookkeeping: which streams exist, which one is current on
// each thread, and where and when an event was recorded.
#include "ember/runtime/stream.h"

#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace ember::runtime {

namespace {

std::atomic<uint64_t> next_pool_serial{0};

// Current stream id of each pool on this thread; pools this thread never
// set a stream on are absent and use the default stream.
std::unordered_map<uint64_t, StreamId>& current_stream_ids() {
  thread_local std::unordered_map<uint64_t, StreamId> ids;
  return ids;
}

}  // namespace

Stream::Stream(int device_index, StreamId id, int priority)
    : device_index_(device_index), id_(id), priority_(priority) {}

StreamPool::StreamPool(int device_index)
    : device_index_(device_index),
      serial_(next_pool_serial.fetch_add(1, std::memory_order_relaxed)) {
  streams_.push_back(
      std::make_unique<Stream>(device_index_, kDefaultStreamId, 0));
  default_stream_ = streams_.front().get();
}

Stream& StreamPool::create(int priority) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto id = static_cast<StreamId>(streams_.size());
  streams_.push_back(std::make_unique<Stream>(device_index_, id, priority));
  return *streams_.back();
}

Stream& StreamPool::get(StreamId id) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (id < 0 || id >= static_cast<StreamId>(streams_.size())) {
    throw std::out_of_range("ember:" + std::to_string(device_index_) +
                            " has no stream with id " + std::to_string(id) +
                            " (" + std::to_string(streams_.size()) +
                            " stream(s) created)");
  }
  // Deque elements never move, so the reference outlives the lock.
  return *streams_[static_cast<std::size_t>(id)];
}

Stream& StreamPool::current() {
  const auto& ids = current_stream_ids();
  // Hot path of every op: no stream was ever made current on this thread.
  if (ids.empty()) return *default_stream_;
  const auto it = ids.find(serial_);
  return get(it == ids.end() ? kDefaultStreamId : it->second);
}

void StreamPool::set_current(StreamId id) {
  get(id);  // validates
  if (id == kDefaultStreamId) {
    current_stream_ids().erase(serial_);  // keeps current()'s fast path
  } else {
    current_stream_ids()[serial_] = id;
  }
}

void StreamPool::synchronize_all() {
  // Snapshot so synchronizing (which may wait on work that creates streams
  // once execution is asynchronous) does not hold the lock.
  std::vector<Stream*> streams;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    streams.reserve(streams_.size());
    for (const auto& stream : streams_) streams.push_back(stream.get());
  }
  for (Stream* stream : streams) stream->synchronize();
}

void Event::record(const Stream& stream) {
  recorded_ = true;
  device_index_ = stream.device_index();
  position_ = stream.completed();
  if (enable_timing_) time_ = Clock::now();
}

double Event::elapsed_ms(const Event& end) const {
  if (!enable_timing_ || !end.enable_timing_) {
    throw std::logic_error(
        "Both events must be created with enable_timing=True to measure "
        "elapsed time");
  }
  if (!recorded_ || !end.recorded_) {
    throw std::logic_error(
        "Both events must be recorded before calculating elapsed time");
  }
  if (device_index_ != end.device_index_) {
    throw std::logic_error("Events were recorded on different devices (ember:" +
                           std::to_string(device_index_) + " and ember:" +
                           std::to_string(end.device_index_) + ")");
  }
  return std::chrono::duration<double, std::milli>(end.time_ - time_).count();
}

}  // namespace ember::runtime
