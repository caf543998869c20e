// Which core a stream's worker runs on, against the host thread that feeds
// it (stream.h: note_host_cpu and the worker's side below).
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

#include "ember/runtime/stream.h"

namespace ember::runtime {

namespace {
thread_local char t_thread_token;  // its address tells threads apart

// The one core the calling thread may run on (-1: several), read from its
// affinity once every kAffinityRecheck calls: a launch cannot afford a
// system call, and affinity changes are rare (forget_thread_affinity makes
// the glue's own take effect at once).
constexpr uint32_t kAffinityRecheck = 1024;
struct ThreadAffinity {
  uint32_t calls_until_check = 0;
  int only_core = -1;
};
thread_local ThreadAffinity t_affinity;

int only_core_of_calling_thread() {
  if (t_affinity.calls_until_check == 0) {
    t_affinity.calls_until_check = kAffinityRecheck;
    t_affinity.only_core = -1;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) == 1) {
      for (int core = 0; core < CPU_SETSIZE; ++core) {
        if (CPU_ISSET(core, &set)) {
          t_affinity.only_core = core;
          break;
        }
      }
    }
  }
  --t_affinity.calls_until_check;
  return t_affinity.only_core;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The host thread that last asked host_confined_to_worker_core (launched
// work), process-wide, and when; and when a thread before it last asked.
// Races between threads only blur the heuristic.
std::atomic<const void*> g_asking_thread{nullptr};
std::atomic<int64_t> g_asked_ns{0};
std::atomic<int64_t> g_another_asked_ns{INT64_MIN / 2};

// Notes the calling thread's ask at `now`; true when no other thread has
// asked within Stream::kSharedFeedHold. While one thread asks: a load, a
// store and a clock read (vDSO).
bool lone_asking_thread(int64_t now) {
  const void* self = &t_thread_token;
  if (g_asking_thread.load(std::memory_order_relaxed) != self) {
    const void* before =
        g_asking_thread.exchange(self, std::memory_order_relaxed);
    if (before != nullptr) {
      g_another_asked_ns.store(g_asked_ns.load(std::memory_order_relaxed),
                               std::memory_order_relaxed);
    }
  }
  g_asked_ns.store(now, std::memory_order_relaxed);
  return now - g_another_asked_ns.load(std::memory_order_relaxed) >=
         std::chrono::nanoseconds(Stream::kSharedFeedHold).count();
}
}  // namespace

void forget_thread_affinity() { t_affinity.calls_until_check = 0; }

bool Stream::host_confined_to_worker_core() const {
  if (in_stream_worker()) return false;
  // Noted whatever the answer: another thread's launches count.
  const bool lone = lone_asking_thread(now_ns());
  return lone && config_ != nullptr && config_->cores.size() == 1 &&
         only_core_of_calling_thread() == config_->cores.front();
}

void Stream::note_host_cpu() {
  if (in_stream_worker()) return;  // work queuing work: not the host
  const int cpu = sched_getcpu();  // rseq or vDSO: no system call
  if (host_cpu_.load(std::memory_order_relaxed) != cpu) {
    host_cpu_.store(cpu, std::memory_order_relaxed);
  }
  const void* thread = &t_thread_token;
  if (host_thread_.load(std::memory_order_relaxed) != thread) {
    if (host_thread_.exchange(thread, std::memory_order_relaxed) != nullptr) {
      host_thread_changed_ns_.store(steady_now_ns(), std::memory_order_relaxed);
    }
  }
}

void Stream::note_worker_cores() {
  worker_cores_.clear();
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return;
  for (int core = 0; core < CPU_SETSIZE; ++core) {
    if (CPU_ISSET(core, &set)) worker_cores_.push_back(core);
  }
}

// True when the worker runs on the host's core and may move now (the rate
// limit and the shared-feed hold allow it): checked before the worker lets
// go of the queue lock, so a worker that may not move does not churn it.
bool Stream::shares_host_cpu() const {
  if (worker_cores_.size() < 2 ||
      sched_getcpu() != host_cpu_.load(std::memory_order_relaxed)) {
    return false;
  }
  const int64_t now = steady_now_ns();
  if (now - last_move_ns_ < std::chrono::nanoseconds(kMoveInterval).count()) {
    return false;
  }
  // Several host threads feed this stream: no core is the host's.
  return now - host_thread_changed_ns_.load(std::memory_order_relaxed) >=
         std::chrono::nanoseconds(kSharedFeedHold).count();
}

void Stream::move_off_host_cpu() {
  const int host = host_cpu_.load(std::memory_order_relaxed);
  last_move_ns_ = steady_now_ns();
  cpu_set_t others;
  cpu_set_t all;
  CPU_ZERO(&others);
  CPU_ZERO(&all);
  for (int core : worker_cores_) {
    if (core < 0 || core >= CPU_SETSIZE) continue;
    CPU_SET(core, &all);
    if (core != host) CPU_SET(core, &others);
  }
  if (CPU_COUNT(&others) == 0) return;
  // Narrowing the mask moves the thread at once; widening it again leaves
  // it there and lets the scheduler balance later. The mask is narrow only
  // between the two calls, so OpenMP threads the worker starts later still
  // get all of its cores.
  if (pthread_setaffinity_np(pthread_self(), sizeof(others), &others) != 0) {
    return;
  }
  (void)pthread_setaffinity_np(pthread_self(), sizeof(all), &all);
  moves_.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace ember::runtime
