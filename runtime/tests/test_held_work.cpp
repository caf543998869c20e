// Held work (stream.h, HeldWork): work the host may still extend, submitted
// by the next operation of any kind on its stream, in stream order.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ember/runtime/stream.h"

namespace ember::runtime {
namespace {

// Appends its labels to `log` when it runs; `queued` decides whether its
// submission queues it or runs it at the call.
class Appender final : public HeldWork {
 public:
  Appender(std::vector<std::string>* log, std::string label, bool queued)
      : log_(log), queued_(queued) {
    labels_.push_back(std::move(label));
  }
  void add(std::string label) { labels_.push_back(std::move(label)); }
  void submit(Stream& stream) override {
    ++submissions;
    auto run = [log = log_, labels = labels_] {
      for (const std::string& label : labels) log->push_back(label);
    };
    if (queued_) {
      stream.enqueue("held", run);
    } else {
      stream.run(run);
    }
  }
  static inline std::atomic<int> submissions{0};

 private:
  std::vector<std::string>* log_;
  std::vector<std::string> labels_;
  bool queued_;
};

void hold(Stream& stream, std::vector<std::string>* log, std::string label,
          bool queued) {
  stream.hold(std::make_unique<Appender>(log, std::move(label), queued));
}

bool extend(Stream& stream, std::string label) {
  return stream.extend_held([&](HeldWork& held) {
    static_cast<Appender&>(held).add(std::move(label));
    return true;
  });
}

class HeldWorkTest : public ::testing::TestWithParam<bool> {};

TEST_P(HeldWorkTest, RunsOnlyWhenTheStreamIsNextUsedAndKeepsItsPlace) {
  const bool queued = GetParam();
  StreamPool pool(0);
  Stream& stream = pool.create();
  std::vector<std::string> log;
  stream.enqueue("before", [&log] { log.push_back("before"); });
  hold(stream, &log, "a", queued);
  EXPECT_TRUE(extend(stream, "b"));
  EXPECT_FALSE(stream.query());  // held work is work left
  stream.enqueue("after", [&log] { log.push_back("after"); });
  EXPECT_FALSE(extend(stream, "c"));  // submitted: nothing held any more
  stream.synchronize();
  EXPECT_EQ(log, (std::vector<std::string>{"before", "a", "b", "after"}));
  EXPECT_TRUE(stream.query());
}

TEST_P(HeldWorkTest, EveryHostWaitAndOrderingCallSubmitsIt) {
  const bool queued = GetParam();
  StreamPool pool(0);
  Stream& stream = pool.create();
  Stream& other = pool.create();
  std::vector<std::string> log;
  const auto expect_ran = [&](const char* how, auto&& call) {
    log.clear();
    hold(stream, &log, how, queued);
    call();
    stream.wait_quietly();
    EXPECT_EQ(log, std::vector<std::string>{how}) << how;
  };
  expect_ran("synchronize", [&] { stream.synchronize(); });
  expect_ran("run", [&] { stream.run([] {}); });
  expect_ran("synchronize_all", [&] { pool.synchronize_all(); });
  expect_ran("wait_quietly", [&] {});
  expect_ran("submit_held", [&] { stream.submit_held(); });
  expect_ran("event record", [&] {
    Event event;
    event.record(stream);
    event.synchronize();
  });
  expect_ran("event block", [&] {
    Event event;
    event.record(other);
    event.block(stream);
  });
  log.clear();
  hold(stream, &log, "first", queued);
  hold(stream, &log, "second", queued);  // submits the first
  if (!queued) {
    EXPECT_EQ(log, std::vector<std::string>{"first"});
  }
  stream.synchronize();
  EXPECT_EQ(log, (std::vector<std::string>{"first", "second"}));
}

TEST_P(HeldWorkTest, AnEventRecordedAfterItCompletesAfterIt) {
  const bool queued = GetParam();
  StreamPool pool(0);
  Stream& stream = pool.create();
  std::vector<std::string> log;
  std::atomic<bool> release{false};
  stream.enqueue("gate", [&release] {
    while (!release.load()) std::this_thread::yield();
  });
  hold(stream, &log, "held", queued);
  Event event;
  if (queued) {
    event.record(stream);
    EXPECT_FALSE(event.query());  // behind the gate and the held work
    release = true;
  } else {
    release = true;  // run at the call: waits for the gate first
    event.record(stream);
  }
  event.synchronize();
  EXPECT_EQ(log, std::vector<std::string>{"held"});
}

INSTANTIATE_TEST_SUITE_P(SubmittedAs, HeldWorkTest, ::testing::Bool(),
                         [](const auto& info) {
                           return info.param ? "Queued" : "RunAtTheCall";
                         });

TEST(HeldWork, AnotherThreadsLaunchQueuesBehindIt) {
  // Two threads on one stream: whichever submits the held work, it is in
  // the queue before the other thread's launch that found it held.
  StreamPool pool(0);
  Stream& stream = pool.create();
  for (int round = 0; round < 200; ++round) {
    std::vector<std::string> log;
    hold(stream, &log, "held", /*queued=*/true);
    std::thread other([&] { stream.submit_held(); });
    stream.enqueue("launch", [&log] { log.push_back("launch"); });
    other.join();
    stream.synchronize();
    ASSERT_EQ(log, (std::vector<std::string>{"held", "launch"})) << round;
  }
}

TEST(HeldWork, ShutdownRunsIt) {
  std::vector<std::string> log;
  {
    StreamPool pool(0);
    hold(pool.create(), &log, "held", /*queued=*/true);
    pool.shutdown_all();
  }
  EXPECT_EQ(log, std::vector<std::string>{"held"});
}

}  // namespace
}  // namespace ember::runtime
