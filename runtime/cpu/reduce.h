/* cpu/reduce.h - reductions: ReduceMean / ReduceSum, ReduceMax, ArgMax.
 * Part of the CPU kernels; runtime/kernels.h includes every family (the conventions are there). */
#ifndef PIPERUN_CPU_REDUCE_H
#define PIPERUN_CPU_REDUCE_H
#include "common.h"
/* ---- ReduceMean / ReduceSum over a set of axes ---- */

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
#endif
