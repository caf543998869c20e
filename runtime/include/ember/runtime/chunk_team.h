// Chunked parallel loops that never wait for a late thread.
//
// An OpenMP region ends at a barrier every thread of the team must reach, so
// when one of them is descheduled (its core busy with the host's Python
// thread, as it is under asynchronous execution on few cores), the whole
// region waits for it. run_chunks hands out chunks one at a time instead:
// the calling thread takes chunks too and returns as soon as every chunk
// has run, so a helper that wakes late finds nothing left and goes back to
// sleep. Which thread runs a chunk never changes what the chunk computes, so
// results are the same whatever the timing.
#pragma once

#include <cstdint>

namespace ember::runtime {

using ChunkFn = void (*)(const void* context, int64_t chunk);

// Runs fn(context, i) for every i in [0, chunks) on the calling thread and
// up to threads - 1 helper threads of the calling thread's own team
// (started on first use; they inherit the caller's CPU affinity). Returns
// when every chunk has run. fn must not throw. Called from inside a chunk,
// it runs the chunks inline.
void run_chunks(int64_t chunks, int threads, ChunkFn fn, const void* context);

// Whether the calling thread is running a chunk (so a parallel loop inside
// it should not start threads of its own).
bool in_run_chunks();

template <class Body>
void run_chunks(int64_t chunks, int threads, const Body& body) {
  run_chunks(
      chunks, threads,
      [](const void* context, int64_t chunk) {
        (*static_cast<const Body*>(context))(chunk);
      },
      &body);
}

}  // namespace ember::runtime
