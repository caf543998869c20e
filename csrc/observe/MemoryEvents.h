// Memory events of ember's allocator, for the tools that watch memory:
// PyTorch's profiler (profile_memory=True, the memory timeline) through c10's
// reportMemoryUsageToProfiler, as CUDA's caching allocator reports, and the
// allocation history behind torch.ember.memory._record_memory_history /
// _snapshot (the format torch.cuda._memory_viz renders).
//
// EmberAllocator calls on_allocate / on_free only while memory_observed():
// one relaxed load and one thread-local lookup per allocation otherwise.
#pragma once

#include <c10/core/Allocator.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace torch {
struct CapturedTraceback;
}

namespace ember::observe {

extern std::atomic<bool> g_memory_history_enabled;

inline bool memory_observed() {
  return g_memory_history_enabled.load(std::memory_order_relaxed) ||
         c10::memoryProfilingEnabled();
}

// `size` is the block's rounded size (what the allocator's stats count).
void on_allocate(int device, void* ptr, std::size_t size);
void on_free(int device, void* ptr, std::size_t size);

// What _record_memory_history(enabled, context, stacks, max_entries) keeps.
struct HistorySettings {
  bool enabled = false;  // keep live blocks' stacks ("state" or "all")
  bool trace = false;    // keep the alloc/free history ("all")
  bool stacks_on_alloc = false;
  bool stacks_on_free = false;
  bool cpp_frames = false;      // stacks="all"
  std::size_t max_entries = 0;  // per device; oldest dropped first
};
void set_memory_history(const HistorySettings& settings, bool clear);

struct HistoryEntry {
  const char* action;  // "alloc", "free_requested", "free_completed"
  std::uintptr_t address;
  std::size_t size;
  int64_t time_us;
  std::shared_ptr<torch::CapturedTraceback> frames;  // may be null
};
// The recorded history of `device`, oldest first.
std::vector<HistoryEntry> memory_history(int device);
// The stack that allocated the live block at `address`, or null.
std::shared_ptr<torch::CapturedTraceback> allocation_context(
    int device, std::uintptr_t address);

}  // namespace ember::observe
