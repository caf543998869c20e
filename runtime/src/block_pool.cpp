// Block records and free-block bins of the caching allocator: see
// block_pool.h.
#include "block_pool.h"

#include <algorithm>

namespace ember::runtime {

namespace {

constexpr std::size_t kFirstSlabBlocks = 128;

// splitmix64: treap priorities only need to be unrelated to the keys.
std::uint64_t next_random(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
  z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
  return z ^ (z >> 31);
}

// Makes `child` take its parent's place, the parent becoming its child.
void rotate_up(Block*& root, Block* child) {
  Block* parent = child->parent;
  Block* grandparent = parent->parent;
  if (parent->left == child) {
    parent->left = child->right;
    if (child->right != nullptr) child->right->parent = parent;
    child->right = parent;
  } else {
    parent->right = child->left;
    if (child->left != nullptr) child->left->parent = parent;
    child->left = parent;
  }
  parent->parent = child;
  child->parent = grandparent;
  if (grandparent == nullptr) {
    root = child;
  } else if (grandparent->left == parent) {
    grandparent->left = child;
  } else {
    grandparent->right = child;
  }
}

}  // namespace

void BlockPool::grow() {
  const std::size_t count = storage_.empty()
                                ? kFirstSlabBlocks
                                : slabs_.front().bytes / sizeof(Block) * 2;
  // Both vectors get their room first, so nothing below can throw.
  storage_.reserve(storage_.size() + 1);
  slabs_.reserve(slabs_.size() + 1);
  auto slab = std::make_unique<Block[]>(count);
  for (std::size_t i = count; i-- > 0;) {
    slab[i].priority = static_cast<std::uint32_t>(next_random(rng_));
    give(&slab[i]);
  }
  slabs_.insert(slabs_.begin(), {reinterpret_cast<std::uintptr_t>(slab.get()),
                                 count * sizeof(Block)});
  storage_.push_back(std::move(slab));
}

void FreeBins::insert(Block* block, int bin) {
  Block*& root = roots_[bin];
  block->left = block->right = nullptr;
  Block* parent = nullptr;
  Block** link = &root;
  while (*link != nullptr) {
    parent = *link;
    link = key_less(block, parent) ? &parent->left : &parent->right;
  }
  *link = block;
  block->parent = parent;
  while (block->parent != nullptr &&
         block->parent->priority > block->priority) {
    rotate_up(root, block);
  }
  nonempty_ |= std::uint64_t{1} << bin;
}

void FreeBins::erase(Block* block, int bin) {
  Block*& root = roots_[bin];
  // Rotate the node down, keeping the heap order, until it has at most one
  // child; then splice it out. Only links are used, never keys.
  while (block->left != nullptr && block->right != nullptr) {
    rotate_up(root, block->left->priority < block->right->priority
                        ? block->left
                        : block->right);
  }
  Block* child = block->left != nullptr ? block->left : block->right;
  Block* parent = block->parent;
  if (child != nullptr) child->parent = parent;
  if (parent == nullptr) {
    root = child;
  } else if (parent->left == block) {
    parent->left = child;
  } else {
    parent->right = child;
  }
  block->left = block->right = block->parent = nullptr;
  if (root == nullptr) nonempty_ &= ~(std::uint64_t{1} << bin);
}

}  // namespace ember::runtime
