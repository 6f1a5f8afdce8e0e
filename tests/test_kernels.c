/* test_kernels.c - the run-time kernels for Gelu, LeakyRelu, Concat, the
 * strided views (Slice, Expand, Tile), Cast, the unary maths (Neg ..
 * HardSwish), Max/Min, comparisons, ReduceMax, ArgMax, Dropout, LSTM and GRU
 * (runtime/kernels.h) against references computed in double:
 *   - forward values against the formula in double;
 *   - each gradient against the derivative in double, and against central
 *     finite differences of the double forward (which also checks the
 *     reference derivative);
 *   - acc = 1 adds exactly the acc = 0 gradient to what dx held;
 *   - k_put / k_put_grad: slices land where they should, nothing else is
 *     touched, put and put_grad are adjoint (<put x, dy> = <x, put_grad dy>),
 *     take(put(x)) = x, and k_put_grad(acc = 0) = k_take.
 *   - NaN: relu, maxpool, softmax, ... give what PyTorch gives on NaN input.
 *   - Conv, MaxPool, AveragePool in 1-D, 2-D and 3-D (ConvShape / PoolShape
 *     with unit leading slots): forward and every gradient against a direct
 *     double loop over (output, window) pairs, acc = 1 adding.
 *   - Philox4x32-10 against Random123's known-answer vectors; k_dropout /
 *     k_dropout_grad: the mask is the generator's, kept values are x * scale,
 *     the backward redraws the forward's mask, micro-batch mb continues the
 *     step's stream at element mb * n, acc = 1 adds.
 *   - k_gather / k_gather_grad: negative indices count from the end (ONNX); an index outside
 *     [-rows, rows) stops the run (pr_bad_index, defined here to record it) naming the node, the
 *     position and pr_rand's step, before anything outside the table is read or written.
 *   - k_lstm / k_gru and their gradients (forward, reverse and bidirectional,
 *     both layouts, GRU's linear_before_reset 0 and 1, zero or given initial
 *     state, with or without bias) against the ONNX equations in double and
 *     central differences of them.
 *   - --threads: every kernel that splits, and pr_sgemm's bands,
 *     give the same bits on 3 threads as on 1; `--threads-only` runs just these, which make test does
 *     under each OpenBLAS kernel set the CPU runs (`--kernel-sets` lists them).
 * Built under ASan + UBSan (make bin/test_kernels); ends with "N passed, M failed, K skipped, R refused" (check.h). */
#include <float.h>
#include <setjmp.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "blas_core.h"

#include "check.h"
/* A summary line, printed only when every check since `since` held. */
#define OK_IF_NONE_FAILED(since, ...)                     \
  do {                                                    \
    if (failed == (since)) printf("ok - " __VA_ARGS__);   \
  } while (0)

static uint64_t rng_state = 88172645463325252ull;
static double urand(void) { /* xorshift64*, uniform in [0, 1) */
  rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
  return (double)((rng_state * 2685821657736338717ull) >> 11) * 0x1.0p-53;
}

/* ---- references in double ---- */
static double gelu_ref(double x, int t) {
  if (t) return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  return 0.5 * x * (1 + erf(x / sqrt(2.0)));
}
static double gelu_dref(double x, int t) {
  if (t) {
    double k = sqrt(2 / M_PI), u = k * (x + 0.044715 * x * x * x), th = tanh(u);
    return 0.5 * (1 + th) + 0.5 * x * (1 - th * th) * k * (1 + 3 * 0.044715 * x * x);
  }
  return 0.5 * (1 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2 * M_PI);
}
static double leaky_ref(double x, double a) { return x > 0 ? x : a * x; }

/* Test inputs: a grid over [-8, 8], the points where things happen, and random values. */
#define NX 2300
static float xs[NX];
static int nx;
static void make_inputs(void) {
  nx = 0;
  for (int i = 0; i <= 2000; i++) xs[nx++] = (float)(-8.0 + 16.0 * i / 2000);
  const float special[] = {0.0f, -0.0f, 1e-3f, -1e-3f, 1e-30f, -1e-30f, FLT_MIN, -FLT_MIN, 0.5f, -0.5f, 3.0f, -3.0f,
                           10.0f, -10.0f, 20.0f, -20.0f, 100.0f, -100.0f, 1e4f, -1e4f};
  for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) xs[nx++] = special[i];
  while (nx < NX) xs[nx++] = (float)(12 * urand() - 6);
}

static void test_gelu(int t) {
  int f0 = failed;
  const char *name = t ? "tanh" : "none";
  float *y = malloc(sizeof(float) * NX), *dy = malloc(sizeof(float) * NX), *dx = malloc(sizeof(float) * NX),
        *dx2 = malloc(sizeof(float) * NX), *base = malloc(sizeof(float) * NX);
  for (int i = 0; i < nx; i++) dy[i] = (float)(2 * urand() - 1), base[i] = (float)(4 * urand() - 2);
  k_gelu(xs, y, nx, t);
  k_gelu_grad(xs, dy, dx, nx, t, 0);
  double worst_y = 0, worst_d = 0, worst_fd = 0;
  for (int i = 0; i < nx; i++) {
    double x = xs[i], ref = gelu_ref(x, t);
    /* float rounding of 1 + erf / 1 + tanh, scaled by 0.5 x, plus the result's own rounding */
    double tol_y = 4 * FLT_EPSILON * (fabs(ref) + fabs(x)) + 1e-37;
    double ey = fabs(y[i] - ref);
    if (ey / (fabs(ref) + fabs(x) + 1e-30) > worst_y) worst_y = ey / (fabs(ref) + fabs(x) + 1e-30);
    CHECK(ey <= tol_y, "gelu(%s) x=%.9g: got %.9g, double %.17g\n", name, x, y[i], ref);
    double dref = dy[i] * gelu_dref(x, t);
    double tol_d = 8 * FLT_EPSILON * fabs(dy[i]) * (1 + fabs(x) + x * x) + 1e-37;
    double ed = fabs(dx[i] - dref);
    if (ed / (fabs(dy[i]) * (1 + fabs(x) + x * x) + 1e-30) > worst_d) worst_d = ed / (fabs(dy[i]) * (1 + fabs(x) + x * x) + 1e-30);
    CHECK(ed <= tol_d, "gelu_grad(%s) x=%.9g dy=%.6g: got %.9g, double %.17g\n", name, x, dy[i], dx[i], dref);
    /* central differences of the double forward, where it is smooth and finite */
    if (fabs(x) <= 8) {
      double h = 1e-5 * (1 + fabs(x));
      double fd = (gelu_ref(x + h, t) - gelu_ref(x - h, t)) / (2 * h);
      double e = fabs(fd - gelu_dref(x, t));
      if (e > worst_fd) worst_fd = e;
      CHECK(e <= 1e-8, "gelu(%s) x=%.9g: derivative %.12g, finite differences %.12g\n", name, x, gelu_dref(x, t), fd);
      CHECK(fabs(dx[i] - dy[i] * fd) <= tol_d + 1e-8 * fabs(dy[i]), "gelu_grad(%s) x=%.9g vs finite differences: %.9g vs %.9g\n",
            name, x, dx[i], dy[i] * fd);
    }
  }
  /* acc = 1 adds the acc = 0 gradient to what was there, in float */
  memcpy(dx2, base, sizeof(float) * NX);
  k_gelu_grad(xs, dy, dx2, nx, t, 1);
  int same = 1;
  for (int i = 0; i < nx; i++) same &= dx2[i] == base[i] + dx[i];
  CHECK(same, "gelu_grad(%s) acc=1 is not base + the acc=0 gradient\n", name);
  /* acc = 0 overwrites whatever dx held (NaN included) */
  for (int i = 0; i < nx; i++) dx2[i] = NAN;
  k_gelu_grad(xs, dy, dx2, nx, t, 0);
  CHECK(!memcmp(dx2, dx, sizeof(float) * (size_t)nx), "gelu_grad(%s) acc=0 does not overwrite dx\n", name);
  OK_IF_NONE_FAILED(f0, "gelu approximate=%s on %d inputs: forward within %.2g, gradient within %.2g (relative to |x| + |y| and "
                        "|dy| (1 + |x| + x^2)) of double; derivative vs finite differences %.1e; acc=1 adds\n",
                    name, nx, worst_y, worst_d, worst_fd);
  free(y), free(dy), free(dx), free(dx2), free(base);
}

static void test_leakyrelu(float alpha) {
  int f0 = failed;
  float *y = malloc(sizeof(float) * NX), *dy = malloc(sizeof(float) * NX), *dx = malloc(sizeof(float) * NX),
        *dx2 = malloc(sizeof(float) * NX), *base = malloc(sizeof(float) * NX);
  for (int i = 0; i < nx; i++) dy[i] = (float)(2 * urand() - 1), base[i] = (float)(4 * urand() - 2);
  k_leakyrelu(xs, y, nx, alpha);
  k_leakyrelu_grad(xs, dy, dx, nx, alpha, 0);
  for (int i = 0; i < nx; i++) {
    double x = xs[i], ref = leaky_ref(x, alpha);
    /* + FLT_TRUE_MIN: alpha x of a tiny x is subnormal, rounded to 2^-149 */
    CHECK(fabs(y[i] - ref) <= FLT_EPSILON * fabs(ref) + FLT_TRUE_MIN, "leakyrelu(%g) x=%.9g: got %.9g, double %.17g\n", alpha, x, y[i], ref);
    /* PyTorch: x > 0 ? dy : alpha dy, so x = 0 and x = -0 take alpha */
    double dref = dy[i] * (x > 0 ? 1.0 : (double)alpha);
    CHECK(fabs(dx[i] - dref) <= FLT_EPSILON * fabs(dref) + FLT_TRUE_MIN, "leakyrelu_grad(%g) x=%.9g: got %.9g, want %.17g\n", alpha, x, dx[i], dref);
    if (fabs(x) > 1e-3) {
      double h = 1e-4 * fabs(x);
      double fd = (leaky_ref(x + h, alpha) - leaky_ref(x - h, alpha)) / (2 * h);
      CHECK(fabs(dx[i] - dy[i] * fd) <= 1e-6 * fabs(dy[i]), "leakyrelu_grad(%g) x=%.9g vs finite differences: %.9g vs %.9g\n", alpha,
            x, dx[i], dy[i] * fd);
    }
  }
  float z[2] = {0.0f, -0.0f}, one[2] = {1, 1}, g[2];
  k_leakyrelu_grad(z, one, g, 2, alpha, 0);
  CHECK(g[0] == alpha && g[1] == alpha, "leakyrelu_grad(%g) at 0 and -0: %g %g, want alpha (x > 0 is false)\n", alpha, g[0], g[1]);
  memcpy(dx2, base, sizeof(float) * NX);
  k_leakyrelu_grad(xs, dy, dx2, nx, alpha, 1);
  int same = 1;
  for (int i = 0; i < nx; i++) same &= dx2[i] == base[i] + dx[i];
  CHECK(same, "leakyrelu_grad(%g) acc=1 is not base + the acc=0 gradient\n", alpha);
  OK_IF_NONE_FAILED(f0, "leakyrelu alpha=%g on %d inputs: forward and gradient exact to float rounding, finite differences agree, "
                        "gradient at 0 is alpha, acc=1 adds\n",
                    alpha, nx);
  free(y), free(dy), free(dx), free(dx2), free(base);
}

/* Concat of K inputs of sizes len[k] along the middle axis of [outer, axis, inner]. */
static void test_put(int64_t outer, int64_t inner, int K, const int64_t *len) {
  int f0 = failed;
  int64_t axis = 0;
  for (int k = 0; k < K; k++) axis += len[k];
  int64_t n = outer * axis * inner;
  float *y = malloc(sizeof(float) * (size_t)n), *dy = malloc(sizeof(float) * (size_t)n);
  float *x[16], *g[16], *gb[16];
  for (int k = 0; k < K; k++) {
    int64_t m = outer * len[k] * inner;
    x[k] = malloc(sizeof(float) * (size_t)m), g[k] = malloc(sizeof(float) * (size_t)m), gb[k] = malloc(sizeof(float) * (size_t)m);
    for (int64_t i = 0; i < m; i++) x[k][i] = (float)(2 * urand() - 1);
  }
  for (int64_t i = 0; i < n; i++) y[i] = NAN, dy[i] = (float)(2 * urand() - 1);
  /* one input at a time: its slice is filled, nothing else changes */
  int64_t start = 0;
  int untouched = 1;
  for (int k = 0; k < K; k++) {
    k_put(x[k], y, outer, axis, inner, start, len[k]);
    for (int64_t o = 0; o < outer; o++)
      for (int64_t a = start + len[k]; a < axis; a++)
        for (int64_t i = 0; i < inner; i++) untouched &= isnan(y[(o * axis + a) * inner + i]);
    start += len[k];
  }
  CHECK(untouched, "k_put (K=%d): wrote past its slice\n", K);
  /* the result is the concatenation (torch.cat semantics, reference built by index) */
  int cat = 1;
  for (int64_t o = 0; o < outer; o++) {
    int64_t a = 0;
    for (int k = 0; k < K; k++)
      for (int64_t l = 0; l < len[k]; l++, a++)
        for (int64_t i = 0; i < inner; i++) cat &= y[(o * axis + a) * inner + i] == x[k][(o * len[k] + l) * inner + i];
  }
  CHECK(cat, "k_put (K=%d, outer %lld, inner %lld): not the concatenation\n", K, (long long)outer, (long long)inner);
  /* put_grad (acc = 0) = take; take(put(x)) = x; adjointness in double; acc = 1 adds */
  start = 0;
  for (int k = 0; k < K; k++) {
    int64_t m = outer * len[k] * inner;
    k_put_grad(dy, g[k], outer, axis, inner, start, len[k], 0);
    k_take(dy, gb[k], outer, axis, inner, start, len[k]);
    CHECK(!memcmp(g[k], gb[k], sizeof(float) * (size_t)m), "k_put_grad acc=0 differs from k_take (input %d)\n", k);
    k_take(y, gb[k], outer, axis, inner, start, len[k]);
    CHECK(!memcmp(gb[k], x[k], sizeof(float) * (size_t)m), "k_take(k_put(x)) != x (input %d)\n", k);
    double lhs = 0, rhs = 0; /* <put x_k, dy> over the whole output (zero outside the slice) vs <x_k, put_grad dy> */
    for (int64_t o = 0; o < outer; o++)
      for (int64_t l = 0; l < len[k]; l++)
        for (int64_t i = 0; i < inner; i++) lhs += (double)y[(o * axis + start + l) * inner + i] * dy[(o * axis + start + l) * inner + i];
    for (int64_t i = 0; i < m; i++) rhs += (double)x[k][i] * g[k][i];
    CHECK(fabs(lhs - rhs) <= 1e-12 * (1 + fabs(lhs)), "k_put/k_put_grad not adjoint (input %d): %.17g vs %.17g\n", k, lhs, rhs);
    for (int64_t i = 0; i < m; i++) gb[k][i] = (float)(urand() - 0.5);
    float *keep = malloc(sizeof(float) * (size_t)m);
    memcpy(keep, gb[k], sizeof(float) * (size_t)m);
    k_put_grad(dy, gb[k], outer, axis, inner, start, len[k], 1);
    int adds = 1;
    for (int64_t i = 0; i < m; i++) adds &= gb[k][i] == keep[i] + g[k][i];
    CHECK(adds, "k_put_grad acc=1 is not dx + the acc=0 gradient (input %d)\n", k);
    free(keep);
    start += len[k];
  }
  /* k_take_grad is Split's gradient (the other direction): it scatters dx_k into a zeroed
   * [outer, axis, inner] buffer; summed over k it rebuilds what k_put builds. */
  float *z = calloc((size_t)n, sizeof(float));
  start = 0;
  for (int k = 0; k < K; k++) k_take_grad(x[k], z, outer, axis, inner, start, len[k]), start += len[k];
  CHECK(!memcmp(z, y, sizeof(float) * (size_t)n), "k_take_grad into zeros is not k_put (K=%d)\n", K);
  OK_IF_NONE_FAILED(f0, "k_put / k_put_grad: Concat of %d inputs along an axis of %lld (outer %lld, inner %lld): slices, "
                        "take(put x) = x, adjoint, acc=1 adds, k_take_grad scatters the same\n",
                    K, (long long)axis, (long long)outer, (long long)inner);
  for (int k = 0; k < K; k++) free(x[k]), free(g[k]), free(gb[k]);
  free(y), free(dy), free(z);
}

/* NaN in, NaN out, as PyTorch (torch 1.13 on CPU; the values below are what it gives):
 *   torch.relu([nan, -1, 2]) = [nan, 0, 2], its gradient of ones = [1, 0, 1]
 *   leaky_relu([nan, -1, 2], 0.1) = [nan, -0.1, 2], gradient [0.1, 0.1, 1]
 *   max_pool2d([1, nan, 3, nan], (1, 4)) = nan, the gradient on the last NaN: [0, 0, 0, 1]
 *   softmax / log_softmax([nan, -1, 2]) = [nan, nan, nan]
 *   tanh, sigmoid, gelu of nan = nan; cross-entropy of a row holding a NaN = nan
 * A kernel that turns NaN into a number hides a broken weight from the NaN checks. */
static void test_nan(void) {
  int f0 = failed;
  const float x[3] = {NAN, -1, 2}, one[3] = {1, 1, 1};
  float y[3], g[3];
  k_relu(x, y, 3);
  CHECK(isnan(y[0]) && y[1] == 0 && y[2] == 2, "relu([nan, -1, 2]) = [%g, %g, %g], torch: [nan, 0, 2]\n", y[0], y[1], y[2]);
  k_relu_grad(y, one, g, 3, 0);
  CHECK(g[0] == 1 && g[1] == 0 && g[2] == 1, "relu_grad at [nan, 0, 2] = [%g, %g, %g], torch: [1, 0, 1]\n", g[0], g[1], g[2]);
  k_leakyrelu(x, y, 3, 0.1f);
  CHECK(isnan(y[0]) && y[1] == -0.1f && y[2] == 2, "leakyrelu([nan, -1, 2]) = [%g, %g, %g], torch: [nan, -0.1, 2]\n", y[0], y[1], y[2]);
  k_leakyrelu_grad(x, one, g, 3, 0.1f, 0);
  CHECK(g[0] == 0.1f && g[1] == 0.1f && g[2] == 1, "leakyrelu_grad([nan, -1, 2]) = [%g, %g, %g], torch: [0.1, 0.1, 1]\n", g[0], g[1], g[2]);
  const float px[4] = {1, NAN, 3, NAN};
  float py[1], pdx[4];
  const PoolShape ps = {.n = 1, .c = 1, .d = 1, .h = 1, .w = 4, .od = 1, .oh = 1, .ow = 1, .kd = 1, .kh = 1, .kw = 4,
                        .sd = 1, .sh = 1, .sw = 4, .dd = 1, .dh = 1, .dw = 1};
  k_maxpool(px, py, &ps);
  CHECK(isnan(py[0]), "maxpool([1, nan, 3, nan]) = %g, torch: nan\n", py[0]);
  k_maxpool_grad(px, one, pdx, &ps, 0);
  CHECK(pdx[0] == 0 && pdx[1] == 0 && pdx[2] == 0 && pdx[3] == 1, "maxpool_grad([1, nan, 3, nan]) = [%g, %g, %g, %g], torch: [0, 0, 0, 1]\n",
        pdx[0], pdx[1], pdx[2], pdx[3]);
  for (int lg = 0; lg < 2; lg++) {
    k_softmax(x, y, 1, 3, lg);
    CHECK(isnan(y[0]) && isnan(y[1]) && isnan(y[2]), "%s([nan, -1, 2]) = [%g, %g, %g], torch: all nan\n", lg ? "log_softmax" : "softmax",
          y[0], y[1], y[2]);
  }
  const float x2[3] = {-1, NAN, 2}; /* the NaN not first: the row's max must not skip it */
  k_softmax(x2, y, 1, 3, 0);
  CHECK(isnan(y[0]) && isnan(y[1]) && isnan(y[2]), "softmax([-1, nan, 2]) = [%g, %g, %g], torch: all nan\n", y[0], y[1], y[2]);
  k_tanh(x, y, 1), k_sigmoid(x, y + 1, 1), k_gelu(x, y + 2, 1, 0);
  CHECK(isnan(y[0]) && isnan(y[1]) && isnan(y[2]), "tanh, sigmoid, gelu of nan = %g, %g, %g, torch: nan\n", y[0], y[1], y[2]);
  const int64_t label = 2;
  double l1 = k_softmax_xent(x2, &label, g, 1, 3, 1);
  CHECK(isnan(l1), "cross-entropy of [-1, nan, 2] = %g, torch: nan\n", l1);
  OK_IF_NONE_FAILED(f0, "NaN propagates as in PyTorch: relu and its gradient, leakyrelu, maxpool (the gradient on the last NaN), "
                        "softmax, log_softmax, tanh, sigmoid, gelu, cross-entropy\n");
}


/* ---- Dropout ---- */

/* Random123's tests/kat_vectors, the three "philox4x32 10" lines: counter, key, result. */
static void test_philox(void) {
  static const uint32_t kat[3][10] = {
      {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
      {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
      {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1},
  };
  int since = failed;
  for (int v = 0; v < 3; v++) {
    uint32_t c[4] = {kat[v][0], kat[v][1], kat[v][2], kat[v][3]};
    k_philox4x32_10(c, kat[v][4], kat[v][5]);
    for (int l = 0; l < 4; l++)
      CHECK(c[l] == kat[v][6 + l], "philox4x32-10 vector %d word %d: %08x, Random123: %08x\n", v, l, c[l], kat[v][6 + l]);
  }
  OK_IF_NONE_FAILED(since, "philox4x32-10 matches Random123's 3 known-answer vectors\n");
}

static void test_dropout(float ratio) {
  enum { N = 4099, MB = 3 }; /* not a multiple of 4: micro-batches start inside a Philox block */
  static float x[MB * N], y[MB * N], dy[MB * N], dx[MB * N], dx2[MB * N];
  static uint8_t m[MB * N], mfull[MB * N];
  int since = failed;
  for (int i = 0; i < MB * N; i++) x[i] = (float)(urand() * 4 - 2), dy[i] = (float)(urand() * 2 - 1);
  RandCtx rc = {0x123456789abcdefull, 7, 0};
  float scale = 1.0f / (float)(1.0 - (double)ratio);
  uint64_t thr = (uint64_t)((double)ratio * 4294967296.0);
  int64_t kept = 0;
  k_dropout(x, y, mfull, MB * N, ratio, 42, &rc); /* the whole step as one micro-batch */
  for (int i = 0; i < MB * N; i++) {
    uint32_t c[4] = {(uint32_t)(i / 4), 0, 42, 7};
    k_philox4x32_10(c, 0x89abcdefu, 0x01234567u);
    int keep = c[i % 4] >= thr;
    kept += keep;
    CHECK(mfull[i] == keep, "dropout(%g): element %d: mask %d, the generator says %d\n", (double)ratio, i, mfull[i], keep);
    CHECK(y[i] == x[i] * (keep ? scale : 0.0f), "dropout(%g): element %d: %.9g from %.9g (kept %d)\n", (double)ratio, i, y[i], x[i], keep);
  }
  for (int mb = 0; mb < MB; mb++) { /* micro-batch mb of N elements draws the step's elements mb * N .. */
    rc.mb = mb;
    k_dropout(x + mb * N, y + mb * N, m + mb * N, N, ratio, 42, &rc);
    k_dropout_grad(dy + mb * N, dx + mb * N, N, ratio, 42, &rc, 0);
  }
  CHECK(!memcmp(m, mfull, sizeof m), "dropout(%g): micro-batches do not continue the step's mask\n", (double)ratio);
  for (int i = 0; i < MB * N; i++)
    CHECK(dx[i] == dy[i] * (mfull[i] ? scale : 0.0f), "dropout_grad(%g): element %d: %.9g, want %.9g\n", (double)ratio, i, dx[i],
          dy[i] * (mfull[i] ? scale : 0.0f));
  memcpy(dx2, dx, sizeof dx);
  rc.mb = 0;
  k_dropout_grad(dy, dx2, N, ratio, 42, &rc, 1);
  for (int i = 0; i < N; i++) CHECK(dx2[i] == dx[i] + dx[i], "dropout_grad(%g) acc=1 is not dx + the gradient at %d\n", (double)ratio, i);
  double p = (double)kept / (MB * N), want = 1 - ratio, sd = sqrt(want * (1 - want) / (MB * N));
  CHECK(fabs(p - want) <= 5 * sd + 1e-12, "dropout(%g): kept %.4f, want %.4f +- %.4f\n", (double)ratio, p, want, 5 * sd);
  OK_IF_NONE_FAILED(since, "dropout(%g): mask from Philox, kept %.4f (want %.4f), x * %.9g, backward redraws it, acc\n", (double)ratio,
                    p, want, (double)scale);
}

/* ---- k_view / k_view_grad (Slice, Expand, Tile) against index loops in double ----
 * x is [4, 5, 6] (values i + 0.25).  Each case is a ViewShape as the compiler
 * builds it and a reference map from an output index (a, b, c) to the input
 * index it reads, written with the op's own definition:
 *   Slice  x[s0 + a p0, s1 + b p1, s2 + c p2] (steps negative too)
 *   Expand x[a % 4 or 0 on a broadcast axis ...] (an input dim of 1 reads index 0)
 *   Tile   x[a % 4, b % 5, c % 6] */
enum { VX0 = 4, VX1 = 5, VX2 = 6 };
typedef struct ViewCase {
  const char *what;
  int kind;             /* 0 slice, 1 expand ([4,1,6] -> [4,3,6] read from x's first column), 2 tile */
  int64_t y[3];         /* output dims */
  int64_t s[3], p[3];   /* slice starts and steps */
} ViewCase;

static int64_t view_ref_at(const ViewCase *c, int64_t a, int64_t b, int64_t k) {
  if (c->kind == 0) return ((c->s[0] + a * c->p[0]) * VX1 + c->s[1] + b * c->p[1]) * VX2 + c->s[2] + k * c->p[2];
  if (c->kind == 1) return (a * 1 + 0) * VX2 + k; /* x viewed as [4, 1, 6]: b broadcast */
  return ((a % VX0) * VX1 + b % VX1) * VX2 + k % VX2;
}

static void test_view(const ViewCase *c) {
  int f0 = failed;
  int64_t nxe = c->kind == 1 ? VX0 * VX2 : VX0 * VX1 * VX2, ny = c->y[0] * c->y[1] * c->y[2];
  ViewShape vs = {.rank = 3, .out = {c->y[0], c->y[1], c->y[2]}, .n = ny, .nx = nxe};
  if (c->kind == 0) {
    vs.base = (c->s[0] * VX1 + c->s[1]) * VX2 + c->s[2];
    vs.st[0] = c->p[0] * VX1 * VX2, vs.st[1] = c->p[1] * VX2, vs.st[2] = c->p[2];
  } else if (c->kind == 1) {
    vs.st[0] = VX2, vs.st[1] = 0, vs.st[2] = 1;
  } else { /* tile as the compiler reads it: [r0, 4, r1, 5, r2, 6] with repeat strides 0 */
    vs.rank = 6;
    const int64_t d[3] = {VX0, VX1, VX2}, xs[3] = {VX1 * VX2, VX2, 1};
    for (int i = 0; i < 3; i++) vs.out[2 * i] = c->y[i] / d[i], vs.st[2 * i] = 0, vs.out[2 * i + 1] = d[i], vs.st[2 * i + 1] = xs[i];
  }
  float *x = malloc(sizeof(float) * (size_t)nxe), *y = malloc(sizeof(float) * (size_t)ny), *dy = malloc(sizeof(float) * (size_t)ny);
  float *dx = malloc(sizeof(float) * (size_t)nxe), *dx1 = malloc(sizeof(float) * (size_t)nxe);
  double *ref = calloc((size_t)nxe, sizeof(double));
  for (int64_t i = 0; i < nxe; i++) x[i] = (float)i + 0.25f;
  for (int64_t i = 0; i < ny; i++) dy[i] = (float)(urand() - 0.5);
  k_view(x, y, &vs);
  int bad = 0;
  for (int64_t a = 0, i = 0; a < c->y[0]; a++)
    for (int64_t b = 0; b < c->y[1]; b++)
      for (int64_t k = 0; k < c->y[2]; k++, i++) {
        int64_t at = view_ref_at(c, a, b, k);
        bad += y[i] != x[at];
        ref[at] += dy[i];
      }
  CHECK(!bad, "k_view %s: %d of %lld elements differ from the index reference\n", c->what, bad, (long long)ny);
  for (int64_t i = 0; i < nxe; i++) dx[i] = 7; /* acc = 0 must overwrite, zeros included */
  k_view_grad(dy, dx, &vs, 0);
  double worst = 0;
  for (int64_t i = 0; i < nxe; i++) worst = fmax(worst, fabs(dx[i] - ref[i]));
  CHECK(worst <= 1e-6, "k_view_grad %s: max error %.3g against the double sum over the outputs that read each element\n", c->what, worst);
  for (int64_t i = 0; i < nxe; i++) dx1[i] = (float)(urand() - 0.5);
  memcpy(x, dx1, sizeof(float) * (size_t)nxe);
  k_view_grad(dy, dx1, &vs, 1);
  double wa = 0;
  for (int64_t i = 0; i < nxe; i++) wa = fmax(wa, fabs(dx1[i] - ((double)x[i] + ref[i])));
  CHECK(wa <= 2e-6, "k_view_grad %s acc=1: max error %.3g against dx + the gradient\n", c->what, wa);
  OK_IF_NONE_FAILED(f0, "k_view / k_view_grad %s: values, gradient (acc 0 and 1) against the index reference\n", c->what);
  free(x), free(y), free(dy), free(dx), free(dx1), free(ref);
}

/* Cast: int64 -> float rounds to nearest even as C's conversion and numpy do;
 * float -> int64 truncates toward zero, NaN and out of range give INT64_MIN
 * (numpy's astype and torch's .long() on x86). */
static void test_cast(void) {
  int f0 = failed;
  const int64_t xi[6] = {0, -3, 16777217, -16777219, INT64_MAX, INT64_MIN};
  const float wantf[6] = {0.0f, -3.0f, 16777216.0f, -16777220.0f, 0x1p63f, -0x1p63f};
  float yf[6];
  k_cast_i64_f32(xi, yf, 6);
  for (int i = 0; i < 6; i++) CHECK(yf[i] == wantf[i], "k_cast_i64_f32(%lld) = %.9g, want %.9g\n", (long long)xi[i], yf[i], wantf[i]);
  const float xf[9] = {2.7f, -2.7f, -0.5f, 0.0f, 1e18f, -0x1p63f, 0x1p63f, NAN, -INFINITY};
  const int64_t wanti[9] = {2, -2, 0, 0, 999999984306749440LL, INT64_MIN, INT64_MIN, INT64_MIN, INT64_MIN};
  int64_t yi[9];
  k_cast_f32_i64(xf, yi, 9);
  for (int i = 0; i < 9; i++) CHECK(yi[i] == wanti[i], "k_cast_f32_i64(%.9g) = %lld, want %lld\n", xf[i], (long long)yi[i], (long long)wanti[i]);
  const int32_t x32[4] = {-7, 0, INT32_MAX, INT32_MIN};
  const float want32[4] = {-7.0f, 0.0f, 2147483648.0f, -2147483648.0f};
  k_cast_i32_f32(x32, yf, 4);
  for (int i = 0; i < 4; i++) CHECK(yf[i] == want32[i], "k_cast_i32_f32(%d) = %.9g, want %.9g\n", x32[i], yf[i], want32[i]);
  const uint8_t xb[3] = {0, 1, 0};
  k_cast_bool_f32(xb, yf, 3);
  CHECK(yf[0] == 0 && yf[1] == 1 && yf[2] == 0, "k_cast_bool_f32([0, 1, 0]) = [%g, %g, %g]\n", yf[0], yf[1], yf[2]);
  /* Halves by their bits; the values are numpy's np.float16 -> np.float32. */
  const uint16_t xh[10] = {0x3c00, 0xc000, 0x0001, 0x03ff, 0x7bff, 0x3555, 0x7c00, 0xfc00, 0x8000, 0x7e00};
  const float wanth[10] = {1.0f, -2.0f, 0x1p-24f, 1023 * 0x1p-24f, 65504.0f, 0.333251953125f, INFINITY, -INFINITY, -0.0f, NAN};
  float yh[10];
  k_cast_f16_f32(xh, yh, 10);
  for (int i = 0; i < 10; i++)
    CHECK(isnan(wanth[i]) ? isnan(yh[i]) : yh[i] == wanth[i] && signbit(yh[i]) == signbit(wanth[i]),
          "k_cast_f16_f32(0x%04x) = %.9g, want %.9g\n", xh[i], yh[i], wanth[i]);
  OK_IF_NONE_FAILED(f0, "k_cast_*: int64, int32, bool, float16 -> float32 (rounding, subnormal halves, infinities, NaN); "
                        "float32 -> int64 (truncation toward zero, NaN and out of range)\n");
}

/* ---- k_unary / k_unary_grad: Neg, Exp, Log, Abs, Reciprocal, Clip, HardSigmoid, HardSwish ---- */
/* ONNX's definitions in double (HardSwish: x max(0, min(1, x/6 + 1/2))). */
static double un_ref(int op, double x, double a, double b) {
  switch (op) {
  case UN_NEG: return -x;
  case UN_EXP: return exp(x);
  case UN_LOG: return log(x);
  case UN_ABS: return fabs(x);
  case UN_RECIPROCAL: return 1 / x;
  case UN_CLIP: return fmin(fmax(x, a), b);
  case UN_HARDSIGMOID: return fmax(0, fmin(1, a * x + b));
  default: return x * fmax(0, fmin(1, x / 6 + 0.5));
  }
}
/* The derivative away from the kinks (where the kernels follow PyTorch, checked apart). */
static double un_dref(int op, double x, double a, double b) {
  switch (op) {
  case UN_NEG: return -1;
  case UN_EXP: return exp(x);
  case UN_LOG: return 1 / x;
  case UN_ABS: return x > 0 ? 1 : -1;
  case UN_RECIPROCAL: return -1 / (x * x);
  case UN_CLIP: return x > a && x < b ? 1 : 0;
  case UN_HARDSIGMOID: return a * x + b > 0 && a * x + b < 1 ? a : 0;
  default: return x < -3 ? 0 : x > 3 ? 1 : x / 3 + 0.5;
  }
}
/* Distance to the nearest kink of op, for finite differences (inf: smooth). */
static double un_kink(int op, double x, double a, double b) {
  switch (op) {
  case UN_ABS: return fabs(x);
  case UN_CLIP: return fmin(fabs(x - a), fabs(x - b));
  case UN_HARDSIGMOID: return fmin(fabs(x + b / a), fabs(x - (1 - b) / a));
  case UN_HARDSWISH: return fmin(fabs(x + 3), fabs(x - 3));
  default: return INFINITY;
  }
}
static int same_class(double got, double ref) { /* both NaN, or the same infinity, or both finite */
  if (isnan(ref) || isnan(got)) return isnan(ref) && isnan(got);
  if (isinf(ref) || isinf(got)) return got == ref;
  return 1;
}

static void test_unary(int op, const char *name, float a, float b) {
  int f0 = failed;
  float *y = malloc(sizeof(float) * NX), *dy = malloc(sizeof(float) * NX), *dx = malloc(sizeof(float) * NX),
        *dx2 = malloc(sizeof(float) * NX), *base = malloc(sizeof(float) * NX);
  for (int i = 0; i < nx; i++) dy[i] = (float)(2 * urand() - 1), base[i] = (float)(4 * urand() - 2);
  k_unary(op, xs, y, nx, a, b);
  k_unary_grad(op, xs, y, dy, dx, nx, a, b, 0);
  double worst_y = 0, worst_d = 0;
  for (int i = 0; i < nx; i++) {
    double x = xs[i], ref = un_ref(op, x, a, b), reff = (float)ref; /* reff: what float can hold (exp(100) = inf) */
    if (!isfinite(reff)) {
      CHECK(same_class(y[i], reff), "%s x=%.9g: got %.9g, want %.9g\n", name, x, y[i], reff);
      continue;
    }
    /* a few roundings of float (HardSigmoid's a x + b is rounded before the clamp) */
    double scale = fabs(ref) + (op == UN_HARDSIGMOID ? fabs(a * x) + fabs(b) : 0);
    double tol = 4 * FLT_EPSILON * scale + FLT_TRUE_MIN, e = fabs(y[i] - ref);
    if (scale >= FLT_MIN && e / scale > worst_y) worst_y = e / scale; /* normal floats (a subnormal result has fewer bits) */
    CHECK(e <= tol, "%s x=%.9g: got %.9g, double %.17g\n", name, x, y[i], ref);
    if (un_kink(op, x, a, b) < 1e-4 * (1 + fabs(x))) continue;
    double dref = dy[i] * un_dref(op, x, a, b), ed = fabs(dx[i] - dref);
    if (!isfinite((float)dref)) continue; /* 1/x^2 of a tiny x: beyond float's range, inf or NaN (inf * 0) in float */
    /* HardSwish's x/3 + 1/2 cancels near x = -1.5: its rounding is relative to the terms */
    double dscale = op == UN_HARDSWISH ? fabs(dy[i]) * (fabs(x) / 3 + 0.5) : fabs(dref) + fabs(dy[i]) * FLT_EPSILON;
    if (ed / dscale > worst_d) worst_d = ed / dscale;
    CHECK(ed <= 8 * FLT_EPSILON * dscale + FLT_TRUE_MIN, "%s_grad x=%.9g dy=%.6g: got %.9g, double %.17g\n", name, x, dy[i], dx[i], dref);
    if (fabs(x) <= 8 && (op != UN_LOG && op != UN_RECIPROCAL ? 1 : fabs(x) > 0.05)) { /* the reference derivative itself */
      double h = 1e-6 * (1 + fabs(x)), fd = (un_ref(op, x + h, a, b) - un_ref(op, x - h, a, b)) / (2 * h);
      CHECK(fabs(fd - un_dref(op, x, a, b)) <= 1e-6 * (1 + fabs(fd)), "%s x=%.9g: derivative %.12g, finite differences %.12g\n", name, x,
            un_dref(op, x, a, b), fd);
    }
  }
  memcpy(dx2, base, sizeof(float) * NX);
  k_unary_grad(op, xs, y, dy, dx2, nx, a, b, 1);
  int same = 1;
  for (int i = 0; i < nx; i++) same &= dx2[i] == base[i] + dx[i] || (isnan(dx[i]) && isnan(dx2[i]));
  CHECK(same, "%s_grad acc=1 is not base + the acc=0 gradient\n", name);
  OK_IF_NONE_FAILED(f0, "%s on %d inputs: forward within %.2g of double, gradient within %.2g away from kinks; acc=1 adds\n", name, nx,
                    worst_y, worst_d);
  free(y), free(dy), free(dx), free(dx2), free(base);
}

/* Values at the kinks and on NaN, as torch 1.13 gives them (gradient of ones):
 *   clamp([-0.5, 0.4, nextafter below -0.5, above 0.4, nan], -0.5, 0.4): gradient [1, 1, 0, 0, 0], nan -> nan
 *   clamp(x, 0.5, -0.5) = -0.5 everywhere (max wins), gradient 0
 *   hardswish at [-3, 3, nan]: gradient [-0.5, 1.5, 1]; hardsigmoid (alpha 1/6, beta 1/2) at [-3, 3]: 0, nan -> nan, gradient 0
 *   abs at [0, -0, nan]: gradient [0, 0, 0]; maximum/minimum: a tie gives each side 0.5, a NaN gives both 1 */
static void test_unary_kinks(void) {
  int f0 = failed;
  const float one[5] = {1, 1, 1, 1, 1};
  float y[5], g[5];
  const float cx[5] = {-0.5f, 0.4f, nextafterf(-0.5f, -1), nextafterf(0.4f, 1), NAN};
  k_unary(UN_CLIP, cx, y, 5, -0.5f, 0.4f);
  CHECK(y[0] == -0.5f && y[1] == 0.4f && y[2] == -0.5f && y[3] == 0.4f && isnan(y[4]), "clip at its bounds: %g %g %g %g %g\n", y[0], y[1],
        y[2], y[3], y[4]);
  k_unary_grad(UN_CLIP, cx, NULL, one, g, 5, -0.5f, 0.4f, 0);
  CHECK(g[0] == 1 && g[1] == 1 && g[2] == 0 && g[3] == 0 && g[4] == 0, "clip_grad at [lo, hi, below, above, nan] = [%g %g %g %g %g], torch: "
        "[1 1 0 0 0]\n", g[0], g[1], g[2], g[3], g[4]);
  k_unary(UN_CLIP, cx, y, 4, 0.5f, -0.5f);
  k_unary_grad(UN_CLIP, cx, NULL, one, g, 4, 0.5f, -0.5f, 0);
  CHECK(y[0] == -0.5f && y[1] == -0.5f && y[2] == -0.5f && y[3] == -0.5f && g[0] == 0 && g[1] == 0 && g[3] == 0,
        "clip with min > max: %g %g %g %g (gradient %g %g), torch: max everywhere, gradient 0\n", y[0], y[1], y[2], y[3], g[0], g[1]);
  const float inf[2] = {-INFINITY, INFINITY};
  k_unary(UN_CLIP, inf, y, 2, -INFINITY, INFINITY);
  CHECK(y[0] == -INFINITY && y[1] == INFINITY, "clip with open bounds changes infinities: %g %g\n", y[0], y[1]);
  const float hx[3] = {-3, 3, NAN};
  k_unary(UN_HARDSWISH, hx, y, 3, 0, 0);
  k_unary_grad(UN_HARDSWISH, hx, NULL, one, g, 3, 0, 0, 0);
  CHECK(y[0] == 0 && y[1] == 3 && isnan(y[2]) && g[0] == -0.5f && g[1] == 1.5f && g[2] == 1,
        "hardswish at [-3, 3, nan] = [%g %g %g], gradient [%g %g %g]; torch: [0 3 nan], [-0.5 1.5 1]\n", y[0], y[1], y[2], g[0], g[1], g[2]);
  k_unary(UN_HARDSIGMOID, hx, y, 3, 0.5f, 0.5f);
  k_unary_grad(UN_HARDSIGMOID, hx, NULL, one, g, 3, 0.25f, 0.75f, 0); /* v = 0 at -3, 1.5 at 3 */
  CHECK(y[0] == 0 && y[1] == 1 && isnan(y[2]) && g[0] == 0 && g[1] == 0 && g[2] == 0,
        "hardsigmoid at [-3, 3, nan] = [%g %g %g], gradient at the kinks and nan [%g %g %g], want [0 1 nan], [0 0 0]\n", y[0], y[1], y[2],
        g[0], g[1], g[2]);
  const float ax[3] = {0.0f, -0.0f, NAN};
  k_unary_grad(UN_ABS, ax, NULL, one, g, 3, 0, 0, 0);
  CHECK(g[0] == 0 && g[1] == 0 && g[2] == 0, "abs_grad at [0, -0, nan] = [%g %g %g], torch: [0 0 0]\n", g[0], g[1], g[2]);
  OK_IF_NONE_FAILED(f0, "clip, hardswish, hardsigmoid, abs at their kinks, out of order bounds and NaN: PyTorch's values and gradients\n");
}

/* ---- Max / Min through k_binary: broadcasting, ties, NaN ---- */
static void test_maxmin(int op) {
  int f0 = failed;
  const char *name = op == BIN_MAX ? "max" : "min";
  /* a [2,3,4] against b [3,1]: values on a coarse grid, so ties are frequent */
  BcastShape s = {.rank = 3, .out = {2, 3, 4}, .sa = {12, 4, 1}, .sb = {0, 1, 0}, .na = 24, .nb = 3, .ny = 24};
  float a[24], b[3], y[24], dy[24], da[24], db[3], da2[24];
  for (int i = 0; i < 24; i++) a[i] = (float)((int)(urand() * 5) - 2) * 0.5f, dy[i] = (float)(2 * urand() - 1);
  b[0] = 0.5f, b[1] = -0.5f, b[2] = NAN, a[5] = NAN;
  k_binary(op, a, b, y, &s);
  k_binary_grad(op, 0, a, b, dy, da, &s, 0);
  k_binary_grad(op, 1, a, b, dy, db, &s, 0);
  double rda[24] = {0}, rdb[3] = {0};
  int ties = 0;
  for (int i = 0; i < 24; i++) {
    int r = i / 4 % 3;
    double u = a[i], v = b[r], want = isnan(u) || isnan(v) ? NAN : op == BIN_MAX ? fmax(u, v) : fmin(u, v);
    CHECK(same_class(y[i], want) && (isnan(want) || y[i] == want), "%s(%g, %g) = %g, want %g\n", name, u, v, y[i], want);
    /* torch: where(a == b, dy / 2, dy), zeroed on the losing side; a NaN loses nowhere */
    double ga = u == v ? dy[i] / 2.0 : (op == BIN_MAX ? u < v : u > v) ? 0 : dy[i];
    double gb = u == v ? dy[i] / 2.0 : (op == BIN_MAX ? v < u : v > u) ? 0 : dy[i];
    ties += u == v;
    rda[i] += ga, rdb[r] += gb;
  }
  int ok = 1;
  for (int i = 0; i < 24; i++) ok &= da[i] == (float)rda[i];
  CHECK(ok, "%s_grad of a differs from torch's rule\n", name);
  for (int r = 0; r < 3; r++) CHECK(fabs(db[r] - rdb[r]) <= 1e-6 * (1 + fabs(rdb[r])), "%s_grad of b[%d] = %.9g, want %.9g\n", name, r, db[r], rdb[r]);
  CHECK(ties > 0, "%s: the test made no ties\n", name);
  for (int i = 0; i < 24; i++) da2[i] = 1.0f;
  k_binary_grad(op, 0, a, b, dy, da2, &s, 1);
  ok = 1;
  for (int i = 0; i < 24; i++) ok &= da2[i] == 1.0f + da[i];
  CHECK(ok, "%s_grad acc=1 does not add\n", name);
  OK_IF_NONE_FAILED(f0, "%s with broadcasting: values, NaN wins, gradient of both inputs as torch (%d ties split in halves, NaN passes to both), "
                        "acc=1 adds\n", name, ties);
}

/* ---- Equal / Less / Greater (broadcast, NaN compares false) and Not ---- */
static void test_compare(void) {
  int f0 = failed;
  BcastShape s = {.rank = 2, .out = {3, 4}, .sa = {4, 1}, .sb = {0, 1}, .na = 12, .nb = 4, .ny = 12};
  const float a[12] = {0, 1, 2, 3, -1, 1, NAN, 3, 2, 2, 2, 2}, b[4] = {0, 1.5f, 2, NAN};
  uint8_t y[12], z[12];
  for (int op = CMP_EQUAL; op <= CMP_GREATER; op++) {
    k_compare(op, a, b, y, &s);
    int ok = 1;
    for (int i = 0; i < 12; i++) {
      double u = a[i], v = b[i % 4];
      ok &= y[i] == (op == CMP_EQUAL ? u == v : op == CMP_LESS ? u < v : u > v);
    }
    CHECK(ok, "k_compare op %d differs from the double comparison\n", op);
    k_not(y, z, 12);
    ok = 1;
    for (int i = 0; i < 12; i++) ok &= z[i] == !y[i];
    CHECK(ok, "k_not is not the negation\n");
  }
  OK_IF_NONE_FAILED(f0, "equal, less, greater with broadcasting (NaN compares false) and not\n");
}

/* ---- ReduceMax and its gradient (torch.amax: ties share dy equally; a NaN max: NaN for the slice) ---- */
static void test_reduce_max(int mask) {
  int f0 = failed;
  ReduceShape s = {.rank = 3, .in = {3, 4, 5}, .mask = mask, .n = 60, .scale = 1};
  s.nout = 1;
  for (int d = 0; d < 3; d++) if (!(mask >> d & 1)) s.nout *= s.in[d];
  float x[60], y[60], dy[60], dx[60], dx2[60], cnt[60];
  for (int i = 0; i < 60; i++) x[i] = (float)((int)(urand() * 4)) * 0.25f, dy[i] = (float)(2 * urand() - 1);
  if (mask != 7) x[17] = NAN; /* over all axes a NaN would leave no slice to split ties in */
  k_reduce_max(x, y, &s);
  k_reduce_max_grad(x, y, dy, dx, cnt, &s, 0);
  double m[60], c[60];
  int nan_slice[60] = {0};
  for (int o = 0; o < s.nout; o++) m[o] = -INFINITY, c[o] = 0;
  for (int i = 0; i < 60; i++) {
    int o = (int)reduce_at(&s, i);
    if (isnan(x[i])) nan_slice[o] = 1;
    else if (x[i] > m[o]) m[o] = x[i];
  }
  for (int i = 0; i < 60; i++) c[reduce_at(&s, i)] += x[i] == m[reduce_at(&s, i)];
  int ok = 1, ties = 0;
  for (int o = 0; o < s.nout; o++) {
    ok &= nan_slice[o] ? isnan(y[o]) : y[o] == m[o];
    ties += !nan_slice[o] && c[o] > 1;
  }
  CHECK(ok, "reduce_max (mask %d) differs from the max in double\n", mask);
  ok = 1;
  for (int i = 0; i < 60; i++) {
    int o = (int)reduce_at(&s, i);
    double want = nan_slice[o] ? NAN : x[i] == m[o] ? dy[o] / c[o] : 0;
    ok &= isnan(want) ? isnan(dx[i]) : fabs(dx[i] - want) <= FLT_EPSILON * fabs(want);
  }
  CHECK(ok, "reduce_max_grad (mask %d) differs from torch.amax's gradient\n", mask);
  CHECK(ties > 0, "reduce_max (mask %d): the test made no ties\n", mask);
  for (int i = 0; i < 60; i++) dx2[i] = 2.0f;
  k_reduce_max_grad(x, y, dy, dx2, cnt, &s, 1);
  ok = 1;
  for (int i = 0; i < 60; i++) ok &= dx2[i] == 2.0f + dx[i] || (isnan(dx[i]) && isnan(dx2[i]));
  CHECK(ok, "reduce_max_grad acc=1 does not add\n");
  OK_IF_NONE_FAILED(f0, "reduce_max over axes mask %d of [3,4,5]: max, NaN wins, gradient split over %d tied slices, NaN slice NaN, acc=1 adds\n",
                    mask, ties);
}

/* ---- ArgMax: first (or last) index of the max, a NaN counting as the max ---- */
/* ---- Gather: wrap and bounds (the runtime's pr_bad_index, fail.c, stops the run; this one jumps back) ---- */
RandCtx pr_rand = {1, 0, 0};
static jmp_buf bad_jmp;
static struct {
  int calls;
  const char *node, *what;
  int64_t at, index, rows, step, mb;
} bad;
void pr_bad_index(const char *node, const char *what, int64_t at, int64_t index, int64_t rows, const RandCtx *when) {
  bad.calls++, bad.node = node, bad.what = what, bad.at = at, bad.index = index, bad.rows = rows, bad.step = when->step, bad.mb = when->mb;
  longjmp(bad_jmp, 1);
}
static void test_gather(void) {
  enum { ROWS = 5, W = 3, N = 6, GUARD = 4 };
  int since = failed;
  /* The table is followed by guard rows: a read past it would show in y, a write in the guards. */
  float table[(ROWS + GUARD) * W], y[N * W], dy[N * W], dt[(ROWS + GUARD) * W], want[(ROWS + GUARD) * W];
  for (int i = 0; i < (ROWS + GUARD) * W; i++) table[i] = (float)(i + 1), dt[i] = want[i] = i < ROWS * W ? 0 : -1;
  for (int i = 0; i < N * W; i++) dy[i] = (float)(100 + i);
  const int64_t good[N] = {0, 4, -1, -5, 2, 4}; /* -1 is row 4, -5 row 0 */
  k_gather(table, good, y, N, ROWS, W, "g");
  int same = 1;
  for (int i = 0; i < N; i++)
    for (int k = 0; k < W; k++) same &= y[i * W + k] == table[(good[i] < 0 ? good[i] + ROWS : good[i]) * W + k];
  CHECK(same, "k_gather: negative indices count from the end (-1 is the last row, -rows the first)\n");
  k_gather_grad(good, dy, dt, N, ROWS, W, "g");
  for (int i = 0; i < N; i++)
    for (int k = 0; k < W; k++) want[(good[i] < 0 ? good[i] + ROWS : good[i]) * W + k] += dy[i * W + k];
  CHECK(!memcmp(dt, want, sizeof dt), "k_gather_grad: negative indices add into the rows they name, repeated ones twice\n");
  const int64_t cases[][N] = {{0, 1, 2, 5, 0, 0}, {0, -6, 1, 1, 1, 1}, {0, 1, 2, 3, 4, INT64_MIN}, {1000000, 0, 0, 0, 0, 0}};
  const int64_t at[] = {3, 1, 5, 0};
  for (int c = 0; c < 4; c++)
    for (int grad = 0; grad < 2; grad++) {
      memset(&bad, 0, sizeof bad);
      memcpy(dt, want, sizeof dt);
      pr_rand.step = 3 + c, pr_rand.mb = grad;
      if (!setjmp(bad_jmp)) {
        if (grad) k_gather_grad(cases[c], dy, dt, N, ROWS, W, "/emb/Gather");
        else k_gather(table, cases[c], y, N, ROWS, W, "/emb/Gather");
      }
      int guards = 1;
      for (int i = ROWS * W; i < (ROWS + GUARD) * W; i++) guards &= dt[i] == -1;
      CHECK(bad.calls == 1 && !strcmp(bad.node, "/emb/Gather") && !strcmp(bad.what, grad ? "Gather's gradient" : "Gather") &&
                bad.at == at[c] && bad.index == cases[c][at[c]] && bad.rows == ROWS && bad.step == 3 + c && bad.mb == grad && guards,
            "%s: index %lld at position %lld of a table of %d rows stops it (pr_bad_index: %d calls, node %s, position %lld, "
            "step %lld), nothing written past the table\n",
            grad ? "k_gather_grad" : "k_gather", (long long)cases[c][at[c]], (long long)at[c], ROWS, bad.calls, bad.node ? bad.node : "-",
            (long long)bad.at, (long long)bad.step);
    }
  pr_rand.step = pr_rand.mb = 0;
  OK_IF_NONE_FAILED(since, "k_gather / k_gather_grad: negative indices wrap; an index out of range (forward and gradient) stops the run "
                           "naming node, position, step and micro-batch, nothing past the table touched\n");
}

static void test_argmax(void) {
  int f0 = failed;
  enum { NO = 3, NA = 7, NI = 4 };
  float x[NO * NA * NI];
  int64_t y[NO * NI];
  for (int i = 0; i < NO * NA * NI; i++) x[i] = (float)((int)(urand() * 3));
  x[(1 * NA + 2) * NI + 3] = NAN, x[(1 * NA + 5) * NI + 3] = NAN;
  for (int last = 0; last < 2; last++) {
    k_argmax(x, y, NO, NA, NI, last);
    int ok = 1;
    for (int o = 0; o < NO; o++)
      for (int k = 0; k < NI; k++) {
        double m = -INFINITY;
        int has_nan = 0;
        for (int j = 0; j < NA; j++) {
          double v = x[(o * NA + j) * NI + k];
          if (isnan(v)) has_nan = 1;
          else m = fmax(m, v);
        }
        int64_t want = -1;
        for (int j = 0; j < NA; j++) {
          double v = x[(o * NA + j) * NI + k];
          if (has_nan ? isnan(v) : v == m) want = last || want < 0 ? j : want;
        }
        ok &= y[o * NI + k] == want;
      }
    CHECK(ok, "argmax (select_last_index=%d) differs from the reference\n", last);
  }
  OK_IF_NONE_FAILED(f0, "argmax along the middle axis of [3,7,4]: ties to the first or the last index, NaN counts as the max\n");
}

/* ---- LSTM / GRU: the ONNX equations in double, step by step ---- */
typedef struct RnnCase { int gru, lbr, layout, h0, bias, dir; } RnnCase; /* dir: 0 forward, 1 reverse, 2 bidirectional */
enum { RT = 3, RB = 2, RI = 3, RH = 2, RG = 4, RD = 2 }; /* steps, batch, input, hidden, most gates, most directions */

static double sigm(double v) { return 1 / (1 + exp(-v)); }

/* One direction's step at time t for batch entry bb: h (and LSTM's c) [RH] updated in place. */
static void rnn_ref_step(const RnnCase *c, const double *xr, const double *w, const double *r, const double *b, double *h, double *cs) {
  int G = c->gru ? 3 : 4;
  double gx[RG * RH], gh[RG * RH], hn[RH]; /* X's and h's part of each gate, biases included */
  for (int k = 0; k < G * RH; k++) {
    gx[k] = c->bias ? b[k] : 0, gh[k] = c->bias ? b[G * RH + k] : 0;
    for (int i = 0; i < RI; i++) gx[k] += xr[i] * w[k * RI + i];
    for (int i = 0; i < RH; i++) gh[k] += h[i] * r[k * RH + i];
  }
  double rg[RH]; /* GRU's reset gate, all of it: (r * h) Rh^T mixes units */
  for (int j = 0; j < RH && c->gru; j++) rg[j] = sigm(gx[RH + j] + gh[RH + j]);
  for (int j = 0; j < RH; j++) {
    if (!c->gru) {
      double ig = sigm(gx[j] + gh[j]), og = sigm(gx[RH + j] + gh[RH + j]), fg = sigm(gx[2 * RH + j] + gh[2 * RH + j]);
      cs[j] = fg * cs[j] + ig * tanh(gx[3 * RH + j] + gh[3 * RH + j]);
      hn[j] = og * tanh(cs[j]);
      continue;
    }
    double z = sigm(gx[j] + gh[j]), pre = gx[2 * RH + j];
    if (c->lbr) pre += rg[j] * gh[2 * RH + j];
    else { /* (r * h) Rh^T + Rbh */
      pre += c->bias ? b[G * RH + 2 * RH + j] : 0;
      for (int i = 0; i < RH; i++) pre += rg[i] * h[i] * r[(2 * RH + j) * RH + i];
    }
    hn[j] = (1 - z) * tanh(pre) + z * h[j];
  }
  memcpy(h, hn, sizeof hn);
}

/* Y ([T,D,B,H] or [B,T,D,H]), Y_h and Y_c ([D,B,H] or [B,D,H]); states from h0 / c0 (or zeros). */
static void rnn_ref(const RnnCase *c, const double *x, const double *w, const double *r, const double *b, const double *h0,
                    const double *c0, double *y, double *yh, double *yc) {
  int G = c->gru ? 3 : 4, D = c->dir == 2 ? 2 : 1;
  for (int d = 0; d < D; d++) {
    int rev = D == 2 ? d : c->dir == 1;
    const double *wd = w + d * G * RH * RI, *rd = r + d * G * RH * RH, *bd = b + d * 2 * G * RH;
    for (int bb = 0; bb < RB; bb++) {
      int so = c->layout ? (bb * D + d) * RH : (d * RB + bb) * RH;
      double h[RH], cs[RH];
      for (int j = 0; j < RH; j++) h[j] = c->h0 ? h0[so + j] : 0, cs[j] = c->h0 && !c->gru ? c0[so + j] : 0;
      for (int k = 0; k < RT; k++) {
        int t = rev ? RT - 1 - k : k, row = c->layout ? bb * RT + t : t * RB + bb;
        rnn_ref_step(c, x + row * RI, wd, rd, bd, h, cs);
        memcpy(y + (c->layout ? (row * D + d) * RH : ((t * D + d) * RB + bb) * RH), h, sizeof h);
      }
      memcpy(yh + so, h, sizeof h);
      memcpy(yc + so, cs, sizeof cs);
    }
  }
}

/* The loss the gradient test differentiates: <gy, Y> + <gh, Y_h> + <gc, Y_c>. */
static double rnn_loss(const RnnCase *c, double *const in[6], const double *gy, const double *gh, const double *gc) {
  int D = c->dir == 2 ? 2 : 1;
  double y[RT * RB * RH * RD], yh[RB * RH * RD], yc[RB * RH * RD], l = 0;
  rnn_ref(c, in[0], in[1], in[2], in[3], in[4], in[5], y, yh, yc);
  for (int i = 0; i < RT * RB * RH * D; i++) l += gy[i] * y[i];
  for (int i = 0; i < RB * RH * D; i++) l += gh[i] * yh[i] + (c->gru ? 0 : gc[i] * yc[i]);
  return l;
}

/* Forward against rnn_ref; every gradient (dX, dW, dR, dB) against central
 * differences of rnn_ref's loss; dW, dR, dB add to what they held, dX too with acc = 1. */
static void test_rnn(const RnnCase *c) {
  int G = c->gru ? 3 : 4, since = failed, D = c->dir == 2 ? 2 : 1, ny = RT * RB * RH * D, ns = RB * RH * D;
  int sizes[6] = {RT * RB * RI, D * G * RH * RI, D * G * RH * RH, D * 2 * G * RH, ns, ns};
  float fin[6][RT * RB * RI + 2 * RG * RH * RI];
  double din[6][RT * RB * RI + 2 * RG * RH * RI], *dp[6];
  for (int k = 0; k < 6; k++) {
    dp[k] = din[k];
    for (int i = 0; i < sizes[k]; i++) fin[k][i] = (float)(urand() * 2 - 1), din[k][i] = fin[k][i];
  }
  double gy[RT * RB * RH * RD], gh[RB * RH * RD], gc[RB * RH * RD];
  float fgy[RT * RB * RH * RD], fgh[RB * RH * RD], fgc[RB * RH * RD];
  for (int i = 0; i < ny; i++) fgy[i] = (float)(urand() - 0.5), gy[i] = fgy[i];
  for (int i = 0; i < ns; i++) fgh[i] = (float)(urand() - 0.5), gh[i] = fgh[i], fgc[i] = (float)(urand() - 0.5), gc[i] = fgc[i];
  RnnShape s = {RT, RB, RI, RH, c->layout, c->lbr, D, c->dir == 1};
  const float *b = c->bias ? fin[3] : NULL, *h0 = c->h0 ? fin[4] : NULL, *c0 = c->h0 ? fin[5] : NULL;
  static float work[4096];
  float y[RT * RB * RH * RD], yh[RB * RH * RD], yc[RB * RH * RD];
  double ry[RT * RB * RH * RD], ryh[RB * RH * RD], ryc[RB * RH * RD];
  if (c->gru) k_gru(fin[0], fin[1], fin[2], b, h0, y, yh, work, &s);
  else k_lstm(fin[0], fin[1], fin[2], b, h0, c0, y, yh, yc, work, &s);
  rnn_ref(c, dp[0], dp[1], dp[2], dp[3], dp[4], dp[5], ry, ryh, ryc);
  const char *name = c->gru ? (c->lbr ? "gru(linear_before_reset)" : "gru") : "lstm";
  const char *dirs[3] = {"forward", "reverse", "bidirectional"};
  for (int i = 0; i < ny; i++) CHECK(fabs(y[i] - ry[i]) <= 1e-6, "%s layout %d: Y[%d] %.9g, double %.12g\n", name, c->layout, i, y[i], ry[i]);
  for (int i = 0; i < ns; i++) {
    CHECK(fabs(yh[i] - ryh[i]) <= 1e-6, "%s layout %d: Y_h[%d] %.9g, double %.12g\n", name, c->layout, i, yh[i], ryh[i]);
    CHECK(c->gru || fabs(yc[i] - ryc[i]) <= 1e-6, "%s layout %d: Y_c[%d] %.9g, double %.12g\n", name, c->layout, i, yc[i], ryc[i]);
  }
  /* Gradients start from 0.25 (dX with acc = 1, the weights always add). */
  float grad[6][RT * RB * RI + 2 * RG * RH * RI];
  for (int k = 0; k < 6; k++)
    for (int i = 0; i < sizes[k]; i++) grad[k][i] = 0.25f;
  float *db = c->bias ? grad[3] : NULL, *dh0 = c->h0 ? grad[4] : NULL, *dc0 = c->h0 ? grad[5] : NULL;
  if (c->gru) k_gru_grad(fin[0], fin[1], fin[2], b, h0, fgy, fgh, grad[0], grad[1], grad[2], db, dh0, work, &s, 1);
  else k_lstm_grad(fin[0], fin[1], fin[2], b, h0, c0, fgy, fgh, fgc, grad[0], grad[1], grad[2], db, dh0, dc0, work, &s, 1);
  const char *what[6] = {"dX", "dW", "dR", "dB", "dinitial_h", "dinitial_c"};
  for (int k = 0; k < 6; k++)
    for (int i = 0; i < sizes[k]; i++) {
      if ((k == 3 && !c->bias) || (k >= 4 && !c->h0) || (k == 5 && c->gru)) break;
      double keep = din[k][i], e = 1e-6;
      din[k][i] = keep + e;
      double lp = rnn_loss(c, dp, gy, gh, gc);
      din[k][i] = keep - e;
      double fd = (lp - rnn_loss(c, dp, gy, gh, gc)) / (2 * e);
      din[k][i] = keep;
      CHECK(fabs(grad[k][i] - 0.25 - fd) <= 2e-5 * (1 + fabs(fd)), "%s layout %d h0 %d: %s[%d] - 0.25 = %.9g, finite differences %.9g\n",
            name, c->layout, c->h0, what[k], i, grad[k][i] - 0.25, fd);
    }
  /* acc = 0 overwrites dX; a NULL dY (only Y_h read) is a zero gradient. */
  float dx0[RT * RB * RI], zy[RT * RB * RH * RD] = {0};
  for (int i = 0; i < RT * RB * RI; i++) dx0[i] = 7;
  float dx1[RT * RB * RI];
  if (c->gru) {
    k_gru_grad(fin[0], fin[1], fin[2], b, h0, NULL, fgh, dx0, NULL, NULL, NULL, NULL, work, &s, 0);
    k_gru_grad(fin[0], fin[1], fin[2], b, h0, zy, fgh, dx1, NULL, NULL, NULL, NULL, work, &s, 0);
  } else {
    k_lstm_grad(fin[0], fin[1], fin[2], b, h0, c0, NULL, fgh, NULL, dx0, NULL, NULL, NULL, NULL, NULL, work, &s, 0);
    k_lstm_grad(fin[0], fin[1], fin[2], b, h0, c0, zy, fgh, NULL, dx1, NULL, NULL, NULL, NULL, NULL, work, &s, 0);
  }
  CHECK(!memcmp(dx0, dx1, sizeof dx0), "%s layout %d: dY = NULL differs from dY = 0 (or acc = 0 kept dX)\n", name, c->layout);
  OK_IF_NONE_FAILED(since, "%s %s layout %d, %s initial state, %s bias: forward vs double, dX/dW/dR/dB/dinitial_h/dinitial_c vs finite "
                    "differences, acc\n", name, dirs[c->dir], c->layout, c->h0 ? "given" : "zero", c->bias ? "with" : "no");
}

/* ---- Conv and pooling, 1-D to 3-D ----
 * The references visit every (output element, window offset) pair directly,
 * in double: no im2col, no GEMM, nothing shared with the kernels but the
 * ONNX definition of a window (input index = out * stride - pad + k * dilation). */
typedef struct WinCase {
  const char *what;
  int n, c, m, group, in[3], k[3], s[3], p[3], dl[3], out[3];
  int e[3]; /* end pads: only the pools' count_include_pad reads them */
} WinCase;

/* Window element kk of output o in the padded input: inside its end pad (count_include_pad counts it)? */
static int win_padded(const WinCase *t, const int *o, const int *kk) {
  for (int a = 0; a < 3; a++)
    if (o[a] * t->s[a] + kk[a] * t->dl[a] >= t->p[a] + t->in[a] + t->e[a]) return 0;
  return 1;
}

/* The input offset (within one channel plane) of output o's window element kk, or -1 in the padding. */
static int64_t win_at(const WinCase *t, const int *o, const int *kk) {
  int64_t at = 0;
  for (int a = 0; a < 3; a++) {
    int i = o[a] * t->s[a] - t->p[a] + kk[a] * t->dl[a];
    if (i < 0 || i >= t->in[a]) return -1;
    at = at * t->in[a] + i;
  }
  return at;
}

static int64_t prod3(const int *v) { return (int64_t)v[0] * v[1] * v[2]; }
/* Unflattens i over the three extents in v (last fastest). */
static void unflat3(int64_t i, const int *v, int *out) {
  out[2] = (int)(i % v[2]), out[1] = (int)(i / v[2] % v[1]), out[0] = (int)(i / v[2] / v[1]);
}

static ConvShape conv_shape(const WinCase *t) {
  return (ConvShape){t->n, t->c, t->in[0], t->in[1], t->in[2], t->m, t->k[0], t->k[1], t->k[2], t->group, t->out[0], t->out[1],
                     t->out[2], t->s[0], t->s[1], t->s[2], t->p[0], t->p[1], t->p[2], t->dl[0], t->dl[1], t->dl[2], 0, 0};
}

/* The largest error relative to the largest reference value: sums of float
 * products may cancel to near 0, where an element-wise relative error means nothing. */
static double max_rel(const float *got, const double *want, int64_t n) {
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
  for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(got[i] - want[i]));
  return worst / scale;
}

static void test_conv(const WinCase *t) {
  int f0 = failed, cg = t->c / t->group, mg = t->m / t->group;
  int64_t isp = prod3(t->in), osp = prod3(t->out), ksz = prod3(t->k);
  int64_t nx = t->n * t->c * isp, nw = t->m * cg * ksz, ny = t->n * t->m * osp;
  float *x = malloc(4 * nx), *w = malloc(4 * nw), *b = malloc(4 * t->m), *y = malloc(4 * ny), *dy = malloc(4 * ny);
  float *dx = malloc(4 * nx), *dw = malloc(4 * nw), *db = malloc(4 * t->m), *col = malloc(4 * cg * ksz * osp);
  double *ry = calloc(ny, 8), *rdx = calloc(nx, 8), *rdw = calloc(nw, 8), *rdb = calloc(t->m, 8);
  for (int64_t i = 0; i < nx; i++) x[i] = (float)(2 * urand() - 1);
  for (int64_t i = 0; i < nw; i++) w[i] = (float)(2 * urand() - 1);
  for (int i = 0; i < t->m; i++) b[i] = (float)(2 * urand() - 1);
  for (int64_t i = 0; i < ny; i++) dy[i] = (float)(2 * urand() - 1);
  for (int n = 0; n < t->n; n++)
    for (int mo = 0; mo < t->m; mo++)
      for (int64_t oi = 0; oi < osp; oi++) {
        int64_t yi = ((int64_t)n * t->m + mo) * osp + oi;
        ry[yi] = b[mo], rdb[mo] += dy[yi];
        for (int ci = 0; ci < cg; ci++)
          for (int64_t ki = 0; ki < ksz; ki++) {
            int o[3], kk[3];
            unflat3(oi, t->out, o), unflat3(ki, t->k, kk);
            int64_t at = win_at(t, o, kk), wi = ((int64_t)mo * cg + ci) * ksz + ki;
            if (at < 0) continue;
            int64_t xi = ((int64_t)n * t->c + mo / mg * cg + ci) * isp + at;
            ry[yi] += (double)w[wi] * x[xi], rdx[xi] += (double)w[wi] * dy[yi], rdw[wi] += (double)x[xi] * dy[yi];
          }
      }
  ConvShape s = conv_shape(t);
  k_conv(x, w, b, y, col, &s);
  double ey = max_rel(y, ry, ny);
  CHECK(ey < 1e-5, "%s: conv forward off by %.2e\n", t->what, ey);
  k_conv_grad(x, w, dy, dx, dw, db, col, &s, 0, 0);
  double ex = max_rel(dx, rdx, nx), ew = max_rel(dw, rdw, nw), eb = max_rel(db, rdb, t->m);
  CHECK(ex < 1e-5 && ew < 1e-5 && eb < 1e-5, "%s: conv gradients off by dx %.2e dw %.2e db %.2e\n", t->what, ex, ew, eb);
  /* acc = 1 adds the same gradients again. */
  k_conv_grad(x, w, dy, dx, dw, db, col, &s, 1, 1);
  for (int64_t i = 0; i < nx; i++) rdx[i] *= 2;
  for (int64_t i = 0; i < nw; i++) rdw[i] *= 2;
  for (int i = 0; i < t->m; i++) rdb[i] *= 2;
  ex = max_rel(dx, rdx, nx), ew = max_rel(dw, rdw, nw), eb = max_rel(db, rdb, t->m);
  CHECK(ex < 1e-5 && ew < 1e-5 && eb < 1e-5, "%s: conv gradients with acc = 1 off by dx %.2e dw %.2e db %.2e\n", t->what, ex, ew, eb);
  OK_IF_NONE_FAILED(f0, "%s: conv forward, dx, dw, db and acc = 1 match the direct double loop (max rel %.1e)\n", t->what, ey);
  free(x), free(w), free(b), free(y), free(dy), free(dx), free(dw), free(db), free(col), free(ry), free(rdx), free(rdw), free(rdb);
}

static void test_pool(const WinCase *t, int count_include_pad) {
  int f0 = failed;
  int64_t isp = prod3(t->in), osp = prod3(t->out), ksz = prod3(t->k), nx = t->n * t->c * isp, ny = t->n * t->c * osp;
  float *x = malloc(4 * nx), *y = malloc(4 * ny), *dy = malloc(4 * ny), *dx = malloc(4 * nx);
  double *rmax = malloc(8 * ny), *ravg = malloc(8 * ny), *rdmax = calloc(nx, 8), *rdavg = calloc(nx, 8);
  for (int64_t i = 0; i < nx; i++) x[i] = (float)(2 * urand() - 1);
  for (int64_t i = 0; i < ny; i++) dy[i] = (float)(2 * urand() - 1);
  for (int64_t nc = 0; nc < (int64_t)t->n * t->c; nc++)
    for (int64_t oi = 0; oi < osp; oi++) {
      double best = -INFINITY, sum = 0;
      int64_t arg = -1, cnt = 0, cnt_pad = 0;
      for (int pass = 0; pass < 2; pass++) /* pass 1 spreads the average's gradient once cnt is known */
        for (int64_t ki = 0; ki < ksz; ki++) {
          int o[3], kk[3];
          unflat3(oi, t->out, o), unflat3(ki, t->k, kk);
          int64_t at = win_at(t, o, kk);
          if (!pass) cnt_pad += win_padded(t, o, kk);
          if (at < 0) continue;
          if (pass) {
            rdavg[nc * isp + at] += dy[nc * osp + oi] / (double)(count_include_pad ? cnt_pad : cnt);
            continue;
          }
          if (x[nc * isp + at] > best) best = x[nc * isp + at], arg = nc * isp + at;
          sum += x[nc * isp + at], cnt++;
        }
      rmax[nc * osp + oi] = best, ravg[nc * osp + oi] = sum / (double)(count_include_pad ? cnt_pad : cnt);
      rdmax[arg] += dy[nc * osp + oi];
    }
  PoolShape s = {t->n, t->c, t->in[0], t->in[1], t->in[2], t->out[0], t->out[1], t->out[2], t->k[0], t->k[1], t->k[2],
                 t->s[0], t->s[1], t->s[2], t->p[0], t->p[1], t->p[2], t->dl[0], t->dl[1], t->dl[2], t->e[0], t->e[1], t->e[2],
                 count_include_pad};
  k_maxpool(x, y, &s);
  double e1 = max_rel(y, rmax, ny);
  k_maxpool_grad(x, dy, dx, &s, 0);
  double e2 = max_rel(dx, rdmax, nx);
  CHECK(e1 == 0 && e2 < 1e-6, "%s: maxpool off by %.2e, its gradient by %.2e\n", t->what, e1, e2);
  int dil1 = t->dl[0] == 1 && t->dl[1] == 1 && t->dl[2] == 1; /* AveragePool has no dilations before opset 19 */
  if (dil1) {
    k_avgpool(x, y, &s);
    e1 = max_rel(y, ravg, ny);
    k_avgpool_grad(dy, dx, &s, 0);
    k_avgpool_grad(dy, dx, &s, 1);
    for (int64_t i = 0; i < nx; i++) rdavg[i] *= 2;
    e2 = max_rel(dx, rdavg, nx);
    CHECK(e1 < 1e-6 && e2 < 1e-6, "%s: avgpool (count_include_pad=%d) off by %.2e, twice its gradient (acc = 1) by %.2e\n", t->what,
          count_include_pad, e1, e2);
  }
  OK_IF_NONE_FAILED(f0, "%s: maxpool%s: values and gradients match the direct double loop\n", t->what,
                    dil1 ? (count_include_pad ? ", avgpool (count_include_pad=1)" : ", avgpool") : "");
  free(x), free(y), free(dy), free(dx), free(rmax), free(ravg), free(rdmax), free(rdavg);
}

/* The vector libm the stage programs use (kernels.h, PR_MVEC): erf and exp eight at a time, against
 * the double-precision functions over the whole float range (every 97th bit pattern, NaNs apart), within
 * libmvec's documented 4 ulp; the infinities and NaN map as erff and expf map them. */
#if defined(PR_MVEC) && defined(__AVX2__)
pr_v8sf_a _ZGVdN8v_expf(pr_v8sf_a);
static double ulp_err(float got, double want) {
  float w = (float)want;
  if (isnan(want)) return isnan(got) ? 0 : 1e9;
  if (isinf(w)) return got == w ? 0 : 1e9;
  double u = nextafterf(fabsf(w), INFINITY) - fabsf(w);
  if (isinf(u)) u = fabsf(w) - nextafterf(fabsf(w), 0);
  return fabs((double)got - want) / u;
}
static void test_mvec(int which) {
  const char *name = which ? "exp" : "erf";
  double worst = 0;
  float worst_x = 0;
  int64_t count = 0;
  for (uint64_t bits = 0; bits < (1ull << 32); bits += 97 * 8) {
    float x[8], y[8];
    for (int k = 0; k < 8; k++) {
      uint32_t b = (uint32_t)(bits + 97u * (uint32_t)k);
      memcpy(&x[k], &b, 4);
      if (isnan(x[k])) x[k] = 0;
    }
    if (which) *(pr_v8sf *)y = _ZGVdN8v_expf(*(const pr_v8sf *)x);
    else k_erf(x, y, 8);
    for (int k = 0; k < 8; k++, count++) {
      double e = ulp_err(y[k], which ? exp((double)x[k]) : erf((double)x[k]));
      if (e > worst) worst = e, worst_x = x[k];
    }
  }
  float sp[3] = {INFINITY, -INFINITY, NAN}, got[8] = {0}, in[8] = {0};
  memcpy(in, sp, sizeof sp);
  if (which) *(pr_v8sf *)got = _ZGVdN8v_expf(*(const pr_v8sf *)in);
  else k_erf(in, got, 8);
  int special = which ? got[0] == INFINITY && got[1] == 0 && isnan(got[2]) : got[0] == 1 && got[1] == -1 && isnan(got[2]);
  CHECK(special, "vector %s of inf, -inf, NaN as libm's", name);
  CHECK(worst <= 4, "vector %s over %lld floats of the whole range: worst %.2f ulp at %a (bound 4)", name, (long long)count, worst, worst_x);
  if (worst <= 4 && special) printf("ok - vector %s (libmvec) within %.2f ulp of the exact value over %lld floats of the whole range\n", name, worst, (long long)count);
}
#endif

/* k_transpose / k_transpose_grad on random permutations of random shapes (ranks 1..6, sizes 1..70,
 * so that both the row copy and the 32x32 tiles with partial edges run) against the element-wise
 * definition: y[i] = x[at(i)] exactly, and dx[at(i)] = dy[i], or += with acc. */
static int64_t perm_ref_at(const PermShape *s, int64_t i) {
  int64_t off = 0;
  for (int d = s->rank - 1; d >= 0; d--) off += (i % s->out[d]) * s->st[d], i /= s->out[d];
  return off;
}
static void test_transpose(void) {
  int f0 = failed, cases = 0;
  while (cases < 400) {
    int r = 1 + (int)(urand() * 6);
    int64_t dims[8], perm[8], xs8[8], n = 1;
    for (int i = 0; i < r; i++) dims[i] = 1 + (int64_t)(urand() * (urand() < 0.7 ? 5 : 70)), n *= dims[i], perm[i] = i;
    if (n > 100000) continue;
    for (int i = r - 1; i > 0; i--) {
      int j = (int)(urand() * (i + 1));
      int64_t t = perm[i];
      perm[i] = perm[j], perm[j] = t;
    }
    int64_t st = 1;
    for (int i = r - 1; i >= 0; i--) xs8[i] = st, st *= dims[i];
    PermShape s = {.rank = r, .n = n};
    for (int i = 0; i < r; i++) s.out[i] = dims[perm[i]], s.st[i] = xs8[perm[i]];
    float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n);
    float *d1 = malloc(sizeof(float) * (size_t)n), *d2 = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) x[i] = (float)urand(), d1[i] = d2[i] = (float)i;
    k_transpose(x, y, &s);
    int64_t bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++)
      if (y[i] != x[perm_ref_at(&s, i)]) bad = i;
    int acc = cases & 1;
    k_transpose_grad(x, d1, &s, acc);
    for (int64_t i = 0; i < n; i++) d2[perm_ref_at(&s, i)] = acc ? d2[perm_ref_at(&s, i)] + x[i] : x[i];
    CHECK(bad < 0, "transpose case %d (rank %d, %lld elements): y[%lld] is not x at its permuted offset", cases, r, (long long)n,
          (long long)bad);
    CHECK(!memcmp(d1, d2, sizeof(float) * (size_t)n), "transpose case %d (rank %d): the gradient (acc %d) differs from the definition",
          cases, r, acc);
    free(x), free(y), free(d1), free(d2);
    cases++;
  }
  OK_IF_NONE_FAILED(f0, "k_transpose and k_transpose_grad (acc 0 and 1) on 400 random permutations match the definition\n");
}

/* k_where / k_where_grad on random shapes (ranks 0..5) where c, x and y each broadcast along random
 * axes, against the element-wise definition: out[i] = c[at(i)] ? x[at(i)] : y[at(i)], and each
 * operand's gradient summed over the output in order (acc 0 and 1), bit for bit. */
static int64_t where_ref_at(const WhereShape *s, const int64_t *st, int64_t i) {
  int64_t off = 0;
  for (int d = s->rank - 1; d >= 0; d--) off += (i % s->out[d]) * st[d], i /= s->out[d];
  return off;
}
static void where_strides(const WhereShape *s, int64_t *st, int64_t *n) {
  int keep[8];
  for (int d = 0; d < s->rank; d++) keep[d] = urand() < 0.6;
  *n = 1;
  for (int d = s->rank - 1; d >= 0; d--) {
    st[d] = keep[d] && s->out[d] > 1 ? *n : 0;
    if (st[d]) *n *= s->out[d];
  }
}
static void test_where(void) {
  int f0 = failed;
  for (int it = 0; it < 300; it++) {
    WhereShape s = {.rank = (int)(urand() * 6)};
    s.nout = 1;
    for (int d = 0; d < s.rank; d++) s.out[d] = 1 + (int64_t)(urand() * 7), s.nout *= s.out[d];
    int64_t nc;
    where_strides(&s, s.sc, &nc), where_strides(&s, s.sx, &s.nx), where_strides(&s, s.sy, &s.ny);
    uint8_t *c = malloc((size_t)nc);
    float *x = malloc(sizeof(float) * (size_t)s.nx), *y = malloc(sizeof(float) * (size_t)s.ny);
    float *o = malloc(sizeof(float) * (size_t)s.nout), *g = malloc(sizeof(float) * (size_t)s.nout);
    for (int64_t i = 0; i < nc; i++) c[i] = urand() < 0.5;
    for (int64_t i = 0; i < s.nx; i++) x[i] = (float)urand();
    for (int64_t i = 0; i < s.ny; i++) y[i] = (float)urand() + 2;
    for (int64_t i = 0; i < s.nout; i++) g[i] = (float)urand();
    k_where(c, x, y, o, &s);
    int64_t bad = -1;
    for (int64_t i = 0; i < s.nout && bad < 0; i++)
      if (o[i] != (c[where_ref_at(&s, s.sc, i)] ? x[where_ref_at(&s, s.sx, i)] : y[where_ref_at(&s, s.sy, i)])) bad = i;
    CHECK(bad < 0, "where case %d (rank %d): out[%lld] is not the element the definition picks", it, s.rank, (long long)bad);
    for (int which = 1; which <= 2; which++) {
      int64_t n = which == 1 ? s.nx : s.ny;
      const int64_t *st = which == 1 ? s.sx : s.sy;
      float *d1 = malloc(sizeof(float) * (size_t)n), *d2 = malloc(sizeof(float) * (size_t)n);
      int acc = it & 1;
      for (int64_t i = 0; i < n; i++) d1[i] = d2[i] = acc ? (float)i : 0.0f;
      k_where_grad(c, g, d1, which, &s, acc);
      for (int64_t i = 0; i < s.nout; i++)
        if ((c[where_ref_at(&s, s.sc, i)] != 0) == (which == 1)) d2[where_ref_at(&s, st, i)] += g[i];
      CHECK(!memcmp(d1, d2, sizeof(float) * (size_t)n), "where case %d (rank %d): the gradient of %s (acc %d) differs from the definition",
            it, s.rank, which == 1 ? "x" : "y", acc);
      free(d1), free(d2);
    }
    free(c), free(x), free(y), free(o), free(g);
  }
  OK_IF_NONE_FAILED(f0, "k_where and k_where_grad (both operands, acc 0 and 1) on 300 random broadcasts match the definition\n");
}

/* ---- --threads: every kernel that splits (par.h) gives the same bits on 1 thread and on 3 ----
 * Run once before pr_par_init (one thread) and once after it; the shapes are odd sizes large enough to
 * split.  test_par_split checks that pr_par_for really splits, so that the comparison can fail. */
enum { TN = 100003, TR = 301, TC = 257 };
typedef struct ThreadOut {
  float ew[24][TN];
  float rows[8][TR * TC];
  float ln_w[4][TC];
  float perm[4][4 * 6 * 33 * 17];
  float take[2][8 * 5 * 900];
  float bin[8][37 * 29 * 61];
  float bin_b[2][61];
} ThreadOut;

static void fill(float *x, int64_t n, double lo, double hi) {
  for (int64_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * urand());
}

static void thread_kernels(ThreadOut *o) {
  static float x[TN], y[TN], dy[TN], a[TR * TC], g[TR * TC], sc[TC], bi[TC], b61[61], b37[37 * 61];
  rng_state = 12345;
  fill(x, TN, -6, 6), fill(y, TN, 0.01, 0.99), fill(dy, TN, -1, 1);
  fill(a, TR * TC, -3, 3), fill(g, TR * TC, -1, 1), fill(sc, TC, 0.5, 1.5), fill(bi, TC, -1, 1);
  fill(b61, 61, 0.5, 2), fill(b37, 37 * 61, 0.5, 2);
  int e = 0;
  k_relu(x, o->ew[e++], TN);
  memcpy(o->ew[e], dy, sizeof dy), k_relu_grad(x, dy, o->ew[e++], TN, 1);
  k_tanh(x, o->ew[e++], TN);
  k_tanh_grad(y, dy, o->ew[e++], TN, 0);
  k_sigmoid(x, o->ew[e++], TN);
  k_sigmoid_grad(y, dy, o->ew[e++], TN, 0);
  k_erf(x, o->ew[e++], TN);
  k_erf_grad(x, dy, o->ew[e++], TN, 0);
  k_sqrt(y, o->ew[e++], TN);
  k_sqrt_grad(y, dy, o->ew[e++], TN, 0);
  k_gelu(x, o->ew[e++], TN, 0);
  k_gelu(x, o->ew[e++], TN, 1);
  k_gelu_grad(x, dy, o->ew[e++], TN, 0, 0);
  memcpy(o->ew[e], y, sizeof y), k_gelu_grad(x, dy, o->ew[e++], TN, 1, 1);
  k_leakyrelu(x, o->ew[e++], TN, 0.1f);
  k_leakyrelu_grad(x, dy, o->ew[e++], TN, 0.1f, 0);
  k_unary(UN_EXP, x, o->ew[e++], TN, 0, 0);
  k_unary(UN_CLIP, x, o->ew[e++], TN, -0.5f, 0.4f);
  k_unary(UN_HARDSWISH, x, o->ew[e++], TN, 0, 0);
  k_unary_grad(UN_LOG, y, NULL, dy, o->ew[e++], TN, 0, 0, 0);
  k_unary_grad(UN_HARDSIGMOID, x, NULL, dy, o->ew[e++], TN, 0.2f, 0.5f, 0);
  memcpy(o->ew[e], x, sizeof x), k_copy_grad(dy, o->ew[e++], TN, 1);
  int r = 0;
  k_softmax(a, o->rows[r++], TR, TC, 0);
  k_softmax(a, o->rows[r++], TR, TC, 1);
  k_softmax_grad(o->rows[0], g, o->rows[r++], TR, TC, 0, 0);
  memcpy(o->rows[r], a, sizeof a), k_softmax_grad(o->rows[1], g, o->rows[r++], TR, TC, 1, 1);
  k_layernorm(a, sc, bi, o->rows[r++], TR, TC, 1e-5f);
  k_layernorm_grad(a, sc, g, o->rows[r++], o->ln_w[0], o->ln_w[1], TR, TC, 1e-5f, 0);
  memcpy(o->rows[r], g, sizeof g), memcpy(o->ln_w[2], sc, sizeof sc), memcpy(o->ln_w[3], bi, sizeof bi);
  k_layernorm_grad(a, sc, g, o->rows[r++], o->ln_w[2], o->ln_w[3], TR, TC, 1e-5f, 1);
  /* attention's K^T: [4,6,33,17] -> [4,6,17,33]; and [4,6,33,17] -> [33,4,17,6] */
  PermShape p1 = {4, {4, 6, 17, 33}, {6 * 33 * 17, 33 * 17, 1, 17}, 4 * 6 * 33 * 17};
  PermShape p2 = {4, {33, 4, 17, 6}, {17, 6 * 33 * 17, 1, 33 * 17}, 4 * 6 * 33 * 17};
  k_transpose(a, o->perm[0], &p1);
  k_transpose(a, o->perm[1], &p2);
  memcpy(o->perm[2], g, sizeof o->perm[2]), k_transpose_grad(a, o->perm[2], &p1, 1);
  k_transpose_grad(a, o->perm[3], &p2, 0);
  /* a slice [8, 5 of 11, 900] and its gradient */
  k_take(x, o->take[0], 8, 11, 900, 3, 5);
  memcpy(o->take[1], x, sizeof o->take[1]), k_take_grad(o->take[0], o->take[1], 8, 5, 900, 1, 2);
  /* binary: same shapes (one row), a bias over rows, [37,1,61] over the middle axis */
  BcastShape same = {.rank = 3, .out = {37, 29, 61}, .sa = {29 * 61, 61, 1}, .sb = {29 * 61, 61, 1}, .na = 37 * 29 * 61, .nb = 37 * 29 * 61, .ny = 37 * 29 * 61};
  BcastShape bias = same, mid = same;
  bias.sb[0] = bias.sb[1] = 0, bias.nb = 61;
  mid.sb[0] = 61, mid.sb[1] = 0, mid.nb = 37 * 61;
  int k = 0;
  k_binary(BIN_ADD, x, y, o->bin[k++], &same);
  k_binary(BIN_DIV, x, b61, o->bin[k++], &bias);
  k_binary(BIN_MUL, x, b37, o->bin[k++], &mid);
  k_binary(BIN_POW, y, b61, o->bin[k++], &bias);
  k_binary_grad(BIN_MUL, 0, x, y, dy, o->bin[k++], &same, 0);
  memcpy(o->bin[k], y, sizeof o->bin[k]), k_binary_grad(BIN_DIV, 0, x, b61, dy, o->bin[k++], &bias, 1);
  k_binary_grad(BIN_DIV, 1, x, b61, dy, o->bin_b[0], &bias, 0); /* summed over rows: one thread */
  k_binary_grad(BIN_SUB, 1, x, b61, dy, o->bin_b[1], &bias, 0);
}

static int parts_seen[64];
static void count_part(const void *arg, int64_t lo, int64_t hi) {
  (void)arg;
  parts_seen[lo / 1000 % 64] = (int)(hi - lo);
}

/* pr_sgemm's shapes for the thread check: {M, N, K, ldc}.  Rows cut (320, 250, 500, 1000: whole blocks
 * and a rest), short and wide C (64 x 640, 8 x 5000, 100 x 1000, 191 x 192: one thread), and a C inside
 * a wider matrix. */
enum { GEMM_SHAPES = 9, GEMM_A = 5000 * 1100, GEMM_C = 1100 * 500 };
static const int gemm_shapes[GEMM_SHAPES][4] = {{320, 96, 512, 96},   {64, 640, 256, 640},   {8, 5000, 64, 5000},
                                                {100, 1000, 300, 1000}, {250, 300, 200, 300}, {191, 192, 64, 192},
                                                {96, 400, 300, 1100},   {500, 1000, 1100, 1000}, {1000, 130, 100, 130}};
static float gemm_one[GEMM_SHAPES][8][GEMM_C];

/* The rows and columns held to the double reference: the edges of the first blocks and of the rest,
 * and every 37th (all of them would take half a minute under the sanitizers). */
static int gemm_sampled(int i, int n) { return i % 37 == 0 || i == 95 || i == 96 || i == n - 1 || i == n / 96 * 96; }

/* Shape c under transposition/beta case t (ta = bit 0, tb = bit 1, beta = bit 2), from fixed inputs;
 * checked against a double reference once (the first call for c, t). */
static float *gemm_run(int c, int t) {
  static float a[GEMM_A], b[GEMM_A], out[GEMM_C], c0[GEMM_C];
  static int filled, checked[GEMM_SHAPES][8];
  if (!filled) rng_state = 777, fill(a, GEMM_A, -1, 1), fill(b, GEMM_A, -1, 1), fill(c0, GEMM_C, -1, 1), filled = 1;
  int M = gemm_shapes[c][0], N = gemm_shapes[c][1], K = gemm_shapes[c][2], ldc = gemm_shapes[c][3], ta = t & 1, tb = t >> 1 & 1;
  float beta = (float)(t >> 2);
  int lda = ta ? M : K, ldb = tb ? K : N;
  memcpy(out, c0, sizeof out);
  pr_sgemm(ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, 0.5f, a, lda, b, ldb, beta, out, ldc);
  if (!checked[c][t]) {
    double worst = 0;
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) {
        if (!gemm_sampled(i, M) || !gemm_sampled(j, N)) continue;
        double s = 0, mag = 0;
        for (int k = 0; k < K; k++) {
          double p = (double)(ta ? a[k * lda + i] : a[i * lda + k]) * (tb ? b[j * ldb + k] : b[k * ldb + j]);
          s += p, mag += fabs(p);
        }
        double want = 0.5 * s + beta * c0[i * ldc + j], err = fabs(out[i * ldc + j] - want) / (0.5 * mag + fabs(beta * c0[i * ldc + j]) + 1e-30);
        if (err > worst) worst = err;
      }
    for (int i = 0; i < M; i++) /* the columns past N, when C is inside a wider matrix, untouched */
      for (int j = N; j < ldc; j++)
        if (memcmp(&out[i * ldc + j], &c0[i * ldc + j], sizeof(float))) worst = 1;
    CHECK(worst < 1e-6, "pr_sgemm %dx%dx%d ldc %d ta=%d tb=%d beta=%g: %.3g from the double reference\n", M, N, K, ldc, ta, tb, (double)beta, worst);
    checked[c][t] = 1;
  }
  return out;
}

static void test_threads(void) {
  static ThreadOut one, three;
  thread_kernels(&one);
  for (int c = 0; c < GEMM_SHAPES; c++)
    for (int t = 0; t < 8; t++) memcpy(gemm_one[c][t], gemm_run(c, t), sizeof(float) * GEMM_C);
  CHECK(pr_par_init(3, 3) == 0, "pr_par_init(3) failed\n");
  /* splitting at all: three parts of whole grains, the last to the end */
  memset(parts_seen, 0, sizeof parts_seen);
  pr_par_for(3000, 1000, 1e9, count_part, NULL);
  CHECK(parts_seen[0] == 1000 && parts_seen[1] == 1000 && parts_seen[2] == 1000, "pr_par_for(3000, grain 1000) on 3 threads: parts %d %d %d\n",
        parts_seen[0], parts_seen[1], parts_seen[2]);
  memset(parts_seen, 0, sizeof parts_seen);
  pr_par_for(2500, 1000, 1e9, count_part, NULL);
  CHECK(parts_seen[0] == 1000 && parts_seen[1] == 1000 && parts_seen[2] == 500, "pr_par_for(2500, grain 1000): parts %d %d %d\n", parts_seen[0],
        parts_seen[1], parts_seen[2]);
  memset(parts_seen, 0, sizeof parts_seen);
  pr_par_for(3000, 1000, 10, count_part, NULL);
  CHECK(parts_seen[0] == 3000, "pr_par_for below PR_PAR_MIN_WORK did not run serially (%d)\n", parts_seen[0]);
  thread_kernels(&three);
  /* gemm.c's bands on 3 threads against pr_sgemm on one (gemm_one, before pr_par_init), and against a
   * double reference: C's rows cut, short C, odd remainders, a C inside a wider matrix (ldc > N), each
   * transposition, beta 0 and 1 */
  for (int c = 0; c < GEMM_SHAPES; c++)
    for (int t = 0; t < 8; t++) {
      float *got = gemm_run(c, t);
      CHECK(!memcmp(gemm_one[c][t], got, sizeof(float) * GEMM_C), "pr_sgemm %dx%dx%d ldc %d ta=%d tb=%d beta=%d: 3 threads differ from 1 (%s)\n",
            gemm_shapes[c][0], gemm_shapes[c][1], gemm_shapes[c][2], gemm_shapes[c][3], t & 1, t >> 1 & 1, t >> 2, getenv("OPENBLAS_CORETYPE") ?: "default kernels");
    }
  const char *what[] = {"elementwise", "rows", "layernorm weights", "transpose", "take", "binary", "binary summed"};
  size_t off[] = {offsetof(ThreadOut, ew), offsetof(ThreadOut, rows), offsetof(ThreadOut, ln_w), offsetof(ThreadOut, perm),
                  offsetof(ThreadOut, take), offsetof(ThreadOut, bin), offsetof(ThreadOut, bin_b), sizeof(ThreadOut)};
  for (int i = 0; i < 7; i++)
    CHECK(!memcmp((char *)&one + off[i], (char *)&three + off[i], off[i + 1] - off[i]), "%s kernels: 3 threads differ from 1\n", what[i]);
  pr_par_stop();
}

/* --kernel-sets: the OpenBLAS kernel sets this CPU can run (blas_core.h), one a line, for tests/run.sh;
 * --threads-only: just the thread checks (run.sh runs them under each set). */
int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--kernel-sets")) {
    const char *sets[] = {"SkylakeX", "Haswell", "Zen", "Sandybridge", "Nehalem", "Prescott"};
    for (size_t i = 0; i < sizeof sets / sizeof *sets; i++)
      if (blas_core_runs_here(sets[i]) == 1) puts(sets[i]);
    return 0;
  }
  make_inputs();
  test_threads();
  if (argc > 1 && !strcmp(argv[1], "--threads-only")) {
    const char *want = getenv("OPENBLAS_CORETYPE"), *got = openblas_get_corename();
    CHECK(!want || !*want || !strcasecmp(want, got), "OPENBLAS_CORETYPE=%s, but OpenBLAS runs its %s kernels\n", want, got);
    printf("ok - OpenBLAS's kernel set: %s\n", got);
    return check_finish();
  }
  test_where();
  test_transpose();
#if defined(PR_MVEC) && defined(__AVX2__)
  test_mvec(0);
  test_mvec(1);
#endif
  test_nan();
  test_gelu(0);
  test_gelu(1);
  test_leakyrelu(0.01f);
  test_leakyrelu(0.2f);
  const int64_t l2[] = {3, 5}, l6[] = {1, 2, 3, 4, 5, 6}, l16[] = {2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2};
  const int64_t l3[] = {7, 1, 4};
  test_put(4, 1, 2, l2);   /* [B, C] concat on axis 1 */
  test_put(4, 1, 6, l6);
  test_put(4, 1, 16, l16);
  test_put(1, 5, 3, l3);   /* axis 0 */
  test_put(3, 7, 6, l6);   /* a middle axis */
  test_philox();
  test_dropout(0.0f);
  test_dropout(0.3f);
  test_dropout(0.5f);
  test_dropout(1.0f);
  const ViewCase views[] = {
      {"Slice x[1:4, ::2, 5:0:-2]", 0, {3, 3, 3}, {1, 0, 5}, {1, 2, -2}},
      {"Slice x[::-1, 4:1:-3, 1:]", 0, {4, 1, 5}, {3, 4, 1}, {-1, -3, 1}},
      {"Slice x[:, 1::2, :] (a run of whole rows)", 0, {4, 2, 6}, {0, 1, 0}, {1, 2, 1}},
      {"Expand [4,1,6] -> [4,3,6]", 1, {4, 3, 6}, {0}, {0}},
      {"Tile [4,5,6] by [2,1,3]", 2, {8, 5, 18}, {0}, {0}},
  };
  for (size_t i = 0; i < sizeof views / sizeof views[0]; i++) test_view(&views[i]);
  test_cast();
  test_unary(UN_NEG, "neg", 0, 0);
  test_unary(UN_EXP, "exp", 0, 0);
  test_unary(UN_LOG, "log", 0, 0);
  test_unary(UN_ABS, "abs", 0, 0);
  test_unary(UN_RECIPROCAL, "reciprocal", 0, 0);
  test_unary(UN_CLIP, "clip[-0.5,0.4]", -0.5f, 0.4f);
  test_unary(UN_CLIP, "clip[-inf,1]", -INFINITY, 1.0f);
  test_unary(UN_HARDSIGMOID, "hardsigmoid(0.2,0.5)", 0.2f, 0.5f);
  test_unary(UN_HARDSIGMOID, "hardsigmoid(1/6,0.5)", 1.0f / 6, 0.5f);
  test_unary(UN_HARDSWISH, "hardswish", 0, 0);
  test_unary_kinks();
  test_maxmin(BIN_MAX);
  test_maxmin(BIN_MIN);
  test_compare();
  for (int mask = 1; mask < 8; mask++) test_reduce_max(mask);
  test_argmax();
  test_gather();
  const RnnCase rnns[] = {{0, 0, 0, 0, 1, 0}, {0, 0, 1, 1, 1, 0}, {0, 0, 0, 1, 0, 0}, {1, 1, 0, 0, 1, 0}, {1, 0, 0, 1, 1, 0},
                          {1, 0, 1, 0, 1, 0}, {1, 1, 1, 1, 0, 0}, {0, 0, 0, 1, 1, 2}, {0, 0, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 2},
                          {1, 0, 0, 0, 1, 1}, {1, 0, 1, 1, 0, 2}};
  for (size_t i = 0; i < sizeof rnns / sizeof rnns[0]; i++) test_rnn(&rnns[i]);
  /* what, n, c, m, group, in, kernel, strides, begin pads, dilations, out (= (in + pads - (k-1)*d - 1) / s + 1,
   * or rounded up: ceil_mode), end pads */
  const WinCase wins[] = {
      {"1-D k=3 s=2 pad=1", 2, 4, 6, 1, {1, 1, 11}, {1, 1, 3}, {1, 1, 2}, {0, 0, 1}, {1, 1, 1}, {1, 1, 6}, {0, 0, 1}},
      {"1-D k=3 d=2 group=2", 2, 4, 6, 2, {1, 1, 10}, {1, 1, 3}, {1, 1, 1}, {0, 0, 2}, {1, 1, 2}, {1, 1, 10}, {0, 0, 2}},
      {"2-D 3x2 s=[2,1] pads=[1,0]", 2, 3, 4, 1, {1, 7, 6}, {1, 3, 2}, {1, 2, 1}, {0, 1, 0}, {1, 1, 1}, {1, 4, 5}, {0, 1, 0}},
      {"3-D 3x3x3 s=[1,2,2] pad=1", 2, 2, 4, 1, {5, 6, 6}, {3, 3, 3}, {1, 2, 2}, {1, 1, 1}, {1, 1, 1}, {5, 3, 3}, {1, 1, 1}},
      {"3-D 2x3x2 group=2 d=[2,1,1] pads=[1,1,0]", 1, 4, 4, 2, {5, 5, 5}, {2, 3, 2}, {1, 1, 1}, {1, 1, 0}, {2, 1, 1}, {5, 5, 4}, {1, 1, 0}},
      {"3-D 2x2x3 s=2 (odd sizes)", 2, 3, 3, 3, {5, 4, 7}, {2, 2, 3}, {2, 2, 2}, {0, 1, 1}, {1, 1, 1}, {2, 2, 4}, {0, 1, 1}},
      /* ceil_mode: the last windows run past the end pads, which count_include_pad must not count */
      {"1-D k=3 s=2 pads=1 ceil_mode", 2, 2, 2, 1, {1, 1, 6}, {1, 1, 3}, {1, 1, 2}, {0, 0, 1}, {1, 1, 1}, {1, 1, 4}, {0, 0, 1}},
      {"3-D 2x3x2 s=2 pads=[1,0,1|0,1,0] ceil_mode", 1, 2, 2, 1, {4, 6, 5}, {2, 3, 2}, {2, 2, 2}, {1, 0, 1}, {1, 1, 1}, {3, 3, 3}, {0, 1, 0}},
  };
  for (size_t i = 0; i < sizeof wins / sizeof wins[0]; i++) {
    test_conv(&wins[i]);
    test_pool(&wins[i], 0);
    test_pool(&wins[i], 1);
  }
  return check_finish();
}
