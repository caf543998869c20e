// Streams and events of an ember device: the execution engine. A stream is
// an ordered queue of work; an event marks a point in a stream. Plain C++,
// no torch headers.
//
// Two ways to submit work to a stream:
//  - run(work): synchronous. The work runs on the calling thread, after
//    everything queued on the stream before it (run waits for the queue to
//    drain first), and its exceptions reach the caller directly. Op
//    registrations call this (through the glue's run_on_device).
//  - enqueue(name, work): asynchronous. The work is queued and executed, in
//    order, by the stream's worker thread (started on first use, pinned to
//    the device's cores). An exception it throws is kept and raised, as an
//    AsyncError naming the work, at the stream's next synchronisation point
//    (synchronize, run, an event synchronize), the way CUDA reports
//    asynchronous kernel errors; queued work behind a failed one is skipped
//    until the error has been reported.
// Streams of one device run their queued work concurrently; Event::block
// orders them (wait_event / wait_stream).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ember/runtime/graph.h"

namespace ember::runtime {

using StreamId = int64_t;
inline constexpr StreamId kDefaultStreamId = 0;

// An exception thrown by queued work, raised at the next synchronisation
// point of its stream. The message names the work (the op), its device and
// stream, and the original error.
class AsyncError final : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Raised by every stream operation in a child forked while queued work was
// in flight in the parent (the work and the threads running it did not
// survive fork()), as CUDA's "Cannot re-initialize CUDA in forked
// subprocess".
class ForkedWithWorkInFlight final : public std::runtime_error {
 public:
  ForkedWithWorkInFlight();
};

// What the worker threads of a device know about it: its cores (empty: no
// pinning) and a hook the layer above runs on each new worker (the glue
// sets the worker's intra-op thread count there).
struct WorkerConfig {
  int device_index = 0;
  std::vector<int> cores;
};
using WorkerStartHook = void (*)(const WorkerConfig&);
// Installed once by the layer above, before the first worker starts.
void set_worker_start_hook(WorkerStartHook hook);
// Runs on a worker whose queue has stayed empty for kWorkerIdleHookDelay
// since it last ran work, once per such idle spell, before it sleeps on.
// The glue gives the worker's OpenMP team back there: a second team in the
// process makes libgomp's barriers of every team sleep instead of spin.
using WorkerIdleHook = void (*)();
void set_worker_idle_hook(WorkerIdleHook hook);
inline constexpr std::chrono::milliseconds kWorkerIdleHookDelay{2};

struct EventState;
class Stream;

// Work the host may still extend before its stream runs it: a run of ops
// that the layer above fuses into one unit (elementwise steps over the same
// elements, each read once from memory). A stream holds at most one; every
// operation on the stream that submits, runs, orders or waits for work
// submits it first (submit_held), so the held work keeps its place in stream
// order and no host wait can miss it.
class HeldWork {
 public:
  virtual ~HeldWork() = default;
  // Submits the work to `stream` (queued or run at the call: the layer
  // above decides, as for any launch). Called once, on whichever thread
  // touched the stream next.
  virtual void submit(Stream& stream) = 0;
};

class Stream final {
 public:
  using Work = std::function<void()>;

  Stream(int device_index, StreamId id, int priority,
         std::shared_ptr<const WorkerConfig> config = nullptr);
  // Runs what is still queued, then stops the worker.
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  int device_index() const { return device_index_; }
  StreamId id() const { return id_; }
  int priority() const { return priority_; }

  // Executes one unit of work in stream order on the calling thread. The
  // fast path (nothing queued) is one atomic load.
  template <class W>
  void run(W&& work) {
    if (pending_.load(std::memory_order_acquire) != 0) [[unlikely]] {
      wait_queue_for_run();
    }
    if (!bursts_tracked_.load(std::memory_order_relaxed)) {
      // No launch has asked about the host's bursts yet (synchronous
      // execution): no clock to read.
      struct Done {
        Stream& stream;
        ~Done() { stream.completed_.fetch_add(1, std::memory_order_relaxed); }
      } done{*this};
      std::forward<W>(work)();
      return;
    }
    // The work's time is the host's burst's work, not a pause or host time
    // of its own (note_work_at_call_done).
    struct Count {
      Stream& stream;
      int64_t start = steady_now_ns();
      ~Count() {
        stream.completed_.fetch_add(1, std::memory_order_relaxed);
        stream.note_work_at_call_done(start, steady_now_ns());
      }
    } count{*this};
    std::forward<W>(work)();
  }

  // Queues `work`; `name` (a string literal or otherwise static) names it in
  // an AsyncError. Runs inline once the engine is shut down. Raises (and
  // queues nothing) when earlier work failed and its error is unreported.
  void enqueue(const char* name, Work work);

  // Holds `work` (submitting any work held before). Raises as enqueue does
  // when earlier work failed.
  void hold(std::unique_ptr<HeldWork> work);
  // Calls extend(held) on the held work (HeldWork&) with the hold lock
  // taken, so no other thread submits it meanwhile; returns extend's result,
  // or false when nothing is held.
  template <class Extend>
  bool extend_held(Extend&& extend) {
    if ((pending_.load(std::memory_order_acquire) & kHeldFlag) == 0) {
      return false;
    }
    std::lock_guard<std::recursive_mutex> lock(held_mutex_);
    return held_ != nullptr && extend(*held_);
  }
  // Submits the held work, if any. One atomic load when nothing is held.
  void submit_held() {
    if ((pending_.load(std::memory_order_acquire) & kHeldFlag) != 0)
        [[unlikely]] {
      submit_held_slow();
    }
  }

  // Units of work completed (run or queued).
  uint64_t completed() const {
    return completed_.load(std::memory_order_relaxed);
  }
  // True when no queued or held work is left (raises nothing). To the thread
  // submitting the held work, the stream is as if it held none.
  bool query() const {
    const int64_t pending = pending_.load(std::memory_order_acquire);
    if ((pending & ~kErrorFlag) == 0) return true;
    return (pending & kQueuedMask) == 0 && submitting_held_here();
  }
  // Waits for the queued work, then raises a pending AsyncError.
  void synchronize();

  // True when the worker is asleep (or not started) with nothing queued:
  // work queued now would first wait for the worker to be woken, which
  // costs more than a small kernel (~150 us for a halted vCPU), so a
  // launcher runs small work at the call instead (and rouses the worker).
  bool worker_asleep() const {
    return worker_asleep_.load(std::memory_order_acquire) && query() &&
           !workers_kept_awake();
  }
  // While set, every stream's worker counts as awake: launchers queue work
  // whatever the worker does (as before this rule). Tests that count
  // launched work set it, so that what is queued does not depend on how
  // long the host paused.
  static void keep_workers_awake(bool keep_awake);
  static bool workers_kept_awake();
  // Wakes (or starts) a sleeping worker without queuing anything, so that
  // work launched a moment later finds it polling. At most one wake-up is
  // sent per sleep.
  void rouse_worker();
  // Wake-ups (or starts) rouse_worker has sent this stream's worker.
  uint64_t rouses() const { return rouses_.load(std::memory_order_relaxed); }
  // Called by a launcher that ran work at the call because the worker was
  // asleep: rouses the worker once the host has gone on launching for
  // kRouseAfter with no pause longer than kBurstGap, or than
  // kBurstGapAfterHostWait where the host waited for the stream in between
  // (synchronize, a host read): a decode step, a training loop, a model
  // called back to back; the work that follows is worth queuing. Never for
  // a short burst that a pause follows (a batch-1 MLP called now and then,
  // which the roused worker's polling and wake-ups would only slow). The
  // plain gap is long against the Python between a model's ops
  // (transformers' decode pauses for 100-500 us between some of them).
  // Nor while the host's own share of the burst (its time outside the work
  // run at the call) is under kRouseMinHostShare: then there is little host
  // time to run ahead of, and a roused worker's team would only contend
  // with the host's for the cores (a compiled ResNet-50 on 2 cores: 39 ms
  // against 35 at the call).
  // Returns true where the launch should be queued after all: the worker
  // was already roused in this burst and has fallen asleep between
  // launches since (queuing wakes it; running at the call again would start
  // the burst's rouse over, flipping a decode between the two modes).
  bool note_work_at_call_while_asleep();
  // Work was queued at `now` (steady_clock ns; only once a launch asked
  // about bursts): a launch of the host's, so its burst goes on.
  void note_work_queued(int64_t now);
  // ... and after any work ran at the call from `start` to `end`
  // (steady_clock ns; run() calls it once a launch asked about bursts):
  // pauses are measured from `end` (the work itself is no pause of the
  // host's), and the work counts against the host's share.
  void note_work_at_call_done(int64_t start, int64_t end);
  // The host waits for a stream or device (synchronize, a host read): the
  // next pause of kBurstGapAfterHostWait ends every stream's burst.
  static void note_host_wait();
  static constexpr std::chrono::microseconds kBurstGap{1000};
  static constexpr std::chrono::microseconds kBurstGapAfterHostWait{100};
  static constexpr std::chrono::microseconds kRouseAfter{200};
  static constexpr double kRouseMinHostShare = 0.25;

  // The worker keeps off the core of the host thread feeding it
  // (stream_placement.cpp). A wake-up tends to put the woken thread on its
  // waker's core, so on 2 cores a worker roused by the host, or a host
  // woken by the worker (or by a lock the worker held), can end up sharing
  // a core with the other while the second core idles. They then take
  // turns: the worker's polling holds the host up, the host's launches
  // stall, the worker falls asleep between them and every launch wakes it
  // again (a batch-1 MLP with a read after each call: 100-170 us against
  // 35-60 on separate cores, ~20 rouses per 100 calls). The host's core is
  // noted at its launches, rouses and waits; a worker that finds itself on
  // it, with another of its cores to go to, moves (at most once per
  // kMoveInterval). Not while more than one host thread feeds the stream
  // (another one noted within kSharedFeedHold): no core is then the
  // host's, and a move would only trade one for another.
  void note_host_cpu();
  // Times the worker moved off the host's core.
  uint64_t moves_off_host_cpu() const {
    return moves_.load(std::memory_order_relaxed);
  }
  static constexpr std::chrono::microseconds kMoveInterval{1000};
  static constexpr std::chrono::milliseconds kSharedFeedHold{100};

  // True when the calling thread may run only on the one core this
  // stream's worker owns (its affinity is that core alone: a serving thread
  // bound to a 1-core device, or a process on one core) and no other
  // thread of the process has asked (launched work) within
  // kSharedFeedHold. Host and worker then take turns on that core: queued
  // work overlaps nothing and costs the hand-over both ways (a batch-1 MLP
  // on a 1-core device ran 1.45x its synchronous time queued), so launchers
  // run such a thread's work at the call. With other host threads about, a
  // host often blocks on them (Python's GIL) and its worker runs queued
  // work meanwhile: two BERT-tiny replicas on two 1-core devices served
  // 0.77x the requests with their work at the call. False on a worker
  // thread and for a stream without cores. Every launch asks (the launching
  // threads are noted here).
  bool host_confined_to_worker_core() const;

  // Destroys, on the calling thread, the work the worker has finished.
  // Finished work is not destroyed by the worker: what it captured
  // (tensors) may be the last reference to memory whose release needs the
  // submitting side (Python-owned storages take the GIL), so it is released
  // here, by enqueue() and by the synchronisation points.
  void collect_finished();
  // Waits for the queued work and destroys it; raises nothing.
  void wait_quietly();

  // Graph capture (graph.h): from begin_capture to end_capture, every unit
  // queued on this stream is also recorded, in order, into `graph` (it
  // still runs as usual), and synchronize() raises CaptureError: the host
  // may not wait on a capturing stream. begin_capture raises CaptureError
  // when the stream already captures. `mode` decides which device-wide
  // waits the capture forbids (graph.h); it began on the calling thread.
  void begin_capture(std::shared_ptr<CapturedGraph> graph,
                     CaptureMode mode = CaptureMode::kGlobal);
  // Ends the capture (nullptr if there was none) and returns its graph;
  // streams that joined it (graph.h, cross-stream capture) leave it too.
  std::shared_ptr<CapturedGraph> end_capture();
  // The graph this stream records into, or nullptr.
  CapturedGraph* capture() const {
    return capture_raw_.load(std::memory_order_acquire);
  }
  // The mode of this stream's capture if it forbids a device-wide wait made
  // by the calling thread (thread_local: only the thread that began it).
  std::optional<CaptureMode> capture_forbidding_wait();
  // Cross-stream capture (Event::block): this stream joins `graph`, begun on
  // `origin` (whose mode and thread it takes); later leaves it when the
  // origin's capture ends.
  void join_capture(std::shared_ptr<CapturedGraph> graph, Stream& origin);
  void leave_capture(const CapturedGraph* graph);
  // Stops the worker after it has run everything queued (idempotent); later
  // work runs inline. Called at exit for every device.
  void shutdown();

  // fork() support (device.cpp's handlers): the queue lock is held across
  // fork(); the child gets fresh locks and no worker, and is marked broken
  // if queued work was in flight.
  void lock_for_fork() { mutex_.lock(); }
  void unlock_after_fork() { mutex_.unlock(); }
  // Returns true if work was in flight.
  bool reset_in_child();
  // Sends every later run() down the slow path, which raises
  // ForkedWithWorkInFlight.
  void refuse_after_fork() { pending_.store(1, std::memory_order_release); }

 private:
  friend class Event;
  friend class StreamPool;  // synchronize_all waits past allowed captures
  struct Item {
    const char* name;
    Work work;
    bool always_runs;  // markers run even after an error
  };
  void push(Item item);
  void submit_held_slow();
  // Submits `work` (taken from held_, hold lock held) as the calling thread.
  void submit_taken(HeldWork& work);
  bool submitting_held_here() const;
  // Whether queued work is unfinished (neither flag counts).
  bool work_queued() const {
    return (pending_.load(std::memory_order_acquire) & kQueuedMask) != 0;
  }
  void worker_loop();
  void wait_queue_for_run();
  void wait_idle(std::unique_lock<std::mutex>& lock);
  // Whether the host's burst goes on at `now` (steady_clock ns): no pause
  // longer than kBurstGap (kBurstGapAfterHostWait after a host wait) since
  // the last work run at the call; else a new burst starts at `now`.
  bool burst_goes_on(int64_t now);
  // The same for a pause of at most `gap_ns` before `at`.
  bool burst_goes_on_after(int64_t at, int64_t gap_ns);
  static int64_t steady_now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void raise_pending_error(std::unique_lock<std::mutex>& lock);
  // Moves finished work out (caller holds the lock); destroyed by the
  // caller after unlocking.
  std::vector<Work> take_finished();
  // The worker, with the queue empty: polls briefly for new work before it
  // sleeps (a launch right behind the last one costs no wake-up).
  void spin_for_work();
  // The worker, after spin_for_work found nothing (caller holds `lock`):
  // sleeps until work, a stop or a rouse; runs the idle hook first when
  // `ran_work` (work ran since the last idle hook) and the queue stays
  // empty for kWorkerIdleHookDelay.
  void sleep_until_work(std::unique_lock<std::mutex>& lock, bool& ran_work);
  // Blocks until `state` is complete (its marker ran on this stream).
  void wait_for(const EventState& state);
  // The worker: remembers the cores it may run on (at its start, after
  // pinning); whether it runs on the host's core and may move now (rate
  // limit, shared-feed hold); moves to another of them.
  void note_worker_cores();
  bool shares_host_cpu() const;
  void move_off_host_cpu();

  const int device_index_;
  const StreamId id_;
  const int priority_;
  const std::shared_ptr<const WorkerConfig> config_;
  std::atomic<uint64_t> completed_{0};
  // Queued work not finished, plus kErrorFlag while an error waits to be
  // reported: run()'s fast path is a single load of this.
  static constexpr int64_t kErrorFlag = int64_t{1} << 62;
  // ... and kHeldFlag while work is held (hold) or being submitted: run()
  // and query() see it, the worker does not (kQueuedMask).
  static constexpr int64_t kHeldFlag = int64_t{1} << 61;
  static constexpr int64_t kQueuedMask = ~(kErrorFlag | kHeldFlag);
  // On a cache line of its own: an idle worker polls it, and a line shared
  // with data the host writes would bounce between their cores on every
  // write.
  alignas(64) std::atomic<int64_t> pending_{0};
  // Set while the worker blocks on work_cv_ (and before it starts); a
  // wake-up requested by rouse_worker() clears it (woken_ marks that one).
  std::atomic<bool> worker_asleep_{true};
  bool rouse_requested_ = false;  // guarded by mutex_
  // The host's current burst of work run at the call (steady_clock ns).
  std::atomic<int64_t> burst_start_ns_{0};
  std::atomic<int64_t> burst_last_ns_{0};
  std::atomic<int64_t> burst_work_ns_{0};  // work run at the call in it
  std::atomic<uint64_t> rouses_{0};
  std::atomic<int> host_cpu_{-1};  // of the host's last launch or wait
  std::atomic<const void*> host_thread_{nullptr};  // ... and its thread
  std::atomic<int64_t> host_thread_changed_ns_{0};
  std::atomic<uint64_t> moves_{0};
  std::vector<int> worker_cores_;              // the worker's own
  int64_t last_move_ns_ = 0;                   // the worker's own
  std::atomic<bool> burst_roused_{false};      // the worker was roused in it
  std::atomic<uint64_t> burst_host_waits_{0};  // host waits last seen
  // Set by the first launch that asks whether to rouse the worker: until
  // then run() keeps no burst accounting.
  std::atomic<bool> bursts_tracked_{false};
  alignas(64) std::mutex mutex_;
  std::condition_variable work_cv_;  // worker: new work or stop
  std::condition_variable done_cv_;  // waiters: work finished
  // Threads blocked on done_cv_, by what they wait for (guarded by mutex_):
  // the worker wakes them only when that may have happened, so a host
  // waiting for an idle stream is not woken by every op that finishes (each
  // wake-up takes a core from the kernels' threads).
  int idle_waiters_ = 0;
  int room_waiters_ = 0;
  int event_waiters_ = 0;
  std::deque<Item> queue_;
  std::vector<Work> finished_;     // run by the worker, destroyed by submitters
  std::thread* worker_ = nullptr;  // leaked in a forked child
  bool stopping_ = false;
  bool shut_down_ = false;
  std::string error_;                       // first error, not yet reported
  std::shared_ptr<CapturedGraph> capture_;  // guarded by mutex_
  std::atomic<CapturedGraph*> capture_raw_{nullptr};
  CaptureMode capture_mode_ = CaptureMode::kGlobal;  // guarded by mutex_
  std::thread::id capture_thread_;                   // guarded by mutex_
  // The held work. Recursive: submitting it runs or queues it on this
  // stream, which submits held work first (nothing, by then). Held while
  // submitting, so that another thread's launch waits until the held work
  // is in the queue before its own.
  std::recursive_mutex held_mutex_;
  std::unique_ptr<HeldWork> held_;  // guarded by held_mutex_
};

// The streams of one device. Stream 0 is the default stream; new streams
// get increasing ids. The current stream is per thread and per device.
class StreamPool final {
 public:
  explicit StreamPool(int device_index,
                      std::shared_ptr<const WorkerConfig> config = nullptr);
  StreamPool(const StreamPool&) = delete;
  StreamPool& operator=(const StreamPool&) = delete;

  Stream& default_stream() { return *default_stream_; }
  Stream& create(int priority = 0);
  // Throws std::out_of_range for an id this pool never handed out.
  Stream& get(StreamId id);
  Stream& current();
  void set_current(StreamId id);
  // Waits for every stream; raises CaptureError first if a capture
  // underway forbids the calling thread a device-wide wait (graph.h).
  void synchronize_all();
  // Stream::collect_finished on every stream.
  void collect_finished();
  // Waits for every stream's queued work and destroys it, without raising
  // a pending error (left for the next synchronisation point): memory
  // statistics read as after synchronous execution.
  void wait_quietly();
  void shutdown_all();

  // Stream::submit_held on every stream (before fork()), raising nothing.
  void submit_all_held();
  // fork() support, as CachingAllocator::lock_for_fork; also takes (and
  // releases) every stream's queue lock.
  void lock_for_fork();
  void unlock_after_fork();
  // In the child, after unlock: fresh workers, or broken if work was in
  // flight. Returns true if work was in flight.
  bool reset_in_child();
  void refuse_after_fork();

 private:
  void refuse_wait_during_capture(const std::vector<Stream*>& streams) const;

  const int device_index_;
  // Process-unique, never reused: keys this pool's per-thread current
  // stream, so a pool created later at the same address starts fresh.
  const uint64_t serial_;
  const std::shared_ptr<const WorkerConfig> config_;
  mutable std::mutex mutex_;
  std::deque<std::unique_ptr<Stream>> streams_;  // index == id
  Stream* default_stream_;  // streams_[0], readable without the lock
};

// A point in a stream: complete once the work queued on the stream before
// record() has finished; with timing, the time it finished (taken by the
// worker when it reaches the event, or at record() when nothing was
// queued).
class Event final {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Event(bool enable_timing = false) : enable_timing_(enable_timing) {}

  void record(Stream& stream);
  bool recorded() const { return state_ != nullptr; }
  bool query() const;
  // Waits for completion; raises the recording stream's pending AsyncError.
  void synchronize() const;
  // Makes work submitted to `stream` after this call wait for this event
  // (cross-stream ordering: wait_event / wait_stream). The host does not
  // wait.
  void block(Stream& stream) const;
  // Milliseconds from this event to `end`. Throws std::logic_error if either
  // event was not recorded, was created without timing, or is not complete.
  double elapsed_ms(const Event& end) const;
  int device_index() const { return device_index_; }
  bool timing_enabled() const { return enable_timing_; }

 private:
  bool enable_timing_;
  int device_index_ = -1;
  Stream* stream_ = nullptr;
  std::shared_ptr<EventState> state_;
  // Recorded on a capturing stream: its graph and the units the stream had
  // submitted to it (a wait on this event joins or joins back, graph.h).
  std::shared_ptr<CapturedGraph> captured_in_;
  std::size_t captured_at_ = 0;
};

// True on a stream's worker thread (queued work must never wait for its own
// device's queues).
bool in_stream_worker();
// The calling thread's affinity changed (the glue bound it to a device's
// cores): host_confined_to_worker_core rechecks it at its next call instead
// of after its periodic recheck.
void forget_thread_affinity();

// True in a child forked while queued work was in flight (every stream
// operation then raises ForkedWithWorkInFlight).
bool forked_with_work_in_flight();
// Called by the child's fork handler (device.cpp) when work was in flight.
void mark_forked_with_work_in_flight();

// EMBER_LAUNCH_BLOCKING=1 (read once): enqueue() runs the work inline, so
// an error is raised by the call that submitted it (debugging, as
// CUDA_LAUNCH_BLOCKING). parse_launch_blocking throws InvalidConfiguration
// (device.h) for a value other than unset, empty, 0 or 1.
bool launch_blocking();
bool parse_launch_blocking(const char* value);

}  // namespace ember::runtime
