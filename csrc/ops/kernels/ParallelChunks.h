// at::parallel_for's contract for ember's own kernels, with the threads
// chosen by where the kernel runs:
//  - on a stream worker, chunks that any free thread takes
//    (runtime/chunk_team.h) instead of an OpenMP region: with asynchronous
//    execution the host thread shares the cores with the worker, and a
//    region would wait at its barrier for a thread the host displaced;
//  - on any other thread (an op run at its call), the caller's OpenMP team:
//    the threads that ran the GEMMs before it, still polling for work. A
//    chunk team of its own there would wake its helpers from sleep and share
//    the cores with the polling OpenMP threads: ViT-B/16's attention took
//    9.9-12.3 ms per run that way against 7.1 ms on the OpenMP team;
//  - except inside a ChunkTeamOnHost scope (below): there the calling
//    thread's own chunk team.
// Only for loops whose iterations are independent (the result must not
// depend on where the chunks begin), so the bits stay the same whatever the
// thread count or timing.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

#include "ember/runtime/chunk_team.h"
#include "ember/runtime/stream.h"

namespace ember::kernels {

// Whether the calling thread is in a ChunkTeamOnHost scope.
inline thread_local bool t_chunk_team_on_host = false;

// Set while small launched work runs at its call because its stream's
// worker slept (DeviceScope.h, launch_on_stream): the host goes on
// launching, the worker wakes for the next op, and an OpenMP region opened
// here would leave libgomp's threads spinning (~300 000 iterations) on the
// cores the worker then needs; a chunk team's helper polls 50 us, then
// sleeps. Llama decode (12 layers, grouped-query attention and skinny GEMMs
// at the call): 21.3 -> 17.9 ms a token (2-core Zen 3).
class ChunkTeamOnHost {
 public:
  ChunkTeamOnHost() : previous_(t_chunk_team_on_host) {
    t_chunk_team_on_host = true;
  }
  ~ChunkTeamOnHost() { t_chunk_team_on_host = previous_; }
  ChunkTeamOnHost(const ChunkTeamOnHost&) = delete;
  ChunkTeamOnHost& operator=(const ChunkTeamOnHost&) = delete;

 private:
  bool previous_;
};

// Runs body(chunk) for every chunk in [0, chunks) on up to `threads`
// threads (see above for which).
template <class Body>
void run_chunk_loop(int64_t chunks, int threads, const Body& body) {
  if (chunks <= 0) return;
  if (threads <= 1 || chunks == 1) {
    for (int64_t c = 0; c < chunks; ++c) body(c);
  } else if (runtime::in_stream_worker() || t_chunk_team_on_host) {
    runtime::run_chunks(chunks, threads, body);
  } else {
    at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) body(c);
    });
  }
}

// The thread count of a loop started here: one inside a parallel region or
// a chunk, else at::get_num_threads().
inline int loop_threads() {
  return at::in_parallel_region() || runtime::in_run_chunks()
             ? 1
             : at::get_num_threads();
}

// Calls fn(begin, end) over [0, n) in chunks of at least `grain`
// iterations (about 8 per thread: late threads leave work to the others).
template <class Fn>
void parallel_chunks(int64_t n, int64_t grain, const Fn& fn) {
  if (n <= 0) return;
  const int64_t threads = loop_threads();
  const int64_t size = std::max<int64_t>(std::max<int64_t>(grain, 1),
                                         (n + threads * 8 - 1) / (threads * 8));
  const int64_t chunks = (n + size - 1) / size;
  run_chunk_loop(chunks, static_cast<int>(std::min(threads, chunks)),
                 [&](int64_t c) { fn(c * size, std::min(n, (c + 1) * size)); });
}

}  // namespace ember::kernels
