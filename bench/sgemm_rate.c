/* The single-core SGEMM rate the bench compares pipecc's GFLOP/s with (bench/bench.py, section 1).
 *
 *   cc -O2 bench/sgemm_rate.c -o bench/work/sgemm_rate -lopenblas && bench/work/sgemm_rate [N] [REPS]
 *
 * One thread of the OpenBLAS the stage programs link, with the kernels they run (runtime/blas_core.h pins
 * OPENBLAS_CORETYPE to this CPU's newest, as pipecc's probe and every stage do; Debian's OpenBLAS alone falls
 * back to "Prescott" on this Xeon, 4x slower), openblas_set_num_threads(1), C = A B with
 * N x N row-major float matrices (default N = 2048, past the caches), one untimed call, then REPS timed calls
 * (default 5).  Prints one line: "sgemm N=<N> kernels=<core> best_gflops=<x> median_gflops=<y>" (2 N^3 FLOPs
 * per call). */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
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
  printf("sgemm N=%d kernels=%s best_gflops=%.3f median_gflops=%.3f check=%g\n", n, openblas_get_corename(), flops / t[0] / 1e9, flops / t[reps / 2] / 1e9,
         (double)c[nn - 1]);
  free(a), free(b), free(c), free(t);
  return 0;
}
