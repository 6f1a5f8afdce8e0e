/* k_reduce.c - the reduce family's GPU kernels against the CPU's (cpu/reduce.h): ReduceSum / ReduceMean
 * (the scale) and their gradient, ReduceMax and its gradient (ties, NaN slices, the counts left in cnt),
 * ArgMax (ties, NaNs, select_last_index, the axis innermost or not), on ranks 1 to 4 with every axis
 * mask of the small shapes, odd and long extents, size-1 axes, acc 0 and 1. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/kernels.h"
#include "kcheck.h"
#include "kernels.h"

static ReduceShape shape_of(int rank, const int64_t *dims, int mask, int mean) {
  ReduceShape s;
  memset(&s, 0, sizeof s);
  s.rank = rank, s.mask = mask, s.n = 1, s.nout = 1;
  int64_t cnt = 1;
  for (int d = 0; d < rank; d++) {
    s.in[d] = dims[d], s.n *= dims[d];
    if (mask >> d & 1) cnt *= dims[d];
    else s.nout *= dims[d];
  }
  s.scale = mean ? 1.0f / (float)cnt : 1.0f;
  return s;
}

static void words(char *out, size_t size, int rank, const int64_t *dims, int mask, const char *what) {
  int k = snprintf(out, size, "[");
  for (int d = 0; d < rank; d++) k += snprintf(out + k, size - (size_t)k, "%s%lld", d ? "," : "", (long long)dims[d]);
  snprintf(out + k, size - (size_t)k, "] mask=%d %s", mask, what);
}

/* Sum and mean, forward and gradient (acc 0 and 1). */
static void check_sum(int rank, const int64_t *dims, int mask) {
  for (int mean = 0; mean < 2; mean++) {
    ReduceShape s = shape_of(rank, dims, mask, mean);
    char w[128];
    float *x = kc_rand(s.n, -0.5f, 1.5f), *y = kc_zeros(s.nout); /* mostly positive: a sum that cancels measures the CPU's own rounding */
    k_reduce(x, y, &s);
    float *gx = kc_up(x, s.n), *gy = kc_dev_zeros(s.nout);
    kc_reduce(gx, gy, &s);
    words(w, sizeof w, rank, dims, mask, mean ? "mean" : "sum");
    kc_report("k_reduce", w, kc_err(gy, y, s.nout));
    float *dy = kc_rand(s.nout, -1, 1), *gdy = kc_up(dy, s.nout);
    for (int acc = 0; acc < 2; acc++) {
      float *dx = kc_rand(s.n, -1, 1), *gdx = kc_up(dx, s.n);
      k_reduce_grad(dy, dx, &s, acc);
      kc_reduce_grad(gdy, gdx, &s, acc);
      words(w, sizeof w, rank, dims, mask, mean ? (acc ? "mean acc=1" : "mean acc=0") : (acc ? "sum acc=1" : "sum acc=0"));
      kc_report("k_reduce_grad", w, kc_err(gdx, dx, s.n));
      kc_free(gdx), free(dx);
    }
    kc_free(gx), kc_free(gy), kc_free(gdy), free(x), free(y), free(dy);
  }
}

/* Max and its gradient: values on a coarse grid (ties), and with `nans` some NaNs (their slices' max is
 * NaN, their gradient NaN). */
static void check_max(int rank, const int64_t *dims, int mask, int nans) {
  ReduceShape s = shape_of(rank, dims, mask, 0);
  char w[128];
  float *x = kc_rand(s.n, -4, 4);
  for (int64_t i = 0; i < s.n; i++) x[i] = floorf(x[i] * 2) / 2;
  if (nans)
    for (int64_t i = 3; i < s.n; i += 97) x[i] = NAN;
  float *y = kc_zeros(s.nout);
  k_reduce_max(x, y, &s);
  float *gx = kc_up(x, s.n), *gy = kc_dev_zeros(s.nout);
  kc_reduce_max(gx, gy, &s);
  words(w, sizeof w, rank, dims, mask, nans ? "ties, NaNs" : "ties");
  kc_report_exact("k_reduce_max", w, gy, y, s.nout * (int64_t)sizeof(float));
  float *dy = kc_rand(s.nout, -1, 1), *gdy = kc_up(dy, s.nout), *gyc = kc_up(y, s.nout);
  for (int acc = 0; acc < 2; acc++) {
    float *dx = kc_rand(s.n, -1, 1), *gdx = kc_up(dx, s.n), *cnt = kc_zeros(s.nout), *gcnt = kc_dev_zeros(s.nout);
    k_reduce_max_grad(x, y, dy, dx, cnt, &s, acc);
    kc_reduce_max_grad(gx, gyc, gdy, gdx, gcnt, &s, acc);
    words(w, sizeof w, rank, dims, mask, nans ? (acc ? "NaNs acc=1" : "NaNs acc=0") : (acc ? "ties acc=1" : "ties acc=0"));
    kc_report("k_reduce_max_grad", w, kc_err(gdx, dx, s.n));
    words(w, sizeof w, rank, dims, mask, "the counts in cnt");
    kc_report_exact("k_reduce_max_grad", w, gcnt, cnt, s.nout * (int64_t)sizeof(float));
    kc_free(gdx), kc_free(gcnt), free(dx), free(cnt);
  }
  kc_free(gx), kc_free(gy), kc_free(gdy), kc_free(gyc), free(x), free(y), free(dy);
}

/* ArgMax over [outer, axis, inner]: values on a grid of 5 (many ties), some NaNs where `nans`. */
static void check_argmax(int64_t outer, int64_t axis, int64_t inner, int nans) {
  int64_t n = outer * axis * inner, nout = outer * inner;
  float *x = kc_rand(n, 0, 5);
  for (int64_t i = 0; i < n; i++) x[i] = floorf(x[i]);
  if (nans)
    for (int64_t i = 5; i < n; i += 13) x[i] = i % 2 ? NAN : -NAN;
  float *gx = kc_up(x, n);
  for (int last = 0; last < 2; last++) {
    int64_t *y = calloc((size_t)nout, sizeof *y), *gy = kc_up_bytes(y, nout * (int64_t)sizeof *y);
    k_argmax(x, y, outer, axis, inner, last);
    kc_argmax(gx, gy, outer, axis, inner, last);
    char w[128];
    snprintf(w, sizeof w, "[%lld,%lld,%lld]%s%s", (long long)outer, (long long)axis, (long long)inner, nans ? " NaNs" : "",
             last ? " last" : "");
    kc_report_exact("k_argmax", w, gy, y, nout * (int64_t)sizeof *y);
    kc_free(gy), free(y);
  }
  kc_free(gx), free(x);
}

void check_reduce(void) {
  static const int64_t r1[][1] = {{1}, {7}, {1000}, {100003}};
  for (size_t i = 0; i < sizeof r1 / sizeof r1[0]; i++)
    for (int m = 0; m < 2; m++) check_sum(1, r1[i], m);
  /* {5003, 3} over the first axis: the CPU adds in one running float sum, whose own rounding grows as
   * sqrt(n) (at 50257 rows it reaches several 1e-6), while the GPU sums in chunks */
  static const int64_t r2[][2] = {{37, 1001}, {3, 50257}, {5003, 3}, {1, 7}, {7, 1}, {1000, 33}};
  for (size_t i = 0; i < sizeof r2 / sizeof r2[0]; i++)
    for (int m = 0; m < 4; m++) check_sum(2, r2[i], m);
  static const int64_t r3[][3] = {{5, 7, 33}, {2, 1, 300}, {3, 1001, 2}};
  for (size_t i = 0; i < sizeof r3 / sizeof r3[0]; i++)
    for (int m = 0; m < 8; m++) check_sum(3, r3[i], m);
  static const int64_t r4[][4] = {{4, 3, 9, 11}, {2, 1, 5, 1}};
  for (size_t i = 0; i < sizeof r4 / sizeof r4[0]; i++)
    for (int m = 0; m < 16; m++) check_sum(4, r4[i], m);
  /* a global pool, few long outputs (chunked), a long leading axis, every axis */
  static const int64_t big[][4] = {{8, 64, 28, 28}, {2, 3, 200, 200}, {3000, 4, 5, 3}, {2, 3, 200, 200}};
  static const int bigmask[] = {12, 14, 1, 15};
  for (int i = 0; i < 4; i++) check_sum(4, big[i], bigmask[i]);

  for (int nans = 0; nans < 2; nans++) {
    static const int64_t m1[] = {1000};
    check_max(1, m1, 1, nans);
    static const int64_t m2[][2] = {{37, 1001}, {1001, 37}, {3, 50257}};
    for (int i = 0; i < 3; i++)
      for (int m = 1; m < 4; m++) check_max(2, m2[i], m, nans);
    static const int64_t m4[] = {4, 3, 9, 11};
    for (int m = 1; m < 16; m += 2) check_max(4, m4, m, nans);
    check_max(4, m4, 6, nans), check_max(4, m4, 12, nans);
    static const int64_t m4b[] = {2, 3, 200, 200};
    check_max(4, m4b, 14, nans);
  }

  for (int nans = 0; nans < 2; nans++) {
    check_argmax(1, 1, 1, nans);
    check_argmax(37, 10, 1, nans);
    check_argmax(3, 1001, 1, nans);
    check_argmax(2, 50257, 1, nans);
    check_argmax(5, 7, 33, nans);
    check_argmax(1, 1000, 3, nans);
    check_argmax(4, 1, 9, nans);
  }
}
