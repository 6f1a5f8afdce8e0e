/* compile_time.c - shape arithmetic and masks: ops pipecc evaluates while
 * compiling (constant folding) and never runs in a stage program.  An export's
 * x.size() views, arange positions and causal masks end up here. */
#include <math.h>

#include "ops/elementwise.h"
#include "ops/rule.h"

/* ---- Constant and ConstantOfShape ---- */

static int constant_infer(Graph *g, Node *n) {
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

static int constant_fold(Graph *g, Node *n) {
  Tensor *o = node_out(g, n, 0);
  const Attr *a = &n->attrs[0];
  fold_alloc(g, o);
  if (a->type == ATTR_TENSOR) memcpy(o->data, g->t[a->tensor].data, (size_t)tensor_bytes(o));
  else if (a->type == ATTR_FLOAT) const_set_f64(o, 0, a->f);
  else if (a->type == ATTR_INT) const_set_i64(o, 0, a->i);
  else
    for (int i = 0; i < a->n; i++)
      if (a->type == ATTR_FLOATS) const_set_f64(o, i, a->floats[i]);
      else const_set_i64(o, i, a->ints[i]);
  return 0;
}

static int cos_infer(Graph *g, Node *n) {
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

static int cos_fold(Graph *g, Node *n) {
  Tensor *o = node_out(g, n, 0);
  fold_alloc(g, o);
  const Attr *v = node_attr(n, "value");
  if (!v || v->type != ATTR_TENSOR) return 0; /* zeros */
  Tensor *val = &g->t[v->tensor];
  if (ir_numel(val) != 1) return node_err(n, "value must hold one element");
  int64_t esz = dtype_size(o->dtype);
  for (int64_t i = 0; i < ir_numel(o); i++) memcpy((char *)o->data + i * esz, val->data, (size_t)esz);
  return 0;
}

/* ---- Shape and Size: only the input's shape is read (OPF_FOLD_FROM_SHAPE) ---- */

static int shape_infer(Graph *g, Node *n) {
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

static int shape_fold(Graph *g, Node *n) {
  Tensor *x = node_in(g, n, 0), *o = node_out(g, n, 0);
  fold_alloc(g, o);
  int64_t start = attr_int(n, "start", 0);
  if (start < 0) start += x->rank;
  if (start < 0) start = 0;
  for (int64_t i = 0; i < o->dims[0]; i++) const_set_i64(o, i, x->dims[start + i]);
  return 0;
}

static int size_infer(Graph *g, Node *n) {
  if (!need_in(g, n, 0)) return -1;
  set_shape(node_out(g, n, 0), DT_INT64, 0, NULL);
  return 0;
}

static int size_fold(Graph *g, Node *n) {
  Tensor *o = node_out(g, n, 0);
  fold_alloc(g, o);
  const_set_i64(o, 0, ir_numel(node_in(g, n, 0)));
  return 0;
}

/* ---- Range (positions) and Trilu (causal masks) ---- */

static int range_infer(Graph *g, Node *n) {
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

static int range_fold(Graph *g, Node *n) {
  Tensor *a = node_in(g, n, 0), *d = node_in(g, n, 2), *o = node_out(g, n, 0);
  fold_alloc(g, o);
  for (int64_t i = 0; i < o->dims[0]; i++)
    if (dtype_is_float(o->dtype)) const_set_f64(o, i, const_f64(a, 0) + (double)i * const_f64(d, 0));
    else const_set_i64(o, i, const_i64(a, 0) + i * const_i64(d, 0));
  return 0;
}

static int trilu_fold(Graph *g, Node *n) {
  Tensor *x = node_in(g, n, 0), *o = node_out(g, n, 0), *kt = node_in(g, n, 1);
  if (x->rank < 2) return node_err(n, "input must have rank >= 2");
  fold_alloc(g, o);
  int64_t k = kt ? const_i64(kt, 0) : 0, upper = attr_int(n, "upper", 1);
  int64_t rows = x->dims[x->rank - 2], cols = x->dims[x->rank - 1], esz = dtype_size(x->dtype);
  for (int64_t i = 0; i < ir_numel(o); i++) {
    int64_t c = i % cols, r = (i / cols) % rows;
    int keep = upper ? c - r >= k : c - r <= k;
    if (keep) memcpy((char *)o->data + i * esz, (const char *)x->data + i * esz, (size_t)esz);
  }
  return 0;
}

#define CT(name, infer, fold) {name, "compile_time", infer, fold, 0, STASH_NONE, NULL, 0, NULL, NULL, NULL, 0, 0, 0}
/* Arithmetic, comparisons and logic share elementwise.c's rules, told apart by code. */
#define CT_EW(name, infer, fold, code) {name, "compile_time", infer, fold, 0, STASH_NONE, NULL, 0, NULL, NULL, NULL, code, 0, 0}
#define CT_SHAPE(name, infer, fold) \
  {name, "compile_time", infer, fold, 0, STASH_NONE, NULL, 0, NULL, NULL, NULL, 0, OPF_FOLD_FROM_SHAPE, 0}
const OpDef OPS_COMPILE_TIME[] = {
    CT("Constant", constant_infer, constant_fold),
    CT("ConstantOfShape", cos_infer, cos_fold),
    CT_SHAPE("Shape", shape_infer, shape_fold),
    CT_SHAPE("Size", size_infer, size_fold),
    CT("Range", range_infer, range_fold),
    CT_EW("LessOrEqual", ew_infer_compare, ew_fold_binary, EW_LESS_EQUAL),
    CT_EW("GreaterOrEqual", ew_infer_compare, ew_fold_binary, EW_GREATER_EQUAL),
    CT_EW("And", ew_infer_compare, ew_fold_binary, EW_AND),
    CT_EW("Or", ew_infer_compare, ew_fold_binary, EW_OR),
    CT("Trilu", infer_same, trilu_fold),
    CT_EW("Floor", infer_same, ew_fold_unary, EW_FLOOR),
    CT_EW("Ceil", infer_same, ew_fold_unary, EW_CEIL),
    CT_EW("Mod", ew_infer_binary, ew_fold_binary, EW_MOD),
    {0},
};
