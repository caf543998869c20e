// What the caching allocator reports about itself: its statistics (the
// torch.cuda.memory_stats counters), snapshots of its segments and blocks
// (memory_snapshot) and which memory it owns. See caching_allocator.h.
#include <mutex>
#include <vector>

#include "caching_allocator_state.h"
#include "ember/runtime/caching_allocator.h"

namespace ember::runtime {

namespace {

template <class Fn>
void for_each_stat(MemoryStats& stats, Fn&& fn) {
  for (Stat* stat :
       {&stats.allocation, &stats.segment, &stats.active, &stats.inactive_split,
        &stats.allocated_bytes, &stats.reserved_bytes, &stats.active_bytes,
        &stats.inactive_split_bytes, &stats.requested_bytes}) {
    fn(*stat);
  }
}

}  // namespace

MemoryStats CachingAllocator::stats() const {
  MemoryStats stats;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats = state_->stats;
  }
  stats.active = stats.allocation;
  stats.active_bytes = stats.allocated_bytes;
  return stats;
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  for_each_stat(state_->stats, [](Stat& stat) { stat.reset_peak(); });
}

void CachingAllocator::reset_accumulated_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  MemoryStats& stats = state_->stats;
  for_each_stat(stats, [](Stat& stat) { stat.reset_accumulated(); });
  stats.num_alloc_retries = 0;
  stats.num_ooms = 0;
  stats.num_device_alloc = 0;
  stats.num_device_free = 0;
  stats.num_unshareable_segments = 0;
}

std::vector<SegmentSnapshot> CachingAllocator::snapshot() const {
  std::vector<SegmentSnapshot> out;
  std::lock_guard<std::mutex> lock(mutex_);
  out.reserve(state_->segments.size());
  for (const auto& [base, segment] : state_->segments) {
    SegmentSnapshot& s = out.emplace_back();
    s.address = base;
    s.size = segment->size;
    s.small = segment->small;
    s.pool = segment->pool != nullptr ? segment->pool->id : kDefaultPool;
    for (const Block* b = segment->head; b != nullptr; b = b->next) {
      const bool allocated = b->state == BlockState::kAllocated;
      s.blocks.push_back({reinterpret_cast<std::uintptr_t>(b->ptr), b->size,
                          allocated ? b->requested : 0, allocated});
    }
  }
  return out;
}

std::pair<void*, std::size_t> CachingAllocator::span(const Block* block) {
  return {block->ptr, block->size};
}

bool CachingAllocator::owns(const void* ptr) const {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mutex_);
  const auto& segments = state_->segments;
  auto it = segments.upper_bound(address);
  if (it == segments.begin()) return false;
  --it;
  return address - it->first < it->second->size;
}

}  // namespace ember::runtime
