/* k_conv.c - the convolution kernels (cuda/conv.cu) against the CPU's (cpu/conv.h): 1-D, 2-D and 3-D,
 * groups (depthwise among them), strides, pads, dilations, odd sizes, a convolution of one point, with and
 * without a bias; the gradients each alone and together, acc 0 and 1; and images in several chunks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/kernels.h"
#include "kcheck.h"
#include "kernels.h"

/* conv.cu: the scratch floats for one chunk of images (0: the default); the 64-bit index kernels always
 * (wide), one GEMM into scratch and a copy for one group too (big). */
void pr_cu_conv_chunk(int64_t floats);
void pr_cu_conv_paths(int wide, int big);

typedef struct Case {
  const char *name;
  int n, c, d, h, w, m, kd, kh, kw, group;
  int sd, sh, sw, pd, ph, pw, dd, dh, dw; /* pads symmetric */
} Case;

static const Case CASES[] = {
    {"2d 3x3 p1", 2, 3, 1, 7, 7, 4, 1, 3, 3, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1},
    {"2d 3x3 s2 p1 odd", 3, 4, 1, 9, 11, 5, 1, 3, 3, 1, 1, 2, 2, 0, 1, 1, 1, 1, 1},
    {"2d 3x3 dil2 p2", 2, 3, 1, 13, 12, 6, 1, 3, 3, 1, 1, 1, 1, 0, 2, 2, 1, 2, 2},
    {"2d depthwise 3x3 s2 p1", 2, 6, 1, 15, 15, 6, 1, 3, 3, 6, 1, 2, 2, 0, 1, 1, 1, 1, 1},
    {"2d groups2 5x3 s(1,2) p(2,1)", 2, 4, 1, 10, 9, 6, 1, 5, 3, 2, 1, 1, 2, 0, 2, 1, 1, 1, 1},
    {"2d 1x1 s2", 4, 8, 1, 8, 8, 16, 1, 1, 1, 1, 1, 2, 2, 0, 0, 0, 1, 1, 1},
    {"2d 7x7 s2 p3", 2, 3, 1, 33, 31, 8, 1, 7, 7, 1, 1, 2, 2, 0, 3, 3, 1, 1, 1},
    {"2d one image 3x3 groups3", 1, 6, 1, 8, 9, 9, 1, 3, 3, 3, 1, 1, 1, 0, 1, 1, 1, 1, 1},
    {"2d many channels 3x3", 2, 64, 1, 6, 6, 33, 1, 3, 3, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1},
    {"1d k5 s2 p2", 3, 3, 1, 1, 31, 5, 1, 1, 5, 1, 1, 1, 2, 0, 0, 2, 1, 1, 1},
    {"1d k3 dil3 groups", 2, 4, 1, 1, 40, 8, 1, 1, 3, 2, 1, 1, 1, 0, 0, 3, 1, 1, 3},
    {"3d 3x3x3 s(1,2,1) p1 dil(1,1,2)", 2, 2, 5, 6, 7, 3, 3, 3, 3, 1, 1, 2, 1, 1, 1, 1, 1, 1, 2},
    {"3d 2x3x1 s2 groups2", 2, 4, 6, 5, 4, 4, 2, 3, 1, 2, 2, 2, 1, 0, 1, 0, 1, 1, 1},
    {"point 3x3 p1", 4, 8, 1, 1, 1, 6, 1, 3, 3, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1},
    {"point 3x3 p1 groups2", 3, 8, 1, 1, 1, 6, 1, 3, 3, 2, 1, 1, 1, 0, 1, 1, 1, 1, 1},
};

static int out_size(int in, int k, int s, int p, int d) { return (in + 2 * p - d * (k - 1) - 1) / s + 1; }

static ConvShape make_shape(const Case *k) {
  ConvShape s;
  memset(&s, 0, sizeof s);
  s.n = k->n, s.c = k->c, s.d = k->d, s.h = k->h, s.w = k->w;
  s.m = k->m, s.kd = k->kd, s.kh = k->kh, s.kw = k->kw, s.group = k->group;
  s.sd = k->sd, s.sh = k->sh, s.sw = k->sw, s.pd = k->pd, s.ph = k->ph, s.pw = k->pw;
  s.dd = k->dd, s.dh = k->dh, s.dw = k->dw;
  s.od = out_size(k->d, k->kd, k->sd, k->pd, k->dd);
  s.oh = out_size(k->h, k->kh, k->sh, k->ph, k->dh);
  s.ow = out_size(k->w, k->kw, k->sw, k->pw, k->dw);
  s.lib = 0;
  return s;
}

static float *prefill(int64_t n, float **dev) {
  float *h = kc_rand(n, -1.0f, 1.0f);
  *dev = kc_up(h, n);
  return h;
}

static void run_case(const Case *k, const char *tag) {
  ConvShape s = make_shape(k);
  int cg = s.c / s.group, mg = s.m / s.group, kvol = s.kd * s.kh * s.kw;
  int64_t sp = (int64_t)s.od * s.oh * s.ow, nx = (int64_t)s.n * s.c * s.d * s.h * s.w, ny = (int64_t)s.n * s.m * sp,
          nw = (int64_t)s.m * cg * kvol, colf = (int64_t)cg * kvol * sp;
  if (colf < (int64_t)mg * cg) colf = (int64_t)mg * cg; /* a point's workspace (ops/conv.c) */
  s.lib_work = 4 * colf;
  float *x = kc_rand(nx, -1, 1), *w = kc_rand(nw, -1, 1), *b = kc_rand(s.m, -1, 1), *dy = kc_rand(ny, -1, 1);
  float *col = kc_zeros(colf);
  float *gx = kc_up(x, nx), *gw = kc_up(w, nw), *gb = kc_up(b, s.m), *gdy = kc_up(dy, ny), *gcol = kc_dev_zeros(colf);
  char shape[128];
  for (int bias = 0; bias < 2; bias++) { /* forward */
    float *gy, *y = prefill(ny, &gy);
    k_conv(x, w, bias ? b : NULL, y, col, &s);
    kc_conv(gx, gw, bias ? gb : NULL, gy, gcol, &s);
    snprintf(shape, sizeof shape, "%s%s%s", k->name, tag, bias ? " bias" : "");
    kc_report("k_conv", shape, kc_err(gy, y, ny));
    free(y), kc_free(gy);
  }
  /* gradients: which (1 dx, 2 dw, 4 db) and acc */
  static const int MODES[][3] = {{1, 0, 0}, {1, 1, 0}, {6, 0, 0}, {6, 0, 1}, {2, 0, 1}, {4, 0, 0}, {7, 1, 0}, {7, 0, 1}};
  for (int md = 0; md < (int)(sizeof MODES / sizeof MODES[0]); md++) {
    int which = MODES[md][0], acc_x = MODES[md][1], acc_w = MODES[md][2];
    float *gdx, *gdw, *gdb, *hdx = prefill(nx, &gdx), *hdw = prefill(nw, &gdw), *hdb = prefill(s.m, &gdb);
    k_conv_grad(x, w, dy, which & 1 ? hdx : NULL, which & 2 ? hdw : NULL, which & 4 ? hdb : NULL, col, &s, acc_x, acc_w);
    kc_conv_grad(gx, gw, gdy, which & 1 ? gdx : NULL, which & 2 ? gdw : NULL, which & 4 ? gdb : NULL, gcol, &s, acc_x,
                 acc_w);
    snprintf(shape, sizeof shape, "%s%s %s%s%s acc_x%d acc_w%d", k->name, tag, which & 1 ? "dx" : "", which & 2 ? "dw" : "",
             which & 4 ? "db" : "", acc_x, acc_w);
    /* what a call leaves alone must stay as it was: compare every output */
    double e = kc_err(gdx, hdx, nx), ew = kc_err(gdw, hdw, nw), eb = kc_err(gdb, hdb, s.m);
    if (ew > e || ew != ew) e = ew;
    if (eb > e || eb != eb) e = eb;
    kc_report("k_conv_grad", shape, e);
    free(hdx), free(hdw), free(hdb);
    kc_free(gdx), kc_free(gdw), kc_free(gdb);
  }
  free(x), free(w), free(b), free(dy), free(col);
  kc_free(gx), kc_free(gw), kc_free(gb), kc_free(gdy), kc_free(gcol);
}

void check_conv(void) {
  for (int i = 0; i < (int)(sizeof CASES / sizeof CASES[0]); i++) run_case(&CASES[i], "");
  /* the other paths: 64-bit indices; one group as the groups are run */
  pr_cu_conv_paths(1, 0);
  for (int i = 0; i < (int)(sizeof CASES / sizeof CASES[0]); i++) run_case(&CASES[i], " wide");
  pr_cu_conv_paths(0, 1);
  for (int i = 0; i < (int)(sizeof CASES / sizeof CASES[0]); i++)
    if (CASES[i].group == 1) run_case(&CASES[i], " big");
  pr_cu_conv_paths(0, 0);
  /* several chunks of images, the last one a single image: 5 images, 2 a chunk */
  static const Case CHUNKED[] = {
      {"2d 3x3 p1 n5", 5, 3, 1, 7, 7, 4, 1, 3, 3, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1},
      {"2d groups2 3x3 s2 n5", 5, 4, 1, 9, 8, 6, 1, 3, 3, 2, 1, 2, 2, 0, 1, 1, 1, 1, 1},
  };
  for (int i = 0; i < (int)(sizeof CHUNKED / sizeof CHUNKED[0]); i++) {
    ConvShape s = make_shape(&CHUNKED[i]);
    int64_t sp = (int64_t)s.od * s.oh * s.ow, per_image = (int64_t)s.c * s.kd * s.kh * s.kw * sp + (int64_t)s.m * sp;
    pr_cu_conv_chunk(2 * per_image + 1);
    run_case(&CHUNKED[i], " chunks of 2");
    pr_cu_conv_paths(1, 1);
    run_case(&CHUNKED[i], " chunks of 2 wide big");
    pr_cu_conv_paths(0, 0);
  }
  pr_cu_conv_chunk(0);
}
