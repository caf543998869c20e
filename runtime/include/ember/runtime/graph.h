// Graph capture and replay (the CUDA-graphs model): while a stream captures,
// the units of work submitted to it are also kept, in order, in a
// CapturedGraph; replay() later queues them all on a stream as one unit of
// work, so replaying a graph costs the host one enqueue whatever its size.
// Plain C++, no torch headers.
//
// What a unit is, and that it can run again, is the submitter's business:
// queued work (Stream::enqueue) is recorded as it is; synchronous work
// (Stream::run) cannot be, so the layer above records a replayable form of
// it itself (record()) and refuses what it cannot record.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace ember::runtime {

class Stream;

// A call that is not allowed while a stream captures (a host wait on the
// capturing stream, work that cannot be recorded), as CUDA's
// cudaErrorStreamCaptureUnsupported.
class CaptureError final : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Which host waits a capture forbids while it is underway (CUDA's
// cudaStreamCaptureMode), beyond a wait on the capturing stream itself,
// which every mode forbids. kGlobal: a device-wide wait from any thread
// raises; kThreadLocal: only one from the thread that began the capture;
// kRelaxed: none (the wait also waits for the capturing stream's work,
// which runs while it is recorded).
enum class CaptureMode { kGlobal, kThreadLocal, kRelaxed };

const char* capture_mode_name(CaptureMode mode);

class CapturedGraph final {
 public:
  using Work = std::function<void()>;

  // Appends a unit; `name` (static) names it in a replay error. `from`:
  // the stream that submitted it (cross-stream capture's bookkeeping).
  void record(const char* name, Work work, const Stream* from = nullptr);
  std::size_t size() const;
  // Names of the recorded units, in order (graph inspection, tests).
  std::vector<std::string> names() const;
  // Queues one unit of work on `stream` that runs every recorded unit in
  // order (an error names the unit that failed). Raises std::logic_error
  // for an empty graph or one that is still being captured.
  void replay(Stream& stream) const;
  // The same, run on the calling thread in stream order (Stream::run): for
  // an engine running synchronously, where a hand-off to the worker costs
  // more than it hides. Errors reach the caller directly.
  void replay_inline(Stream& stream) const;
  // Drops every unit (and what the units hold).
  void clear();

  // Set by Stream::begin_capture / end_capture; `origin` is the stream that
  // began the capture.
  void set_capturing(bool capturing, Stream* origin = nullptr);
  bool capturing() const;

  // Cross-stream capture, as CUDA's event fork/join: a stream that waits on
  // an event recorded during the capture joins it (Event::block): its work
  // is recorded here too, in submission order, which is the order a replay
  // runs everything in. Before the capture ends every joined stream must be
  // joined back: the origin waits on an event recorded on it after its last
  // work.
  Stream* origin() const;
  void add_joined(Stream* stream);
  std::vector<Stream*> joined() const;
  // Units `stream` has submitted to this graph so far.
  std::size_t submitted_by(const Stream* stream) const;
  // The origin waited on an event recorded on `stream` when it had
  // submitted `position` units.
  void note_joined_back(const Stream* stream, std::size_t position);
  // Joined streams with work after their last join back.
  std::vector<Stream*> unjoined() const;

 private:
  struct Unit {
    const char* name;
    Work work;
  };
  std::shared_ptr<const std::vector<Unit>> units_for_replay() const;
  static void run_units(const std::vector<Unit>& units);

  mutable std::mutex mutex_;
  // Shared with replays in flight, so clear() never pulls units from under
  // a running replay.
  std::shared_ptr<std::vector<Unit>> units_ =
      std::make_shared<std::vector<Unit>>();
  bool capturing_ = false;
  Stream* origin_ = nullptr;
  struct JoinedStream {
    Stream* stream;
    std::size_t joined_back_at;
  };
  std::vector<JoinedStream> joined_;
  std::unordered_map<const Stream*, std::size_t> submitted_;
};

}  // namespace ember::runtime
