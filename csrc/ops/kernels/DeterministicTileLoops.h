// The plain loops behind native_tile_sum (ops/kernels/DeterministicReduce.cpp),
// included once per instruction set: the file defines them in namespace
// EMBER_TILE_NS with attributes EMBER_TILE_ATTR. Every copy performs the
// same additions in the same order (no fused multiply-add: fp-contract is
// off), so the copies agree bit for bit; only their speed differs.
// No include guard: included more than once on purpose.

namespace EMBER_TILE_NS {

template <TileMap M, class Acc>
EMBER_TILE_ATTR inline Acc mapped(Acc x, Acc center) {
  if constexpr (M == TileMap::kIdentity) {
    return x;
  } else if constexpr (M == TileMap::kAbs) {
    return x < Acc(0) ? -x : x;
  } else if constexpr (M == TileMap::kSquare) {
    return x * x;
  } else {
    const Acc d = x - center;
    return d * d;
  }
}

// Rows contiguous: each row summed with kLanes interleaved accumulators,
// combined pairwise at the end.
template <TileMap M, class In, class Acc>
EMBER_TILE_ATTR void sum_rows(const In* data, int64_t row_stride, int64_t rows,
                              int64_t cols, const Acc* center, Acc* out,
                              int64_t out_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    const In* p = data + r * row_stride;
    const Acc c = center != nullptr ? center[r] : Acc(0);
    Acc lane[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= cols; i += kLanes) {
      for (int64_t k = 0; k < kLanes; ++k) {
        lane[k] += mapped<M, Acc>(static_cast<Acc>(p[i + k]), c);
      }
    }
    for (int64_t k = 0; i < cols; ++i, ++k) {
      lane[k] += mapped<M, Acc>(static_cast<Acc>(p[i]), c);
    }
    for (int64_t width = kLanes / 2; width > 0; width /= 2) {
      for (int64_t k = 0; k < width; ++k) lane[k] += lane[k + width];
    }
    out[r * out_stride] = lane[0];
  }
}

// Rows adjacent in memory (a reduction across rows): one accumulator per
// row, stepping column by column.
template <TileMap M, class In, class Acc>
EMBER_TILE_ATTR void sum_columns(const In* data, int64_t col_stride,
                                 int64_t rows, int64_t cols, const Acc* center,
                                 Acc* out, int64_t out_stride) {
  Acc acc[kOuterTileRows] = {};
  Acc c[kOuterTileRows] = {};
  for (int64_t r = 0; r < rows; ++r) c[r] = center ? center[r] : Acc(0);
  for (int64_t j = 0; j < cols; ++j) {
    const In* p = data + j * col_stride;
    for (int64_t r = 0; r < rows; ++r) {
      acc[r] += mapped<M, Acc>(static_cast<Acc>(p[r]), c[r]);
    }
  }
  for (int64_t r = 0; r < rows; ++r) out[r * out_stride] = acc[r];
}

}  // namespace EMBER_TILE_NS
