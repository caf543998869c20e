// Caching allocator for one ember device: host memory handed out the way a
// GPU caching allocator hands out device memory. Plain C++, no torch headers.
//
// Requests are rounded up and served from segments obtained from the OS
// (memory files mapped MAP_SHARED, shareable with other processes). Freed
// blocks go back to size-binned free lists, are split to serve smaller
// requests and coalesced with free neighbours. empty_cache() returns every
// fully free segment to the OS. A memory limit bounds what the
// allocator may reserve; exceeding it raises OutOfMemory after the cache
// has been flushed once.
//
// Private pools (torch.ember.MemPool): a pool has segments of its own; while
// a thread routes allocations to it (begin_allocate_to_pool), that thread's
// requests are served from them only, and blocks freed go back to the pool
// whichever thread frees them.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ember::runtime {

// A private pool's id (the second half of c10's MempoolId_t); 0 is the
// device's default pool.
using PoolId = std::uint64_t;
inline constexpr PoolId kDefaultPool = 0;

// Every pointer handed out is aligned to this many bytes (a cache line,
// and the widest vector register).
inline constexpr std::size_t kAlignment = 64;

// One statistic in the shape torch.cuda.memory_stats reports it.
struct Stat {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t allocated = 0;  // accumulated increases
  int64_t freed = 0;      // accumulated decreases

  void increase(int64_t amount);
  void decrease(int64_t amount);
  void reset_peak() { peak = current; }
  void reset_accumulated() { allocated = freed = 0; }
};

// Names follow c10::CachingDeviceAllocator::DeviceStats so the glue layer
// maps them one to one.
struct MemoryStats {
  Stat allocation;                // blocks handed to clients
  Stat segment;                   // segments obtained from the OS
  Stat active;                    // blocks in use
  Stat inactive_split;            // free blocks inside partly used segments
  Stat allocated_bytes;           // bytes in blocks handed to clients (rounded)
  Stat reserved_bytes;            // bytes in segments
  Stat active_bytes;              // bytes in active blocks
  Stat inactive_split_bytes;      // bytes in inactive split blocks
  Stat requested_bytes;           // bytes clients asked for (unrounded)
  int64_t num_alloc_retries = 0;  // cache flushes forced by the limit
  int64_t num_ooms = 0;           // requests that failed after a flush
  int64_t num_device_alloc = 0;   // segments mapped
  int64_t num_device_free = 0;    // segments unmapped
  // Segments mapped as anonymous private memory instead of a memory file
  // (memfd_create failed, or shared segments were off): blocks in them
  // cross processes by copy. Accumulated, like num_device_alloc.
  int64_t num_unshareable_segments = 0;
};

// Raised when a request cannot be met within the memory limit. The
// allocator's state is unchanged by the failed request.
class OutOfMemory final : public std::runtime_error {
 public:
  OutOfMemory(int device, std::size_t requested, std::size_t allocated,
              std::size_t reserved, std::size_t limit);
  int device;
  std::size_t requested;
  std::size_t allocated;
  std::size_t reserved;
  std::size_t limit;
};

struct Block;  // opaque: a span of a segment
class Stream;

// One segment and its blocks in address order, as snapshot() reports them
// (the shape of torch.cuda.memory_snapshot()'s segments).
struct BlockSnapshot {
  std::uintptr_t address = 0;
  std::size_t size = 0;       // rounded
  std::size_t requested = 0;  // what the client asked for; 0 when free
  bool allocated = false;
};
struct SegmentSnapshot {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  bool small = false;  // the small pool (requests <= 1 MiB)
  PoolId pool = kDefaultPool;
  std::vector<BlockSnapshot> blocks;
};

// A block's bytes as another process can map them: a duplicate of its
// segment's memory file (the caller closes it) and where the pointer lies
// in that file. fd == -1: the memory cannot be shared (not in a segment,
// or a segment without a memory file).
struct SharedSpan {
  int fd = -1;
  std::size_t offset = 0;        // of the pointer, in the file
  std::size_t segment_size = 0;  // the file's size
};

// What allocate() hands out: the pointer, and the handle free() takes back.
struct Allocation {
  void* ptr = nullptr;
  Block* block = nullptr;
};

class CachingAllocator final {
 public:
  // limit_bytes == 0 means the device's whole capacity (physical memory).
  explicit CachingAllocator(int device_index, std::size_t limit_bytes = 0);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // nbytes == 0 returns an empty Allocation. Throws OutOfMemory. Served
  // from the private pool the calling thread routes to, if any.
  Allocation allocate(std::size_t nbytes);
  // For long-lived buffers that kernels stream whole on every use (packed
  // weights): requests above the small-block size are served from
  // segments of their own, of 2 MiB pages of private memory
  // (map_huge_page_memory), whatever pool the thread routes to; smaller
  // ones as allocate(). Those segments are never shared with other
  // processes, and ordinary requests never get their blocks. Counted in
  // every statistic as other segments; empty_cache() returns them once free.
  Allocation allocate_huge_pages(std::size_t nbytes);
  // Takes back a block from allocate(); nullptr is ignored. A block used by
  // other streams (record_stream) is reused only once each of them has
  // passed the point where it was freed (an event recorded there); until
  // then it stays allocated in the statistics.
  void free(Block* block);
  // Marks `block` as used by `stream` (Tensor.record_stream).
  void record_stream(Block* block, Stream& stream);
  // Freed blocks still waiting for their streams (tests).
  std::size_t deferred_frees() const;

  // Returns every cached block whose segment is entirely free to the OS:
  // segments of the default pool and of private pools nobody holds any more
  // (use count 0); a live private pool keeps its cache.
  void empty_cache();
  // Returns the entirely free segments of private pool `pool` (any use
  // count); a pool with use count 0 and no segment left is forgotten.
  void empty_cache(PoolId pool);

  // Private pools, with the reference counting of CUDA's caching allocator.
  // create_pool: a new pool with use count 1 (or one more use of an
  // existing one). release_pool: one use less (throws std::invalid_argument
  // for an unknown pool); at 0 its memory goes back at the next
  // empty_cache() once its blocks are free. pool_use_count: 0 for an
  // unknown pool. Pool 0 is the default pool and cannot be created.
  void create_pool(PoolId pool);
  void release_pool(PoolId pool);
  int pool_use_count(PoolId pool) const;
  // The calling thread's allocations on this device go to `pool` (created
  // if it does not exist) until end_allocate_to_pool(pool); one more use of
  // the pool meanwhile. With several routes on one device, the first begun
  // serves (CUDA's rule: a nested use_mem_pool does not redirect).
  void begin_allocate_to_pool(PoolId pool);
  // Ends the calling thread's latest route to `pool` (throws
  // std::invalid_argument if it has none) and drops its use, as
  // CUDA's endAllocateToPool + releasePool (use_mem_pool's exit).
  void end_allocate_to_pool(PoolId pool);

  MemoryStats stats() const;
  void reset_peak_stats();
  void reset_accumulated_stats();

  void set_memory_limit(std::size_t bytes);  // 0 = capacity
  std::size_t memory_limit() const;
  // Physical memory the device can address (the machine's RAM).
  std::size_t capacity() const { return capacity_; }

  // Every segment with its blocks, by address (memory_snapshot()).
  std::vector<SegmentSnapshot> snapshot() const;
  // Pointer and rounded size of a block allocate() handed out that free()
  // has not taken back (memory observers: profiler, history).
  static std::pair<void*, std::size_t> span(const Block* block);

  // True if ptr lies inside a segment of this allocator.
  bool owns(const void* ptr) const;

  // Zero-copy sharing across processes (caching_allocator_sharing.cpp).
  // Segments are memory files (memfd_create, mapped MAP_SHARED) unless
  // turned off here or the OS refuses one (num_unshareable_segments).
  void set_shared_segments(bool shared);  // for segments mapped from now on
  bool shared_segments() const;
  // The memory file behind `ptr`. The caller keeps the block allocated
  // while another process may map it.
  SharedSpan shared_span(const void* ptr) const;

  int device_index() const { return device_index_; }

  // Segments mapped from now on prefer NUMA node `node` (topology()'s
  // bind_memory); -1 (the default) leaves placement to first touch.
  void bind_to_numa_node(int node);
  int numa_node() const;

  // fork() support, called only by the runtime's pthread_atfork handlers
  // (device.cpp): the forking thread holds the lock across fork(), so the
  // child never inherits it held by a thread that does not exist there.
  void lock_for_fork() { mutex_.lock(); }
  void unlock_after_fork() { mutex_.unlock(); }
  // In the child, with the lock still held by the fork, before anything
  // else runs there: inherited shared segments become private mappings of
  // their files (the child's writes stay in the child; pages it has not
  // written show what the parent writes later, unlike fork's snapshot), and
  // the default pool's inherited segments serve no new request (they go
  // back to the OS once free), so the child's blocks come from fresh,
  // shareable segments.
  void after_fork_in_child();

 private:
  struct State;
  Allocation allocate_from(std::size_t nbytes, bool huge_pages);
  std::size_t memory_limit_locked() const;  // caller holds mutex_
  void free_locked(Block* block);
  // The private pool the calling thread routes to (kDefaultPool if none);
  // looked up only while some thread routes (caching_allocator_pools.cpp).
  PoolId routed_pool() const;
  // record_stream's deferred frees (caching_allocator_streams.cpp).
  void free_after_streams(Block* block, const std::vector<Stream*>& streams);
  void process_deferred_locked();
  const int device_index_;
  const std::size_t capacity_;
  mutable std::mutex mutex_;
  std::unique_ptr<State> state_;
  // Threads with a route to a private pool of this allocator: while 0, the
  // hot path skips the per-thread lookup.
  std::atomic<int> routing_threads_{0};
};

// Size a request is rounded up to (exposed for tests).
std::size_t round_allocation_size(std::size_t nbytes);

}  // namespace ember::runtime
