/* shape.c - shape inference rules.
 *
 * Each rule reads its inputs' (already known) shapes and attributes and sets
 * dtype, rank and dims of its outputs.  Shapes are fully static: a value the
 * rule needs (a Reshape target, Slice bounds) must be a compile-time
 * constant, which constant folding has made it by the time the rule runs. */
#include "shape.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

int node_err(const Node *n, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return err_set("node '%s' (%s): %s", n->name, n->op, msg);
}

int norm_axis(int64_t axis, int rank) {
  if (axis < -rank || axis >= rank) return -1;
  return (int)(axis < 0 ? axis + rank : axis);
}

static void set_shape(Tensor *t, int dtype, int rank, const int64_t *dims) {
  t->dtype = dtype;
  t->rank = rank;
  for (int i = 0; i < rank; i++) t->dims[i] = dims[i];
}

static void copy_shape(Tensor *dst, const Tensor *src) { set_shape(dst, src->dtype, src->rank, src->dims); }

static Tensor *need_in(Graph *g, Node *n, int k) {
  Tensor *t = node_in(g, n, k);
  if (!t) {
    node_err(n, "input %d is missing", k);
    return NULL;
  }
  if (t->rank < 0) {
    node_err(n, "the shape of input '%s' is unknown", t->name);
    return NULL;
  }
  return t;
}

static Tensor *need_const(Graph *g, Node *n, int k, const char *what) {
  Tensor *t = need_in(g, n, k);
  if (t && !t->data) {
    node_err(n, "%s (input '%s') must be a compile-time constant, but it is computed at run time", what, t->name);
    return NULL;
  }
  return t;
}

int broadcast_shape(const Tensor *a, const Tensor *b, int *rank, int64_t *dims) {
  int r = a->rank > b->rank ? a->rank : b->rank;
  for (int i = 0; i < r; i++) {
    int ia = i - (r - a->rank), ib = i - (r - b->rank);
    int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
    if (da != db && da != 1 && db != 1) return -1;
    dims[i] = da == 1 ? db : da;
  }
  *rank = r;
  return 0;
}

int ints_from_attr_or_input(Graph *g, Node *n, const char *name, int k, int64_t *out, int max, int *count) {
  int c = attr_ints(n, name, out, max);
  if (c >= 0) {
    if (c > max) return node_err(n, "attribute '%s' has too many values", name);
    *count = c;
    return 0;
  }
  Tensor *t = node_in(g, n, k);
  if (!t) {
    *count = -1; /* absent */
    return 0;
  }
  if (!t->data) return node_err(n, "'%s' (input '%s') must be a compile-time constant", name, t->name);
  int64_t m = ir_numel(t);
  if (m > max) return node_err(n, "'%s' has too many values", name);
  for (int64_t i = 0; i < m; i++) out[i] = const_i64(t, i);
  *count = (int)m;
  return 0;
}

int infer_Unary(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0);
  if (!x) return -1;
  copy_shape(node_out(g, n, 0), x);
  if (!strcmp(n->op, "Not") && x->dtype != DT_BOOL) return node_err(n, "input must be bool");
  return 0;
}

static int broadcast_outputs(Graph *g, Node *n, int first, int count, int out_dtype) {
  int rank = 0;
  int64_t dims[MAX_RANK];
  Tensor acc = {0};
  for (int k = first; k < first + count; k++) {
    Tensor *x = need_in(g, n, k);
    if (!x) return -1;
    if (k == first) {
      acc = *x;
      continue;
    }
    if (broadcast_shape(&acc, x, &rank, dims))
      return node_err(n, "shapes %s and %s do not broadcast", shape_str(&acc), shape_str(x));
    acc.rank = rank;
    memcpy(acc.dims, dims, sizeof dims);
  }
  set_shape(node_out(g, n, 0), out_dtype, acc.rank, acc.dims);
  return 0;
}

int infer_Binary(Graph *g, Node *n) {
  Tensor *a = need_in(g, n, 0), *b = need_in(g, n, 1);
  if (!a || !b) return -1;
  if (a->dtype != b->dtype && strcmp(n->op, "Pow"))
    return node_err(n, "input types differ (%s and %s)", dtype_name(a->dtype), dtype_name(b->dtype));
  return broadcast_outputs(g, n, 0, 2, a->dtype);
}

int infer_Compare(Graph *g, Node *n) {
  Tensor *a = need_in(g, n, 0), *b = need_in(g, n, 1);
  if (!a || !b) return -1;
  return broadcast_outputs(g, n, 0, 2, DT_BOOL);
}

int infer_Where(Graph *g, Node *n) {
  Tensor *c = need_in(g, n, 0), *x = need_in(g, n, 1), *y = need_in(g, n, 2);
  if (!c || !x || !y) return -1;
  if (c->dtype != DT_BOOL) return node_err(n, "condition must be bool, not %s", dtype_name(c->dtype));
  if (x->dtype != y->dtype) return node_err(n, "X and Y types differ");
  return broadcast_outputs(g, n, 0, 3, x->dtype);
}

/* Spatial attributes shared by Conv and the pools. */
typedef struct Window {
  int nsp;
  int64_t k[MAX_RANK], s[MAX_RANK], d[MAX_RANK], pb[MAX_RANK], pe[MAX_RANK];
} Window;

static int window_attrs(Node *n, const Tensor *x, const int64_t *kernel, Window *w, int ceil_mode) {
  w->nsp = x->rank - 2;
  int64_t tmp[2 * MAX_RANK];
  for (int i = 0; i < w->nsp; i++) w->k[i] = kernel[i], w->s[i] = 1, w->d[i] = 1, w->pb[i] = w->pe[i] = 0;
  int c;
  if ((c = attr_ints(n, "strides", tmp, MAX_RANK)) >= 0) {
    if (c != w->nsp) return node_err(n, "strides has %d values for %d spatial dims", c, w->nsp);
    for (int i = 0; i < c; i++) w->s[i] = tmp[i];
  }
  if ((c = attr_ints(n, "dilations", tmp, MAX_RANK)) >= 0) {
    if (c != w->nsp) return node_err(n, "dilations has %d values for %d spatial dims", c, w->nsp);
    for (int i = 0; i < c; i++) w->d[i] = tmp[i];
  }
  const char *ap = attr_str(n, "auto_pad", "NOTSET");
  if (!strcmp(ap, "NOTSET")) {
    if ((c = attr_ints(n, "pads", tmp, 2 * MAX_RANK)) >= 0) {
      if (c != 2 * w->nsp) return node_err(n, "pads has %d values for %d spatial dims", c, w->nsp);
      for (int i = 0; i < w->nsp; i++) w->pb[i] = tmp[i], w->pe[i] = tmp[i + w->nsp];
    }
  } else if (!strcmp(ap, "SAME_UPPER") || !strcmp(ap, "SAME_LOWER")) {
    for (int i = 0; i < w->nsp; i++) {
      int64_t in = x->dims[i + 2], out = (in + w->s[i] - 1) / w->s[i];
      int64_t total = (out - 1) * w->s[i] + (w->k[i] - 1) * w->d[i] + 1 - in;
      if (total < 0) total = 0;
      w->pb[i] = !strcmp(ap, "SAME_UPPER") ? total / 2 : total - total / 2;
      w->pe[i] = total - w->pb[i];
    }
  } else if (strcmp(ap, "VALID")) {
    return node_err(n, "auto_pad '%s' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID", ap);
  }
  for (int i = 0; i < w->nsp; i++) {
    if (w->s[i] < 1 || w->d[i] < 1 || w->k[i] < 1 || w->pb[i] < 0 || w->pe[i] < 0)
      return node_err(n, "kernel, strides and dilations must be positive and pads non-negative");
    (void)ceil_mode;
  }
  return 0;
}

static int window_out(Node *n, const Tensor *x, const Window *w, int ceil_mode, int64_t *out) {
  for (int i = 0; i < w->nsp; i++) {
    int64_t span = x->dims[i + 2] + w->pb[i] + w->pe[i] - ((w->k[i] - 1) * w->d[i] + 1);
    if (span < 0)
      return node_err(n, "the window (%lld) is larger than the padded input (%lld) on spatial axis %d",
                      (long long)((w->k[i] - 1) * w->d[i] + 1), (long long)(x->dims[i + 2] + w->pb[i] + w->pe[i]), i);
    int64_t o = (ceil_mode ? (span + w->s[i] - 1) / w->s[i] : span / w->s[i]) + 1;
    /* As PyTorch and ONNX's reference: a last window that starts in the end padding is dropped. */
    if (ceil_mode && (o - 1) * w->s[i] >= x->dims[i + 2] + w->pb[i]) o--;
    out[i] = o;
  }
  return 0;
}

int infer_Conv(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0), *wt = need_in(g, n, 1);
  if (!x || !wt) return -1;
  if (x->rank < 3) return node_err(n, "input %s needs rank >= 3 (N, C, spatial...)", shape_str(x));
  if (wt->rank != x->rank) return node_err(n, "weight %s and input %s ranks differ", shape_str(wt), shape_str(x));
  int64_t group = attr_int(n, "group", 1);
  if (group < 1 || x->dims[1] % group || wt->dims[0] % group)
    return node_err(n, "group %lld does not divide channels (%lld in, %lld out)", (long long)group,
                    (long long)x->dims[1], (long long)wt->dims[0]);
  if (wt->dims[1] * group != x->dims[1])
    return node_err(n, "weight %s expects %lld input channels, input %s has %lld", shape_str(wt),
                    (long long)(wt->dims[1] * group), shape_str(x), (long long)x->dims[1]);
  int64_t kernel[MAX_RANK];
  int c = attr_ints(n, "kernel_shape", kernel, MAX_RANK);
  for (int i = 0; i < x->rank - 2; i++)
    if (c < 0) kernel[i] = wt->dims[i + 2];
    else if (c != x->rank - 2 || kernel[i] != wt->dims[i + 2])
      return node_err(n, "kernel_shape does not match weight %s", shape_str(wt));
  Tensor *b = node_in(g, n, 2);
  if (b && (b->rank != 1 || b->dims[0] != wt->dims[0]))
    return node_err(n, "bias %s must be [%lld]", shape_str(b), (long long)wt->dims[0]);
  Window w;
  int64_t dims[MAX_RANK] = {x->dims[0], wt->dims[0]};
  if (window_attrs(n, x, kernel, &w, 0) || window_out(n, x, &w, 0, dims + 2)) return -1;
  set_shape(node_out(g, n, 0), x->dtype, x->rank, dims);
  return 0;
}

int infer_Pool(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0);
  if (!x) return -1;
  if (x->rank < 3) return node_err(n, "input %s needs rank >= 3", shape_str(x));
  int64_t kernel[MAX_RANK];
  if (attr_ints(n, "kernel_shape", kernel, MAX_RANK) != x->rank - 2)
    return node_err(n, "kernel_shape must give %d values", x->rank - 2);
  if (node_attr(n, "storage_order") && attr_int(n, "storage_order", 0) != 0)
    return node_err(n, "storage_order=1 (column-major indices) is not supported");
  int ceil_mode = (int)attr_int(n, "ceil_mode", 0);
  Window w;
  int64_t dims[MAX_RANK] = {x->dims[0], x->dims[1]};
  if (window_attrs(n, x, kernel, &w, ceil_mode) || window_out(n, x, &w, ceil_mode, dims + 2)) return -1;
  set_shape(node_out(g, n, 0), x->dtype, x->rank, dims);
  Tensor *idx = node_out(g, n, 1);
  if (idx) set_shape(idx, DT_INT64, x->rank, dims);
  return 0;
}

int infer_GlobalPool(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0);
  if (!x) return -1;
  if (x->rank < 3) return node_err(n, "input %s needs rank >= 3", shape_str(x));
  int64_t dims[MAX_RANK];
  for (int i = 0; i < x->rank; i++) dims[i] = i < 2 ? x->dims[i] : 1;
  set_shape(node_out(g, n, 0), x->dtype, x->rank, dims);
  return 0;
}

int infer_BatchNorm(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0);
  if (!x) return -1;
  if (x->rank < 2) return node_err(n, "input %s needs rank >= 2", shape_str(x));
  for (int k = 1; k < 5; k++) {
    Tensor *p = need_in(g, n, k);
    if (!p) return -1;
    if (p->rank != 1 || p->dims[0] != x->dims[1])
      return node_err(n, "input '%s' %s must be [%lld] (one value per channel)", p->name, shape_str(p),
                      (long long)x->dims[1]);
  }
  copy_shape(node_out(g, n, 0), x);
  for (int k = 1; k < n->nout; k++) {
    Tensor *o = node_out(g, n, k);
    if (o) set_shape(o, x->dtype, 1, &x->dims[1]);
  }
  return 0;
}

int infer_MatMul(Graph *g, Node *n) {
  Tensor *a = need_in(g, n, 0), *b = need_in(g, n, 1);
  if (!a || !b) return -1;
  if (a->rank < 1 || b->rank < 1) return node_err(n, "inputs must have rank >= 1");
  /* Promote 1-D operands as numpy does, then broadcast the batch dims. */
  Tensor A = *a, B = *b;
  if (A.rank == 1) A.rank = 2, A.dims[1] = a->dims[0], A.dims[0] = 1;
  if (B.rank == 1) B.rank = 2, B.dims[0] = b->dims[0], B.dims[1] = 1;
  if (A.dims[A.rank - 1] != B.dims[B.rank - 2])
    return node_err(n, "inner dimensions differ: %s x %s", shape_str(a), shape_str(b));
  Tensor ab = A, bb = B;
  ab.rank -= 2, bb.rank -= 2;
  int rank;
  int64_t dims[MAX_RANK];
  if (broadcast_shape(&ab, &bb, &rank, dims))
    return node_err(n, "batch dimensions of %s and %s do not broadcast", shape_str(a), shape_str(b));
  if (a->rank > 1) dims[rank++] = A.dims[A.rank - 2];
  if (b->rank > 1) dims[rank++] = B.dims[B.rank - 1];
  set_shape(node_out(g, n, 0), a->dtype, rank, dims);
  return 0;
}

int infer_Gemm(Graph *g, Node *n) {
  Tensor *a = need_in(g, n, 0), *b = need_in(g, n, 1);
  if (!a || !b) return -1;
  if (a->rank != 2 || b->rank != 2) return node_err(n, "A %s and B %s must be matrices", shape_str(a), shape_str(b));
  int ta = (int)attr_int(n, "transA", 0), tb = (int)attr_int(n, "transB", 0);
  int64_t m = ta ? a->dims[1] : a->dims[0], k = ta ? a->dims[0] : a->dims[1];
  int64_t k2 = tb ? b->dims[1] : b->dims[0], nn = tb ? b->dims[0] : b->dims[1];
  if (k != k2) return node_err(n, "inner dimensions differ: A %s%s, B %s%s", shape_str(a), ta ? "^T" : "",
                               shape_str(b), tb ? "^T" : "");
  int64_t dims[2] = {m, nn};
  Tensor *c = node_in(g, n, 2);
  if (c) {
    Tensor y = {0};
    y.rank = 2, y.dims[0] = m, y.dims[1] = nn;
    int r;
    int64_t bd[MAX_RANK];
    if (c->rank < 0 || broadcast_shape(&y, c, &r, bd) || r != 2 || bd[0] != m || bd[1] != nn)
      return node_err(n, "C %s does not broadcast to [%lld,%lld]", shape_str(c), (long long)m, (long long)nn);
  }
  set_shape(node_out(g, n, 0), a->dtype, 2, dims);
  return 0;
}

int infer_Transpose(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0);
  if (!x) return -1;
  int64_t perm[MAX_RANK], dims[MAX_RANK];
  int c = attr_ints(n, "perm", perm, MAX_RANK);
  if (c < 0)
    for (int i = 0; i < x->rank; i++) perm[i] = x->rank - 1 - i;
  else if (c != x->rank)
    return node_err(n, "perm has %d entries for input %s", c, shape_str(x));
  int seen = 0;
  for (int i = 0; i < x->rank; i++) {
    if (perm[i] < 0 || perm[i] >= x->rank || (seen >> perm[i] & 1)) return node_err(n, "perm is not a permutation");
    seen |= 1 << perm[i];
    dims[i] = x->dims[perm[i]];
  }
  set_shape(node_out(g, n, 0), x->dtype, x->rank, dims);
  return 0;
}

int infer_Reshape(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0), *s = need_const(g, n, 1, "the target shape");
  if (!x || !s) return -1;
  int64_t r = ir_numel(s), dims[MAX_RANK], known = 1;
  if (s->rank != 1 || r > MAX_RANK) return node_err(n, "the target shape must be a 1-D list of at most %d values", MAX_RANK);
  int allowzero = (int)attr_int(n, "allowzero", 0), infer_at = -1;
  for (int64_t i = 0; i < r; i++) {
    int64_t d = const_i64(s, i);
    if (d == 0 && !allowzero) {
      if (i >= x->rank) return node_err(n, "target dim %lld is 0 (copy) but the input has rank %d", (long long)i, x->rank);
      d = x->dims[i];
    }
    if (d == -1) {
      if (infer_at >= 0) return node_err(n, "the target shape has more than one -1");
      infer_at = (int)i;
      continue;
    }
    if (d < 0) return node_err(n, "target dim %lld is negative (%lld)", (long long)i, (long long)d);
    if (d > 0 && known > INT64_MAX / d) return node_err(n, "the target shape is too large");
    dims[i] = d;
    known *= d;
  }
  int64_t total = ir_numel(x);
  if (infer_at >= 0) {
    if (known == 0 || total % known)
      return node_err(n, "cannot reshape %s (%lld elements) to the target shape: %lld is not a multiple of %lld%s",
                      shape_str(x), (long long)total, (long long)total, (long long)known,
                      " (the batch size may be baked into this node's constant shape)");
    dims[infer_at] = total / known;
  } else if (known != total) {
    return node_err(n, "cannot reshape %s (%lld elements) to a shape of %lld elements; the model pins the batch "
                    "size here (export it with a dynamic batch axis, or use the batch it was exported with)",
                    shape_str(x), (long long)total, (long long)known);
  }
  set_shape(node_out(g, n, 0), x->dtype, (int)r, dims);
  return 0;
}

int infer_Flatten(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0);
  if (!x) return -1;
  int64_t axis = attr_int(n, "axis", 1);
  if (axis < 0) axis += x->rank;
  if (axis < 0 || axis > x->rank) return node_err(n, "axis %lld is out of range for %s", (long long)axis, shape_str(x));
  int64_t dims[2] = {1, 1};
  for (int i = 0; i < x->rank; i++) dims[i >= axis] *= x->dims[i];
  set_shape(node_out(g, n, 0), x->dtype, 2, dims);
  return 0;
}

int infer_Squeeze(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0);
  if (!x) return -1;
  int64_t axes[MAX_RANK], dims[MAX_RANK];
  int c, drop = 0, r = 0;
  if (ints_from_attr_or_input(g, n, "axes", 1, axes, MAX_RANK, &c)) return -1;
  for (int i = 0; i < c; i++) {
    int a = norm_axis(axes[i], x->rank);
    if (a < 0) return node_err(n, "axis %lld is out of range for %s", (long long)axes[i], shape_str(x));
    if (x->dims[a] != 1) return node_err(n, "cannot squeeze axis %d of %s: it is not 1", a, shape_str(x));
    drop |= 1 << a;
  }
  for (int i = 0; i < x->rank; i++)
    if (c < 0 ? x->dims[i] != 1 : !(drop >> i & 1)) dims[r++] = x->dims[i];
  set_shape(node_out(g, n, 0), x->dtype, r, dims);
  return 0;
}

int infer_Unsqueeze(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0);
  if (!x) return -1;
  int64_t axes[MAX_RANK], dims[MAX_RANK];
  int c, add = 0;
  if (ints_from_attr_or_input(g, n, "axes", 1, axes, MAX_RANK, &c)) return -1;
  if (c < 1) return node_err(n, "axes is required");
  int r = x->rank + c;
  if (r > MAX_RANK) return node_err(n, "the result would have rank %d (max %d)", r, MAX_RANK);
  for (int i = 0; i < c; i++) {
    int a = norm_axis(axes[i], r);
    if (a < 0 || (add >> a & 1)) return node_err(n, "axis %lld is out of range or repeated", (long long)axes[i]);
    add |= 1 << a;
  }
  for (int i = 0, j = 0; i < r; i++) dims[i] = (add >> i & 1) ? 1 : x->dims[j++];
  set_shape(node_out(g, n, 0), x->dtype, r, dims);
  return 0;
}

int infer_Concat(Graph *g, Node *n) {
  Tensor *x0 = need_in(g, n, 0);
  if (!x0) return -1;
  int a = norm_axis(attr_int(n, "axis", 0), x0->rank);
  if (a < 0) return node_err(n, "axis is out of range for %s", shape_str(x0));
  int64_t dims[MAX_RANK];
  memcpy(dims, x0->dims, sizeof dims);
  dims[a] = 0;
  for (int k = 0; k < n->nin; k++) {
    Tensor *x = need_in(g, n, k);
    if (!x) return -1;
    if (x->rank != x0->rank || x->dtype != x0->dtype)
      return node_err(n, "input %d %s %s does not match input 0 %s %s", k, dtype_name(x->dtype), shape_str(x),
                      dtype_name(x0->dtype), shape_str(x0));
    for (int i = 0; i < x->rank; i++)
      if (i != a && x->dims[i] != x0->dims[i])
        return node_err(n, "input %d %s differs from %s outside axis %d", k, shape_str(x), shape_str(x0), a);
    dims[a] += x->dims[a];
  }
  set_shape(node_out(g, n, 0), x0->dtype, x0->rank, dims);
  return 0;
}

int infer_Split(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0);
  if (!x) return -1;
  int a = norm_axis(attr_int(n, "axis", 0), x->rank);
  if (a < 0) return node_err(n, "axis is out of range for %s", shape_str(x));
  int64_t split[64];
  int c;
  if (ints_from_attr_or_input(g, n, "split", 1, split, 64, &c)) return -1;
  if (c < 0) {
    /* Equal parts; the last one smaller when the size does not divide (opset 18). */
    int64_t parts = n->nout, size = (x->dims[a] + parts - 1) / parts;
    if (parts > 64) return node_err(n, "too many outputs");
    for (int i = 0; i < parts; i++) {
      int64_t left = x->dims[a] - i * size;
      split[i] = left < size ? (left < 0 ? 0 : left) : size;
    }
    if (x->dims[a] % parts && !node_attr(n, "num_outputs"))
      return node_err(n, "axis %d of size %lld does not split into %d equal parts", a, (long long)x->dims[a], n->nout);
    c = n->nout;
  }
  if (c != n->nout) return node_err(n, "split lists %d sizes for %d outputs", c, n->nout);
  int64_t sum = 0;
  for (int i = 0; i < c; i++) {
    if (split[i] < 0 || split[i] > x->dims[a]) return node_err(n, "split size %lld is out of range", (long long)split[i]);
    sum += split[i];
  }
  if (sum != x->dims[a]) return node_err(n, "split sizes add up to %lld, not %lld", (long long)sum, (long long)x->dims[a]);
  for (int i = 0; i < c; i++) {
    Tensor *o = node_out(g, n, i);
    if (!o) continue;
    copy_shape(o, x);
    o->dims[a] = split[i];
  }
  return 0;
}

/* Clamps ONNX Slice bounds for one axis exactly as the spec does. */
void slice_bounds(int64_t dim, int64_t start, int64_t end, int64_t step, int64_t *s, int64_t *count) {
  if (start < 0) start += dim;
  if (end < 0) end += dim;
  if (step > 0) {
    start = start < 0 ? 0 : start > dim ? dim : start;
    end = end < 0 ? 0 : end > dim ? dim : end;
    *count = end > start ? (end - start - 1) / step + 1 : 0;
  } else {
    start = start < 0 ? -1 : start > dim - 1 ? dim - 1 : start;
    end = end < -1 ? -1 : end > dim - 1 ? dim - 1 : end;
    if (step == INT64_MIN) step = -INT64_MAX;
    *count = start > end ? (start - end - 1) / -step + 1 : 0;
  }
  *s = start;
}

int slice_params(Graph *g, Node *n, const Tensor *x, int64_t *start, int64_t *step, int64_t *dims) {
  int64_t st[MAX_RANK], en[MAX_RANK], ax[MAX_RANK], sp[MAX_RANK];
  int cs, ce, ca, cp;
  if (g->opset < 10) {
    cs = attr_ints(n, "starts", st, MAX_RANK), ce = attr_ints(n, "ends", en, MAX_RANK);
    ca = attr_ints(n, "axes", ax, MAX_RANK), cp = -1;
  } else {
    if (!need_const(g, n, 1, "starts") || !need_const(g, n, 2, "ends")) return -1;
    if (ints_from_attr_or_input(g, n, "", 1, st, MAX_RANK, &cs) || ints_from_attr_or_input(g, n, "", 2, en, MAX_RANK, &ce) ||
        ints_from_attr_or_input(g, n, "", 3, ax, MAX_RANK, &ca) || ints_from_attr_or_input(g, n, "", 4, sp, MAX_RANK, &cp))
      return -1;
  }
  if (cs < 0 || cs != ce) return node_err(n, "starts and ends must have the same length");
  if (ca >= 0 && ca != cs) return node_err(n, "axes must have as many entries as starts");
  if (cp >= 0 && cp != cs) return node_err(n, "steps must have as many entries as starts");
  for (int i = 0; i < x->rank; i++) start[i] = 0, step[i] = 1, dims[i] = x->dims[i];
  int seen = 0;
  for (int i = 0; i < cs; i++) {
    int a = norm_axis(ca >= 0 ? ax[i] : i, x->rank);
    if (a < 0 || (seen >> a & 1)) return node_err(n, "slice axis %lld is out of range or repeated", (long long)(ca >= 0 ? ax[i] : i));
    seen |= 1 << a;
    step[a] = cp >= 0 ? sp[i] : 1;
    if (step[a] == 0) return node_err(n, "a slice step is 0");
    slice_bounds(x->dims[a], st[i], en[i], step[a], &start[a], &dims[a]);
  }
  return 0;
}

int infer_Slice(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0);
  if (!x) return -1;
  int64_t start[MAX_RANK], step[MAX_RANK], dims[MAX_RANK];
  if (slice_params(g, n, x, start, step, dims)) return -1;
  set_shape(node_out(g, n, 0), x->dtype, x->rank, dims);
  return 0;
}

int infer_Gather(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0), *idx = need_in(g, n, 1);
  if (!x || !idx) return -1;
  if (idx->dtype != DT_INT64 && idx->dtype != DT_INT32) return node_err(n, "indices must be int32 or int64");
  int a = norm_axis(attr_int(n, "axis", 0), x->rank);
  if (a < 0) return node_err(n, "axis is out of range for %s", shape_str(x));
  int r = x->rank - 1 + idx->rank;
  if (r > MAX_RANK) return node_err(n, "the result would have rank %d", r);
  int64_t dims[MAX_RANK];
  int k = 0;
  for (int i = 0; i < a; i++) dims[k++] = x->dims[i];
  for (int i = 0; i < idx->rank; i++) dims[k++] = idx->dims[i];
  for (int i = a + 1; i < x->rank; i++) dims[k++] = x->dims[i];
  if (idx->data)
    for (int64_t i = 0; i < ir_numel(idx); i++) {
      int64_t v = const_i64(idx, i);
      if (v < -x->dims[a] || v >= x->dims[a])
        return node_err(n, "index %lld is out of range for axis %d of size %lld", (long long)v, a, (long long)x->dims[a]);
    }
  set_shape(node_out(g, n, 0), x->dtype, r, dims);
  return 0;
}

int infer_LayerNorm(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0), *s = need_in(g, n, 1);
  if (!x || !s) return -1;
  int a = norm_axis(attr_int(n, "axis", -1), x->rank);
  if (a < 0) return node_err(n, "axis is out of range for %s", shape_str(x));
  for (int k = 1; k < 3; k++) {
    Tensor *p = node_in(g, n, k);
    if (!p) continue;
    Tensor norm = *x;
    int r;
    int64_t bd[MAX_RANK];
    if (p->rank > x->rank - a || broadcast_shape(&norm, p, &r, bd) || memcmp(bd, x->dims, sizeof(int64_t) * (size_t)r))
      return node_err(n, "%s %s does not match the normalised dims of %s", k == 1 ? "scale" : "bias", shape_str(p), shape_str(x));
  }
  copy_shape(node_out(g, n, 0), x);
  for (int k = 1; k < 3; k++) {
    Tensor *o = node_out(g, n, k);
    if (!o) continue;
    copy_shape(o, x);
    o->dtype = (int)attr_int(n, "stash_type", DT_FLOAT);
    for (int i = a; i < x->rank; i++) o->dims[i] = 1;
  }
  return 0;
}

/* Axes of a reduction: an attribute before opset 18 (13 for ReduceSum), an input after. */
int reduce_axes(Graph *g, Node *n, const Tensor *x, int *mask) {
  int64_t axes[MAX_RANK];
  int c;
  if (ints_from_attr_or_input(g, n, "axes", 1, axes, MAX_RANK, &c)) return -1;
  *mask = 0;
  if (c <= 0) {
    if (attr_int(n, "noop_with_empty_axes", 0)) return 0;
    *mask = (1 << x->rank) - 1;
    return 0;
  }
  for (int i = 0; i < c; i++) {
    int a = norm_axis(axes[i], x->rank);
    if (a < 0) return node_err(n, "axis %lld is out of range for %s", (long long)axes[i], shape_str(x));
    *mask |= 1 << a;
  }
  return 0;
}

int infer_Reduce(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0);
  if (!x) return -1;
  int mask, keep = (int)attr_int(n, "keepdims", 1), r = 0;
  if (reduce_axes(g, n, x, &mask)) return -1;
  int64_t dims[MAX_RANK];
  for (int i = 0; i < x->rank; i++)
    if (!(mask >> i & 1)) dims[r++] = x->dims[i];
    else if (keep) dims[r++] = 1;
  set_shape(node_out(g, n, 0), x->dtype, r, dims);
  return 0;
}

int infer_Dropout(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0);
  if (!x) return -1;
  copy_shape(node_out(g, n, 0), x);
  Tensor *m = node_out(g, n, 1);
  if (m) copy_shape(m, x), m->dtype = DT_BOOL;
  return 0;
}

int infer_Cast(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0);
  if (!x) return -1;
  int64_t to = attr_int(n, "to", 0);
  if (!dtype_size((int)to)) return node_err(n, "cast to element type %lld is not supported", (long long)to);
  copy_shape(node_out(g, n, 0), x);
  node_out(g, n, 0)->dtype = (int)to;
  return 0;
}

int infer_Expand(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0), *s = need_const(g, n, 1, "the shape");
  if (!x || !s) return -1;
  Tensor target = {0};
  target.rank = (int)ir_numel(s);
  if (s->rank != 1 || target.rank > MAX_RANK) return node_err(n, "the shape must be 1-D with at most %d values", MAX_RANK);
  for (int i = 0; i < target.rank; i++) target.dims[i] = const_i64(s, i);
  int r;
  int64_t dims[MAX_RANK];
  if (broadcast_shape(x, &target, &r, dims)) return node_err(n, "%s does not expand to %s", shape_str(x), shape_str(&target));
  set_shape(node_out(g, n, 0), x->dtype, r, dims);
  return 0;
}

int infer_Shape(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0);
  if (!x) return -1;
  int64_t start = attr_int(n, "start", 0), end = attr_int(n, "end", x->rank);
  if (start < 0) start += x->rank;
  if (end < 0) end += x->rank;
  start = start < 0 ? 0 : start > x->rank ? x->rank : start;
  end = end < 0 ? 0 : end > x->rank ? x->rank : end;
  int64_t len = end > start ? end - start : 0;
  set_shape(node_out(g, n, 0), DT_INT64, 1, &len);
  return 0;
}

int infer_Size(Graph *g, Node *n) {
  if (!need_in(g, n, 0)) return -1;
  set_shape(node_out(g, n, 0), DT_INT64, 0, NULL);
  return 0;
}

int infer_Constant(Graph *g, Node *n) {
  Tensor *o = node_out(g, n, 0);
  const Attr *a = n->nattrs == 1 ? &n->attrs[0] : NULL;
  if (!a) return node_err(n, "needs exactly one value attribute");
  if (!strcmp(a->name, "value") && a->type == ATTR_TENSOR) {
    copy_shape(o, &g->t[a->tensor]);
  } else if (!strcmp(a->name, "value_float") || !strcmp(a->name, "value_int")) {
    set_shape(o, a->name[6] == 'f' ? DT_FLOAT : DT_INT64, 0, NULL);
  } else if (!strcmp(a->name, "value_floats") || !strcmp(a->name, "value_ints")) {
    int64_t len = a->n;
    set_shape(o, a->name[6] == 'f' ? DT_FLOAT : DT_INT64, 1, &len);
  } else {
    return node_err(n, "attribute '%s' is not supported", a->name);
  }
  return 0;
}

int infer_ConstantOfShape(Graph *g, Node *n) {
  Tensor *s = need_const(g, n, 0, "the shape");
  if (!s) return -1;
  int64_t dims[MAX_RANK], r = ir_numel(s);
  if (s->rank != 1 || r > MAX_RANK) return node_err(n, "the shape must be 1-D with at most %d values", MAX_RANK);
  for (int i = 0; i < r; i++)
    if ((dims[i] = const_i64(s, i)) < 0) return node_err(n, "negative dimension");
  const Attr *v = node_attr(n, "value");
  set_shape(node_out(g, n, 0), v && v->type == ATTR_TENSOR ? g->t[v->tensor].dtype : DT_FLOAT, (int)r, dims);
  return 0;
}

int infer_Range(Graph *g, Node *n) {
  Tensor *a = need_const(g, n, 0, "start"), *b = need_const(g, n, 1, "limit"), *d = need_const(g, n, 2, "delta");
  if (!a || !b || !d) return -1;
  if (ir_numel(a) != 1 || ir_numel(b) != 1 || ir_numel(d) != 1) return node_err(n, "start, limit and delta must be scalars");
  double s = const_f64(a, 0), l = const_f64(b, 0), dl = const_f64(d, 0);
  if (dl == 0) return node_err(n, "delta is 0");
  double c = (l - s) / dl;
  int64_t len = c > 0 ? (int64_t)ceil(c) : 0;
  if (!dtype_is_float(a->dtype)) {
    int64_t si = const_i64(a, 0), li = const_i64(b, 0), di = const_i64(d, 0);
    len = di > 0 ? (li > si ? (li - si + di - 1) / di : 0) : (si > li ? (si - li - di - 1) / -di : 0);
  }
  set_shape(node_out(g, n, 0), a->dtype, 1, &len);
  return 0;
}

/* Pad (constant mode): pads from an attribute before opset 11, a constant input after. */
int pad_params(Graph *g, Node *n, const Tensor *x, int64_t *begin, int64_t *end, float *value) {
  const char *mode = attr_str(n, "mode", "constant");
  if (strcmp(mode, "constant")) return node_err(n, "mode '%s' is not supported (only constant)", mode);
  int64_t pads[2 * MAX_RANK];
  int c;
  if (g->opset < 11) {
    c = attr_ints(n, "pads", pads, 2 * MAX_RANK);
    *value = attr_float(n, "value", 0);
  } else {
    if (!need_const(g, n, 1, "pads")) return -1;
    if (n->nin > 3 && n->in[3] >= 0) return node_err(n, "the axes input is not supported");
    if (ints_from_attr_or_input(g, n, "", 1, pads, 2 * MAX_RANK, &c)) return -1;
    Tensor *v = node_in(g, n, 2);
    if (v && !v->data) return node_err(n, "constant_value must be a compile-time constant");
    *value = v && ir_numel(v) ? (float)const_f64(v, 0) : 0;
  }
  if (c != 2 * x->rank) return node_err(n, "pads has %d values for rank %d", c, x->rank);
  for (int i = 0; i < x->rank; i++) {
    begin[i] = pads[i], end[i] = pads[i + x->rank];
    if (begin[i] < 0 || end[i] < 0) return node_err(n, "negative pads (cropping) are not supported");
  }
  return 0;
}

int infer_Pad(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0);
  if (!x) return -1;
  int64_t b[MAX_RANK], e[MAX_RANK], dims[MAX_RANK];
  float v;
  if (pad_params(g, n, x, b, e, &v)) return -1;
  for (int i = 0; i < x->rank; i++) dims[i] = x->dims[i] + b[i] + e[i];
  set_shape(node_out(g, n, 0), x->dtype, x->rank, dims);
  return 0;
}
