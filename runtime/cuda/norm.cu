/* cuda/norm.cu - normalizations over rows or channels on the GPU: BatchNormalization, Softmax,
 * LayerNormalization and their gradients (cpu/norm.h's k_* kernels, the same arguments).
 *
 * Rows (Softmax, LayerNorm): a warp per row up to 1024 columns (8 rows to a block), else a block of
 * 256 threads (1024 for long rows when the rows are few); each thread sums the elements lane, lane + T,
 * ... of its row in order, then a fixed tree (warp shuffles, then the warps' totals through shared
 * memory; rows.cuh), so every sum's order is fixed by the shape.  A row is read again for each pass (max, sum,
 * write) instead of being held, and each element is written by the thread that read it after the row's
 * sums are complete, so the output may be the input (in place).
 * LayerNorm's dscale and dbias, sums over the rows: a thread per column adding the rows in order onto
 * what dscale / dbias hold (the CPU's order); past 64 rows the rows cut into fixed chunks, a thread per
 * (chunk, column) summing its chunk's rows in order, then a thread per column adding the chunks' sums
 * in order onto what dscale / dbias hold.
 * BatchNorm: each channel's n * sp elements cut into P chunks (P fixed by the shape), a block per
 * (channel, chunk) summing in double as the CPU does (x and x^2; for the gradient also dy and dy x, dy
 * masked by a fused Relu's output), then a thread per channel adding its P partial sums in order into the
 * statistics, the running-statistics update (in double, as the CPU), the gradient of gamma and beta, and
 * the channel's coefficients, and last an element-wise pass writing y or dx.
 * The float expressions of the outputs are the CPU's, products and sums each rounded on its own (no
 * fused multiply-add), so where the statistics agree the outputs do to the bit. */
#include "common.cuh"
#include "kernels.h"
#include "rows.cuh"

#include <math.h>

#define N_MUL(a, b) __fmul_rn((a), (b))
#define N_ADD(a, b) __fadd_rn((a), (b))
#define N_SUB(a, b) __fsub_rn((a), (b))

namespace {

/* ---- Softmax ---- */
template <int TPR> __global__ void softmax_k(const float *x, float *y, int64_t rows, int64_t cols, int log) {
  __shared__ float sh[33];
  int64_t row;
  int lane;
  if (!row_of<TPR>(rows, &row, &lane)) return;
  const float *a = x + row * cols;
  float *b = y + row * cols;
  const float mx = row_max<TPR>(a, cols, lane, sh);
  float sum = 0;
  if (log) {
    for (int64_t k = lane; k < cols; k += TPR) sum += expf(a[k] - mx);
    sum = group_sum<TPR>(sum, sh);
    const float ls = logf(sum);
    for (int64_t k = lane; k < cols; k += TPR) b[k] = N_SUB(N_SUB(a[k], mx), ls);
  } else { /* -inf gives 0 even where the maximum is -inf too (the CPU's fix-up loop) */
    for (int64_t k = lane; k < cols; k += TPR) sum += a[k] == -INFINITY ? 0.0f : expf(a[k] - mx);
    sum = group_sum<TPR>(sum, sh);
    for (int64_t k = lane; k < cols; k += TPR) b[k] = (a[k] == -INFINITY ? 0.0f : expf(a[k] - mx)) / sum;
  }
}
template <int TPR> __global__ void softmax_grad_k(const float *y, const float *dy, float *dx, int64_t rows, int64_t cols, int log, int acc) {
  __shared__ float sh[33];
  int64_t row;
  int lane;
  if (!row_of<TPR>(rows, &row, &lane)) return;
  const float *p = y + row * cols, *g = dy + row * cols;
  float *d = dx + row * cols, dot = 0;
  if (log)
    for (int64_t k = lane; k < cols; k += TPR) dot += g[k];
  else
    for (int64_t k = lane; k < cols; k += TPR) dot = N_ADD(dot, N_MUL(g[k], p[k]));
  dot = group_sum<TPR>(dot, sh);
  for (int64_t k = lane; k < cols; k += TPR) {
    float v = log ? N_SUB(g[k], N_MUL(expf(p[k]), dot)) : N_MUL(p[k], N_SUB(g[k], dot));
    d[k] = acc ? d[k] + v : v;
  }
}

/* ---- LayerNorm ---- */
/* A row's mean and biased variance in float (ln_row_stats): the sum, then the squared deviations'. */
template <int TPR> __device__ __forceinline__ void ln_stats(const float *a, int64_t cols, int lane, float *sh, float *mean, float *var) {
  float s = 0;
  for (int64_t k = lane; k < cols; k += TPR) s += a[k];
  const float m = group_sum<TPR>(s, sh) / (float)cols;
  float q = 0;
  for (int64_t k = lane; k < cols; k += TPR) {
    float d = a[k] - m;
    q = N_ADD(q, N_MUL(d, d));
  }
  *mean = m, *var = group_sum<TPR>(q, sh) / (float)cols;
}
template <int TPR> __global__ void layernorm_k(const float *x, const float *scale, const float *bias, float *y, int64_t rows, int64_t cols,
                                               float eps) {
  __shared__ float sh[33];
  int64_t row;
  int lane;
  if (!row_of<TPR>(rows, &row, &lane)) return;
  const float *a = x + row * cols;
  float *b = y + row * cols, mean, var;
  ln_stats<TPR>(a, cols, lane, sh, &mean, &var);
  const float inv = 1.0f / sqrtf(var + eps);
  for (int64_t k = lane; k < cols; k += TPR) b[k] = N_ADD(N_MUL(N_MUL(a[k] - mean, inv), scale[k]), bias ? bias[k] : 0.0f);
}
template <int TPR> __global__ void layernorm_stats_k(const float *x, float *mean_out, float *inv_out, int64_t rows, int64_t cols, float eps) {
  __shared__ float sh[33];
  int64_t row;
  int lane;
  if (!row_of<TPR>(rows, &row, &lane)) return;
  float mean, var;
  ln_stats<TPR>(x + row * cols, cols, lane, sh, &mean, &var);
  if (lane == 0) {
    if (mean_out) mean_out[row] = mean;
    if (inv_out) inv_out[row] = 1.0f / sqrtf(var + eps);
  }
}
template <int TPR> __global__ void layernorm_dx_k(const float *x, const float *scale, const float *dy, float *dx, int64_t rows, int64_t cols,
                                                  float eps, int acc) {
  __shared__ float sh[33];
  int64_t row;
  int lane;
  if (!row_of<TPR>(rows, &row, &lane)) return;
  const float *a = x + row * cols, *g = dy + row * cols;
  float mean, var;
  ln_stats<TPR>(a, cols, lane, sh, &mean, &var);
  const float inv = 1.0f / sqrtf(var + eps);
  float sg = 0, sgx = 0; /* the sums of dy*scale and dy*scale*xhat */
  for (int64_t k = lane; k < cols; k += TPR) {
    float xh = N_MUL(a[k] - mean, inv), gs = N_MUL(g[k], scale[k]);
    sg += gs, sgx = N_ADD(sgx, N_MUL(gs, xh));
  }
  sg = group_sum<TPR>(sg, sh);
  sgx = group_sum<TPR>(sgx, sh);
  const float mg = sg / (float)cols, mgx = sgx / (float)cols;
  float *d = dx + row * cols;
  for (int64_t k = lane; k < cols; k += TPR) {
    float v = N_MUL(inv, N_SUB(N_SUB(N_MUL(g[k], scale[k]), mg), N_MUL(N_MUL(a[k] - mean, inv), mgx)));
    d[k] = acc ? d[k] + v : v;
  }
}
/* dscale / dbias over the rows (stats: the rows' means, then their 1/sqrt(var + eps)): thread (chunk p,
 * column k) sums rows [p rch, p rch + rch) in order into part (2 P cols: dscale's partials, then
 * dbias's), or with P = 1 onto what dscale / dbias hold. */
__global__ void layernorm_dw_k(const float *x, const float *dy, const float *stats, float *dscale, float *dbias, float *part, int64_t rows,
                               int64_t cols, int64_t rch, int64_t P) {
  PR_CU_FOR(t, P * cols) {
    const int64_t p = t / cols, k = t % cols, hi = (p + 1) * rch < rows ? (p + 1) * rch : rows;
    /* one chunk: onto what dscale / dbias hold, row by row, as the CPU adds */
    float ss = P == 1 && dscale ? dscale[k] : 0.0f, sb = P == 1 && dbias ? dbias[k] : 0.0f;
    for (int64_t r = p * rch; r < hi; r++) {
      const float g = dy[r * cols + k];
      if (dscale) ss = N_ADD(ss, N_MUL(g, N_MUL(x[r * cols + k] - stats[r], stats[rows + r])));
      sb += g;
    }
    if (P == 1) {
      if (dscale) dscale[k] = ss;
      if (dbias) dbias[k] = sb;
    } else {
      part[t] = ss, part[P * cols + t] = sb;
    }
  }
}
__global__ void layernorm_dw_finish_k(const float *part, float *dscale, float *dbias, int64_t cols, int64_t P) {
  PR_CU_FOR(k, cols) {
    float ss = dscale ? dscale[k] : 0.0f, sb = dbias ? dbias[k] : 0.0f;
    for (int64_t p = 0; p < P; p++) ss += part[p * cols + k], sb += part[P * cols + p * cols + k];
    if (dscale) dscale[k] = ss;
    if (dbias) dbias[k] = sb;
  }
}

/* ---- BatchNorm ---- */
#define BN_THREADS 256
/* A channel's n * sp elements, j = i sp + k (plane i, element k), cut into P chunks of L. */
static int64_t bn_chunks(const BnShape *s) {
  const int64_t cnt = s->n * s->sp, a = (cnt + 4095) / 4096, b = (1024 + s->c - 1) / s->c;
  const int64_t p = a < b ? a : b;
  return p > 0 ? p : 1;
}
/* Per (channel, chunk) block: NS sums in double into part[(ch P + p) NS + q]: x, x^2, and with NS = 4
 * dy (masked where y <= 0 when y is given, as k_relu_grad) and dy x.  I: the index type of j / sp. */
template <int NS, typename I>
__global__ void bn_sums_k(const float *x, const float *dy, const float *y, BnShape s, int64_t P, int64_t L, double *part) {
  __shared__ double sh[33];
  const int64_t ch = blockIdx.x / P, p = blockIdx.x % P, cnt = s.n * s.sp;
  const int64_t lo = p * L, hi = lo + L < cnt ? lo + L : cnt;
  double a[NS];
#pragma unroll
  for (int q = 0; q < NS; q++) a[q] = 0;
  const I sp = (I)s.sp;
  for (int64_t j = lo + threadIdx.x; j < hi; j += BN_THREADS) {
    const I i = (I)j / sp, k = (I)j - i * sp;
    const int64_t off = ((int64_t)i * s.c + ch) * s.sp + (int64_t)k;
    const double xv = x[off];
    a[0] += xv, a[1] += xv * xv;
    if (NS == 4) {
      const double d = y && y[off] <= 0 ? 0.0f : dy[off];
      a[2 % NS] += d, a[3 % NS] += d * xv;
    }
  }
#pragma unroll
  for (int q = 0; q < NS; q++) {
    const double t = group_sum<BN_THREADS>(a[q], sh);
    if (threadIdx.x == 0) part[blockIdx.x * NS + q] = t;
  }
}
/* A channel's NS totals: its P partial sums in order. */
template <int NS> __device__ __forceinline__ void bn_totals(const double *part, int64_t ch, int64_t P, double *t) {
  for (int q = 0; q < NS; q++) t[q] = 0;
  for (int64_t p = 0; p < P; p++)
    for (int q = 0; q < NS; q++) t[q] += part[(ch * P + p) * NS + q];
}
/* bn_moments */
__device__ __forceinline__ void bn_moments(double sum, double sq, int64_t cnt, double *mean, double *var) {
  double mu = sum / (double)cnt, v = sq / (double)cnt - mu * mu;
  *mean = mu;
  *var = v > 0 ? v : 0;
}
/* The forward's per-channel coefficients: the float mean, 1/sqrt(var + eps), gamma, beta. */
__global__ void bn_finish_k(const double *part, const float *gamma, const float *beta, float *rmean, float *rvar, float4 *coef, BnShape s,
                            int64_t P) {
  PR_CU_FOR(ch, s.c) {
    const int64_t cnt = s.n * s.sp;
    double mean, var;
    if (s.training) {
      double t[2];
      bn_totals<2>(part, ch, P, t);
      bn_moments(t[0], t[1], cnt, &mean, &var);
      if (rmean) {
        rmean[ch] = (float)(rmean[ch] * s.momentum + mean * (1 - s.momentum));
        rvar[ch] = (float)(rvar[ch] * s.momentum + (cnt > 1 ? var * (double)cnt / (double)(cnt - 1) : var) * (1 - s.momentum));
      }
    } else {
      mean = rmean[ch], var = rvar[ch];
    }
    coef[ch] = make_float4((float)mean, (float)(1.0 / sqrt(var + s.eps)), gamma[ch], beta[ch]);
  }
}
template <typename I> __global__ void bn_apply_k(const float *x, float *y, const float4 *coef, int64_t total, int64_t sp, int64_t c, int relu) {
  PR_CU_FOR(i, total) {
    const float4 f = coef[(int64_t)(((I)i / (I)sp) % (I)c)];
    float z = N_ADD(N_MUL(N_MUL(x[i] - f.x, f.y), f.z), f.w);
    if (relu) z = z > 0 || z != z ? z : 0; /* k_relu's expression */
    y[i] = z;
  }
}
/* The gradient's per-channel coefficients of dx. */
struct BnGrad {
  float m, fi, g;
  double mdy, mdyx, gi;
};
__global__ void bn_grad_finish_k(const double *part, const float *gamma, const float *rmean, const float *rvar, float *dgamma, float *dbeta,
                                 BnGrad *coef, BnShape s, int64_t P) {
  PR_CU_FOR(ch, s.c) {
    const int64_t cnt = s.n * s.sp;
    double t[4], mean, var;
    bn_totals<4>(part, ch, P, t);
    if (s.training) bn_moments(t[0], t[1], cnt, &mean, &var);
    else mean = rmean[ch], var = rvar[ch];
    const double inv = 1.0 / sqrt(var + s.eps), sdy = t[2], sdyx = (t[3] - mean * sdy) * inv;
    if (dgamma) dgamma[ch] += (float)sdyx;
    if (dbeta) dbeta[ch] += (float)sdy;
    if (coef) {
      const float g = gamma[ch];
      coef[ch] = BnGrad{(float)mean, (float)inv, g, sdy / (double)cnt, sdyx / (double)cnt, g * inv};
    }
  }
}
template <typename I>
__global__ void bn_dx_k(const float *x, const float *dy, const float *y, float *dx, const BnGrad *coef, int64_t total, int64_t sp, int64_t c,
                        int training, int acc) {
  PR_CU_FOR(i, total) {
    const BnGrad f = coef[(int64_t)(((I)i / (I)sp) % (I)c)];
    const float d = y && y[i] <= 0 ? 0.0f : dy[i];
    float v;
    if (training) {
      const double t = (double)N_MUL(x[i] - f.m, f.fi);
      v = (float)__dmul_rn(f.gi, __dsub_rn(__dsub_rn((double)d, f.mdy), __dmul_rn(t, f.mdyx)));
    } else {
      v = N_MUL(N_MUL(d, f.g), f.fi);
    }
    dx[i] = acc ? dx[i] + v : v;
  }
}
/* Scratch carved in one piece: n bytes rounded up to 256. */
static int64_t round256(int64_t n) { return (n + 255) / 256 * 256; }

} // namespace

extern "C" void kc_batchnorm(const float *x, const float *gamma, const float *beta, float *rmean, float *rvar, float *y, const BnShape *s) {
  const int64_t total = s->n * s->c * s->sp, cnt = s->n * s->sp;
  if (total <= 0) return;
  const int64_t P = s->training ? bn_chunks(s) : 1, L = (cnt + P - 1) / P;
  const int64_t coef_bytes = round256(s->c * (int64_t)sizeof(float4));
  char *scr = (char *)pr_cu_scratch(coef_bytes + (s->training ? s->c * P * 2 * (int64_t)sizeof(double) : 0));
  float4 *coef = (float4 *)scr;
  double *part = (double *)(scr + coef_bytes);
  if (s->training) {
    if (cnt <= 0xffffffffLL) bn_sums_k<2, uint32_t><<<(unsigned)(s->c * P), BN_THREADS, 0, pr_cu_stream>>>(x, nullptr, nullptr, *s, P, L, part);
    else bn_sums_k<2, uint64_t><<<(unsigned)(s->c * P), BN_THREADS, 0, pr_cu_stream>>>(x, nullptr, nullptr, *s, P, L, part);
    PR_CU_LAUNCHED();
  }
  bn_finish_k<<<pr_cu_blocks(s->c, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(part, gamma, beta, rmean, rvar, coef, *s, P);
  PR_CU_LAUNCHED();
  if (total <= 0xffffffffLL)
    bn_apply_k<uint32_t><<<pr_cu_blocks(total, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(x, y, coef, total, s->sp, s->c, s->relu);
  else bn_apply_k<uint64_t><<<pr_cu_blocks(total, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(x, y, coef, total, s->sp, s->c, s->relu);
  PR_CU_LAUNCHED();
}

extern "C" void kc_batchnorm_grad(const float *x, const float *gamma, const float *rmean, const float *rvar, const float *dy, const float *y,
                                  float *dx, float *dgamma, float *dbeta, const BnShape *s, int acc_x) {
  const int64_t total = s->n * s->c * s->sp, cnt = s->n * s->sp;
  if (total <= 0 || (!dx && !dgamma && !dbeta)) return;
  const int64_t P = bn_chunks(s), L = (cnt + P - 1) / P;
  const int64_t coef_bytes = round256(s->c * (int64_t)sizeof(BnGrad));
  char *scr = (char *)pr_cu_scratch(coef_bytes + s->c * P * 4 * (int64_t)sizeof(double));
  BnGrad *coef = (BnGrad *)scr;
  double *part = (double *)(scr + coef_bytes);
  if (cnt <= 0xffffffffLL) bn_sums_k<4, uint32_t><<<(unsigned)(s->c * P), BN_THREADS, 0, pr_cu_stream>>>(x, dy, y, *s, P, L, part);
  else bn_sums_k<4, uint64_t><<<(unsigned)(s->c * P), BN_THREADS, 0, pr_cu_stream>>>(x, dy, y, *s, P, L, part);
  PR_CU_LAUNCHED();
  bn_grad_finish_k<<<pr_cu_blocks(s->c, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(part, gamma, rmean, rvar, dgamma, dbeta,
                                                                                         dx ? coef : nullptr, *s, P);
  PR_CU_LAUNCHED();
  if (!dx) return;
  if (total <= 0xffffffffLL)
    bn_dx_k<uint32_t><<<pr_cu_blocks(total, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(x, dy, y, dx, coef, total, s->sp, s->c,
                                                                                              s->training, acc_x);
  else
    bn_dx_k<uint64_t><<<pr_cu_blocks(total, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(x, dy, y, dx, coef, total, s->sp, s->c,
                                                                                              s->training, acc_x);
  PR_CU_LAUNCHED();
}

extern "C" void kc_softmax(const float *x, float *y, int64_t rows, int64_t cols, int log) {
  if (rows <= 0 || cols <= 0) return;
  ROWS_LAUNCH(softmax_k, rows, cols, x, y, rows, cols, log);
}

extern "C" void kc_softmax_grad(const float *y, const float *dy, float *dx, int64_t rows, int64_t cols, int log, int acc) {
  if (rows <= 0 || cols <= 0) return;
  ROWS_LAUNCH(softmax_grad_k, rows, cols, y, dy, dx, rows, cols, log, acc);
}

extern "C" void kc_layernorm(const float *x, const float *scale, const float *bias, float *y, int64_t rows, int64_t cols, float eps) {
  if (rows <= 0 || cols <= 0) return;
  ROWS_LAUNCH(layernorm_k, rows, cols, x, scale, bias, y, rows, cols, eps);
}

extern "C" void kc_layernorm_stats(const float *x, float *mean_out, float *inv_out, int64_t rows, int64_t cols, float eps) {
  if (rows <= 0 || cols <= 0 || (!mean_out && !inv_out)) return;
  ROWS_LAUNCH(layernorm_stats_k, rows, cols, x, mean_out, inv_out, rows, cols, eps);
}

extern "C" void kc_layernorm_grad(const float *x, const float *scale, const float *dy, float *dx, float *dscale, float *dbias, int64_t rows,
                                  int64_t cols, float eps, int acc) {
  if (rows <= 0 || cols <= 0) return;
  /* The weights' sums first: they read dy, which dx may be (in place). */
  if (dscale || dbias) {
    int64_t rch = rows;
    if (rows > 64) {
      rch = (int64_t)ceil(sqrt((double)rows));
      if (rch < 16) rch = 16;
    }
    const int64_t P = (rows + rch - 1) / rch;
    const int64_t stats_bytes = round256(2 * rows * (int64_t)sizeof(float));
    char *scr = (char *)pr_cu_scratch(stats_bytes + (P > 1 ? 2 * P * cols * (int64_t)sizeof(float) : 0));
    float *stats = (float *)scr, *part = (float *)(scr + stats_bytes);
    /* each row's mean, then each row's 1/sqrt(var + eps) */
    ROWS_LAUNCH(layernorm_stats_k, rows, cols, x, stats, stats + rows, rows, cols, eps);
    layernorm_dw_k<<<pr_cu_blocks(P * cols, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(x, dy, stats, dscale, dbias, part, rows, cols,
                                                                                                rch, P);
    PR_CU_LAUNCHED();
    if (P > 1) {
      layernorm_dw_finish_k<<<pr_cu_blocks(cols, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(part, dscale, dbias, cols, P);
      PR_CU_LAUNCHED();
    }
  }
  if (dx) ROWS_LAUNCH(layernorm_dx_k, rows, cols, x, scale, dy, dx, rows, cols, eps, acc);
}
