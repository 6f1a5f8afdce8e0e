/* cpu/activation.h - element-wise activations and unary maths: Relu, Tanh, Sigmoid, Erf, Sqrt, Gelu, LeakyRelu,
 * k_unary (Neg, Exp, Log, Abs, Reciprocal, Clip, HardSigmoid, HardSwish).
 * Part of the CPU kernels; runtime/kernels.h includes every family (the conventions are there). */
#ifndef PIPERUN_CPU_ACTIVATION_H
#define PIPERUN_CPU_ACTIVATION_H
#include "common.h"

/* ---- elementwise activations ---- */
/* NaN stays NaN, as torch.relu keeps it: a NaN made 0 here would hide a
 * broken weight from the loss check and let --save write it. */
PR_EW_RANGE(relu_r, out[i] = x[i] > 0 || x[i] != x[i] ? x[i] : 0;)
static inline void k_relu(const float *x, float *y, int64_t n) { PR_EW_FOR(relu_r, n, 2, .x = x, .out = y); }
/* PyTorch's threshold_backward: zero where y <= 0, so a NaN output passes its gradient. */
PR_EW_RANGE(relu_grad_r, PR_GRAD_OUT(y[i] <= 0 ? 0 : dy[i]))
static inline void k_relu_grad(const float *y, const float *dy, float *dx, int64_t n, int acc) {
  PR_EW_FOR(relu_grad_r, n, 3, .y = y, .dy = dy, .out = dx, .acc = acc);
}
PR_EW_RANGE(tanh_r, out[i] = tanhf(x[i]);)
static inline void k_tanh(const float *x, float *y, int64_t n) { PR_EW_FOR(tanh_r, n, 20, .x = x, .out = y); }
PR_EW_RANGE(tanh_grad_r, PR_GRAD_OUT(dy[i] * (1 - y[i] * y[i])))
static inline void k_tanh_grad(const float *y, const float *dy, float *dx, int64_t n, int acc) {
  PR_EW_FOR(tanh_grad_r, n, 3, .y = y, .dy = dy, .out = dx, .acc = acc);
}
PR_EW_RANGE(sigmoid_r, out[i] = 1 / (1 + expf(-x[i]));)
static inline void k_sigmoid(const float *x, float *y, int64_t n) { PR_EW_FOR(sigmoid_r, n, 20, .x = x, .out = y); }
PR_EW_RANGE(sigmoid_grad_r, PR_GRAD_OUT(dy[i] * y[i] * (1 - y[i])))
static inline void k_sigmoid_grad(const float *y, const float *dy, float *dx, int64_t n, int acc) {
  PR_EW_FOR(sigmoid_grad_r, n, 3, .y = y, .dy = dy, .out = dx, .acc = acc);
}
/* ---- more elementwise ---- */
/* erf eight at a time through glibc's vector libm (libmvec, glibc >= 2.35: at most 4 ulp from the
 * correctly rounded value, tests/test_kernels.c checks it against erff over the whole float range);
 * the tail and other targets use erff.  The same elements go the same way whatever the cut. */
/* Elements [lo, hi): lo is a multiple of the grain, so the eight-at-a-time loop takes the same elements
 * as on one thread. */
PR_RANGE void erf_r(const void *arg, int64_t lo, int64_t hi) {
  const PrEw *e = (const PrEw *)arg;
  int64_t i = lo;
#if defined(PR_MVEC) && defined(__AVX2__)
  for (; i + 8 <= hi; i += 8) *(pr_v8sf *)(e->out + i) = _ZGVdN8v_erff(*(const pr_v8sf *)(e->x + i));
#endif
  for (; i < hi; i++) e->out[i] = erff(e->x[i]);
}
static inline void k_erf(const float *x, float *y, int64_t n) { PR_EW_FOR(erf_r, n, 10, .x = x, .out = y); }
PR_EW_RANGE(erf_grad_r, PR_GRAD_OUT(dy[i] * 1.12837916709551257f * expf(-x[i] * x[i])))
static inline void k_erf_grad(const float *x, const float *dy, float *dx, int64_t n, int acc) {
  PR_EW_FOR(erf_grad_r, n, 10, .x = x, .dy = dy, .out = dx, .acc = acc);
}
PR_EW_RANGE(sqrt_r, out[i] = sqrtf(x[i]);)
static inline void k_sqrt(const float *x, float *y, int64_t n) { PR_EW_FOR(sqrt_r, n, 4, .x = x, .out = y); }
PR_EW_RANGE(sqrt_grad_r, PR_GRAD_OUT(dy[i] * 0.5f / y[i]))
static inline void k_sqrt_grad(const float *y, const float *dy, float *dx, int64_t n, int acc) {
  PR_EW_FOR(sqrt_grad_r, n, 4, .y = y, .dy = dy, .out = dx, .acc = acc);
}

/* ---- Gelu (ONNX opset 20), computed as PyTorch's CPU kernels do, in float ---- */
/* approximate="none": 0.5 x (1 + erf(x / sqrt 2)); "tanh" (tanh_approx = 1):
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
/* Elements [lo, hi) (lo a multiple of the grain: the eight-at-a-time loop takes the same elements as on
 * one thread). */
PR_RANGE void gelu_r(const void *arg, int64_t lo, int64_t n) {
  const PrEw *e = (const PrEw *)arg;
  const float *x = e->x;
  float *y = e->out;
  const float kAlpha = 0.70710678118654752440f; /* 1/sqrt(2) */
  const float kBeta = 0.79788456080286535588f;  /* sqrt(2/pi) */
  const float kKappa = 0.044715f;
  int64_t i = lo;
  if (e->op) { /* the tanh form */
    for (; i < n; i++) {
      float v = x[i], inner = kBeta * (v + kKappa * (v * v * v));
      y[i] = 0.5f * v * (1.0f + tanhf(inner));
    }
    return;
  }
#if defined(PR_MVEC) && defined(__AVX2__)
  /* erf eight at a time, as k_erf */
  for (; i + 8 <= n; i += 8) {
    pr_v8sf_a v, t;
    memcpy(&v, x + i, sizeof v);
    t = _ZGVdN8v_erff(v * kAlpha);
    v = v * 0.5f * (1.0f + t);
    memcpy(y + i, &v, sizeof v);
  }
#endif
  for (; i < n; i++) y[i] = x[i] * 0.5f * (1.0f + erff(x[i] * kAlpha));
}
static inline void k_gelu(const float *x, float *y, int64_t n, int tanh_approx) {
  PR_EW_FOR(gelu_r, n, 12, .x = x, .out = y, .op = tanh_approx);
}
/* d gelu / dx from the forward's input x:
 * none: Phi(x) + x phi(x); tanh: 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2). */
static inline float gelu_slope(float v, int tanh_approx) {
  const float kAlpha = 0.70710678118654752440f;  /* 1/sqrt(2) */
  const float kPdf = 0.39894228040143267794f;    /* 1/sqrt(2 pi) */
  const float kBeta = 0.79788456080286535588f;   /* sqrt(2/pi) */
  const float kKappa = 0.044715f;
  if (tanh_approx) {
    float v2 = v * v;
    float t = tanhf(kBeta * (v + kKappa * (v2 * v)));
    float left = 0.5f * v, right = 1.0f + t;
    float dleft = 0.5f * right;
    float dright = left * (1.0f - t * t) * (kBeta * (1.0f + 3.0f * kKappa * v2));
    return dleft + dright;
  }
  float cdf = 0.5f * (1.0f + erff(v * kAlpha));
  float pdf = kPdf * expf(v * v * -0.5f);
  return cdf + v * pdf;
}
PR_RANGE void gelu_grad_r(const void *arg, int64_t lo, int64_t n) {
  const PrEw *e = (const PrEw *)arg;
  const float *x = e->x, *dy = e->dy;
  float *dx = e->out;
  int tanh_approx = e->op, acc = e->acc;
  int64_t i = lo;
#if defined(PR_MVEC) && defined(__AVX2__)
  /* the exact form eight at a time: erf and exp through libmvec, as k_erf */
  for (; !tanh_approx && i + 8 <= n; i += 8) {
    pr_v8sf_a v, g, d;
    memcpy(&v, x + i, sizeof v);
    memcpy(&g, dy + i, sizeof g);
    pr_v8sf_a cdf = 0.5f * (1.0f + _ZGVdN8v_erff(v * 0.70710678118654752440f));
    pr_v8sf_a pdf = 0.39894228040143267794f * _ZGVdN8v_expf(v * v * -0.5f);
    g = g * (cdf + v * pdf);
    if (acc) memcpy(&d, dx + i, sizeof d), g = d + g;
    memcpy(dx + i, &g, sizeof g);
  }
#endif
  for (; i < n; i++) {
    float g = dy[i] * gelu_slope(x[i], tanh_approx);
    dx[i] = acc ? dx[i] + g : g;
  }
}
static inline void k_gelu_grad(const float *x, const float *dy, float *dx, int64_t n, int tanh_approx, int acc) {
  PR_EW_FOR(gelu_grad_r, n, 16, .x = x, .dy = dy, .out = dx, .op = tanh_approx, .acc = acc);
}

/* ---- LeakyRelu: y = x > 0 ? x : alpha x; its gradient uses x > 0, as PyTorch's does ---- */
PR_EW_RANGE(leakyrelu_r, out[i] = x[i] > 0 ? x[i] : x[i] * f0;)
static inline void k_leakyrelu(const float *x, float *y, int64_t n, float alpha) {
  PR_EW_FOR(leakyrelu_r, n, 2, .x = x, .out = y, .f0 = alpha);
}
PR_EW_RANGE(leakyrelu_grad_r, PR_GRAD_OUT(x[i] > 0 ? dy[i] : dy[i] * f0))
static inline void k_leakyrelu_grad(const float *x, const float *dy, float *dx, int64_t n, float alpha, int acc) {
  PR_EW_FOR(leakyrelu_grad_r, n, 3, .x = x, .dy = dy, .out = dx, .f0 = alpha, .acc = acc);
}

/* ---- unary maths and bounded activations: Neg, Exp, Log, Abs, Reciprocal,
 * Clip, HardSigmoid, HardSwish.  One kernel, the op a constant argument, so
 * each call specialises; a, b are Clip's bounds or HardSigmoid's alpha, beta. ---- */

/* Comparisons written so that a NaN input gives NaN, as torch.clamp and
 * torch.nn.Hardsigmoid do (fmaxf would drop it). */
static inline float un_apply(int op, float x, float a, float b) {
  switch (op) {
  case UN_NEG: return -x;
  case UN_EXP: return expf(x);
  case UN_LOG: return logf(x);
  case UN_ABS: return fabsf(x);
  case UN_RECIPROCAL: return 1.0f / x;
  case UN_CLIP: { /* min(max(x, lo), hi): hi wins when lo > hi, as torch.clamp and np.clip */
    float v = x < a ? a : x;
    return v > b ? b : v;
  }
  case UN_HARDSIGMOID: {
    float v = a * x + b;
    return v < 0 ? 0 : v > 1 ? 1 : v;
  }
  default: { /* hardswish, as PyTorch computes it: x * min(max(x + 3, 0), 6) / 6 */
    float t = x + 3.0f;
    t = t < 0 ? 0 : t > 6 ? 6 : t;
    return x * t / 6.0f;
  }
  }
}
/* The op chosen once per part, each its own loop (a constant op, as the inlined kernel had). */
#define UN_LOOP(OP) for (int64_t i = lo; i < hi; i++) e->out[i] = un_apply(OP, e->x[i], e->f0, e->f1);
PR_RANGE void unary_r(const void *arg, int64_t lo, int64_t hi) {
  const PrEw *e = (const PrEw *)arg;
  switch (e->op) {
  case UN_NEG: UN_LOOP(UN_NEG) break;
  case UN_EXP: UN_LOOP(UN_EXP) break;
  case UN_LOG: UN_LOOP(UN_LOG) break;
  case UN_ABS: UN_LOOP(UN_ABS) break;
  case UN_RECIPROCAL: UN_LOOP(UN_RECIPROCAL) break;
  case UN_CLIP: UN_LOOP(UN_CLIP) break;
  case UN_HARDSIGMOID: UN_LOOP(UN_HARDSIGMOID) break;
  default: UN_LOOP(UN_HARDSWISH)
  }
}
#undef UN_LOOP
static inline void k_unary(int op, const float *x, float *y, int64_t n, float a, float b) {
  PR_EW_FOR(unary_r, n, 10, .x = x, .out = y, .op = op, .f0 = a, .f1 = b);
}
/* d/dx times dy, as PyTorch's backward formulas: Exp and Reciprocal from the
 * output y, the rest from the input x (the other may be NULL).  At the kinks:
 * Abs 0 at 0 (and NaN); Clip passes dy on [lo, hi] inclusive (torch.clamp),
 * 0 outside and for NaN; HardSigmoid alpha dy strictly inside (0, 1);
 * HardSwish 0 below -3, dy (x/3 + 1/2) on [-3, 3], dy above (and for NaN). */
static inline float un_grad(int op, float x, float y, float dy, float a, float b) {
  switch (op) {
  case UN_NEG: return -dy;
  case UN_EXP: return dy * y;
  case UN_LOG: return dy / x;
  case UN_ABS: return x > 0 ? dy : x < 0 ? -dy : 0;
  case UN_RECIPROCAL: return -dy * (y * y);
  case UN_CLIP: return x >= a && x <= b ? dy : 0;
  case UN_HARDSIGMOID: {
    float v = a * x + b;
    return v > 0 && v < 1 ? dy * a : 0;
  }
  default: return x < -3.0f ? 0 : x <= 3.0f ? dy * (x / 3.0f + 0.5f) : dy;
  }
}
PR_EW_RANGE(unary_grad_r, PR_GRAD_OUT(un_grad(op, x ? x[i] : 0, y ? y[i] : 0, dy[i], f0, f1)))
static inline void k_unary_grad(int op, const float *x, const float *y, const float *dy, float *dx, int64_t n, float a, float b,
                                int acc) {
  PR_EW_FOR(unary_grad_r, n, 4, .x = x, .y = y, .dy = dy, .out = dx, .op = op, .f0 = a, .f1 = b, .acc = acc);
}
#endif
