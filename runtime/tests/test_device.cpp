// ctest runs this binary with EMBER_DEVICES=4 (see runtime/CMakeLists.txt)
// so the multi-device cases run; run by hand they follow whatever
// EMBER_DEVICES holds.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "ember/runtime/cpu_features.h"
#include "ember/runtime/device.h"

namespace ember::runtime {
namespace {

TEST(ParseDeviceCount, AcceptsIntegersInRange) {
  EXPECT_EQ(parse_device_count(nullptr), 1);  // unset: one device
  EXPECT_EQ(parse_device_count("1"), 1);
  EXPECT_EQ(parse_device_count("8"), 8);
  EXPECT_EQ(parse_device_count("64"), kMaxDevices);
}

TEST(ParseDeviceCount, RejectsAnythingElse) {
  for (const char* bad : {"0", "-1", "abc", "", "65", "2x", " 2", "2 ", "+2",
                          "0x2", "1.5", "99999999999999999999"}) {
    try {
      parse_device_count(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InvalidConfiguration& error) {
      EXPECT_EQ(std::string(error.what()),
                "EMBER_DEVICES='" + std::string(bad) +
                    "' is invalid: expected an integer between 1 and 64");
    }
  }
}

TEST(Device, CountFollowsEnvironment) {
  EXPECT_EQ(device_count(), parse_device_count(std::getenv("EMBER_DEVICES")));
  EXPECT_GE(device_count(), 1);
}

TEST(Device, BadIndexThrowsInvalidDevice) {
  const int count = device_count();
  for (int bad : {-1, count, count + 5}) {
    try {
      device(bad);
      ADD_FAILURE() << "accepted index " << bad;
    } catch (const InvalidDevice& error) {
      EXPECT_EQ(error.index, bad);
      EXPECT_EQ(error.count, count);
      EXPECT_EQ(std::string(error.what()),
                "invalid device index " + std::to_string(bad) + ": ember has " +
                    std::to_string(count) + " device(s) (valid indices 0.." +
                    std::to_string(count - 1) + ")");
    }
  }
  EXPECT_THROW(check_device_index(count), InvalidDevice);
  EXPECT_NO_THROW(check_device_index(count - 1));
  // InvalidDevice is an out_of_range, so generic handlers catch it too.
  EXPECT_THROW(device(-1), std::out_of_range);
}

TEST(Device, EachIndexIsOneLongLivedDevice) {
  const int count = device_count();
  std::vector<Device*> first(count);
  for (int i = 0; i < count; ++i) {
    first[i] = &device(i);
    EXPECT_EQ(first[i]->index(), i);
    EXPECT_EQ(first[i]->allocator().device_index(), i);
    EXPECT_EQ(first[i]->streams().default_stream().device_index(), i);
  }
  // Concurrent first use from many threads still yields one object each.
  std::vector<std::thread> threads;
  std::vector<std::vector<Device*>> seen(8, std::vector<Device*>(count));
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = count - 1; i >= 0; --i) seen[t][i] = &device(i);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const auto& pointers : seen) EXPECT_EQ(pointers, first);
}

TEST(Device, CurrentDeviceIsPerThread) {
  if (device_count() < 2) GTEST_SKIP() << "needs EMBER_DEVICES >= 2";
  const int before = current_device();
  set_current_device(1);
  EXPECT_EQ(current_device(), 1);
  int seen_by_other_thread = -1;
  std::thread([&] {
    seen_by_other_thread = current_device();
    set_current_device(device_count() - 1);
  }).join();
  EXPECT_EQ(seen_by_other_thread, 0);  // new threads start on device 0
  EXPECT_EQ(current_device(), 1);      // untouched by the other thread
  set_current_device(before);
}

TEST(Device, SetCurrentDeviceRejectsBadIndex) {
  const int before = current_device();
  EXPECT_THROW(set_current_device(device_count()), InvalidDevice);
  EXPECT_THROW(set_current_device(-1), InvalidDevice);
  EXPECT_EQ(current_device(), before);
}

TEST(Device, PropertiesDescribeTheHost) {
  const DeviceProperties& properties = device(0).properties();
  EXPECT_EQ(properties.index, 0);
  EXPECT_GE(properties.cores, 1);
  // Devices own disjoint shares of the process's cores (ctest runs with
  // EMBER_DEVICES=4; by hand, one device owns them all).
  const auto shares = partition_cores(allowed_cpus(), device_count());
  EXPECT_EQ(properties.core_ids, shares[0]);
  EXPECT_EQ(properties.cores, static_cast<int>(shares[0].size()));
  if (device_count() == 1) {
    EXPECT_EQ(properties.cores, available_cores());
  }
  EXPECT_GE(properties.numa_node, 0);
  EXPECT_GT(properties.total_memory, 0u);
  EXPECT_EQ(properties.total_memory, physical_memory_bytes());
  EXPECT_EQ(properties.total_memory, device(0).allocator().capacity());
  EXPECT_EQ(properties.isa, cpu_features().best_isa());
  EXPECT_EQ(properties.name.rfind("ember (", 0), 0u) << properties.name;
  EXPECT_EQ(properties.name.back(), ')');
  EXPECT_GT(properties.name.size(), std::string("ember ()").size());
  if (device_count() > 1) {
    EXPECT_EQ(device(1).properties().index, 1);
  }
}

}  // namespace
}  // namespace ember::runtime
