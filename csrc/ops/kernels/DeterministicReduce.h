// Sums in a fixed order: the building block of ember's deterministic mode
// (flags::deterministic()). ATen's CPU reductions split a long reduction
// into one chunk per thread and add the chunks' partial results, so the
// rounding depends on torch.get_num_threads(). Here the split is a function
// of the shape alone:
//
//   the input, viewed as K kept rows x R reduced columns, is cut into tiles
//   of at most kTileElements (whole rows when R is short, one row and
//   kTileElements columns when it is long); each tile is reduced serially by
//   ATen's own kernel (inside a parallel region, so it never splits further);
//   the per-tile partials of a row are then added serially.
//
// Tiles are independent, so they run in parallel; which thread reduces a
// tile changes nothing. Results are bitwise identical for every thread count
// and every run (not bitwise equal to ATen's, which is itself only fixed
// for a fixed thread count).
//
// Everything here works on CPU tensors (the aliases of ember tensors).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/FunctionRef.h>

#include <cstdint>
#include <vector>

namespace ember::deterministic {

// Elements one tile covers. A constant: changing it changes the rounding
// of deterministic results (never their reproducibility).
inline constexpr int64_t kTileElements = 32768;
// Kept elements one tile spans when reducing across rows (sum over dim 0
// of a row-major matrix).
inline constexpr int64_t kOuterTileRows = 256;

// Runs fn(i) for every i in [0, n) on ATen's intra-op threads. Each call
// runs inside an ATen parallel region, so the ATen kernels it calls never
// split their work further (they run serially, whichever thread runs them).
// Why not at::parallel_for: it is a header template, and ember is built
// without OpenMP, so here it would always run inline, outside any region.
// TensorIterator::for_each is compiled into libtorch with ATen's threading.
// Call 0 runs on the calling thread (whose allocation capture and
// dispatcher state are the op's); the others may run on worker threads,
// which should only write into tensors allocated beforehand.
// `needs_region`: fn calls ATen kernels (which must see a parallel region);
// plain loops need none, and a single call then runs inline.
void parallel_tiles(int64_t n, c10::function_ref<void(int64_t)> fn,
                    bool needs_region = true);

// Runs fn on the calling thread with ATen kernels serial inside it.
void run_serially(c10::function_ref<void()> fn);

// The dtype partial sums are kept in: float for the 16-bit float types,
// the input's own otherwise.
at::ScalarType accumulate_type(at::ScalarType dtype);

// A reduction over `dims`, seen as `rows` kept rows x `cols` reduced
// columns (kept dims in order, then the reduced dims).
struct RowLayout {
  std::vector<int64_t> order;      // permutation: kept dims, reduced dims
  std::vector<int64_t> out_shape;  // the result's shape (keepdim honoured)
  int64_t rows = 1;
  int64_t cols = 1;
  // x as a rows x cols matrix: a view when the layout allows, else a copy.
  at::Tensor matrix(const at::Tensor& x) const;
};
RowLayout row_layout(const at::Tensor& x, at::IntArrayRef dims, bool keepdim);

// One tile of a rows x cols reduction: rows [r0, r0 + rn), columns
// [c0, c0 + cn); its partial sums go to column `block` of the partial
// matrix (rows x column blocks).
struct Tile {
  int64_t r0, rn, c0, cn, block;
};

// Writes the partial sums of one tile (of whatever the caller reduces) into
// its slot of `partial`. Called from worker threads: it must only write
// that slot.
using TileSum = c10::function_ref<void(const Tile& tile, at::Tensor& partial)>;

// The tile of a RowLayout matrix, and its slot in the partial matrix.
at::Tensor tile_of(const at::Tensor& matrix, const Tile& tile);
at::Tensor slot_of(const at::Tensor& partial, const Tile& tile);

// Whether a rows x cols matrix (RowLayout::matrix) runs along columns.
bool columns_contiguous(const at::Tensor& matrix);

// What a tile sums, element by element (a, b: the inputs).
enum class TileMap : uint8_t {
  kIdentity,           // a
  kAbs,                // |a|
  kSquare,             // a * a
  kSquaredDeviation,   // (a - row_center[row])^2
  kProduct,            // a * b
  kSquaredDifference,  // (a - b)^2
  kNormalizedProduct,  // (a - column_center[col]) * column_scale[col] * b
};

// The inputs of a native tile sum. `a` is a rows x cols matrix (any
// strides); `b`, when the map reads it, has a's sizes, strides and dtype;
// the centers and scale are contiguous, in partial's dtype, indexed by
// matrix row (row_center) or column (column_*).
struct TileInputs {
  at::Tensor a;
  at::Tensor b;
  at::Tensor row_center;
  at::Tensor column_center;
  at::Tensor column_scale;
};

// Sums `map` over a tile into its slot of `partial` (float or double) with
// plain loops, for float, double, bfloat16 and half inputs laid out along
// rows or along columns; returns false (and does nothing) for anything
// else, which the caller then hands to ATen. Fixed order: 32 interleaved
// accumulators per row combined pairwise, or one accumulator per row
// stepping column by column.
bool native_tile_sum(const TileInputs& inputs, const Tile& tile,
                     at::Tensor& partial, TileMap map);
// The one-input form.
bool native_tile_sum(const at::Tensor& matrix, const Tile& tile,
                     at::Tensor& partial, TileMap map,
                     const at::Tensor& row_center = at::Tensor());

// A sum tile_sums can do with plain loops alone.
struct NativeSum {
  TileInputs inputs;
  TileMap map;
};

// Per-row sums (a `rows` tensor of `options`' dtype) of a rows x cols
// reduction: tiles of at most kTileElements, cut by the shape alone (long
// thin tiles along contiguous memory: `columns_contiguous` says whether
// consecutive columns or consecutive rows are adjacent in memory), summed
// in parallel, then each row's tile partials summed in order. Tiles use
// `native` when it handles them (no parallel region needed), else `tile`.
at::Tensor tile_sums(int64_t rows, int64_t cols, bool columns_contiguous,
                     const at::TensorOptions& options, TileSum tile,
                     const NativeSum* native = nullptr);

// sum(x, dims, keepdim) in dtype `out_dtype`, in a fixed order. An empty
// `dims` reduces every dimension (as at::sum). Floating and complex inputs
// only; the caller passes others to ATen (integer sums do not round).
at::Tensor sum(const at::Tensor& x, at::IntArrayRef dims, bool keepdim,
               at::ScalarType out_dtype);

// Number of elements each output element of a reduction over `dims` sums.
int64_t reduced_count(const at::Tensor& x, at::IntArrayRef dims);

// The dims of an optional dim list, wrapped and sorted (empty = all).
c10::SmallVector<int64_t, 8> wrap_dims(const at::Tensor& x,
                                       at::OptionalIntArrayRef dims);

}  // namespace ember::deterministic
