// Internals streams and events share (stream.cpp, stream_capture.cpp,
// event.cpp).
#pragma once

#include <atomic>

#include "ember/runtime/stream.h"

namespace ember::runtime {

// An event's completion: set by the worker that reaches its marker (or at
// record, on an idle stream).
struct EventState {
  std::atomic<bool> done{false};
  Event::Clock::time_point time{};
};

// Throws ForkedWithWorkInFlight in a child forked while work was queued.
void check_not_forked_broken();

// Whether any stream of the process is capturing a graph
// (stream_capture.cpp).
bool any_stream_capturing();

}  // namespace ember::runtime
