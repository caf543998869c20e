// Graph capture and replay: queued work recorded while a stream captures,
// replayed in order as one unit, host waits refused during capture, errors
// naming the unit that failed.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ember/runtime/graph.h"
#include "ember/runtime/stream.h"

namespace ember::runtime {
namespace {

TEST(Graph, CaptureRecordsQueuedWorkAndStillRunsIt) {
  Stream stream(0, 1, 0);
  auto graph = std::make_shared<CapturedGraph>();
  std::vector<int> order;
  stream.begin_capture(graph);
  EXPECT_EQ(stream.capture(), graph.get());
  stream.enqueue("first", [&] { order.push_back(1); });
  stream.enqueue("second", [&] { order.push_back(2); });
  EXPECT_EQ(stream.end_capture(), graph);
  EXPECT_EQ(stream.capture(), nullptr);
  stream.synchronize();
  EXPECT_EQ(order, (std::vector<int>{1, 2}));  // ran once during capture
  EXPECT_EQ(graph->names(), (std::vector<std::string>{"first", "second"}));
}

TEST(Graph, ReplayRunsEveryUnitInOrderAsOneQueuedUnit) {
  Stream stream(0, 1, 0);
  auto graph = std::make_shared<CapturedGraph>();
  std::vector<int> order;
  stream.begin_capture(graph);
  for (int i = 0; i < 5; ++i)
    stream.enqueue("unit", [&order, i] { order.push_back(i); });
  stream.end_capture();
  stream.synchronize();
  order.clear();
  const uint64_t before = stream.completed();
  for (int replay = 0; replay < 3; ++replay) graph->replay(stream);
  stream.synchronize();
  EXPECT_EQ(stream.completed() - before, 3u);  // one unit per replay
  EXPECT_EQ(order,
            (std::vector<int>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4}));
}

TEST(Graph, InlineReplayRunsOnTheCallingThreadAfterQueuedWork) {
  Stream stream(0, 1, 0);
  auto graph = std::make_shared<CapturedGraph>();
  std::vector<int> order;
  stream.begin_capture(graph);
  stream.enqueue("unit", [&order] { order.push_back(1); });
  stream.end_capture();
  stream.synchronize();
  order.clear();
  stream.enqueue("before", [&order] { order.push_back(0); });
  graph->replay_inline(stream);  // waits for "before" first
  EXPECT_EQ(order, (std::vector<int>{0, 1}));
}

TEST(Graph, HostWaitOnACapturingStreamIsRefused) {
  Stream stream(0, 1, 0);
  auto graph = std::make_shared<CapturedGraph>();
  stream.begin_capture(graph);
  EXPECT_THROW(stream.synchronize(), CaptureError);
  EXPECT_THROW(stream.begin_capture(std::make_shared<CapturedGraph>()),
               CaptureError);
  EXPECT_THROW(graph->replay(stream), std::logic_error);  // still capturing
  stream.end_capture();
  stream.synchronize();  // allowed again
}

// Device-wide waits (StreamPool::synchronize_all) under each capture mode,
// from the capturing thread and from another one; a wait on the capturing
// stream itself is refused in every mode.
bool device_wait_refused(StreamPool& pool) {
  try {
    pool.synchronize_all();
    return false;
  } catch (const CaptureError&) {
    return true;
  }
}

bool device_wait_refused_on_another_thread(StreamPool& pool) {
  bool refused = false;
  std::thread other([&] { refused = device_wait_refused(pool); });
  other.join();
  return refused;
}

TEST(Graph, CaptureModeDecidesWhichDeviceWideWaitsAreRefused) {
  struct Expected {
    CaptureMode mode;
    bool same_thread_refused;
    bool other_thread_refused;
  };
  for (const Expected& e : {Expected{CaptureMode::kGlobal, true, true},
                            Expected{CaptureMode::kThreadLocal, true, false},
                            Expected{CaptureMode::kRelaxed, false, false}}) {
    SCOPED_TRACE(capture_mode_name(e.mode));
    StreamPool pool(0);
    Stream& side = pool.create();
    auto graph = std::make_shared<CapturedGraph>();
    std::atomic<int> ran{0};
    side.begin_capture(graph, e.mode);
    side.enqueue("unit", [&] { ran.fetch_add(1); });
    EXPECT_EQ(device_wait_refused(pool), e.same_thread_refused);
    EXPECT_EQ(device_wait_refused_on_another_thread(pool),
              e.other_thread_refused);
    EXPECT_THROW(side.synchronize(), CaptureError);  // every mode
    side.end_capture();
    pool.synchronize_all();  // allowed again
    EXPECT_EQ(ran.load(), 1);
    EXPECT_EQ(graph->size(), 1u);
  }
}

TEST(Graph, AStreamWaitingOnACapturedEventJoinsTheCaptureUntilItEnds) {
  StreamPool pool(0);
  Stream& origin = pool.create();
  Stream& side = pool.create();
  auto graph = std::make_shared<CapturedGraph>();
  origin.begin_capture(graph);
  origin.enqueue("a", [] {});
  Event fork;
  fork.record(origin);
  fork.block(side);
  EXPECT_EQ(side.capture(), graph.get());
  side.enqueue("b", [] {});
  EXPECT_EQ(graph->unjoined(), std::vector<Stream*>{&side});
  Event join;
  join.record(side);
  side.enqueue("c", [] {});  // after the event: not covered by the join
  join.block(origin);
  EXPECT_EQ(graph->unjoined(), std::vector<Stream*>{&side});
  Event join_after_c;
  join_after_c.record(side);
  join_after_c.block(origin);
  EXPECT_TRUE(graph->unjoined().empty());
  origin.end_capture();
  EXPECT_EQ(side.capture(), nullptr);
  pool.synchronize_all();  // nothing captures any more
  EXPECT_EQ(graph->names(), (std::vector<std::string>{"a", "b", "c"}));
}

TEST(Graph, ReplayOfAnEmptyGraphIsRefused) {
  Stream stream(0, 1, 0);
  CapturedGraph graph;
  EXPECT_THROW(graph.replay(stream), std::logic_error);
}

TEST(Graph, AReplayErrorNamesTheUnitAndSurfacesAtTheNextSync) {
  Stream stream(0, 1, 0);
  auto graph = std::make_shared<CapturedGraph>();
  bool fail = false;
  stream.begin_capture(graph);
  stream.enqueue("aten::fine", [] {});
  stream.enqueue("aten::fails", [&fail] {
    if (fail) throw std::runtime_error("bad input");
  });
  stream.end_capture();
  stream.synchronize();
  fail = true;
  graph->replay(stream);
  try {
    stream.synchronize();
    FAIL() << "expected the replay's error";
  } catch (const AsyncError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("aten::fails"), std::string::npos) << message;
    EXPECT_NE(message.find("bad input"), std::string::npos) << message;
  }
}

TEST(Graph, ClearDropsUnitsButNotAReplayInFlight) {
  Stream stream(0, 1, 0);
  auto graph = std::make_shared<CapturedGraph>();
  auto held = std::make_shared<int>(7);
  int seen = 0;
  stream.begin_capture(graph);
  stream.enqueue("reads", [held, &seen] { seen = *held; });
  stream.end_capture();
  stream.synchronize();
  std::weak_ptr<int> watch = held;
  held.reset();
  seen = 0;
  graph->replay(stream);
  graph->clear();
  stream.synchronize();
  EXPECT_EQ(seen, 7);
  stream.collect_finished();
  EXPECT_EQ(graph->size(), 0u);
  EXPECT_TRUE(watch.expired());  // the units' captures went with the graph
}

}  // namespace
}  // namespace ember::runtime
