/* cpu/pool.h - MaxPool and AveragePool (1-D, 2-D, 3-D).
 * Part of the CPU kernels; runtime/kernels.h includes every family (the conventions are there). */
#ifndef PIPERUN_CPU_POOL_H
#define PIPERUN_CPU_POOL_H
#include "common.h"
/* ---- pooling (1-D, 2-D, 3-D) ----
 * As for ConvShape, 1-D and 2-D windows sit in the last spatial slots with
 * unit sizes before them. */

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
#endif
