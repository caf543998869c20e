// Streams and events of an ember device. A stream is an ordered queue of
// work executed by the device's execution engine; an event marks a point in
// a stream. Plain C++, no torch headers.
//
// Execution is synchronous today: Stream::run executes the work inline, so
// every recorded event is complete when record() returns. Op registrations
// only ever call Stream::run, so an asynchronous engine replaces the inside
// of this class without touching them.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <utility>

namespace ember::runtime {

using StreamId = int64_t;
inline constexpr StreamId kDefaultStreamId = 0;

class Stream final {
 public:
  Stream(int device_index, StreamId id, int priority);
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  int device_index() const { return device_index_; }
  StreamId id() const { return id_; }
  int priority() const { return priority_; }

  // Executes one unit of work in stream order.
  template <class Work>
  void run(Work&& work) {
    std::forward<Work>(work)();
    completed_.fetch_add(1, std::memory_order_relaxed);
  }

  // Counter of work units completed; events record a position in it.
  uint64_t completed() const {
    return completed_.load(std::memory_order_relaxed);
  }
  bool query() const { return true; }  // all submitted work is done
  void synchronize() {}

 private:
  const int device_index_;
  const StreamId id_;
  const int priority_;
  std::atomic<uint64_t> completed_{0};
};

// The streams of one device. Stream 0 is the default stream; new streams
// get increasing ids. The current stream is per thread and per device.
class StreamPool final {
 public:
  explicit StreamPool(int device_index);
  StreamPool(const StreamPool&) = delete;
  StreamPool& operator=(const StreamPool&) = delete;

  Stream& default_stream() { return *default_stream_; }
  Stream& create(int priority = 0);
  // Throws std::out_of_range for an id this pool never handed out.
  Stream& get(StreamId id);
  Stream& current();
  void set_current(StreamId id);
  void synchronize_all();

  // fork() support, as CachingAllocator::lock_for_fork.
  void lock_for_fork() { mutex_.lock(); }
  void unlock_after_fork() { mutex_.unlock(); }

 private:
  const int device_index_;
  // Process-unique, never reused: keys this pool's per-thread current
  // stream, so a pool created later at the same address starts fresh.
  const uint64_t serial_;
  mutable std::mutex mutex_;
  std::deque<std::unique_ptr<Stream>> streams_;  // index == id
  Stream* default_stream_;  // streams_[0], readable without the lock
};

class Event final {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Event(bool enable_timing = false) : enable_timing_(enable_timing) {}

  void record(const Stream& stream);
  bool recorded() const { return recorded_; }
  bool query() const { return true; }  // synchronous engine: always done
  void synchronize() const {}
  // Makes `stream` wait for this event (a no-op while execution is
  // synchronous, kept so callers express the dependency).
  void block(Stream& stream) const { (void)stream; }
  // Milliseconds from this event to `end`. Throws std::logic_error if either
  // event was not recorded or was created without timing.
  double elapsed_ms(const Event& end) const;
  int device_index() const { return device_index_; }
  bool timing_enabled() const { return enable_timing_; }

 private:
  bool enable_timing_;
  bool recorded_ = false;
  int device_index_ = -1;
  uint64_t position_ = 0;
  Clock::time_point time_{};
};

}  // namespace ember::runtime
