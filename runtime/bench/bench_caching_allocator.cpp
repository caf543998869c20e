// Micro-benchmark of the caching allocator's hot path: an allocate + free
// pair of one block, as every ember op does for its output. Compares with
// std::malloc/free and posix_memalign/free (what PyTorch's CPU allocator
// uses) for the same sizes, in the same process. Single threaded, except the
// "contended" rows, where two threads hammer one allocator.
//
//   ember_runtime_bench [pairs per repetition (default 2000000)]
//
// Each row is the median over repetitions of ns per allocate+free pair.
// Every block gets one byte written so neither side can elide the pair.
// The "cold" rows measure the path the cache hides: a segment mapped from
// the OS, every page of it written once (the first-touch page faults), and
// unmapped again by empty_cache(), in microseconds per segment.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "ember/runtime/caching_allocator.h"

namespace {

using ember::runtime::Allocation;
using ember::runtime::CachingAllocator;

constexpr int kRepetitions = 7;

inline void touch(void* p) {
  *static_cast<volatile char*>(p) = 1;
  asm volatile("" : : "r"(p) : "memory");
}

template <class Fn>
double median_ns_per_pair(std::size_t pairs, std::size_t pairs_per_call,
                          Fn&& fn) {
  fn(pairs / 10 + 1);  // warm up: segments mapped, pages touched
  std::vector<double> samples;
  for (int r = 0; r < kRepetitions; ++r) {
    const auto start = std::chrono::steady_clock::now();
    fn(pairs);
    const auto stop = std::chrono::steady_clock::now();
    samples.push_back(
        std::chrono::duration<double, std::nano>(stop - start).count() /
        static_cast<double>(pairs * pairs_per_call));
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

struct Row {
  std::string name;
  std::vector<std::size_t> sizes;  // allocated in order, freed in reverse
};

double bench_ember(CachingAllocator& allocator, const Row& row,
                   std::size_t pairs) {
  return median_ns_per_pair(pairs, row.sizes.size(), [&](std::size_t n) {
    Allocation live[8];
    const std::size_t k = row.sizes.size();
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t j = 0; j < k; ++j) {
        live[j] = allocator.allocate(row.sizes[j]);
        touch(live[j].ptr);
      }
      for (std::size_t j = k; j-- > 0;) allocator.free(live[j].block);
    }
  });
}

double bench_malloc(const Row& row, std::size_t pairs) {
  return median_ns_per_pair(pairs, row.sizes.size(), [&](std::size_t n) {
    void* live[8];
    const std::size_t k = row.sizes.size();
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t j = 0; j < k; ++j) {
        live[j] = std::malloc(row.sizes[j]);
        touch(live[j]);
      }
      for (std::size_t j = k; j-- > 0;) std::free(live[j]);
    }
  });
}

double bench_memalign(const Row& row, std::size_t pairs) {
  return median_ns_per_pair(pairs, row.sizes.size(), [&](std::size_t n) {
    void* live[8];
    const std::size_t k = row.sizes.size();
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t j = 0; j < k; ++j) {
        if (posix_memalign(&live[j], 64, row.sizes[j]) != 0) std::abort();
        touch(live[j]);
      }
      for (std::size_t j = k; j-- > 0;) std::free(live[j]);
    }
  });
}

// Two threads, one allocator: ns per pair as seen by each thread.
double bench_ember_contended(CachingAllocator& allocator, std::size_t size,
                             std::size_t pairs) {
  return median_ns_per_pair(pairs, 1, [&](std::size_t n) {
    auto work = [&] {
      for (std::size_t i = 0; i < n; ++i) {
        const Allocation a = allocator.allocate(size);
        touch(a.ptr);
        allocator.free(a.block);
      }
    };
    std::thread other(work);
    work();
    other.join();
  });
}

// One segment's whole life: allocate (maps it), write one byte per page,
// free, empty_cache (unmaps it). Microseconds per segment.
double bench_cold_segment_us(std::size_t size, std::size_t count) {
  CachingAllocator allocator(0);
  return median_ns_per_pair(count, 1,
                            [&](std::size_t n) {
                              for (std::size_t i = 0; i < n; ++i) {
                                const Allocation a = allocator.allocate(size);
                                for (std::size_t offset = 0; offset < size;
                                     offset += 4096) {
                                  touch(static_cast<char*>(a.ptr) + offset);
                                }
                                allocator.free(a.block);
                                allocator.empty_cache();
                              }
                            }) /
         1000.0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t pairs =
      argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 2000000;
  const std::vector<Row> rows = {
      {"256 B", {256}},
      {"4 KiB", {4096}},
      {"64 KiB", {65536}},
      {"1 MiB", {std::size_t{1} << 20}},
      {"mixed 256B/4KiB/64KiB", {256, 4096, 65536}},
  };
  std::printf("ns per allocate+free pair (median of %d x %zu pairs)\n",
              kRepetitions, pairs);
  std::printf("%-24s %10s %10s %14s %8s\n", "size", "ember", "malloc",
              "posix_memalign", "ember/malloc");
  for (const Row& row : rows) {
    CachingAllocator allocator(0);
    const double ember = bench_ember(allocator, row, pairs);
    const double malloc_ns = bench_malloc(row, pairs);
    const double memalign_ns = bench_memalign(row, pairs);
    std::printf("%-24s %10.1f %10.1f %14.1f %8.2fx\n", row.name.c_str(), ember,
                malloc_ns, memalign_ns, ember / malloc_ns);
  }
  for (std::size_t size : {std::size_t{256}, std::size_t{65536}}) {
    CachingAllocator allocator(0);
    std::printf("%-24s %10.1f   (2 threads, one allocator, per thread)\n",
                ("contended " + std::to_string(size) + " B").c_str(),
                bench_ember_contended(allocator, size, pairs / 4));
  }
  for (std::size_t mib : {std::size_t{2}, std::size_t{64}}) {
    const std::size_t count = std::max<std::size_t>(pairs / 20000 / mib, 4);
    std::printf("%-24s %10.1f   (us per segment: map, touch, unmap)\n",
                ("cold " + std::to_string(mib) + " MiB segment").c_str(),
                bench_cold_segment_us(mib << 20, count));
  }
  return 0;
}
