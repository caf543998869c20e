// at::parallel_for's contract for ember's own kernels, run as chunks that
// any free thread takes (runtime/chunk_team.h) instead of an OpenMP region:
// with asynchronous execution the host thread shares the cores with the
// stream's worker, and a region would wait at its barrier for a thread the
// host displaced. Only for loops whose iterations are independent (the
// result must not depend on where the chunks begin), so the bits stay the
// same whatever the thread count or timing.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

#include "ember/runtime/chunk_team.h"

namespace ember::kernels {

// Calls fn(begin, end) over [0, n) in chunks of at least `grain`
// iterations, on the calling thread and the helpers of its team, as many
// threads as at::get_num_threads() (one inside a parallel region or chunk).
template <class Fn>
void parallel_chunks(int64_t n, int64_t grain, const Fn& fn) {
  if (n <= 0) return;
  const bool nested = at::in_parallel_region() || runtime::in_run_chunks();
  const int64_t threads = nested ? 1 : at::get_num_threads();
  // About 8 chunks per thread: late threads leave work to the others.
  const int64_t size = std::max<int64_t>(std::max<int64_t>(grain, 1),
                                         (n + threads * 8 - 1) / (threads * 8));
  const int64_t chunks = (n + size - 1) / size;
  runtime::run_chunks(
      chunks, static_cast<int>(std::min(threads, chunks)),
      [&](int64_t c) { fn(c * size, std::min(n, (c + 1) * size)); });
}

}  // namespace ember::kernels
