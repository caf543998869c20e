// The caching allocator's private pools (torch.ember.MemPool and
// use_mem_pool): their reference counts and the per-thread routes that send
// a thread's allocations to one of them. See caching_allocator.h; the pools'
// segments and free lists live in the State (caching_allocator_state.h).
#include <iterator>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "caching_allocator_state.h"
#include "ember/runtime/caching_allocator.h"

namespace ember::runtime {

namespace {

// One begin_allocate_to_pool of the calling thread not ended yet.
struct PoolRoute {
  const CachingAllocator* allocator;
  PoolId pool;
};
// In the order begun. Per thread, as use_mem_pool's routing is.
thread_local std::vector<PoolRoute> t_routes;

std::size_t routes_to(const CachingAllocator* allocator) {
  std::size_t count = 0;
  for (const PoolRoute& route : t_routes) count += route.allocator == allocator;
  return count;
}

std::string pool_name(int device, PoolId pool) {
  return "ember:" + std::to_string(device) + " allocator: memory pool (0, " +
         std::to_string(pool) + ")";
}

}  // namespace

// The first route begun serves, as in CUDA's caching allocator (its
// get_pool takes the first matching entry of captures_underway), so an
// inner use_mem_pool inside another on the same device does not redirect.
PoolId CachingAllocator::routed_pool() const {
  for (const PoolRoute& route : t_routes) {
    if (route.allocator == this) return route.pool;
  }
  return kDefaultPool;
}

void CachingAllocator::create_pool(PoolId pool) {
  if (pool == kDefaultPool) {
    throw std::invalid_argument(pool_name(device_index_, pool) +
                                " is the default pool; it cannot be created");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto& slot = state_->private_pools[pool];
  if (slot == nullptr) {
    slot = std::make_unique<PrivatePool>();
    slot->id = pool;
  }
  ++slot->use_count;
}

void CachingAllocator::release_pool(PoolId pool) {
  std::lock_guard<std::mutex> lock(mutex_);
  PrivatePool* found = state_->find_pool(pool);
  if (found == nullptr || found->use_count == 0) {
    throw std::invalid_argument(pool_name(device_index_, pool) +
                                " is not held: nothing to release");
  }
  if (--found->use_count == 0 && found->segments == 0) {
    state_->private_pools.erase(pool);
  }
}

int CachingAllocator::pool_use_count(PoolId pool) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = state_->private_pools.find(pool);
  return it == state_->private_pools.end() ? 0 : it->second->use_count;
}

void CachingAllocator::begin_allocate_to_pool(PoolId pool) {
  create_pool(pool);  // one use while the route lasts
  t_routes.push_back({this, pool});
  if (routes_to(this) == 1) {
    routing_threads_.fetch_add(1, std::memory_order_relaxed);
  }
}

void CachingAllocator::end_allocate_to_pool(PoolId pool) {
  for (auto it = t_routes.rbegin(); it != t_routes.rend(); ++it) {
    if (it->allocator != this || it->pool != pool) continue;
    t_routes.erase(std::next(it).base());
    if (routes_to(this) == 0) {
      routing_threads_.fetch_sub(1, std::memory_order_relaxed);
    }
    release_pool(pool);
    return;
  }
  throw std::invalid_argument(pool_name(device_index_, pool) +
                              ": this thread does not allocate to it");
}

void CachingAllocator::empty_cache(PoolId pool) {
  if (pool == kDefaultPool) return empty_cache();
  std::lock_guard<std::mutex> lock(mutex_);
  process_deferred_locked();
  PrivatePool* found = state_->find_pool(pool);
  if (found != nullptr) state_->release_fully_free_segments(found);
}

}  // namespace ember::runtime
