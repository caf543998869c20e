// Held work (Stream::hold): kept until something else happens on the
// stream, then run in stream order, by the held runner, on the thread that
// needs it done or as one queued unit.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ember/runtime/stream.h"

namespace ember::runtime {
namespace {

// Records, in order, which work ran and on which thread.
struct Log {
  std::mutex mutex;
  std::vector<std::string> order;
  std::vector<std::thread::id> threads;
  Stream::Work record(std::string what) {
    return [this, what = std::move(what)] {
      std::lock_guard<std::mutex> lock(mutex);
      order.push_back(what);
      threads.push_back(std::this_thread::get_id());
    };
  }
};

class Ranges final : public RangeWork {
 public:
  explicit Ranges(int64_t n) : memory_{{0x1000, 0x1000 + 4 * n}}, n_(n) {}
  int64_t size() const override { return n_; }
  void run_range(int64_t, int64_t) const override {}
  const std::vector<ByteRange>& memory() const override { return memory_; }

 private:
  std::vector<ByteRange> memory_;
  int64_t n_;
};

TEST(HeldWork, WaitsUntilTheStreamIsWaitedForThenRunsThere) {
  Stream stream(0, 1, 0);
  Log log;
  stream.hold("a", log.record("a"), std::make_shared<Ranges>(8));
  stream.hold("b", log.record("b"), std::make_shared<Ranges>(8));
  EXPECT_TRUE(log.order.empty());
  EXPECT_FALSE(stream.query());
  EXPECT_TRUE(stream.holds_only());
  stream.synchronize();
  EXPECT_EQ(log.order, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(log.threads[0], std::this_thread::get_id());
  EXPECT_TRUE(stream.query());
  EXPECT_FALSE(stream.holds_only());
  EXPECT_EQ(stream.completed(), 2u);
}

TEST(HeldWork, RunsBeforeASynchronousRun) {
  Stream stream(0, 1, 0);
  Log log;
  stream.hold("a", log.record("a"), nullptr);
  stream.run(log.record("run"));
  EXPECT_EQ(log.order, (std::vector<std::string>{"a", "run"}));
}

TEST(HeldWork, GoesAheadOfQueuedWorkAsOneUnit) {
  Stream stream(0, 1, 0);
  Log log;
  stream.hold("a", log.record("a"), nullptr);
  stream.hold("b", log.record("b"), nullptr);
  stream.enqueue("c", log.record("c"));
  EXPECT_FALSE(stream.holds_only());
  stream.synchronize();
  EXPECT_EQ(log.order, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_NE(log.threads[0], std::this_thread::get_id());  // the worker's
  EXPECT_EQ(stream.completed(), 3u);
}

TEST(HeldWork, RunHeldRunsItNowOnTheCaller) {
  Stream stream(0, 1, 0);
  Log log;
  stream.hold("a", log.record("a"), nullptr);
  stream.run_held();
  EXPECT_EQ(log.order, (std::vector<std::string>{"a"}));
  EXPECT_TRUE(stream.query());
  stream.run_held();  // nothing held: nothing to do
  EXPECT_EQ(log.order.size(), 1u);
}

std::vector<std::string>* runner_saw = nullptr;
void recording_runner(std::vector<HeldWork>& units) {
  for (HeldWork& unit : units) {
    runner_saw->push_back(
        std::string(unit.name) +
        (unit.ranges ? ":" + std::to_string(unit.ranges->size()) : ""));
    unit.whole();
  }
}

TEST(HeldWork, TheRunnerGetsTheUnitsInOrderWithTheirRanges) {
  std::vector<std::string> saw;
  runner_saw = &saw;
  set_held_runner(&recording_runner);
  Stream stream(0, 1, 0);
  Log log;
  stream.hold("a", log.record("a"), std::make_shared<Ranges>(16));
  stream.hold("b", log.record("b"), nullptr);
  stream.synchronize();
  set_held_runner(nullptr);  // back to running each unit
  EXPECT_EQ(saw, (std::vector<std::string>{"a:16", "b"}));
  EXPECT_EQ(log.order, (std::vector<std::string>{"a", "b"}));
}

TEST(HeldWork, AnErrorIsRaisedAtTheNextSynchronisationNamingTheWork) {
  Stream stream(0, 1, 0);
  stream.hold(
      "bad op", [] { throw std::runtime_error("boom"); }, nullptr);
  try {
    stream.synchronize();
    FAIL() << "expected AsyncError";
  } catch (const AsyncError& e) {
    EXPECT_NE(std::string(e.what()).find("bad op"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("boom"), std::string::npos);
  }
  EXPECT_TRUE(stream.query());
  stream.synchronize();  // reported once
}

// Held work another thread is running (a device-wide wait reaches every
// stream) comes before what is held or queued after it.
Stream::Work slow(Log& log, std::string what) {
  return [&log, what = std::move(what)] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    log.record(what)();
  };
}

TEST(HeldWork, WorkHeldBehindHeldWorkAnotherThreadRunsWaitsForIt) {
  Stream stream(0, 1, 0);
  Log log;
  stream.hold("a", slow(log, "a"), nullptr);
  std::thread other([&] { stream.synchronize(); });  // runs "a" there
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  stream.hold("b", log.record("b"), nullptr);
  stream.synchronize();
  other.join();
  EXPECT_EQ(log.order, (std::vector<std::string>{"a", "b"}));
}

TEST(HeldWork, WorkQueuedBehindHeldWorkAnotherThreadRunsWaitsForIt) {
  Stream stream(0, 1, 0);
  Log log;
  stream.hold("a", slow(log, "a"), nullptr);
  std::thread other([&] { stream.run_held(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  stream.enqueue("c", log.record("c"));
  stream.synchronize();
  other.join();
  EXPECT_EQ(log.order, (std::vector<std::string>{"a", "c"}));
}

TEST(HeldWork, ShutdownRunsWhatIsHeld) {
  Log log;
  {
    Stream stream(0, 1, 0);
    stream.hold("a", log.record("a"), nullptr);
  }
  EXPECT_EQ(log.order, (std::vector<std::string>{"a"}));
}

}  // namespace
}  // namespace ember::runtime
