// The execution engine: queued work on stream workers, ordering, events with
// completion times, cross-stream waits, asynchronous errors, shutdown with
// work in flight, worker pinning, core partitioning and NUMA binding.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ember/runtime/caching_allocator.h"
#include "ember/runtime/cpu_features.h"
#include "ember/runtime/device.h"
#include "ember/runtime/stream.h"
#include "ember/runtime/topology.h"

namespace ember::runtime {
namespace {

using namespace std::chrono_literals;

// Spins (yielding) until `done()` or the deadline; returns done().
template <class Done>
bool eventually(Done done, std::chrono::milliseconds timeout = 10s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(100us);
  }
  return done();
}

std::string error_of(auto&& call) {
  try {
    call();
  } catch (const AsyncError& e) {
    return e.what();
  }
  return "no AsyncError";
}

TEST(Engine, QueuedWorkRunsInOrderOnAWorkerThread) {
  StreamPool pool(0);
  Stream& stream = pool.create();
  std::vector<int> order;
  std::thread::id worker;
  for (int i = 0; i < 200; ++i) {
    stream.enqueue("append", [&order, &worker, i] {
      order.push_back(i);
      worker = std::this_thread::get_id();
    });
  }
  stream.synchronize();
  ASSERT_EQ(order.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(order[i], i);
  EXPECT_NE(worker, std::this_thread::get_id());
  EXPECT_EQ(stream.completed(), 200u);
  EXPECT_TRUE(stream.query());
}

TEST(Engine, EnqueueReturnsBeforeTheWorkRuns) {
  StreamPool pool(0);
  Stream& stream = pool.default_stream();
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  std::atomic<bool> ran{false};
  stream.enqueue("gated", [opened, &ran] {
    opened.wait();
    ran = true;
  });
  EXPECT_FALSE(stream.query());
  EXPECT_FALSE(ran);
  gate.set_value();
  stream.synchronize();
  EXPECT_TRUE(ran);
  EXPECT_TRUE(stream.query());
}

TEST(Engine, RunWaitsForQueuedWorkFirst) {
  StreamPool pool(0);
  Stream& stream = pool.default_stream();
  std::atomic<int> value{0};
  stream.enqueue("slow write", [&value] {
    std::this_thread::sleep_for(30ms);
    value = 7;
  });
  int seen = -1;
  stream.run([&] { seen = value; });  // inline, after the queued write
  EXPECT_EQ(seen, 7);
}

TEST(Engine, ErrorIsRaisedAtTheNextSynchronizeWithTheOpName) {
  StreamPool pool(1);
  Stream& stream = pool.create();
  std::atomic<bool> later_ran{false};
  // The failing op waits until the next op is queued: an error that is
  // already pending is raised by the next enqueue instead (tested below).
  std::atomic<bool> both_queued{false};
  stream.enqueue("aten::boom", [&both_queued] {
    while (!both_queued) std::this_thread::yield();
    throw std::runtime_error("bad shape");
  });
  stream.enqueue("aten::after", [&later_ran] { later_ran = true; });
  both_queued = true;
  const std::string message = error_of([&] { stream.synchronize(); });
  EXPECT_NE(message.find("aten::boom"), std::string::npos) << message;
  EXPECT_NE(message.find("bad shape"), std::string::npos) << message;
  EXPECT_NE(message.find("ember:1 stream 1"), std::string::npos) << message;
  EXPECT_FALSE(later_ran);  // work behind a failed op is skipped
  // Reported once; the stream works again afterwards.
  EXPECT_NO_THROW(stream.synchronize());
  stream.enqueue("aten::again", [&later_ran] { later_ran = true; });
  stream.synchronize();
  EXPECT_TRUE(later_ran);
}

TEST(Engine, ErrorIsRaisedByTheNextRun) {
  StreamPool pool(0);
  Stream& stream = pool.default_stream();
  stream.enqueue("aten::fail", [] { throw std::runtime_error("oops"); });
  // Let the worker finish the failed work first: the error must still reach
  // the next run, not only a run that finds work queued.
  ASSERT_TRUE(eventually([&] { return stream.query(); }));
  bool ran = false;
  const std::string message =
      error_of([&] { stream.run([&] { ran = true; }); });
  EXPECT_NE(message.find("aten::fail"), std::string::npos) << message;
  EXPECT_FALSE(ran);
}

TEST(Engine, ErrorIsRaisedByTheNextEnqueueWhichQueuesNothing) {
  StreamPool pool(0);
  Stream& stream = pool.default_stream();
  stream.enqueue("aten::fail", [] { throw std::runtime_error("oops"); });
  ASSERT_TRUE(eventually([&] { return stream.query(); }));
  bool ran = false;
  const std::string message =
      error_of([&] { stream.enqueue("aten::next", [&] { ran = true; }); });
  EXPECT_NE(message.find("aten::fail"), std::string::npos) << message;
  stream.synchronize();
  EXPECT_FALSE(ran);
}

// Records the thread that destroys it.
struct DestroyedOn {
  std::shared_ptr<std::thread::id> where;
  explicit DestroyedOn(std::shared_ptr<std::thread::id> w)
      : where(std::move(w)) {}
  DestroyedOn(const DestroyedOn&) = default;
  ~DestroyedOn() {
    if (where.use_count() == 2) *where = std::this_thread::get_id();
  }
};

TEST(Engine, FinishedWorkIsDestroyedBySubmittingThreadsNotTheWorker) {
  StreamPool pool(0);
  Stream& stream = pool.create();
  auto where = std::make_shared<std::thread::id>();
  std::thread::id worker;
  {
    DestroyedOn marker(where);
    stream.enqueue("work",
                   [marker, &worker] { worker = std::this_thread::get_id(); });
  }
  stream.synchronize();  // destroys finished work on this thread
  EXPECT_EQ(*where, std::this_thread::get_id());
  EXPECT_NE(*where, worker);
}

TEST(Engine, EnqueueWaitsWhenTheQueueIsFull) {
  StreamPool pool(0);
  Stream& stream = pool.create();
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  std::atomic<int> submitted{0};
  std::atomic<int> ran{0};
  std::thread producer([&] {
    stream.enqueue("gate", [opened] { opened.wait(); });
    for (int i = 0; i < 1000; ++i) {
      stream.enqueue("count", [&ran] { ++ran; });
      ++submitted;
    }
  });
  // The producer stops well short of 1000 while the worker is held.
  std::this_thread::sleep_for(100ms);
  EXPECT_LT(submitted.load(), 200);
  EXPECT_GT(submitted.load(), 0);
  gate.set_value();
  producer.join();
  stream.synchronize();
  EXPECT_EQ(ran.load(), 1000);
}

TEST(Engine, WorkersKnowTheyAreWorkers) {
  StreamPool pool(0);
  Stream& stream = pool.create();
  std::atomic<bool> inside{false};
  stream.enqueue("probe", [&inside] { inside = in_stream_worker(); });
  stream.synchronize();
  EXPECT_TRUE(inside);
  EXPECT_FALSE(in_stream_worker());
}

TEST(Engine, EventCompletesWhenThePrecedingWorkFinishes) {
  StreamPool pool(0);
  Stream& stream = pool.create();
  Event start(true), end(true);
  start.record(stream);  // nothing queued: complete at once
  EXPECT_TRUE(start.query());
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  stream.enqueue("gated", [opened] {
    opened.wait();
    std::this_thread::sleep_for(25ms);
  });
  end.record(stream);
  EXPECT_FALSE(end.query());
  EXPECT_THROW(start.elapsed_ms(end), std::logic_error);  // not complete
  gate.set_value();
  end.synchronize();
  EXPECT_TRUE(end.query());
  // The end time is when the worker finished the gated work, not when
  // record() was called.
  EXPECT_GE(start.elapsed_ms(end), 25.0);
}

TEST(Engine, BlockOrdersOneStreamAfterAnother) {
  StreamPool pool(0);
  Stream& producer = pool.create();
  Stream& consumer = pool.create();
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  int value = 0;  // plain int: TSan checks the event orders the accesses
  producer.enqueue("produce", [opened, &value] {
    opened.wait();
    value = 42;
  });
  Event produced;
  produced.record(producer);
  produced.block(consumer);
  int seen = -1;
  consumer.enqueue("consume", [&] { seen = value; });
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(consumer.query());  // waiting for the producer's event
  gate.set_value();
  consumer.synchronize();
  EXPECT_EQ(seen, 42);
}

TEST(Engine, BlockOnACompleteEventQueuesNothing) {
  StreamPool pool(0);
  Stream& a = pool.create();
  Stream& b = pool.create();
  Event done;
  done.record(a);
  done.block(b);
  EXPECT_TRUE(b.query());
  EXPECT_EQ(b.completed(), 0u);
}

TEST(Engine, TwoStreamsRunConcurrently) {
  // Each stream's work waits until the other's has started: possible only
  // if both run at once (a single executor would time out).
  StreamPool pool(0);
  Stream& a = pool.create();
  Stream& b = pool.create();
  std::atomic<int> started{0};
  std::atomic<int> met{0};
  auto work = [&] {
    started.fetch_add(1);
    if (eventually([&] { return started.load() == 2; }, 5s)) met.fetch_add(1);
  };
  a.enqueue("a", work);
  b.enqueue("b", work);
  a.synchronize();
  b.synchronize();
  EXPECT_EQ(met.load(), 2);
}

TEST(Engine, ShutdownRunsEverythingQueued) {
  std::atomic<int> ran{0};
  {
    StreamPool pool(0);
    Stream& stream = pool.create();
    for (int i = 0; i < 50; ++i) {
      stream.enqueue("count", [&ran] {
        std::this_thread::sleep_for(200us);
        ran.fetch_add(1);
      });
    }
  }  // destroyed with work in flight
  EXPECT_EQ(ran.load(), 50);
}

TEST(Engine, WorkAfterShutdownRunsInline) {
  StreamPool pool(0);
  Stream& stream = pool.create();
  stream.enqueue("first", [] {});
  stream.shutdown();
  std::thread::id ran_on;
  stream.enqueue("late", [&] { ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  EXPECT_TRUE(stream.query());
}

TEST(CorePartition, SplitsTheAllowedCoresIntoDisjointSets) {
  using Sets = std::vector<std::vector<int>>;
  EXPECT_EQ(partition_cores({0, 1, 2, 3}, 1), (Sets{{0, 1, 2, 3}}));
  EXPECT_EQ(partition_cores({0, 1, 2, 3}, 2), (Sets{{0, 1}, {2, 3}}));
  EXPECT_EQ(partition_cores({0, 1, 2, 3}, 3), (Sets{{0, 1}, {2}, {3}}));
  EXPECT_EQ(partition_cores({4, 5, 9}, 3), (Sets{{4}, {5}, {9}}));
  // More devices than cores: shared, round robin.
  EXPECT_EQ(partition_cores({0, 1}, 4), (Sets{{0}, {1}, {0}, {1}}));
}

TEST(CorePartition, ParsesExplicitCoreSets) {
  using Sets = std::vector<std::vector<int>>;
  const std::vector<int> allowed{0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(parse_device_cores("0-3,4-7", allowed),
            (Sets{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(parse_device_cores("0+2,1+3", allowed), (Sets{{0, 2}, {1, 3}}));
  EXPECT_EQ(parse_device_cores("5", allowed), (Sets{{5}}));
  EXPECT_EQ(parse_device_cores("6-7+0", allowed), (Sets{{0, 6, 7}}));
}

TEST(CorePartition, RejectsInvalidCoreSetsWithTheReason) {
  const std::vector<int> allowed{0, 1, 2, 3};
  auto message_of = [&](const std::string& value) -> std::string {
    try {
      parse_device_cores(value, allowed);
    } catch (const InvalidConfiguration& e) {
      return e.what();
    }
    return "no exception";
  };
  EXPECT_NE(
      message_of("0-1,1-2").find("core 1 is given to ember:0 and ember:1"),
      std::string::npos);
  EXPECT_NE(message_of("0,9").find("core 9 is not available to this process "
                                   "(allowed: 0-3)"),
            std::string::npos);
  EXPECT_NE(message_of("0,,1").find("device 1 has no cores"),
            std::string::npos);
  EXPECT_NE(message_of("x").find("'x' is not a core number"),
            std::string::npos);
  EXPECT_NE(message_of("3-1").find("runs backwards"), std::string::npos);
  EXPECT_NE(message_of("0-").find("is not a core number"), std::string::npos);
  EXPECT_EQ(message_of("0-1"), "no exception");
}

TEST(CorePartition, DevicesReportTheirCores) {
  // ctest runs with EMBER_DEVICES=4: the process's cores split four ways.
  const std::vector<int> allowed = allowed_cpus();
  const auto expected = partition_cores(allowed, device_count());
  for (int i = 0; i < device_count(); ++i) {
    EXPECT_EQ(device_cores(i), expected[i]);
    EXPECT_EQ(device(i).properties().core_ids, expected[i]);
    EXPECT_EQ(device(i).properties().cores,
              static_cast<int>(expected[i].size()));
  }
  bool partitioned = false;
  for (const auto& cores : expected) partitioned |= cores != allowed;
  EXPECT_EQ(cores_partitioned(), partitioned);
}

// A two-node machine: cores 0-1 on node 0, 2-3 on node 1. Records binds.
class FakeTopology final : public Topology {
 public:
  std::vector<int> allowed_cores() const override { return {0, 1, 2, 3}; }
  int node_count() const override { return 2; }
  int node_of_core(int core) const override { return core < 2 ? 0 : 1; }
  bool bind_memory(void* ptr, std::size_t bytes, int node) const override {
    binds.push_back({ptr, bytes, node});
    return true;
  }
  struct Bind {
    void* ptr;
    std::size_t bytes;
    int node;
  };
  mutable std::vector<Bind> binds;
};

TEST(Numa, SegmentsAreBoundToTheDeviceNode) {
  FakeTopology fake;
  set_topology(&fake);
  {
    CachingAllocator allocator(1);
    allocator.bind_to_numa_node(fake.node_of_core(2));
    Allocation a = allocator.allocate(3 << 20);  // one new large segment
    ASSERT_EQ(fake.binds.size(), 1u);
    EXPECT_EQ(fake.binds[0].node, 1);
    EXPECT_LE(static_cast<char*>(fake.binds[0].ptr), static_cast<char*>(a.ptr));
    EXPECT_GE(fake.binds[0].bytes, std::size_t{3} << 20);
    allocator.free(a.block);
    Allocation b = allocator.allocate(1000);  // small pool: a second segment
    EXPECT_EQ(fake.binds.size(), 2u);
    allocator.free(b.block);
  }
  {
    CachingAllocator unbound(0);  // default: first touch, no bind call
    Allocation a = unbound.allocate(1000);
    EXPECT_EQ(fake.binds.size(), 2u);
    unbound.free(a.block);
  }
  set_topology(nullptr);
}

// Cores alternate between two nodes (core % 2).
class AlternatingNodes final : public Topology {
 public:
  std::vector<int> allowed_cores() const override { return allowed_cpus(); }
  int node_count() const override { return 2; }
  int node_of_core(int core) const override { return core % 2; }
  bool bind_memory(void* ptr, std::size_t bytes, int node) const override {
    binds.push_back({ptr, bytes, node});
    return true;
  }
  struct Bind {
    void* ptr;
    std::size_t bytes;
    int node;
  };
  mutable std::vector<Bind> binds;
};

TEST(Numa, ADeviceOnAMultiNodeMachineBindsItsMemoryToItsCoresNode) {
  if (device_count() < 2) GTEST_SKIP() << "needs EMBER_DEVICES >= 2";
  AlternatingNodes fake;
  set_topology(&fake);
  {
    Device dev(1);  // a second Device object for index 1: its own allocator
    const int node = dev.properties().core_ids.front() % 2;
    EXPECT_EQ(dev.properties().numa_node, node);
    EXPECT_EQ(dev.allocator().numa_node(), node);
    Allocation a = dev.allocator().allocate(1000);
    ASSERT_EQ(fake.binds.size(), 1u);
    EXPECT_EQ(fake.binds[0].node, node);
    dev.allocator().free(a.block);
  }
  set_topology(nullptr);
}

// 8 threads x 2 devices x 2 streams: each thread runs a random chain of
// steps on its own data, each step queued on a random stream of a random
// device and ordered after the previous step by an event (cross-stream
// wait). The result must equal the same chain computed serially. Bounded:
// a fixed number of steps. Runs under `make tsan`.
TEST(Engine, StressThreadsDevicesStreamsWithEvents) {
  constexpr int kThreads = 8;
  constexpr int kSteps = 300;
  StreamPool devices[2] = {StreamPool(0), StreamPool(1)};
  Stream* streams[2][2];
  for (int d = 0; d < 2; ++d) {
    streams[d][0] = &devices[d].default_stream();
    streams[d][1] = &devices[d].create();
  }
  std::vector<std::thread> threads;
  std::vector<uint64_t> results(kThreads), expected(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(1234 + t);
      auto value = std::make_shared<uint64_t>(t);
      uint64_t reference = t;
      Event previous;
      for (int step = 0; step < kSteps; ++step) {
        Stream& stream = *streams[rng() % 2][rng() % 2];
        const uint64_t k = rng() % 1000;
        previous.block(stream);
        stream.enqueue("step", [value, k] { *value = *value * 31 + k; });
        reference = reference * 31 + k;
        previous.record(stream);
      }
      previous.synchronize();
      results[t] = *value;
      expected[t] = reference;
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(results, expected);
}

}  // namespace
}  // namespace ember::runtime

namespace ember::runtime {
namespace {

TEST(RecordStream, FreedBlockWaitsForTheStreamsThatUsedIt) {
  CachingAllocator allocator(0);
  StreamPool pool(0);
  Stream& side = pool.create();
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  side.enqueue("busy", [opened] { opened.wait(); });

  Allocation used = allocator.allocate(4096);
  allocator.record_stream(used.block, side);
  allocator.free(used.block);  // the side stream has not passed this point
  EXPECT_EQ(allocator.deferred_frees(), 1u);
  EXPECT_EQ(allocator.stats().allocation.current, 1);
  Allocation other = allocator.allocate(4096);
  EXPECT_NE(other.ptr, used.ptr);  // not handed out again yet
  EXPECT_EQ(allocator.stats().allocation.current, 2);

  gate.set_value();
  side.synchronize();
  Allocation again = allocator.allocate(4096);  // reclaims the deferred block
  EXPECT_EQ(allocator.deferred_frees(), 0u);
  EXPECT_EQ(allocator.stats().allocation.current, 2);  // other + again
  EXPECT_EQ(again.ptr, used.ptr);
  allocator.free(other.block);
  allocator.free(again.block);
  EXPECT_EQ(allocator.stats().allocation.current, 0);
}

TEST(RecordStream, IdleStreamsDoNotDelayTheFree) {
  CachingAllocator allocator(0);
  StreamPool pool(0);
  Stream& side = pool.create();
  Allocation a = allocator.allocate(4096);
  allocator.record_stream(a.block, side);
  allocator.record_stream(a.block, side);  // recorded once
  allocator.free(a.block);
  EXPECT_EQ(allocator.deferred_frees(), 0u);
  EXPECT_EQ(allocator.stats().allocation.current, 0);
  EXPECT_THROW(allocator.record_stream(a.block, side), std::invalid_argument);
}

}  // namespace
}  // namespace ember::runtime

namespace ember::runtime {
namespace {

TEST(LaunchBlocking, ParsesZeroOrOne) {
  EXPECT_FALSE(parse_launch_blocking(nullptr));
  EXPECT_FALSE(parse_launch_blocking(""));
  EXPECT_FALSE(parse_launch_blocking("0"));
  EXPECT_TRUE(parse_launch_blocking("1"));
  try {
    parse_launch_blocking("yes");
    ADD_FAILURE() << "no exception";
  } catch (const InvalidConfiguration& e) {
    EXPECT_STREQ(e.what(),
                 "EMBER_LAUNCH_BLOCKING='yes' is invalid: expected 0 or 1");
  }
}

}  // namespace
}  // namespace ember::runtime
