#include "ops/kernels/matmul/PackedWeights.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/Storage.h>
#include <c10/util/intrusive_ptr.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <list>
#include <mutex>
#include <unordered_map>

#include "core/CpuAllocationCapture.h"
#include "core/EmberAllocator.h"
#include "graphs/GraphCapture.h"
#include "ops/DeviceScope.h"
#include "ops/kernels/matmul/MklPackedGemm.h"

namespace ember::matmul {
namespace {

// Before packing reads a weight: the work queued on the device (which may
// write it) must have run. A stream capturing a graph refuses host waits;
// packing then waits for that stream's queue only (stream order, as the
// synchronous op around it would).
void wait_before_packing(c10::DeviceIndex device) {
  if (capture::graph_for(device) != nullptr) {
    runtime::device(device).streams().current().run([] {});
    return;
  }
  synchronize_for_host_read(device);
}

// Enough for the weights of a model of a few hundred million fp32
// parameters in both layouts; beyond it the least recently used go.
constexpr int64_t kDefaultLimitBytes = int64_t{4} << 30;
// The row count oneDNN's blocked layout is chosen for: measured as good as
// an exact hint for every M from 17 to 1024 on transformer shapes.
constexpr int64_t kOneDnnRowsHint = 128;

// Which bytes, seen through which view, packed how.
struct Key {
  const c10::StorageImpl* storage;
  int64_t offset, k, n, stride_k, stride_n;
  PackKind kind;
  uint64_t geometry;
  bool operator==(const Key&) const = default;
};

struct KeyHash {
  size_t operator()(const Key& key) const {
    size_t h = std::hash<const void*>()(key.storage);
    for (int64_t v :
         {key.offset, key.k, key.n, key.stride_k, key.stride_n,
          static_cast<int64_t>(key.kind), static_cast<int64_t>(key.geometry)}) {
      h = h * 1000003u ^ std::hash<int64_t>()(v);
    }
    return h;
  }
};

struct Entry {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  uint32_t version;
  // Writes the version counter misses (`weight.data.mul_(2)`).
  StorageWriteWatch writes;
  std::shared_ptr<const PackedWeight> packed;  // null: seen once, not packed
  std::list<Key>::iterator lru;
  // How often it was looked up lately (saturating; halved as lookups go by):
  // what admission weighs a new pack against the packs it would push out.
  uint8_t uses = 1;
};

// Most `Entry::uses` counts: a few passes' worth, so that packs of a model no
// longer run give way within a few passes of the next one.
constexpr uint8_t kMaxUses = 15;

class PackCache {
 public:
  // `b` is K x N for the 2-D kinds; any shape with a `reorder` (its sizes
  // and strides are then part of `geometry`).
  std::shared_ptr<const PackedWeight> find_or_pack(
      const at::Tensor& b, PackKind kind, uint64_t geometry = 0,
      const OneDnnReorder* reorder = nullptr) {
    if (limit_ <= 0) return nullptr;
    const c10::StorageImpl* impl = b.storage().unsafeGetStorageImpl();
    const Key key{impl,        b.storage_offset(),
                  b.size(0),   b.numel() / std::max<int64_t>(b.size(0), 1),
                  b.stride(0), b.stride(-1),
                  kind,        geometry};
    // An inference tensor (a model moved to ember under inference_mode) has
    // no version counter: its writes are seen by the storage watch alone,
    // which every write through ember's op paths reports (StorageWrites.h).
    const uint32_t version =
        b.is_inference()
            ? 0
            : b.unsafeGetTensorImpl()->version_counter().current_version();
    std::lock_guard<std::mutex> lock(mutex_);
    age_uses();
    auto it = entries_.find(key);
    if (it != entries_.end() && it->second.storage.expired()) {
      // A released storage whose address came back: not the same weight.
      erase(it, /*invalidated=*/true);
      it = entries_.end();
    }
    if (it == entries_.end()) {
      sweep_released();
      lru_.push_front(key);
      entries_.emplace(key, Entry{b.storage().getWeakStorageImpl(), version,
                                  StorageWriteWatch(b), nullptr, lru_.begin()});
      return nullptr;
    }
    Entry& entry = it->second;
    lru_.splice(lru_.begin(), lru_, entry.lru);
    entry.uses = static_cast<uint8_t>(std::min<int>(entry.uses + 1, kMaxUses));
    if (entry.version != version || entry.writes.written()) {
      // Written since: the old pack (if any) is stale; pack on the next
      // call that sees these contents again.
      if (entry.packed) {
        bytes_ -= static_cast<int64_t>(entry.packed->budget_bytes);
        ++invalidations_;
      }
      entry.packed.reset();
      entry.version = version;
      entry.writes = StorageWriteWatch(b);
      return nullptr;
    }
    if (entry.packed) {
      ++hits_;
      return entry.packed;
    }
    std::shared_ptr<PackedWeight> packed =
        reorder ? pack_with(b, kind, *reorder, entry.uses)
                : pack(b, kind, entry.uses);
    if (!packed) return nullptr;
    bytes_ += static_cast<int64_t>(packed->budget_bytes);
    ++packs_;
    entry.packed = packed;
    evict_over_limit(key);
    return packed;
  }

  PackCacheStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    sweep_released();
    PackCacheStats s;
    for (const auto& [key, entry] : entries_) s.entries += entry.packed ? 1 : 0;
    s.bytes = bytes_;
    s.limit = limit_;
    s.hits = hits_;
    s.packs = packs_;
    s.invalidations = invalidations_;
    s.evictions = evictions_;
    s.admissions_refused = admissions_refused_;
    return s;
  }

  int64_t bytes_on(c10::DeviceIndex device) {
    std::lock_guard<std::mutex> lock(mutex_);
    int64_t bytes = 0;
    for (const auto& [key, entry] : entries_) {
      if (entry.packed && entry.packed->device == device) {
        bytes += static_cast<int64_t>(entry.packed->bytes);
      }
    }
    return bytes;
  }

  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    entries_.clear();
    lru_.clear();
    bytes_ = 0;
    hits_ = packs_ = invalidations_ = evictions_ = admissions_refused_ = 0;
    lookups_since_aging_ = 0;
  }

  // In a forked child: this cache, or a new empty one with the same limit if
  // a thread the child does not have held the lock (maybe mid-update).
  PackCache* in_child() {
    if (mutex_.try_lock()) {
      mutex_.unlock();
      return this;
    }
    auto* fresh = new PackCache();
    fresh->limit_ = limit_;
    return fresh;
  }

  void set_limit(int64_t bytes) {
    TORCH_CHECK_VALUE(bytes >= 0, "pack cache limit must be >= 0, got ", bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    limit_ = bytes;
    evict_over_limit(std::nullopt);
  }

 private:
  using Iterator = std::unordered_map<Key, Entry, KeyHash>::iterator;

  void erase(Iterator it, bool invalidated) {
    if (it->second.packed) {
      bytes_ -= static_cast<int64_t>(it->second.packed->budget_bytes);
      ++(invalidated ? invalidations_ : evictions_);
    }
    lru_.erase(it->second.lru);
    entries_.erase(it);
  }

  // Packs of weights that were released: their memory goes back now.
  void sweep_released() {
    for (auto it = entries_.begin(); it != entries_.end();) {
      auto next = std::next(it);
      if (it->second.storage.expired()) erase(it, /*invalidated=*/true);
      it = next;
    }
  }

  // Halves every entry's use count once the lookups since the last halving
  // reach twice the entries (about two passes over a model's weights).
  void age_uses() {
    const auto period =
        std::max<int64_t>(8, 2 * static_cast<int64_t>(entries_.size()));
    if (++lookups_since_aging_ < period) return;
    lookups_since_aging_ = 0;
    for (auto& [key, entry] : entries_) entry.uses /= 2;
  }

  // Whether a new pack of `budget` bytes, of a weight used `uses` times
  // lately, goes in: it fits beside the others, or every pack least recently
  // used that it would push out is used at least two times less (a tie
  // keeps the packs held, so they do not churn as the counts age). LRU alone
  // thrashes when a model's packs exceed the budget: each pass evicts every
  // pack just before its next use and re-packs it. Refused, the packs held
  // stay and this weight takes the unpacked route (counted).
  bool admits(size_t budget, uint8_t uses) {
    int64_t over = bytes_ + static_cast<int64_t>(budget) - limit_;
    for (auto key = lru_.rbegin(); over > 0 && key != lru_.rend(); ++key) {
      const Entry& victim = entries_.find(*key)->second;
      if (!victim.packed) continue;
      if (victim.uses + 1 >= uses) {
        ++admissions_refused_;
        return false;
      }
      over -= static_cast<int64_t>(victim.packed->budget_bytes);
    }
    return true;
  }

  void evict_over_limit(std::optional<Key> keep) {
    // Oldest first; the pack just made stays even when it alone exceeds
    // the budget (it was checked against the limit before packing).
    for (auto key = lru_.rbegin(); bytes_ > limit_ && key != lru_.rend();) {
      auto it = entries_.find(*key);
      ++key;
      if ((keep && it->first == *keep) || !it->second.packed) continue;
      bytes_ -= static_cast<int64_t>(it->second.packed->budget_bytes);
      it->second.packed.reset();
      ++evictions_;
    }
  }

  std::shared_ptr<PackedWeight> pack_with(const at::Tensor& w, PackKind kind,
                                          const OneDnnReorder& reorder,
                                          uint8_t uses) {
    auto packed = std::make_shared<PackedWeight>();
    packed->kind = kind;
    packed->k = w.size(0);
    packed->n = w.numel() / w.size(0);
    packed->bytes = static_cast<size_t>(w.numel()) * w.element_size();
    if (kind == PackKind::kWinogradF32) packed->bytes = packed->bytes / 9 * 16;
    packed->budget_bytes = packed->bytes;
    if (static_cast<int64_t>(packed->budget_bytes) > limit_ ||
        !admits(packed->budget_bytes, uses)) {
      return nullptr;
    }
    packed->device = w.device().index();
    // Packing reads the weight on this thread: work still queued may be
    // writing it. (Packing runs only on submitting threads, never in
    // launched work, so waiting here under the cache lock cannot deadlock.)
    wait_before_packing(packed->device);
    const at::Tensor cpu_weight =
        at::from_blob(const_cast<void*>(w.const_data_ptr()), w.sizes(),
                      w.strides(), at::TensorOptions().dtype(w.scalar_type()));
    try {
      // The blocked copy is allocated through the CPU allocator, so from
      // this device's pool.
      CpuAllocationCapture capture(packed->device);
      packed->onednn = reorder(cpu_weight);
    } catch (const c10::OutOfMemoryError&) {
      return nullptr;
    }
    return packed;
  }

  std::shared_ptr<PackedWeight> pack(const at::Tensor& b, PackKind kind,
                                     uint8_t uses) {
    auto packed = std::make_shared<PackedWeight>();
    packed->kind = kind;
    packed->k = b.size(0);
    packed->n = b.size(1);
    packed->bytes = kind == PackKind::kPanelsF32
                        ? PanelPackedF32::bytes(packed->k, packed->n)
                    : kind == PackKind::kPanelsBf16
                        ? PanelPackedBf16::bytes(packed->k, packed->n)
                    : kind == PackKind::kMklF32
                        ? mkl_pack_bytes(packed->k, packed->n)
                        : static_cast<size_t>(packed->k * packed->n) *
                              (kind == PackKind::kOneDnnBf16 ? 2 : 4);
    // MKL's pack reserves room its data never fills (MklPackedGemm.h): the
    // budget counts the data, the device's memory the whole allocation.
    packed->budget_bytes =
        kind == PackKind::kMklF32
            ? static_cast<size_t>(packed->k * packed->n) * sizeof(float)
            : packed->bytes;
    if (static_cast<int64_t>(packed->budget_bytes) > limit_ ||
        !admits(packed->budget_bytes, uses)) {
      return nullptr;
    }
    const c10::DeviceIndex device = b.device().index();
    packed->device = device;
    wait_before_packing(device);  // as in pack_with
    try {
      if (kind == PackKind::kOneDnn || kind == PackKind::kOneDnnBf16) {
        // oneDNN takes the N x K (Linear) view of B (fp32, or bf16 for a
        // bf16 pack of an fp32 or bf16 B); its blocked copy is allocated
        // through the CPU allocator, so from this device's pool.
        at::Tensor weight =
            at::from_blob(const_cast<void*>(b.const_data_ptr()),
                          {packed->n, packed->k}, {b.stride(1), b.stride(0)},
                          at::TensorOptions().dtype(b.scalar_type()));
        if (kind == PackKind::kOneDnnBf16) weight = weight.to(at::kBFloat16);
        static const auto reorder =
            c10::Dispatcher::singleton()
                .findSchemaOrThrow("mkldnn::_reorder_linear_weight", "")
                .typed<at::Tensor(const at::Tensor&, std::optional<int64_t>)>();
        CpuAllocationCapture capture(device);
        packed->onednn = reorder.call(weight, kOneDnnRowsHint);
      } else {
        // Streamed whole by every GEMM that uses it (start to end per call
        // in decode): 2 MiB pages save the TLB walks of 4 KiB ones.
        packed->panels =
            device_allocator()->allocate_huge_pages_on(device, packed->bytes);
        if (kind == PackKind::kMklF32) {
          mkl_pack_f32(b.const_data_ptr<float>(), packed->k, packed->n,
                       b.stride(0), b.stride(1), packed->panels.get());
        } else if (kind == PackKind::kPanelsF32) {
          pack_panels_f32(b.const_data_ptr<float>(), packed->k, packed->n,
                          b.stride(0), b.stride(1),
                          static_cast<float*>(packed->panels.get()));
        } else if (b.scalar_type() == at::kBFloat16) {
          pack_panels_bf16(static_cast<const uint16_t*>(b.const_data_ptr()),
                           packed->k, packed->n, b.stride(0), b.stride(1),
                           static_cast<uint16_t*>(packed->panels.get()));
        } else {
          pack_panels_bf16(b.const_data_ptr<float>(), packed->k, packed->n,
                           b.stride(0), b.stride(1),
                           static_cast<uint16_t*>(packed->panels.get()));
        }
      }
    } catch (const c10::OutOfMemoryError&) {
      return nullptr;  // no room for a pack: the unpacked route runs
    }
    return packed;
  }

  std::mutex mutex_;
  std::unordered_map<Key, Entry, KeyHash> entries_;
  std::list<Key> lru_;  // most recently used first
  int64_t bytes_ = 0;
  int64_t limit_ = kDefaultLimitBytes;
  int64_t hits_ = 0, packs_ = 0, invalidations_ = 0, evictions_ = 0;
  int64_t admissions_refused_ = 0;
  int64_t lookups_since_aging_ = 0;
};

// Never destroyed: it outlives every tensor.
std::atomic<PackCache*> cache_instance{new PackCache()};

PackCache& cache() { return *cache_instance.load(std::memory_order_acquire); }

// fork(): a child never waits for a cache lock inherited held; it starts
// with an empty cache instead (the inherited one and its packs are left
// behind). The lock is no ForkHeldMutex (core/ForkSafety.h): packing holds
// it while it allocates, and an allocation recorded in the memory history
// takes the GIL for its Python frames, which os.fork() holds while its
// prepare step would wait for this lock (fork() itself deadlocked).
void use_whole_cache_in_child() {
  cache_instance.store(cache().in_child(), std::memory_order_release);
}
const bool fork_handler_installed =
    (pthread_atfork(nullptr, nullptr, use_whole_cache_in_child), true);

}  // namespace

PanelPackedF32 PackedWeight::f32() const {
  return {static_cast<const float*>(panels.get()), k, n};
}

PanelPackedBf16 PackedWeight::bf16() const {
  return {static_cast<const uint16_t*>(panels.get()), k, n};
}

std::shared_ptr<const PackedWeight> packed_weight(const at::Tensor& b,
                                                  PackKind kind) {
  return cache().find_or_pack(b, kind);
}

std::shared_ptr<const PackedWeight> packed_onednn_weight(
    const at::Tensor& weight, PackKind kind, uint64_t geometry,
    const OneDnnReorder& reorder) {
  if (weight.dim() == 0 || weight.numel() == 0) return nullptr;
  return cache().find_or_pack(weight, kind, geometry, &reorder);
}

PackCacheStats pack_cache_stats() { return cache().stats(); }
int64_t pack_cache_bytes_on(c10::DeviceIndex device) {
  return cache().bytes_on(device);
}
void clear_pack_cache() { cache().clear(); }
void set_pack_cache_limit(int64_t bytes) { cache().set_limit(bytes); }

}  // namespace ember::matmul
