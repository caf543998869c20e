#include "observe/MemoryEvents.h"

#include <Python.h>
#include <torch/csrc/profiler/combined_traceback.h>

#include <chrono>
#include <deque>
#include <mutex>
#include <unordered_map>

#include "core/ForkSafety.h"
#include "ember/runtime/device.h"

namespace ember::observe {

std::atomic<bool> g_memory_history_enabled{false};

namespace {

namespace rt = ember::runtime;

struct DeviceHistory {
  std::deque<HistoryEntry> trace;
  std::unordered_map<std::uintptr_t, std::shared_ptr<torch::CapturedTraceback>>
      live;
};

struct History {
  // A leaf (frames are gathered outside it).
  ForkHeldMutex mutex;
  HistorySettings settings;
  std::vector<DeviceHistory> devices{static_cast<size_t>(rt::kMaxDevices)};
};

History& history() {
  static auto* h = new History();  // used from deleters at exit: never freed
  return *h;
}

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Python frames only on a Python thread: gathering them takes the GIL, and a
// free on a stream's worker thread (no Python thread state) while a Python
// thread holding the GIL waits for that stream would deadlock.
std::shared_ptr<torch::CapturedTraceback> gather(bool cpp) {
  const bool python =
      Py_IsInitialized() && PyGILState_GetThisThreadState() != nullptr;
  if (!python && !cpp) return nullptr;
  return torch::CapturedTraceback::gather(python, /*script=*/python, cpp);
}

// `pending` is what the allocator's totals do not show yet (a block about
// to be freed still counts in them).
void report_to_profiler(int device, void* ptr, int64_t delta, int64_t pending) {
  if (!c10::memoryProfilingEnabled()) return;
  const rt::MemoryStats s = rt::device(device).allocator().stats();
  c10::reportMemoryUsageToProfiler(
      ptr, delta, static_cast<size_t>(s.allocated_bytes.current + pending),
      static_cast<size_t>(s.reserved_bytes.current),
      c10::Device(c10::DeviceType::PrivateUse1,
                  static_cast<c10::DeviceIndex>(device)));
}

void record(int device, const char* action, void* ptr, std::size_t size,
            bool is_alloc) {
  History& h = history();
  std::shared_ptr<torch::CapturedTraceback> frames;
  {
    std::lock_guard<std::mutex> lock(h.mutex);
    if (!h.settings.enabled) return;
  }
  // Stacks are gathered outside the lock (they may take the GIL's view).
  const HistorySettings settings = [&] {
    std::lock_guard<std::mutex> lock(h.mutex);
    return h.settings;
  }();
  if (is_alloc || settings.stacks_on_free) {
    frames = gather(settings.cpp_frames);
  }
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(h.mutex);
  DeviceHistory& d = h.devices[static_cast<size_t>(device)];
  if (is_alloc) {
    d.live[address] = frames;
  } else {
    d.live.erase(address);
  }
  if (!h.settings.trace) return;
  auto push = [&](const char* what,
                  std::shared_ptr<torch::CapturedTraceback> f) {
    d.trace.push_back({what, address, size, now_us(), std::move(f)});
    while (d.trace.size() > h.settings.max_entries) d.trace.pop_front();
  };
  if (is_alloc) {
    push(action, settings.stacks_on_alloc ? frames : nullptr);
  } else {
    // Execution is synchronous: a free completes when it is requested.
    push("free_requested", frames);
    push("free_completed", frames);
  }
}

}  // namespace

void on_allocate(int device, void* ptr, std::size_t size) {
  report_to_profiler(device, ptr, static_cast<int64_t>(size), 0);
  if (g_memory_history_enabled.load(std::memory_order_relaxed)) {
    record(device, "alloc", ptr, size, /*is_alloc=*/true);
  }
}

void on_free(int device, void* ptr, std::size_t size) {
  if (g_memory_history_enabled.load(std::memory_order_relaxed)) {
    record(device, "free", ptr, size, /*is_alloc=*/false);
  }
  // Called before the block goes back: the totals still count it.
  const auto bytes = static_cast<int64_t>(size);
  report_to_profiler(device, ptr, -bytes, -bytes);
}

void set_memory_history(const HistorySettings& settings, bool clear) {
  History& h = history();
  std::lock_guard<std::mutex> lock(h.mutex);
  h.settings = settings;
  if (clear || !settings.enabled) {
    for (DeviceHistory& d : h.devices) {
      d.trace.clear();
      if (!settings.enabled) d.live.clear();
    }
  }
  g_memory_history_enabled.store(settings.enabled, std::memory_order_relaxed);
}

std::vector<HistoryEntry> memory_history(int device) {
  History& h = history();
  std::lock_guard<std::mutex> lock(h.mutex);
  const DeviceHistory& d = h.devices.at(static_cast<size_t>(device));
  return {d.trace.begin(), d.trace.end()};
}

std::shared_ptr<torch::CapturedTraceback> allocation_context(
    int device, std::uintptr_t address) {
  History& h = history();
  std::lock_guard<std::mutex> lock(h.mutex);
  const DeviceHistory& d = h.devices.at(static_cast<size_t>(device));
  auto it = d.live.find(address);
  return it == d.live.end() ? nullptr : it->second;
}

}  // namespace ember::observe
