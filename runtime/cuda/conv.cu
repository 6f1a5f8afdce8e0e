/* cuda/conv.cu - convolution (1-D, 2-D, 3-D; groups, strides, pads, dilations) on the GPU: im2col + cuBLAS
 * GEMM, the arithmetic of cpu/conv.h's im2col path (which a convolution of one point, or oneDNN, only
 * reorders).  Kernels of cuda/conv.h.
 *
 * The columns of `nc` images at once (as many as fit CHUNK floats of scratch) are laid out per group:
 * col[g][r][n][p], r = ((ci * kd + kz) * kh + ki) * kw + kj the row of cpu/conv.h's im2col, n the image
 * in the chunk, p the output point, so that group g's columns are one [kk, nc * sp] matrix.  Then:
 *   forward:  y[n][g] = W_g col_g[n]: one strided-batched GEMM over the images (one group, images of 128
 *             points or more), or one over the groups into scratch [M][nc][sp] and a copy to y's layout;
 *             the bias is added after, as the CPU adds it;
 *   dW:       dW_g (+)= dy_g col_g^T over all the chunk's images in one GEMM (dy copied to [M][nc][sp]),
 *             chunk after chunk with beta 1: a fixed order, no atomics;
 *   dx:       dcol_g = W_g^T dy_g, then each dx element gathers its taps in the CPU's order (col2im);
 *   db:       a block per channel and run of images, a fixed tree each, then the runs in order.
 * Index arithmetic is 32-bit with multiply-shift division where a chunk's indices fit, 64-bit otherwise. */
#include "common.cuh"
#include "kernels.h"

/* Scratch floats for one chunk of images (at least one image is taken). */
#define CHUNK_DEFAULT ((int64_t)1 << 26)
static int64_t chunk_floats = CHUNK_DEFAULT;
/* For the checks (tests/gpu/k_conv.c): the chunk (0: the default); the 64-bit kernels always (wide); one
 * GEMM into scratch and a copy for one group too (big). */
static int force_wide, force_big;
extern "C" void pr_cu_conv_chunk(int64_t floats) { chunk_floats = floats > 0 ? floats : CHUNK_DEFAULT; }
extern "C" void pr_cu_conv_paths(int wide, int big) { force_wide = wide, force_big = big; }

#define LAUNCH(n) pr_cu_blocks((n), PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream

/* ---- 32-bit index kernels ----
 * n / d for n < 2^31 as a multiply and a shift (the magic number of Granlund and Montgomery, as PyTorch's
 * IntDivider): q = (umulhi(n, m) + n) >> s. */
struct Div {
  unsigned d, m, s;
};
static Div mkdiv(int64_t d64) {
  Div v;
  unsigned d = (unsigned)d64;
  v.d = d;
  for (v.s = 0; v.s < 32; v.s++)
    if ((1ull << v.s) >= d) break;
  v.m = (unsigned)(((1ull << 32) * ((1ull << v.s) - d)) / d + 1);
  return v;
}
__device__ __forceinline__ unsigned dq(unsigned n, Div v) { return (__umulhi(n, v.m) + n) >> v.s; }

/* A chunk's geometry for the 32-bit kernels. */
struct Geo {
  int c, d, h, w, od, oh, ow, kd, kh, kw, sd, sh, sw, pd, ph, pw, dd, dh, dw, cnt;
  unsigned sp, kvol, ncols, rows; /* rows: c * kvol */
  Div dsp, dow, doh, dkvol, dkw, dkh, dsd, dsh, dsw, dw_in, dh_in, dd_in, dc;
};
static Geo mkgeo(const ConvShape *s, int cnt) {
  Geo g;
  g.c = s->c, g.d = s->d, g.h = s->h, g.w = s->w, g.od = s->od, g.oh = s->oh, g.ow = s->ow;
  g.kd = s->kd, g.kh = s->kh, g.kw = s->kw, g.sd = s->sd, g.sh = s->sh, g.sw = s->sw;
  g.pd = s->pd, g.ph = s->ph, g.pw = s->pw, g.dd = s->dd, g.dh = s->dh, g.dw = s->dw, g.cnt = cnt;
  g.sp = (unsigned)s->od * s->oh * s->ow, g.kvol = (unsigned)s->kd * s->kh * s->kw;
  g.ncols = (unsigned)cnt * g.sp, g.rows = (unsigned)s->c * g.kvol;
  g.dsp = mkdiv(g.sp), g.dow = mkdiv(s->ow), g.doh = mkdiv(s->oh), g.dkvol = mkdiv(g.kvol), g.dkw = mkdiv(s->kw);
  g.dkh = mkdiv(s->kh), g.dsd = mkdiv(s->sd), g.dsh = mkdiv(s->sh), g.dsw = mkdiv(s->sw), g.dw_in = mkdiv(s->w);
  g.dh_in = mkdiv(s->h), g.dd_in = mkdiv(s->d), g.dc = mkdiv(s->c);
  return g;
}

/* col[row][q] for images n0 ..: a thread per column q (image and output point), rows over the grid's y. */
__global__ void conv_im2col32(const float *x, float *col, Geo g, int n0) {
  unsigned q = blockIdx.x * blockDim.x + threadIdx.x;
  if (q >= g.ncols) return;
  unsigned nl = dq(q, g.dsp), p = q - nl * g.sp, t = dq(p, g.dow), ox = p - t * g.ow, oz = dq(t, g.doh), oy = t - oz * g.oh;
  const float *xn = x + ((int64_t)n0 + nl) * g.c * ((int64_t)g.d * g.h * g.w);
  int bz = (int)oz * g.sd - g.pd, by = (int)oy * g.sh - g.ph, bx = (int)ox * g.sw - g.pw;
  for (unsigned row = blockIdx.y; row < g.rows; row += gridDim.y) {
    unsigned c = dq(row, g.dkvol), tap = row - c * g.kvol, t2 = dq(tap, g.dkw), kj = tap - t2 * g.kw;
    unsigned kz = dq(t2, g.dkh), ki = t2 - kz * g.kh;
    int iz = bz + (int)kz * g.dd, iy = by + (int)ki * g.dh, ix = bx + (int)kj * g.dw;
    float v = 0.0f;
    if (iz >= 0 && iz < g.d && iy >= 0 && iy < g.h && ix >= 0 && ix < g.w)
      v = xn[((int64_t)c * g.d + iz) * ((int64_t)g.h * g.w) + (int64_t)iy * g.w + ix];
    col[(int64_t)row * g.ncols + q] = v;
  }
}

/* dx of images n0 .. from the columns' gradients: each element (written, or added to when acc) sums its
 * taps in the order kz, ki, kj, as k_col2im_add adds them. */
__global__ void conv_col2im32(const float *col, float *dx, Geo g, int n0, unsigned total, int acc) {
  float *dxc = dx + (int64_t)n0 * g.c * ((int64_t)g.d * g.h * g.w);
  for (unsigned idx = blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += gridDim.x * blockDim.x) {
    unsigned t = dq(idx, g.dw_in), ix = idx - t * g.w, t2 = dq(t, g.dh_in), iy = t - t2 * g.h;
    unsigned t3 = dq(t2, g.dd_in), iz = t2 - t3 * g.d, nl = dq(t3, g.dc), c = t3 - nl * g.c;
    const float *cb = col + (int64_t)c * g.kvol * g.ncols + (int64_t)nl * g.sp;
    float v = acc ? dxc[idx] : 0.0f;
    for (int kz = 0; kz < g.kd; kz++) {
      int tz = (int)iz + g.pd - kz * g.dd;
      if (tz < 0) continue;
      unsigned oz = dq((unsigned)tz, g.dsd);
      if ((int)(oz * g.sd) != tz || (int)oz >= g.od) continue;
      for (int ki = 0; ki < g.kh; ki++) {
        int ty = (int)iy + g.ph - ki * g.dh;
        if (ty < 0) continue;
        unsigned oy = dq((unsigned)ty, g.dsh);
        if ((int)(oy * g.sh) != ty || (int)oy >= g.oh) continue;
        for (int kj = 0; kj < g.kw; kj++) {
          int tx = (int)ix + g.pw - kj * g.dw;
          if (tx < 0) continue;
          unsigned ox = dq((unsigned)tx, g.dsw);
          if ((int)(ox * g.sw) != tx || (int)ox >= g.ow) continue;
          v += cb[(int64_t)((kz * g.kh + ki) * g.kw + kj) * g.ncols + (oz * g.oh + oy) * g.ow + ox];
        }
      }
    }
    dxc[idx] = v;
  }
}

/* y of images n0 .. n0 + cnt - 1 ([n][o][p]) from tmp[o][n][p], plus the bias. */
__global__ void conv_out32(const float *tmp, const float *b, float *y, int n0, unsigned cnt, unsigned m, Div dsp, Div dm,
                           unsigned total) {
  float *yc = y + (int64_t)n0 * m * dsp.d;
  for (unsigned idx = blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += gridDim.x * blockDim.x) {
    unsigned r = dq(idx, dsp), p = idx - r * dsp.d, nl = dq(r, dm), o = r - nl * m;
    float v = tmp[(o * cnt + nl) * dsp.d + p];
    yc[idx] = b ? v + b[o] : v;
  }
}

/* y[n][o][p] += b[o] over `total` floats from y. */
__global__ void conv_bias32(const float *b, float *y, unsigned m, Div dsp, Div dm, unsigned total) {
  for (unsigned idx = blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += gridDim.x * blockDim.x) {
    unsigned r = dq(idx, dsp), o = r - dq(r, dm) * m;
    y[idx] += b[o];
  }
}

/* dyT[o][n][p] = dy of images n0 .. n0 + cnt - 1 ([n][o][p]). */
__global__ void conv_dy_t32(const float *dy, float *dyt, int n0, unsigned cnt, unsigned m, Div dsp, Div dcnt,
                            unsigned total) {
  const float *dyc = dy + (int64_t)n0 * m * dsp.d;
  for (unsigned idx = blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += gridDim.x * blockDim.x) {
    unsigned r = dq(idx, dsp), p = idx - r * dsp.d, o = dq(r, dcnt), nl = r - o * cnt;
    dyt[idx] = dyc[(nl * m + o) * dsp.d + p];
  }
}

/* ---- 64-bit index kernels: the same arithmetic, for chunks whose indices do not fit ---- */

__global__ void conv_im2col64(const float *x, float *col, ConvShape s, int n0, int cnt) {
  int64_t kvol = (int64_t)s.kd * s.kh * s.kw, sp = (int64_t)s.od * s.oh * s.ow, ncols = cnt * sp,
          total = (int64_t)s.c * kvol * ncols;
  PR_CU_FOR(idx, total) {
    int64_t q = idx % ncols, row = idx / ncols; /* row = c * kvol + tap: g * kk + ci * kvol + tap */
    int64_t nl = q / sp, p = q % sp, c = row / kvol, t = row % kvol;
    int kj = (int)(t % s.kw), ki = (int)(t / s.kw % s.kh), kz = (int)(t / s.kw / s.kh);
    int ox = (int)(p % s.ow), oy = (int)(p / s.ow % s.oh), oz = (int)(p / s.ow / s.oh);
    int iz = oz * s.sd - s.pd + kz * s.dd, iy = oy * s.sh - s.ph + ki * s.dh, ix = ox * s.sw - s.pw + kj * s.dw;
    float v = 0.0f;
    if (iz >= 0 && iz < s.d && iy >= 0 && iy < s.h && ix >= 0 && ix < s.w)
      v = x[((((int64_t)n0 + nl) * s.c + c) * s.d + iz) * ((int64_t)s.h * s.w) + (int64_t)iy * s.w + ix];
    col[idx] = v;
  }
}

__global__ void conv_col2im64(const float *col, float *dx, ConvShape s, int n0, int cnt, int acc) {
  int64_t kvol = (int64_t)s.kd * s.kh * s.kw, sp = (int64_t)s.od * s.oh * s.ow, ncols = cnt * sp;
  int64_t total = (int64_t)cnt * s.c * s.d * s.h * s.w;
  float *dxc = dx + (int64_t)n0 * s.c * s.d * s.h * s.w;
  PR_CU_FOR(idx, total) {
    int ix = (int)(idx % s.w), iy = (int)(idx / s.w % s.h), iz = (int)(idx / s.w / s.h % s.d);
    int64_t t = idx / s.w / s.h / s.d, c = t % s.c, nl = t / s.c;
    const float *cb = col + c * kvol * ncols + nl * sp;
    float v = acc ? dxc[idx] : 0.0f;
    for (int kz = 0; kz < s.kd; kz++) {
      int tz = iz + s.pd - kz * s.dd;
      if (tz < 0 || tz % s.sd) continue;
      int oz = tz / s.sd;
      if (oz >= s.od) continue;
      for (int ki = 0; ki < s.kh; ki++) {
        int ty = iy + s.ph - ki * s.dh;
        if (ty < 0 || ty % s.sh) continue;
        int oy = ty / s.sh;
        if (oy >= s.oh) continue;
        for (int kj = 0; kj < s.kw; kj++) {
          int tx = ix + s.pw - kj * s.dw;
          if (tx < 0 || tx % s.sw) continue;
          int ox = tx / s.sw;
          if (ox >= s.ow) continue;
          v += cb[(int64_t)((kz * s.kh + ki) * s.kw + kj) * ncols + ((int64_t)oz * s.oh + oy) * s.ow + ox];
        }
      }
    }
    dxc[idx] = v;
  }
}

__global__ void conv_out64(const float *tmp, const float *b, float *y, int n0, int cnt, int m, int64_t sp) {
  int64_t total = (int64_t)cnt * m * sp;
  float *yc = y + (int64_t)n0 * m * sp;
  PR_CU_FOR(idx, total) {
    int64_t p = idx % sp, o = idx / sp % m, nl = idx / sp / m;
    float v = tmp[(o * cnt + nl) * sp + p];
    yc[idx] = b ? v + b[o] : v;
  }
}

__global__ void conv_bias64(const float *b, float *y, int64_t total, int m, int64_t sp) {
  PR_CU_FOR(idx, total) y[idx] += b[idx / sp % m];
}

__global__ void conv_dy_t64(const float *dy, float *dyt, int n0, int cnt, int m, int64_t sp) {
  int64_t total = (int64_t)cnt * m * sp;
  const float *dyc = dy + (int64_t)n0 * m * sp;
  PR_CU_FOR(idx, total) {
    int64_t p = idx % sp, nl = idx / sp % cnt, o = idx / sp / cnt;
    dyt[idx] = dyc[(nl * m + o) * sp + p];
  }
}

/* ---- the bias's gradient ----
 * part[o][r] = the sum of dy[n][o][p] over run r's images (DB_RUN points or more a run, whole images): a
 * block each, each thread's points in order, then a fixed tree; then db[o] (+)= the runs in order. */
#define DB_THREADS 256
#define DB_RUN 8192
__global__ void conv_db_part(const float *dy, float *part, int n, int m, int64_t sp, int per_run, int runs) {
  __shared__ float red[DB_THREADS];
  int o = blockIdx.x, r = blockIdx.y, tid = threadIdx.x;
  int n1 = (r + 1) * per_run < n ? (r + 1) * per_run : n;
  float v = 0.0f;
  for (int img = r * per_run; img < n1; img++) {
    const float *row = dy + ((int64_t)img * m + o) * sp;
    for (int64_t p = tid; p < sp; p += DB_THREADS) v += row[p];
  }
  red[tid] = v;
  __syncthreads();
  for (int w = DB_THREADS / 2; w > 0; w >>= 1) {
    if (tid < w) red[tid] += red[tid + w];
    __syncthreads();
  }
  if (tid == 0) part[(int64_t)o * runs + r] = red[0];
}
__global__ void conv_db_sum(const float *part, float *db, int m, int runs, int acc) {
  PR_CU_FOR(o, m) {
    float v = acc ? db[o] : 0.0f;
    for (int r = 0; r < runs; r++) v += part[o * runs + r];
    db[o] = v;
  }
}
/* Images a run, and runs (at most 65535: the grid's y). */
static int db_runs(const ConvShape *s, int64_t sp, int *per_run) {
  int64_t per = (DB_RUN + sp - 1) / sp;
  if (per * 65535 < s->n) per = (s->n + 65534) / 65535;
  if (per > s->n) per = s->n;
  *per_run = (int)per;
  return (int)((s->n + per - 1) / per);
}

/* Whether a chunk's indices fit the 32-bit kernels (with room for a grid stride, at most 2^28, past the end). */
static int fits(int64_t n) { return !force_wide && n < ((int64_t)1 << 30); }

static void im2col(const float *x, float *col, const ConvShape *s, int n0, int cnt) {
  int64_t ncols = (int64_t)cnt * s->od * s->oh * s->ow, rows = (int64_t)s->c * s->kd * s->kh * s->kw;
  if (fits(ncols * rows)) {
    unsigned gx = (unsigned)((ncols + PR_CU_THREADS - 1) / PR_CU_THREADS), gy = (4096 + gx - 1) / gx;
    if (gy > rows) gy = (unsigned)rows;
    if (gy > 65535) gy = 65535;
    conv_im2col32<<<dim3(gx, gy), PR_CU_THREADS, 0, pr_cu_stream>>>(x, col, mkgeo(s, cnt), n0);
  } else conv_im2col64<<<LAUNCH(ncols * rows)>>>(x, col, *s, n0, cnt);
  PR_CU_LAUNCHED();
}

/* Images per chunk: as many as CHUNK floats of scratch hold, each needing its columns and a copy of its
 * output (or its output's gradient). */
static int conv_chunk(const ConvShape *s, int64_t *per_image) {
  int64_t kvol = (int64_t)s->kd * s->kh * s->kw, sp = (int64_t)s->od * s->oh * s->ow;
  *per_image = (int64_t)s->c * kvol * sp + (int64_t)s->m * sp;
  int64_t nc = chunk_floats / *per_image;
  if (nc < 1) nc = 1;
  if (nc > s->n) nc = s->n;
  return (int)nc;
}

extern "C" void kc_conv(const float *x, const float *w, const float *b, float *y, float *col, const ConvShape *s) {
  (void)col; /* sized for one image and group on the CPU: the chunk's columns are in scratch */
  if (s->n <= 0) return;
  int G = s->group, cg = s->c / G, mg = s->m / G, kvol = s->kd * s->kh * s->kw, kk = cg * kvol;
  int64_t sp = (int64_t)s->od * s->oh * s->ow, per_image;
  int nc = conv_chunk(s, &per_image);
  float *cols = (float *)pr_cu_scratch(per_image * nc * (int64_t)sizeof(float));
  float *tmp = cols + (int64_t)s->c * kvol * sp * nc;
  for (int n0 = 0; n0 < s->n; n0 += nc) {
    int cnt = s->n - n0 < nc ? s->n - n0 : nc;
    int64_t ncols = cnt * sp, total = (int64_t)cnt * s->m * sp;
    im2col(x, cols, s, n0, cnt);
    float *out = y + (int64_t)n0 * s->m * sp;
    /* One group: y[n] = W col[n], image by image (col[n]: columns n * sp .. of [kk, ncols]), unless the
     * images are small (7x7: one GEMM and a copy took 0.20 ms against 0.26 on an H100, 56x56: 0.37 against 0.36). */
    if (G == 1 && !force_big && sp >= 128)
      pr_cu_sgemm(0, 0, s->m, (int)sp, kk, 1.0f, w, kk, 0, cols, (int)ncols, sp, 0.0f, out, (int)sp, s->m * sp, cnt);
    else if (cnt == 1) /* group by group: [M][1][sp] is y's own layout */
      pr_cu_sgemm(0, 0, mg, (int)ncols, kk, 1.0f, w, kk, (int64_t)mg * kk, cols, (int)ncols, (int64_t)kk * ncols, 0.0f,
                  out, (int)ncols, (int64_t)mg * ncols, G);
    else { /* group by group into tmp[o][n][p], then to y with the bias */
      pr_cu_sgemm(0, 0, mg, (int)ncols, kk, 1.0f, w, kk, (int64_t)mg * kk, cols, (int)ncols, (int64_t)kk * ncols, 0.0f,
                  tmp, (int)ncols, (int64_t)mg * ncols, G);
      if (fits(total))
        conv_out32<<<LAUNCH(total)>>>(tmp, b, y, n0, cnt, s->m, mkdiv(sp), mkdiv(s->m), (unsigned)total);
      else conv_out64<<<LAUNCH(total)>>>(tmp, b, y, n0, cnt, s->m, sp);
      PR_CU_LAUNCHED();
      continue;
    }
    if (b) { /* the bias after the product, as the CPU adds it */
      if (fits(total)) conv_bias32<<<LAUNCH(total)>>>(b, out, s->m, mkdiv(sp), mkdiv(s->m), (unsigned)total);
      else conv_bias64<<<LAUNCH(total)>>>(b, out, total, s->m, sp);
      PR_CU_LAUNCHED();
    }
  }
}

extern "C" void kc_conv_grad(const float *x, const float *w, const float *dy, float *dx, float *dw, float *db, float *col,
                             const ConvShape *s, int acc_x, int acc_w) {
  (void)col;
  if (s->n <= 0) return;
  int G = s->group, cg = s->c / G, mg = s->m / G, kvol = s->kd * s->kh * s->kw, kk = cg * kvol;
  int64_t sp = (int64_t)s->od * s->oh * s->ow, per_image;
  int nc = conv_chunk(s, &per_image), per_run, runs = db_runs(s, sp, &per_run);
  int64_t col_floats = dx || dw ? per_image * nc : 0;
  float *cols = (float *)pr_cu_scratch((col_floats + (db ? (int64_t)s->m * runs : 0)) * (int64_t)sizeof(float));
  float *dyt_buf = cols + (int64_t)s->c * kvol * sp * nc, *part = cols + col_floats;
  if (db) {
    conv_db_part<<<dim3(s->m, runs), DB_THREADS, 0, pr_cu_stream>>>(dy, part, s->n, s->m, sp, per_run, runs);
    PR_CU_LAUNCHED();
    conv_db_sum<<<LAUNCH(s->m)>>>(part, db, s->m, runs, acc_w);
    PR_CU_LAUNCHED();
  }
  if (!dx && !dw) return;
  for (int n0 = 0; n0 < s->n; n0 += nc) {
    int cnt = s->n - n0 < nc ? s->n - n0 : nc;
    int64_t ncols = cnt * sp;
    /* dy of the chunk as [M][cnt][sp]: dy itself for one image */
    const float *dyt = dy + (int64_t)n0 * s->m * sp;
    if (cnt > 1) {
      int64_t total = (int64_t)cnt * s->m * sp;
      if (fits(total))
        conv_dy_t32<<<LAUNCH(total)>>>(dy, dyt_buf, n0, cnt, s->m, mkdiv(sp), mkdiv(cnt), (unsigned)total);
      else conv_dy_t64<<<LAUNCH(total)>>>(dy, dyt_buf, n0, cnt, s->m, sp);
      PR_CU_LAUNCHED();
      dyt = dyt_buf;
    }
    if (dw) { /* dW_g (+)= dy_g [mg, ncols] . col_g^T [ncols, kk] */
      im2col(x, cols, s, n0, cnt);
      pr_cu_sgemm(0, 1, mg, kk, (int)ncols, 1.0f, dyt, (int)ncols, (int64_t)mg * ncols, cols, (int)ncols,
                  (int64_t)kk * ncols, acc_w || n0 > 0 ? 1.0f : 0.0f, dw, kk, (int64_t)mg * kk, G);
    }
    if (dx) { /* dcol_g [kk, ncols] = W_g^T [kk, mg] . dy_g [mg, ncols], then gathered into dx */
      pr_cu_sgemm(1, 0, kk, (int)ncols, mg, 1.0f, w, kk, (int64_t)mg * kk, dyt, (int)ncols, (int64_t)mg * ncols, 0.0f, cols,
                  (int)ncols, (int64_t)kk * ncols, G);
      int64_t total = (int64_t)cnt * s->c * s->d * s->h * s->w;
      if (fits(total) && fits((int64_t)s->c * kvol * ncols))
        conv_col2im32<<<LAUNCH(total)>>>(cols, dx, mkgeo(s, cnt), n0, (unsigned)total, acc_x);
      else conv_col2im64<<<LAUNCH(total)>>>(cols, dx, *s, n0, cnt, acc_x);
      PR_CU_LAUNCHED();
    }
  }
}
