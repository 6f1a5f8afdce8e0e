/* cuda/common.cuh - what every CUDA kernel family shares: the compute stream and the cuBLAS handle
 * (common.cu), the precision the GEMMs run in, launch sizes, error checks that stop the run with a
 * message naming the call, a scratch buffer for kernels that need room of their own, and the row-major
 * GEMM on cuBLAS (pr_cu_sgemm).
 *
 * Conventions, as on the CPU (runtime/kernels.h): row-major float32, NCHW; every backward kernel takes
 * `acc` (0: write the gradient, 1: add to what is there).  Every pointer a kernel takes is device memory
 * (the arena); shapes and the runtime's contexts (&pr_opt, &pr_rand) are host structs, passed to the
 * device by value.  Every kernel runs on pr_cu_stream, in order, so the host never waits for one.
 *
 * Determinism: the same call on the same inputs gives the same bits on every run and whatever the
 * stage split.  No float atomics; every sum has an order fixed by the shape alone (one thread's loop, or
 * a fixed tree over a fixed block size); cuBLAS with one workspace on one stream. */
#ifndef PIPERUN_CUDA_COMMON_CUH
#define PIPERUN_CUDA_COMMON_CUH
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "../shapes.h"
#include "precision.h"
}

extern cudaStream_t pr_cu_stream;  /* every kernel and copy of the stage's compute, in order */
extern cublasHandle_t pr_cu_blas;  /* on pr_cu_stream, its workspace fixed (deterministic) */

/* Stops the run: "piperun: CUDA error: <what> at <file>:<line>: <cuda's words>" on stderr, exit 1. */
extern "C" void pr_cu_fail(const char *what, const char *err, const char *file, int line);
#define PR_CU(call)                                                                                 \
  do {                                                                                              \
    cudaError_t e_ = (call);                                                                        \
    if (e_ != cudaSuccess) pr_cu_fail(#call, cudaGetErrorString(e_), __FILE__, __LINE__);           \
  } while (0)
#define PR_CUBLAS(call)                                                                             \
  do {                                                                                              \
    cublasStatus_t s_ = (call);                                                                     \
    if (s_ != CUBLAS_STATUS_SUCCESS) pr_cu_fail(#call, cublasGetStatusString(s_), __FILE__, __LINE__); \
  } while (0)
/* After a launch: a bad configuration is reported where it was made. */
#define PR_CU_LAUNCHED() PR_CU(cudaGetLastError())

/* Blocks of `threads` for n items (at least 1, at most 2^31 - 1: kernels loop with a grid stride). */
static inline unsigned pr_cu_blocks(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > 1048576) b = 1048576;
  return (unsigned)b;
}
#define PR_CU_THREADS 256
/* A grid-stride loop over [0, n). */
#define PR_CU_FOR(i, n) for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

/* Bad input a kernel found (a Gather index outside its table: shapes.h, pr_bad_index).  A kernel cannot
 * stop the run, and a check after every launch would cost a sync per call, so the first one is recorded
 * here, in page-locked host memory the GPU writes directly (mapped: no copy, no sync), and the device
 * layer reads it after the waits the runtime makes anyway (cuda/device.cu, pr_dev_check), then stops the
 * run naming it.  The kernel leaves the bad element alone (a zero, no read or write outside the table),
 * so nothing is corrupted meanwhile.  node is a host pointer (the call's string) the kernel only carries;
 * what the kernel was is a number, as a string in device code has a device address. */
enum { PR_CU_FAULT_GATHER, PR_CU_FAULT_GATHER_GRAD };
struct PrCuFault {
  int claimed;        /* the first thread to set it writes the rest */
  volatile int ready; /* set after the rest, behind a system-wide fence */
  int what;           /* PR_CU_FAULT_* */
  const char *node;
  int64_t at, index, rows, step, mb;
};
/* The record as the kernels address it (mapped when first asked for), and as the host reads it (NULL
 * until then: nothing recorded). */
PrCuFault *pr_cu_fault_dev(void);
extern PrCuFault *pr_cu_fault_host;
/* A kernel thread's report: the first one in the run is kept. */
__device__ inline void pr_cu_record_fault(PrCuFault *f, const char *node, int what, int64_t at, int64_t index, int64_t rows, int64_t step,
                                          int64_t mb) {
  if (atomicCAS(&f->claimed, 0, 1) != 0) return;
  f->node = node, f->what = what, f->at = at, f->index = index, f->rows = rows, f->step = step, f->mb = mb;
  __threadfence_system();
  f->ready = 1;
}

/* Device scratch of at least `bytes`, for a kernel's own temporaries within one call: one buffer,
 * grown when asked for more (after the stream drains), reused by the next call on the same stream. */
extern "C" void *pr_cu_scratch(int64_t bytes);

/* cuBLAS's compute type for the run's precision (precision.h): fp32 pedantic (no TF32), TF32, or
 * bf16 inputs with fp32 accumulation. */
cublasComputeType_t pr_cu_compute_type(void);

/* Row-major C = alpha op(A) op(B) + beta C, as cblas_sgemm(CblasRowMajor, ...) takes it, for `count`
 * products whose operands lie sA, sB, sC floats apart (one cuBLAS call, in the run's precision).  cuBLAS
 * is column-major: a row-major matrix is its transpose there, so it computes C^T = op(B)^T op(A)^T. */
void pr_cu_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, int64_t sA, const float *B,
                 int ldb, int64_t sB, float beta, float *C, int ldc, int64_t sC, int64_t count);
#endif
