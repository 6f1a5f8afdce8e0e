/* cuda/pool.cu - MaxPool and AveragePool (1-D, 2-D, 3-D) on the GPU, as runtime/cpu/pool.h computes them.
 *
 * Forward: one thread per output element, its window visited in the CPU's order (z, y, x), padding
 * skipped.  Backward: the CPU adds each output's share into dx in output memory order; here one thread
 * per input element visits the outputs whose windows hold it in that same order (oz, oy, ox
 * increasing) and adds their shares into one running total, so every sum is the CPU's, with no atomics.
 * MaxPool's backward first finds each window's chosen element (the CPU's rule: the first maximum, or
 * the last NaN) into scratch; AveragePool's first divides dy by each window's count into scratch. */
#include "common.cuh"
#include "kernels.h"

/* An output's coordinates from its offset o: (nc, oz, oy, ox). */
struct PoolAt {
  int64_t nc;
  int z, y, x;
};
static __device__ __forceinline__ PoolAt pool_at(int64_t o, int d, int h, int w) {
  PoolAt a;
  a.x = (int)(o % w);
  o /= w;
  a.y = (int)(o % h);
  o /= h;
  a.z = (int)(o % d);
  a.nc = o / d;
  return a;
}

/* Runs the statement given last with k (the offset within the channel plane) for each input element of
 * output (oz, oy, ox)'s window, in the CPU's order, skipping the padding (POOL_WINDOW). */
#define CU_POOL_WINDOW(s, oz, oy, ox, ...)                                          \
  for (int kz = 0; kz < (s).kd; kz++) {                                             \
    int iz = (oz) * (s).sd - (s).pd + kz * (s).dd;                                  \
    if (iz < 0 || iz >= (s).d) continue;                                            \
    for (int ki = 0; ki < (s).kh; ki++) {                                           \
      int iy = (oy) * (s).sh - (s).ph + ki * (s).dh;                                \
      if (iy < 0 || iy >= (s).h) continue;                                          \
      for (int kj = 0; kj < (s).kw; kj++) {                                         \
        int ix = (ox) * (s).sw - (s).pw + kj * (s).dw;                              \
        if (ix < 0 || ix >= (s).w) continue;                                        \
        int64_t k = ((int64_t)iz * (s).h + iy) * (s).w + ix;                        \
        __VA_ARGS__                                                                 \
      }                                                                             \
    }                                                                               \
  }

/* Runs the statement given last with oz, oy, ox for each output whose window holds input (iz, iy, ix),
 * in output memory order: along each axis the tap kk = k-1 .. 0 gives the outputs in increasing order. */
#define CU_POOL_CONTAINING(s, iz, iy, ix, ...)                                       \
  for (int kz = (s).kd - 1; kz >= 0; kz--) {                                         \
    int nz = (iz) + (s).pd - kz * (s).dd;                                            \
    if (nz < 0 || nz % (s).sd) continue;                                             \
    int oz = nz / (s).sd;                                                            \
    if (oz >= (s).od) break;                                                         \
    for (int ki = (s).kh - 1; ki >= 0; ki--) {                                       \
      int ny = (iy) + (s).ph - ki * (s).dh;                                          \
      if (ny < 0 || ny % (s).sh) continue;                                           \
      int oy = ny / (s).sh;                                                          \
      if (oy >= (s).oh) break;                                                       \
      for (int kj = (s).kw - 1; kj >= 0; kj--) {                                     \
        int nx = (ix) + (s).pw - kj * (s).dw;                                        \
        if (nx < 0 || nx % (s).sw) continue;                                         \
        int ox = nx / (s).sw;                                                        \
        if (ox >= (s).ow) break;                                                     \
        __VA_ARGS__                                                                  \
      }                                                                              \
    }                                                                                \
  }

/* pool_taps and pool_count of cpu/pool.h. */
static __device__ __forceinline__ int cu_pool_taps(int at, int k, int dl, int limit) {
  int t = (limit - at + dl - 1) / dl;
  return t < k ? t : k;
}
/* The window's taps along one axis that fall inside the input (the CPU's loop counts their product). */
static __device__ __forceinline__ int cu_pool_inside(int o, int st, int p, int k, int dl, int n) {
  int c = 0;
  for (int kk = 0; kk < k; kk++) {
    int i = o * st - p + kk * dl;
    c += i >= 0 && i < n;
  }
  return c;
}
static __device__ __forceinline__ int cu_pool_count(const PoolShape &s, int oz, int oy, int ox) {
  if (s.count_include_pad)
    return cu_pool_taps(oz * s.sd, s.kd, s.dd, s.pd + s.d + s.ed) * cu_pool_taps(oy * s.sh, s.kh, s.dh, s.ph + s.h + s.eh) *
           cu_pool_taps(ox * s.sw, s.kw, s.dw, s.pw + s.w + s.ew);
  int c = cu_pool_inside(oz, s.sd, s.pd, s.kd, s.dd, s.d) * cu_pool_inside(oy, s.sh, s.ph, s.kh, s.dh, s.h) *
          cu_pool_inside(ox, s.sw, s.pw, s.kw, s.dw, s.w);
  return c ? c : 1;
}

static int64_t pool_out_numel(const PoolShape *s) { return (int64_t)s->n * s->c * s->od * s->oh * s->ow; }
static int64_t pool_in_numel(const PoolShape *s) { return (int64_t)s->n * s->c * s->d * s->h * s->w; }

__global__ void maxpool_k(const float *x, float *y, PoolShape s, int64_t n) {
  int64_t plane = (int64_t)s.d * s.h * s.w;
  PR_CU_FOR(o, n) {
    PoolAt a = pool_at(o, s.od, s.oh, s.ow);
    const float *xp = x + a.nc * plane;
    float best = -INFINITY;
    CU_POOL_WINDOW(s, a.z, a.y, a.x, {
      float v = xp[k];
      if (v > best || isnan(v)) best = v;
    });
    y[o] = best;
  }
}

/* Each window's chosen element (its offset in the channel plane), or -1 for a window wholly in the padding. */
__global__ void maxpool_pick_k(const float *x, int *at, PoolShape s, int64_t n) {
  int64_t plane = (int64_t)s.d * s.h * s.w;
  PR_CU_FOR(o, n) {
    PoolAt a = pool_at(o, s.od, s.oh, s.ow);
    const float *xp = x + a.nc * plane;
    float best = -INFINITY;
    int64_t pick = -1;
    CU_POOL_WINDOW(s, a.z, a.y, a.x, {
      float v = xp[k];
      if (pick < 0 || v > best || isnan(v)) best = v, pick = k;
    });
    at[o] = (int)pick;
  }
}

__global__ void maxpool_grad_k(const int *at, const float *dy, float *dx, PoolShape s, int acc, int64_t n) {
  PR_CU_FOR(i, n) {
    PoolAt a = pool_at(i, s.d, s.h, s.w);
    int self = (int)(((int64_t)a.z * s.h + a.y) * s.w + a.x);
    int64_t obase = a.nc * s.od * s.oh * s.ow;
    float v = acc ? dx[i] : 0.0f;
    CU_POOL_CONTAINING(s, a.z, a.y, a.x, {
      int64_t o = obase + ((int64_t)oz * s.oh + oy) * s.ow + ox;
      if (at[o] == self) v += dy[o];
    });
    dx[i] = v;
  }
}

__global__ void avgpool_k(const float *x, float *y, PoolShape s, int64_t n) {
  int64_t plane = (int64_t)s.d * s.h * s.w;
  PR_CU_FOR(o, n) {
    PoolAt a = pool_at(o, s.od, s.oh, s.ow);
    const float *xp = x + a.nc * plane;
    float sum = 0;
    CU_POOL_WINDOW(s, a.z, a.y, a.x, { sum += xp[k]; });
    y[o] = sum / (float)cu_pool_count(s, a.z, a.y, a.x);
  }
}

/* Each output's share: dy / its window's count. */
__global__ void avgpool_share_k(const float *dy, float *g, PoolShape s, int64_t n) {
  PR_CU_FOR(o, n) {
    PoolAt a = pool_at(o, s.od, s.oh, s.ow);
    g[o] = dy[o] / (float)cu_pool_count(s, a.z, a.y, a.x);
  }
}

__global__ void avgpool_grad_k(const float *g, float *dx, PoolShape s, int acc, int64_t n) {
  PR_CU_FOR(i, n) {
    PoolAt a = pool_at(i, s.d, s.h, s.w);
    int64_t obase = a.nc * s.od * s.oh * s.ow;
    float v = acc ? dx[i] : 0.0f;
    CU_POOL_CONTAINING(s, a.z, a.y, a.x, { v += g[obase + ((int64_t)oz * s.oh + oy) * s.ow + ox]; });
    dx[i] = v;
  }
}

extern "C" void kc_maxpool(const float *x, float *y, const PoolShape *s) {
  int64_t n = pool_out_numel(s);
  if (n <= 0) return;
  maxpool_k<<<pr_cu_blocks(n, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(x, y, *s, n);
  PR_CU_LAUNCHED();
}

extern "C" void kc_maxpool_grad(const float *x, const float *dy, float *dx, const PoolShape *s, int acc) {
  int64_t no = pool_out_numel(s), ni = pool_in_numel(s);
  if (ni <= 0) return;
  int *at = (int *)pr_cu_scratch((no > 0 ? no : 1) * (int64_t)sizeof(int));
  if (no > 0) {
    maxpool_pick_k<<<pr_cu_blocks(no, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(x, at, *s, no);
    PR_CU_LAUNCHED();
  }
  maxpool_grad_k<<<pr_cu_blocks(ni, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(at, dy, dx, *s, acc, ni);
  PR_CU_LAUNCHED();
}

extern "C" void kc_avgpool(const float *x, float *y, const PoolShape *s) {
  int64_t n = pool_out_numel(s);
  if (n <= 0) return;
  avgpool_k<<<pr_cu_blocks(n, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(x, y, *s, n);
  PR_CU_LAUNCHED();
}

extern "C" void kc_avgpool_grad(const float *dy, float *dx, const PoolShape *s, int acc) {
  int64_t no = pool_out_numel(s), ni = pool_in_numel(s);
  if (ni <= 0) return;
  float *g = (float *)pr_cu_scratch((no > 0 ? no : 1) * (int64_t)sizeof(float));
  if (no > 0) {
    avgpool_share_k<<<pr_cu_blocks(no, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(dy, g, *s, no);
    PR_CU_LAUNCHED();
  }
  avgpool_grad_k<<<pr_cu_blocks(ni, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(g, dx, *s, acc, ni);
  PR_CU_LAUNCHED();
}
