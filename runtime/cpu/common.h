/* cpu/common.h - what every kernel family shares: the inlining attributes, splitting a kernel over the rank's
 * threads (par.h), pr_sgemm, sums in eight lanes and the vector libm's types.
 * Part of the CPU kernels; runtime/kernels.h includes every family (the conventions are there). */
#ifndef PIPERUN_CPU_COMMON_H
#define PIPERUN_CPU_COMMON_H
/* Kernels whose loops are driven by a constant shape struct are inlined at
 * every call, so clang specialises each one on its shape. */
#define PR_INLINE static inline __attribute__((always_inline))
/* Kernels whose work does not gain from a constant shape (a library call, a copy, a per-channel loop)
 * are kept out of line instead: inlining them at each of a large model's thousand calls was most of its
 * build (docs/kernels.md, "Build time"). */
#define PR_OUT_OF_LINE static __attribute__((noinline, unused))
#include "../par.h"
#include "../shapes.h"
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* ---- splitting a kernel over the rank's threads (--threads T, par.h) ----
 * A kernel's loop is a range function over its items (elements, rows, batches), its operands in a
 * struct; the kernel hands it to PR_PAR_RUN, which runs it whole on one thread or in parts of whole
 * grains on T (pr_par_for).  Each item is computed by the same code either way, so T changes no bits.
 * A range function is never inlined: one thread and T run the same machine code.  Inlined with a call's
 * constant shape, clang vectorised some loops differently from the function's own copy (softmax's exp:
 * libmvec in one, libm's expf in the other), and the bits moved with T.  Loops that call libm where
 * speed matters say how they vectorise themselves (softmax_r).  The last argument: a pointer to the
 * operands (a compound literal may hold commas). */
#define PR_RANGE static __attribute__((noinline, unused))
#define PR_PAR_RUN(n, grain, work, fn, ...)                                                                 \
  do {                                                                                                      \
    const void *par_arg_ = (__VA_ARGS__);                                                                   \
    if (pr_par_nthreads == 1) fn(par_arg_, 0, (n));                                                         \
    else pr_par_for((n), (grain), (work), fn, par_arg_);                                                    \
  } while (0)
typedef struct PrEw {
  const float *x, *y, *dy; /* the inputs a kernel reads (y: the forward's output, for gradients) */
  float *out;
  float f0, f1;            /* a kernel's constants (LeakyRelu's alpha, Clip's bounds) */
  int op, acc;             /* k_unary's op; gradients: add to `out` */
} PrEw;
/* The range function `name` over [lo, hi), `body` the work of element i, with the PrEw's fields in scope. */
#define PR_EW_RANGE(name, body)                                                                             \
  PR_RANGE void name(const void *arg_, int64_t lo, int64_t hi) {                                            \
    const PrEw *e_ = (const PrEw *)arg_;                                                                    \
    const float *x = e_->x, *y = e_->y, *dy = e_->dy;                                                       \
    float *out = e_->out, f0 = e_->f0, f1 = e_->f1;                                                         \
    int op = e_->op, acc = e_->acc;                                                                         \
    (void)x, (void)y, (void)dy, (void)f0, (void)f1, (void)op, (void)acc;                                    \
    for (int64_t i = lo; i < hi; i++) { body }                                                              \
  }
/* Runs range function fn over n elements, `cost` elements' work each, the PrEw's fields given by name. */
#define PR_EW_FOR(fn, n, cost, ...) PR_PAR_RUN((n), PR_PAR_EW_GRAIN, (double)(n) * (cost), fn, &(PrEw){__VA_ARGS__})
/* A gradient's element: written, or added (acc). */
#define PR_GRAD_OUT(g) out[i] = acc ? out[i] + (g) : (g);

/* cblas_sgemm(CblasRowMajor, ...) cut into bands over the rank's threads (gemm.c). */
void pr_sgemm(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
              int ldb, float beta, float *C, int ldc);

/* ---- sums in eight lanes ----
 * A sum in one running total is a chain of dependent adds that no compiler may vectorise.  These keep
 * eight totals, element k going to lane k % 8, and add the lanes in a fixed tree at the end: the order is
 * fixed by the length alone, so every rank that runs a kernel gets the same bits, at vector speed. */
static inline float pr_lanes_total(const float *l) {
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}
static inline float pr_sum8(const float *x, int64_t n) {
  float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int j = 0; j < 8; j++) l[j] += x[k + j];
  float t = pr_lanes_total(l);
  for (; k < n; k++) t += x[k];
  return t;
}
static inline float pr_dot8(const float *x, const float *y, int64_t n) {
  float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int j = 0; j < 8; j++) l[j] += x[k + j] * y[k + j];
  float t = pr_lanes_total(l);
  for (; k < n; k++) t += x[k] * y[k];
  return t;
}

/* glibc's vector libm (libmvec) eight floats at a time: erf, softmax's and Gelu's exp. */
#if defined(PR_MVEC) && defined(__AVX2__)
typedef float pr_v8sf __attribute__((vector_size(32), aligned(4)));
typedef float pr_v8sf_a __attribute__((vector_size(32)));
pr_v8sf_a _ZGVdN8v_erff(pr_v8sf_a);
pr_v8sf_a _ZGVdN8v_expf(pr_v8sf_a);
#endif
#endif
