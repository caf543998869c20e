// The prepacked-weight cache of ember's default GEMM route. A GEMM operand B
// that comes back with unchanged contents (a Linear/Conv1D weight: the same
// ember storage, same view, same version counter) is packed once into the
// layout its kernel wants and reused on every later call:
//
//   kPanelsF32 / kPanelsBf16  skinny GEMM (M <= 16) panels (SkinnyGemm.h);
//                             kPanelsF32 also serves more rows on non-Intel
//                             AVX-512 CPUs (the panel kernel)
//   kMklF32                   MKL's packed B (MklPackedGemm.h), the fp32
//                             route of more than 16 rows on Intel CPUs
//   kOneDnn / kOneDnnBf16     oneDNN's blocked weight (fp32, or bf16 for bf16
//                             operands and under "medium") for its packed
//                             matmul
//   kOneDnnConv               oneDNN's blocked convolution weight, one pack
//                             per call geometry (ops/kernels/Convolution.cpp)
//   kWinogradF32              a 3x3 filter transformed for Winograd's
//                             F(2x2, 3x3) (conv/WinogradF2x3.h): 16/9 of
//                             the weight's floats
//
// Packs live in ember device memory (they count in memory_stats and the
// memory limit), the cache is bounded in bytes (least recently used packs
// go first), a write to the weight (its version counter, or any write to its
// storage that ember's op paths report: ops/StorageWrites.h) or its release
// invalidates the pack, and torch.ember.empty_cache() drops them all.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "ops/kernels/matmul/SkinnyGemm.h"

namespace ember::matmul {

enum class PackKind : uint8_t {
  kPanelsF32,
  kPanelsBf16,
  kMklF32,
  kOneDnn,
  kOneDnnBf16,
  kOneDnnConv,
  kWinogradF32
};

// One packed copy of B (K x N).
struct PackedWeight {
  PackKind kind;
  c10::DeviceIndex device = 0;
  int64_t k = 0;
  int64_t n = 0;
  size_t bytes = 0;  // allocated (ember memory: memory_stats)
  // What the cache's byte budget counts: the packed data. Equal to `bytes`
  // but for kMklF32, whose allocation MKL sizes with room it never writes.
  size_t budget_bytes = 0;
  c10::DataPtr panels;  // kPanels*, kMklF32: ember memory
  at::Tensor onednn;    // kOneDnn*: oneDNN's blocked weight (an MKLDNN tensor);
                        // kWinogradF32: the transformed filter (CPU floats)

  PanelPackedF32 f32() const;
  PanelPackedBf16 bf16() const;
};

// The pack of `b` (a 2-D fp32 or, for kOneDnnBf16, bf16 ember tensor, K x N)
// for `kind`, or nullptr when `b` is not worth packing yet: a B seen for the
// first time (or whose contents changed since last time) is only remembered;
// the pack is made when the same contents come back. Packs that do not
// fit the budget are never made. An inference tensor (no version counter) is
// packed too: its writes are seen by the storage watch alone.
std::shared_ptr<const PackedWeight> packed_weight(const at::Tensor& b,
                                                  PackKind kind);

// The oneDNN pack of a weight of any shape (same cache, same rules):
// `reorder` gets a CPU alias of `weight` and returns its packed copy (for
// kWinogradF32, any CPU tensor of the transformed filter's floats).
// `geometry` tells apart packs of one weight made for different calls (a
// convolution's stride, padding and input size choose its blocked layout).
using OneDnnReorder = std::function<at::Tensor(const at::Tensor& cpu_weight)>;
std::shared_ptr<const PackedWeight> packed_onednn_weight(
    const at::Tensor& weight, PackKind kind, uint64_t geometry,
    const OneDnnReorder& reorder);

struct PackCacheStats {
  int64_t entries = 0;
  int64_t bytes = 0;  // against the limit: PackedWeight::budget_bytes
  int64_t limit = 0;
  int64_t hits = 0;
  int64_t packs = 0;
  int64_t invalidations = 0;  // writes or releases of a packed weight
  int64_t evictions = 0;      // dropped for the byte budget
  // New packs not made because they would push out packs used as often
  // (a model whose packs exceed the budget keeps those it has).
  int64_t admissions_refused = 0;
};
// Counters run from the last clear_pack_cache() (torch.ember.empty_cache()).
PackCacheStats pack_cache_stats();
// Bytes of packs held in one device's memory (part of its allocated bytes).
int64_t pack_cache_bytes_on(c10::DeviceIndex device);
void clear_pack_cache();
// Byte budget of the packs (0 disables packing).
void set_pack_cache_limit(int64_t bytes);

}  // namespace ember::matmul
