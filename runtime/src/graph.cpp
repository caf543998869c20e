// Graph capture and replay: see graph.h.
#include "ember/runtime/graph.h"

#include <algorithm>
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

void CapturedGraph::record(const char* name, Work work, const Stream* from) {
  std::lock_guard<std::mutex> lock(mutex_);
  units_->push_back(Unit{name, std::move(work)});
  if (from != nullptr) ++submitted_[from];
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

void CapturedGraph::set_capturing(bool capturing, Stream* origin) {
  std::lock_guard<std::mutex> lock(mutex_);
  capturing_ = capturing;
  if (capturing) {
    origin_ = origin;
    joined_.clear();
    submitted_.clear();
  }
}

Stream* CapturedGraph::origin() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return origin_;
}

void CapturedGraph::add_joined(Stream* stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  joined_.push_back(JoinedStream{stream, 0});
}

std::vector<Stream*> CapturedGraph::joined() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Stream*> out;
  for (const JoinedStream& j : joined_) out.push_back(j.stream);
  return out;
}

std::size_t CapturedGraph::submitted_by(const Stream* stream) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = submitted_.find(stream);
  return it == submitted_.end() ? 0 : it->second;
}

void CapturedGraph::note_joined_back(const Stream* stream,
                                     std::size_t position) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (JoinedStream& j : joined_) {
    if (j.stream == stream) {
      j.joined_back_at = std::max(j.joined_back_at, position);
    }
  }
}

std::vector<Stream*> CapturedGraph::unjoined() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Stream*> out;
  for (const JoinedStream& j : joined_) {
    const auto it = submitted_.find(j.stream);
    const std::size_t submitted = it == submitted_.end() ? 0 : it->second;
    if (submitted > j.joined_back_at) out.push_back(j.stream);
  }
  return out;
}

bool CapturedGraph::capturing() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return capturing_;
}

}  // namespace ember::runtime
