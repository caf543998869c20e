// fork() while other threads are inside the runtime: the child must never
// inherit a lock held by a thread that does not exist in it (the atfork
// handlers of device.cpp). Each child uses the allocator and the stream
// pool and exits; a child that has not exited after a generous timeout is
// counted as hung and killed.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "ember/runtime/device.h"

namespace ember::runtime {
namespace {

using Clock = std::chrono::steady_clock;

// Waits for `pid`; kills it and returns false if it runs past `timeout`.
bool exited_within(pid_t pid, std::chrono::seconds timeout, int* status) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (waitpid(pid, status, WNOHANG) == pid) return true;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  kill(pid, SIGKILL);
  waitpid(pid, status, 0);
  return false;
}

// What a child does: everything that takes a runtime lock.
[[noreturn]] void child_body() {
  Device& dev = device(0);
  Allocation a = dev.allocator().allocate(100000 * sizeof(float));
  Allocation b = dev.allocator().allocate(3 << 20);
  dev.allocator().free(a.block);
  dev.allocator().free(b.block);
  dev.allocator().empty_cache();
  (void)dev.allocator().stats();
  dev.streams().create();
  dev.synchronize();
  _exit(0);
}

TEST(Fork, ChildNeverInheritsAHeldLock) {
  constexpr int kForks = 300;
  std::atomic<bool> stop{false};
  std::vector<std::thread> hammers;
  // Two threads keep the allocator's and the stream pool's locks busy, the
  // way the reproducer keeps allocating from a Python thread.
  for (int t = 0; t < 2; ++t) {
    hammers.emplace_back([&stop, t] {
      Device& dev = device(0);
      while (!stop.load(std::memory_order_relaxed)) {
        for (std::size_t size : {std::size_t{1000}, std::size_t{50000},
                                 std::size_t{700000}, std::size_t{12} << 20}) {
          Allocation a = dev.allocator().allocate(size);
          dev.allocator().free(a.block);
        }
        if (t == 1) {
          dev.allocator().empty_cache();
          dev.streams().get(kDefaultStreamId);
          (void)dev.allocator().stats();
        }
      }
    });
  }
  int hung = 0;
  int failed = 0;
  int forks = 0;
  // The first hung child fails the test: no need to wait for more.
  for (; forks < kForks && hung == 0; ++forks) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0) << "fork failed";
    if (pid == 0) child_body();
    int status = 0;
    if (!exited_within(pid, std::chrono::seconds(10), &status)) {
      ++hung;
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++failed;
    }
  }
  stop = true;
  for (auto& thread : hammers) thread.join();
  EXPECT_EQ(hung, 0) << "child " << forks << " of " << kForks << " hung";
  EXPECT_EQ(failed, 0) << failed << " of " << forks << " children failed";
}

TEST(Fork, DeviceCreatedInTheChildWorks) {
  // A device the parent never touched is created by the child itself.
  if (device_count() < 2) GTEST_SKIP() << "needs EMBER_DEVICES >= 2";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    Device& dev = device(device_count() - 1);
    Allocation a = dev.allocator().allocate(4096);
    dev.allocator().free(a.block);
    _exit(dev.allocator().stats().allocation.current == 0 ? 0 : 1);
  }
  int status = 0;
  ASSERT_TRUE(exited_within(pid, std::chrono::seconds(20), &status));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST(Fork, ChildOfAnIdleEngineGetsFreshWorkers) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "TSan cannot start threads in a child of a threaded process";
#endif
  // The parent's stream has had a worker; it is gone in the child, which
  // starts its own on the next queued work.
  Stream& stream = device(0).streams().create();
  std::atomic<int> value{0};
  stream.enqueue("parent work", [&value] { value = 1; });
  stream.synchronize();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    stream.enqueue("child work", [&value] { value = 2; });
    stream.synchronize();
    Event event;
    event.record(stream);
    event.synchronize();
    _exit(value == 2 ? 0 : 1);
  }
  int status = 0;
  ASSERT_TRUE(exited_within(pid, std::chrono::seconds(20), &status));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST(Fork, ChildForkedWithWorkInFlightRaisesInsteadOfHanging) {
  Stream& stream = device(0).streams().create();
  std::atomic<bool> release{false};
  stream.enqueue("aten::slow", [&release] {
    while (!release.load())
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int raised = 0;
    for (auto use :
         {+[](Stream& s) { s.synchronize(); }, +[](Stream& s) { s.run([] {}); },
          +[](Stream& s) { s.enqueue("x", [] {}); },
          +[](Stream&) { device(0).streams().default_stream().run([] {}); }}) {
      try {
        use(stream);
      } catch (const ForkedWithWorkInFlight& error) {
        raised += std::string(error.what()).find("spawn") != std::string::npos;
      }
    }
    _exit(raised == 4 && forked_with_work_in_flight() ? 0 : 1);
  }
  int status = 0;
  const bool exited = exited_within(pid, std::chrono::seconds(20), &status);
  release = true;
  stream.synchronize();
  ASSERT_TRUE(exited) << "the child hung";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_FALSE(forked_with_work_in_flight());  // the parent is untouched
}

}  // namespace
}  // namespace ember::runtime

namespace ember::runtime {
namespace {

// report_invalid_configuration is irreversible, so it runs in a child.
TEST(Configuration, ReportedErrorIsRaisedByEveryDeviceUse) {
  ASSERT_EQ(invalid_configuration(), nullptr);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    report_invalid_configuration("EMBER_VERBOSE='7' is invalid");
    report_invalid_configuration("second report");  // the first one stays
    int raised = 0;
    for (auto use :
         {+[] { (void)device_count(); }, +[] { (void)device(0); },
          +[] { check_device_index(0); }, +[] { set_current_device(0); }}) {
      try {
        use();
      } catch (const InvalidConfiguration& error) {
        raised += std::string(error.what()) == "EMBER_VERBOSE='7' is invalid";
      }
    }
    const bool kept =
        *invalid_configuration() == "EMBER_VERBOSE='7' is invalid";
    _exit(raised == 4 && kept ? 0 : 1);
  }
  int status = 0;
  ASSERT_TRUE(exited_within(pid, std::chrono::seconds(20), &status));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_NO_THROW(device_count());  // the parent is untouched
}

}  // namespace
}  // namespace ember::runtime
