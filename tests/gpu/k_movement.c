/* k_movement.c - the movement family's checks (kcheck.h): copies, Pad, Transpose (tiled and row-wise
 * permutations), Split's and Concat's slices, strided views (Slice with negative steps, Expand, Tile, and a
 * view that reads an element twice), the casts (every half, the int64 edges) and Gather with repeated and
 * negative indices, each gradient with acc 0 and 1.  Everything but a view's summed gradient must be the
 * CPU's bits; Gather's gradient too (its sums run in the CPU's order). */
#include <math.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "cuda/kernels.h"
#include "device.h"
#include "kcheck.h"
#include "kernels.h"

#define F(n) ((int64_t)(n) * (int64_t)sizeof(float))

static float *dup(const float *h, int64_t n) {
  float *c = malloc((size_t)(n > 0 ? n : 1) * sizeof *c);
  memcpy(c, h, (size_t)n * sizeof *c);
  return c;
}

/* ---- copies ---- */
static void check_copy(int64_t n) {
  char w[48];
  snprintf(w, sizeof w, "%lld", (long long)n);
  float *x = kc_rand(n, -1, 1), *y = kc_rand(n, -1, 1), *dx = kc_up(x, n), *dy = kc_up(y, n);
  k_copy(x, y, n);
  kc_copy(dx, dy, n);
  kc_report_exact("k_copy", w, dy, y, F(n));
  k_copy(x, x, n); /* in place: nothing moves */
  kc_copy(dx, dx, n);
  snprintf(w, sizeof w, "%lld in place", (long long)n);
  kc_report_exact("k_copy", w, dx, x, F(n));
  for (int acc = 0; acc < 2; acc++) {
    float *g = kc_rand(n, -1, 1), *d = kc_rand(n, -1, 1), *junk = kc_rand(n, -5, 5), *dg = kc_up(g, n), *dd = kc_up(acc ? d : junk, n);
    k_copy_grad(g, d, n, acc);
    kc_copy_grad(dg, dd, n, acc);
    snprintf(w, sizeof w, "%lld acc=%d", (long long)n, acc);
    kc_report_exact("k_copy_grad", w, dd, d, F(n));
    free(g), free(d), free(junk), kc_free(dg), kc_free(dd);
  }
  /* k_copy_i64 (zb1's copy of a Gather's indices for W): n int64s, here the bits of 2n random floats. */
  float *xi = kc_rand(2 * n, -1, 1), *yi = kc_rand(2 * n, -1, 1), *dxi = kc_up(xi, 2 * n), *dyi = kc_up(yi, 2 * n);
  k_copy_i64((const int64_t *)xi, (int64_t *)yi, n);
  kc_copy_i64((const int64_t *)dxi, (int64_t *)dyi, n);
  snprintf(w, sizeof w, "%lld", (long long)n);
  kc_report_exact("k_copy_i64", w, dyi, yi, 8 * n);
  free(xi), free(yi), kc_free(dxi), kc_free(dyi);
  float *z = kc_rand(n, -1, 1), *dz = kc_up(z, n);
  k_zero(z, n);
  kc_zero(dz, n);
  snprintf(w, sizeof w, "%lld", (long long)n);
  kc_report_exact("k_zero", w, dz, z, F(n));
  free(x), free(y), free(z), kc_free(dx), kc_free(dy), kc_free(dz);
}

/* ---- Pad ---- */
static void check_pad(int rank, const int64_t *in, const int64_t *begin, const int64_t *end, float value) {
  PadShape s;
  memset(&s, 0, sizeof s);
  s.rank = rank, s.value = value;
  int64_t nx = 1, ny = 1;
  char w[96];
  int at = snprintf(w, sizeof w, "in");
  for (int d = 0; d < rank; d++) {
    s.in[d] = in[d], s.begin[d] = begin[d], s.out[d] = in[d] + begin[d] + end[d];
    nx *= s.in[d], ny *= s.out[d];
    at += snprintf(w + at, sizeof w - (size_t)at, " %lld+%lld+%lld", (long long)begin[d], (long long)in[d], (long long)end[d]);
  }
  float *x = kc_rand(nx, -1, 1), *y = kc_zeros(ny), *junk = kc_rand(ny, -5, 5), *dx = kc_up(x, nx), *dy = kc_up(junk, ny);
  k_pad(x, y, &s);
  kc_pad(dx, dy, &s);
  kc_report_exact("k_pad", w, dy, y, F(ny));
  float *g = kc_rand(ny, -1, 1), *dg = kc_up(g, ny);
  for (int acc = 0; acc < 2; acc++) {
    float *d = kc_rand(nx, -1, 1), *j2 = kc_rand(nx, -5, 5), *dd = kc_up(acc ? d : j2, nx);
    k_pad_grad(g, d, &s, acc);
    kc_pad_grad(dg, dd, &s, acc);
    char w2[120];
    snprintf(w2, sizeof w2, "%s acc=%d", w, acc);
    kc_report_exact("k_pad_grad", w2, dd, d, F(nx));
    free(d), free(j2), kc_free(dd);
  }
  free(x), free(y), free(junk), free(g), kc_free(dx), kc_free(dy), kc_free(dg);
}

/* ---- Transpose ---- */
static void check_transpose(int rank, const int64_t *in, const int *perm) {
  PermShape s;
  memset(&s, 0, sizeof s);
  int64_t xs[8], st = 1;
  for (int d = rank - 1; d >= 0; d--) xs[d] = st, st *= in[d];
  s.rank = rank, s.n = st;
  char w[96];
  int at = snprintf(w, sizeof w, "[");
  for (int d = 0; d < rank; d++) at += snprintf(w + at, sizeof w - (size_t)at, "%s%lld", d ? "," : "", (long long)in[d]);
  at += snprintf(w + at, sizeof w - (size_t)at, "] perm");
  for (int d = 0; d < rank; d++) {
    s.out[d] = in[perm[d]], s.st[d] = xs[perm[d]];
    at += snprintf(w + at, sizeof w - (size_t)at, " %d", perm[d]);
  }
  int64_t n = s.n;
  float *x = kc_rand(n, -1, 1), *y = kc_zeros(n), *junk = kc_rand(n, -5, 5), *dx = kc_up(x, n), *dy = kc_up(junk, n);
  k_transpose(x, y, &s);
  kc_transpose(dx, dy, &s);
  kc_report_exact("k_transpose", w, dy, y, F(n));
  float *g = kc_rand(n, -1, 1), *dg = kc_up(g, n);
  for (int acc = 0; acc < 2; acc++) {
    float *d = kc_rand(n, -1, 1), *dd = kc_up(acc ? d : junk, n);
    k_transpose_grad(g, d, &s, acc);
    kc_transpose_grad(dg, dd, &s, acc);
    char w2[120];
    snprintf(w2, sizeof w2, "%s acc=%d", w, acc);
    kc_report_exact("k_transpose_grad", w2, dd, d, F(n));
    free(d), kc_free(dd);
  }
  free(x), free(y), free(junk), free(g), kc_free(dx), kc_free(dy), kc_free(dg);
}

/* ---- Split and Concat: [outer, axis, inner], the slice [start, start + len) ---- */
static void check_slices(int64_t outer, int64_t axis, int64_t inner, int64_t start, int64_t len) {
  char w[96];
  snprintf(w, sizeof w, "[%lld,%lld,%lld] [%lld,+%lld)", (long long)outer, (long long)axis, (long long)inner, (long long)start,
           (long long)len);
  int64_t nb = outer * axis * inner, ns = outer * len * inner;
  float *big = kc_rand(nb, -1, 1), *small = kc_rand(ns, -1, 1), *dbig = kc_up(big, nb), *dsmall = kc_up(small, ns);
  /* take: the slice of big */
  float *y = kc_rand(ns, -1, 1), *junk = kc_rand(ns > nb ? ns : nb, -5, 5), *dyv = kc_up(junk, ns);
  k_take(big, y, outer, axis, inner, start, len);
  kc_take(dbig, dyv, outer, axis, inner, start, len);
  kc_report_exact("k_take", w, dyv, y, F(ns));
  free(y), kc_free(dyv);
  /* take's gradient: small added into its place in big */
  float *d = dup(big, nb), *dd = kc_up(big, nb);
  k_take_grad(small, d, outer, axis, inner, start, len);
  kc_take_grad(dsmall, dd, outer, axis, inner, start, len);
  kc_report_exact("k_take_grad", w, dd, d, F(nb));
  free(d), kc_free(dd);
  /* put: small into its place in big (the rest untouched) */
  d = dup(big, nb), dd = kc_up(big, nb);
  k_put(small, d, outer, axis, inner, start, len);
  kc_put(dsmall, dd, outer, axis, inner, start, len);
  kc_report_exact("k_put", w, dd, d, F(nb));
  free(d), kc_free(dd);
  /* put's gradient: the slice of big, written or added */
  for (int acc = 0; acc < 2; acc++) {
    d = dup(small, ns), dd = kc_up(acc ? small : junk, ns);
    k_put_grad(big, d, outer, axis, inner, start, len, acc);
    kc_put_grad(dbig, dd, outer, axis, inner, start, len, acc);
    char w2[120];
    snprintf(w2, sizeof w2, "%s acc=%d", w, acc);
    kc_report_exact("k_put_grad", w2, dd, d, F(ns));
    free(d), kc_free(dd);
  }
  free(big), free(small), free(junk), kc_free(dbig), kc_free(dsmall);
}

/* ---- strided views ---- */
static void check_view(const char *name, int rank, const int64_t *out, const int64_t *st, int64_t base, int64_t nx) {
  ViewShape s;
  memset(&s, 0, sizeof s);
  s.rank = rank, s.base = base, s.nx = nx, s.n = 1;
  for (int d = 0; d < rank; d++) s.out[d] = out[d], s.st[d] = st[d], s.n *= out[d];
  int64_t n = s.n;
  float *x = kc_rand(nx, -1, 1), *y = kc_zeros(n), *junk = kc_rand(n > nx ? n : nx, -5, 5), *dx = kc_up(x, nx), *dy = kc_up(junk, n);
  k_view(x, y, &s);
  kc_view(dx, dy, &s);
  kc_report_exact("k_view", name, dy, y, F(n));
  float *g = kc_rand(n, -0.25f, 1), *dg = kc_up(g, n);
  for (int acc = 0; acc < 2; acc++) {
    float *d = kc_rand(nx, -1, 1), *dd = kc_up(acc ? d : junk, nx);
    k_view_grad(g, d, &s, acc);
    kc_view_grad(dg, dd, &s, acc);
    char w[120];
    snprintf(w, sizeof w, "%s acc=%d", name, acc);
    kc_report("k_view_grad", w, kc_err(dd, d, nx));
    free(d), kc_free(dd);
  }
  free(x), free(y), free(junk), free(g), kc_free(dx), kc_free(dy), kc_free(dg);
}

static void check_views(void) {
  /* Slice x[1:6:2, 30:3:-3] of [7, 33] */
  check_view("slice [7,33] [1:6:2, 30:3:-3]", 2, (int64_t[]){3, 9}, (int64_t[]){66, -3}, 33 + 30, 231);
  check_view("slice [10,65] [2:9]", 2, (int64_t[]){7, 65}, (int64_t[]){65, 1}, 130, 650);
  check_view("slice [1037] [::-1]", 1, (int64_t[]){1037}, (int64_t[]){-1}, 1036, 1037);
  check_view("expand [1,33] to [5,7,33]", 3, (int64_t[]){5, 7, 33}, (int64_t[]){0, 0, 1}, 0, 33);
  check_view("expand [9,1] to [9,1000]", 2, (int64_t[]){9, 1000}, (int64_t[]){1, 0}, 0, 9);
  check_view("expand [1] to [20011]", 1, (int64_t[]){20011}, (int64_t[]){0}, 0, 1);
  check_view("expand [3,1,5] to [3,40,5]", 3, (int64_t[]){3, 40, 5}, (int64_t[]){5, 0, 1}, 0, 15);
  check_view("expand [1] to [1] (scalar)", 1, (int64_t[]){1}, (int64_t[]){0}, 0, 1);
  check_view("tile [4,6] by 2x3", 4, (int64_t[]){2, 4, 3, 6}, (int64_t[]){0, 6, 0, 1}, 0, 24);
  check_view("tile [65] by 300", 2, (int64_t[]){300, 65}, (int64_t[]){0, 1}, 0, 65);
  check_view("expand of a reversed slice", 3, (int64_t[]){4, 5, 7}, (int64_t[]){0, -7, 1}, 4 * 7, 35);
  check_view("window (reads elements twice)", 2, (int64_t[]){10, 5}, (int64_t[]){1, 1}, 0, 14);
  /* 16 axes: each axis of x [2,2,2,2,2,2,2,3] repeated twice */
  int64_t out[16], st[16], xs = 1;
  static const int64_t xd[8] = {2, 2, 2, 2, 2, 2, 2, 3};
  for (int k = 7; k >= 0; k--) out[2 * k] = 2, st[2 * k] = 0, out[2 * k + 1] = xd[k], st[2 * k + 1] = xs, xs *= xd[k];
  check_view("tile of 16 axes", 16, out, st, 0, xs);
}

/* ---- casts ---- */
static void check_casts(void) {
  enum { N = 4099 };
  float *r = kc_rand(N, 0, 1);
  /* int64 to float: small, near 2^24, near 2^53 and 2^62, both signs (rounding to nearest even) */
  int64_t *i64 = malloc(N * sizeof *i64);
  for (int i = 0; i < N; i++) {
    int64_t mag = i % 4 == 0 ? (int64_t)(r[i] * 1000) : i % 4 == 1 ? (1 << 24) + (int64_t)(r[i] * 64)
                  : i % 4 == 2 ? ((int64_t)1 << 53) + (int64_t)(r[i] * 4096) : ((int64_t)1 << 62) + (int64_t)(r[i] * 1e15);
    i64[i] = i % 8 < 4 ? mag : -mag;
  }
  i64[0] = INT64_MAX, i64[1] = INT64_MIN, i64[2] = 0;
  float *y = kc_zeros(N), *junk = kc_rand(N, -5, 5), *dy = kc_up(junk, N);
  int64_t *di = kc_up_bytes(i64, N * 8);
  k_cast_i64_f32(i64, y, N);
  kc_cast_i64_f32(di, dy, N);
  kc_report_exact("k_cast_i64_f32", "4099 mixed magnitudes", dy, y, F(N));
  kc_free(di);
  /* int32 to float */
  int32_t *i32 = malloc(N * sizeof *i32);
  for (int i = 0; i < N; i++) i32[i] = (int32_t)((r[i] - 0.5) * 4294967295.0);
  i32[0] = INT32_MAX, i32[1] = INT32_MIN, i32[2] = (1 << 24) + 1, i32[3] = -7;
  di = kc_up_bytes(i32, N * 4);
  k_cast_i32_f32(i32, y, N);
  kc_cast_i32_f32(di, dy, N);
  kc_report_exact("k_cast_i32_f32", "4099 full range", dy, y, F(N));
  kc_free(di);
  /* bool to float: any nonzero byte is true */
  uint8_t *b8 = malloc(N);
  for (int i = 0; i < N; i++) b8[i] = (uint8_t)(r[i] * 4);
  b8[0] = 255;
  di = kc_up_bytes(b8, N);
  k_cast_bool_f32(b8, y, N);
  kc_cast_bool_f32(di, dy, N);
  kc_report_exact("k_cast_bool_f32", "4099 bytes 0..3, 255", dy, y, F(N));
  kc_free(di);
  /* float16 to float: every half */
  enum { NH = 65536 };
  uint16_t *h = malloc(NH * sizeof *h);
  for (int i = 0; i < NH; i++) h[i] = (uint16_t)i;
  float *yh = kc_zeros(NH), *dyh = kc_dev_zeros(NH);
  di = kc_up_bytes(h, NH * 2);
  k_cast_f16_f32(h, yh, NH);
  kc_cast_f16_f32(di, dyh, NH);
  kc_report_exact("k_cast_f16_f32", "all 65536 halves", dyh, yh, F(NH));
  kc_free(di), kc_free(dyh), free(yh);
  /* float to int64: truncation; NaN, infinities and values beyond int64 give INT64_MIN */
  float *f = kc_rand(N, -1e6f, 1e6f);
  static const float edge[] = {NAN, INFINITY, -INFINITY, 0x1p63f, -0x1p63f, 9.3e18f, -9.2e18f, -0.5f, 0.99f, -0.0f, 0x1.fffffep62f, 16777217.0f};
  for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) f[i] = edge[i];
  for (int i = 20; i < 200; i++) f[i] = (r[i] - 0.5f) * 1.8e19f;
  int64_t *o64 = calloc(N, 8), *j64 = malloc(N * 8);
  memset(j64, 0x5a, N * 8);
  float *df = kc_up(f, N);
  int64_t *do64 = kc_up_bytes(j64, N * 8);
  k_cast_f32_i64(f, o64, N);
  kc_cast_f32_i64(df, do64, N);
  kc_report_exact("k_cast_f32_i64", "4099 with NaN, inf, +-2^63", do64, o64, N * 8);
  kc_free(df), kc_free(do64), kc_free(dy);
  free(r), free(i64), free(i32), free(b8), free(h), free(f), free(o64), free(j64), free(y), free(junk);
}

/* ---- Gather on axis 0 and its gradient ---- */
static void check_gather(int64_t n, int64_t rows, int64_t width) {
  char w[96];
  snprintf(w, sizeof w, "%lld ids, table [%lld,%lld]", (long long)n, (long long)rows, (long long)width);
  float *r = kc_rand(n, 0, 1), *table = kc_rand(rows * width, -1, 1);
  int64_t *idx = malloc((size_t)n * sizeof *idx);
  for (int64_t i = 0; i < n; i++) { /* both signs: -rows .. rows - 1 */
    idx[i] = (int64_t)(r[i] * 2 * (double)rows) - rows;
    if (idx[i] >= rows) idx[i] = rows - 1;
  }
  int64_t *di = kc_up_bytes(idx, n * 8);
  float *dt = kc_up(table, rows * width), *y = kc_zeros(n * width), *junk = kc_rand(n * width, -5, 5), *dyv = kc_up(junk, n * width);
  k_gather(table, idx, y, n, rows, width, "check_gather");
  kc_gather(dt, di, dyv, n, rows, width, "check_gather");
  kc_report_exact("k_gather", w, dyv, y, F(n * width));
  /* the gradient adds into a table that holds something already: the CPU's order gives the CPU's bits */
  float *g = kc_rand(n * width, -1, 1), *dg = kc_up(g, n * width), *d = dup(table, rows * width);
  k_gather_grad(idx, g, d, n, rows, width, "check_gather");
  kc_gather_grad(di, dg, dt, n, rows, width, "check_gather");
  kc_report_exact("k_gather_grad", w, dt, d, F(rows * width));
  free(r), free(table), free(idx), free(y), free(junk), free(g), free(d);
  kc_free(di), kc_free(dt), kc_free(dyv), kc_free(dg);
}

/* ---- a bad Gather index: recorded by the kernel, nothing outside the table read or written, and reported
 * (pr_bad_index, naming the node and the launch's step) by the device layer's check, not at the launch ---- */
static jmp_buf bad_jmp;
static struct { int calls; const char *node, *what; int64_t at, index, rows, step; } bad;
void pr_bad_index(const char *node, const char *what, int64_t at, int64_t index, int64_t rows, const RandCtx *when) {
  bad.calls++, bad.node = node, bad.what = what, bad.at = at, bad.index = index, bad.rows = rows, bad.step = when->step;
  longjmp(bad_jmp, 1);
}
/* pr_dev_check after the device's work: whether it reported index at position at, from node, launched at step. */
static int reported(const char *node, const char *what, int64_t at, int64_t index, int64_t rows, int64_t step) {
  memset(&bad, 0, sizeof bad);
  cudaDeviceSynchronize();
  if (!setjmp(bad_jmp)) pr_dev_check();
  return bad.calls == 1 && bad.node == node && !strcmp(bad.what, what) && bad.at == at && bad.index == index && bad.rows == rows &&
         bad.step == step;
}
static void check_gather_bad(void) {
  enum { ROWS = 5, WIDTH = 3, N = 4, GUARD = 8 };
  const char *node = "/embed/Gather";
  int64_t idx[N] = {1, -5, 7, 4}; /* 7 is out of [-5, 5) */
  /* The table with guard rows after it: a read or write past the table would show in them. */
  float *table = kc_rand((ROWS + GUARD) * WIDTH, -1, 1), *g = kc_rand(N * WIDTH, -1, 1), *y = kc_zeros(N * WIDTH);
  float *dt = kc_up(table, (ROWS + GUARD) * WIDTH), *dg = kc_up(g, N * WIDTH), *dy = kc_dev_zeros(N * WIDTH);
  int64_t *di = kc_up_bytes(idx, sizeof idx);
  pr_rand.step = 6, pr_rand.mb = 2;
  kc_gather(dt, di, dy, N, ROWS, WIDTH, node);
  pr_rand.step = 7; /* the report names the launch's step, not the check's */
  int ok = reported(node, "Gather", 2, 7, ROWS, 6);
  for (int i = 0; i < N; i++)
    for (int k = 0; k < WIDTH; k++) y[i * WIDTH + k] = i == 2 ? 0 : table[(idx[i] < 0 ? idx[i] + ROWS : idx[i]) * WIDTH + k];
  kc_report("k_gather", ok ? "index 7 of 5 rows: reported" : "index 7 of 5 rows: NOT REPORTED", ok ? 0 : 1);
  kc_report_exact("k_gather", "index 7 of 5 rows: 0 for it", dy, y, F(N * WIDTH));
  /* The gradient adds the good positions' rows and nothing past the table. */
  float *want = dup(table, (ROWS + GUARD) * WIDTH);
  for (int i = 0; i < N; i++)
    if (i != 2)
      for (int k = 0; k < WIDTH; k++) want[(idx[i] < 0 ? idx[i] + ROWS : idx[i]) * WIDTH + k] += g[i * WIDTH + k];
  kc_gather_grad(di, dg, dt, N, ROWS, WIDTH, node);
  ok = reported(node, "Gather's gradient", 2, 7, ROWS, 7);
  kc_report("k_gather_grad", ok ? "index 7 of 5 rows: reported" : "index 7 of 5 rows: NOT REPORTED", ok ? 0 : 1);
  kc_report_exact("k_gather_grad", "index 7 of 5 rows: guard rows kept", dt, want, F((ROWS + GUARD) * WIDTH));
  pr_rand.step = 0, pr_rand.mb = 0;
  free(table), free(g), free(y), free(want);
  kc_free(dt), kc_free(dg), kc_free(dy), kc_free(di);
}

void check_movement(void) {
  check_copy(1), check_copy(7), check_copy(1037), check_copy(100003);

  check_pad(0, NULL, NULL, NULL, 3.5f);
  check_pad(1, (int64_t[]){1037}, (int64_t[]){3}, (int64_t[]){5}, 0);
  check_pad(2, (int64_t[]){7, 33}, (int64_t[]){1, 2}, (int64_t[]){0, 3}, -1.5f);
  check_pad(3, (int64_t[]){2, 5, 7}, (int64_t[]){0, 1, 1}, (int64_t[]){1, 1, 0}, 0.25f);
  check_pad(4, (int64_t[]){2, 3, 9, 9}, (int64_t[]){0, 0, 1, 1}, (int64_t[]){0, 0, 1, 1}, 0);
  check_pad(4, (int64_t[]){2, 3, 5, 1}, (int64_t[]){0, 0, 0, 0}, (int64_t[]){0, 0, 0, 0}, 1);
  check_pad(2, (int64_t[]){1, 1}, (int64_t[]){2, 0}, (int64_t[]){0, 33}, 7);

  check_transpose(1, (int64_t[]){1037}, (int[]){0});
  check_transpose(2, (int64_t[]){33, 65}, (int[]){1, 0});
  check_transpose(2, (int64_t[]){1, 7}, (int[]){1, 0});
  check_transpose(3, (int64_t[]){5, 7, 33}, (int[]){0, 2, 1});
  check_transpose(3, (int64_t[]){5, 7, 33}, (int[]){1, 0, 2});
  check_transpose(3, (int64_t[]){5, 7, 33}, (int[]){2, 1, 0});
  check_transpose(3, (int64_t[]){5, 1, 33}, (int[]){2, 0, 1});
  check_transpose(4, (int64_t[]){2, 3, 37, 17}, (int[]){0, 2, 1, 3});
  check_transpose(4, (int64_t[]){2, 3, 37, 17}, (int[]){0, 1, 3, 2});
  check_transpose(4, (int64_t[]){2, 3, 37, 17}, (int[]){3, 2, 1, 0});
  check_transpose(4, (int64_t[]){2, 3, 37, 17}, (int[]){0, 2, 3, 1});
  check_transpose(4, (int64_t[]){2, 65, 12, 16}, (int[]){0, 2, 1, 3}); /* heads of attention */
  check_transpose(4, (int64_t[]){2, 12, 65, 16}, (int[]){0, 1, 3, 2}); /* K^T */
  check_transpose(3, (int64_t[]){3, 100, 257}, (int[]){0, 2, 1});

  check_slices(1, 1037, 1, 100, 500);
  check_slices(7, 33, 5, 3, 11);
  check_slices(3, 10, 65, 0, 10);
  check_slices(4, 9, 1, 8, 1);
  check_slices(64, 144, 1, 48, 48); /* q, k, v of a fused projection */
  check_slices(2, 5, 7, 2, 0);

  check_views();
  check_casts();

  check_gather(1, 1, 1);
  check_gather(7, 5000, 3);
  check_gather(1000, 37, 65);
  check_gather(2048, 300, 33);
  check_gather(513, 2, 1000);
  check_gather_bad();
}
