/* test_kernels.c - the run-time kernels for Gelu, LeakyRelu, Concat, the
 * strided views (Slice, Expand, Tile) and Cast
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
 * Built under ASan + UBSan (make bin/test_kernels); ends with "N passed, M failed". */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

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
                     t->out[2], t->s[0], t->s[1], t->s[2], t->p[0], t->p[1], t->p[2], t->dl[0], t->dl[1], t->dl[2]};
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

int main(void) {
  make_inputs();
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
  printf("%d passed, %d failed\n", passed, failed);
  return failed != 0;
}
