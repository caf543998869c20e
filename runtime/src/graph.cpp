// Graph capture and replay: see graph.h.
#include "ember/runtime/graph.h"

#include <exception>
#include <utility>

#include "ember/runtime/stream.h"

namespace ember::runtime {

const char* capture_mode_name(CaptureMode mode) {
  switch (mode) {
    case CaptureMode::kGlobal:
      return "global";
    case CaptureMode::kThreadLocal:
      return "thread_local";
    case CaptureMode::kRelaxed:
      return "relaxed";
  }
  return "global";
}

void CapturedGraph::record(const char* name, Work work) {
  std::lock_guard<std::mutex> lock(mutex_);
  units_->push_back(Unit{name, std::move(work)});
}

std::size_t CapturedGraph::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return units_->size();
}

std::vector<std::string> CapturedGraph::names() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> out;
  out.reserve(units_->size());
  for (const Unit& unit : *units_) out.emplace_back(unit.name);
  return out;
}

std::shared_ptr<const std::vector<CapturedGraph::Unit>>
CapturedGraph::units_for_replay() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (capturing_) {
    throw std::logic_error("replay of a graph that is still being captured");
  }
  if (units_->empty()) throw std::logic_error("replay of an empty graph");
  return units_;
}

void CapturedGraph::run_units(const std::vector<Unit>& units) {
  for (const Unit& unit : units) {
    try {
      unit.work();
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string(unit.name) + ": " + e.what());
    }
  }
}

void CapturedGraph::replay(Stream& stream) const {
  stream.enqueue("graph replay",
                 [units = units_for_replay()] { run_units(*units); });
}

void CapturedGraph::replay_inline(Stream& stream) const {
  const auto units = units_for_replay();
  stream.run([&] { run_units(*units); });
}

void CapturedGraph::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  units_ = std::make_shared<std::vector<Unit>>();
}

void CapturedGraph::set_capturing(bool capturing) {
  std::lock_guard<std::mutex> lock(mutex_);
  capturing_ = capturing;
}

bool CapturedGraph::capturing() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return capturing_;
}

}  // namespace ember::runtime
