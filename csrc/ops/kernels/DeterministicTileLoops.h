// The plain loops behind native_tile_sum (ops/kernels/DeterministicReduce.cpp),
// included once per instruction set: the file defines them in namespace
// EMBER_TILE_NS with attributes EMBER_TILE_ATTR. Every copy performs the
// same additions in the same order (no fused multiply-add: fp-contract is
// off), so the copies agree bit for bit; only their speed differs.
// No include guard: included more than once on purpose.

namespace EMBER_TILE_NS {

// One element's term. `a`, `b`: the two inputs; `rc`: the row's center;
// `cc`, `cs`: the column's center and scale (only what `M` uses is read).
template <TileMap M, class Acc>
EMBER_TILE_ATTR inline Acc mapped(Acc a, Acc b, Acc rc, Acc cc, Acc cs) {
  if constexpr (M == TileMap::kIdentity) {
    return a;
  } else if constexpr (M == TileMap::kAbs) {
    return a < Acc(0) ? -a : a;
  } else if constexpr (M == TileMap::kSquare) {
    return a * a;
  } else if constexpr (M == TileMap::kSquaredDeviation) {
    const Acc d = a - rc;
    return d * d;
  } else if constexpr (M == TileMap::kProduct) {
    return a * b;
  } else if constexpr (M == TileMap::kSquaredDifference) {
    const Acc d = a - b;
    return d * d;
  } else {
    static_assert(M == TileMap::kNormalizedProduct);
    return ((a - cc) * cs) * b;
  }
}

template <TileMap M>
constexpr bool uses_b =
    M == TileMap::kProduct || M == TileMap::kSquaredDifference ||
    M == TileMap::kNormalizedProduct;
template <TileMap M>
constexpr bool uses_columns = M == TileMap::kNormalizedProduct;

template <TileMap M, class In, class Acc>
EMBER_TILE_ATTR inline Acc term_at(const In* pa, const In* pb, Acc rc,
                                   const Acc* column_center,
                                   const Acc* column_scale, int64_t i) {
  Acc b = Acc(0), cc = Acc(0), cs = Acc(0);
  if constexpr (uses_b<M>) b = static_cast<Acc>(pb[i]);
  if constexpr (uses_columns<M>) {
    cc = column_center[i];
    cs = column_scale[i];
  }
  return mapped<M, Acc>(static_cast<Acc>(pa[i]), b, rc, cc, cs);
}

// Rows contiguous: each row summed with kLanes interleaved accumulators,
// combined pairwise at the end.
template <TileMap M, class In, class Acc>
EMBER_TILE_ATTR void sum_rows(const TileLoopArgs<In, Acc>& args) {
  for (int64_t r = 0; r < args.rows; ++r) {
    const In* pa = args.a + r * args.stride;
    const In* pb = uses_b<M> ? args.b + r * args.stride : nullptr;
    const Acc rc = args.row_center != nullptr ? args.row_center[r] : Acc(0);
    const Acc* cc = args.column_center;
    const Acc* cs = args.column_scale;
    Acc lane[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= args.cols; i += kLanes) {
      for (int64_t k = 0; k < kLanes; ++k) {
        lane[k] += term_at<M, In, Acc>(pa, pb, rc, cc, cs, i + k);
      }
    }
    for (int64_t k = 0; i < args.cols; ++i, ++k) {
      lane[k] += term_at<M, In, Acc>(pa, pb, rc, cc, cs, i);
    }
    for (int64_t width = kLanes / 2; width > 0; width /= 2) {
      for (int64_t k = 0; k < width; ++k) lane[k] += lane[k + width];
    }
    args.out[r * args.out_stride] = lane[0];
  }
}

// Rows adjacent in memory (a reduction across rows): one accumulator per
// row, stepping column by column.
template <TileMap M, class In, class Acc>
EMBER_TILE_ATTR void sum_columns(const TileLoopArgs<In, Acc>& args) {
  Acc acc[kOuterTileRows] = {};
  Acc rc[kOuterTileRows] = {};
  const int64_t rows = args.rows;
  for (int64_t r = 0; r < rows; ++r) {
    rc[r] = args.row_center != nullptr ? args.row_center[r] : Acc(0);
  }
  for (int64_t j = 0; j < args.cols; ++j) {
    const In* pa = args.a + j * args.stride;
    const In* pb = uses_b<M> ? args.b + j * args.stride : nullptr;
    Acc cc = Acc(0), cs = Acc(0);
    if constexpr (uses_columns<M>) {
      cc = args.column_center[j];
      cs = args.column_scale[j];
    }
    for (int64_t r = 0; r < rows; ++r) {
      Acc b = Acc(0);
      if constexpr (uses_b<M>) b = static_cast<Acc>(pb[r]);
      acc[r] += mapped<M, Acc>(static_cast<Acc>(pa[r]), b, rc[r], cc, cs);
    }
  }
  for (int64_t r = 0; r < rows; ++r) args.out[r * args.out_stride] = acc[r];
}

}  // namespace EMBER_TILE_NS
