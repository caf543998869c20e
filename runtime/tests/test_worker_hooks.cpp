// The hooks the layer above installs on stream workers: the start hook
// (after pinning to the device's cores) and the idle hook (once per idle
// spell after work, on the worker).
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "ember/runtime/cpu_features.h"
#include "ember/runtime/stream.h"

namespace ember::runtime {
namespace {

std::atomic<int> hook_calls{0};
std::atomic<int> hook_cores{0};
void count_hook(const WorkerConfig& config) {
  hook_calls.fetch_add(1);
  hook_cores = static_cast<int>(config.cores.size());
}

TEST(WorkerHooks, WorkersArePinnedToTheDeviceCores) {
  const std::vector<int> allowed = allowed_cpus();
  ASSERT_FALSE(allowed.empty());
  auto config = std::make_shared<WorkerConfig>();
  config->device_index = 0;
  config->cores = {allowed.back()};
  set_worker_start_hook(count_hook);
  const int calls_before = hook_calls.load();
  StreamPool pool(0, config);
  Stream& stream = pool.create();
  std::vector<int> worker_cpus;
  stream.enqueue("affinity", [&] {
    cpu_set_t set;
    CPU_ZERO(&set);
    pthread_getaffinity_np(pthread_self(), sizeof(set), &set);
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &set)) worker_cpus.push_back(cpu);
    }
  });
  stream.synchronize();
  set_worker_start_hook(nullptr);
  EXPECT_EQ(worker_cpus, std::vector<int>{allowed.back()});
  EXPECT_EQ(hook_calls.load(), calls_before + 1);
  EXPECT_EQ(hook_cores.load(), 1);
}

std::atomic<int> idle_hook_calls{0};
std::atomic<std::thread::id> idle_hook_thread{};
void count_idle_hook() {
  idle_hook_thread = std::this_thread::get_id();
  idle_hook_calls.fetch_add(1);
}

// Polls (up to 10 s) until the idle hook has run `expected` times in all.
bool idle_hook_calls_reach(int expected) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (idle_hook_calls.load() < expected &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return idle_hook_calls.load() == expected;
}

TEST(WorkerHooks, IdleHookRunsOnTheWorkerOncePerIdleSpellAfterWork) {
  set_worker_idle_hook(count_idle_hook);
  const int before = idle_hook_calls.load();
  StreamPool pool(0);
  Stream& stream = pool.create();
  std::thread::id worker;
  stream.enqueue("first", [&] { worker = std::this_thread::get_id(); });
  stream.synchronize();
  EXPECT_TRUE(idle_hook_calls_reach(before + 1));
  EXPECT_EQ(idle_hook_thread.load(), worker);
  // Idle on: no second call until work has run again.
  std::this_thread::sleep_for(kWorkerIdleHookDelay * 10);
  EXPECT_EQ(idle_hook_calls.load(), before + 1);
  stream.enqueue("second", [] {});
  stream.synchronize();
  EXPECT_TRUE(idle_hook_calls_reach(before + 2));
  set_worker_idle_hook(nullptr);
}

TEST(WorkerHooks, NoIdleHookBeforeAnyWork) {
  set_worker_idle_hook(count_idle_hook);
  const int before = idle_hook_calls.load();
  StreamPool pool(0);
  Stream& stream = pool.create();
  stream.rouse_worker();  // a worker that never ran work
  std::this_thread::sleep_for(kWorkerIdleHookDelay * 10);
  EXPECT_EQ(idle_hook_calls.load(), before);
  set_worker_idle_hook(nullptr);
}

}  // namespace
}  // namespace ember::runtime
