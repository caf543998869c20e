#include "observe/Profiler.h"

#include <c10/util/ApproximateClock.h>
#include <libkineto.h>
#include <output_base.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "core/ForkSafety.h"
#include "ember/runtime/device.h"
#include "observe/ExecutionPath.h"

namespace ember::observe {
namespace {

namespace rt = ember::runtime;

// One op's work on an ember stream while a session records.
struct DeviceActivity {
  std::string name;  // how it ran: "delegated" or ember's route

  int device;
  int64_t stream;
  int64_t start_ns;
  int64_t end_ns;
  uint64_t correlation;
};

class EmberProfilerSession;
std::atomic<EmberProfilerSession*> g_recording{nullptr};

// Guards the sessions' activities (one session records at a time): a leaf,
// taken by ops' threads and by stream workers.
ForkHeldMutex activities_mutex;

// Kineto pushes a correlation id when an op starts and pops it when the op
// ends, on the op's thread: the op's start/end for us. A frame is an open op.
struct OpFrame {
  uint64_t correlation;
  int64_t start_ns;
  ExecutionPath outer_path;
  bool child_recorded;
  bool launched = false;  // its work is recorded by the worker that runs it
};
thread_local std::vector<OpFrame> t_frames;

class EmberProfilerSession final : public libkineto::IActivityProfilerSession {
 public:
  void start() override {
    start_ns_ = c10::getTime();
    status_ = libkineto::TraceStatus::RECORDING;
    g_recording.store(this, std::memory_order_release);
  }
  void stop() override {
    for (int i = 0; i < rt::device_count(); ++i) rt::device(i).synchronize();
    g_recording.store(nullptr, std::memory_order_release);
    end_ns_ = c10::getTime();
    status_ = libkineto::TraceStatus::READY;
  }

  void pushCorrelationId(uint64_t id) override {
    t_frames.push_back({id, c10::getTime(), t_path, false});
    t_path = ExecutionPath::kUnmarked;
  }
  void popCorrelationId() override {
    if (t_frames.empty()) return;
    const OpFrame frame = t_frames.back();
    t_frames.pop_back();
    const bool ran_kernel = t_path != ExecutionPath::kUnmarked;
    // The innermost op that ran an ember kernel is the device event; its
    // callers (composite ops) are not counted again.
    const bool record = ran_kernel && !frame.child_recorded && !frame.launched;
    if (record && g_recording.load(std::memory_order_acquire) == this) {
      const int device = rt::current_device();
      const int64_t stream = rt::device(device).streams().current().id();
      std::lock_guard<std::mutex> lock(activities_mutex);
      activities_.push_back({current_op_name(), device, stream, frame.start_ns,
                             c10::getTime(), frame.correlation});
    }
    if (!t_frames.empty() &&
        (record || frame.child_recorded || frame.launched)) {
      t_frames.back().child_recorded = true;
    }
    t_path = ran_kernel ? t_path : frame.outer_path;
  }

  void add_launched(const LaunchTrace& trace, int device, int64_t start_ns,
                    int64_t end_ns) {
    std::lock_guard<std::mutex> lock(activities_mutex);
    activities_.push_back({trace.route, device, trace.stream, start_ns, end_ns,
                           trace.correlation});
  }

  // How the op ran (ExecutionPath.h): ember's route, or CPU's kernel.
  static std::string current_op_name() {
    switch (t_path) {
      case ExecutionPath::kDelegated:
        return "delegated";
      case ExecutionPath::kCopied:
        return "copied";
      default:
        return t_route != nullptr ? t_route : "native";
    }
  }

  std::vector<std::string> errors() override { return {}; }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, nullptr, start_ns_, end_ns_);
  }
  void processTrace(libkineto::ActivityLogger& logger,
                    libkineto::getLinkedActivityCallback linked,
                    int64_t /*start*/, int64_t /*end*/) override {
    std::lock_guard<std::mutex> lock(activities_mutex);
    buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
    buffer_->span = libkineto::TraceSpan(start_ns_, end_ns_, "ember");
    std::set<std::pair<int, int64_t>> rows;
    int32_t id = 0;
    for (const DeviceActivity& a : activities_) {
      const libkineto::ITraceActivity* op =
          linked ? linked(static_cast<int32_t>(a.correlation)) : nullptr;
      // Named after the CPU op that launched it and how it ran, e.g.
      // "ember::mm [onednn]", "ember::relu [delegated]".
      std::string op_name = op != nullptr ? op->name() : "kernel";
      if (op_name.rfind("aten::", 0) == 0) op_name = op_name.substr(6);
      auto activity = std::make_unique<libkineto::GenericTraceActivity>(
          buffer_->span, libkineto::ActivityType::CONCURRENT_KERNEL,
          "ember::" + op_name + " [" + a.name + "]");
      activity->startTime = a.start_ns;
      activity->endTime = a.end_ns;
      activity->id = ++id;
      activity->device = a.device;
      activity->resource = static_cast<int32_t>(a.stream);
      activity->threadId = static_cast<int32_t>(a.stream);
      activity->flow.id = static_cast<uint32_t>(a.correlation);
      activity->flow.type = libkineto::kLinkAsyncCpuGpu;
      activity->flow.start = false;
      activity->linked = op;
      // (addMetadata formats with fmt, which torch's wheel does not export)
      activity->addMetadataQuoted("device",
                                  "ember:" + std::to_string(a.device));
      activity->addMetadataQuoted("stream", std::to_string(a.stream));
      activity->addMetadataQuoted("correlation", std::to_string(a.correlation));
      logger.handleGenericActivity(*activity);
      buffer_->activities.push_back(std::move(activity));
      rows.emplace(a.device, a.stream);
    }
    std::set<int> devices;
    for (const auto& row : rows) devices.insert(row.first);
    for (int device : devices) {
      logger.handleDeviceInfo(
          {device, device, "ember:" + std::to_string(device), "ember"},
          start_ns_);
    }
    for (const auto& [device, stream] : rows) {
      logger.handleResourceInfo(
          {static_cast<int64_t>(stream), static_cast<int64_t>(stream), device,
           "ember:" + std::to_string(device) + " stream " +
               std::to_string(stream)},
          start_ns_);
    }
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return nullptr;
  }
  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    return {};
  }
  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override {
    std::lock_guard<std::mutex> lock(activities_mutex);
    return std::move(buffer_);
  }

 private:
  int64_t start_ns_ = 0;
  int64_t end_ns_ = 0;
  std::vector<DeviceActivity> activities_;
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_;
};

class EmberActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<libkineto::ActivityType>& availableActivities()
      const override {
    return activities_;
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      const std::set<libkineto::ActivityType>& types,
      const libkineto::Config&) override {
    // Kernel activity is what ProfilerActivity.PrivateUse1 asks for; the
    // autograd profiler's use_device="ember" (the stubs below) does not.
    if (types.count(libkineto::ActivityType::CONCURRENT_KERNEL) == 0) {
      return nullptr;
    }
    return std::make_unique<EmberProfilerSession>();
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      int64_t, int64_t, const std::set<libkineto::ActivityType>& types,
      const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_{"ember"};
  std::set<libkineto::ActivityType> activities_{
      libkineto::ActivityType::CONCURRENT_KERNEL,
      libkineto::ActivityType::PRIVATEUSE1_RUNTIME};
};

REGISTER_PRIVATEUSE1_PROFILER(EmberActivityProfiler);

// The autograd profiler's use_device="ember": an event is the point its
// stream reached and the wall time then (work is complete when recorded).
struct StubEvent {
  int64_t ns;
};

class EmberProfilerStubs final : public torch::profiler::impl::ProfilerStubs {
 public:
  void record(c10::DeviceIndex* device,
              torch::profiler::impl::ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    const int index = rt::current_device();
    if (device != nullptr) *device = static_cast<c10::DeviceIndex>(index);
    rt::device(index).streams().current().synchronize();
    auto e = std::make_shared<StubEvent>();
    e->ns = c10::getTime();
    if (cpu_ns != nullptr) *cpu_ns = e->ns;
    *event = std::static_pointer_cast<void>(e);
  }
  float elapsed(
      const torch::profiler::impl::ProfilerVoidEventStub* start,
      const torch::profiler::impl::ProfilerVoidEventStub* end) const override {
    const auto* a = static_cast<const StubEvent*>(start->get());
    const auto* b = static_cast<const StubEvent*>(end->get());
    if (a == nullptr || b == nullptr) return 0.f;
    return static_cast<float>(b->ns - a->ns) / 1000.f;  // microseconds
  }
  void mark(const char*) const override {}
  void rangePush(const char*) const override {}
  void rangePop() const override {}
  bool enabled() const override { return true; }
  void onEachDevice(std::function<void(int)> op) const override {
    const int previous = rt::current_device();
    for (int i = 0; i < rt::device_count(); ++i) {
      rt::set_current_device(i);
      op(i);
    }
    rt::set_current_device(previous);
  }
  void synchronize() const override {
    for (int i = 0; i < rt::device_count(); ++i) rt::device(i).synchronize();
  }
};

}  // namespace

std::optional<LaunchTrace> trace_launch(int64_t stream) {
  EmberProfilerSession* session = g_recording.load(std::memory_order_acquire);
  if (session == nullptr || t_frames.empty()) return std::nullopt;
  t_frames.back().launched = true;
  return LaunchTrace{t_frames.back().correlation,
                     EmberProfilerSession::current_op_name(), stream};
}

void record_launched(const LaunchTrace& trace, int device, int64_t start_ns,
                     int64_t end_ns) {
  // A session stops only after every device's queued work has run.
  if (EmberProfilerSession* session =
          g_recording.load(std::memory_order_acquire)) {
    session->add_launched(trace, device, start_ns, end_ns);
  }
}

int64_t profiler_time_ns() { return c10::getTime(); }

void register_profiler() {
  static const bool registered = [] {
    static EmberProfilerStubs stubs;
    torch::profiler::impl::registerPrivateUse1Methods(&stubs);
    return true;
  }();
  (void)registered;
}

namespace {
// At load time, as the Kineto profiler above.
const bool kStubsRegistered = (register_profiler(), true);
}  // namespace

}  // namespace ember::observe
