#include "ember/runtime/chunk_team.h"

#include <immintrin.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "named_thread.h"

namespace ember::runtime {
namespace {

thread_local bool t_in_chunk = false;

// Marks the calling thread as running chunks for its lifetime.
struct InChunk {
  bool previous = t_in_chunk;
  InChunk() { t_in_chunk = true; }
  ~InChunk() { t_in_chunk = previous; }
};

// How long an idle helper keeps polling for the next job before it sleeps:
// kernels that use a team usually come in runs (a layer's GEMMs).
constexpr auto kHelperSpin = std::chrono::microseconds(50);

// One team's shared state. The job is published as (generation, next chunk)
// in one word, so a helper can claim a chunk only of the job it saw: a
// claim that succeeds proves the job is unfinished, so its fn and context
// are still alive.
// Cache-line aligned: idle helpers poll `generation`, and a line shared
// with data that other threads write would bounce between cores. `done`,
// which every chunk writes, has a line of its own.
struct alignas(64) TeamState {
  std::atomic<uint64_t> ticket{0};  // generation << 32 | next chunk
  std::atomic<uint32_t> generation{0};
  std::atomic<bool> stop{false};
  ChunkFn fn = nullptr;
  const void* context = nullptr;
  std::atomic<int64_t> chunks{0};
  alignas(64) std::atomic<int64_t> done{0};

  // Claims and runs chunks of job `gen` until none is left.
  void work(uint32_t gen) {
    const InChunk in_chunk;
    uint64_t t = ticket.load(std::memory_order_acquire);
    for (;;) {
      if (static_cast<uint32_t>(t >> 32) != gen) return;
      const auto chunk = static_cast<int64_t>(t & 0xffffffffu);
      const int64_t total = chunks.load(std::memory_order_relaxed);
      if (chunk >= total) return;
      if (!ticket.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel,
                                        std::memory_order_acquire)) {
        continue;
      }
      fn(context, chunk);
      done.fetch_add(1, std::memory_order_release);
      t = ticket.load(std::memory_order_acquire);
    }
  }
};

// `seen` is the generation the team had when the helper was started (0: a
// new state), not what it reads once it runs: the caller may already have
// published its first job by then, and that job is the helper's too.
void helper_loop(std::shared_ptr<TeamState> state, uint32_t seen) {
  for (;;) {
    const auto deadline = std::chrono::steady_clock::now() + kHelperSpin;
    uint32_t now = seen;
    for (int i = 1;; ++i) {
      now = state->generation.load(std::memory_order_acquire);
      if (now != seen || state->stop.load(std::memory_order_relaxed)) break;
      _mm_pause();
      if ((i & 63) == 0 && std::chrono::steady_clock::now() > deadline) {
        state->generation.wait(seen, std::memory_order_acquire);
      }
    }
    if (state->stop.load(std::memory_order_acquire)) return;
    seen = now;
    state->work(seen);
  }
}

// A calling thread's team. Helpers are detached and share the state, so a
// team can be dropped (thread exit, or in a forked child, where the
// helpers do not exist) without joining anything.
class Team {
 public:
  ~Team() { stop_helpers(); }

  void run(int64_t chunks, int threads, ChunkFn fn, const void* context) {
    ensure_helpers(threads - 1);
    TeamState& s = *state_;
    s.fn = fn;
    s.context = context;
    s.chunks.store(chunks, std::memory_order_relaxed);
    s.done.store(0, std::memory_order_relaxed);
    const uint32_t gen = s.generation.load(std::memory_order_relaxed) + 1;
    s.ticket.store(static_cast<uint64_t>(gen) << 32, std::memory_order_release);
    s.generation.store(gen, std::memory_order_release);
    s.generation.notify_all();
    s.work(gen);
    for (int i = 1; s.done.load(std::memory_order_acquire) < chunks; ++i) {
      _mm_pause();
      if ((i & 1023) == 0) std::this_thread::yield();
    }
  }

 private:
  void ensure_helpers(int helpers) {
    if (owner_ != getpid()) {
      // A forked child: the helpers stayed in the parent. The old state is
      // left to them (here it is only memory); the child starts its own.
      state_.reset();
      owner_ = getpid();
    }
    if (helpers == helpers_ && state_) return;
    stop_helpers();
    state_ = std::make_shared<TeamState>();
    helpers_ = helpers;
    for (int i = 0; i < helpers; ++i) {
      start_named_thread("ember-chunks", [state = state_] {
        helper_loop(state, 0u);
      }).detach();
    }
  }

  void stop_helpers() {
    if (!state_) return;
    state_->stop.store(true, std::memory_order_release);
    state_->generation.fetch_add(1, std::memory_order_release);
    state_->generation.notify_all();
    state_.reset();
  }

  std::shared_ptr<TeamState> state_;
  int helpers_ = -1;
  pid_t owner_ = getpid();
};

}  // namespace

bool in_run_chunks() { return t_in_chunk; }

void run_chunks(int64_t chunks, int threads, ChunkFn fn, const void* context) {
  if (chunks <= 0) return;
  if (threads <= 1 || chunks == 1 || t_in_chunk) {
    const InChunk in_chunk;
    for (int64_t i = 0; i < chunks; ++i) fn(context, i);
    return;
  }
  thread_local Team team;
  team.run(chunks, threads, fn, context);
}

}  // namespace ember::runtime
