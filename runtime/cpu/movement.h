/* cpu/movement.h - data movement: copies, Pad, Transpose, slices along an axis, strided views, Cast, Gather,
 * Concat.
 * Part of the CPU kernels; runtime/kernels.h includes every family (the conventions are there). */
#ifndef PIPERUN_CPU_MOVEMENT_H
#define PIPERUN_CPU_MOVEMENT_H
#include "common.h"
/* Reshape, Flatten, Squeeze, Unsqueeze, Identity: the bytes do not change. */
static inline void k_copy(const float *x, float *y, int64_t n) {
  if (x != y) memcpy(y, x, sizeof(float) * (size_t)n);
}
/* An int64 value kept for a later weight gradient (zb1's W reading a Gather's indices). */
static inline void k_copy_i64(const int64_t *x, int64_t *y, int64_t n) {
  if (x != y) memcpy(y, x, sizeof(int64_t) * (size_t)n);
}
PR_EW_RANGE(add_into_r, out[i] += dy[i];)
static inline void k_copy_grad(const float *dy, float *dx, int64_t n, int acc) {
  if (acc)
    PR_EW_FOR(add_into_r, n, 3, .dy = dy, .out = dx);
  else
    memcpy(dx, dy, sizeof(float) * (size_t)n);
}

/* ---- constant padding of any rank ---- */

/* Offset in y of the element of x at linear index i. */
static inline int64_t pad_offset(const PadShape *s, int64_t i) {
  int64_t off = 0, stride = 1;
  for (int d = s->rank - 1; d >= 0; d--) {
    off += (i % s->in[d] + s->begin[d]) * stride;
    i /= s->in[d];
    stride *= s->out[d];
  }
  return off;
}

static inline void k_pad(const float *x, float *y, const PadShape *s) {
  int64_t nx = 1, ny = 1;
  for (int d = 0; d < s->rank; d++) nx *= s->in[d], ny *= s->out[d];
  for (int64_t i = 0; i < ny; i++) y[i] = s->value;
  for (int64_t i = 0; i < nx; i++) y[pad_offset(s, i)] = x[i];
}

static inline void k_pad_grad(const float *dy, float *dx, const PadShape *s, int acc) {
  int64_t nx = 1;
  for (int d = 0; d < s->rank; d++) nx *= s->in[d];
  for (int64_t i = 0; i < nx; i++) dx[i] = acc ? dx[i] + dy[pad_offset(s, i)] : dy[pad_offset(s, i)];
}

/* ---- Transpose (any rank) ---- */

/* One pass over a permutation, both directions: y[i] = x[at(i)] (fwd), or dx[at(i)] (+)= dy[i] (grad).
 * The output is walked in order, its last axis innermost.  Where that axis reads the input with a
 * stride and another output axis q reads it contiguously (a true transpose, K^T of attention), the
 * two are walked in 32x32 tiles so both sides stay in cache; a contiguous last axis is a row copy.
 * Every element moves once, so the order changes no bits. */
#define PERM_TILE 32
/* Elements [la, lb) of one output row yo, whose input elements are xi[l * sl]. */
static inline void perm_row(float *yo, float *xi, int64_t la, int64_t lb, int64_t sl, int grad, int acc) {
  if (!grad) {
    if (sl == 1) memcpy(yo + la, xi + la, sizeof(float) * (size_t)(lb - la));
    else for (int64_t l = la; l < lb; l++) yo[l] = xi[l * sl];
  } else if (acc) {
    for (int64_t l = la; l < lb; l++) xi[l * sl] += yo[l];
  } else {
    if (sl == 1) memcpy(xi + la, yo + la, sizeof(float) * (size_t)(lb - la));
    else for (int64_t l = la; l < lb; l++) xi[l * sl] = yo[l];
  }
}
/* Output indices [lo, hi) of the first output axis (all of them when the first axis is the tiled one,
 * or the last): each output element, and each input element it reads, belongs to one index of it. */
static inline void perm_walk(const PermShape *s, float *x, float *y, int grad, int acc, int64_t lo, int64_t hi) {
  int r = s->rank, last = r - 1, q = -1;
  int64_t ost[8], idx[8] = {0};
  if (r == 0 || s->n == 0 || lo >= hi) return;
  ost[last] = 1;
  for (int d = last - 1; d >= 0; d--) ost[d] = ost[d + 1] * s->out[d + 1];
  if (s->st[last] != 1)
    for (int d = 0; d < last; d++)
      if (s->st[d] == 1 && s->out[d] > 1) q = d;
  int64_t nl = s->out[last], sl = s->st[last];
  int split = last > 0 && q != 0; /* the range is over axis 0 */
  if (split) idx[0] = lo;
  for (;;) {
    int64_t ib = 0, ob = 0;
    for (int d = 0; d < last; d++) ib += idx[d] * s->st[d], ob += idx[d] * ost[d];
    if (q < 0)
      perm_row(y + ob, x + ib, 0, nl, sl, grad, acc);
    else /* axis q reads the input contiguously: tiles of q x last */
      for (int64_t q0 = 0; q0 < s->out[q]; q0 += PERM_TILE)
        for (int64_t l0 = 0; l0 < nl; l0 += PERM_TILE) {
          int64_t q1 = q0 + PERM_TILE < s->out[q] ? q0 + PERM_TILE : s->out[q], l1 = l0 + PERM_TILE < nl ? l0 + PERM_TILE : nl;
          for (int64_t qi = q0; qi < q1; qi++) perm_row(y + ob + qi * ost[q], x + ib + qi, l0, l1, sl, grad, acc);
        }
    /* the next index over the output axes before the last, q excepted */
    int d = last - 1;
    for (; d >= 0; d--) {
      if (d == q) continue;
      if (++idx[d] < (split && d == 0 ? hi : s->out[d])) break;
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}
typedef struct PrPerm {
  const PermShape *s;
  float *x, *y;
  int grad, acc;
} PrPerm;
PR_RANGE void perm_r(const void *arg, int64_t lo, int64_t hi) {
  const PrPerm *p = (const PrPerm *)arg;
  perm_walk(p->s, p->x, p->y, p->grad, p->acc, lo, hi);
}
/* Split over the first output axis where it is not the tiled one (par.h). */
static inline void perm_run(const PermShape *s, float *x, float *y, int grad, int acc) {
  int parts = s->rank > 1 && !(s->st[s->rank - 1] != 1 && s->st[0] == 1 && s->out[0] > 1);
  if (!parts) perm_walk(s, x, y, grad, acc, 0, 1);
  else PR_PAR_RUN(s->out[0], 1, (double)s->n * 2, perm_r, &(PrPerm){s, x, y, grad, acc});
}
static inline void k_transpose(const float *x, float *y, const PermShape *s) { perm_run(s, (float *)x, y, 0, 0); }
static inline void k_transpose_grad(const float *dy, float *dx, const PermShape *s, int acc) {
  perm_run(s, dx, (float *)dy, 1, acc);
}

/* ---- Split / slices along one axis: [outer, axis, inner] ---- */
typedef struct PrTake {
  const float *x;
  float *y;
  int64_t axis, inner, start, len;
  int grad;
} PrTake;
/* Outer indices [lo, hi): a copy of each slice, or (grad) dy added into its place in x. */
PR_RANGE void take_r(const void *arg, int64_t lo, int64_t hi) {
  const PrTake *t = (const PrTake *)arg;
  int64_t n = t->len * t->inner;
  for (int64_t o = lo; o < hi; o++) {
    float *in = (float *)t->x + (o * t->axis + t->start) * t->inner, *sl = t->y + o * n;
    if (!t->grad) memcpy(sl, in, sizeof(float) * (size_t)n);
    else for (int64_t k = 0; k < n; k++) in[k] += sl[k];
  }
}
static inline void k_take(const float *x, float *y, int64_t outer, int64_t axis, int64_t inner, int64_t start, int64_t len) {
  PR_PAR_RUN(outer, 1, (double)outer * (double)len * (double)inner * 2, take_r, &(PrTake){x, y, axis, inner, start, len, 0});
}
/* Adds dy into its place in dx (dx zeroed by the caller's first call when needed). */
static inline void k_take_grad(const float *dy, float *dx, int64_t outer, int64_t axis, int64_t inner, int64_t start, int64_t len) {
  PR_PAR_RUN(outer, 1, (double)outer * (double)len * (double)inner * 3, take_r, &(PrTake){dx, (float *)dy, axis, inner, start, len, 1});
}
static inline void k_zero(float *x, int64_t n) { memset(x, 0, sizeof(float) * (size_t)n); }

/* ---- strided views: Slice, Expand, Tile ----
 * y[i] = x[base + sum_d idx_d(i) * st[d]] over y's dims `out`.  A Slice has
 * its steps (negative when it walks backwards) times x's strides; Expand has
 * stride 0 on broadcast axes; Tile reads x as [r0, d0, r1, d1, ...] with stride
 * 0 on each repeat axis (16 axes: two per axis of a rank-8 input). */

/* Input offset of the first element of output row r (a row: the last axis). */
static inline int64_t view_row(const ViewShape *s, int64_t r) {
  int64_t off = s->base;
  for (int d = s->rank - 2; d >= 0; d--) {
    off += (r % s->out[d]) * s->st[d];
    r /= s->out[d];
  }
  return off;
}
static inline void k_view(const float *x, float *y, const ViewShape *s) {
  int64_t len = s->out[s->rank - 1], step = s->st[s->rank - 1];
  for (int64_t r = 0; r < s->n / len; r++) {
    const float *src = x + view_row(s, r);
    for (int64_t k = 0; k < len; k++) y[r * len + k] = src[k * step];
  }
}
/* The adjoint: dx = 0 (acc = 0), then dy added at the element each output
 * read, in output order.  A Slice reads each element at most once; Expand
 * and Tile sum over the copies, so dx holds the sum over broadcast axes or
 * tiles. */
static inline void k_view_grad(const float *dy, float *dx, const ViewShape *s, int acc) {
  int64_t len = s->out[s->rank - 1], step = s->st[s->rank - 1];
  if (!acc) memset(dx, 0, sizeof(float) * (size_t)s->nx);
  for (int64_t r = 0; r < s->n / len; r++) {
    float *dst = dx + view_row(s, r);
    for (int64_t k = 0; k < len; k++) dst[k * step] += dy[r * len + k];
  }
}

/* ---- Cast to and from float32 at run time ----
 * Training values are float32 or int64; an inference program (--forward-only)
 * also reads bool, int32 and float16 inputs.  Buffers of those types are
 * declared float in the generated C, hence `const void *`. */
static inline void k_cast_i64_f32(const int64_t *x, float *y, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = (float)x[i];
}
static inline void k_cast_i32_f32(const void *x, float *y, int64_t n) {
  const int32_t *v = (const int32_t *)x;
  for (int64_t i = 0; i < n; i++) y[i] = (float)v[i];
}
static inline void k_cast_bool_f32(const void *x, float *y, int64_t n) {
  const uint8_t *v = (const uint8_t *)x;
  for (int64_t i = 0; i < n; i++) y[i] = v[i] ? 1.0f : 0.0f;
}
/* IEEE half to float, exactly (every half is a float): subnormals, infinities, NaN. */
static inline float pr_half_to_float(uint16_t h) {
  int e = h >> 10 & 0x1f, m = h & 0x3ff;
  float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 0x400), e - 25);
  return h >> 15 ? -v : v;
}
static inline void k_cast_f16_f32(const void *x, float *y, int64_t n) {
  const uint16_t *v = (const uint16_t *)x;
  for (int64_t i = 0; i < n; i++) y[i] = pr_half_to_float(v[i]);
}
/* Truncation toward zero, as numpy's astype and torch's .long(); NaN and
 * values outside int64 give INT64_MIN, what both give on x86 (and no
 * undefined behaviour here). */
static inline void k_cast_f32_i64(const float *x, int64_t *y, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = x[i] >= -0x1p63f && x[i] < 0x1p63f ? (int64_t)x[i] : INT64_MIN;
}

/* ---- Gather on axis 0: embedding lookup; its gradient is a scatter-add ----
 * Indices in [-rows, rows), a negative one counting from the end, as ONNX says; any other stops the run
 * naming the node (pr_bad_index): indices that come from the data are checked here, where they are used,
 * at one compare each.  The gradient checks them again before it adds into the table: it reads them
 * anew (a stashed copy, which the memory plan may have offloaded and brought back). */
static inline int64_t gather_row(const int64_t *idx, int64_t i, int64_t rows, const char *node, const char *what) {
  int64_t v = idx[i];
  if (__builtin_expect(v < -rows || v >= rows, 0)) pr_bad_index(node, what, i, v, rows, &pr_rand);
  return v < 0 ? v + rows : v;
}
static inline void k_gather(const float *table, const int64_t *idx, float *y, int64_t n, int64_t rows, int64_t width, const char *node) {
  for (int64_t i = 0; i < n; i++) {
    int64_t r = gather_row(idx, i, rows, node, "Gather");
    memcpy(y + i * width, table + r * width, sizeof(float) * (size_t)width);
  }
}
static inline void k_gather_grad(const int64_t *idx, const float *dy, float *dtable, int64_t n, int64_t rows, int64_t width,
                                 const char *node) {
  for (int64_t i = 0; i < n; i++) {
    int64_t r = gather_row(idx, i, rows, node, "Gather's gradient");
    for (int64_t k = 0; k < width; k++) dtable[r * width + k] += dy[i * width + k];
  }
}

/* ---- Concat at run time: each input is put into its slice of the output ---- */
/* The inverse of k_take: x [outer, len, inner] goes to y's slice [start,
 * start + len) along an axis of size `axis` ([outer, axis, inner]).  The K
 * inputs of a Concat cover y, so y needs no zeroing. */
PR_OUT_OF_LINE void k_put(const float *x, float *y, int64_t outer, int64_t axis, int64_t inner, int64_t start, int64_t len) {
  for (int64_t o = 0; o < outer; o++) memcpy(y + (o * axis + start) * inner, x + o * len * inner, sizeof(float) * (size_t)(len * inner));
}
/* Concat's gradient for one input: dx [outer, len, inner] = dy's slice, written
 * (acc = 0, the same as k_take(dy, dx, ...)) or added (acc = 1).  k_take_grad
 * is NOT this: it scatters a small dy INTO a slice of a large dx (Split's
 * gradient), the opposite direction, and always adds. */
PR_OUT_OF_LINE void k_put_grad(const float *dy, float *dx, int64_t outer, int64_t axis, int64_t inner, int64_t start, int64_t len,
                              int acc) {
  if (!acc) {
    k_take(dy, dx, outer, axis, inner, start, len);
    return;
  }
  for (int64_t o = 0; o < outer; o++)
    for (int64_t k = 0; k < len * inner; k++) dx[o * len * inner + k] += dy[(o * axis + start) * inner + k];
}
#endif
