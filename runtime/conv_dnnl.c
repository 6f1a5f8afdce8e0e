/* conv_dnnl.c - convolutions through oneDNN (libdnnl), where the compiler chose it (ConvShape.lib).
 *
 * Why: on this project's CPUs oneDNN's JIT convolutions in its blocked layouts (nChw16c) run at
 * 150-220 GFLOP/s on the sample ResNet's shapes, where im2col + OpenBLAS SGEMM per sample reaches
 * 30-70 (bench/README.md, "Kernels").  The rest of a stage program keeps the plain NCHW layout, so
 * each call reorders its inputs into the blocked layout and its output back, inside the workspace
 * the compiler sized for it (conv.c: conv_workspace); nothing here allocates activation-sized
 * memory of its own.
 *
 * Each convolution's primitives (forward, backward data, backward weights, and the reorders around
 * them) are made once, at its first call, and kept by the address of its shape constant.  They are
 * deterministic for a given shape and thread count, so every rank that runs a convolution gets the
 * same bits, whatever the cut: -n 1 and -n 4 stay bit-identical.  pr_conv_lib_init pins oneDNN's
 * instruction set to the one the BLAS kernels were pinned to (blas_core.h), so hosts of a cluster
 * with different CPUs also run the same code.
 *
 * A call returns -1 where oneDNN cannot run the shape or the workspace is too small: the caller
 * then runs im2col + GEMM (the same arithmetic as a build without oneDNN). */
#ifdef PR_DNNL
#include <dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

void omp_set_num_threads(int);

typedef struct Reo { /* a reorder between two layouts, with dst += src (sum) or dst = src */
  dnnl_primitive_t p;
  dnnl_memory_t from, to;
} Reo;

typedef struct Lib {
  const ConvShape *s;
  int ok; /* 1 ready, -1 oneDNN refused the shape or the workspace is too small */
  dnnl_primitive_t fwd, bdata, bweights;
  /* The layouts each primitive wants, and memory objects for them (data handles set per call). */
  dnnl_memory_t u_x, u_w, u_y;               /* the plain NCHW / OIHW tensors */
  dnnl_memory_t f_x, f_w, f_y;               /* forward */
  dnnl_memory_t d_dy, d_w, d_dx;             /* backward data */
  dnnl_memory_t w_x, w_dy, w_dw;             /* backward weights */
  int f_x_plain, f_w_plain, f_y_plain, d_dy_plain, d_w_plain, w_x_plain, w_dy_plain;
  Reo r_fx, r_fw, r_fy, r_ddy, r_dw, r_ddx, r_ddx_sum, r_wx, r_wdy, r_wdw, r_wdw_sum;
  dnnl_memory_t scr[3];                      /* forward, backward data, backward weights scratch (NULL: none) */
  size_t off_x, off_y, off_w, off_s, need;   /* the workspace: blocked x (or dx), y (or dy), w (or dw), scratch */
} Lib;

static dnnl_engine_t eng;
static dnnl_stream_t strm;
static Lib *libs;
static int nlibs, caplibs, inited;

void pr_conv_lib_init(const char *blas_core, int threads) {
  if (inited) return;
  inited = 1;
  omp_set_num_threads(threads > 0 ? threads : 1);
  /* The same instructions on every host: oneDNN would otherwise pick each host's newest. */
  dnnl_cpu_isa_t isa = dnnl_cpu_isa_all;
  if (blas_core && (!strcmp(blas_core, "SkylakeX") || !strcmp(blas_core, "Cooperlake"))) isa = dnnl_cpu_isa_avx512_core;
  else if (blas_core && (!strcmp(blas_core, "Haswell") || !strcmp(blas_core, "Zen"))) isa = dnnl_cpu_isa_avx2;
  else if (blas_core && !strcmp(blas_core, "Sandybridge")) isa = dnnl_cpu_isa_avx;
  else if (blas_core) isa = dnnl_cpu_isa_sse41;
  dnnl_set_max_cpu_isa(isa);
  if (dnnl_engine_create(&eng, dnnl_cpu, 0) || dnnl_stream_create(&strm, eng, dnnl_stream_default_flags)) eng = NULL;
}

static dnnl_memory_t mem_of(const dnnl_memory_desc_t *md) {
  dnnl_memory_t m = NULL;
  if (dnnl_memory_create(&m, md, eng, DNNL_MEMORY_NONE)) return NULL;
  return m;
}

static int reo_make(Reo *r, dnnl_memory_t from, dnnl_memory_t to, int sum) {
  const dnnl_memory_desc_t *a, *b;
  dnnl_memory_get_memory_desc(from, &a);
  dnnl_memory_get_memory_desc(to, &b);
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t po = NULL;
  if (sum) {
    if (dnnl_primitive_attr_create(&attr) || dnnl_post_ops_create(&po) || dnnl_post_ops_append_sum(po, 1.0f) ||
        dnnl_primitive_attr_set_post_ops(attr, po))
      return -1;
  }
  dnnl_primitive_desc_t pd;
  int bad = dnnl_reorder_primitive_desc_create(&pd, a, eng, b, eng, attr) != dnnl_success;
  if (po) dnnl_post_ops_destroy(po);
  if (attr) dnnl_primitive_attr_destroy(attr);
  if (bad) return -1;
  bad = dnnl_primitive_create(&r->p, pd) != dnnl_success;
  dnnl_primitive_desc_destroy(pd);
  r->from = from, r->to = to;
  return bad ? -1 : 0;
}

/* A primitive that was made and then fails to run has no fallback that would give the same bits:
 * the run stops, saying so. */
static void must(dnnl_status_t st, const char *what) {
  if (st == dnnl_success) return;
  fprintf(stderr, "piperun: error: oneDNN failed to run a convolution's %s (status %d)\n", what, (int)st);
  abort();
}

static void reo_run(Reo *r, const void *from, void *to) {
  must(dnnl_memory_set_data_handle(r->from, (void *)from), "input");
  must(dnnl_memory_set_data_handle(r->to, to), "output");
  dnnl_exec_arg_t a[2] = {{DNNL_ARG_FROM, r->from}, {DNNL_ARG_TO, r->to}};
  must(dnnl_primitive_execute(r->p, strm, 2, a), "reorder");
}

/* The primitives' layouts for one shape; 0 when every part was made. */
static int lib_make(Lib *L, int64_t work_bytes) {
  const ConvShape *s = L->s;
  int three = s->d > 1 || s->kd > 1 || s->od > 1, nd = three ? 5 : 4, g = s->group > 1;
  dnnl_dims_t xd, wd, yd, st, dl, pl, pr;
  xd[0] = s->n, xd[1] = s->c, yd[0] = s->n, yd[1] = s->m;
  int sp_in[3] = {s->d, s->h, s->w}, sp_out[3] = {s->od, s->oh, s->ow}, k[3] = {s->kd, s->kh, s->kw};
  int str[3] = {s->sd, s->sh, s->sw}, dil[3] = {s->dd, s->dh, s->dw}, pb[3] = {s->pd, s->ph, s->pw};
  int wi = 0;
  if (g) wd[wi++] = s->group;
  wd[wi++] = s->m / s->group, wd[wi++] = s->c / s->group;
  for (int i = 3 - (nd - 2), j = 0; i < 3; i++, j++) {
    xd[2 + j] = sp_in[i], yd[2 + j] = sp_out[i], wd[wi++] = k[i], st[j] = str[i], dl[j] = dil[i] - 1, pl[j] = pb[i];
    /* The end pad that gives this output size (ONNX's end pads may be larger than what is read). */
    pr[j] = (int64_t)(sp_out[i] - 1) * str[i] + (int64_t)(k[i] - 1) * dil[i] + 1 - sp_in[i] - pb[i];
  }
  dnnl_memory_desc_t ux, uw, uy, ax, aw, ay;
  dnnl_format_tag_t tx = three ? dnnl_ncdhw : dnnl_nchw, tw = g ? (three ? dnnl_goidhw : dnnl_goihw) : (three ? dnnl_oidhw : dnnl_oihw);
  if (dnnl_memory_desc_init_by_tag(&ux, nd, xd, dnnl_f32, tx) || dnnl_memory_desc_init_by_tag(&uw, nd + g, wd, dnnl_f32, tw) ||
      dnnl_memory_desc_init_by_tag(&uy, nd, yd, dnnl_f32, tx) ||
      dnnl_memory_desc_init_by_tag(&ax, nd, xd, dnnl_f32, dnnl_format_tag_any) ||
      dnnl_memory_desc_init_by_tag(&aw, nd + g, wd, dnnl_f32, dnnl_format_tag_any) ||
      dnnl_memory_desc_init_by_tag(&ay, nd, yd, dnnl_f32, dnnl_format_tag_any))
    return -1;
  dnnl_convolution_desc_t fd, dd, wdsc;
  dnnl_primitive_desc_t fpd = NULL, dpd = NULL, wpd = NULL;
  /* Each primitive's scratch memory comes from the workspace too (user scratchpad mode), so what a
   * convolution needs beside the plan's arena is only its code and descriptors. */
  dnnl_primitive_attr_t attr = NULL;
  int bad = dnnl_primitive_attr_create(&attr) || dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) ||
            dnnl_dilated_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct, &ax, &aw, NULL, &ay,
                                                       st, dl, pl, pr) ||
            dnnl_primitive_desc_create(&fpd, &fd, attr, eng, NULL) ||
            dnnl_dilated_convolution_backward_data_desc_init(&dd, dnnl_convolution_direct, &ax, &aw, &ay, st, dl, pl, pr) ||
            dnnl_primitive_desc_create(&dpd, &dd, attr, eng, fpd) ||
            dnnl_dilated_convolution_backward_weights_desc_init(&wdsc, dnnl_convolution_direct, &ax, &aw, NULL, &ay, st, dl, pl, pr) ||
            dnnl_primitive_desc_create(&wpd, &wdsc, attr, eng, fpd);
  if (attr) dnnl_primitive_attr_destroy(attr);
  if (!bad) {
    const dnnl_memory_desc_t *fx = dnnl_primitive_desc_query_md(fpd, dnnl_query_src_md, 0),
                             *fw = dnnl_primitive_desc_query_md(fpd, dnnl_query_weights_md, 0),
                             *fy = dnnl_primitive_desc_query_md(fpd, dnnl_query_dst_md, 0),
                             *ddy = dnnl_primitive_desc_query_md(dpd, dnnl_query_diff_dst_md, 0),
                             *dw = dnnl_primitive_desc_query_md(dpd, dnnl_query_weights_md, 0),
                             *ddx = dnnl_primitive_desc_query_md(dpd, dnnl_query_diff_src_md, 0),
                             *wx = dnnl_primitive_desc_query_md(wpd, dnnl_query_src_md, 0),
                             *wdy = dnnl_primitive_desc_query_md(wpd, dnnl_query_diff_dst_md, 0),
                             *wdw = dnnl_primitive_desc_query_md(wpd, dnnl_query_diff_weights_md, 0);
    /* The workspace: one region for x-sized tensors, one for y-sized, one for weights. */
    size_t szx = dnnl_memory_desc_get_size(fx), szy = dnnl_memory_desc_get_size(fy), szw = dnnl_memory_desc_get_size(fw), t;
    if ((t = dnnl_memory_desc_get_size(ddx)) > szx) szx = t;
    if ((t = dnnl_memory_desc_get_size(wx)) > szx) szx = t;
    if ((t = dnnl_memory_desc_get_size(ddy)) > szy) szy = t;
    if ((t = dnnl_memory_desc_get_size(wdy)) > szy) szy = t;
    if ((t = dnnl_memory_desc_get_size(dw)) > szw) szw = t;
    if ((t = dnnl_memory_desc_get_size(wdw)) > szw) szw = t;
    /* One scratch region serves the three primitives (they never run at once). */
    size_t scr = 0, scr_of[3] = {0, 0, 0};
    dnnl_primitive_desc_t pds[3] = {fpd, dpd, wpd};
    for (int i = 0; i < 3; i++) {
      const dnnl_memory_desc_t *sm = dnnl_primitive_desc_query_md(pds[i], dnnl_query_scratchpad_md, 0);
      scr_of[i] = sm ? dnnl_memory_desc_get_size(sm) : 0;
      if (scr_of[i] > scr) scr = scr_of[i];
      if (scr_of[i] > 0 && !(L->scr[i] = mem_of(sm))) bad = 1;
    }
    L->off_x = 0, L->off_y = (szx + 63) / 64 * 64, L->off_w = L->off_y + (szy + 63) / 64 * 64;
    L->off_s = L->off_w + (szw + 63) / 64 * 64, L->need = L->off_s + scr;
    if (getenv("PIPERUN_DNNL_SIZES"))
      fprintf(stderr, "dnnl conv %d->%d k%dx%d s%d %dx%d->%dx%d n%d: x %zu y %zu w %zu scratch %zu (f %zu d %zu w %zu) need %zu have %lld\n",
              s->c, s->m, s->kh, s->kw, s->sh, s->h, s->w, s->oh, s->ow, s->n, szx, szy, szw, scr, scr_of[0], scr_of[1], scr_of[2],
              L->need, (long long)work_bytes);
    if ((int64_t)L->need > work_bytes) bad = 1;
    L->f_x_plain = dnnl_memory_desc_equal(fx, &ux), L->f_w_plain = dnnl_memory_desc_equal(fw, &uw);
    L->f_y_plain = dnnl_memory_desc_equal(fy, &uy), L->d_dy_plain = dnnl_memory_desc_equal(ddy, &uy);
    L->d_w_plain = dnnl_memory_desc_equal(dw, &uw), L->w_x_plain = dnnl_memory_desc_equal(wx, &ux);
    L->w_dy_plain = dnnl_memory_desc_equal(wdy, &uy);
    if (!bad) {
      L->u_x = mem_of(&ux), L->u_w = mem_of(&uw), L->u_y = mem_of(&uy);
      L->f_x = mem_of(fx), L->f_w = mem_of(fw), L->f_y = mem_of(fy);
      L->d_dy = mem_of(ddy), L->d_w = mem_of(dw), L->d_dx = mem_of(ddx);
      L->w_x = mem_of(wx), L->w_dy = mem_of(wdy), L->w_dw = mem_of(wdw);
      bad = !L->u_x || !L->u_w || !L->u_y || !L->f_x || !L->f_w || !L->f_y || !L->d_dy || !L->d_w || !L->d_dx ||
            !L->w_x || !L->w_dy || !L->w_dw;
    }
    if (!bad)
      bad = dnnl_primitive_create(&L->fwd, fpd) || dnnl_primitive_create(&L->bdata, dpd) ||
            dnnl_primitive_create(&L->bweights, wpd) || (!L->f_x_plain && reo_make(&L->r_fx, L->u_x, L->f_x, 0)) ||
            (!L->f_w_plain && reo_make(&L->r_fw, L->u_w, L->f_w, 0)) || (!L->f_y_plain && reo_make(&L->r_fy, L->f_y, L->u_y, 0)) ||
            (!L->d_dy_plain && reo_make(&L->r_ddy, L->u_y, L->d_dy, 0)) ||
            (!L->d_w_plain && reo_make(&L->r_dw, L->u_w, L->d_w, 0)) || reo_make(&L->r_ddx, L->d_dx, L->u_x, 0) ||
            reo_make(&L->r_ddx_sum, L->d_dx, L->u_x, 1) || (!L->w_x_plain && reo_make(&L->r_wx, L->u_x, L->w_x, 0)) ||
            (!L->w_dy_plain && reo_make(&L->r_wdy, L->u_y, L->w_dy, 0)) || reo_make(&L->r_wdw, L->w_dw, L->u_w, 0) ||
            reo_make(&L->r_wdw_sum, L->w_dw, L->u_w, 1);
  }
  if (fpd) dnnl_primitive_desc_destroy(fpd);
  if (dpd) dnnl_primitive_desc_destroy(dpd);
  if (wpd) dnnl_primitive_desc_destroy(wpd);
  return bad ? -1 : 0;
}

static Lib *lib_for(const ConvShape *s, int64_t work_bytes) {
  if (!inited) pr_conv_lib_init(NULL, 1);
  if (!eng) return NULL;
  for (int i = 0; i < nlibs; i++)
    if (libs[i].s == s) return libs[i].ok > 0 ? &libs[i] : NULL;
  if (nlibs == caplibs) {
    caplibs = caplibs ? 2 * caplibs : 16;
    Lib *n = realloc(libs, sizeof *libs * (size_t)caplibs);
    if (!n) return NULL;
    libs = n;
  }
  Lib *L = &libs[nlibs++];
  memset(L, 0, sizeof *L);
  L->s = s;
  L->ok = lib_make(L, work_bytes) == 0 ? 1 : -1;
  if (L->ok < 0)
    fprintf(stderr, "piperun: note: oneDNN did not take a convolution (%d -> %d channels, %dx%d kernel; workspace %lld bytes, "
            "needs %zu); it runs as im2col + GEMM\n", s->c, s->m, s->kh, s->kw, (long long)work_bytes, L->need);
  return L->ok > 0 ? L : NULL;
}

/* Runs a convolution primitive on three tensors, with its scratch memory (if any) at the workspace's
 * scratch region. */
static void run3(dnnl_primitive_t p, dnnl_memory_t scr, char *ws, int a0, dnnl_memory_t m0, int a1, dnnl_memory_t m1, int a2,
                 dnnl_memory_t m2) {
  dnnl_exec_arg_t a[4] = {{a0, m0}, {a1, m1}, {a2, m2}, {DNNL_ARG_SCRATCHPAD, scr}};
  if (scr) must(dnnl_memory_set_data_handle(scr, ws), "scratch");
  must(dnnl_primitive_execute(p, strm, scr ? 4 : 3, a), "convolution");
  must(dnnl_stream_wait(strm), "stream");
}

/* Puts a plain tensor where a primitive wants it: the tensor itself when the layouts agree, else
 * its reorder into the workspace at `at`. */
static void *place(int plain, Reo *r, dnnl_memory_t m, const float *plain_p, char *at) {
  void *p = plain ? (void *)plain_p : at;
  if (!plain) reo_run(r, plain_p, at);
  dnnl_memory_set_data_handle(m, p);
  return p;
}

int pr_conv_lib_fwd(const ConvShape *s, const float *x, const float *w, const float *b, float *y, float *work) {
  Lib *L = lib_for(s, s->lib_work);
  if (!L) return -1;
  char *ws = (char *)work;
  place(L->f_x_plain, &L->r_fx, L->f_x, x, ws + L->off_x);
  place(L->f_w_plain, &L->r_fw, L->f_w, w, ws + L->off_w);
  dnnl_memory_set_data_handle(L->f_y, L->f_y_plain ? (void *)y : ws + L->off_y);
  run3(L->fwd, L->scr[0], ws + L->off_s, DNNL_ARG_SRC, L->f_x, DNNL_ARG_WEIGHTS, L->f_w, DNNL_ARG_DST, L->f_y);
  if (!L->f_y_plain) reo_run(&L->r_fy, ws + L->off_y, y);
  if (b) { /* after the sum, as the im2col path adds it */
    int64_t sp = (int64_t)s->od * s->oh * s->ow;
    for (int n = 0; n < s->n; n++)
      for (int m = 0; m < s->m; m++) {
        float *yr = y + ((int64_t)n * s->m + m) * sp, bm = b[m];
        for (int64_t p = 0; p < sp; p++) yr[p] += bm;
      }
  }
  return 0;
}

/* dx (+)= the input gradient: computed in the workspace, then reordered into dx (adding when acc). */
int pr_conv_lib_bwd_data(const ConvShape *s, const float *w, const float *dy, float *dx, int acc, float *work) {
  Lib *L = lib_for(s, s->lib_work);
  if (!L) return -1;
  char *ws = (char *)work;
  place(L->d_dy_plain, &L->r_ddy, L->d_dy, dy, ws + L->off_y);
  place(L->d_w_plain, &L->r_dw, L->d_w, w, ws + L->off_w);
  dnnl_memory_set_data_handle(L->d_dx, ws + L->off_x);
  run3(L->bdata, L->scr[1], ws + L->off_s, DNNL_ARG_DIFF_DST, L->d_dy, DNNL_ARG_WEIGHTS, L->d_w, DNNL_ARG_DIFF_SRC, L->d_dx);
  reo_run(acc ? &L->r_ddx_sum : &L->r_ddx, ws + L->off_x, dx);
  return 0;
}

/* dw (+)= the weight gradient of this micro-batch, the same way. */
int pr_conv_lib_bwd_weights(const ConvShape *s, const float *x, const float *dy, float *dw, int acc, float *work) {
  Lib *L = lib_for(s, s->lib_work);
  if (!L) return -1;
  char *ws = (char *)work;
  place(L->w_x_plain, &L->r_wx, L->w_x, x, ws + L->off_x);
  place(L->w_dy_plain, &L->r_wdy, L->w_dy, dy, ws + L->off_y);
  dnnl_memory_set_data_handle(L->w_dw, ws + L->off_w);
  run3(L->bweights, L->scr[2], ws + L->off_s, DNNL_ARG_SRC, L->w_x, DNNL_ARG_DIFF_DST, L->w_dy, DNNL_ARG_DIFF_WEIGHTS, L->w_dw);
  reo_run(acc ? &L->r_wdw_sum : &L->r_wdw, ws + L->off_w, dw);
  return 0;
}
#endif
