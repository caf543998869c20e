// Internals of the caching allocator (caching_allocator.cpp): block records,
// the slab pool that recycles them, and the size bins of free blocks. Not
// thread safe; the allocator's mutex guards all of it.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "ember/runtime/caching_allocator.h"

namespace ember::runtime {

struct Segment;
struct PrivatePool;

enum class BlockState : std::uint8_t {
  kRecycled,   // in the BlockPool, describes nothing
  kFree,       // in a FreeBins tree
  kAllocated,  // handed to a client
};

// A span of a segment. Blocks of one segment form a doubly linked list in
// address order, so neighbours are found in O(1) for coalescing. A free
// block is also a node of its bin's treap, keyed by (size, ptr).
struct Block {
  char* ptr = nullptr;
  std::size_t size = 0;
  std::size_t requested = 0;  // what the client asked for, while allocated
  Segment* segment = nullptr;
  Block* prev = nullptr;  // in the segment; unused while recycled
  Block* next = nullptr;  // in the segment; the pool's list while recycled
  Block* left = nullptr;  // treap links, while free
  Block* right = nullptr;
  Block* parent = nullptr;
  std::uint32_t priority = 0;  // treap heap order, fixed for the record
  BlockState state = BlockState::kRecycled;

  // A block that does not cover its whole segment.
  bool is_split() const { return prev != nullptr || next != nullptr; }
};

struct Segment {
  char* base = nullptr;
  std::size_t size = 0;
  // The segment's memory file (segment_memory.h), shared with other
  // processes through it; -1: anonymous private memory (no file could be
  // made, sharing was off, or inherited across fork()), sent by copy.
  int fd = -1;
  bool small = false;
  // The private pool (torch.ember.MemPool) the segment belongs to; nullptr
  // for the device's default pool.
  PrivatePool* pool = nullptr;
  // The block at the segment's base (its record changes as blocks split
  // and merge, and is kept up to date).
  Block* head = nullptr;

  bool fully_free() const {
    return head->state == BlockState::kFree && head->next == nullptr;
  }
};

// Owns every Block record of one allocator. Records are allocated in slabs
// of doubling size and recycled through an intrusive list; they go back to
// the heap only with the pool. So any Block* the allocator ever handed out
// stays dereferenceable, and contains() tells an own record from anything
// else without touching it.
class BlockPool {
 public:
  BlockPool() = default;
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // Makes sure `count` records can be taken without allocating. Throws
  // std::bad_alloc; the pool is unchanged then.
  void reserve(std::size_t count) {
    if (available_ < count) grow();
  }
  // A recycled record; reserve() first.
  Block* take() {
    Block* block = free_;
    free_ = block->next;
    --available_;
    return block;
  }
  void give(Block* block) {
    block->state = BlockState::kRecycled;
    block->next = free_;
    free_ = block;
    ++available_;
  }
  // True if `block` points at a record of this pool (in any state).
  bool contains(const Block* block) const {
    const auto address = reinterpret_cast<std::uintptr_t>(block);
    for (const Slab& slab : slabs_) {
      const std::uintptr_t offset = address - slab.begin;
      if (offset < slab.bytes) return offset % sizeof(Block) == 0;
    }
    return false;
  }

 private:
  struct Slab {
    std::uintptr_t begin;
    std::size_t bytes;
  };
  void grow();

  std::vector<std::unique_ptr<Block[]>> storage_;
  std::vector<Slab> slabs_;  // newest first
  Block* free_ = nullptr;
  std::size_t available_ = 0;
  std::uint64_t rng_ = 0x9e3779b97f4a7c15;  // treap priorities
};

inline constexpr int kNumBins = 64;

// The free blocks of one pool: a treap per log2 size bin, ordered by
// (size, ptr), and a bitmap of the non-empty bins.
class FreeBins {
 public:
  // Smallest free block of at least `size` bytes (`bin` is its bin), lowest
  // address first; nullptr if none.
  Block* best_fit(std::size_t size, int bin) const {
    Block* best = nullptr;
    for (Block* node = roots_[bin]; node != nullptr;) {
      if (node->size >= size) {
        best = node;
        node = node->left;
      } else {
        node = node->right;
      }
    }
    if (best != nullptr) return best;
    const std::uint64_t higher =
        bin + 1 < kNumBins ? nonempty_ >> (bin + 1) : 0;
    if (higher == 0) return nullptr;
    best = roots_[bin + 1 + std::countr_zero(higher)];
    while (best->left != nullptr) best = best->left;
    return best;
  }

  void insert(Block* block, int bin);
  void erase(Block* block, int bin);

  // `block`, a member of bin `old_bin`, got a new size and/or address and
  // belongs in `new_bin` now. Keeps the node where it is when its key still
  // sorts between its neighbours (the common case: a split or merge moves
  // no key past another one), else moves it.
  void rekeyed(Block* block, int old_bin, int new_bin) {
    if (old_bin == new_bin && in_order(block)) return;
    erase(block, old_bin);
    insert(block, new_bin);
  }

 private:
  static bool key_less(const Block* a, const Block* b) {
    return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
  }
  static bool in_order(const Block* block) {
    const Block* before = block->left;
    if (before != nullptr) {
      while (before->right != nullptr) before = before->right;
    } else {
      for (const Block* node = block;
           (before = node->parent) != nullptr && before->left == node;) {
        node = before;
      }
    }
    if (before != nullptr && !key_less(before, block)) return false;
    const Block* after = block->right;
    if (after != nullptr) {
      while (after->left != nullptr) after = after->left;
    } else {
      for (const Block* node = block;
           (after = node->parent) != nullptr && after->right == node;) {
        node = after;
      }
    }
    return after == nullptr || key_less(block, after);
  }

  std::array<Block*, kNumBins> roots_{};
  std::uint64_t nonempty_ = 0;
};

}  // namespace ember::runtime
