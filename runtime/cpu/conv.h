/* cpu/conv.h - convolution (1-D, 2-D, 3-D): im2col + GEMM, a point's own path, oneDNN where built with it.
 * Part of the CPU kernels; runtime/kernels.h includes every family (the conventions are there). */
#ifndef PIPERUN_CPU_CONV_H
#define PIPERUN_CPU_CONV_H
#include "common.h"
/* ---- convolution (1-D, 2-D, 3-D) through im2col + GEMM ----
 * One kernel for every rank: the compiler puts 1-D and 2-D convolutions in
 * the last spatial slots (d = kd = od = 1 and, for 1-D, h = kh = oh = 1), so
 * the unit loops fold away in the specialised code and a 2-D convolution
 * performs exactly the arithmetic it did before 3-D existed. */

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
#endif
