// Pinned (page-locked) host memory: what pin_memory() / pin_memory=True
// CPU tensors live in, as cudaHostAlloc memory does for CUDA. Plain C++,
// no torch headers.
//
// Each allocation is its own anonymous mapping, locked with mlock() so its
// pages stay resident. Locking is bounded by RLIMIT_MEMLOCK: past it the
// memory is still handed out and still counts as pinned (is_pinned() is
// true, the non_blocking copy path applies), only not locked, and the
// statistics say how many bytes are.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ember::runtime {

struct PinnedStats {
  int64_t allocations = 0;    // live pinned allocations
  int64_t bytes = 0;          // their mapped bytes
  int64_t locked_bytes = 0;   // of which mlock() locked
  int64_t lock_failures = 0;  // allocations mlock() refused (accumulated)
};

// Page-aligned, zero-filled. nbytes == 0 returns nullptr. Throws
// std::bad_alloc when the OS refuses the mapping.
void* pinned_allocate(std::size_t nbytes);
// Takes back a pointer from pinned_allocate; nullptr is ignored; anything
// else throws std::invalid_argument.
void pinned_free(void* ptr);
// True if ptr lies inside a live pinned allocation.
bool is_pinned(const void* ptr);
PinnedStats pinned_stats();

// fork() support, called only by the runtime's pthread_atfork handlers
// (device.cpp): the registry's lock is held across fork().
void pinned_lock_for_fork();
void pinned_unlock_after_fork();

}  // namespace ember::runtime
