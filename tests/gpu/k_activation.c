/* k_activation.c - the activation family's GPU kernels against the CPU's (cpu/activation.h): Relu, Tanh,
 * Sigmoid, Erf, Sqrt, Gelu (both forms), LeakyRelu and k_unary (every UN_ op code, Clip's and
 * HardSigmoid's parameters), forward and gradient, acc 0 and 1, the gradient's NULL x or y, in place. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda/kernels.h"
#include "kcheck.h"
#include "kernels.h"

static const int64_t SIZES[] = {1, 7, 33, 1000, 100003};
enum { NSIZES = sizeof SIZES / sizeof SIZES[0] };

typedef void (*Fwd)(const float *x, float *y, int64_t n);
/* a: what the gradient reads (the forward's x or y, as the kernel's prototype says). */
typedef void (*Bwd)(const float *a, const float *dy, float *dx, int64_t n, int acc);

/* Inputs of n in [lo, hi) with the values at the edges: 0 (where `zero`), -0 and a NaN where there is
 * room, and up to two more chosen points (kinks; `npts` of them). */
static float *inputs(int64_t n, float lo, float hi, int zero, const float *pts, int npts) {
  float *x = kc_rand(n, lo, hi);
  if (zero && n > 1) x[1] = 0;
  if (zero && n > 2) x[2] = -0.0f;
  for (int k = 0; k < npts && 3 + k < n; k++) x[3 + k] = pts[k];
  if (n > 5) x[5] = NAN;
  return x;
}

/* The forward on each size (and once in place): the GPU's y against the CPU's. */
static void check_fwd(const char *name, const char *mode, Fwd cpu, Fwd gpu, float lo, float hi, int zero, const float *pts, int npts) {
  for (int s = 0; s < NSIZES; s++) {
    int64_t n = SIZES[s];
    float *x = inputs(n, lo, hi, zero, pts, npts), *y = kc_zeros(n);
    cpu(x, y, n);
    float *dx = kc_up(x, n), *dy = kc_dev_zeros(n);
    gpu(dx, dy, n);
    char shape[96];
    snprintf(shape, sizeof shape, "n=%lld%s", (long long)n, mode);
    kc_report(name, shape, kc_err(dy, y, n));
    if (n == 1000) { /* y = x, in place */
      gpu(dx, dx, n);
      snprintf(shape, sizeof shape, "n=%lld%s in place", (long long)n, mode);
      kc_report(name, shape, kc_err(dx, y, n));
    }
    kc_free(dx), kc_free(dy), free(x), free(y);
  }
}

/* The gradient on each size, acc 0 and 1 (dx prefilled with the same random values on both sides: acc 0
 * must overwrite them).  `fwd`: the CPU forward whose output the gradient reads, or NULL when it reads x. */
static void check_bwd(const char *name, const char *mode, Fwd fwd, Bwd cpu, Bwd gpu, float lo, float hi, int zero, const float *pts,
                      int npts) {
  for (int s = 0; s < NSIZES; s++) {
    int64_t n = SIZES[s];
    float *x = inputs(n, lo, hi, zero, pts, npts), *a = x;
    if (fwd) a = kc_zeros(n), fwd(x, a, n);
    float *dy = kc_rand(n, -1, 1);
    float *da = kc_up(a, n), *ddy = kc_up(dy, n);
    for (int acc = 0; acc < 2; acc++) {
      float *dx = kc_rand(n, -1, 1);
      float *ddx = kc_up(dx, n);
      cpu(a, dy, dx, n, acc);
      gpu(da, ddy, ddx, n, acc);
      char shape[96];
      snprintf(shape, sizeof shape, "n=%lld acc=%d%s", (long long)n, acc, mode);
      kc_report(name, shape, kc_err(ddx, dx, n));
      kc_free(ddx), free(dx);
    }
    kc_free(da), kc_free(ddy), free(dy);
    if (a != x) free(a);
    free(x);
  }
}

/* The kernels with one more argument, through the two-argument shapes above (the argument in a static). */
static int gelu_mode;
static float leaky_alpha;
static void cpu_gelu(const float *x, float *y, int64_t n) { k_gelu(x, y, n, gelu_mode); }
static void gpu_gelu(const float *x, float *y, int64_t n) { kc_gelu(x, y, n, gelu_mode); }
static void cpu_gelu_grad(const float *x, const float *dy, float *dx, int64_t n, int acc) { k_gelu_grad(x, dy, dx, n, gelu_mode, acc); }
static void gpu_gelu_grad(const float *x, const float *dy, float *dx, int64_t n, int acc) { kc_gelu_grad(x, dy, dx, n, gelu_mode, acc); }
static void cpu_leaky(const float *x, float *y, int64_t n) { k_leakyrelu(x, y, n, leaky_alpha); }
static void gpu_leaky(const float *x, float *y, int64_t n) { kc_leakyrelu(x, y, n, leaky_alpha); }
static void cpu_leaky_grad(const float *x, const float *dy, float *dx, int64_t n, int acc) { k_leakyrelu_grad(x, dy, dx, n, leaky_alpha, acc); }
static void gpu_leaky_grad(const float *x, const float *dy, float *dx, int64_t n, int acc) { kc_leakyrelu_grad(x, dy, dx, n, leaky_alpha, acc); }

/* k_unary with op `op` and parameters a, b: the forward (with x in [lo, hi), negated at every other
 * element when `alt`) and the gradient with both x and y given, then with only what the compiler passes
 * (Exp and Reciprocal y, Neg nothing, the rest x). */
static void check_unary_op(int op, float a, float b, float lo, float hi, int zero, int alt, const float *pts, int npts) {
  for (int s = 0; s < NSIZES; s++) {
    int64_t n = SIZES[s];
    float *x = inputs(n, lo, hi, zero, pts, npts), *y = kc_zeros(n);
    if (alt)
      for (int64_t i = 1; i < n; i += 2) x[i] = -x[i];
    k_unary(op, x, y, n, a, b);
    float *dxin = kc_up(x, n), *dyout = kc_dev_zeros(n);
    kc_unary(op, dxin, dyout, n, a, b);
    char shape[128];
    snprintf(shape, sizeof shape, "op=%d a=%g b=%g n=%lld", op, a, b, (long long)n);
    kc_report("k_unary", shape, kc_err(dyout, y, n));
    if (n == 1000) {
      float *dio = kc_up(x, n);
      kc_unary(op, dio, dio, n, a, b);
      snprintf(shape, sizeof shape, "op=%d a=%g b=%g n=%lld in place", op, a, b, (long long)n);
      kc_report("k_unary", shape, kc_err(dio, y, n));
      kc_free(dio);
    }
    float *dy = kc_rand(n, -1, 1), *ddy = kc_up(dy, n);
    int reads_y = op == UN_EXP || op == UN_RECIPROCAL, reads_x = !reads_y && op != UN_NEG;
    for (int minimal = 0; minimal < 2; minimal++)
      for (int acc = 0; acc < 2; acc++) {
        const float *cx = x, *cy = y, *gx = dxin, *gy = dyout;
        if (minimal) {
          if (!reads_x) cx = NULL, gx = NULL;
          if (!reads_y) cy = NULL, gy = NULL;
        }
        float *dx = kc_rand(n, -1, 1), *ddx = kc_up(dx, n);
        k_unary_grad(op, cx, cy, dy, dx, n, a, b, acc);
        kc_unary_grad(op, gx, gy, ddy, ddx, n, a, b, acc);
        snprintf(shape, sizeof shape, "op=%d a=%g b=%g n=%lld acc=%d%s", op, a, b, (long long)n, acc, minimal ? " x/y NULL" : "");
        kc_report("k_unary_grad", shape, kc_err(ddx, dx, n));
        kc_free(ddx), free(dx);
      }
    kc_free(ddy), free(dy), kc_free(dxin), kc_free(dyout), free(x), free(y);
  }
}

static void check_unary(void) {
  const float none[1] = {0};
  check_unary_op(UN_NEG, 0, 0, -3, 3, 1, 0, none, 0);
  check_unary_op(UN_EXP, 0, 0, -5, 5, 1, 0, none, 0);
  check_unary_op(UN_LOG, 0, 0, 0.05f, 5, 0, 0, none, 0);
  check_unary_op(UN_ABS, 0, 0, -3, 3, 1, 0, none, 0);
  check_unary_op(UN_RECIPROCAL, 0, 0, 0.1f, 3, 0, 1, none, 0);
  const float clip[2] = {-0.5f, 0.7f}, clip_swapped[2] = {0.5f, -0.5f};
  check_unary_op(UN_CLIP, -0.5f, 0.7f, -2, 2, 1, 0, clip, 2);
  check_unary_op(UN_CLIP, 0.5f, -0.5f, -2, 2, 1, 0, clip_swapped, 2); /* lo > hi: hi wins */
  const float hs_onnx[2] = {-2.5f, 2.5f}, hs_torch[2] = {-3.0f, 3.0f};
  check_unary_op(UN_HARDSIGMOID, 0.2f, 0.5f, -4, 4, 1, 0, hs_onnx, 2);
  check_unary_op(UN_HARDSIGMOID, 1.0f / 6.0f, 0.5f, -4, 4, 1, 0, hs_torch, 2);
  const float hw[2] = {-3.0f, 3.0f};
  check_unary_op(UN_HARDSWISH, 0, 0, -5, 5, 1, 0, hw, 2);
}

void check_activation(void) {
  const float none[1] = {0};
  check_fwd("k_relu", "", k_relu, kc_relu, -3, 3, 1, none, 0);
  check_bwd("k_relu_grad", "", k_relu, k_relu_grad, kc_relu_grad, -3, 3, 1, none, 0);
  check_fwd("k_tanh", "", k_tanh, kc_tanh, -4, 4, 1, none, 0);
  check_bwd("k_tanh_grad", "", k_tanh, k_tanh_grad, kc_tanh_grad, -4, 4, 1, none, 0);
  check_fwd("k_sigmoid", "", k_sigmoid, kc_sigmoid, -8, 8, 1, none, 0);
  check_bwd("k_sigmoid_grad", "", k_sigmoid, k_sigmoid_grad, kc_sigmoid_grad, -8, 8, 1, none, 0);
  check_fwd("k_erf", "", k_erf, kc_erf, -3, 3, 1, none, 0);
  check_bwd("k_erf_grad", "", NULL, k_erf_grad, kc_erf_grad, -3, 3, 1, none, 0);
  check_fwd("k_sqrt", "", k_sqrt, kc_sqrt, 0.01f, 4, 1, none, 0);
  check_bwd("k_sqrt_grad", "", k_sqrt, k_sqrt_grad, kc_sqrt_grad, 0.01f, 4, 0, none, 0); /* y = 0 would be an infinite slope */
  for (gelu_mode = 0; gelu_mode < 2; gelu_mode++) {
    const char *mode = gelu_mode ? " tanh" : " erf";
    check_fwd("k_gelu", mode, cpu_gelu, gpu_gelu, -5, 5, 1, none, 0);
    check_bwd("k_gelu_grad", mode, NULL, cpu_gelu_grad, gpu_gelu_grad, -5, 5, 1, none, 0);
  }
  const float alphas[] = {0.01f, 0.2f};
  for (int k = 0; k < 2; k++) {
    leaky_alpha = alphas[k];
    char mode[32];
    snprintf(mode, sizeof mode, " alpha=%g", leaky_alpha);
    check_fwd("k_leakyrelu", mode, cpu_leaky, gpu_leaky, -3, 3, 1, none, 0);
    check_bwd("k_leakyrelu_grad", mode, NULL, cpu_leaky_grad, gpu_leaky_grad, -3, 3, 1, none, 0);
  }
  check_unary();
}
