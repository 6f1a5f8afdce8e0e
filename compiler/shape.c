/* shape.c - what the operators' shape rules share.
 *
 * Each rule (in compiler/ops/, with its operator) reads its inputs' already
 * known shapes and attributes and sets dtype, rank and dims of its outputs.
 * Shapes are fully static: a value a rule needs (a Reshape target, Slice
 * bounds) must be a compile-time constant, which constant folding has made it
 * by the time the rule runs, because the pass visits nodes in order. */
#include "shape.h"

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

void set_shape(Tensor *t, int dtype, int rank, const int64_t *dims) {
  t->dtype = dtype;
  t->rank = rank;
  for (int i = 0; i < rank; i++) t->dims[i] = dims[i];
}

void copy_shape(Tensor *dst, const Tensor *src) { set_shape(dst, src->dtype, src->rank, src->dims); }

Tensor *need_in(Graph *g, Node *n, int k) {
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

Tensor *need_const(Graph *g, Node *n, int k, const char *what) {
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

int infer_same(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0);
  if (!x) return -1;
  copy_shape(node_out(g, n, 0), x);
  return 0;
}

int broadcast_outputs(Graph *g, Node *n, int first, int count, int out_dtype) {
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

int window_attrs(const Node *n, const Tensor *x, const int64_t *kernel, Window *w) {
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
  }
  return 0;
}

int window_out(const Node *n, const Tensor *x, const Window *w, int ceil_mode, int64_t *out) {
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

int window_slots(const Node *n, const Window *w, const Tensor *x, const Tensor *y, WinSlots *ws) {
  if (w->nsp < 1 || w->nsp > WIN_SLOTS)
    return node_err(n, "%d spatial dims: only 1-D, 2-D and 3-D windows run", w->nsp);
  for (int i = 0; i < WIN_SLOTS; i++) {
    int a = i - (WIN_SLOTS - w->nsp); /* the window's axis in slot i; < 0: a unit slot */
    ws->in[i] = a < 0 ? 1 : x->dims[a + 2];
    ws->out[i] = a < 0 ? 1 : y->dims[a + 2];
    ws->k[i] = a < 0 ? 1 : w->k[a];
    ws->s[i] = a < 0 ? 1 : w->s[a];
    ws->pb[i] = a < 0 ? 0 : w->pb[a];
    ws->pe[i] = a < 0 ? 0 : w->pe[a];
    ws->d[i] = a < 0 ? 1 : w->d[a];
  }
  return 0;
}
