#include "ops/StorageWrites.h"

#include <c10/core/StorageImpl.h>

#include <algorithm>
#include <atomic>
#include <unordered_map>

#include "core/ForkSafety.h"

namespace ember {
namespace {

struct Watched {
  int64_t watches = 0;
  uint64_t writes = 0;
};

// A leaf lock (taken under the pack cache's lock, never while taking one).
ForkHeldMutex& registry_mutex() {
  static auto* mutex = new ForkHeldMutex();
  return *mutex;
}
std::unordered_map<const c10::StorageImpl*, Watched>& registry() {
  static auto* watched =
      new std::unordered_map<const c10::StorageImpl*, Watched>();
  return *watched;
}
std::atomic<int64_t> watched_storages{0};
thread_local std::shared_ptr<StorageWriteRecording> t_recording;

const c10::StorageImpl* storage_of(const at::Tensor& t) {
  return t.defined() && t.has_storage() ? t.storage().unsafeGetStorageImpl()
                                        : nullptr;
}

// Adds a watch on `storage`; returns the writes reported so far.
uint64_t add_watch(const c10::StorageImpl* storage) {
  std::lock_guard<ForkHeldMutex> lock(registry_mutex());
  auto [it, inserted] = registry().try_emplace(storage);
  if (inserted) watched_storages.fetch_add(1, std::memory_order_relaxed);
  ++it->second.watches;
  return it->second.writes;
}

}  // namespace

StorageWriteWatch::StorageWriteWatch(const at::Tensor& tensor)
    : storage_(storage_of(tensor)) {
  if (storage_ != nullptr) start_ = add_watch(storage_);
}

StorageWriteWatch::StorageWriteWatch(const StorageWriteWatch& other)
    : storage_(other.storage_), start_(other.start_) {
  if (storage_ != nullptr) add_watch(storage_);
}

StorageWriteWatch& StorageWriteWatch::operator=(
    const StorageWriteWatch& other) {
  if (this != &other) {
    StorageWriteWatch copy(other);
    std::swap(storage_, copy.storage_);
    std::swap(start_, copy.start_);
  }
  return *this;
}

StorageWriteWatch::~StorageWriteWatch() {
  if (storage_ == nullptr) return;
  std::lock_guard<ForkHeldMutex> lock(registry_mutex());
  auto it = registry().find(storage_);
  if (it != registry().end() && --it->second.watches == 0) {
    registry().erase(it);
    watched_storages.fetch_sub(1, std::memory_order_relaxed);
  }
}

bool StorageWriteWatch::written() const {
  if (storage_ == nullptr) return false;
  std::lock_guard<ForkHeldMutex> lock(registry_mutex());
  auto it = registry().find(storage_);
  return it == registry().end() || it->second.writes != start_;
}

void note_storage_write(const at::Tensor& written) {
  if (t_recording != nullptr) [[unlikely]] {
    if (const c10::StorageImpl* storage = storage_of(written)) {
      t_recording->add(storage, written.storage().getWeakStorageImpl());
    }
  }
  if (watched_storages.load(std::memory_order_relaxed) == 0) return;
  const c10::StorageImpl* storage = storage_of(written);
  if (storage == nullptr) return;
  std::lock_guard<ForkHeldMutex> lock(registry_mutex());
  auto it = registry().find(storage);
  if (it != registry().end()) ++it->second.writes;
}

void StorageWriteRecording::begin() {
  outer_ = std::move(t_recording);
  t_recording = shared_from_this();
}

void StorageWriteRecording::end() {
  if (t_recording.get() == this) t_recording = std::move(outer_);
  outer_.reset();
}

void StorageWriteRecording::add(
    const c10::StorageImpl* storage,
    c10::weak_intrusive_ptr<c10::StorageImpl> weak) {
  if (outer_ != nullptr) outer_->add(storage, weak);
  const auto at = std::lower_bound(seen_.begin(), seen_.end(), storage);
  if (at != seen_.end() && *at == storage) return;
  seen_.insert(at, storage);
  storages_.push_back(std::move(weak));
}

void StorageWriteRecording::report() const {
  if (watched_storages.load(std::memory_order_relaxed) == 0) return;
  // A storage released since (and any at its address now) was not written
  // by the replay. The live ones are held until after the lock is released:
  // a storage's last reference may run a Python object's destructor.
  std::vector<c10::intrusive_ptr<c10::StorageImpl>> alive;
  alive.reserve(storages_.size());
  for (const auto& weak : storages_) {
    if (auto storage = weak.lock()) alive.push_back(std::move(storage));
  }
  std::lock_guard<ForkHeldMutex> lock(registry_mutex());
  for (const auto& storage : alive) {
    auto it = registry().find(storage.get());
    if (it != registry().end()) ++it->second.writes;
  }
}

}  // namespace ember
