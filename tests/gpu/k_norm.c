/* k_norm.c - the norm family's GPU kernels against the CPU's (cpu/norm.h): BatchNormalization (training
 * with the running statistics' update, the recomputation's NULL running statistics, eval, each with and
 * without the fused Relu) and its gradient (training and eval, Relu-masked, every NULL-able output, acc
 * 0 and 1), Softmax and LogSoftmax (a causal mask's -inf too) and their gradients, LayerNormalization
 * (with and without bias), its statistics (NULL outputs) and its gradient (NULL outputs, acc 0 and 1), on
 * rows 1, 3, 37 and more, columns 1, 7, 768, 1001, 50257. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/kernels.h"
#include "kcheck.h"
/* cpu/norm.h's BatchNorm sums in vectors of four doubles; this file is built without -march (the GPU
 * machine's CPU may be another), so clang notes that their calling convention there is not AVX's. */
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wpsabi"
#include "kernels.h"
#pragma clang diagnostic pop

/* ---- BatchNormalization ---- */

static const char *const BN_MODE[] = {"training", "recompute", "eval"};

static void check_bn_fwd(int64_t n, int64_t c, int64_t sp) {
  const int64_t total = n * c * sp;
  float *x = kc_rand(total, -2, 3), *gamma = kc_rand(c, 0.5f, 1.5f), *beta = kc_rand(c, -0.5f, 0.5f);
  float *rm0 = kc_rand(c, -0.5f, 0.5f), *rv0 = kc_rand(c, 0.5f, 1.5f);
  float *gx = kc_up(x, total), *gg = kc_up(gamma, c), *gb = kc_up(beta, c);
  for (int mode = 0; mode < 3; mode++)
    for (int relu = 0; relu < 2; relu++) {
      BnShape s = {.n = n, .c = c, .sp = sp, .eps = 1e-5f, .momentum = 0.9, .relu = relu, .training = mode < 2};
      float *rm = malloc((size_t)c * sizeof *rm), *rv = malloc((size_t)c * sizeof *rv), *y = kc_zeros(total);
      memcpy(rm, rm0, (size_t)c * sizeof *rm), memcpy(rv, rv0, (size_t)c * sizeof *rv);
      float *grm = kc_up(rm, c), *grv = kc_up(rv, c), *gy = kc_dev_zeros(total);
      const int stats = mode != 1;
      k_batchnorm(x, gamma, beta, stats ? rm : NULL, stats ? rv : NULL, y, &s);
      kc_batchnorm(gx, gg, gb, stats ? grm : NULL, stats ? grv : NULL, gy, &s);
      char w[128];
      snprintf(w, sizeof w, "[%lld,%lld,%lld] %s%s", (long long)n, (long long)c, (long long)sp, BN_MODE[mode], relu ? " relu" : "");
      kc_report("k_batchnorm", w, kc_err(gy, y, total));
      snprintf(w, sizeof w, "[%lld,%lld,%lld] %s running mean", (long long)n, (long long)c, (long long)sp, BN_MODE[mode]);
      kc_report("k_batchnorm", w, kc_err(grm, rm, c));
      snprintf(w, sizeof w, "[%lld,%lld,%lld] %s running var", (long long)n, (long long)c, (long long)sp, BN_MODE[mode]);
      kc_report("k_batchnorm", w, kc_err(grv, rv, c));
      kc_free(grm), kc_free(grv), kc_free(gy), free(rm), free(rv), free(y);
    }
  kc_free(gx), kc_free(gg), kc_free(gb), free(x), free(gamma), free(beta), free(rm0), free(rv0);
}

/* The gradient: which = 0 all of dx, dgamma, dbeta; 1 dx alone; 2 dgamma and dbeta alone; 3 dbeta alone. */
static void check_bn_grad(int64_t n, int64_t c, int64_t sp) {
  const int64_t total = n * c * sp;
  float *x = kc_rand(total, -2, 3), *gamma = kc_rand(c, 0.5f, 1.5f), *beta = kc_rand(c, -0.5f, 0.5f);
  float *rm = kc_rand(c, -0.5f, 0.5f), *rv = kc_rand(c, 0.5f, 1.5f), *dy = kc_rand(total, -1, 1);
  float *gx = kc_up(x, total), *gg = kc_up(gamma, c), *grm = kc_up(rm, c), *grv = kc_up(rv, c), *gdy = kc_up(dy, total);
  static const char *const WHICH[] = {"dx dgamma dbeta", "dx", "dgamma dbeta", "dbeta"};
  for (int training = 1; training >= 0; training--)
    for (int relu = 0; relu < 2; relu++) {
      BnShape s = {.n = n, .c = c, .sp = sp, .eps = 1e-5f, .momentum = 0.9, .relu = relu, .training = training};
      /* the fused Relu's output the gradient masks by: the forward's own, NULL running stats (no update) */
      float *y = NULL, *gyv = NULL;
      if (relu) {
        y = kc_zeros(total);
        k_batchnorm(x, gamma, beta, training ? NULL : rm, training ? NULL : rv, y, &s);
        gyv = kc_up(y, total);
      }
      for (int which = 0; which < 4; which++)
        for (int acc = 0; acc < 2; acc++) {
          if (which >= 2 && acc) continue; /* acc is dx's alone */
          int wdx = which <= 1, wdg = which == 0 || which == 2, wdb = which != 1;
          float *dx = kc_rand(total, -1, 1), *dg = kc_rand(c, -1, 1), *db = kc_rand(c, -1, 1);
          float *gdx = kc_up(dx, total), *gdg = kc_up(dg, c), *gdb = kc_up(db, c);
          k_batchnorm_grad(x, gamma, rm, rv, dy, y, wdx ? dx : NULL, wdg ? dg : NULL, wdb ? db : NULL, &s, acc);
          kc_batchnorm_grad(gx, gg, grm, grv, gdy, gyv, wdx ? gdx : NULL, wdg ? gdg : NULL, wdb ? gdb : NULL, &s, acc);
          char w[160];
          snprintf(w, sizeof w, "[%lld,%lld,%lld] %s%s %s acc=%d", (long long)n, (long long)c, (long long)sp, training ? "training" : "eval",
                   relu ? " relu" : "", WHICH[which], acc);
          char wx[200];
          if (wdx) snprintf(wx, sizeof wx, "%s: dx", w), kc_report("k_batchnorm_grad", wx, kc_err(gdx, dx, total));
          if (wdg) snprintf(wx, sizeof wx, "%s: dgamma", w), kc_report("k_batchnorm_grad", wx, kc_err(gdg, dg, c));
          if (wdb) snprintf(wx, sizeof wx, "%s: dbeta", w), kc_report("k_batchnorm_grad", wx, kc_err(gdb, db, c));
          /* the outputs not asked for are left alone */
          if (!wdx) snprintf(wx, sizeof wx, "%s: dx untouched", w), kc_report_exact("k_batchnorm_grad", wx, gdx, dx, total * 4);
          if (!wdg) snprintf(wx, sizeof wx, "%s: dgamma untouched", w), kc_report_exact("k_batchnorm_grad", wx, gdg, dg, c * 4);
          kc_free(gdx), kc_free(gdg), kc_free(gdb), free(dx), free(dg), free(db);
        }
      if (relu) kc_free(gyv), free(y);
    }
  kc_free(gx), kc_free(gg), kc_free(grm), kc_free(grv), kc_free(gdy);
  free(x), free(gamma), free(beta), free(rm), free(rv), free(dy);
}

/* ---- Softmax ---- */

/* kc_err of a result with infinities (log-softmax of a masked row): the same infinities on both sides,
 * then the error of the rest. */
static double err_inf(const float *dev, const float *cpu, int64_t n) {
  float *g = kc_zeros(n), *c = kc_zeros(n);
  kc_down(g, dev, n);
  for (int64_t i = 0; i < n; i++) {
    if (isinf(g[i]) || isinf(cpu[i])) {
      if (g[i] != cpu[i]) {
        free(g), free(c);
        return INFINITY;
      }
      g[i] = 0;
      c[i] = 0;
    } else {
      c[i] = cpu[i];
    }
  }
  float *d = kc_up(g, n);
  double e = kc_err(d, c, n);
  kc_free(d), free(g), free(c);
  return e;
}

/* causal: -inf above the diagonal of each row's position (row r % cols keeps columns <= r % cols). */
static void check_softmax(int64_t rows, int64_t cols, int causal) {
  const int64_t n = rows * cols;
  float *x = kc_rand(n, -5, 5);
  if (causal)
    for (int64_t r = 0; r < rows; r++)
      for (int64_t k = r % cols + 1; k < cols; k++) x[r * cols + k] = -INFINITY;
  float *gx = kc_up(x, n), *dy = kc_rand(n, -1, 1), *gdy = kc_up(dy, n);
  for (int log = 0; log < 2; log++) {
    char w[128];
    float *y = kc_zeros(n), *gy = kc_dev_zeros(n);
    k_softmax(x, y, rows, cols, log);
    kc_softmax(gx, gy, rows, cols, log);
    snprintf(w, sizeof w, "%lld x %lld%s%s", (long long)rows, (long long)cols, log ? " log" : "", causal ? " causal" : "");
    kc_report("k_softmax", w, causal && log ? err_inf(gy, y, n) : kc_err(gy, y, n));
    if (rows == 37 && cols == 1001) { /* in place */
      float *gxi = kc_up(x, n);
      kc_softmax(gxi, gxi, rows, cols, log);
      snprintf(w, sizeof w, "%lld x %lld%s in place", (long long)rows, (long long)cols, log ? " log" : "");
      kc_report("k_softmax", w, kc_err(gxi, y, n));
      kc_free(gxi);
    }
    /* the gradient reads the CPU's y, so that it is checked alone */
    float *gyc = kc_up(y, n);
    for (int acc = 0; acc < 2; acc++) {
      float *dx = kc_rand(n, -1, 1), *gdx = kc_up(dx, n);
      k_softmax_grad(y, dy, dx, rows, cols, log, acc);
      kc_softmax_grad(gyc, gdy, gdx, rows, cols, log, acc);
      snprintf(w, sizeof w, "%lld x %lld%s%s acc=%d", (long long)rows, (long long)cols, log ? " log" : "", causal ? " causal" : "", acc);
      kc_report("k_softmax_grad", w, kc_err(gdx, dx, n));
      kc_free(gdx), free(dx);
    }
    kc_free(gy), kc_free(gyc), free(y);
  }
  kc_free(gx), kc_free(gdy), free(x), free(dy);
}

/* ---- LayerNormalization ---- */

static void check_layernorm(int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  const float eps = 1e-5f;
  float *x = kc_rand(n, -2, 3), *scale = kc_rand(cols, 0.5f, 1.5f), *bias = kc_rand(cols, -0.5f, 0.5f), *dy = kc_rand(n, -1, 1);
  float *gx = kc_up(x, n), *gs = kc_up(scale, cols), *gb = kc_up(bias, cols), *gdy = kc_up(dy, n);
  char w[160];
  for (int hasb = 0; hasb < 2; hasb++) {
    float *y = kc_zeros(n), *gy = kc_dev_zeros(n);
    k_layernorm(x, scale, hasb ? bias : NULL, y, rows, cols, eps);
    kc_layernorm(gx, gs, hasb ? gb : NULL, gy, rows, cols, eps);
    snprintf(w, sizeof w, "%lld x %lld%s", (long long)rows, (long long)cols, hasb ? " bias" : " no bias");
    kc_report("k_layernorm", w, kc_err(gy, y, n));
    kc_free(gy), free(y);
  }
  for (int which = 0; which < 3; which++) { /* both, mean alone, inv alone */
    float *m = kc_rand(rows, -1, 1), *inv = kc_rand(rows, -1, 1), *gm = kc_up(m, rows), *ginv = kc_up(inv, rows);
    k_layernorm_stats(x, which != 2 ? m : NULL, which != 1 ? inv : NULL, rows, cols, eps);
    kc_layernorm_stats(gx, which != 2 ? gm : NULL, which != 1 ? ginv : NULL, rows, cols, eps);
    snprintf(w, sizeof w, "%lld x %lld %s: mean", (long long)rows, (long long)cols, which == 0 ? "both" : which == 1 ? "mean only" : "inv only");
    kc_report("k_layernorm_stats", w, kc_err(gm, m, rows));
    snprintf(w, sizeof w, "%lld x %lld %s: inv", (long long)rows, (long long)cols, which == 0 ? "both" : which == 1 ? "mean only" : "inv only");
    kc_report("k_layernorm_stats", w, kc_err(ginv, inv, rows));
    kc_free(gm), kc_free(ginv), free(m), free(inv);
  }
  /* which: 0 dx dscale dbias, 1 dx, 2 dscale dbias, 3 dscale, 4 dbias */
  static const char *const WHICH[] = {"dx dscale dbias", "dx", "dscale dbias", "dscale", "dbias"};
  for (int which = 0; which < 5; which++)
    for (int acc = 0; acc < 2; acc++) {
      if (which >= 2 && acc) continue;
      int wdx = which <= 1, wds = which == 0 || which == 2 || which == 3, wdb = which == 0 || which == 2 || which == 4;
      float *dx = kc_rand(n, -1, 1), *ds = kc_rand(cols, -1, 1), *db = kc_rand(cols, -1, 1);
      float *gdx = kc_up(dx, n), *gds = kc_up(ds, cols), *gdb = kc_up(db, cols);
      k_layernorm_grad(x, scale, dy, wdx ? dx : NULL, wds ? ds : NULL, wdb ? db : NULL, rows, cols, eps, acc);
      kc_layernorm_grad(gx, gs, gdy, wdx ? gdx : NULL, wds ? gds : NULL, wdb ? gdb : NULL, rows, cols, eps, acc);
      char wx[200];
      snprintf(w, sizeof w, "%lld x %lld %s acc=%d", (long long)rows, (long long)cols, WHICH[which], acc);
      if (wdx) snprintf(wx, sizeof wx, "%s: dx", w), kc_report("k_layernorm_grad", wx, kc_err(gdx, dx, n));
      if (wds) snprintf(wx, sizeof wx, "%s: dscale", w), kc_report("k_layernorm_grad", wx, kc_err(gds, ds, cols));
      if (wdb) snprintf(wx, sizeof wx, "%s: dbias", w), kc_report("k_layernorm_grad", wx, kc_err(gdb, db, cols));
      if (!wdx) snprintf(wx, sizeof wx, "%s: dx untouched", w), kc_report_exact("k_layernorm_grad", wx, gdx, dx, n * 4);
      kc_free(gdx), kc_free(gds), kc_free(gdb), free(dx), free(ds), free(db);
    }
  if (rows == 37 && cols == 768) { /* dx in place of dy */
    float *dx = malloc((size_t)n * sizeof *dx), *ds = kc_rand(cols, -1, 1), *db = kc_rand(cols, -1, 1);
    memcpy(dx, dy, (size_t)n * sizeof *dx);
    float *gdx = kc_up(dy, n), *gds = kc_up(ds, cols), *gdb = kc_up(db, cols);
    k_layernorm_grad(x, scale, dy, dx, ds, db, rows, cols, eps, 0);
    kc_layernorm_grad(gx, gs, gdx, gdx, gds, gdb, rows, cols, eps, 0);
    snprintf(w, sizeof w, "%lld x %lld dx in place of dy: dx", (long long)rows, (long long)cols);
    kc_report("k_layernorm_grad", w, kc_err(gdx, dx, n));
    snprintf(w, sizeof w, "%lld x %lld dx in place of dy: dscale", (long long)rows, (long long)cols);
    kc_report("k_layernorm_grad", w, kc_err(gds, ds, cols));
    kc_free(gdx), kc_free(gds), kc_free(gdb), free(dx), free(ds), free(db);
  }
  kc_free(gx), kc_free(gs), kc_free(gb), kc_free(gdy), free(x), free(scale), free(bias), free(dy);
}

void check_norm(void) {
  static const int64_t bn[][3] = {{1, 1, 1}, {2, 3, 7}, {3, 5, 1}, {37, 7, 33}, {4, 16, 49}, {8, 64, 784}, {2, 1, 100000}, {32, 3, 1}};
  for (size_t i = 0; i < sizeof bn / sizeof bn[0]; i++) check_bn_fwd(bn[i][0], bn[i][1], bn[i][2]);
  for (size_t i = 0; i < sizeof bn / sizeof bn[0]; i++) check_bn_grad(bn[i][0], bn[i][1], bn[i][2]);

  static const int64_t rows[] = {1, 3, 37};
  static const int64_t cols[] = {1, 7, 768, 1001, 50257};
  for (int r = 0; r < 3; r++)
    for (int c = 0; c < 5; c++) check_softmax(rows[r], cols[c], 0);
  check_softmax(37, 768, 1), check_softmax(300, 128, 1), check_softmax(2000, 64, 0);

  for (int r = 0; r < 3; r++)
    for (int c = 0; c < 5; c++) check_layernorm(rows[r], cols[c]);
  check_layernorm(300, 768), check_layernorm(1000, 33), check_layernorm(65, 1001);
}
