/* kernels.h - the compute kernels stage programs call, one per op and
 * direction.  static inline so that the generated code's constant shapes
 * specialise them; GEMM goes through CBLAS (OpenBLAS, one thread per rank).
 *
 * Conventions: row-major float32, NCHW.  Every backward kernel takes `acc`:
 * 0 = write the gradient, 1 = add to what is there (a tensor read by several
 * ops, or a weight gradient summed over micro-batches).  The order of those
 * additions is fixed by the compiler, which is what makes -n 1 and -n 4
 * produce bit-identical weights. */
#ifndef PIPERUN_KERNELS_H
#define PIPERUN_KERNELS_H
/* Kernels whose loops are driven by a constant shape struct are inlined at
 * every call, so clang specialises each one on its shape. */
#define PR_INLINE static inline __attribute__((always_inline))
/* Kernels whose work does not gain from a constant shape (a library call, a copy, a per-channel loop)
 * are kept out of line instead: inlining them at each of a large model's thousand calls was most of its
 * build (docs/kernels.md, "Build time"). */
#define PR_OUT_OF_LINE static __attribute__((noinline, unused))
#include "par.h"
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* ---- splitting a kernel over the rank's threads (--threads T, par.h) ----
 * A kernel's loop is a range function over its items (elements, rows, batches), its operands in a
 * struct; the kernel hands it to PR_PAR_RUN, which runs it whole on one thread or in parts of whole
 * grains on T (pr_par_for).  Each item is computed by the same code either way, so T changes no bits.
 * A range function is never inlined: one thread and T run the same machine code.  Inlined with a call's
 * constant shape, clang vectorised some loops differently from the function's own copy (softmax's exp:
 * libmvec in one, libm's expf in the other), and the bits moved with T.  Loops that call libm where
 * speed matters say how they vectorise themselves (softmax_r).  The last argument: a pointer to the
 * operands (a compound literal may hold commas). */
#define PR_RANGE static __attribute__((noinline, unused))
#define PR_PAR_RUN(n, grain, work, fn, ...)                                                                 \
  do {                                                                                                      \
    const void *par_arg_ = (__VA_ARGS__);                                                                   \
    if (pr_par_nthreads == 1) fn(par_arg_, 0, (n));                                                         \
    else pr_par_for((n), (grain), (work), fn, par_arg_);                                                    \
  } while (0)
typedef struct PrEw {
  const float *x, *y, *dy; /* the inputs a kernel reads (y: the forward's output, for gradients) */
  float *out;
  float f0, f1;            /* a kernel's constants (LeakyRelu's alpha, Clip's bounds) */
  int op, acc;             /* k_unary's op; gradients: add to `out` */
} PrEw;
/* The range function `name` over [lo, hi), `body` the work of element i, with the PrEw's fields in scope. */
#define PR_EW_RANGE(name, body)                                                                             \
  PR_RANGE void name(const void *arg_, int64_t lo, int64_t hi) {                                            \
    const PrEw *e_ = (const PrEw *)arg_;                                                                    \
    const float *x = e_->x, *y = e_->y, *dy = e_->dy;                                                       \
    float *out = e_->out, f0 = e_->f0, f1 = e_->f1;                                                         \
    int op = e_->op, acc = e_->acc;                                                                         \
    (void)x, (void)y, (void)dy, (void)f0, (void)f1, (void)op, (void)acc;                                    \
    for (int64_t i = lo; i < hi; i++) { body }                                                              \
  }
/* Runs range function fn over n elements, `cost` elements' work each, the PrEw's fields given by name. */
#define PR_EW_FOR(fn, n, cost, ...) PR_PAR_RUN((n), PR_PAR_EW_GRAIN, (double)(n) * (cost), fn, &(PrEw){__VA_ARGS__})
/* A gradient's element: written, or added (acc). */
#define PR_GRAD_OUT(g) out[i] = acc ? out[i] + (g) : (g);

/* cblas_sgemm(CblasRowMajor, ...) cut into bands over the rank's threads (gemm.c). */
void pr_sgemm(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
              int ldb, float beta, float *C, int ldc);

/* ---- Gemm: Y = alpha * op(A) op(B) + beta * C, C broadcast from [cm, cn] ---- */
static inline void k_gemm(const float *A, const float *B, const float *C, float *Y, int M, int N, int K, int ta, int tb,
                          float alpha, float beta, int cm, int cn) {
  if (C && beta != 0) {
    /* C broadcast into Y: a row vector (a bias) in a loop of its own, so that it vectorises */
    if (cm == 1 && cn == N)
      for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) Y[(int64_t)i * N + j] = beta * C[j];
    else
      for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) Y[(int64_t)i * N + j] = beta * C[(int64_t)(cm == 1 ? 0 : i) * cn + (cn == 1 ? 0 : j)];
  }
  pr_sgemm(ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, ta ? M : K, B,
              tb ? K : N, C && beta != 0 ? 1.0f : 0.0f, Y, N);
}

/* dA = alpha * dY op(B)^T (shape of A: [M,K], or [K,M] when ta). */
static inline void k_gemm_dA(const float *dY, const float *B, float *dA, int M, int N, int K, int ta, int tb, float alpha,
                             int acc) {
  if (!ta) /* dA[M,K] = dY[M,N] . op(B)^T */
    pr_sgemm(CblasNoTrans, tb ? CblasNoTrans : CblasTrans, M, K, N, alpha, dY, N, B, tb ? K : N,
                acc ? 1.0f : 0.0f, dA, K);
  else /* dA[K,M] = op(B) . dY^T */
    pr_sgemm(tb ? CblasTrans : CblasNoTrans, CblasTrans, K, M, N, alpha, B, tb ? K : N, dY, N,
                acc ? 1.0f : 0.0f, dA, M);
}

/* dB = alpha * op(A)^T dY (shape of B: [K,N], or [N,K] when tb). */
static inline void k_gemm_dB(const float *dY, const float *A, float *dB, int M, int N, int K, int ta, int tb, float alpha,
                             int acc) {
  if (!tb) /* dB[K,N] = op(A)^T . dY */
    pr_sgemm(ta ? CblasNoTrans : CblasTrans, CblasNoTrans, K, N, M, alpha, A, ta ? M : K, dY, N,
                acc ? 1.0f : 0.0f, dB, N);
  else /* dB[N,K] = dY^T . op(A) */
    pr_sgemm(CblasTrans, ta ? CblasTrans : CblasNoTrans, N, K, M, alpha, dY, N, A, ta ? M : K,
                acc ? 1.0f : 0.0f, dB, K);
}

/* dC = beta * dY summed over the broadcast axes. */
static inline void k_gemm_dC(const float *dY, float *dC, int M, int N, int cm, int cn, float beta, int acc) {
  if (!acc) memset(dC, 0, sizeof(float) * (size_t)cm * (size_t)cn);
  if (cm == 1 && cn == N) { /* a bias: the column sums, rows in order, a vector of columns at a time */
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) dC[j] += beta * dY[(int64_t)i * N + j];
    return;
  }
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) dC[(int64_t)(cm == 1 ? 0 : i) * cn + (cn == 1 ? 0 : j)] += beta * dY[(int64_t)i * N + j];
}

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
/* Reshape, Flatten, Squeeze, Unsqueeze, Identity: the bytes do not change. */
static inline void k_copy(const float *x, float *y, int64_t n) {
  if (x != y) memcpy(y, x, sizeof(float) * (size_t)n);
}
PR_EW_RANGE(add_into_r, out[i] += dy[i];)
static inline void k_copy_grad(const float *dy, float *dx, int64_t n, int acc) {
  if (acc)
    PR_EW_FOR(add_into_r, n, 3, .dy = dy, .out = dx);
  else
    memcpy(dx, dy, sizeof(float) * (size_t)n);
}

/* ---- constant padding of any rank ---- */
typedef struct PadShape {
  int rank;
  int64_t in[8], out[8], begin[8];
  float value;
} PadShape;

/* Offset in y of the element of x at linear index i. */
static inline int64_t pad_offset(const PadShape *s, int64_t i) {
  int64_t off = 0, stride = 1;
  for (int d = s->rank - 1; d >= 0; d--) {
    off += (i % s->in[d] + s->begin[d]) * stride;
    i /= s->in[d];
    stride *= s->out[d];
  }
  return off;
}

static inline void k_pad(const float *x, float *y, const PadShape *s) {
  int64_t nx = 1, ny = 1;
  for (int d = 0; d < s->rank; d++) nx *= s->in[d], ny *= s->out[d];
  for (int64_t i = 0; i < ny; i++) y[i] = s->value;
  for (int64_t i = 0; i < nx; i++) y[pad_offset(s, i)] = x[i];
}

static inline void k_pad_grad(const float *dy, float *dx, const PadShape *s, int acc) {
  int64_t nx = 1;
  for (int d = 0; d < s->rank; d++) nx *= s->in[d];
  for (int64_t i = 0; i < nx; i++) dx[i] = acc ? dx[i] + dy[pad_offset(s, i)] : dy[pad_offset(s, i)];
}

/* ---- convolution (1-D, 2-D, 3-D) through im2col + GEMM ----
 * One kernel for every rank: the compiler puts 1-D and 2-D convolutions in
 * the last spatial slots (d = kd = od = 1 and, for 1-D, h = kh = oh = 1), so
 * the unit loops fold away in the specialised code and a 2-D convolution
 * performs exactly the arithmetic it did before 3-D existed. */
typedef struct ConvShape {
  int n, c, d, h, w;            /* input [n, c, d, h, w] */
  int m, kd, kh, kw, group;     /* weight [m, c/group, kd, kh, kw] */
  int od, oh, ow;               /* output */
  int sd, sh, sw, pd, ph, pw;   /* strides, begin pads */
  int dd, dh, dw;               /* dilations */
  int lib;                      /* 1: the compiler chose oneDNN for it (conv_dnnl.c, in a build with PR_DNNL) */
  int64_t lib_work;             /* bytes of the workspace (col) the compiler gave it */
} ConvShape;

#ifdef PR_DNNL
/* conv_dnnl.c: 0 when oneDNN ran the call, -1 when it cannot take the shape (im2col + GEMM then runs it). */
void pr_conv_lib_init(const char *blas_core, int threads);
int pr_conv_lib_fwd(const ConvShape *s, const float *x, const float *w, const float *b, float *y, float *work);
int pr_conv_lib_bwd_data(const ConvShape *s, const float *w, const float *dy, float *dx, int acc, float *work);
int pr_conv_lib_bwd_weights(const ConvShape *s, const float *x, const float *dy, float *dw, int acc, float *work);
#endif

PR_INLINE int64_t conv_in_sp(const ConvShape *s) { return (int64_t)s->d * s->h * s->w; }
PR_INLINE int conv_out_sp(const ConvShape *s) { return s->od * s->oh * s->ow; }

/* The outputs ox in [*lo, *hi) whose input column ox * sw - pw + kj * dw lies inside [0, w): the
 * padding's zeros are written, and col2im skips them, as whole spans rather than a test per element. */
PR_INLINE void conv_span(int ow, int sw, int off, int w, int *lo, int *hi) {
  int l = off >= 0 ? 0 : (-off + sw - 1) / sw;   /* first ox with ox * sw + off >= 0 */
  int h = w - off <= 0 ? 0 : (w - off + sw - 1) / sw; /* first ox with ox * sw + off >= w */
  *lo = l < ow ? l : ow;
  *hi = h < ow ? (h > *lo ? h : *lo) : ow;
}

/* col[(c/g)*kd*kh*kw, od*oh*ow] for one sample and group; zero where the window is in the padding. */
PR_INLINE void k_im2col(const float *x, float *col, const ConvShape *s) {
  int cg = s->c / s->group, sp = conv_out_sp(s);
  for (int ci = 0; ci < cg; ci++)
    for (int kz = 0; kz < s->kd; kz++)
      for (int ki = 0; ki < s->kh; ki++)
        for (int kj = 0; kj < s->kw; kj++) {
          float *row = col + ((((int64_t)ci * s->kd + kz) * s->kh + ki) * s->kw + kj) * sp;
          int off = kj * s->dw - s->pw, lo, hi;
          conv_span(s->ow, s->sw, off, s->w, &lo, &hi);
          for (int oz = 0; oz < s->od; oz++) {
            /* The depth test stays out of the inner loops, which then are the 2-D ones. */
            int iz = oz * s->sd - s->pd + kz * s->dd, zin = iz >= 0 && iz < s->d;
            const float *xz = x + ((int64_t)ci * s->d + (zin ? iz : 0)) * s->h * s->w;
            float *rz = row + (int64_t)oz * s->oh * s->ow;
            for (int oy = 0; oy < s->oh; oy++) {
              int iy = oy * s->sh - s->ph + ki * s->dh;
              float *r = rz + (int64_t)oy * s->ow;
              if (!zin || iy < 0 || iy >= s->h) {
                memset(r, 0, sizeof(float) * (size_t)s->ow);
                continue;
              }
              const float *xr = xz + (int64_t)iy * s->w; /* input column ox * sw + off */
              for (int ox = 0; ox < lo; ox++) r[ox] = 0;
              if (s->sw == 1) memcpy(r + lo, xr + lo + off, sizeof(float) * (size_t)(hi - lo));
              else
                for (int ox = lo; ox < hi; ox++) r[ox] = xr[(int64_t)ox * s->sw + off];
              for (int ox = hi; ox < s->ow; ox++) r[ox] = 0;
            }
          }
        }
}

/* dx += the columns' values at their inputs; each dx element gets its additions in the same order as
 * a test per element would give (the spans only skip the padding). */
PR_INLINE void k_col2im_add(const float *col, float *dx, const ConvShape *s) {
  int cg = s->c / s->group, sp = conv_out_sp(s);
  for (int ci = 0; ci < cg; ci++)
    for (int kz = 0; kz < s->kd; kz++)
      for (int ki = 0; ki < s->kh; ki++)
        for (int kj = 0; kj < s->kw; kj++) {
          const float *row = col + ((((int64_t)ci * s->kd + kz) * s->kh + ki) * s->kw + kj) * sp;
          int off = kj * s->dw - s->pw, lo, hi;
          conv_span(s->ow, s->sw, off, s->w, &lo, &hi);
          for (int oz = 0; oz < s->od; oz++) {
            int iz = oz * s->sd - s->pd + kz * s->dd;
            if (iz < 0 || iz >= s->d) continue;
            float *dz = dx + ((int64_t)ci * s->d + iz) * s->h * s->w;
            const float *rz = row + (int64_t)oz * s->oh * s->ow;
            for (int oy = 0; oy < s->oh; oy++) {
              int iy = oy * s->sh - s->ph + ki * s->dh;
              if (iy < 0 || iy >= s->h) continue;
              float *d = dz + (int64_t)iy * s->w; /* input column ox * sw + off */
              const float *r = rz + (int64_t)oy * s->ow;
              if (s->sw == 1) { /* restrict: col and dx never overlap, so the adds vectorise without a check */
                float *restrict dd = d + lo + off;
                const float *restrict rr = r + lo;
                for (int64_t k = 0; k < hi - lo; k++) dd[k] += rr[k];
              } else
                for (int ox = lo; ox < hi; ox++) d[(int64_t)ox * s->sw + off] += r[ox];
            }
          }
        }
}

/* ---- a convolution of one point ----
 * Input and output both one spatial point (ResNet-18's last stage at 32x32: 512 channels at 1x1,
 * 3x3 kernel, padding 1): only the kernel tap that lands on the point does any work, the rest see
 * the padding's zeros.  oneDNN and im2col still run all of them (oneDNN's weight gradient of that
 * shape took 4.5-5.6 ms against 0.1 ms of arithmetic, plus reorders of the whole 3x3 weight), so
 * these run as one GEMM per group over the tap's weights, which the workspace packs (the compiler
 * gives it (M/group) x (C/group) floats, ops/conv.c).  The tap: -1 when none lands on the point
 * (the output is then the bias alone). */
PR_INLINE int conv_is_point(const ConvShape *s) { return s->d == 1 && s->h == 1 && s->w == 1 && s->od == 1 && s->oh == 1 && s->ow == 1; }

PR_INLINE int conv_point_tap(const ConvShape *s) {
  const int k[3] = {s->kd, s->kh, s->kw}, p[3] = {s->pd, s->ph, s->pw}, d[3] = {s->dd, s->dh, s->dw};
  int t = 0;
  for (int i = 0; i < 3; i++) {
    if (p[i] % d[i] || p[i] / d[i] >= k[i]) return -1; /* input index 0 = -pad + tap * dilation */
    t = t * k[i] + p[i] / d[i];
  }
  return t;
}

/* wt[mi][ci] = w[g * mg + mi][ci][tap]. */
PR_INLINE void conv_point_pack(const float *w, float *wt, const ConvShape *s, int g, int tap) {
  int cg = s->c / s->group, mg = s->m / s->group, kk = s->kd * s->kh * s->kw;
  for (int mi = 0; mi < mg; mi++)
    for (int ci = 0; ci < cg; ci++) wt[(int64_t)mi * cg + ci] = w[((int64_t)(g * mg + mi) * cg + ci) * kk + tap];
}

PR_OUT_OF_LINE void k_conv_point(const float *x, const float *w, const float *b, float *y, float *wt, const ConvShape *s) {
  int cg = s->c / s->group, mg = s->m / s->group, tap = conv_point_tap(s);
  for (int g = 0; g < s->group && tap >= 0; g++) {
    conv_point_pack(w, wt, s, g, tap);
    pr_sgemm(CblasNoTrans, CblasTrans, s->n, mg, cg, 1.0f, x + (int64_t)g * cg, s->c, wt, cg, 0.0f, y + (int64_t)g * mg, s->m);
  }
  if (tap >= 0 && !b) return;
  for (int n = 0; n < s->n; n++)
    for (int o = 0; o < s->m; o++) y[(int64_t)n * s->m + o] = tap >= 0 ? y[(int64_t)n * s->m + o] + b[o] : b ? b[o] : 0.0f;
}

PR_OUT_OF_LINE void k_conv_point_grad(const float *x, const float *w, const float *dy, float *dx, float *dw, float *db, float *wt,
                                      const ConvShape *s, int acc_x, int acc_w) {
  int cg = s->c / s->group, mg = s->m / s->group, kk = s->kd * s->kh * s->kw, tap = conv_point_tap(s);
  if (dw && !acc_w) memset(dw, 0, sizeof(float) * (size_t)s->m * cg * kk);
  if (dx && !acc_x) memset(dx, 0, sizeof(float) * (size_t)s->n * s->c);
  if (db) {
    if (!acc_w) memset(db, 0, sizeof(float) * (size_t)s->m);
    for (int o = 0; o < s->m; o++) {
      float sum = 0;
      for (int n = 0; n < s->n; n++) sum += dy[(int64_t)n * s->m + o];
      db[o] += sum;
    }
  }
  for (int g = 0; g < s->group && tap >= 0; g++) {
    const float *dyg = dy + (int64_t)g * mg;
    if (dw) { /* the tap's gradient, then added at the tap */
      pr_sgemm(CblasTrans, CblasNoTrans, mg, cg, s->n, 1.0f, dyg, s->m, x + (int64_t)g * cg, s->c, 0.0f, wt, cg);
      for (int mi = 0; mi < mg; mi++)
        for (int ci = 0; ci < cg; ci++) dw[((int64_t)(g * mg + mi) * cg + ci) * kk + tap] += wt[(int64_t)mi * cg + ci];
    }
    if (dx) {
      conv_point_pack(w, wt, s, g, tap);
      pr_sgemm(CblasNoTrans, CblasNoTrans, s->n, cg, mg, 1.0f, dyg, s->m, wt, cg, 1.0f, dx + (int64_t)g * cg, s->c);
    }
  }
}

/* Out of line: oneDNN does the work (conv_dnnl.c), so specialising the im2col fallback on each call's
 * shape buys nothing (resnet50's stage: 11.3 s of clang inlined, 2.6 s not). */
PR_OUT_OF_LINE void k_conv(const float *x, const float *w, const float *b, float *y, float *col, const ConvShape *s) {
  if (conv_is_point(s)) {
    k_conv_point(x, w, b, y, col, s);
    return;
  }
#ifdef PR_DNNL
  if (s->lib && pr_conv_lib_fwd(s, x, w, b, y, col) == 0) return;
#endif
  int cg = s->c / s->group, mg = s->m / s->group, kk = cg * s->kd * s->kh * s->kw, sp = conv_out_sp(s);
  for (int n = 0; n < s->n; n++)
    for (int g = 0; g < s->group; g++) {
      const float *xg = x + ((int64_t)n * s->c + (int64_t)g * cg) * conv_in_sp(s);
      float *yg = y + ((int64_t)n * s->m + (int64_t)g * mg) * sp;
      k_im2col(xg, col, s);
      pr_sgemm(CblasNoTrans, CblasNoTrans, mg, sp, kk, 1.0f, w + (int64_t)g * mg * kk, kk, col, sp, 0.0f, yg, sp);
      if (b)
        for (int mi = 0; mi < mg; mi++)
          for (int p = 0; p < sp; p++) yg[(int64_t)mi * sp + p] += b[g * mg + mi];
    }
}

/* Gradients of a convolution: dw, db accumulate when acc_w; dx when acc_x.
 * dx or dw/db may be NULL when not needed. */
PR_OUT_OF_LINE void k_conv_grad(const float *x, const float *w, const float *dy, float *dx, float *dw, float *db, float *col,
                               const ConvShape *s, int acc_x, int acc_w) {
  if (conv_is_point(s)) {
    k_conv_point_grad(x, w, dy, dx, dw, db, col, s, acc_x, acc_w);
    return;
  }
  int cg = s->c / s->group, mg = s->m / s->group, kk = cg * s->kd * s->kh * s->kw, sp = conv_out_sp(s);
#ifdef PR_DNNL
  /* oneDNN takes dw and dx (a shape it refuses fails the first call, and then runs here whole). */
  if (s->lib && (dw ? pr_conv_lib_bwd_weights(s, x, dy, dw, acc_w, col) : dx ? pr_conv_lib_bwd_data(s, w, dy, dx, acc_x, col) : -1) == 0) {
    if (dw && dx) pr_conv_lib_bwd_data(s, w, dy, dx, acc_x, col);
    dw = dx = NULL;
  }
#endif
  if (dx && !acc_x) memset(dx, 0, sizeof(float) * (size_t)s->n * s->c * conv_in_sp(s));
  if (dw && !acc_w) memset(dw, 0, sizeof(float) * (size_t)s->m * kk);
  if (db && !acc_w) memset(db, 0, sizeof(float) * (size_t)s->m);
  for (int n = 0; n < s->n; n++)
    for (int g = 0; g < s->group; g++) {
      const float *xg = x + ((int64_t)n * s->c + (int64_t)g * cg) * conv_in_sp(s);
      const float *dyg = dy + ((int64_t)n * s->m + (int64_t)g * mg) * sp;
      if (dw) {
        k_im2col(xg, col, s);
        pr_sgemm(CblasNoTrans, CblasTrans, mg, kk, sp, 1.0f, dyg, sp, col, sp, 1.0f, dw + (int64_t)g * mg * kk, kk);
      }
      if (db)
        for (int mi = 0; mi < mg; mi++) {
          float sum = 0;
          for (int p = 0; p < sp; p++) sum += dyg[(int64_t)mi * sp + p];
          db[g * mg + mi] += sum;
        }
      if (dx) {
        pr_sgemm(CblasTrans, CblasNoTrans, kk, sp, mg, 1.0f, w + (int64_t)g * mg * kk, kk, dyg, sp, 0.0f, col, sp);
        k_col2im_add(col, dx + ((int64_t)n * s->c + (int64_t)g * cg) * conv_in_sp(s), s);
      }
    }
}

/* ---- pooling (1-D, 2-D, 3-D) ----
 * As for ConvShape, 1-D and 2-D windows sit in the last spatial slots with
 * unit sizes before them. */
typedef struct PoolShape {
  int n, c, d, h, w, od, oh, ow;
  int kd, kh, kw, sd, sh, sw, pd, ph, pw, dd, dh, dw;
  int ed, eh, ew;        /* end pads: count_include_pad counts a window only up to them */
  int count_include_pad; /* AveragePool */
} PoolShape;

/* Runs the statement given last with iz, iy, ix and k (the input's offset) for each input element
 * of output (oz, oy, ox)'s window in channel plane nc, skipping the padding. */
#define POOL_WINDOW(s, nc, oz, oy, ox, ...)                                         \
  for (int kz = 0; kz < (s)->kd; kz++) {                                            \
    int iz = (oz) * (s)->sd - (s)->pd + kz * (s)->dd;                               \
    if (iz < 0 || iz >= (s)->d) continue;                                           \
    for (int ki = 0; ki < (s)->kh; ki++) {                                          \
      int iy = (oy) * (s)->sh - (s)->ph + ki * (s)->dh;                             \
      if (iy < 0 || iy >= (s)->h) continue;                                         \
      for (int kj = 0; kj < (s)->kw; kj++) {                                        \
        int ix = (ox) * (s)->sw - (s)->pw + kj * (s)->dw;                           \
        if (ix < 0 || ix >= (s)->w) continue;                                       \
        int64_t k = (((nc) * (s)->d + iz) * (s)->h + iy) * (s)->w + ix;             \
        __VA_ARGS__                                                                 \
      }                                                                             \
    }                                                                               \
  }

/* Runs the statement given last for each output element of every channel
 * plane, in memory order: o is its offset. */
#define POOL_OUTPUTS(s, ...)                                                        \
  for (int64_t nc = 0; nc < (int64_t)(s)->n * (s)->c; nc++)                         \
    for (int oz = 0; oz < (s)->od; oz++)                                            \
      for (int oy = 0; oy < (s)->oh; oy++)                                          \
        for (int ox = 0; ox < (s)->ow; ox++) {                                      \
          int64_t o = ((nc * (s)->od + oz) * (s)->oh + oy) * (s)->ow + ox;          \
          __VA_ARGS__                                                               \
        }

PR_INLINE size_t pool_in_numel(const PoolShape *s) { return (size_t)s->n * s->c * s->d * s->h * s->w; }

PR_INLINE void k_maxpool(const float *x, float *y, const PoolShape *s) {
  POOL_OUTPUTS(s, {
    float best = -INFINITY;
    POOL_WINDOW(s, nc, oz, oy, ox, {
      if (x[k] > best || isnan(x[k])) best = x[k];
    });
    y[o] = best;
  })
}

/* The gradient goes to the first maximum of each window, or to its last NaN,
 * as PyTorch's index does (it takes a NaN whenever it sees one). */
PR_INLINE void k_maxpool_grad(const float *x, const float *dy, float *dx, const PoolShape *s, int acc) {
  if (!acc) memset(dx, 0, sizeof(float) * pool_in_numel(s));
  POOL_OUTPUTS(s, {
    float best = -INFINITY;
    int64_t at = -1;
    POOL_WINDOW(s, nc, oz, oy, ox, {
      if (at < 0 || x[k] > best || isnan(x[k])) best = x[k], at = k;
    });
    if (at >= 0) dx[at] += dy[o];
  })
}

/* How many of a window's k taps (dilation dl) from padded position at come before limit. */
PR_INLINE int pool_taps(int at, int k, int dl, int limit) {
  int t = (limit - at + dl - 1) / dl;
  return t < k ? t : k;
}

/* The divisor of output (oz, oy, ox): with count_include_pad, the window's
 * elements inside the padded input (all of them, unless ceil_mode let the
 * last window run past the end pad: PyTorch and ONNX's reference clip it
 * there); without, its elements inside the input. */
PR_INLINE int pool_count(const PoolShape *s, int oz, int oy, int ox) {
  if (s->count_include_pad)
    return pool_taps(oz * s->sd, s->kd, s->dd, s->pd + s->d + s->ed) * pool_taps(oy * s->sh, s->kh, s->dh, s->ph + s->h + s->eh) *
           pool_taps(ox * s->sw, s->kw, s->dw, s->pw + s->w + s->ew);
  int c = 0;
  POOL_WINDOW(s, 0, oz, oy, ox, { (void)k, c++; });
  return c ? c : 1;
}

PR_INLINE void k_avgpool(const float *x, float *y, const PoolShape *s) {
  POOL_OUTPUTS(s, {
    float sum = 0;
    POOL_WINDOW(s, nc, oz, oy, ox, { sum += x[k]; });
    y[o] = sum / (float)pool_count(s, oz, oy, ox);
  })
}

PR_INLINE void k_avgpool_grad(const float *dy, float *dx, const PoolShape *s, int acc) {
  if (!acc) memset(dx, 0, sizeof(float) * pool_in_numel(s));
  POOL_OUTPUTS(s, {
    float g = dy[o] / (float)pool_count(s, oz, oy, ox);
    POOL_WINDOW(s, nc, oz, oy, ox, { dx[k] += g; });
  })
}

/* ---- sums in eight lanes ----
 * A sum in one running total is a chain of dependent adds that no compiler may vectorise.  These keep
 * eight totals, element k going to lane k % 8, and add the lanes in a fixed tree at the end: the order is
 * fixed by the length alone, so every rank that runs a kernel gets the same bits, at vector speed. */
static inline float pr_lanes_total(const float *l) {
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}
static inline float pr_sum8(const float *x, int64_t n) {
  float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int j = 0; j < 8; j++) l[j] += x[k + j];
  float t = pr_lanes_total(l);
  for (; k < n; k++) t += x[k];
  return t;
}
static inline float pr_dot8(const float *x, const float *y, int64_t n) {
  float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int j = 0; j < 8; j++) l[j] += x[k + j] * y[k + j];
  float t = pr_lanes_total(l);
  for (; k < n; k++) t += x[k] * y[k];
  return t;
}

/* ---- elementwise binary ops with numpy broadcasting ---- */
enum { BIN_ADD = 0, BIN_SUB = 1, BIN_MUL = 2, BIN_DIV = 3, BIN_POW = 4, BIN_MAX = 5, BIN_MIN = 6 };
enum { BIN_MUL_SELF = 100 }; /* kernels.h's own: pow with the exponent 2 */
typedef struct BcastShape {
  int rank;
  int64_t out[8];      /* output dims */
  int64_t sa[8], sb[8]; /* strides of a and b in output coordinates (0 on broadcast axes) */
  int64_t na, nb, ny;  /* element counts */
} BcastShape;

static inline int64_t bcast_at(const BcastShape *s, const int64_t *st, int64_t i) {
  int64_t off = 0;
  for (int d = s->rank - 1; d >= 0; d--) {
    off += (i % s->out[d]) * st[d];
    i /= s->out[d];
  }
  return off;
}

static inline float bin_apply(int op, float a, float b) {
  switch (op) {
  case BIN_ADD: return a + b;
  case BIN_SUB: return a - b;
  case BIN_MUL: return a * b;
  case BIN_DIV: return a / b;
  case BIN_MAX: return a > b || a != a ? a : b; /* a NaN on either side wins, as torch.maximum */
  case BIN_MIN: return a < b || a != a ? a : b;
  default: return b == 2.0f ? a * a : powf(a, b); /* x**2 as x*x: exact either way, and far cheaper */
  }
}

/* The broadcasting kernels proper are in broadcast.c, compiled once per build rather than in every
 * stage program. */
void k_binary(int op, const float *a, const float *b, float *y, const BcastShape *s);
/* Gradient for input `which` (0 = a, 1 = b) of k_binary's op, summed over its broadcast axes; a or b is
 * NULL where the op's gradient does not read it.  d accumulates when acc. */
void k_binary_grad(int op, int which, const float *a, const float *b, const float *dy, float *d, const BcastShape *s, int acc);

/* ---- batch normalization over N and the spatial axes, per channel ---- */
typedef struct BnShape {
  int64_t n, c, sp;   /* [n, c, sp] */
  float eps;
  double momentum;    /* ONNX momentum: running = running * momentum + batch * (1 - momentum), in double as PyTorch */
  int relu;           /* a Relu fused after it (compiler/fuse.c): y = relu(bn(x)), and dy is masked by y */
  int training;       /* last: stash.c's stash_bn_training reads it there */
} BnShape;

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

/* ---- more elementwise ---- */
/* erf eight at a time through glibc's vector libm (libmvec, glibc >= 2.35: at most 4 ulp from the
 * correctly rounded value, tests/test_kernels.c checks it against erff over the whole float range);
 * the tail and other targets use erff.  The same elements go the same way whatever the cut. */
#if defined(PR_MVEC) && defined(__AVX2__)
typedef float pr_v8sf __attribute__((vector_size(32), aligned(4)));
typedef float pr_v8sf_a __attribute__((vector_size(32)));
pr_v8sf_a _ZGVdN8v_erff(pr_v8sf_a);
pr_v8sf_a _ZGVdN8v_expf(pr_v8sf_a);
#endif
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

/* ---- Where(cond, x, y) with broadcasting; cond is bool (uint8) ---- */
typedef struct WhereShape {
  int rank;
  int64_t out[8], sc[8], sx[8], sy[8];
  int64_t nx, ny, nout;
} WhereShape;

/* Where walks the output a row (its last axis) at a time: the offsets of c, x and y are found once
 * per row from an odometer over the other axes, and the row runs with the last axis' strides (0 for
 * a broadcast operand).  The output is visited in order, so a broadcast operand's gradient sums its
 * contributions in the order it always did. */
static inline void where_row(const WhereShape *s, const int64_t *idx, int64_t *oc, int64_t *ox, int64_t *oy) {
  *oc = *ox = *oy = 0;
  for (int d = 0; d < s->rank - 1; d++) *oc += idx[d] * s->sc[d], *ox += idx[d] * s->sx[d], *oy += idx[d] * s->sy[d];
}
static inline int where_next(const WhereShape *s, int64_t *idx) {
  for (int d = s->rank - 2; d >= 0; d--) {
    if (++idx[d] < s->out[d]) return 1;
    idx[d] = 0;
  }
  return 0;
}
static inline void k_where(const uint8_t *c, const float *x, const float *y, float *out, const WhereShape *s) {
  if (s->rank == 0) {
    out[0] = c[0] ? x[0] : y[0];
    return;
  }
  int last = s->rank - 1;
  int64_t L = s->out[last], tc = s->sc[last], tx = s->sx[last], ty = s->sy[last], idx[8] = {0}, oc, ox, oy;
  float *o = out;
  do {
    where_row(s, idx, &oc, &ox, &oy);
    for (int64_t k = 0; k < L; k++) o[k] = c[oc + k * tc] ? x[ox + k * tx] : y[oy + k * ty];
    o += L;
  } while (where_next(s, idx));
}
/* which = 1: gradient of x, 2: of y. */
static inline void k_where_grad(const uint8_t *c, const float *dout, float *d, int which, const WhereShape *s, int acc) {
  if (!acc) memset(d, 0, sizeof(float) * (size_t)(which == 1 ? s->nx : s->ny));
  if (s->rank == 0) {
    if ((c[0] != 0) == (which == 1)) d[0] += dout[0];
    return;
  }
  int last = s->rank - 1, want = which == 1;
  int64_t L = s->out[last], tc = s->sc[last], td = which == 1 ? s->sx[last] : s->sy[last], idx[8] = {0}, oc, ox, oy;
  const float *g = dout;
  do {
    where_row(s, idx, &oc, &ox, &oy);
    float *dr = d + (which == 1 ? ox : oy);
    for (int64_t k = 0; k < L; k++)
      if ((c[oc + k * tc] != 0) == want) dr[k * td] += g[k];
    g += L;
  } while (where_next(s, idx));
}

/* ---- MatMul with numpy semantics: batch dims broadcast ---- */
typedef struct MatMulShape {
  int64_t batch;          /* output batch count */
  int64_t M, N, K;
  int nb;                 /* batch rank */
  int64_t bdims[6], sa[6], sb[6]; /* output batch dims; A/B matrix strides per batch axis (0 = broadcast) */
  int b_shared;           /* B is one matrix for every batch: fold the batch into M */
} MatMulShape;

static inline void mm_offsets(const MatMulShape *s, int64_t b, int64_t *oa, int64_t *ob) {
  *oa = *ob = 0;
  for (int d = s->nb - 1; d >= 0; d--) {
    int64_t i = b % s->bdims[d];
    b /= s->bdims[d];
    *oa += i * s->sa[d], *ob += i * s->sb[d];
  }
}

/* Whether each batch has a matrix of its own in the operand with strides st (none broadcast): then the
 * batches' gradients for it go to separate places and may be computed on separate threads. */
static inline int mm_own(const MatMulShape *s, const int64_t *st) {
  for (int d = 0; d < s->nb; d++)
    if (st[d] == 0 && s->bdims[d] > 1) return 0;
  return 1;
}
/* Batches [lo, hi) of a batched product: the forward (which 0), dA (1) or dB (2), one GEMM each. */
typedef struct PrMatMul {
  const MatMulShape *s;
  const float *x, *w; /* forward: A, B; dA: dY, B; dB: dY, A */
  float *out;
  int which;
} PrMatMul;
PR_RANGE void matmul_r(const void *arg, int64_t lo, int64_t hi) {
  const PrMatMul *m = (const PrMatMul *)arg;
  const MatMulShape *s = m->s;
  int M = (int)s->M, N = (int)s->N, K = (int)s->K;
  for (int64_t b = lo; b < hi; b++) {
    int64_t oa, ob;
    mm_offsets(s, b, &oa, &ob);
    if (m->which == 0)
      pr_sgemm(CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, m->x + oa * M * K, K, m->w + ob * K * N, N, 0.0f, m->out + b * M * N, N);
    else if (m->which == 1)
      pr_sgemm(CblasNoTrans, CblasTrans, M, K, N, 1.0f, m->x + b * M * N, N, m->w + ob * K * N, N, 1.0f, m->out + oa * M * K, K);
    else
      pr_sgemm(CblasTrans, CblasNoTrans, K, N, M, 1.0f, m->w + oa * M * K, K, m->x + b * M * N, N, 1.0f, m->out + ob * K * N, N);
  }
}
/* The batches over the rank's threads where each writes its own matrix (par.h); else in order, one
 * thread, each GEMM still cut by gemm.c. */
static inline void matmul_run(const MatMulShape *s, const float *x, const float *w, float *out, int which, int split) {
  PrMatMul m = {s, x, w, out, which};
  if (split) PR_PAR_RUN(s->batch, 1, 2.0 * (double)s->batch * (double)s->M * (double)s->N * (double)s->K, matmul_r, &m);
  else matmul_r(&m, 0, s->batch);
}
static inline void k_matmul(const float *A, const float *B, float *Y, const MatMulShape *s) {
  if (s->b_shared) {
    pr_sgemm(CblasNoTrans, CblasNoTrans, (int)(s->batch * s->M), (int)s->N, (int)s->K, 1.0f, A, (int)s->K, B,
                (int)s->N, 0.0f, Y, (int)s->N);
    return;
  }
  matmul_run(s, A, B, Y, 0, 1);
}

/* dA = dY B^T (summed over batches that share an A), acc as usual. */
static inline void k_matmul_dA(const float *dY, const float *B, float *dA, int64_t na, const MatMulShape *s, int acc) {
  if (s->b_shared) {
    pr_sgemm(CblasNoTrans, CblasTrans, (int)(s->batch * s->M), (int)s->K, (int)s->N, 1.0f, dY, (int)s->N, B,
                (int)s->N, acc ? 1.0f : 0.0f, dA, (int)s->K);
    return;
  }
  if (!acc) memset(dA, 0, sizeof(float) * (size_t)na);
  matmul_run(s, dY, B, dA, 1, mm_own(s, s->sa));
}

/* dB = A^T dY, summed over the batches that share a B. */
static inline void k_matmul_dB(const float *dY, const float *A, float *dB, int64_t nbel, const MatMulShape *s, int acc) {
  if (s->b_shared) {
    pr_sgemm(CblasTrans, CblasNoTrans, (int)s->K, (int)s->N, (int)(s->batch * s->M), 1.0f, A, (int)s->K, dY,
                (int)s->N, acc ? 1.0f : 0.0f, dB, (int)s->N);
    return;
  }
  if (!acc) memset(dB, 0, sizeof(float) * (size_t)nbel);
  matmul_run(s, dY, A, dB, 2, mm_own(s, s->sb));
}

/* ---- Transpose (any rank) ---- */
typedef struct PermShape {
  int rank;
  int64_t out[8];   /* output dims */
  int64_t st[8];    /* input stride along each output axis */
  int64_t n;
} PermShape;

/* One pass over a permutation, both directions: y[i] = x[at(i)] (fwd), or dx[at(i)] (+)= dy[i] (grad).
 * The output is walked in order, its last axis innermost.  Where that axis reads the input with a
 * stride and another output axis q reads it contiguously (a true transpose, K^T of attention), the
 * two are walked in 32x32 tiles so both sides stay in cache; a contiguous last axis is a row copy.
 * Every element moves once, so the order changes no bits. */
#define PERM_TILE 32
/* Elements [la, lb) of one output row yo, whose input elements are xi[l * sl]. */
static inline void perm_row(float *yo, float *xi, int64_t la, int64_t lb, int64_t sl, int grad, int acc) {
  if (!grad) {
    if (sl == 1) memcpy(yo + la, xi + la, sizeof(float) * (size_t)(lb - la));
    else for (int64_t l = la; l < lb; l++) yo[l] = xi[l * sl];
  } else if (acc) {
    for (int64_t l = la; l < lb; l++) xi[l * sl] += yo[l];
  } else {
    if (sl == 1) memcpy(xi + la, yo + la, sizeof(float) * (size_t)(lb - la));
    else for (int64_t l = la; l < lb; l++) xi[l * sl] = yo[l];
  }
}
/* Output indices [lo, hi) of the first output axis (all of them when the first axis is the tiled one,
 * or the last): each output element, and each input element it reads, belongs to one index of it. */
static inline void perm_walk(const PermShape *s, float *x, float *y, int grad, int acc, int64_t lo, int64_t hi) {
  int r = s->rank, last = r - 1, q = -1;
  int64_t ost[8], idx[8] = {0};
  if (r == 0 || s->n == 0 || lo >= hi) return;
  ost[last] = 1;
  for (int d = last - 1; d >= 0; d--) ost[d] = ost[d + 1] * s->out[d + 1];
  if (s->st[last] != 1)
    for (int d = 0; d < last; d++)
      if (s->st[d] == 1 && s->out[d] > 1) q = d;
  int64_t nl = s->out[last], sl = s->st[last];
  int split = last > 0 && q != 0; /* the range is over axis 0 */
  if (split) idx[0] = lo;
  for (;;) {
    int64_t ib = 0, ob = 0;
    for (int d = 0; d < last; d++) ib += idx[d] * s->st[d], ob += idx[d] * ost[d];
    if (q < 0)
      perm_row(y + ob, x + ib, 0, nl, sl, grad, acc);
    else /* axis q reads the input contiguously: tiles of q x last */
      for (int64_t q0 = 0; q0 < s->out[q]; q0 += PERM_TILE)
        for (int64_t l0 = 0; l0 < nl; l0 += PERM_TILE) {
          int64_t q1 = q0 + PERM_TILE < s->out[q] ? q0 + PERM_TILE : s->out[q], l1 = l0 + PERM_TILE < nl ? l0 + PERM_TILE : nl;
          for (int64_t qi = q0; qi < q1; qi++) perm_row(y + ob + qi * ost[q], x + ib + qi, l0, l1, sl, grad, acc);
        }
    /* the next index over the output axes before the last, q excepted */
    int d = last - 1;
    for (; d >= 0; d--) {
      if (d == q) continue;
      if (++idx[d] < (split && d == 0 ? hi : s->out[d])) break;
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}
typedef struct PrPerm {
  const PermShape *s;
  float *x, *y;
  int grad, acc;
} PrPerm;
PR_RANGE void perm_r(const void *arg, int64_t lo, int64_t hi) {
  const PrPerm *p = (const PrPerm *)arg;
  perm_walk(p->s, p->x, p->y, p->grad, p->acc, lo, hi);
}
/* Split over the first output axis where it is not the tiled one (par.h). */
static inline void perm_run(const PermShape *s, float *x, float *y, int grad, int acc) {
  int parts = s->rank > 1 && !(s->st[s->rank - 1] != 1 && s->st[0] == 1 && s->out[0] > 1);
  if (!parts) perm_walk(s, x, y, grad, acc, 0, 1);
  else PR_PAR_RUN(s->out[0], 1, (double)s->n * 2, perm_r, &(PrPerm){s, x, y, grad, acc});
}
static inline void k_transpose(const float *x, float *y, const PermShape *s) { perm_run(s, (float *)x, y, 0, 0); }
static inline void k_transpose_grad(const float *dy, float *dx, const PermShape *s, int acc) {
  perm_run(s, dx, (float *)dy, 1, acc);
}

/* ---- Split / slices along one axis: [outer, axis, inner] ---- */
typedef struct PrTake {
  const float *x;
  float *y;
  int64_t axis, inner, start, len;
  int grad;
} PrTake;
/* Outer indices [lo, hi): a copy of each slice, or (grad) dy added into its place in x. */
PR_RANGE void take_r(const void *arg, int64_t lo, int64_t hi) {
  const PrTake *t = (const PrTake *)arg;
  int64_t n = t->len * t->inner;
  for (int64_t o = lo; o < hi; o++) {
    float *in = (float *)t->x + (o * t->axis + t->start) * t->inner, *sl = t->y + o * n;
    if (!t->grad) memcpy(sl, in, sizeof(float) * (size_t)n);
    else for (int64_t k = 0; k < n; k++) in[k] += sl[k];
  }
}
static inline void k_take(const float *x, float *y, int64_t outer, int64_t axis, int64_t inner, int64_t start, int64_t len) {
  PR_PAR_RUN(outer, 1, (double)outer * (double)len * (double)inner * 2, take_r, &(PrTake){x, y, axis, inner, start, len, 0});
}
/* Adds dy into its place in dx (dx zeroed by the caller's first call when needed). */
static inline void k_take_grad(const float *dy, float *dx, int64_t outer, int64_t axis, int64_t inner, int64_t start, int64_t len) {
  PR_PAR_RUN(outer, 1, (double)outer * (double)len * (double)inner * 3, take_r, &(PrTake){dx, (float *)dy, axis, inner, start, len, 1});
}
static inline void k_zero(float *x, int64_t n) { memset(x, 0, sizeof(float) * (size_t)n); }

/* ---- strided views: Slice, Expand, Tile ----
 * y[i] = x[base + sum_d idx_d(i) * st[d]] over y's dims `out`.  A Slice has
 * its steps (negative when it walks backwards) times x's strides; Expand has
 * stride 0 on broadcast axes; Tile reads x as [r0, d0, r1, d1, ...] with stride
 * 0 on each repeat axis (16 axes: two per axis of a rank-8 input). */
typedef struct ViewShape {
  int rank;
  int64_t out[16]; /* output dims */
  int64_t st[16];  /* input stride along each output axis */
  int64_t base;    /* input offset of output element 0 */
  int64_t n, nx;   /* output and input element counts */
} ViewShape;

/* Input offset of the first element of output row r (a row: the last axis). */
static inline int64_t view_row(const ViewShape *s, int64_t r) {
  int64_t off = s->base;
  for (int d = s->rank - 2; d >= 0; d--) {
    off += (r % s->out[d]) * s->st[d];
    r /= s->out[d];
  }
  return off;
}
static inline void k_view(const float *x, float *y, const ViewShape *s) {
  int64_t len = s->out[s->rank - 1], step = s->st[s->rank - 1];
  for (int64_t r = 0; r < s->n / len; r++) {
    const float *src = x + view_row(s, r);
    for (int64_t k = 0; k < len; k++) y[r * len + k] = src[k * step];
  }
}
/* The adjoint: dx = 0 (acc = 0), then dy added at the element each output
 * read, in output order.  A Slice reads each element at most once; Expand
 * and Tile sum over the copies, so dx holds the sum over broadcast axes or
 * tiles. */
static inline void k_view_grad(const float *dy, float *dx, const ViewShape *s, int acc) {
  int64_t len = s->out[s->rank - 1], step = s->st[s->rank - 1];
  if (!acc) memset(dx, 0, sizeof(float) * (size_t)s->nx);
  for (int64_t r = 0; r < s->n / len; r++) {
    float *dst = dx + view_row(s, r);
    for (int64_t k = 0; k < len; k++) dst[k * step] += dy[r * len + k];
  }
}

/* ---- Cast to and from float32 at run time ----
 * Training values are float32 or int64; an inference program (--forward-only)
 * also reads bool, int32 and float16 inputs.  Buffers of those types are
 * declared float in the generated C, hence `const void *`. */
static inline void k_cast_i64_f32(const int64_t *x, float *y, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = (float)x[i];
}
static inline void k_cast_i32_f32(const void *x, float *y, int64_t n) {
  const int32_t *v = (const int32_t *)x;
  for (int64_t i = 0; i < n; i++) y[i] = (float)v[i];
}
static inline void k_cast_bool_f32(const void *x, float *y, int64_t n) {
  const uint8_t *v = (const uint8_t *)x;
  for (int64_t i = 0; i < n; i++) y[i] = v[i] ? 1.0f : 0.0f;
}
/* IEEE half to float, exactly (every half is a float): subnormals, infinities, NaN. */
static inline float pr_half_to_float(uint16_t h) {
  int e = h >> 10 & 0x1f, m = h & 0x3ff;
  float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 0x400), e - 25);
  return h >> 15 ? -v : v;
}
static inline void k_cast_f16_f32(const void *x, float *y, int64_t n) {
  const uint16_t *v = (const uint16_t *)x;
  for (int64_t i = 0; i < n; i++) y[i] = pr_half_to_float(v[i]);
}
/* Truncation toward zero, as numpy's astype and torch's .long(); NaN and
 * values outside int64 give INT64_MIN, what both give on x86 (and no
 * undefined behaviour here). */
static inline void k_cast_f32_i64(const float *x, int64_t *y, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = x[i] >= -0x1p63f && x[i] < 0x1p63f ? (int64_t)x[i] : INT64_MIN;
}

/* ---- ReduceMean / ReduceSum over a set of axes ---- */
typedef struct ReduceShape {
  int rank;
  int64_t in[8];
  int mask;        /* reduced axes */
  int64_t n, nout;
  float scale;     /* 1/count for the mean, 1 for the sum */
} ReduceShape;

static inline int64_t reduce_at(const ReduceShape *s, int64_t i) {
  int64_t out = 0, mul = 1;
  for (int d = s->rank - 1; d >= 0; d--) {
    int64_t c = i % s->in[d];
    i /= s->in[d];
    if (!(s->mask >> d & 1)) out += c * mul, mul *= s->in[d];
  }
  return out;
}
/* A reduction over trailing axes (a norm's mean over the features) sums each output's contiguous run in
 * lanes (pr_sum8); any other in input order. */
static inline void k_reduce(const float *x, float *y, const ReduceShape *s) {
  int t = 0; /* the reduced axes are the last t, and only they */
  while (t < s->rank && (s->mask >> (s->rank - 1 - t) & 1)) t++;
  if (t > 0 && s->mask == ((1 << s->rank) - 1) - ((1 << (s->rank - t)) - 1)) {
    int64_t inner = s->n / s->nout;
    for (int64_t o = 0; o < s->nout; o++) y[o] = pr_sum8(x + o * inner, inner) * s->scale;
    return;
  }
  memset(y, 0, sizeof(float) * (size_t)s->nout);
  for (int64_t i = 0; i < s->n; i++) y[reduce_at(s, i)] += x[i];
  for (int64_t o = 0; o < s->nout; o++) y[o] *= s->scale;
}
static inline void k_reduce_grad(const float *dy, float *dx, const ReduceShape *s, int acc) {
  for (int64_t i = 0; i < s->n; i++) {
    float g = dy[reduce_at(s, i)] * s->scale;
    dx[i] = acc ? dx[i] + g : g;
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

/* ---- Gather on axis 0: embedding lookup; its gradient is a scatter-add ---- */
static inline void k_gather(const float *table, const int64_t *idx, float *y, int64_t n, int64_t rows, int64_t width) {
  for (int64_t i = 0; i < n; i++) {
    int64_t r = idx[i] < 0 ? idx[i] + rows : idx[i];
    memcpy(y + i * width, table + r * width, sizeof(float) * (size_t)width);
  }
}
static inline void k_gather_grad(const int64_t *idx, const float *dy, float *dtable, int64_t n, int64_t rows, int64_t width) {
  for (int64_t i = 0; i < n; i++) {
    int64_t r = idx[i] < 0 ? idx[i] + rows : idx[i];
    for (int64_t k = 0; k < width; k++) dtable[r * width + k] += dy[i * width + k];
  }
}

/* ---- the loss ---- */
/* Softmax cross-entropy over `rows` rows of `classes` logits with integer
 * labels.  Returns the SUM of the rows' losses (the caller divides); writes
 * dlogits = (softmax - onehot) * scale. */
static inline double k_softmax_xent(const float *logits, const int64_t *labels, float *dlogits, int64_t rows, int classes,
                                    float scale) {
  double total = 0;
  for (int64_t r = 0; r < rows; r++) {
    const float *z = logits + r * classes;
    float mx = z[0];
    for (int k = 1; k < classes; k++) mx = z[k] > mx ? z[k] : mx;
    float sum = 0;
    for (int k = 0; k < classes; k++) sum += expf(z[k] - mx);
    float lse = mx + logf(sum);
    total += (double)(lse - z[labels[r]]);
    for (int k = 0; k < classes; k++) {
      float p = expf(z[k] - lse);
      dlogits[r * classes + k] = (p - (k == labels[r] ? 1.0f : 0.0f)) * scale;
    }
  }
  return total;
}

/* Mean squared error against the one-hot encoding of integer labels (PyTorch's
 * F.mse_loss(logits, one_hot(labels)), mean over every element).  Returns the
 * sum over this micro-batch's elements; dlogits = 2 (z - t) * scale. */
static inline double k_mse_onehot(const float *logits, const int64_t *labels, float *dlogits, int64_t rows, int classes, float scale) {
  double total = 0;
  for (int64_t r = 0; r < rows; r++)
    for (int k = 0; k < classes; k++) {
      float d = logits[r * classes + k] - (k == labels[r] ? 1.0f : 0.0f);
      total += (double)d * d;
      dlogits[r * classes + k] = 2.0f * d * scale;
    }
  return total;
}

/* The stage program's MSE loss: k_mse_onehot's sum over the classes' mean (the runtime divides by the rows). */
static inline double k_mse_loss(const float *logits, const int64_t *labels, float *dlogits, int64_t rows, int classes, float scale) {
  return k_mse_onehot(logits, labels, dlogits, rows, classes, scale) / classes;
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

/* ---- Concat at run time: each input is put into its slice of the output ---- */
/* The inverse of k_take: x [outer, len, inner] goes to y's slice [start,
 * start + len) along an axis of size `axis` ([outer, axis, inner]).  The K
 * inputs of a Concat cover y, so y needs no zeroing. */
PR_OUT_OF_LINE void k_put(const float *x, float *y, int64_t outer, int64_t axis, int64_t inner, int64_t start, int64_t len) {
  for (int64_t o = 0; o < outer; o++) memcpy(y + (o * axis + start) * inner, x + o * len * inner, sizeof(float) * (size_t)(len * inner));
}
/* Concat's gradient for one input: dx [outer, len, inner] = dy's slice, written
 * (acc = 0, the same as k_take(dy, dx, ...)) or added (acc = 1).  k_take_grad
 * is NOT this: it scatters a small dy INTO a slice of a large dx (Split's
 * gradient), the opposite direction, and always adds. */
PR_OUT_OF_LINE void k_put_grad(const float *dy, float *dx, int64_t outer, int64_t axis, int64_t inner, int64_t start, int64_t len,
                              int acc) {
  if (!acc) {
    k_take(dy, dx, outer, axis, inner, start, len);
    return;
  }
  for (int64_t o = 0; o < outer; o++)
    for (int64_t k = 0; k < len * inner; k++) dx[o * len * inner + k] += dy[(o * axis + start) * inner + k];
}

/* ---- Dropout: masks from a counter-based generator ----
 *
 * Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as
 * easy as 1, 2, 3", SC 2011; Random123's reference): a keyed bijection of a
 * 128-bit counter, so any element's random number is computed from where it
 * is - no stream state to carry between actions, ranks or micro-batches.
 * Element e of Dropout node `node` (its index in the ONNX graph, fixed at
 * compile time) in step `step` reads lane e % 4 of
 *   philox(counter = {e / 4 (64 bits), node, step}, key = the run's --seed),
 * where e = mb * n + i counts across the step's micro-batches (so a
 * batch-major tensor gets the same mask for any --microbatches too).  Where a
 * micro-batch runs (-n, schedule, rank) does not enter: masks are identical.
 * PyTorch's own stream is not reproduced (README.md says why). */
typedef struct RandCtx {
  uint64_t seed; /* the run's --seed: Philox's key */
  int64_t step;  /* the optimizer step being run, from 0 (the counter keeps its low 32 bits) */
  int64_t mb;    /* the micro-batch of the action being run */
} RandCtx;

/* Ten rounds of Philox4x32 on ctr, in place (Random123's philox4x32_R(10, ...)). */
static inline void k_philox4x32_10(uint32_t ctr[4], uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 10; r++) {
    if (r) k0 += 0x9E3779B9u, k1 += 0xBB67AE85u; /* the key schedule: bumped before rounds 2..10 */
    uint64_t p0 = (uint64_t)0xD2511F53u * ctr[0], p1 = (uint64_t)0xCD9E8D57u * ctr[2];
    uint32_t c1 = ctr[1], c3 = ctr[3];
    ctr[0] = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
    ctr[1] = (uint32_t)p1;
    ctr[2] = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    ctr[3] = (uint32_t)p0;
  }
}

/* An element is kept when its 32-bit draw is at least ratio * 2^32: P(keep) = 1 - ratio. */
static inline uint64_t k_dropout_threshold(float ratio) {
  return ratio >= 1 ? (uint64_t)1 << 32 : ratio <= 0 ? 0 : (uint64_t)((double)ratio * 4294967296.0);
}
/* PyTorch's CPU dropout multiplies by a noise tensor holding 1 / (1 - p) computed in float. */
static inline float k_dropout_scale(float ratio) { return ratio >= 1 ? 0.0f : 1.0f / (float)(1.0 - (double)ratio); }

/* The factors of the step's elements 4 * block .. 4 * block + 3: scale where kept, 0 where dropped. */
static inline void k_dropout_block(const RandCtx *rc, int64_t node, uint64_t block, uint64_t thr, float scale, float f[4]) {
  uint32_t c[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)node, (uint32_t)rc->step};
  k_philox4x32_10(c, (uint32_t)rc->seed, (uint32_t)(rc->seed >> 32));
  for (int l = 0; l < 4; l++) f[l] = c[l] >= thr ? scale : 0.0f;
}

/* y = x * mask * 1/(1 - ratio) over one micro-batch's n values (mask: NULL, or the kept flags as bytes).
 * A dropped element is x * 0, not 0, as PyTorch's x * noise (NaN stays NaN). */
static inline void k_dropout(const float *x, float *y, uint8_t *mask, int64_t n, float ratio, int64_t node, const RandCtx *rc) {
  uint64_t thr = k_dropout_threshold(ratio);
  float scale = k_dropout_scale(ratio), f[4] = {scale, scale, scale, scale};
  uint64_t e0 = (uint64_t)(rc->mb * n);
  for (int64_t i = 0; i < n; i++) {
    uint64_t e = e0 + (uint64_t)i;
    if (thr && (i == 0 || e % 4 == 0)) k_dropout_block(rc, node, e / 4, thr, scale, f); /* ratio 0 keeps all: no draws */
    y[i] = x[i] * f[e % 4];
    if (mask) mask[i] = f[e % 4] != 0;
  }
}

/* dx = dy * mask * 1/(1 - ratio).  The mask is drawn again rather than kept:
 * a stashed byte mask costs n bytes per micro-batch in flight on every
 * Dropout (1F1B keeps up to n_stages micro-batches, GPipe all of them), while
 * a redraw is one Philox call per 4 elements, small beside the matrix
 * products around a Dropout, and needs no memory at all. */
static inline void k_dropout_grad(const float *dy, float *dx, int64_t n, float ratio, int64_t node, const RandCtx *rc, int acc) {
  uint64_t thr = k_dropout_threshold(ratio);
  float scale = k_dropout_scale(ratio), f[4] = {scale, scale, scale, scale};
  uint64_t e0 = (uint64_t)(rc->mb * n);
  for (int64_t i = 0; i < n; i++) {
    uint64_t e = e0 + (uint64_t)i;
    if (thr && (i == 0 || e % 4 == 0)) k_dropout_block(rc, node, e / 4, thr, scale, f);
    float g = dy[i] * f[e % 4];
    dx[i] = acc ? dx[i] + g : g;
  }
}

/* ---- unary maths and bounded activations: Neg, Exp, Log, Abs, Reciprocal,
 * Clip, HardSigmoid, HardSwish.  One kernel, the op a constant argument, so
 * each call specialises; a, b are Clip's bounds or HardSigmoid's alpha, beta. ---- */
enum { UN_NEG = 0, UN_EXP, UN_LOG, UN_ABS, UN_RECIPROCAL, UN_CLIP, UN_HARDSIGMOID, UN_HARDSWISH };

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

/* ---- Equal, Less, Greater (float inputs, broadcast) and Not: bool (uint8) results ---- */
enum { CMP_EQUAL = 0, CMP_LESS, CMP_GREATER };
static inline void k_compare(int op, const float *a, const float *b, uint8_t *y, const BcastShape *s) {
  for (int64_t i = 0; i < s->ny; i++) {
    float u = a[bcast_at(s, s->sa, i)], v = b[bcast_at(s, s->sb, i)];
    y[i] = op == CMP_EQUAL ? u == v : op == CMP_LESS ? u < v : u > v;
  }
}
static inline void k_not(const uint8_t *x, uint8_t *y, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = !x[i];
}

/* ---- ReduceMax over a set of axes (ReduceShape; scale unused) ---- */
/* A NaN wins, as torch.amax propagates it. */
static inline void k_reduce_max(const float *x, float *y, const ReduceShape *s) {
  for (int64_t o = 0; o < s->nout; o++) y[o] = -INFINITY;
  for (int64_t i = 0; i < s->n; i++) {
    int64_t o = reduce_at(s, i);
    if (x[i] > y[o] || x[i] != x[i]) y[o] = x[i];
  }
}
/* torch.amax's gradient: dy split equally over the elements equal to the max,
 * (dy / count) * (x == y); a NaN max matches nothing, so its count is 0 and
 * the whole slice gets NaN, as in PyTorch.  cnt: nout floats of scratch. */
static inline void k_reduce_max_grad(const float *x, const float *y, const float *dy, float *dx, float *cnt, const ReduceShape *s,
                                     int acc) {
  memset(cnt, 0, sizeof(float) * (size_t)s->nout);
  for (int64_t i = 0; i < s->n; i++) {
    int64_t o = reduce_at(s, i);
    if (x[i] == y[o]) cnt[o] += 1;
  }
  for (int64_t i = 0; i < s->n; i++) {
    int64_t o = reduce_at(s, i);
    float g = dy[o] / cnt[o] * (x[i] == y[o] ? 1.0f : 0.0f);
    dx[i] = acc ? dx[i] + g : g;
  }
}

/* ---- ArgMax along one axis ([outer, axis, inner]), int64 result ---- */
/* A NaN counts as larger than any number (torch.argmax, np.argmax); ties go
 * to the first index, or the last with select_last_index. */
static inline void k_argmax(const float *x, int64_t *y, int64_t outer, int64_t axis, int64_t inner, int last) {
  for (int64_t o = 0; o < outer; o++)
    for (int64_t k = 0; k < inner; k++) {
      const float *p = x + o * axis * inner + k;
      int64_t at = 0;
      for (int64_t j = 1; j < axis; j++) {
        float v = p[j * inner], best = p[at * inner];
        int vn = v != v, bn = best != best;
        int better = vn ? !bn || last : !bn && (v > best || (last && v == best));
        if (better) at = j;
      }
      y[o * inner + k] = at;
    }
}

/* ---- recurrent layers: LSTM and GRU, forward, reverse or both directions ----
 * Arrays that have a row per (time step, batch entry) - X and the
 * workspace's gates and states - keep the node's layout: row t*B + b
 * (layout 0, time-major) or b*T + t (layout 1, batch-major), so step t's rows
 * start at rnn_row(s, t) and lie rnn_rs(s) rows apart, and one sgemm serves
 * every step wherever the step does not matter (the input projection, dX, dW).
 * The directions run one after the other through the same workspace, each
 * with its own W, R, B and initial state (slice d of each), each writing its
 * slice of Y, Y_h and Y_c; a reverse direction visits t = T-1 .. 0.
 * Forward and backward run the same recurrence (rnn_*_run) into the
 * workspace, so backward recomputes the gates instead of keeping them per
 * micro-batch in flight; the gradients of W, R and B add up in one fixed
 * order, whatever the partition. */
typedef struct RnnShape {
  int64_t T, B, in, H; /* steps, batch, input size, hidden size */
  int layout;         /* 0: X [T,B,in], Y [T,D,B,H], Y_h [D,B,H]; 1: X [B,T,in], Y [B,T,D,H], Y_h [B,D,H] */
  int lbr;            /* GRU's linear_before_reset */
  int D;              /* directions: 1, or 2 (bidirectional: forward, then reverse) */
  int rev;            /* the direction being run visits the steps in reverse */
} RnnShape;

static inline int64_t rnn_row(const RnnShape *s, int64_t t) { return s->layout ? t : t * s->B; }
static inline int rnn_rs(const RnnShape *s) { return s->layout ? (int)s->T : 1; }
/* The time of the k-th step the direction takes. */
static inline int64_t rnn_t(const RnnShape *s, int64_t k) { return s->rev ? s->T - 1 - k : k; }
/* Direction d's part of a state array (initial_h, Y_h, ...): its offset, and the floats between its batch rows. */
static inline int64_t rnn_soff(const RnnShape *s, int d) { return s->layout ? d * s->H : d * s->B * s->H; }
static inline int rnn_sld(const RnnShape *s) { return (int)(s->layout ? s->D * s->H : s->H); }
/* Where Y holds h_t of direction d, batch entry b. */
static inline int64_t rnn_yoff(const RnnShape *s, int d, int64_t t, int64_t b) {
  return s->layout ? ((b * s->T + t) * s->D + d) * s->H : ((t * s->D + d) * s->B + b) * s->H;
}
static inline float rnn_sigmoid(float x) { return 1 / (1 + expf(-x)); }

/* Direction d's shape: which way it runs. */
static inline RnnShape rnn_dir(const RnnShape *s, int d) {
  RnnShape sd = *s;
  if (s->D == 2) sd.rev = d;
  return sd;
}

/* G[r, :] = X[r, :] W^T + Wb + Rb for every row: the input part of every step's gates. */
static inline void rnn_input_gates(const float *x, const float *w, const float *b, float *g, const RnnShape *s, int ng,
                                   int with_rb) {
  int rows = (int)(s->T * s->B), n = ng * (int)s->H;
  pr_sgemm(CblasNoTrans, CblasTrans, rows, n, (int)s->in, 1.0f, x, (int)s->in, w, (int)s->in, 0.0f, g, n);
  if (!b) return;
  for (int64_t r = 0; r < rows; r++)
    for (int k = 0; k < n; k++) g[r * n + k] += with_rb ? b[k] + b[n + k] : b[k];
}

/* Column sums of the rows of d [rows, n] added into db (a bias gradient). */
static inline void rnn_bias_grad(const float *d, float *db, int64_t rows, int n) {
  for (int64_t r = 0; r < rows; r++)
    for (int k = 0; k < n; k++) db[k] += d[r * n + k];
}

/* The state before time t: the initial state (or NULL: zeros) at the direction's
 * first step, else the previous step's rows of hs; *ld: the floats between its batch rows. */
static inline const float *rnn_prev(const float *hs, const float *h0, const RnnShape *s, int64_t t, int *ld) {
  int first = t == rnn_t(s, 0);
  *ld = first ? rnn_sld(s) : rnn_rs(s) * (int)s->H;
  return first ? h0 : hs + rnn_row(s, s->rev ? t + 1 : t - 1) * s->H;
}

/* ONNX's LSTM (gates i, o, f, c in that order): gates_t = X_t W^T + h_{t-1} R^T + Wb + Rb,
 * c_t = f * c_{t-1} + i * c~, h_t = o * tanh(c_t).  Leaves the activated gates in
 * G [rows, 4H], h_t in HS and c_t in CS (all in the node's layout). */
static inline void rnn_lstm_run(const float *x, const float *w, const float *r, const float *b, const float *h0, const float *c0,
                                float *G, float *HS, float *CS, const RnnShape *s) {
  int H = (int)s->H, rs = rnn_rs(s);
  rnn_input_gates(x, w, b, G, s, 4, 1);
  for (int64_t k = 0; k < s->T; k++) {
    int64_t t = rnn_t(s, k);
    int ld, ldc;
    const float *hp = rnn_prev(HS, h0, s, t, &ld), *cpt = rnn_prev(CS, c0, s, t, &ldc);
    float *gt = G + rnn_row(s, t) * 4 * H;
    if (hp) pr_sgemm(CblasNoTrans, CblasTrans, (int)s->B, 4 * H, H, 1.0f, hp, ld, r, H, 1.0f, gt, rs * 4 * H);
    for (int64_t bb = 0; bb < s->B; bb++) {
      int64_t row = rnn_row(s, t) + bb * rs;
      float *g = G + row * 4 * H, *c = CS + row * H, *h = HS + row * H;
      const float *cp = cpt ? cpt + bb * ldc : NULL;
      for (int j = 0; j < H; j++) {
        float i = rnn_sigmoid(g[j]), o = rnn_sigmoid(g[H + j]), f = rnn_sigmoid(g[2 * H + j]), cc = tanhf(g[3 * H + j]);
        g[j] = i, g[H + j] = o, g[2 * H + j] = f, g[3 * H + j] = cc;
        c[j] = (cp ? f * cp[j] : 0) + i * cc;
        h[j] = o * tanhf(c[j]);
      }
    }
  }
}

/* Direction d's part of Y, Y_h and Y_c (any may be NULL) from its states HS and CS. */
static inline void rnn_outputs(const float *HS, const float *CS, float *y, float *yh, float *yc, const RnnShape *s, int d) {
  int64_t H = s->H, last = rnn_row(s, rnn_t(s, s->T - 1)), so = rnn_soff(s, d);
  size_t bytes = sizeof(float) * (size_t)H;
  for (int64_t bb = 0; bb < s->B; bb++) {
    for (int64_t t = 0; y && t < s->T; t++) memcpy(y + rnn_yoff(s, d, t, bb), HS + (rnn_row(s, t) + bb * rnn_rs(s)) * H, bytes);
    int64_t row = last + bb * rnn_rs(s);
    if (yh) memcpy(yh + so + bb * rnn_sld(s), HS + row * H, bytes);
    if (yc) memcpy(yc + so + bb * rnn_sld(s), CS + row * H, bytes);
  }
}

/* Direction d's slices of W, R, B (ng gates) and of a state array (NULL stays NULL). */
static inline const float *rnn_wd(const float *w, const RnnShape *s, int ng, int64_t cols, int d) {
  return w ? w + (int64_t)d * ng * s->H * cols : NULL;
}
static inline const float *rnn_sd(const float *p, const RnnShape *s, int d) { return p ? p + rnn_soff(s, d) : NULL; }

static inline void k_lstm(const float *x, const float *w, const float *r, const float *b, const float *h0, const float *c0, float *y,
                          float *yh, float *yc, float *work, const RnnShape *s) {
  float *G = work, *HS = G + s->T * s->B * 4 * s->H, *CS = HS + s->T * s->B * s->H;
  for (int d = 0; d < s->D; d++) {
    RnnShape sd = rnn_dir(s, d);
    rnn_lstm_run(x, rnn_wd(w, s, 4, s->in, d), rnn_wd(r, s, 4, s->H, d), rnn_wd(b, s, 8, 1, d), rnn_sd(h0, s, d), rnn_sd(c0, s, d), G,
                 HS, CS, &sd);
    rnn_outputs(HS, CS, y, yh, yc, &sd, d);
  }
}

/* Direction d's dY at time t (if any) added into dh [B, H]. */
static inline void rnn_add_dy(const float *dy, float *dh, const RnnShape *s, int d, int64_t t) {
  if (!dy) return;
  for (int64_t bb = 0; bb < s->B; bb++)
    for (int64_t j = 0; j < s->H; j++) dh[bb * s->H + j] += dy[rnn_yoff(s, d, t, bb) + j];
}

/* dh, dc [B, H] start from direction d's dY_h and dY_c (or zeros). */
static inline void rnn_grad_init(const float *dyh, const float *dyc, float *dh, float *dc, const RnnShape *s, int d) {
  for (int64_t bb = 0; bb < s->B; bb++)
    for (int64_t j = 0; j < s->H; j++) {
      int64_t i = bb * s->H + j, at = rnn_soff(s, d) + bb * rnn_sld(s) + j;
      dh[i] = dyh ? dyh[at] : 0;
      if (dc) dc[i] = dyc ? dyc[at] : 0;
    }
}

/* After the direction's first step, dh and dc are its initial state's gradients: added into dh0 / dc0 when asked. */
static inline void rnn_state_grad(const float *g, float *d0, const RnnShape *s, int d) {
  for (int64_t bb = 0; d0 && bb < s->B; bb++)
    for (int64_t j = 0; j < s->H; j++) d0[rnn_soff(s, d) + bb * rnn_sld(s) + j] += g[bb * s->H + j];
}

/* The products every recurrent gradient ends with, given dGx [rows, ng*H] (the
 * gradient of the input part of the gates) and dGh (of the recurrent part):
 * dX (= or += by acc), dW += dGx^T X, dR += sum_t dGh_t^T h_{t-1}, dB += their
 * column sums.  hr: what multiplies R's last H rows (GRU's r * h_{t-1} when
 * linear_before_reset is 0; its rows hrw floats apart), else NULL. */
static inline void rnn_weight_grads(const float *x, const float *w, const float *h0, const float *HS, const float *hr, int hrw,
                                    const float *dGx, const float *dGh, float *dx, float *dw, float *dr, float *db, const RnnShape *s,
                                    int ng, int acc) {
  int H = (int)s->H, ni = (int)s->in, n = ng * H, rows = (int)(s->T * s->B), rs = rnn_rs(s);
  if (dx) pr_sgemm(CblasNoTrans, CblasNoTrans, rows, ni, n, 1.0f, dGx, n, w, ni, acc ? 1.0f : 0.0f, dx, ni);
  if (dw) pr_sgemm(CblasTrans, CblasNoTrans, n, ni, rows, 1.0f, dGx, n, x, ni, 1.0f, dw, ni);
  if (dr)
    for (int64_t t = 0; t < s->T; t++) {
      int ld;
      const float *hp = rnn_prev(HS, h0, s, t, &ld), *dg = dGh + rnn_row(s, t) * n;
      int m = hr ? n - H : n; /* rows of R that multiply h_{t-1} */
      if (hp) pr_sgemm(CblasTrans, CblasNoTrans, m, H, (int)s->B, 1.0f, dg, rs * n, hp, ld, 1.0f, dr, H);
      if (hr)
        pr_sgemm(CblasTrans, CblasNoTrans, H, H, (int)s->B, 1.0f, dg + m, rs * n, hr + rnn_row(s, t) * hrw, rs * hrw,
                    1.0f, dr + (int64_t)m * H, H);
    }
  if (db) {
    rnn_bias_grad(dGx, db, rows, n);
    rnn_bias_grad(dGh, db + n, rows, n);
  }
}

/* Direction d's slice of a gradient (NULL stays NULL). */
static inline float *rnn_gd(float *g, int64_t per_dir, int d) { return g ? g + per_dir * d : NULL; }

/* One direction of LSTM's backward through time: the forward again into the
 * workspace, then its steps in reverse turn dh, dc into the gates' gradients
 * (dG [rows, 4H], before the activations) and hand dh = dG_t R and dc * f to
 * the step before.  LSTM's dGx and dGh are one array. */
static inline void rnn_lstm_grad(const float *x, const float *w, const float *r, const float *b, const float *h0, const float *c0,
                                 const float *dy, const float *dyh, const float *dyc, float *dx, float *dw, float *dr, float *db,
                                 float *dh0, float *dc0, float *work, const RnnShape *s, int d, int acc) {
  int64_t H = s->H, rows = s->T * s->B;
  int rs = rnn_rs(s);
  float *G = work, *HS = G + rows * 4 * H, *CS = HS + rows * H, *dG = CS + rows * H, *dh = dG + rows * 4 * H, *dc = dh + s->B * H;
  rnn_lstm_run(x, w, r, b, h0, c0, G, HS, CS, s);
  rnn_grad_init(dyh, dyc, dh, dc, s, d);
  for (int64_t k = s->T - 1; k >= 0; k--) {
    int64_t t = rnn_t(s, k);
    int ldc;
    const float *cpt = rnn_prev(CS, c0, s, t, &ldc);
    rnn_add_dy(dy, dh, s, d, t);
    for (int64_t bb = 0; bb < s->B; bb++) {
      int64_t row = rnn_row(s, t) + bb * rs;
      const float *g = G + row * 4 * H, *c = CS + row * H, *cp = cpt ? cpt + bb * ldc : NULL;
      float *dg = dG + row * 4 * H, *dhb = dh + bb * H, *dcb = dc + bb * H;
      for (int64_t j = 0; j < H; j++) {
        float i = g[j], o = g[H + j], f = g[2 * H + j], cc = g[3 * H + j], tc = tanhf(c[j]);
        float dcj = dcb[j] + dhb[j] * o * (1 - tc * tc);
        dg[j] = dcj * cc * i * (1 - i);
        dg[H + j] = dhb[j] * tc * o * (1 - o);
        dg[2 * H + j] = (cp ? dcj * cp[j] : 0) * f * (1 - f);
        dg[3 * H + j] = dcj * i * (1 - cc * cc);
        dcb[j] = dcj * f;
      }
    }
    /* dh of the step before = dG_t R: replaces dh (its own part is spent). */
    pr_sgemm(CblasNoTrans, CblasNoTrans, (int)s->B, (int)H, 4 * (int)H, 1.0f, dG + rnn_row(s, t) * 4 * H,
                rs * 4 * (int)H, r, (int)H, 0.0f, dh, (int)H);
  }
  rnn_weight_grads(x, w, h0, HS, NULL, 0, dG, dG, dx, dw, dr, db, s, 4, acc);
  rnn_state_grad(dh, dh0, s, d);
  rnn_state_grad(dc, dc0, s, d);
}

/* Every direction's backward in turn; dX sums them (the second adds). */
static inline void k_lstm_grad(const float *x, const float *w, const float *r, const float *b, const float *h0, const float *c0,
                               const float *dy, const float *dyh, const float *dyc, float *dx, float *dw, float *dr, float *db,
                               float *dh0, float *dc0, float *work, const RnnShape *s, int acc) {
  int64_t G = 4 * s->H;
  for (int d = 0; d < s->D; d++) {
    RnnShape sd = rnn_dir(s, d);
    rnn_lstm_grad(x, rnn_wd(w, s, 4, s->in, d), rnn_wd(r, s, 4, s->H, d), rnn_wd(b, s, 8, 1, d), rnn_sd(h0, s, d), rnn_sd(c0, s, d),
                  dy, dyh, dyc, dx, rnn_gd(dw, G * s->in, d), rnn_gd(dr, G * s->H, d), rnn_gd(db, 2 * G, d), dh0, dc0, work, &sd, d,
                  d ? 1 : acc);
  }
}

/* ONNX's GRU (gates z, r, h): z, r = sigmoid(X_t W^T + h_{t-1} R^T + Wb + Rb),
 * h~ = tanh(X_t Wh^T + Wbh + r * (h_{t-1} Rh^T + Rbh)) when linear_before_reset
 * (torch's form), else tanh(X_t Wh^T + Wbh + (r * h_{t-1}) Rh^T + Rbh);
 * h_t = (1 - z) h~ + z h_{t-1}.  Leaves X's part of the gates in GX [rows, 3H],
 * z, r, h~ and the recurrent term (h_{t-1} Rh^T + Rbh, or r * h_{t-1}) in A [rows, 4H], h_t in HS. */
static inline void rnn_gru_run(const float *x, const float *w, const float *r, const float *b, const float *h0, float *GX, float *A,
                               float *HS, const RnnShape *s) {
  int H = (int)s->H, rs = rnn_rs(s), lbr = s->lbr;
  const float *rb = b ? b + 3 * H : NULL;
  rnn_input_gates(x, w, b, GX, s, 3, 0);
  for (int64_t k = 0; k < s->T; k++) {
    int64_t t = rnn_t(s, k);
    int ld;
    const float *hp = rnn_prev(HS, h0, s, t, &ld);
    float *at = A + rnn_row(s, t) * 4 * H;
    if (hp) pr_sgemm(CblasNoTrans, CblasTrans, (int)s->B, (lbr ? 3 : 2) * H, H, 1.0f, hp, ld, r, H, 0.0f, at, rs * 4 * H);
    for (int pass = 0; pass < 2; pass++) {
      /* Without linear_before_reset, h~ needs (r * h_{t-1}) Rh^T: one more product between the passes. */
      if (pass == 1 && !lbr && hp)
        pr_sgemm(CblasNoTrans, CblasTrans, (int)s->B, H, H, 1.0f, at + 3 * H, rs * 4 * H, r + 2 * H * H, H, 0.0f,
                    at + 2 * H, rs * 4 * H);
      for (int64_t bb = 0; bb < s->B; bb++) {
        int64_t row = rnn_row(s, t) + bb * rs;
        const float *gx = GX + row * 3 * H, *hpb = hp ? hp + bb * ld : NULL;
        float *a = A + row * 4 * H, *h = HS + row * H;
        for (int j = 0; j < H; j++) {
          float hpj = hpb ? hpb[j] : 0;
          if (pass == 0) {
            a[j] = rnn_sigmoid(gx[j] + (hp ? a[j] : 0) + (rb ? rb[j] : 0));
            a[H + j] = rnn_sigmoid(gx[H + j] + (hp ? a[H + j] : 0) + (rb ? rb[H + j] : 0));
            if (!lbr) a[3 * H + j] = a[H + j] * hpj;
            continue;
          }
          float rec = (hp ? a[2 * H + j] : 0) + (rb ? rb[2 * H + j] : 0);
          if (lbr) a[3 * H + j] = rec;
          float hh = tanhf(gx[2 * H + j] + (lbr ? a[H + j] * rec : rec));
          a[2 * H + j] = hh;
          h[j] = (1 - a[j]) * hh + a[j] * hpj;
        }
      }
    }
  }
}

static inline void k_gru(const float *x, const float *w, const float *r, const float *b, const float *h0, float *y, float *yh,
                         float *work, const RnnShape *s) {
  float *GX = work, *A = GX + s->T * s->B * 3 * s->H, *HS = A + s->T * s->B * 4 * s->H;
  for (int d = 0; d < s->D; d++) {
    RnnShape sd = rnn_dir(s, d);
    rnn_gru_run(x, rnn_wd(w, s, 3, s->in, d), rnn_wd(r, s, 3, s->H, d), rnn_wd(b, s, 6, 1, d), rnn_sd(h0, s, d), GX, A, HS, &sd);
    rnn_outputs(HS, NULL, y, yh, NULL, &sd, d);
  }
}

/* One step of GRU's backward: dh [B, H] (dL/dh_t) becomes the gradient of the
 * state before; fills time t's rows of dGx and dGh (the gradients of X's and
 * h's parts of the gates, before the activations).  tmp [B, H]: the part of
 * that gradient that is not a product with R. */
static inline void rnn_gru_step_grad(const float *r, const float *A, const float *hp, int ld, float *dGx, float *dGh, float *dh,
                                     float *tmp, const RnnShape *s, int64_t t) {
  int H = (int)s->H, rs = rnn_rs(s), lbr = s->lbr;
  int64_t r0 = rnn_row(s, t);
  for (int pass = 0; pass < 2; pass++) {
    /* Without linear_before_reset, dr needs d(r * h_{t-1}) = dah Rh, kept in dGx's z columns until pass 1 fills them. */
    if (pass == 1 && !lbr)
      pr_sgemm(CblasNoTrans, CblasNoTrans, (int)s->B, H, H, 1.0f, dGx + r0 * 3 * H + 2 * H, rs * 3 * H, r + 2 * H * H,
                  H, 0.0f, dGx + r0 * 3 * H, rs * 3 * H);
    for (int64_t bb = 0; bb < s->B; bb++) {
      int64_t row = r0 + bb * rs;
      const float *a = A + row * 4 * H, *hpb = hp ? hp + bb * ld : NULL;
      float *gx = dGx + row * 3 * H, *gh = dGh + row * 3 * H, *dhb = dh + bb * H, *tb = tmp + bb * H;
      for (int j = 0; j < H; j++) {
        float z = a[j], rr = a[H + j], hh = a[2 * H + j], hpj = hpb ? hpb[j] : 0;
        if (pass == 0) {
          float dah = dhb[j] * (1 - z) * (1 - hh * hh);
          gx[2 * H + j] = dah;
          gh[2 * H + j] = lbr ? dah * rr : dah;
          tb[j] = dhb[j] * z;
          continue;
        }
        float dah = gx[2 * H + j], drh = lbr ? 0 : gx[j];
        float dr = lbr ? dah * a[3 * H + j] : drh * hpj;
        float dz = dhb[j] * (hpj - hh);
        if (!lbr) tb[j] += drh * rr;
        gx[j] = gh[j] = dz * z * (1 - z);
        gx[H + j] = gh[H + j] = dr * rr * (1 - rr);
      }
    }
  }
  /* The state before's gradient = tmp + dGh_t R (over z, r and, with linear_before_reset, h). */
  pr_sgemm(CblasNoTrans, CblasNoTrans, (int)s->B, H, (lbr ? 3 : 2) * H, 1.0f, dGh + r0 * 3 * H, rs * 3 * H, r, H,
              1.0f, tmp, H);
  memcpy(dh, tmp, sizeof(float) * (size_t)(s->B * H));
}

static inline void rnn_gru_grad(const float *x, const float *w, const float *r, const float *b, const float *h0, const float *dy,
                                const float *dyh, float *dx, float *dw, float *dr, float *db, float *dh0, float *work, const RnnShape *s,
                                int d, int acc) {
  int64_t H = s->H, rows = s->T * s->B;
  float *GX = work, *A = GX + rows * 3 * H, *HS = A + rows * 4 * H, *dGx = HS + rows * H, *dGh = dGx + rows * 3 * H;
  float *dh = dGh + rows * 3 * H, *tmp = dh + s->B * H;
  rnn_gru_run(x, w, r, b, h0, GX, A, HS, s);
  rnn_grad_init(dyh, NULL, dh, NULL, s, d);
  for (int64_t k = s->T - 1; k >= 0; k--) {
    int64_t t = rnn_t(s, k);
    int ld;
    const float *hp = rnn_prev(HS, h0, s, t, &ld);
    rnn_add_dy(dy, dh, s, d, t);
    rnn_gru_step_grad(r, A, hp, ld, dGx, dGh, dh, tmp, s, t);
  }
  /* Without linear_before_reset, Rh multiplies r * h_{t-1} (A's last H columns), not h_{t-1}. */
  rnn_weight_grads(x, w, h0, HS, s->lbr ? NULL : A + 3 * H, 4 * (int)H, dGx, dGh, dx, dw, dr, db, s, 3, acc);
  rnn_state_grad(dh, dh0, s, d);
}

static inline void k_gru_grad(const float *x, const float *w, const float *r, const float *b, const float *h0, const float *dy,
                              const float *dyh, float *dx, float *dw, float *dr, float *db, float *dh0, float *work, const RnnShape *s,
                              int acc) {
  int64_t G = 3 * s->H;
  for (int d = 0; d < s->D; d++) {
    RnnShape sd = rnn_dir(s, d);
    rnn_gru_grad(x, rnn_wd(w, s, 3, s->in, d), rnn_wd(r, s, 3, s->H, d), rnn_wd(b, s, 6, 1, d), rnn_sd(h0, s, d), dy, dyh, dx,
                 rnn_gd(dw, G * s->in, d), rnn_gd(dr, G * s->H, d), rnn_gd(db, 2 * G, d), dh0, work, &sd, d, d ? 1 : acc);
  }
}

/* ---- optimizers (PyTorch's update rules, step by step) ---- */
/* The flags are tested once per call, not per element, so each loop vectorises; every element gets the
 * same expressions as in one loop with the tests inside. */
static inline void k_sgd(float *p, const float *g, float *buf, int64_t n, float lr, float momentum, float wd, int first) {
  if (wd == 0 && momentum == 0) {
    for (int64_t i = 0; i < n; i++) p[i] = p[i] + (-lr) * g[i];
    return;
  }
  if (momentum == 0) {
    for (int64_t i = 0; i < n; i++) {
      float d = g[i];
      d = d + wd * p[i];
      p[i] = p[i] + (-lr) * d;
    }
    return;
  }
  for (int64_t i = 0; i < n; i++) {
    float d = g[i];
    if (wd != 0) d = d + wd * p[i];
    buf[i] = first ? d : buf[i] * momentum + d;
    d = buf[i];
    p[i] = p[i] + (-lr) * d;
  }
}

/* Adam (decoupled = 0) and AdamW (decoupled = 1); step counts from 1. */
static inline void k_adam(float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1, float beta2, float eps,
                          float wd, int decoupled, int64_t step) {
  double bc1 = 1 - pow(beta1, (double)step), bc2 = 1 - pow(beta2, (double)step);
  float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
  for (int64_t i = 0; i < n; i++) {
    float grad = g[i];
    if (decoupled) p[i] = p[i] * (1 - lr * wd);
    else if (wd != 0) grad = grad + wd * p[i];
    m[i] = m[i] * beta1 + grad * (1 - beta1);
    v[i] = v[i] * beta2 + grad * grad * (1 - beta2);
    float denom = sqrtf(v[i]) / bc2_sqrt + eps;
    p[i] = p[i] + (-step_size) * (m[i] / denom);
  }
}

/* The run's optimizer hyper-parameters at the step being taken (the runtime's pr_opt, set before each
 * UPDATE): the generated update calls read them, since run.sh may change them and the learning rate
 * follows its schedule.  step counts from 0. */
typedef struct OptCtx {
  float lr, momentum, weight_decay, beta1, beta2, eps;
  int64_t step;
} OptCtx;

/* One weight's update, as the stage program's update() calls it. */
static inline void k_sgd_step(float *p, const float *g, float *buf, int64_t n, const OptCtx *o) {
  k_sgd(p, g, buf, n, o->lr, o->momentum, o->weight_decay, o->step == 0);
}
static inline void k_adam_step(float *p, const float *g, float *m, float *v, int64_t n, int decoupled, const OptCtx *o) {
  k_adam(p, g, m, v, n, o->lr, o->beta1, o->beta2, o->eps, o->weight_decay, decoupled, o->step + 1);
}
#endif
