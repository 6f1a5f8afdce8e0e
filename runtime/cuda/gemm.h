/* cuda/gemm.h - Gemm and MatMul on the GPU (through cuBLAS, gemm.cu): kc_<name> for each k_<name> of
 * cpu/gemm.h, the same arguments and semantics, every buffer in device memory, shapes on the host. */
#ifndef PIPERUN_CUDA_GEMM_H
#define PIPERUN_CUDA_GEMM_H
#include "../shapes.h"
void kc_gemm(const float *A, const float *B, const float *C, float *Y, int M, int N, int K, int ta, int tb, float alpha,
             float beta, int cm, int cn);
void kc_gemm_dA(const float *dY, const float *B, float *dA, int M, int N, int K, int ta, int tb, float alpha, int acc);
void kc_gemm_dB(const float *dY, const float *A, float *dB, int M, int N, int K, int ta, int tb, float alpha, int acc);
void kc_gemm_dC(const float *dY, float *dC, int M, int N, int cm, int cn, float beta, int acc);
void kc_matmul(const float *A, const float *B, float *Y, const MatMulShape *s);
void kc_matmul_dA(const float *dY, const float *B, float *dA, int64_t na, const MatMulShape *s, int acc);
void kc_matmul_dB(const float *dY, const float *A, float *dB, int64_t nbel, const MatMulShape *s, int acc);
#endif
