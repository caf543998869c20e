// When a stream's worker sleeps, and who wakes it without queuing work
// (stream.h: worker_asleep, rouse_worker, note_work_at_call_*): launchers
// run small work at the call while the worker sleeps, and a host that goes
// on launching rouses it. A worker idle for a while runs the idle hook.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>

#include "ember/runtime/stream.h"
#include "named_thread.h"

namespace ember::runtime {

namespace {
std::atomic<WorkerIdleHook> worker_idle_hook{nullptr};
}  // namespace

void set_worker_idle_hook(WorkerIdleHook hook) {
  worker_idle_hook.store(hook, std::memory_order_release);
}

void Stream::sleep_until_work(std::unique_lock<std::mutex>& lock,
                              bool& ran_work) {
  const auto has_work = [this] {
    return !queue_.empty() || stopping_ || rouse_requested_;
  };
  if (ran_work) {
    if (WorkerIdleHook hook =
            worker_idle_hook.load(std::memory_order_acquire)) {
      if (work_cv_.wait_for(lock, kWorkerIdleHookDelay, has_work)) return;
      ran_work = false;
      lock.unlock();
      hook();
      lock.lock();
    }
  }
  work_cv_.wait(lock, has_work);
}

void Stream::rouse_worker() {
  note_host_cpu();
  std::lock_guard<std::mutex> lock(mutex_);
  if (shut_down_ || stopping_ || rouse_requested_) return;
  if (worker_ == nullptr) {
    rouses_.fetch_add(1, std::memory_order_relaxed);
    worker_asleep_.store(false, std::memory_order_release);
    worker_ = new std::thread(
        start_named_thread("ember-worker", [this] { worker_loop(); }));
    return;
  }
  if (!worker_asleep_.load(std::memory_order_acquire)) return;
  rouses_.fetch_add(1, std::memory_order_relaxed);
  rouse_requested_ = true;
  work_cv_.notify_one();
}

namespace {
std::atomic<bool> keep_workers_awake_flag{false};
std::atomic<uint64_t> host_waits{0};
}  // namespace

void Stream::note_host_wait() {
  host_waits.fetch_add(1, std::memory_order_relaxed);
}

void Stream::keep_workers_awake(bool keep_awake) {
  keep_workers_awake_flag.store(keep_awake, std::memory_order_relaxed);
}

bool Stream::workers_kept_awake() {
  return keep_workers_awake_flag.load(std::memory_order_relaxed);
}

bool Stream::burst_goes_on(int64_t now) {
  // After a host wait the pause that ends the burst is short: a model called
  // again at once goes on with it, one called now and then starts anew.
  const uint64_t waits = host_waits.load(std::memory_order_relaxed);
  const bool waited =
      burst_host_waits_.exchange(waits, std::memory_order_relaxed) != waits;
  const auto gap = waited ? kBurstGapAfterHostWait : kBurstGap;
  return burst_goes_on_after(now, std::chrono::nanoseconds(gap).count());
}

bool Stream::burst_goes_on_after(int64_t at, int64_t gap_ns) {
  if (at - burst_last_ns_.load(std::memory_order_relaxed) <= gap_ns) {
    return true;
  }
  burst_start_ns_.store(at, std::memory_order_relaxed);
  burst_work_ns_.store(0, std::memory_order_relaxed);
  burst_roused_.store(false, std::memory_order_relaxed);
  return false;
}

void Stream::note_work_at_call_done(int64_t start, int64_t end) {
  // A pause before the work ends the burst too. Only the plain gap: the
  // short gap after a host wait is left for the next launch to judge (the
  // work right after a wait is often the read's own copy, which must not
  // use up the wait).
  burst_goes_on_after(start, std::chrono::nanoseconds(kBurstGap).count());
  burst_work_ns_.fetch_add(end - start, std::memory_order_relaxed);
  burst_last_ns_.store(end, std::memory_order_relaxed);
}

void Stream::note_work_queued(int64_t now) {
  burst_last_ns_.store(now, std::memory_order_relaxed);
}

bool Stream::note_work_at_call_while_asleep() {
  bursts_tracked_.store(true, std::memory_order_relaxed);
  const int64_t now = steady_now_ns();
  if (!burst_goes_on(now)) return false;
  if (burst_roused_.load(std::memory_order_relaxed)) return true;
  const int64_t elapsed = now - burst_start_ns_.load(std::memory_order_relaxed);
  const int64_t host = elapsed - burst_work_ns_.load(std::memory_order_relaxed);
  if (elapsed >= std::chrono::nanoseconds(kRouseAfter).count() &&
      static_cast<double>(host) >=
          kRouseMinHostShare * static_cast<double>(elapsed)) {
    burst_roused_.store(true, std::memory_order_relaxed);
    rouse_worker();
  }
  return false;
}

}  // namespace ember::runtime
