/* k_pool.c - the pooling kernels (k_maxpool, k_maxpool_grad, k_avgpool, k_avgpool_grad) on the GPU against
 * the CPU's: 1-D, 2-D and 3-D windows, strides, pads (end pads apart), dilations, ceil-mode output sizes,
 * count_include_pad both ways, acc 0 and 1.  MaxPool's inputs are rounded to a few levels so that windows
 * hold ties (the gradient must go where the CPU's goes), and one pass puts NaNs among them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/kernels.h"
#include "kcheck.h"
#include "kernels.h"

/* A case: nsp spatial axes, each's input size, kernel, stride, begin and end pad, dilation. */
typedef struct {
  int n, c, nsp;
  int in[3], k[3], st[3], pb[3], pe[3], dl[3];
  int ceil_mode;
} PoolCase;

/* The output size along one axis, as the compiler's window_out. */
static int pool_out(int in, int k, int s, int pb, int pe, int dl, int ceil_mode) {
  int span = in + pb + pe - ((k - 1) * dl + 1);
  int o = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
  if (ceil_mode && (o - 1) * s >= in + pb) o--;
  return o;
}

/* The PoolShape the compiler would make (window_slots: 1-D and 2-D windows in the last slots). */
static PoolShape pool_shape(const PoolCase *p, int cip) {
  int in[3], out[3], k[3], st[3], pb[3], pe[3], dl[3];
  for (int i = 0; i < 3; i++) {
    int a = i - (3 - p->nsp);
    in[i] = a < 0 ? 1 : p->in[a];
    k[i] = a < 0 ? 1 : p->k[a];
    st[i] = a < 0 ? 1 : p->st[a];
    pb[i] = a < 0 ? 0 : p->pb[a];
    pe[i] = a < 0 ? 0 : p->pe[a];
    dl[i] = a < 0 ? 1 : p->dl[a];
    out[i] = pool_out(in[i], k[i], st[i], pb[i], pe[i], dl[i], p->ceil_mode);
  }
  return (PoolShape){.n = p->n, .c = p->c, .d = in[0], .h = in[1], .w = in[2], .od = out[0], .oh = out[1], .ow = out[2],
                     .kd = k[0], .kh = k[1], .kw = k[2], .sd = st[0], .sh = st[1], .sw = st[2], .pd = pb[0], .ph = pb[1],
                     .pw = pb[2], .dd = dl[0], .dh = dl[1], .dw = dl[2], .ed = pe[0], .eh = pe[1], .ew = pe[2],
                     .count_include_pad = cip};
}

static void pool_words(char *buf, size_t size, const PoolShape *s, int nsp, int ceil_mode, const char *extra) {
  if (nsp == 1)
    snprintf(buf, size, "%dx%dx%d k%d s%d p%d,%d d%d%s %s", s->n, s->c, s->w, s->kw, s->sw, s->pw, s->ew, s->dw,
             ceil_mode ? " ceil" : "", extra);
  else if (nsp == 2)
    snprintf(buf, size, "%dx%dx%dx%d k%dx%d s%d,%d p%d,%d d%d%s %s", s->n, s->c, s->h, s->w, s->kh, s->kw, s->sh, s->sw, s->ph,
             s->pw, s->dw, ceil_mode ? " ceil" : "", extra);
  else
    snprintf(buf, size, "%dx%dx%dx%dx%d k%dx%dx%d s%d,%d,%d%s %s", s->n, s->c, s->d, s->h, s->w, s->kd, s->kh, s->kw, s->sd, s->sh,
             s->sw, ceil_mode ? " ceil" : "", extra);
}

static float *copy_of(const float *h, int64_t n) {
  float *c = malloc((size_t)(n > 0 ? n : 1) * sizeof *c);
  memcpy(c, h, (size_t)n * sizeof *c);
  return c;
}

static void pool_max_case(const PoolCase *p, const PoolShape *s, int64_t ni, int64_t no, int nans) {
  char words[160];
  float *x = kc_rand(ni, -2, 2);
  for (int64_t i = 0; i < ni; i++) x[i] = floorf(x[i] * 2) / 2; /* 8 levels: windows tie */
  if (nans)
    for (int64_t i = 5; i < ni; i += 37) x[i] = NAN;
  float *gx = kc_up(x, ni), *y = kc_zeros(no), *gy = kc_dev_zeros(no);
  k_maxpool(x, y, s);
  kc_maxpool(gx, gy, s);
  pool_words(words, sizeof words, s, p->nsp, p->ceil_mode, nans ? "ties nan" : "ties");
  kc_report_exact("k_maxpool", words, gy, y, no * (int64_t)sizeof(float));
  for (int acc = 0; acc < 2; acc++) {
    float *dy = kc_rand(no, -1, 1), *pre = kc_rand(ni, -1, 1), *dx = copy_of(pre, ni);
    float *gdy = kc_up(dy, no), *gdx = kc_up(pre, ni);
    k_maxpool_grad(x, dy, dx, s, acc);
    kc_maxpool_grad(gx, gdy, gdx, s, acc);
    char w2[200];
    snprintf(w2, sizeof w2, "%s acc%d", words, acc);
    kc_report("k_maxpool_grad", w2, kc_err(gdx, dx, ni));
    free(dy), free(pre), free(dx), kc_free(gdy), kc_free(gdx);
  }
  free(x), free(y), kc_free(gx), kc_free(gy);
}

static void pool_avg_case(const PoolCase *p, PoolShape s, int64_t ni, int64_t no, int cip) {
  char words[160];
  s.count_include_pad = cip;
  float *x = kc_rand(ni, -1, 1), *y = kc_zeros(no);
  float *gx = kc_up(x, ni), *gy = kc_dev_zeros(no);
  k_avgpool(x, y, &s);
  kc_avgpool(gx, gy, &s);
  pool_words(words, sizeof words, &s, p->nsp, p->ceil_mode, cip ? "cip1" : "cip0");
  kc_report("k_avgpool", words, kc_err(gy, y, no));
  for (int acc = 0; acc < 2; acc++) {
    float *dy = kc_rand(no, -1, 1), *pre = kc_rand(ni, -1, 1), *dx = copy_of(pre, ni);
    float *gdy = kc_up(dy, no), *gdx = kc_up(pre, ni);
    k_avgpool_grad(dy, dx, &s, acc);
    kc_avgpool_grad(gdy, gdx, &s, acc);
    char w2[200];
    snprintf(w2, sizeof w2, "%s acc%d", words, acc);
    kc_report("k_avgpool_grad", w2, kc_err(gdx, dx, ni));
    free(dy), free(pre), free(dx), kc_free(gdy), kc_free(gdx);
  }
  free(x), free(y), kc_free(gx), kc_free(gy);
}

void check_pool(void) {
  static const PoolCase cases[] = {
      /* 2-D, ResNet's stem pool: k3 s2 p1 on odd sizes */
      {2, 3, 2, {7, 9}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, {1, 1}, 0},
      /* 2-D, non-overlapping k2 s2 */
      {1, 5, 2, {8, 8}, {2, 2}, {2, 2}, {0, 0}, {0, 0}, {1, 1}, 0},
      /* 2-D, k3 s1 p1, dilation 2 on one axis */
      {2, 2, 2, {11, 10}, {3, 3}, {1, 1}, {1, 2}, {1, 2}, {1, 2}, 0},
      /* 2-D, ceil mode: the last window runs past the input */
      {1, 3, 2, {8, 7}, {3, 2}, {2, 2}, {0, 0}, {0, 0}, {1, 1}, 1},
      /* 2-D, ceil mode with pads (a last window that would start in the end pad is dropped) */
      {2, 2, 2, {9, 6}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, {1, 1}, 1},
      /* 2-D, asymmetric pads (auto_pad SAME_UPPER-like) */
      {1, 4, 2, {6, 7}, {2, 3}, {1, 2}, {0, 1}, {1, 1}, {1, 1}, 0},
      /* 2-D, global: the window covers the input */
      {2, 16, 2, {7, 7}, {7, 7}, {1, 1}, {0, 0}, {0, 0}, {1, 1}, 0},
      /* 2-D, large (over 1000 outputs) */
      {4, 16, 2, {33, 33}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, {1, 1}, 0},
      /* 1-D */
      {2, 4, 1, {33}, {3}, {2}, {1}, {1}, {1}, 0},
      {3, 1, 1, {1}, {1}, {1}, {0}, {0}, {1}, 0},
      {1, 7, 1, {20}, {2}, {1}, {0}, {1}, {3}, 1},
      /* 3-D */
      {1, 2, 3, {5, 6, 7}, {2, 3, 2}, {1, 2, 2}, {0, 1, 1}, {0, 1, 1}, {1, 1, 2}, 0},
      {2, 3, 3, {4, 5, 5}, {3, 3, 3}, {2, 2, 2}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const PoolCase *p = &cases[i];
    PoolShape s = pool_shape(p, 0);
    int64_t ni = (int64_t)s.n * s.c * s.d * s.h * s.w, no = (int64_t)s.n * s.c * s.od * s.oh * s.ow;
    pool_max_case(p, &s, ni, no, 0);
    pool_max_case(p, &s, ni, no, 1);
    pool_avg_case(p, s, ni, no, 0);
    pool_avg_case(p, s, ni, no, 1);
  }
}
