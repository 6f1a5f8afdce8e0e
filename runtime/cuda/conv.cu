/* cuda/conv.cu - convolution (1-D, 2-D, 3-D; groups, strides, pads, dilations) on the GPU: im2col + cuBLAS
 * GEMM, the arithmetic of cpu/conv.h's im2col path (which a convolution of one point, or oneDNN, only
 * reorders).  Kernels of cuda/conv.h.
 *
 * The columns of `nc` images at once (as many as fit CHUNK floats of scratch) are laid out per group:
 * col[g][r][n][p], r = ((ci * kd + kz) * kh + ki) * kw + kj the row of cpu/conv.h's im2col, n the image
 * in the chunk, p the output point, so that group g's columns are one [kk, nc * sp] matrix.  Then:
 *   forward:  y[n][g] = W_g col_g[n]: one strided-batched GEMM over the images (one group), or over the
 *             groups into scratch [M][nc][sp] and a copy to y's layout; the bias is added after, as the CPU;
 *   dW:       dW_g (+)= dy_g col_g^T over all the chunk's images in one GEMM (dy copied to [M][nc][sp]),
 *             chunk after chunk with beta 1: a fixed order, no atomics;
 *   dx:       dcol_g = W_g^T dy_g, then each dx element gathers its taps in the CPU's order (col2im);
 *   db:       one block per channel, a fixed tree over the images' points. */
#include "common.cuh"
#include "kernels.h"

/* Scratch floats for one chunk of images (at least one image); pr_cu_conv_chunk changes it (checks). */
static int64_t chunk_floats = (int64_t)1 << 26;
extern "C" void pr_cu_conv_chunk(int64_t floats) { chunk_floats = floats > 0 ? floats : (int64_t)1 << 26; }

/* Row-major C = alpha op(A) op(B) + beta C, `count` products sA, sB, sC floats apart: cuBLAS, column-major,
 * computes C^T = op(B)^T op(A)^T. */
static void sgemm_rm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, int64_t sA,
                     const float *B, int ldb, int64_t sB, float beta, float *C, int ldc, int64_t sC, int64_t count) {
  if (M <= 0 || N <= 0 || count <= 0) return;
  cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (count == 1)
    PR_CUBLAS(cublasGemmEx(pr_cu_blas, ob, oa, N, M, K, &alpha, B, CUDA_R_32F, ldb, A, CUDA_R_32F, lda, &beta, C,
                           CUDA_R_32F, ldc, pr_cu_compute_type(), CUBLAS_GEMM_DEFAULT));
  else
    PR_CUBLAS(cublasGemmStridedBatchedEx(pr_cu_blas, ob, oa, N, M, K, &alpha, B, CUDA_R_32F, ldb, sB, A, CUDA_R_32F,
                                         lda, sA, &beta, C, CUDA_R_32F, ldc, sC, (int)count, pr_cu_compute_type(),
                                         CUBLAS_GEMM_DEFAULT));
}

#define LAUNCH(n) pr_cu_blocks((n), PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream

/* col[g][r][n][p] of images n0 .. n0 + cnt - 1 (I: the index type, int where everything fits). */
template <typename I> __global__ void conv_im2col(const float *x, float *col, ConvShape s, int n0, int cnt) {
  I kvol = (I)s.kd * s.kh * s.kw, sp = (I)s.od * s.oh * s.ow, ncols = (I)cnt * sp, total = (I)s.c * kvol * ncols;
  for (I idx = blockIdx.x * (I)blockDim.x + threadIdx.x; idx < total; idx += (I)gridDim.x * blockDim.x) {
    I q = idx % ncols, row = idx / ncols; /* row = c * kvol + tap: g * kk + ci * kvol + tap */
    I nl = q / sp, p = q % sp, c = row / kvol, t = row % kvol;
    int kj = (int)(t % s.kw), ki = (int)(t / s.kw % s.kh), kz = (int)(t / s.kw / s.kh);
    int ox = (int)(p % s.ow), oy = (int)(p / s.ow % s.oh), oz = (int)(p / s.ow / s.oh);
    int iz = oz * s.sd - s.pd + kz * s.dd, iy = oy * s.sh - s.ph + ki * s.dh, ix = ox * s.sw - s.pw + kj * s.dw;
    float v = 0.0f;
    if (iz >= 0 && iz < s.d && iy >= 0 && iy < s.h && ix >= 0 && ix < s.w)
      v = x[((((int64_t)n0 + nl) * s.c + c) * s.d + iz) * ((int64_t)s.h * s.w) + (int64_t)iy * s.w + ix];
    col[idx] = v;
  }
}

/* dx of images n0 .. n0 + cnt - 1 from the columns' gradients: each element (written, or added to when acc)
 * sums its taps in the order kz, ki, kj, as k_col2im_add adds them. */
template <typename I> __global__ void conv_col2im(const float *col, float *dx, ConvShape s, int n0, int cnt, int acc) {
  I kvol = (I)s.kd * s.kh * s.kw, sp = (I)s.od * s.oh * s.ow, ncols = (I)cnt * sp;
  I total = (I)cnt * s.c * s.d * s.h * s.w;
  float *dxc = dx + (int64_t)n0 * s.c * s.d * s.h * s.w;
  for (I idx = blockIdx.x * (I)blockDim.x + threadIdx.x; idx < total; idx += (I)gridDim.x * blockDim.x) {
    int ix = (int)(idx % s.w), iy = (int)(idx / s.w % s.h), iz = (int)(idx / s.w / s.h % s.d);
    I t = idx / s.w / s.h / s.d, c = t % s.c, nl = t / s.c;
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
          v += cb[(I)((kz * s.kh + ki) * s.kw + kj) * ncols + ((I)oz * s.oh + oy) * s.ow + ox];
        }
      }
    }
    dxc[idx] = v;
  }
}

/* y of images n0 .. n0 + cnt - 1 from tmp[o][n][p] (the groups' products), plus the bias. */
template <typename I> __global__ void conv_out(const float *tmp, const float *b, float *y, int n0, int cnt, int m, I sp) {
  I total = (I)cnt * m * sp;
  float *yc = y + (int64_t)n0 * m * sp;
  for (I idx = blockIdx.x * (I)blockDim.x + threadIdx.x; idx < total; idx += (I)gridDim.x * blockDim.x) {
    I p = idx % sp, o = idx / sp % m, nl = idx / sp / m;
    float v = tmp[(o * cnt + nl) * sp + p];
    yc[idx] = b ? v + b[o] : v;
  }
}

/* y[n][o][p] += b[o] over `total` floats of y. */
template <typename I> __global__ void conv_bias(const float *b, float *y, I total, int m, I sp) {
  for (I idx = blockIdx.x * (I)blockDim.x + threadIdx.x; idx < total; idx += (I)gridDim.x * blockDim.x)
    y[idx] += b[idx / sp % m];
}

/* dyT[o][n][p] = dy of images n0 .. n0 + cnt - 1 ([n][o][p]). */
template <typename I> __global__ void conv_dy_t(const float *dy, float *dyt, int n0, int cnt, int m, I sp) {
  I total = (I)cnt * m * sp;
  const float *dyc = dy + (int64_t)n0 * m * sp;
  for (I idx = blockIdx.x * (I)blockDim.x + threadIdx.x; idx < total; idx += (I)gridDim.x * blockDim.x) {
    I p = idx % sp, nl = idx / sp % cnt, o = idx / sp / cnt;
    dyt[idx] = dyc[(nl * m + o) * sp + p];
  }
}

/* db[o] (+)= the sum of dy[n][o][p] over every image and point: a block per channel, each thread's points
 * in order, then a fixed tree. */
#define DB_THREADS 256
__global__ void conv_db(const float *dy, float *db, int n, int m, int64_t sp, int acc) {
  __shared__ float red[DB_THREADS];
  int o = blockIdx.x, tid = threadIdx.x;
  float v = 0.0f;
  for (int64_t i = tid; i < (int64_t)n * sp; i += DB_THREADS) {
    int64_t img = i / sp, p = i % sp;
    v += dy[(img * m + o) * sp + p];
  }
  red[tid] = v;
  __syncthreads();
  for (int w = DB_THREADS / 2; w > 0; w >>= 1) {
    if (tid < w) red[tid] += red[tid + w];
    __syncthreads();
  }
  if (tid == 0) db[o] = acc ? db[o] + red[0] : red[0];
}

/* Whether indices up to n fit an int (with room for the grid stride, at most 2^28, past the last). */
static int fits(int64_t n) { return n < ((int64_t)1 << 30); }

static void im2col(const float *x, float *col, const ConvShape *s, int n0, int cnt, int64_t total) {
  if (fits(total)) conv_im2col<int><<<LAUNCH(total)>>>(x, col, *s, n0, cnt);
  else conv_im2col<int64_t><<<LAUNCH(total)>>>(x, col, *s, n0, cnt);
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
    int64_t ncols = cnt * sp;
    im2col(x, cols, s, n0, cnt, (int64_t)s->c * kvol * ncols);
    float *out = y + (int64_t)n0 * s->m * sp;
    int64_t total = (int64_t)cnt * s->m * sp;
    if (G == 1) /* y[n] = W col[n], image by image (col[n]: columns n * sp .. of the [kk, ncols] matrix) */
      sgemm_rm(0, 0, s->m, (int)sp, kk, 1.0f, w, kk, 0, cols, (int)ncols, sp, 0.0f, out, (int)sp, s->m * sp, cnt);
    else if (cnt == 1) /* group by group: [M][1][sp] is y's own layout */
      sgemm_rm(0, 0, mg, (int)ncols, kk, 1.0f, w, kk, (int64_t)mg * kk, cols, (int)ncols, (int64_t)kk * ncols, 0.0f,
               out, (int)ncols, (int64_t)mg * ncols, G);
    else { /* group by group into tmp[o][n][p], then to y with the bias */
      sgemm_rm(0, 0, mg, (int)ncols, kk, 1.0f, w, kk, (int64_t)mg * kk, cols, (int)ncols, (int64_t)kk * ncols, 0.0f,
               tmp, (int)ncols, (int64_t)mg * ncols, G);
      if (fits(total)) conv_out<int><<<LAUNCH(total)>>>(tmp, b, y, n0, cnt, s->m, (int)sp);
      else conv_out<int64_t><<<LAUNCH(total)>>>(tmp, b, y, n0, cnt, s->m, sp);
      PR_CU_LAUNCHED();
      continue;
    }
    if (b) { /* the bias after the product, as the CPU adds it */
      if (fits(total)) conv_bias<int><<<LAUNCH(total)>>>(b, out, total, s->m, (int)sp);
      else conv_bias<int64_t><<<LAUNCH(total)>>>(b, out, total, s->m, sp);
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
  if (db) {
    conv_db<<<s->m, DB_THREADS, 0, pr_cu_stream>>>(dy, db, s->n, s->m, sp, acc_w);
    PR_CU_LAUNCHED();
  }
  if (!dx && !dw) return;
  int nc = conv_chunk(s, &per_image);
  float *cols = (float *)pr_cu_scratch(per_image * nc * (int64_t)sizeof(float));
  float *dyt_buf = cols + (int64_t)s->c * kvol * sp * nc;
  for (int n0 = 0; n0 < s->n; n0 += nc) {
    int cnt = s->n - n0 < nc ? s->n - n0 : nc;
    int64_t ncols = cnt * sp, ctotal = (int64_t)s->c * kvol * ncols;
    /* dy of the chunk as [M][cnt][sp]: dy itself for one image */
    const float *dyt = dy + (int64_t)n0 * s->m * sp;
    if (cnt > 1) {
      int64_t total = (int64_t)cnt * s->m * sp;
      if (fits(total)) conv_dy_t<int><<<LAUNCH(total)>>>(dy, dyt_buf, n0, cnt, s->m, (int)sp);
      else conv_dy_t<int64_t><<<LAUNCH(total)>>>(dy, dyt_buf, n0, cnt, s->m, sp);
      PR_CU_LAUNCHED();
      dyt = dyt_buf;
    }
    if (dw) { /* dW_g (+)= dy_g [mg, ncols] . col_g^T [ncols, kk] */
      im2col(x, cols, s, n0, cnt, ctotal);
      sgemm_rm(0, 1, mg, kk, (int)ncols, 1.0f, dyt, (int)ncols, (int64_t)mg * ncols, cols, (int)ncols,
               (int64_t)kk * ncols, acc_w || n0 > 0 ? 1.0f : 0.0f, dw, kk, (int64_t)mg * kk, G);
    }
    if (dx) { /* dcol_g [kk, ncols] = W_g^T [kk, mg] . dy_g [mg, ncols], then gathered into dx */
      sgemm_rm(1, 0, kk, (int)ncols, mg, 1.0f, w, kk, (int64_t)mg * kk, dyt, (int)ncols, (int64_t)mg * ncols, 0.0f, cols,
               (int)ncols, (int64_t)kk * ncols, G);
      int64_t total = (int64_t)cnt * s->c * s->d * s->h * s->w;
      if (fits(total) && fits(ctotal)) conv_col2im<int><<<LAUNCH(total)>>>(cols, dx, *s, n0, cnt, acc_x);
      else conv_col2im<int64_t><<<LAUNCH(total)>>>(cols, dx, *s, n0, cnt, acc_x);
      PR_CU_LAUNCHED();
    }
  }
}
