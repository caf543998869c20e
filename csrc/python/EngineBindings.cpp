// torch_ember._C bindings of the execution engine's introspection and test
// hooks: what a device's workers and inline ops run with, and queued work
// that sleeps or fails (how the tests show asynchronous semantics without
// depending on kernel timings).
#include <omp.h>
#include <pthread.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <sched.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/EmberAllocator.h"
#include "core/RuntimeErrors.h"
#include "ember/runtime/device.h"
#include "ember/runtime/stream.h"
#include "graphs/GraphCapture.h"
#include "ops/DeviceScope.h"
#include "ops/LaunchStats.h"
#include "ops/kernels/ConvEpilogue.h"
#include "ops/kernels/elementwise/ElementwiseChain.h"

namespace py = pybind11;

namespace ember {
namespace {

namespace rt = ember::runtime;

rt::Stream& stream_of(int device, int64_t stream_id) {
  return translate_runtime_errors([&]() -> rt::Stream& {
    try {
      return rt::device(device).streams().get(stream_id);
    } catch (const std::out_of_range&) {
      TORCH_CHECK(false, "unknown ember stream id ", stream_id,
                  " on ember:", device);
    }
  });
}

std::vector<int> thread_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  pthread_getaffinity_np(pthread_self(), sizeof(set), &set);
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

}  // namespace

void bind_engine(py::module& m) {
  m.def(
      "_graph_pool_handle", [] { return py::make_tuple(0, new_pool_number()); },
      "A fresh graph memory pool id (torch.ember.graph_pool_handle).");
  m.def(
      "_is_current_stream_capturing",
      [] {
        return capture::underway() &&
               rt::device(rt::current_device()).streams().current().capture() !=
                   nullptr;
      },
      "Whether the current stream of the current device captures a graph.");
  m.def(
      "_engine_enqueue_sleep",
      [](int device, int64_t stream_id, double seconds) {
        stream_of(device, stream_id).enqueue("ember_test_sleep", [seconds] {
          std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
        });
      },
      "Queues work that sleeps `seconds` on a stream (tests, benchmarks).");
  m.def("_engine_keep_workers_awake", &rt::Stream::keep_workers_awake,
        "While set, stream workers count as awake: small launched work is "
        "queued even while a worker sleeps, and tiny work on an idle stream "
        "too (tests that count launched work).");
  m.def(
      "_tiny_work_numel", [] { return kTinyWorkNumel; },
      "Work of at most this many elements runs at the call on an idle "
      "stream, in either engine (idle_stream_for_tiny_work).");
  m.def("_engine_tiny_work_at_call", &set_tiny_work_at_call,
        "Whether tiny work runs at the call on an idle stream (on by "
        "default; off for A/B measurements).");
  m.def(
      "_engine_worker_asleep",
      [](int device, int64_t stream_id) {
        return stream_of(device, stream_id).worker_asleep();
      },
      "Whether the stream's worker sleeps with nothing queued (tests).");
  m.def(
      "_engine_worker_rouses",
      [](int device, int64_t stream_id) {
        return stream_of(device, stream_id).rouses();
      },
      "Wake-ups sent to the stream's sleeping worker without work (tests).");
  m.def(
      "_engine_worker_moves",
      [](int device, int64_t stream_id) {
        return stream_of(device, stream_id).moves_off_host_cpu();
      },
      "Times the stream's worker moved off the core of the host thread "
      "launching to it (tests).");
  m.def(
      "_engine_enqueue_failure",
      [](int device, int64_t stream_id, std::string name, std::string message) {
        // The name must outlive the work: kept by the process.
        const char* kept = (new std::string(std::move(name)))->c_str();
        stream_of(device, stream_id).enqueue(kept, [message] {
          throw std::runtime_error(message);
        });
      },
      "Queues work that throws (tests of asynchronous error reporting).");
  m.def(
      "_engine_worker_threads",
      [](int device, int64_t stream_id) {
        rt::Stream& stream = stream_of(device, stream_id);
        auto result = std::make_shared<std::pair<int, std::vector<int>>>();
        stream.enqueue("ember_worker_threads", [result] {
          result->first = omp_get_max_threads();
          result->second = thread_cpus();
        });
        {
          py::gil_scoped_release no_gil;
          translate_runtime_errors([&] { stream.synchronize(); });
        }
        return *result;
      },
      "(OpenMP thread count, CPU ids) of a stream's worker thread.");
  m.def(
      "_engine_inline_threads",
      [](int device) {
        int threads = 0;
        translate_runtime_errors([&] {
          run_on_device(static_cast<c10::DeviceIndex>(device),
                        [&] { threads = omp_get_max_threads(); });
        });
        return threads;
      },
      "OpenMP thread count an op runs with on this thread.");
  m.def(
      "_engine_bind_thread",
      [](int device) {
        const int cores =
            bind_thread_to_device(static_cast<c10::DeviceIndex>(device));
        return std::make_pair(cores, thread_cpus());
      },
      "Binds the calling thread to a device's cores; returns (cores, the "
      "thread's CPU ids).");
  m.def("_engine_cores_partitioned", [] {
    return translate_runtime_errors([] { return rt::cores_partitioned(); });
  });
  m.def("_engine_forked_with_work_in_flight",
        [] { return rt::forked_with_work_in_flight(); });
  m.def("launch_stats", [] {
    py::dict stats;
    for (const auto& [op, counts] : launch_stats()) {
      py::dict entry;
      entry["launched"] = counts.launched;
      entry["waited"] = counts.waited;
      stats[py::str(op)] = entry;
    }
    return stats;
  });
  m.def("reset_launch_stats", &reset_launch_stats);
  m.def("chain_stats", [] {
    const kernels::ChainStats s = kernels::chain_stats();
    py::dict stats;
    stats["chains"] = s.chains;
    stats["steps"] = s.steps;
    stats["written"] = s.written;
    stats["skipped"] = s.skipped;
    const kernels::EpilogueStats e = kernels::epilogue_stats();
    stats["convolutions"] = e.convolutions;
    stats["epilogue_steps"] = e.steps;
    stats["epilogue_written"] = e.written;
    return stats;
  });
  m.def("reset_chain_stats", [] {
    kernels::reset_chain_stats();
    kernels::reset_epilogue_stats();
  });
}

}  // namespace ember
