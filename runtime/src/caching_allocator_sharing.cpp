// The caching allocator's side of zero-copy sharing across processes: its
// segments are memory files another process can map (segment_memory.h);
// shared_span() tells where a block lies in one. fork() turns the child's
// inherited segments private. See caching_allocator.h.
#include <unistd.h>

#include <mutex>

#include "caching_allocator_state.h"
#include "ember/runtime/caching_allocator.h"

namespace ember::runtime {

void CachingAllocator::set_shared_segments(bool shared) {
  std::lock_guard<std::mutex> lock(mutex_);
  state_->shared_segments = shared;
}

bool CachingAllocator::shared_segments() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return state_->shared_segments;
}

SharedSpan CachingAllocator::shared_span(const void* ptr) const {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mutex_);
  const auto& segments = state_->segments;
  auto it = segments.upper_bound(address);
  if (it == segments.begin()) return {};
  --it;
  const Segment& segment = *it->second;
  if (address - it->first >= segment.size || segment.fd < 0) return {};
  // Duplicated under the lock: the segment's own descriptor is closed when
  // empty_cache() unmaps it.
  const int fd = dup(segment.fd);
  if (fd < 0) return {};
  return {fd, address - it->first, segment.size};
}

void CachingAllocator::after_fork_in_child() {
  State& state = *state_;
  for (auto& [base, segment] : state.segments) {
    if (segment->fd >= 0) {
      // On failure the mapping stays shared with the parent; nothing else
      // can be done this early in the child.
      (void)make_private_in_child({segment->base, segment->fd}, segment->size);
      segment->fd = -1;
    }
    if (segment->pool != nullptr) continue;  // a MemPool's: still the pool's
    // Free blocks leave the default pool's bins for the inherited pool's.
    for (Block* block = segment->head; block != nullptr; block = block->next) {
      if (block->state == BlockState::kFree) state.remove_free(block);
    }
    segment->pool = &state.inherited;
    ++state.inherited.segments;
    for (Block* block = segment->head; block != nullptr; block = block->next) {
      if (block->state == BlockState::kFree) state.insert_free(block);
    }
  }
}

}  // namespace ember::runtime
