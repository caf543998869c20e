// Writes to ember memory that version counters do not see.
//
// ember's packed weights (ops/kernels/matmul/PackedWeights.h) and graph
// replays (graphs/GraphCapture.h) trust a weight's version counter to tell
// them it was written. Views share their base's counter, but aliases made
// another way do not: `param.data` and Inductor's `reinterpret_tensor` get a
// counter of their own, so `param.data.mul_(2)` left the weight's counter
// unchanged and the old pack in use. Every write to ember memory goes
// through ember's op paths (delegated in-place and out= arguments, ember's
// own in-place kernels), which report the storage they write here; a watch
// on a storage sees those writes whichever tensor made them.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace c10 {
struct StorageImpl;
}

namespace ember {

// Counts the writes to one storage from its construction on. Copies watch
// the same storage from the same starting point; cheap to check.
class StorageWriteWatch {
 public:
  StorageWriteWatch() = default;
  explicit StorageWriteWatch(const at::Tensor& tensor);
  StorageWriteWatch(const StorageWriteWatch& other);
  StorageWriteWatch& operator=(const StorageWriteWatch& other);
  ~StorageWriteWatch();

  // Whether a write to the storage was reported since the watch began
  // (false for a default-constructed watch).
  bool written() const;

 private:
  const c10::StorageImpl* storage_ = nullptr;
  uint64_t start_ = 0;
};

// Reports a write to `written`'s storage (an in-place or out= argument).
// Costs one relaxed atomic load while nothing is watched and no recording
// is underway on the calling thread.
void note_storage_write(const at::Tensor& written);

// The storages written on one thread while it records them: a graph's
// capture. A replay writes them again by running the recorded kernels,
// through none of ember's op paths, so it reports them again itself
// (report()). Begun and ended on the thread that captures; recordings
// nest (the inner one also adds to the outer). Owned by a shared_ptr: the
// thread records into it until end(), whoever else lets go of it.
class StorageWriteRecording
    : public std::enable_shared_from_this<StorageWriteRecording> {
 public:
  void begin();  // on this thread, until end()
  void end();    // on the thread that called begin()
  // Reports a write to each recorded storage still alive.
  void report() const;
  // note_storage_write's entry: `storage` was written on this thread.
  void add(const c10::StorageImpl* storage,
           c10::weak_intrusive_ptr<c10::StorageImpl> weak);

 private:
  std::shared_ptr<StorageWriteRecording> outer_;
  std::vector<const c10::StorageImpl*> seen_;  // sorted, for deduplication
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> storages_;
};

}  // namespace ember
