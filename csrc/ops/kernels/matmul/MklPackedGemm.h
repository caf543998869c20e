// fp32 GEMM on a B packed by MKL (cblas_sgemm_pack / cblas_sgemm_compute,
// the MKL inside libtorch_cpu). On Intel CPUs it beats oneDNN's packed
// matmul at transformer shapes: BERT-base's 72 linears at M = 128 with cold
// weights run in 64 ms through it against 73 ms through oneDNN (2 cores,
// Xeon with AVX-512). Plain C++; no torch types.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ember::matmul {

// Whether ember's GEMMs of more than 16 rows take MKL's packed route: Intel
// CPUs (elsewhere MKL takes slower code paths and oneDNN's is used).
// Decided once from CPUID.
bool mkl_packed_preferred();

// MKL's packed layout is chosen for a row count; one fixed count makes the
// layout, and so every result's bits, independent of which M came first.
// A pack made for 128 rows runs every M from 128 to 1024 within 5% of a
// pack made for that M (one made for 1024 halves the speed at M = 128).
constexpr int64_t kMklRowsHint = 128;

// Bytes of the pack of a K x N B. MKL reserves more than K*N floats
// (~8 MB plus ~1.6 KB per column on MKL 2024); the pages past the packed
// data are never written or read, so resident memory grows by about the
// weight's size.
size_t mkl_pack_bytes(int64_t k, int64_t n);

// Whether a K x N B of these element strides is one MKL can pack: row-major
// (unit column stride) or transposed (unit row stride: a Linear weight).
bool mkl_can_pack(int64_t k, int64_t n, int64_t stride_k, int64_t stride_n);
bool mkl_row_major(int64_t k, int64_t n, int64_t stride_k, int64_t stride_n);

// Packs B (K x N, element strides for which mkl_can_pack holds) into
// `dest` (mkl_pack_bytes(k, n) bytes, 64-byte aligned). The pack holds
// addresses inside itself: it must not be moved.
void mkl_pack_f32(const float* b, int64_t k, int64_t n, int64_t stride_k,
                  int64_t stride_n, void* dest);

// C[m x n] (row stride ldc) = A[m x k] (row stride lda >= k, unit column
// stride) @ packed B (+ bias[n] when not null). Runs on the calling thread's
// OpenMP thread count; the summation order depends on it, and on nothing
// else (same pack, same thread count: the same bits).
void mkl_packed_gemm_f32(const float* a, int64_t lda, int64_t m, int64_t k,
                         int64_t n, const void* packed_b, const float* bias,
                         float* c, int64_t ldc);

}  // namespace ember::matmul
