// Held work (stream.h: Stream::hold): elementwise units a launcher would
// have run at the call, kept until something else happens on the stream so
// that consecutive ones can run together range by range (the glue's
// HeldRunner), then run on the thread that needs them done, or queued as
// one unit ahead of the next queued work.
#include <atomic>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ember/runtime/stream.h"
#include "stream_internal.h"

namespace ember::runtime {

namespace {

// Most units a stream holds: a chain longer than this runs in parts (each
// unit keeps its result, and its operands, allocated until it has run).
constexpr std::size_t kMaxHeld = 16;

void run_each(std::vector<HeldWork>& units) {
  for (HeldWork& unit : units) unit.whole();
}

std::atomic<HeldRunner> held_runner{&run_each};

}  // namespace

void set_held_runner(HeldRunner runner) {
  held_runner.store(runner != nullptr ? runner : &run_each,
                    std::memory_order_release);
}

void Stream::hold(const char* name, Work whole,
                  std::shared_ptr<const RangeWork> ranges) {
  check_not_forked_broken();
  std::unique_lock<std::mutex> lock(mutex_);
  if ((pending_.load(std::memory_order_acquire) & kErrorFlag) != 0)
      [[unlikely]] {
    raise_pending_error(lock);  // as enqueue: reported, nothing held
  }
  if (shut_down_ || launch_blocking()) [[unlikely]] {
    lock.unlock();
    run(whole);
    return;
  }
  if (held_.size() >= kMaxHeld) run_held_here(lock);  // bounds what it keeps
  note_work_queued();
  held_.push_back(HeldWork{name, std::move(whole), std::move(ranges)});
  held_count_.fetch_add(1, std::memory_order_release);
  pending_.fetch_add(1, std::memory_order_release);
}

// Caller holds mutex_.
Stream::Work Stream::take_held_as_work(std::size_t& units) {
  units = held_.size();
  held_count_.store(0, std::memory_order_release);
  return [held = std::move(held_)]() mutable {
    held_runner.load(std::memory_order_acquire)(held);
  };
}

// Caller holds `lock` on mutex_; released while the work runs.
void Stream::run_held_here(std::unique_lock<std::mutex>& lock) {
  // Held work another thread runs (a device-wide wait reaches every
  // stream) comes first: what was held after it depends on it.
  if (held_running_) {
    ++event_waiters_;  // woken by every unit's end (worker and held runs)
    done_cv_.wait(lock, [this] { return !held_running_; });
    --event_waiters_;
  }
  if (held_.empty()) return;
  const char* name = held_.front().name;
  std::size_t units = 0;
  Work work = take_held_as_work(units);
  held_running_ = true;
  lock.unlock();
  std::string error;
  try {
    work();
  } catch (const std::exception& e) {
    error = e.what();
  } catch (...) {
    error = "unknown exception";
  }
  work = nullptr;  // the units' captures released outside the lock
  lock.lock();
  held_running_ = false;
  work_cv_.notify_all();  // a worker holding back queued work behind it
  if (!error.empty() && error_.empty()) {
    error_ = "ember:" + std::to_string(device_index_) + " stream " +
             std::to_string(id_) + ": asynchronous error in " +
             (name != nullptr ? name : "held work") + ": " + error;
    pending_.fetch_or(kErrorFlag, std::memory_order_release);
  }
  completed_.fetch_add(units, std::memory_order_relaxed);
  const int64_t left = (pending_.fetch_sub(static_cast<int64_t>(units),
                                           std::memory_order_release) -
                        static_cast<int64_t>(units)) &
                       ~kErrorFlag;
  if (event_waiters_ > 0 || (left == 0 && idle_waiters_ > 0)) {
    done_cv_.notify_all();
  }
}

void Stream::run_held() {
  std::unique_lock<std::mutex> lock(mutex_);
  run_held_here(lock);
}

}  // namespace ember::runtime
