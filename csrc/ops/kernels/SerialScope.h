// Makes the libraries ATen calls (its own parallel loops, oneDNN, MKL) see
// one thread on the calling thread, for the scope's lifetime. Both settings
// are per thread (OpenMP's nthreads ICV, MKL's local thread count), so other
// threads are unaffected. Deterministic mode uses it where a kernel's
// summation order follows its thread split.
#pragma once

#include <omp.h>  // torch's OpenMP runtime (libgomp, linked explicitly)

// From the MKL inside libtorch_cpu (exported).
extern "C" {
// MKL's C entry point (mkl_set_num_threads_local is a macro for it; the
// lower-case symbols are the Fortran interface, which takes a pointer).
int MKL_Set_Num_Threads_Local(int threads);
}

namespace ember::kernels {

class SerialScope {
 public:
  SerialScope()
      : omp_previous_(omp_get_max_threads()),
        mkl_previous_(MKL_Set_Num_Threads_Local(1)) {
    omp_set_num_threads(1);
  }
  ~SerialScope() {
    omp_set_num_threads(omp_previous_);
    MKL_Set_Num_Threads_Local(mkl_previous_);  // 0 restores the global count
  }
  SerialScope(const SerialScope&) = delete;
  SerialScope& operator=(const SerialScope&) = delete;

 private:
  int omp_previous_;
  int mkl_previous_;
};

}  // namespace ember::kernels
