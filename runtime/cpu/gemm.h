/* cpu/gemm.h - Gemm and MatMul (through pr_sgemm).
 * Part of the CPU kernels; runtime/kernels.h includes every family (the conventions are there). */
#ifndef PIPERUN_CPU_GEMM_H
#define PIPERUN_CPU_GEMM_H
#include "common.h"
/* ---- Gemm: Y = alpha * op(A) op(B) + beta * C, C broadcast from [cm, cn] ---- */
static inline void k_gemm(const float *A, const float *B, const float *C, float *Y, int M, int N, int K, int ta, int tb,
                          float alpha, float beta, int cm, int cn) {
  if (C && beta != 0) {
    /* C broadcast into Y: a row vector (a bias) in a loop of its own, so that it vectorises */
    if (cm == 1 && cn == N)
      for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) Y[(int64_t)i * N + j] = beta * C[j];
    else
      for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) Y[(int64_t)i * N + j] = beta * C[(int64_t)(cm == 1 ? 0 : i) * cn + (cn == 1 ? 0 : j)];
  }
  pr_sgemm(ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, ta ? M : K, B,
              tb ? K : N, C && beta != 0 ? 1.0f : 0.0f, Y, N);
}

/* dA = alpha * dY op(B)^T (shape of A: [M,K], or [K,M] when ta). */
static inline void k_gemm_dA(const float *dY, const float *B, float *dA, int M, int N, int K, int ta, int tb, float alpha,
                             int acc) {
  if (!ta) /* dA[M,K] = dY[M,N] . op(B)^T */
    pr_sgemm(CblasNoTrans, tb ? CblasNoTrans : CblasTrans, M, K, N, alpha, dY, N, B, tb ? K : N,
                acc ? 1.0f : 0.0f, dA, K);
  else /* dA[K,M] = op(B) . dY^T */
    pr_sgemm(tb ? CblasTrans : CblasNoTrans, CblasTrans, K, M, N, alpha, B, tb ? K : N, dY, N,
                acc ? 1.0f : 0.0f, dA, M);
}

/* dB = alpha * op(A)^T dY (shape of B: [K,N], or [N,K] when tb). */
static inline void k_gemm_dB(const float *dY, const float *A, float *dB, int M, int N, int K, int ta, int tb, float alpha,
                             int acc) {
  if (!tb) /* dB[K,N] = op(A)^T . dY */
    pr_sgemm(ta ? CblasNoTrans : CblasTrans, CblasNoTrans, K, N, M, alpha, A, ta ? M : K, dY, N,
                acc ? 1.0f : 0.0f, dB, N);
  else /* dB[N,K] = dY^T . op(A) */
    pr_sgemm(CblasTrans, ta ? CblasTrans : CblasNoTrans, N, K, M, alpha, dY, N, A, ta ? M : K,
                acc ? 1.0f : 0.0f, dB, K);
}

/* Rows [r0, r1) of k_gemm_dB's dB into dBr (those rows alone, contiguous): a gradient kept in the stage's file
 * (pipecc --offload-optimizer) comes into memory a band at a time.  The rows of C in whole 96-row blocks are
 * one product to every OpenBLAS kernel set, cut or not (gemm.c), so the bands' bits are the whole call's. */
static inline void k_gemm_dB_rows(const float *dY, const float *A, float *dBr, int M, int N, int K, int ta, int tb, float alpha,
                                  int acc, int r0, int r1) {
  if (!tb) /* rows of op(A)^T: A's rows when ta, else its columns */
    pr_sgemm(ta ? CblasNoTrans : CblasTrans, CblasNoTrans, r1 - r0, N, M, alpha, ta ? A + (int64_t)r0 * M : A + r0, ta ? M : K, dY,
             N, acc ? 1.0f : 0.0f, dBr, N);
  else /* rows of dY^T: dY's columns */
    pr_sgemm(CblasTrans, ta ? CblasTrans : CblasNoTrans, r1 - r0, K, M, alpha, dY + r0, N, A, ta ? M : K, acc ? 1.0f : 0.0f, dBr, K);
}

/* dC = beta * dY summed over the broadcast axes. */
static inline void k_gemm_dC(const float *dY, float *dC, int M, int N, int cm, int cn, float beta, int acc) {
  if (!acc) memset(dC, 0, sizeof(float) * (size_t)cm * (size_t)cn);
  if (cm == 1 && cn == N) { /* a bias: the column sums, rows in order, a vector of columns at a time */
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) dC[j] += beta * dY[(int64_t)i * N + j];
    return;
  }
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) dC[(int64_t)(cm == 1 ? 0 : i) * cn + (cn == 1 ? 0 : j)] += beta * dY[(int64_t)i * N + j];
}
/* ---- MatMul with numpy semantics: batch dims broadcast ---- */

static inline void mm_offsets(const MatMulShape *s, int64_t b, int64_t *oa, int64_t *ob) {
  *oa = *ob = 0;
  for (int d = s->nb - 1; d >= 0; d--) {
    int64_t i = b % s->bdims[d];
    b /= s->bdims[d];
    *oa += i * s->sa[d], *ob += i * s->sb[d];
  }
}

/* Whether each batch has a matrix of its own in the operand with strides st (none broadcast): then the
 * batches' gradients for it go to separate places and may be computed on separate threads. */
static inline int mm_own(const MatMulShape *s, const int64_t *st) {
  for (int d = 0; d < s->nb; d++)
    if (st[d] == 0 && s->bdims[d] > 1) return 0;
  return 1;
}
/* Batches [lo, hi) of a batched product: the forward (which 0), dA (1) or dB (2), one GEMM each. */
typedef struct PrMatMul {
  const MatMulShape *s;
  const float *x, *w; /* forward: A, B; dA: dY, B; dB: dY, A */
  float *out;
  int which;
} PrMatMul;
PR_RANGE void matmul_r(const void *arg, int64_t lo, int64_t hi) {
  const PrMatMul *m = (const PrMatMul *)arg;
  const MatMulShape *s = m->s;
  int M = (int)s->M, N = (int)s->N, K = (int)s->K;
  for (int64_t b = lo; b < hi; b++) {
    int64_t oa, ob;
    mm_offsets(s, b, &oa, &ob);
    if (m->which == 0)
      pr_sgemm(CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, m->x + oa * M * K, K, m->w + ob * K * N, N, 0.0f, m->out + b * M * N, N);
    else if (m->which == 1)
      pr_sgemm(CblasNoTrans, CblasTrans, M, K, N, 1.0f, m->x + b * M * N, N, m->w + ob * K * N, N, 1.0f, m->out + oa * M * K, K);
    else
      pr_sgemm(CblasTrans, CblasNoTrans, K, N, M, 1.0f, m->w + oa * M * K, K, m->x + b * M * N, N, 1.0f, m->out + ob * K * N, N);
  }
}
/* The batches over the rank's threads where each writes its own matrix (par.h); else in order, one
 * thread, each GEMM still cut by gemm.c. */
static inline void matmul_run(const MatMulShape *s, const float *x, const float *w, float *out, int which, int split) {
  PrMatMul m = {s, x, w, out, which};
  if (split) PR_PAR_RUN(s->batch, 1, 2.0 * (double)s->batch * (double)s->M * (double)s->N * (double)s->K, matmul_r, &m);
  else matmul_r(&m, 0, s->batch);
}
static inline void k_matmul(const float *A, const float *B, float *Y, const MatMulShape *s) {
  if (s->b_shared) {
    pr_sgemm(CblasNoTrans, CblasNoTrans, (int)(s->batch * s->M), (int)s->N, (int)s->K, 1.0f, A, (int)s->K, B,
                (int)s->N, 0.0f, Y, (int)s->N);
    return;
  }
  matmul_run(s, A, B, Y, 0, 1);
}

/* dA = dY B^T (summed over batches that share an A), acc as usual. */
static inline void k_matmul_dA(const float *dY, const float *B, float *dA, int64_t na, const MatMulShape *s, int acc) {
  if (s->b_shared) {
    pr_sgemm(CblasNoTrans, CblasTrans, (int)(s->batch * s->M), (int)s->K, (int)s->N, 1.0f, dY, (int)s->N, B,
                (int)s->N, acc ? 1.0f : 0.0f, dA, (int)s->K);
    return;
  }
  if (!acc) memset(dA, 0, sizeof(float) * (size_t)na);
  matmul_run(s, dY, B, dA, 1, mm_own(s, s->sa));
}

/* dB = A^T dY, summed over the batches that share a B. */
static inline void k_matmul_dB(const float *dY, const float *A, float *dB, int64_t nbel, const MatMulShape *s, int acc) {
  if (s->b_shared) {
    pr_sgemm(CblasTrans, CblasNoTrans, (int)s->K, (int)s->N, (int)(s->batch * s->M), 1.0f, A, (int)s->K, dY,
                (int)s->N, acc ? 1.0f : 0.0f, dB, (int)s->N);
    return;
  }
  if (!acc) memset(dB, 0, sizeof(float) * (size_t)nbel);
  matmul_run(s, dY, A, dB, 2, mm_own(s, s->sb));
}
#endif
