// run_chunks: every chunk runs exactly once, its writes are visible when the
// call returns, helpers really take chunks, callers on several threads keep
// to their own teams, nested calls run inline, and a forked child (whose
// helpers stayed in the parent) still completes its runs.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "ember/runtime/chunk_team.h"

namespace ember::runtime {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

TEST(ChunkTeam, EveryChunkRunsExactlyOnce) {
  for (int threads : {1, 2, 4, 8}) {
    for (int64_t chunks : {0, 1, 2, 3, 17, 1000}) {
      std::vector<std::atomic<int>> runs(static_cast<size_t>(chunks));
      run_chunks(chunks, threads, [&](int64_t i) {
        runs[static_cast<size_t>(i)].fetch_add(1, std::memory_order_relaxed);
      });
      for (int64_t i = 0; i < chunks; ++i) {
        ASSERT_EQ(runs[static_cast<size_t>(i)].load(), 1)
            << "chunk " << i << " of " << chunks << ", " << threads
            << " threads";
      }
    }
  }
}

TEST(ChunkTeam, WritesOfEveryChunkAreVisibleOnReturn) {
  // Plain (non-atomic) writes: the call's return must order them.
  std::vector<int64_t> out(4096);
  for (int round = 0; round < 200; ++round) {
    run_chunks(64, 2, [&](int64_t c) {
      for (int64_t i = c * 64; i < (c + 1) * 64; ++i) out[i] = i + round;
    });
    for (int64_t i = 0; i < 4096; ++i) ASSERT_EQ(out[i], i + round);
  }
}

TEST(ChunkTeam, HelpersTakeChunks) {
  // Whichever thread takes a chunk first waits until the other chunk has
  // run: only a second thread can run it. Alone, the wait times out.
  std::atomic<int> finished{0};
  std::atomic<bool> timed_out{false};
  run_chunks(2, 2, [&](int64_t) {
    if (finished.fetch_add(1) == 0) {
      const auto deadline = Clock::now() + 10s;
      while (finished.load() < 2 && Clock::now() < deadline) {
        std::this_thread::yield();
      }
      if (finished.load() < 2) timed_out = true;
    }
  });
  EXPECT_FALSE(timed_out.load());
}

TEST(ChunkTeam, CallersOnSeveralThreadsUseTheirOwnTeams) {
  std::vector<std::thread> callers;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&, t] {
      std::vector<int> out(300);
      for (int round = 0; round < 300; ++round) {
        run_chunks(30, 3, [&](int64_t c) {
          for (int64_t i = c * 10; i < (c + 1) * 10; ++i) out[i] = t + round;
        });
        for (int v : out) {
          if (v != t + round) wrong.fetch_add(1);
        }
      }
    });
  }
  for (auto& caller : callers) caller.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(ChunkTeam, ANestedRunRunsInline) {
  std::atomic<int> inner{0};
  run_chunks(4, 2, [&](int64_t) {
    run_chunks(5, 2, [&](int64_t) { inner.fetch_add(1); });
  });
  EXPECT_EQ(inner.load(), 20);
}

TEST(ChunkTeam, AForkedChildCompletesItsRuns) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "TSan cannot start threads in a child of a threaded process";
#endif
  run_chunks(8, 2, [](int64_t) {});  // the parent's team exists
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::vector<std::atomic<int>> runs(100);
    for (int round = 0; round < 50; ++round) {
      run_chunks(100, 2, [&](int64_t i) { runs[i].fetch_add(1); });
    }
    for (auto& r : runs) {
      if (r.load() != 50) _exit(1);
    }
    _exit(0);
  }
  int status = 0;
  const auto deadline = Clock::now() + 20s;
  bool exited = false;
  while (Clock::now() < deadline) {
    if (waitpid(pid, &status, WNOHANG) == pid) {
      exited = true;
      break;
    }
    std::this_thread::sleep_for(1ms);
  }
  if (!exited) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  ASSERT_TRUE(exited) << "the child hung in run_chunks";
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace ember::runtime
