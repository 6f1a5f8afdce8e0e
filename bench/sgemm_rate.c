/* The single-core SGEMM rate the bench compares pipecc's GFLOP/s with (bench/bench.py, section 1).
 *
 *   cc -O2 bench/sgemm_rate.c -o bench/work/sgemm_rate -lopenblas && bench/work/sgemm_rate [N] [REPS]
 *
 * One thread of the OpenBLAS the stage programs link, with the kernels they run (runtime/blas_core.h pins
 * OPENBLAS_CORETYPE to this CPU's newest, as pipecc's probe and every stage do; Debian's OpenBLAS alone falls
 * back to "Prescott" on this Xeon, 4x slower), openblas_set_num_threads(1), C = A B with
 * N x N row-major float matrices (default N = 2048, past the caches), one untimed call, then REPS timed calls
 * (default 5).  Prints one line: "sgemm N=<N> kernels=<core> best_gflops=<x> median_gflops=<y> fma_peak_gflops=<z>"
 * (2 N^3 FLOPs per call).
 *
 * fma_peak_gflops is the core's floating-point ceiling, which no kernel passes: independent fused multiply-adds on
 * registers only (no loads), 12 chains (past the FMA latency times the FMA ports of current x86 cores), in the
 * widest vectors the CPU has (AVX-512, else AVX2, else 0: not measured), best of 5 runs of about 0.1 s. */
#include <cblas.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../runtime/blas_core.h"

void openblas_set_num_threads(int);
char *openblas_get_corename(void);

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

#define FMA_CHAINS 12

/* Where the FMA loops leave their result, so that the compiler keeps them. */
static volatile float fma_sink;

/* FLOPs done by `iters` rounds of FMA_CHAINS independent vector FMAs, each chain its own variable so that
 * every one stays in a register (optimised: bench.py builds with -O2; chains in an array were kept in memory
 * at -O2 and measured 54 GFLOP/s, and -O0 measures a tenth); their sum goes to fma_sink. */
#define FMA_LOOP(VEC, SET1, FMADD, ADD, LANES)                                                               \
  VEC x = SET1(0.999999f), y = SET1(1e-7f), a0 = SET1(0), a1 = SET1(1), a2 = SET1(2), a3 = SET1(3), a4 = SET1(4), \
      a5 = SET1(5), a6 = SET1(6), a7 = SET1(7), a8 = SET1(8), a9 = SET1(9), a10 = SET1(10), a11 = SET1(11);   \
  for (long n = 0; n < iters; n++) {                                                                          \
    a0 = FMADD(a0, x, y), a1 = FMADD(a1, x, y), a2 = FMADD(a2, x, y), a3 = FMADD(a3, x, y);                   \
    a4 = FMADD(a4, x, y), a5 = FMADD(a5, x, y), a6 = FMADD(a6, x, y), a7 = FMADD(a7, x, y);                   \
    a8 = FMADD(a8, x, y), a9 = FMADD(a9, x, y), a10 = FMADD(a10, x, y), a11 = FMADD(a11, x, y);               \
  }                                                                                                           \
  VEC sum = ADD(ADD(ADD(ADD(a0, a1), ADD(a2, a3)), ADD(ADD(a4, a5), ADD(a6, a7))), ADD(ADD(a8, a9), ADD(a10, a11))); \
  float out[LANES];                                                                                           \
  memcpy(out, &sum, sizeof out);                                                                              \
  fma_sink = out[0];                                                                                          \
  return 2.0 * LANES * FMA_CHAINS * (double)iters

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx512f"))) static double fma_avx512(long iters) {
  FMA_LOOP(__m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, 16);
}

__attribute__((target("avx2,fma"))) static double fma_avx2(long iters) {
  FMA_LOOP(__m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, 8);
}

/* The best GFLOP/s of 5 runs of the widest FMA loop this CPU has; 0 where it has neither. */
static double fma_peak(void) {
  __builtin_cpu_init();
  int w512 = __builtin_cpu_supports("avx512f"), w256 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (!w512 && !w256) return 0;
  double best = 0;
  for (int r = 0; r < 5; r++) {
    double t0 = now(), flops = w512 ? fma_avx512(30000000) : fma_avx2(30000000), t = now() - t0;
    if (flops / t > best) best = flops / t;
  }
  return best / 1e9;
}
#else
static double fma_peak(void) { return 0; }
#endif

int main(int argc, char **argv) {
  blas_core_pin(argv, NULL);
  int n = argc > 1 ? atoi(argv[1]) : 2048, reps = argc > 2 ? atoi(argv[2]) : 5;
  if (n < 16 || reps < 1 || reps > 1000) {
    fprintf(stderr, "usage: sgemm_rate [N >= 16] [REPS 1..1000]\n");
    return 2;
  }
  openblas_set_num_threads(1);
  size_t nn = (size_t)n * n;
  float *a = malloc(sizeof(float) * nn), *b = malloc(sizeof(float) * nn), *c = malloc(sizeof(float) * nn);
  double *t = malloc(sizeof(double) * reps);
  if (!a || !b || !c || !t) {
    fprintf(stderr, "sgemm_rate: out of memory\n");
    return 1;
  }
  for (size_t i = 0; i < nn; i++) a[i] = (float)(i % 7) * 0.1f, b[i] = (float)(i % 5) * 0.1f, c[i] = 0.0f;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
  for (int r = 0; r < reps; r++) {
    double t0 = now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    t[r] = now() - t0;
  }
  qsort(t, reps, sizeof(double), cmp);
  double flops = 2.0 * n * (double)n * n;
  printf("sgemm N=%d kernels=%s best_gflops=%.3f median_gflops=%.3f fma_peak_gflops=%.3f check=%g\n", n, openblas_get_corename(),
         flops / t[0] / 1e9, flops / t[reps / 2] / 1e9, fma_peak(), (double)c[nn - 1]);
  free(a), free(b), free(c), free(t);
  return 0;
}
