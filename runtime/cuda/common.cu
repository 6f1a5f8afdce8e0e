/* cuda/common.cu - the stream, the cuBLAS handle, the precision, the scratch buffer and the row-major
 * GEMM every CUDA kernel family uses (common.cuh). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"

cudaStream_t pr_cu_stream;
cublasHandle_t pr_cu_blas;
int pr_cu_precision = PR_PREC_FP32;

static void *scratch;
static int64_t scratch_bytes;
static void *blas_work;
/* cuBLAS's workspace, set once so that it never picks an algorithm by the room it happens to find. */
#define BLAS_WORK_BYTES (32LL << 20)

PrCuFault *pr_cu_fault_host;
static PrCuFault *fault_dev;

PrCuFault *pr_cu_fault_dev(void) {
  if (fault_dev) return fault_dev;
  void *h = NULL;
  PR_CU(cudaHostAlloc(&h, sizeof(PrCuFault), cudaHostAllocMapped));
  memset(h, 0, sizeof(PrCuFault));
  PR_CU(cudaHostGetDevicePointer((void **)&fault_dev, h, 0));
  pr_cu_fault_host = (PrCuFault *)h;
  return fault_dev;
}

extern "C" void pr_cu_fail(const char *what, const char *err, const char *file, int line) {
  fprintf(stderr, "piperun: CUDA error: %s at %s:%d: %s\n", what, file, line, err);
  fflush(stderr);
  exit(1);
}

extern "C" void pr_cu_init(int device, int precision) {
  int count = 0;
  PR_CU(cudaGetDeviceCount(&count));
  if (count < 1) pr_cu_fail("cudaGetDeviceCount", "no GPU is visible to this process", __FILE__, __LINE__);
  PR_CU(cudaSetDevice(device % count));
  PR_CU(cudaStreamCreateWithFlags(&pr_cu_stream, cudaStreamNonBlocking));
  PR_CUBLAS(cublasCreate(&pr_cu_blas));
  PR_CUBLAS(cublasSetStream(pr_cu_blas, pr_cu_stream));
  PR_CU(cudaMalloc(&blas_work, BLAS_WORK_BYTES));
  PR_CUBLAS(cublasSetWorkspace(pr_cu_blas, blas_work, BLAS_WORK_BYTES));
  /* Pedantic: no TF32 and no reduced-precision reductions unless the run asked for them by name. */
  PR_CUBLAS(cublasSetMathMode(pr_cu_blas, precision == PR_PREC_FP32 ? CUBLAS_PEDANTIC_MATH : CUBLAS_DEFAULT_MATH));
  pr_cu_precision = precision;
  (void)pr_cu_fault_dev(); /* mapped now, not at the first Gather's launch */
}

cublasComputeType_t pr_cu_compute_type(void) {
  switch (pr_cu_precision) {
  case PR_PREC_TF32: return CUBLAS_COMPUTE_32F_FAST_TF32;
  case PR_PREC_BF16: return CUBLAS_COMPUTE_32F_FAST_16BF;
  default: return CUBLAS_COMPUTE_32F_PEDANTIC;
  }
}

void pr_cu_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, int64_t sA, const float *B,
                 int ldb, int64_t sB, float beta, float *C, int ldc, int64_t sC, int64_t count) {
  if (M <= 0 || N <= 0 || count <= 0) return;
  cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (count == 1)
    PR_CUBLAS(cublasGemmEx(pr_cu_blas, ob, oa, N, M, K, &alpha, B, CUDA_R_32F, ldb, A, CUDA_R_32F, lda, &beta, C,
                           CUDA_R_32F, ldc, pr_cu_compute_type(), CUBLAS_GEMM_DEFAULT));
  else
    PR_CUBLAS(cublasGemmStridedBatchedEx(pr_cu_blas, ob, oa, N, M, K, &alpha, B, CUDA_R_32F, ldb, sB, A, CUDA_R_32F,
                                         lda, sA, &beta, C, CUDA_R_32F, ldc, sC, (int)count, pr_cu_compute_type(),
                                         CUBLAS_GEMM_DEFAULT));
}

extern "C" void *pr_cu_scratch(int64_t bytes) {
  if (bytes <= scratch_bytes) return scratch;
  PR_CU(cudaStreamSynchronize(pr_cu_stream)); /* the kernels still reading the old one */
  if (scratch) PR_CU(cudaFree(scratch));
  int64_t want = bytes < (1LL << 20) ? (1LL << 20) : bytes;
  PR_CU(cudaMalloc(&scratch, (size_t)want));
  scratch_bytes = want;
  return scratch;
}
