/* cpu/binary.h - broadcasting ops of two or three inputs: Add .. Min (k_binary, broadcast.c), Where, the
 * comparisons and Not.
 * Part of the CPU kernels; runtime/kernels.h includes every family (the conventions are there). */
#ifndef PIPERUN_CPU_BINARY_H
#define PIPERUN_CPU_BINARY_H
#include "common.h"
/* ---- elementwise binary ops with numpy broadcasting ---- */

static inline int64_t bcast_at(const BcastShape *s, const int64_t *st, int64_t i) {
  int64_t off = 0;
  for (int d = s->rank - 1; d >= 0; d--) {
    off += (i % s->out[d]) * st[d];
    i /= s->out[d];
  }
  return off;
}

static inline float bin_apply(int op, float a, float b) {
  switch (op) {
  case BIN_ADD: return a + b;
  case BIN_SUB: return a - b;
  case BIN_MUL: return a * b;
  case BIN_DIV: return a / b;
  case BIN_MAX: return a > b || a != a ? a : b; /* a NaN on either side wins, as torch.maximum */
  case BIN_MIN: return a < b || a != a ? a : b;
  default: return b == 2.0f ? a * a : powf(a, b); /* x**2 as x*x: exact either way, and far cheaper */
  }
}

/* The broadcasting kernels proper are in broadcast.c, compiled once per build rather than in every
 * stage program. */
void k_binary(int op, const float *a, const float *b, float *y, const BcastShape *s);
/* Gradient for input `which` (0 = a, 1 = b) of k_binary's op, summed over its broadcast axes; a or b is
 * NULL where the op's gradient does not read it.  d accumulates when acc. */
void k_binary_grad(int op, int which, const float *a, const float *b, const float *dy, float *d, const BcastShape *s, int acc);

/* ---- Where(cond, x, y) with broadcasting; cond is bool (uint8) ---- */

/* Where walks the output a row (its last axis) at a time: the offsets of c, x and y are found once
 * per row from an odometer over the other axes, and the row runs with the last axis' strides (0 for
 * a broadcast operand).  The output is visited in order, so a broadcast operand's gradient sums its
 * contributions in the order it always did. */
static inline void where_row(const WhereShape *s, const int64_t *idx, int64_t *oc, int64_t *ox, int64_t *oy) {
  *oc = *ox = *oy = 0;
  for (int d = 0; d < s->rank - 1; d++) *oc += idx[d] * s->sc[d], *ox += idx[d] * s->sx[d], *oy += idx[d] * s->sy[d];
}
static inline int where_next(const WhereShape *s, int64_t *idx) {
  for (int d = s->rank - 2; d >= 0; d--) {
    if (++idx[d] < s->out[d]) return 1;
    idx[d] = 0;
  }
  return 0;
}
static inline void k_where(const uint8_t *c, const float *x, const float *y, float *out, const WhereShape *s) {
  if (s->rank == 0) {
    out[0] = c[0] ? x[0] : y[0];
    return;
  }
  int last = s->rank - 1;
  int64_t L = s->out[last], tc = s->sc[last], tx = s->sx[last], ty = s->sy[last], idx[8] = {0}, oc, ox, oy;
  float *o = out;
  do {
    where_row(s, idx, &oc, &ox, &oy);
    for (int64_t k = 0; k < L; k++) o[k] = c[oc + k * tc] ? x[ox + k * tx] : y[oy + k * ty];
    o += L;
  } while (where_next(s, idx));
}
/* which = 1: gradient of x, 2: of y. */
static inline void k_where_grad(const uint8_t *c, const float *dout, float *d, int which, const WhereShape *s, int acc) {
  if (!acc) memset(d, 0, sizeof(float) * (size_t)(which == 1 ? s->nx : s->ny));
  if (s->rank == 0) {
    if ((c[0] != 0) == (which == 1)) d[0] += dout[0];
    return;
  }
  int last = s->rank - 1, want = which == 1;
  int64_t L = s->out[last], tc = s->sc[last], td = which == 1 ? s->sx[last] : s->sy[last], idx[8] = {0}, oc, ox, oy;
  const float *g = dout;
  do {
    where_row(s, idx, &oc, &ox, &oy);
    float *dr = d + (which == 1 ? ox : oy);
    for (int64_t k = 0; k < L; k++)
      if ((c[oc + k * tc] != 0) == want) dr[k * td] += g[k];
    g += L;
  } while (where_next(s, idx));
}

/* ---- Equal, Less, Greater (float inputs, broadcast) and Not: bool (uint8) results ---- */
static inline void k_compare(int op, const float *a, const float *b, uint8_t *y, const BcastShape *s) {
  for (int64_t i = 0; i < s->ny; i++) {
    float u = a[bcast_at(s, s->sa, i)], v = b[bcast_at(s, s->sb, i)];
    y[i] = op == CMP_EQUAL ? u == v : op == CMP_LESS ? u < v : u > v;
  }
}
static inline void k_not(const uint8_t *x, uint8_t *y, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = !x[i];
}
#endif
