#include "ops/HeldElementwise.h"

#include <ATen/ops/as_strided.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <cstdint>

#include "flags/BackendFlags.h"
#include "observe/Profiler.h"
#include "ops/kernels/ParallelChunks.h"
#include "ops/kernels/SerialScope.h"

namespace ember {
namespace {

using ByteRange = runtime::RangeWork::ByteRange;

bool overlap(const ByteRange& a, const ByteRange& b) {
  return a.first < b.second && b.first < a.second;
}

// Ranges run together only where every two of them that share memory are
// the same memory: element i of one is then element i of the other, so
// running the ops range by range reads and writes what running them one by
// one would. Partly overlapping operands (a shifted view of another) would
// not be.
bool compatible(const std::vector<ByteRange>& held,
                const std::vector<ByteRange>& next) {
  for (std::size_t i = 0; i < next.size(); ++i) {
    for (const ByteRange& other : held) {
      if (overlap(next[i], other) && next[i] != other) return false;
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (overlap(next[i], next[j]) && next[i] != next[j]) return false;
    }
  }
  return true;
}

// Bytes per range of one L2-resident pass: every distinct operand's range
// of a chain stays in the core's 2 MB L2 (measured on 2-4 MB L2 cores).
constexpr int64_t kRangeBytes = int64_t{1} << 20;
constexpr int64_t kMinRange = 4096;
constexpr int64_t kMaxRange = int64_t{1} << 16;

// Elements per range: a multiple of 1024 (whole vectors of any dtype, so
// a vector kernel's tail stays at the end of the tensor) whose operands
// all fit kRangeBytes.
int64_t range_elements(const std::vector<ByteRange>& memory, int64_t size) {
  std::vector<ByteRange> distinct(memory);
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  int64_t bytes = 0;
  for (const ByteRange& r : distinct) {
    bytes += static_cast<int64_t>(r.second - r.first);
  }
  const int64_t per_element = std::max<int64_t>(1, bytes / size);
  const int64_t elements = kRangeBytes / per_element / 1024 * 1024;
  return std::clamp(elements, kMinRange, kMaxRange);
}

// units[first, last): one chain, run range by range.
void run_fused(std::vector<runtime::HeldWork>& units, std::size_t first,
               std::size_t last, const std::vector<ByteRange>& memory) {
  const int64_t size = units[first].ranges->size();
  const int64_t step = range_elements(memory, size);
  const int64_t ranges = (size + step - 1) / step;
  kernels::run_chunk_loop(
      ranges,
      static_cast<int>(std::min<int64_t>(kernels::loop_threads(), ranges)),
      [&](int64_t r) {
        // Each range on one thread: the kernels inside run serially (on a
        // stream worker's chunk team, too).
        const kernels::SerialScope one_thread;
        c10::impl::ExcludeDispatchKeyGuard below_autograd(
            c10::autograd_dispatch_keyset_with_ADInplaceOrView);
        const int64_t begin = r * step;
        const int64_t end = std::min(size, begin + step);
        for (std::size_t u = first; u < last; ++u) {
          units[u].ranges->run_range(begin, end);
        }
      });
}

// The held runner: consecutive units over the same elements with
// compatible memory run fused; any other unit runs whole.
void run_held_units(std::vector<runtime::HeldWork>& units) {
  std::size_t first = 0;
  while (first < units.size()) {
    std::size_t last = first + 1;
    std::vector<ByteRange> memory;
    if (units[first].ranges != nullptr &&
        compatible({}, units[first].ranges->memory())) {
      memory = units[first].ranges->memory();
      const int64_t size = units[first].ranges->size();
      while (last < units.size() && units[last].ranges != nullptr &&
             units[last].ranges->size() == size &&
             compatible(memory, units[last].ranges->memory())) {
        const auto& more = units[last].ranges->memory();
        memory.insert(memory.end(), more.begin(), more.end());
        ++last;
      }
    }
    if (last - first == 1) {
      units[first].whole();
    } else {
      run_fused(units, first, last, memory);
    }
    first = last;
  }
}

const bool runner_registered = [] {
  runtime::set_held_runner(&run_held_units);
  return true;
}();

}  // namespace

bool holds_elementwise() {
  return flags::fuse_elementwise() && !flags::cpu_parity() &&
         !flags::deterministic() && !observe::recording_device_activity();
}

std::optional<std::vector<runtime::RangeWork::ByteRange>> elementwise_memory(
    const at::Tensor& out, std::initializer_list<const at::Tensor*> operands) {
  if (!out.is_contiguous() || out.numel() == 0) return std::nullopt;
  std::vector<ByteRange> memory;
  const auto add = [&memory](const at::Tensor& t) {
    const auto begin = reinterpret_cast<std::uintptr_t>(t.const_data_ptr());
    memory.emplace_back(begin, begin + t.nbytes());
  };
  add(out);
  for (const at::Tensor* t : operands) {
    if (!t->defined()) continue;
    if (t->dim() != 0 && (!t->is_contiguous() || t->sizes() != out.sizes() ||
                          t->is_conj() || t->is_neg())) {
      return std::nullopt;
    }
    add(*t);
  }
  return memory;
}

at::Tensor element_range(const at::Tensor& t, int64_t begin, int64_t end) {
  if (t.dim() == 0) return t;
  return at::as_strided(t, {end - begin}, {1}, t.storage_offset() + begin);
}

}  // namespace ember
