// The caching allocator's record_stream support (Tensor.record_stream): a
// block used by other streams than the one it was allocated for is reused
// only once each of them has passed the point where it was freed. See
// caching_allocator.h; the allocation paths are in caching_allocator.cpp.
#include <stdexcept>
#include <string>
#include <vector>

#include "caching_allocator_state.h"
#include "ember/runtime/caching_allocator.h"
#include "ember/runtime/stream.h"

namespace ember::runtime {

// Caller holds mutex_: frees the deferred blocks whose streams have passed
// their free point.
void CachingAllocator::process_deferred_locked() {
  auto& deferred = state_->deferred;
  std::size_t kept = 0;
  for (std::size_t i = 0; i < deferred.size(); ++i) {
    bool done = true;
    for (const Event& event : deferred[i].events) done = done && event.query();
    if (done) {
      free_locked(deferred[i].block);
    } else {
      deferred[kept++] = std::move(deferred[i]);
    }
  }
  deferred.resize(kept);
}

void CachingAllocator::record_stream(Block* block, Stream& stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  State& state = *state_;
  if (!state.blocks.contains(block) || block->state != BlockState::kAllocated) {
    throw std::invalid_argument(
        "ember:" + std::to_string(device_index_) +
        " allocator: record_stream() of a block that is not allocated here");
  }
  auto& uses = state.stream_uses[block];
  for (Stream* used : uses) {
    if (used == &stream) return;
  }
  uses.push_back(&stream);
}

std::size_t CachingAllocator::deferred_frees() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return state_->deferred.size();
}

// `block` was used by `streams` besides its own (record_stream): it is
// reused once every one of them has passed this point. The events are
// recorded outside the allocator's lock (recording takes the stream's).
void CachingAllocator::free_after_streams(Block* block,
                                          const std::vector<Stream*>& streams) {
  std::vector<Event> events;
  for (Stream* stream : streams) {
    Event event;
    event.record(*stream);
    if (!event.query()) events.push_back(std::move(event));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (events.empty()) {
    free_locked(block);
  } else {
    state_->deferred.push_back({block, std::move(events)});
  }
}

}  // namespace ember::runtime
