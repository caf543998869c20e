#include "ops/kernels/matmul/MklPackedGemm.h"

#include <cstring>
#include <limits>
#include <stdexcept>

#include "ember/runtime/cpu_features.h"

// MKL's packed-GEMM entry points, exported by libtorch_cpu (declared here:
// the wheel ships no MKL headers). The CBLAS enums are ints; MKL_INT is a
// 32-bit int in the LP64 interface these unsuffixed symbols are.
extern "C" {
size_t cblas_sgemm_pack_get_size(int identifier, int m, int n, int k);
void cblas_sgemm_pack(int layout, int identifier, int trans, int m, int n,
                      int k, float alpha, const float* src, int ld,
                      float* dest);
void cblas_sgemm_compute(int layout, int transa, int transb, int m, int n,
                         int k, const float* a, int lda, const float* b,
                         int ldb, float beta, float* c, int ldc);
}

namespace ember::matmul {
namespace {

constexpr int kRowMajor = 101;
constexpr int kNoTrans = 111;
constexpr int kTrans = 112;
constexpr int kPacked = 151;
constexpr int kBMatrix = 162;

int as_mkl_int(int64_t v) {
  if (v < 0 || v > std::numeric_limits<int>::max()) {
    throw std::length_error("MKL packed GEMM: dimension out of 32-bit range");
  }
  return static_cast<int>(v);
}

}  // namespace

bool mkl_row_major(int64_t k, int64_t n, int64_t stride_k, int64_t stride_n) {
  return stride_n == 1 && (k == 1 || stride_k >= n);
}

bool mkl_can_pack(int64_t k, int64_t n, int64_t stride_k, int64_t stride_n) {
  return mkl_row_major(k, n, stride_k, stride_n) ||
         (stride_k == 1 && (n == 1 || stride_n >= k));
}

bool mkl_packed_preferred() {
  static const bool preferred =
      runtime::cpu_features().vendor == "GenuineIntel";
  return preferred;
}

size_t mkl_pack_bytes(int64_t k, int64_t n) {
  return cblas_sgemm_pack_get_size(kBMatrix, as_mkl_int(kMklRowsHint),
                                   as_mkl_int(n), as_mkl_int(k));
}

void mkl_pack_f32(const float* b, int64_t k, int64_t n, int64_t stride_k,
                  int64_t stride_n, void* dest) {
  // Row-major B is (K x N, ld = stride_k); a transposed Linear weight
  // (N x K row-major, ld = stride_n) is packed as op(B) = W^T.
  const bool row_major = mkl_row_major(k, n, stride_k, stride_n);
  // A single row or column has no row stride to speak of; MKL still wants
  // ld >= its row length.
  const int64_t ld =
      row_major ? (k == 1 ? n : stride_k) : (n == 1 ? k : stride_n);
  cblas_sgemm_pack(kRowMajor, kBMatrix, row_major ? kNoTrans : kTrans,
                   as_mkl_int(kMklRowsHint), as_mkl_int(n), as_mkl_int(k), 1.0f,
                   b, as_mkl_int(ld), static_cast<float*>(dest));
}

void mkl_packed_gemm_f32(const float* a, int64_t lda, int64_t m, int64_t k,
                         int64_t n, const void* packed_b, const float* bias,
                         float* c, int64_t ldc) {
  if (bias != nullptr) {
    // C = A B + 1 * C, with C's rows holding the bias.
    for (int64_t row = 0; row < m; ++row) {
      std::memcpy(c + row * ldc, bias, sizeof(float) * n);
    }
  }
  cblas_sgemm_compute(kRowMajor, kNoTrans, kPacked, as_mkl_int(m),
                      as_mkl_int(n), as_mkl_int(k), a, as_mkl_int(lda),
                      static_cast<const float*>(packed_b), as_mkl_int(k),
                      bias != nullptr ? 1.0f : 0.0f, c, as_mkl_int(ldc));
}

}  // namespace ember::matmul
