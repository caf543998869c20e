// Streams: the execution engine (see stream.h). Each stream owns a FIFO
// queue and, once work is queued, one worker thread pinned to the device's
// cores. Events (event.cpp) are markers in that queue.
#include "ember/runtime/stream.h"

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>

#include <cstdlib>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "ember/runtime/device.h"
#include "ember/runtime/graph.h"
#include "named_thread.h"
#include "stream_internal.h"

namespace ember::runtime {

namespace {

std::atomic<uint64_t> next_pool_serial{0};
std::atomic<WorkerStartHook> worker_start_hook{nullptr};
std::atomic<bool> forked_broken{false};
// Set by the first queued work of the process: until then every stream is
// idle and synchronize_all has nothing to wait for (the common synchronous
// case pays one load per host read).
std::atomic<bool> any_work_queued{false};

// Current stream id of each pool on this thread; pools this thread never
// set a stream on are absent and use the default stream.
std::unordered_map<uint64_t, StreamId>& current_stream_ids() {
  thread_local std::unordered_map<uint64_t, StreamId> ids;
  return ids;
}

// How long a worker whose queue ran empty, or a host thread waiting for a
// stream, polls before sleeping on its condition variable: ops launched
// back to back (a model's forward) then cost no futex wake-up. Short
// enough that an idle device gives its cores back at once.
constexpr auto kSpinBeforeSleep = std::chrono::microseconds(50);

// Most units of work a stream queues before enqueue() waits: deep enough
// for the host to run a few layers ahead of the worker.
constexpr std::size_t kMaxQueued = 128;

template <class Done>
void spin_until(Done&& done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpinBeforeSleep;
  for (int i = 1;; ++i) {
    if (done()) return;
    _mm_pause();
    if ((i & 63) == 0 && std::chrono::steady_clock::now() > deadline) return;
  }
}

void pin_to_cores(const std::vector<int>& cores) {
  if (cores.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int core : cores) {
    if (core >= 0 && core < CPU_SETSIZE) CPU_SET(core, &set);
  }
  // Best effort: a core taken away from the process since start-up leaves
  // the worker where it is.
  (void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

}  // namespace

namespace {
thread_local bool t_in_stream_worker = false;
}  // namespace

void check_not_forked_broken() {
  if (forked_broken.load(std::memory_order_acquire)) [[unlikely]] {
    throw ForkedWithWorkInFlight();
  }
}

bool in_stream_worker() { return t_in_stream_worker; }

void set_worker_start_hook(WorkerStartHook hook) {
  worker_start_hook.store(hook, std::memory_order_release);
}

bool forked_with_work_in_flight() {
  return forked_broken.load(std::memory_order_acquire);
}

void mark_forked_with_work_in_flight() {
  forked_broken.store(true, std::memory_order_release);
}

ForkedWithWorkInFlight::ForkedWithWorkInFlight()
    : std::runtime_error(
          "ember: cannot use ember in a process forked while ember work was "
          "in flight (its worker threads do not survive fork()); synchronize "
          "before forking, or use the 'spawn' start method") {}

Stream::Stream(int device_index, StreamId id, int priority,
               std::shared_ptr<const WorkerConfig> config)
    : device_index_(device_index),
      id_(id),
      priority_(priority),
      config_(std::move(config)) {}

Stream::~Stream() { shutdown(); }

bool parse_launch_blocking(const char* value) {
  if (value == nullptr || *value == '\0') return false;
  const std::string text(value);
  if (text == "0") return false;
  if (text == "1") return true;
  throw InvalidConfiguration("EMBER_LAUNCH_BLOCKING='" + text +
                             "' is invalid: expected 0 or 1");
}

bool launch_blocking() {
  static const bool blocking = [] {
    try {
      return parse_launch_blocking(std::getenv("EMBER_LAUNCH_BLOCKING"));
    } catch (const InvalidConfiguration&) {
      return false;  // reported by device_count() (device.cpp)
    }
  }();
  return blocking;
}

void Stream::enqueue(const char* name, Work work) {
  check_not_forked_broken();
  submit_held();  // ahead of this work in stream order
  if ((pending_.load(std::memory_order_acquire) & kErrorFlag) != 0)
      [[unlikely]] {
    // A launch after failed work reports the failure (as CUDA's next API
    // call does); the work is not queued.
    std::unique_lock<std::mutex> lock(mutex_);
    raise_pending_error(lock);
  }
  if (CapturedGraph* graph = capture()) [[unlikely]] {
    graph->record(name, work, this);
  }
  if (launch_blocking()) [[unlikely]] {
    run(work);  // EMBER_LAUNCH_BLOCKING=1: errors surface at the call
    return;
  }
  if (bursts_tracked_.load(std::memory_order_relaxed)) {
    note_work_queued(steady_now_ns());
  }
  note_host_cpu();
  std::unique_lock<std::mutex> lock(mutex_);
  if (shut_down_) {
    lock.unlock();
    run(work);
    return;
  }
  if (queue_.size() >= kMaxQueued) [[unlikely]] {
    // The host ran far ahead: wait until the worker has caught up halfway
    // (as a GPU's launch queue blocks when full). Bounds the memory that
    // queued work holds, its results included.
    ++room_waiters_;
    done_cv_.wait(lock, [this] {
      return queue_.size() <= kMaxQueued / 2 || worker_ == nullptr;
    });
    --room_waiters_;
  }
  push(Item{name, std::move(work), false});
  // Finished work is destroyed by a later submission while held work is
  // being submitted (submit_taken).
  std::vector<Work> finished =
      submitting_held_here() ? std::vector<Work>() : take_finished();
  lock.unlock();
  finished.clear();  // destroyed here, outside the lock
}

void Stream::hold(std::unique_ptr<HeldWork> work) {
  check_not_forked_broken();
  if ((pending_.load(std::memory_order_acquire) & kErrorFlag) != 0)
      [[unlikely]] {
    std::unique_lock<std::mutex> lock(mutex_);
    raise_pending_error(lock);
  }
  // Host waits that skip a device with nothing ever queued must see it.
  if (!any_work_queued.load(std::memory_order_relaxed)) {
    any_work_queued.store(true, std::memory_order_release);
  }
  std::unique_ptr<HeldWork> earlier;  // destroyed once the lock is released
  std::lock_guard<std::recursive_mutex> lock(held_mutex_);
  if (held_ != nullptr) {
    earlier = std::move(held_);
    submit_taken(*earlier);
  }
  held_ = std::move(work);
  pending_.fetch_or(kHeldFlag, std::memory_order_release);
}

namespace {
// The stream whose held work the calling thread is submitting.
thread_local const Stream* t_submitting_held = nullptr;
}  // namespace

bool Stream::submitting_held_here() const { return t_submitting_held == this; }

// With the flag still set: another thread's launch waits (submit_held) until
// this work is in the queue ahead of its own; to this thread the stream
// looks as if nothing were held (query), so the work runs at the call or is
// queued by the same rules as any launch.
// Nothing is destroyed under the hold lock (here, or as finished work by
// enqueue and run): what held or finished work references may be the last
// reference to memory whose release takes the GIL, which a thread waiting
// for the lock (submit_held) may hold.
void Stream::submit_taken(HeldWork& work) {
  struct Scope {
    const Stream* previous = t_submitting_held;
    explicit Scope(const Stream* stream) { t_submitting_held = stream; }
    ~Scope() { t_submitting_held = previous; }
  } scope(this);
  work.submit(*this);
}

void Stream::submit_held_slow() {
  std::unique_ptr<HeldWork> work;  // destroyed once the lock is released
  std::lock_guard<std::recursive_mutex> lock(held_mutex_);
  if (held_ == nullptr) return;  // submitted already (or being, by us)
  struct ClearFlag {
    std::atomic<int64_t>& pending;
    ~ClearFlag() { pending.fetch_and(~kHeldFlag, std::memory_order_release); }
  } clear{pending_};
  work = std::move(held_);
  submit_taken(*work);
}

std::vector<Stream::Work> Stream::take_finished() {
  std::vector<Work> finished;
  finished.swap(finished_);
  return finished;
}

void Stream::collect_finished() {
  std::vector<Work> finished;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finished = take_finished();
  }
}

void Stream::wait_quietly() {
  if (forked_with_work_in_flight()) return;
  submit_held();
  std::vector<Work> finished;
  std::unique_lock<std::mutex> lock(mutex_);
  wait_idle(lock);
  finished = take_finished();
}

void Stream::spin_for_work() {
  spin_until([this] { return work_queued(); });
}

// Caller holds mutex_.
void Stream::push(Item item) {
  if (!any_work_queued.load(std::memory_order_relaxed)) {
    any_work_queued.store(true, std::memory_order_release);
  }
  queue_.push_back(std::move(item));
  pending_.fetch_add(1, std::memory_order_release);
  if (worker_ == nullptr) {
    worker_ = new std::thread(
        start_named_thread("ember-worker", [this] { worker_loop(); }));
  }
  work_cv_.notify_one();
}

void Stream::worker_loop() {
  worker_asleep_.store(false, std::memory_order_release);
  t_in_stream_worker = true;
  if (config_ != nullptr) pin_to_cores(config_->cores);
  note_worker_cores();
  try {
    set_current_device(device_index_);
  } catch (const std::exception&) {
    // A stream outside the process's devices (runtime tests): the current
    // device stays 0.
  }
  if (config_ != nullptr) {
    if (WorkerStartHook hook =
            worker_start_hook.load(std::memory_order_acquire)) {
      hook(*config_);
    }
  }
  std::unique_lock<std::mutex> lock(mutex_);
  bool ran_work = false;
  for (;;) {
    if (shares_host_cpu()) {
      // Not under the lock: a host blocked on it would be woken here, on
      // this core, by the unlock.
      lock.unlock();
      move_off_host_cpu();
      lock.lock();
    }
    if (queue_.empty() && !stopping_) {
      lock.unlock();
      spin_for_work();
      lock.lock();
    }
    if (queue_.empty() && !stopping_) {
      worker_asleep_.store(true, std::memory_order_release);
      sleep_until_work(lock, ran_work);
      worker_asleep_.store(false, std::memory_order_release);
      rouse_requested_ = false;
      // Back to the top: woken on the waker's core, perhaps (move off
      // it); roused with nothing queued (poll for the work about to come).
      continue;
    }
    if (queue_.empty()) return;  // stopping, and everything ran
    Item item = std::move(queue_.front());
    queue_.pop_front();
    const bool skip = !error_.empty() && !item.always_runs;
    lock.unlock();
    ran_work = true;
    std::string error;
    if (!skip) {
      try {
        item.work();
      } catch (const std::exception& e) {
        error = e.what();
      } catch (...) {
        error = "unknown exception";
      }
    }
    lock.lock();
    // Kept for the submitting side to destroy (collect_finished); a
    // synchronize destroys it before it returns.
    finished_.push_back(std::move(item.work));
    if (!error.empty() && error_.empty()) {
      error_ = "ember:" + std::to_string(device_index_) + " stream " +
               std::to_string(id_) + ": asynchronous error in " +
               (item.name != nullptr ? item.name : "queued work") + ": " +
               error;
      pending_.fetch_or(kErrorFlag, std::memory_order_release);
    }
    completed_.fetch_add(1, std::memory_order_relaxed);
    const bool idle = ((pending_.fetch_sub(1, std::memory_order_release) - 1) &
                       kQueuedMask) == 0;
    if (event_waiters_ > 0 || (idle && idle_waiters_ > 0) ||
        (room_waiters_ > 0 && queue_.size() <= kMaxQueued / 2)) {
      done_cv_.notify_all();
    }
  }
}

// Caller holds `lock` on mutex_.
void Stream::wait_idle(std::unique_lock<std::mutex>& lock) {
  if (work_queued()) {
    lock.unlock();
    spin_until([this] { return !work_queued(); });
    lock.lock();
  }
  ++idle_waiters_;
  done_cv_.wait(lock, [this] { return !work_queued(); });
  --idle_waiters_;
}

void Stream::raise_pending_error(std::unique_lock<std::mutex>& lock) {
  (void)lock;
  if (error_.empty()) return;
  std::string message = std::move(error_);
  error_.clear();
  pending_.fetch_and(~kErrorFlag, std::memory_order_release);
  throw AsyncError(message);
}

void Stream::wait_queue_for_run() {
  // Stream order inside the stream (also while it captures: the captured
  // synchronous unit runs after the launched ones before it).
  check_not_forked_broken();
  submit_held();
  std::vector<Work> finished;
  std::unique_lock<std::mutex> lock(mutex_);
  wait_idle(lock);
  note_host_cpu();
  if (!submitting_held_here()) finished = take_finished();  // submit_taken
  raise_pending_error(lock);
}

void Stream::synchronize() {
  if (capture() != nullptr) [[unlikely]] {
    throw CaptureError(
        "operation not permitted when stream is capturing: a host wait on "
        "stream " +
        std::to_string(id_) + " of device " + std::to_string(device_index_) +
        ", which is capturing a graph (end the capture first)");
  }
  note_host_wait();
  wait_queue_for_run();
}

void Stream::wait_for(const EventState& state) {
  check_not_forked_broken();
  std::unique_lock<std::mutex> lock(mutex_);
  ++event_waiters_;
  done_cv_.wait(lock,
                [&] { return state.done.load(std::memory_order_acquire); });
  --event_waiters_;
}

void Stream::shutdown() {
  try {
    submit_held();  // runs before the worker stops
  } catch (const std::exception&) {
    // an earlier error, unreported: the held work is dropped with it
  }
  std::thread* worker = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    shut_down_ = true;
    stopping_ = true;
    worker = worker_;
    worker_ = nullptr;
    work_cv_.notify_all();
  }
  if (worker != nullptr) {
    if (worker->get_id() == std::this_thread::get_id()) {
      worker->detach();  // shut down from its own work: cannot join itself
    } else {
      worker->join();
    }
    delete worker;
  }
}

bool Stream::reset_in_child() {
  // The threads that waited on these are gone with their waiter records:
  // fresh condition variables (the old ones are abandoned, not destroyed).
  new (&work_cv_) std::condition_variable();
  new (&done_cv_) std::condition_variable();
  worker_ = nullptr;  // the thread does not exist here; leaked, never joined
  worker_asleep_.store(true, std::memory_order_relaxed);
  rouse_requested_ = false;
  idle_waiters_ = room_waiters_ = event_waiters_ = 0;
  stopping_ = false;
  // Held work never ran either: leaked with what it holds (the parent's).
  const bool held = held_ != nullptr;
  (void)held_.release();
  new (&held_mutex_) std::recursive_mutex();
  return (pending_.load(std::memory_order_acquire) & ~kErrorFlag) != 0 ||
         !queue_.empty() || held;
}

StreamPool::StreamPool(int device_index,
                       std::shared_ptr<const WorkerConfig> config)
    : device_index_(device_index),
      serial_(next_pool_serial.fetch_add(1, std::memory_order_relaxed)),
      config_(std::move(config)) {
  streams_.push_back(
      std::make_unique<Stream>(device_index_, kDefaultStreamId, 0, config_));
  default_stream_ = streams_.front().get();
}

Stream& StreamPool::create(int priority) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto id = static_cast<StreamId>(streams_.size());
  streams_.push_back(
      std::make_unique<Stream>(device_index_, id, priority, config_));
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

namespace {
std::vector<Stream*> snapshot(std::mutex& mutex,
                              const std::deque<std::unique_ptr<Stream>>& all) {
  std::lock_guard<std::mutex> lock(mutex);
  std::vector<Stream*> streams;
  streams.reserve(all.size());
  for (const auto& stream : all) streams.push_back(stream.get());
  return streams;
}
}  // namespace

void StreamPool::synchronize_all() {
  Stream::note_host_wait();
  if (!any_work_queued.load(std::memory_order_acquire) &&
      !any_stream_capturing()) {
    return;
  }
  // A snapshot: the waits (on work that may create streams) hold no lock.
  // Every stream is waited for before the first pending error is raised.
  const std::vector<Stream*> streams = snapshot(mutex_, streams_);
  refuse_wait_during_capture(streams);
  std::exception_ptr first_error;
  for (Stream* stream : streams) {
    try {
      // A capture that allows this wait (a relaxed one, or another
      // thread's thread_local one) is waited for like any stream: its work
      // runs while it is recorded.
      stream->wait_queue_for_run();
    } catch (const AsyncError&) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error) std::rethrow_exception(first_error);
}

void StreamPool::collect_finished() {
  for (Stream* stream : snapshot(mutex_, streams_)) stream->collect_finished();
}

void StreamPool::wait_quietly() {
  for (Stream* stream : snapshot(mutex_, streams_)) stream->wait_quietly();
}

void StreamPool::shutdown_all() {
  for (Stream* stream : snapshot(mutex_, streams_)) stream->shutdown();
}

void StreamPool::submit_all_held() {
  for (Stream* stream : snapshot(mutex_, streams_)) {
    try {
      stream->submit_held();
    } catch (const std::exception&) {
      // an unreported earlier error: raised at the stream's next use
    }
  }
}

void StreamPool::lock_for_fork() {
  mutex_.lock();
  for (auto& stream : streams_) stream->lock_for_fork();
}

void StreamPool::unlock_after_fork() {
  for (auto it = streams_.rbegin(); it != streams_.rend(); ++it) {
    (*it)->unlock_after_fork();
  }
  mutex_.unlock();
}

bool StreamPool::reset_in_child() {
  bool in_flight = false;
  for (auto& stream : streams_) in_flight |= stream->reset_in_child();
  return in_flight;
}

void StreamPool::refuse_after_fork() {
  for (auto& stream : streams_) stream->refuse_after_fork();
}

}  // namespace ember::runtime
