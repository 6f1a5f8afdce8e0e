/* cpu/norm.h - normalizations over rows or channels: BatchNormalization, Softmax, LayerNormalization.
 * Part of the CPU kernels; runtime/kernels.h includes every family (the conventions are there). */
#ifndef PIPERUN_CPU_NORM_H
#define PIPERUN_CPU_NORM_H
#include "common.h"
/* ---- batch normalization over N and the spatial axes, per channel ---- */

/* The per-channel sums below run in 8 double lanes, each plane's elements dealt round-robin, and the
 * lanes add up in a fixed order at the end: the compiler vectorises them (a single running sum is a
 * chain it may not reorder), and the result depends only on the data and the shape. */
#define BN_LANES 8
typedef double bn_v4d __attribute__((vector_size(32)));
typedef float bn_v4f __attribute__((vector_size(16)));
typedef int bn_v4i __attribute__((vector_size(16)));
static inline bn_v4d bn_load4(const float *p) {
  bn_v4f f;
  memcpy(&f, p, sizeof f);
  return __builtin_convertvector(f, bn_v4d);
}
static inline double bn_lanes_total(const double *lane) {
  double t = 0;
  for (int j = 0; j < BN_LANES; j++) t += lane[j];
  return t;
}

/* Adds one plane's elements into sum lanes and their squares into square lanes (element k into
 * lane k % 8), in double. */
static inline void bn_plane_sums(const float *p, int64_t sp, double *sum, double *sq) {
  bn_v4d s0, s1, q0, q1;
  memcpy(&s0, sum, sizeof s0), memcpy(&s1, sum + 4, sizeof s1), memcpy(&q0, sq, sizeof q0), memcpy(&q1, sq + 4, sizeof q1);
  int64_t k = 0;
  for (; k + BN_LANES <= sp; k += BN_LANES) {
    bn_v4d x0 = bn_load4(p + k), x1 = bn_load4(p + k + 4);
    s0 += x0, s1 += x1, q0 += x0 * x0, q1 += x1 * x1;
  }
  memcpy(sum, &s0, sizeof s0), memcpy(sum + 4, &s1, sizeof s1), memcpy(sq, &q0, sizeof q0), memcpy(sq + 4, &q1, sizeof q1);
  for (; k < sp; k++) sum[k % BN_LANES] += p[k], sq[k % BN_LANES] += (double)p[k] * p[k];
}

/* Mean and biased variance from the sums of a channel's cnt elements and of their squares.  One
 * pass, in double: E[x^2] - mean^2 loses about log2(1 + mean^2 / var) bits of double's 53, so the
 * variance keeps float's 24 while the mean is under ~20000 times the spread (2^14.5); the two-pass
 * form this replaced read the input twice more, a third of batch normalization's time. */
static inline void bn_moments(double sum, double sq, int64_t cnt, double *mean, double *var) {
  double mu = sum / (double)cnt, v = sq / (double)cnt - mu * mu;
  *mean = mu;
  *var = v > 0 ? v : 0;
}

/* Mean and biased variance of channel ch over the batch and spatial axes. */
static inline void bn_batch_stats(const float *x, const BnShape *s, int64_t ch, double *mean, double *var) {
  double sum[BN_LANES] = {0}, sq[BN_LANES] = {0};
  for (int64_t i = 0; i < s->n; i++) bn_plane_sums(x + (i * s->c + ch) * s->sp, s->sp, sum, sq);
  bn_moments(bn_lanes_total(sum), bn_lanes_total(sq), s->n * s->sp, mean, var);
}

/* Training: normalise with the batch's mean and (biased) variance and update
 * the running statistics with the unbiased variance, as PyTorch does. */
PR_OUT_OF_LINE void k_batchnorm(const float *x, const float *gamma, const float *beta, float *rmean, float *rvar, float *y,
                               const BnShape *s) {
  int64_t cnt = s->n * s->sp, sp = s->sp;
  for (int64_t ch = 0; ch < s->c; ch++) {
    double mean, var;
    if (s->training) {
      bn_batch_stats(x, s, ch, &mean, &var);
      if (rmean) { /* NULL: a recomputation, whose forward already moved the running statistics */
        rmean[ch] = (float)(rmean[ch] * s->momentum + mean * (1 - s->momentum));
        rvar[ch] = (float)(rvar[ch] * s->momentum + (cnt > 1 ? var * (double)cnt / (double)(cnt - 1) : var) * (1 - s->momentum));
      }
    } else {
      mean = rmean[ch], var = rvar[ch];
    }
    /* Locals: y may not alias gamma and beta as far as the compiler knows, so it would reload them. */
    const float m = (float)mean, inv = (float)(1.0 / sqrt(var + s->eps)), g = gamma[ch], b = beta[ch];
    for (int64_t i = 0; i < s->n; i++) {
      const float *xp = x + (i * s->c + ch) * sp;
      float *yp = y + (i * s->c + ch) * sp;
      if (s->relu) /* k_relu's expression */
        for (int64_t k = 0; k < sp; k++) {
          float z = (xp[k] - m) * inv * g + b;
          yp[k] = z > 0 || z != z ? z : 0;
        }
      else
        for (int64_t k = 0; k < sp; k++) yp[k] = (xp[k] - m) * inv * g + b;
    }
  }
}

/* Gradients of batch normalization; training mode recomputes the batch statistics from the
 * stashed input.  dx may be NULL; dgamma/dbeta add.  One pass gathers, per channel and in double,
 * the sums of x, x^2, dy and dy * x (so the statistics and both reductions), a second writes dx:
 *   dbeta = sum dy,  dgamma = sum dy (x - mean) inv = (sum dy x - mean sum dy) inv. */
/* With a fused Relu, y is its output and each dy is first masked as k_relu_grad does (zero where
 * y <= 0), so the sums and dx see what the separate Relu's gradient would have held. */
static inline float bn_masked(const float *y, const float *dy, int64_t k) { return y && y[k] <= 0 ? 0 : dy[k]; }

PR_OUT_OF_LINE void k_batchnorm_grad(const float *x, const float *gamma, const float *rmean, const float *rvar, const float *dy,
                                    const float *y, float *dx, float *dgamma, float *dbeta, const BnShape *s, int acc_x) {
  int64_t cnt = s->n * s->sp, sp = s->sp;
  for (int64_t ch = 0; ch < s->c; ch++) {
    double lx[BN_LANES] = {0}, lxx[BN_LANES] = {0}, ldy[BN_LANES] = {0}, ldyx[BN_LANES] = {0};
    for (int64_t i = 0; i < s->n; i++) {
      const float *xp = x + (i * s->c + ch) * sp, *dp = dy + (i * s->c + ch) * sp, *yp = y ? y + (i * s->c + ch) * sp : NULL;
      bn_v4d a[8];
      double *lanes[4] = {lx, lxx, ldy, ldyx};
      for (int q = 0; q < 4; q++) memcpy(a + 2 * q, lanes[q], sizeof(double) * 4), memcpy(a + 2 * q + 1, lanes[q] + 4, sizeof(double) * 4);
      int64_t k = 0;
      if (yp) /* two loops: a test of yp inside the one loop kept it from vectorising (BN's backward ran 2x slower) */
        for (; k + BN_LANES <= sp; k += BN_LANES)
          for (int h = 0; h < 2; h++) {
            bn_v4f dv, yv, zero = {0, 0, 0, 0};
            memcpy(&dv, dp + k + 4 * h, sizeof dv), memcpy(&yv, yp + k + 4 * h, sizeof yv);
            bn_v4i bits, keep = ~(yv <= zero); /* k_relu_grad's mask: zero where y <= 0 (a NaN y passes) */
            memcpy(&bits, &dv, sizeof bits);
            bits &= keep;
            memcpy(&dv, &bits, sizeof dv);
            bn_v4d xv = bn_load4(xp + k + 4 * h), d = __builtin_convertvector(dv, bn_v4d);
            a[h] += xv, a[2 + h] += xv * xv, a[4 + h] += d, a[6 + h] += d * xv;
          }
      else
        for (; k + BN_LANES <= sp; k += BN_LANES)
          for (int h = 0; h < 2; h++) {
            bn_v4d xv = bn_load4(xp + k + 4 * h), d = bn_load4(dp + k + 4 * h);
            a[h] += xv, a[2 + h] += xv * xv, a[4 + h] += d, a[6 + h] += d * xv;
          }
      for (int q = 0; q < 4; q++) memcpy(lanes[q], a + 2 * q, sizeof(double) * 4), memcpy(lanes[q] + 4, a + 2 * q + 1, sizeof(double) * 4);
      for (; k < sp; k++) {
        double xv = xp[k], d = bn_masked(yp, dp, k);
        lx[k % BN_LANES] += xv, lxx[k % BN_LANES] += xv * xv, ldy[k % BN_LANES] += d, ldyx[k % BN_LANES] += d * xv;
      }
    }
    double mean, var;
    if (s->training) bn_moments(bn_lanes_total(lx), bn_lanes_total(lxx), cnt, &mean, &var);
    else mean = rmean[ch], var = rvar[ch];
    const double inv = 1.0 / sqrt(var + s->eps), sdy = bn_lanes_total(ldy), sdyx = (bn_lanes_total(ldyx) - mean * sdy) * inv;
    if (dgamma) dgamma[ch] += (float)sdyx;
    if (dbeta) dbeta[ch] += (float)sdy;
    if (!dx) continue;
    const float m = (float)mean, fi = (float)inv, g = gamma[ch];
    const double mdy = sdy / (double)cnt, mdyx = sdyx / (double)cnt, gi = g * inv;
    for (int64_t i = 0; i < s->n; i++) {
      const float *xp = x + (i * s->c + ch) * sp, *dp = dy + (i * s->c + ch) * sp, *yp = y ? y + (i * s->c + ch) * sp : NULL;
      float *dxp = dx + (i * s->c + ch) * sp;
      if (s->training && yp)
        for (int64_t k = 0; k < sp; k++) {
          float v = (float)(gi * ((yp[k] <= 0 ? 0 : dp[k]) - mdy - (xp[k] - m) * fi * mdyx));
          dxp[k] = acc_x ? dxp[k] + v : v;
        }
      else if (s->training)
        for (int64_t k = 0; k < sp; k++) {
          float v = (float)(gi * (dp[k] - mdy - (xp[k] - m) * fi * mdyx));
          dxp[k] = acc_x ? dxp[k] + v : v;
        }
      else if (yp)
        for (int64_t k = 0; k < sp; k++) {
          float v = (yp[k] <= 0 ? 0 : dp[k]) * g * fi;
          dxp[k] = acc_x ? dxp[k] + v : v;
        }
      else
        for (int64_t k = 0; k < sp; k++) {
          float v = dp[k] * g * fi;
          dxp[k] = acc_x ? dxp[k] + v : v;
        }
    }
  }
}

/* ---- Softmax over the last axis ---- */
/* Below this a vector expf leaves its fast path (e^-80 is far above float's smallest normal). */
#define PR_EXP_LOW (-80.0f)
/* One scalar expf the vectoriser leaves alone (a NaN argument comes back NaN, as from the vector one). */
PR_OUT_OF_LINE float pr_expf_one(float t) { return expf(t); }
/* Row kernels' operands (softmax, layernorm): rows are independent, so they split by rows. */
typedef struct PrRows {
  const float *x, *dy, *scale, *bias;
  float *y, *dx, *dscale, *dbias; /* dscale, dbias: layernorm_dw_r */
  int64_t rows, cols;
  float eps;
  int log, acc;
} PrRows;
#define PR_ROWS_FOR(fn, rows, cols, cost, ...) \
  PR_PAR_RUN((rows), 1, (double)(rows) * (double)(cols) * (cost), fn, &(PrRows){.cols = (cols), __VA_ARGS__})
PR_RANGE void softmax_r(const void *arg, int64_t lo, int64_t hi) {
  const PrRows *q = (const PrRows *)arg;
  const float *x = q->x;
  float *y = q->y;
  int64_t cols = q->cols;
  int log = q->log;
  for (int64_t r = lo; r < hi; r++) {
    const float *a = x + r * cols;
    float *b = y + r * cols, mx = a[0], sum = 0;
    /* The maximum in eight lanes too: exact in any order (a NaN in the row makes the loss NaN anyway). */
    int64_t k0 = 1;
    if (cols >= 16) {
      float l[8];
      for (int j = 0; j < 8; j++) l[j] = a[j];
      for (k0 = 8; k0 + 8 <= cols; k0 += 8)
        for (int j = 0; j < 8; j++) l[j] = a[k0 + j] > l[j] ? a[k0 + j] : l[j];
      for (int j = 0; j < 8; j++) mx = l[j] > mx ? l[j] : mx;
    }
    for (int64_t k = k0; k < cols; k++) mx = a[k] > mx ? a[k] : mx;
    if (log) {
      for (int64_t k = 0; k < cols; k++) sum += expf(a[k] - mx);
      for (int64_t k = 0; k < cols; k++) b[k] = a[k] - mx - logf(sum);
      continue;
    }
    /* The exponentials in one loop of their own (vectorised where the build has a vector libm), then
     * summed in lanes, then divided.  A vector expf takes a slow path, a lane at a time, for arguments
     * near or below its underflow, and a causal mask makes half of every row -inf: those lanes get an
     * argument of 0 and are set afterwards, -inf to 0 and the rest (a denormal or 0) by the scalar expf. */
    int64_t k = 0;
#if defined(PR_MVEC) && defined(__AVX2__)
    /* Eight at a time through libmvec, as the vectoriser did when the shape was a constant (the
     * out-of-line copy left most of a row of 32 to the scalar expf), the tail one at a time. */
    for (; k + 8 <= cols; k += 8) {
      pr_v8sf_a v;
      float t[8];
      for (int j = 0; j < 8; j++) t[j] = a[k + j] - mx > PR_EXP_LOW ? a[k + j] - mx : 0.0f;
      memcpy(&v, t, sizeof v);
      v = _ZGVdN8v_expf(v);
      memcpy(b + k, &v, sizeof v);
    }
#endif
#ifdef __clang__
#pragma clang loop vectorize(disable)
#endif
    for (; k < cols; k++) {
      float t = a[k] - mx;
      b[k] = expf(t > PR_EXP_LOW ? t : 0.0f);
    }
    for (int64_t k = 0; k < cols; k++)
      if (!(a[k] - mx > PR_EXP_LOW)) b[k] = a[k] == -INFINITY ? 0.0f : pr_expf_one(a[k] - mx);
    sum = pr_sum8(b, cols);
    for (int64_t k = 0; k < cols; k++) b[k] /= sum;
  }
}
static inline void k_softmax(const float *x, float *y, int64_t rows, int64_t cols, int log) {
  PR_ROWS_FOR(softmax_r, rows, cols, 12, .x = x, .y = y, .log = log);
}
PR_RANGE void softmax_grad_r(const void *arg, int64_t lo, int64_t hi) {
  const PrRows *q = (const PrRows *)arg;
  const float *y = q->x, *dy = q->dy;
  float *dx = q->dx;
  int64_t cols = q->cols;
  int log = q->log, acc = q->acc;
  for (int64_t r = lo; r < hi; r++) {
    const float *p = y + r * cols, *g = dy + r * cols;
    float *d = dx + r * cols, dot = log ? pr_sum8(g, cols) : pr_dot8(g, p, cols);
    for (int64_t k = 0; k < cols; k++) {
      float v = log ? g[k] - expf(p[k]) * dot : p[k] * (g[k] - dot);
      d[k] = acc ? d[k] + v : v;
    }
  }
}
static inline void k_softmax_grad(const float *y, const float *dy, float *dx, int64_t rows, int64_t cols, int log, int acc) {
  PR_ROWS_FOR(softmax_grad_r, rows, cols, 4, .x = y, .dy = dy, .dx = dx, .log = log, .acc = acc);
}

/* ---- LayerNormalization over the trailing `cols` elements ---- */
/* Mean and biased variance of one row, in float as ONNX's stash_type=1, each sum over eight lanes
 * (pr_sum8) so that it vectorises: a row of 768 summed in order is a chain of 768 dependent adds. */
static inline void ln_row_stats(const float *a, int64_t cols, float *mean, float *var) {
  float m = pr_sum8(a, cols) / (float)cols, l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= cols; k += 8)
    for (int j = 0; j < 8; j++) l[j] += (a[k + j] - m) * (a[k + j] - m);
  float v = pr_lanes_total(l);
  for (; k < cols; k++) v += (a[k] - m) * (a[k] - m);
  *mean = m, *var = v / (float)cols;
}
PR_RANGE void layernorm_r(const void *arg, int64_t lo, int64_t hi) {
  const PrRows *q = (const PrRows *)arg;
  const float *x = q->x, *scale = q->scale, *bias = q->bias;
  int64_t cols = q->cols;
  for (int64_t r = lo; r < hi; r++) {
    const float *a = x + r * cols;
    float *b = q->y + r * cols, mean, var;
    ln_row_stats(a, cols, &mean, &var);
    float inv = 1.0f / sqrtf(var + q->eps);
    for (int64_t k = 0; k < cols; k++) b[k] = (a[k] - mean) * inv * scale[k] + (bias ? bias[k] : 0);
  }
}
static inline void k_layernorm(const float *x, const float *scale, const float *bias, float *y, int64_t rows, int64_t cols, float eps) {
  PR_ROWS_FOR(layernorm_r, rows, cols, 5, .x = x, .scale = scale, .bias = bias, .y = y, .eps = eps);
}
/* LayerNormalization's optional outputs: per-row mean and 1/sqrt(var + eps). */
static inline void k_layernorm_stats(const float *x, float *mean_out, float *inv_out, int64_t rows, int64_t cols, float eps) {
  for (int64_t r = 0; r < rows; r++) {
    const float *a = x + r * cols;
    float mean, var;
    ln_row_stats(a, cols, &mean, &var);
    if (mean_out) mean_out[r] = mean;
    if (inv_out) inv_out[r] = 1.0f / sqrtf(var + eps);
  }
}

/* Rows [lo, hi) of the gradient: dx, and where dscale or dbias is given (one thread) their sums over
 * the rows in order. */
static inline void layernorm_grad_rows(const float *x, const float *scale, const float *dy, float *dx, float *dscale, float *dbias,
                                       int64_t lo, int64_t hi, int64_t cols, float eps, int acc) {
  for (int64_t r = lo; r < hi; r++) {
    const float *a = x + r * cols, *g = dy + r * cols;
    float mean, var;
    ln_row_stats(a, cols, &mean, &var);
    float inv = 1.0f / sqrtf(var + eps);
    if (dscale)
      for (int64_t k = 0; k < cols; k++) dscale[k] += g[k] * ((a[k] - mean) * inv);
    if (dbias)
      for (int64_t k = 0; k < cols; k++) dbias[k] += g[k];
    if (!dx) continue;
    /* the sums of dy*scale and dy*scale*xhat, over eight lanes as ln_row_stats */
    float l1[8] = {0, 0, 0, 0, 0, 0, 0, 0}, l2[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t k = 0;
    for (; k + 8 <= cols; k += 8)
      for (int j = 0; j < 8; j++) {
        float xh = (a[k + j] - mean) * inv, gs = g[k + j] * scale[k + j];
        l1[j] += gs, l2[j] += gs * xh;
      }
    float sg = pr_lanes_total(l1), sgx = pr_lanes_total(l2);
    for (; k < cols; k++) {
      float xh = (a[k] - mean) * inv, gs = g[k] * scale[k];
      sg += gs, sgx += gs * xh;
    }
    float *d = dx + r * cols, mg = sg / (float)cols, mgx = sgx / (float)cols;
    if (acc)
      for (int64_t q = 0; q < cols; q++) d[q] += inv * (g[q] * scale[q] - mg - (a[q] - mean) * inv * mgx);
    else
      for (int64_t q = 0; q < cols; q++) d[q] = inv * (g[q] * scale[q] - mg - (a[q] - mean) * inv * mgx);
  }
}
PR_RANGE void layernorm_dx_r(const void *arg, int64_t lo, int64_t hi) {
  const PrRows *q = (const PrRows *)arg;
  layernorm_grad_rows(q->x, q->scale, q->dy, q->dx, NULL, NULL, lo, hi, q->cols, q->eps, q->acc);
}
/* Columns [lo, hi) of dscale and dbias: each still summed over the rows in order, as on one thread. */
PR_RANGE void layernorm_dw_r(const void *arg, int64_t lo, int64_t hi) {
  const PrRows *q = (const PrRows *)arg;
  int64_t cols = q->cols, rows = q->rows;
  for (int64_t r = 0; r < rows; r++) {
    const float *a = q->x + r * cols, *g = q->dy + r * cols;
    float mean, var;
    ln_row_stats(a, cols, &mean, &var);
    float inv = 1.0f / sqrtf(var + q->eps);
    if (q->dscale)
      for (int64_t k = lo; k < hi; k++) q->dscale[k] += g[k] * ((a[k] - mean) * inv);
    if (q->dbias)
      for (int64_t k = lo; k < hi; k++) q->dbias[k] += g[k];
  }
}
static inline void k_layernorm_grad(const float *x, const float *scale, const float *dy, float *dx, float *dscale, float *dbias,
                                    int64_t rows, int64_t cols, float eps, int acc) {
  if (pr_par_threads() == 1) { /* one pass over the rows, the weights' sums beside dx */
    layernorm_grad_rows(x, scale, dy, dx, dscale, dbias, 0, rows, cols, eps, acc);
    return;
  }
  if (dx) PR_ROWS_FOR(layernorm_dx_r, rows, cols, 8, .x = x, .scale = scale, .dy = dy, .dx = dx, .eps = eps, .acc = acc);
  if (dscale || dbias)
    PR_PAR_RUN(cols, 64, (double)rows * (double)cols * 4, layernorm_dw_r,
               &(PrRows){.x = x, .dy = dy, .dscale = dscale, .dbias = dbias, .rows = rows, .cols = cols, .eps = eps});
}
#endif
