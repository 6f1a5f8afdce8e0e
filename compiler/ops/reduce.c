/* reduce.c - ReduceMean, ReduceSum and ReduceMax over any set of axes, and
 * ArgMax along one. */
#include <math.h>

#include "ops/rule.h"

enum { RED_MEAN = 1, RED_SUM, RED_MAX }; /* OpDef.code */

/* ---- shape and fold rules ---- */

/* Axes of a reduction: an attribute before opset 18 (13 for ReduceSum), an input after. */
static int reduce_axes(Graph *g, Node *n, const Tensor *x, int *mask) {
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

static int reduce_infer(Graph *g, Node *n) {
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

static int reduce_fold(Graph *g, Node *n) {
  Tensor *x = node_in(g, n, 0), *o = node_out(g, n, 0);
  fold_alloc(g, o);
  int mask;
  if (reduce_axes(g, n, x, &mask)) return -1;
  int64_t m = ir_numel(x), count = 1, xs[MAX_RANK];
  for (int i = 0; i < x->rank; i++)
    if (mask >> i & 1) count *= x->dims[i];
  /* Output index of each input element: drop the reduced coordinates. */
  row_strides(x, xs);
  double *acc = pool_alloc(&g->pool, (size_t)ir_numel(o) * sizeof(double) + 1);
  int max = n->def->code == RED_MAX;
  for (int64_t i = 0; max && i < ir_numel(o); i++) acc[i] = -INFINITY;
  for (int64_t lin = 0; lin < m; lin++) {
    int64_t out = 0, rem = lin;
    for (int i = 0; i < x->rank; i++) {
      int64_t c = rem / xs[i];
      rem %= xs[i];
      if (!(mask >> i & 1)) out = out * x->dims[i] + c;
    }
    double v = const_f64(x, lin);
    if (!max) acc[out] += v;
    else if (v > acc[out] || isnan(v)) acc[out] = v;
  }
  int mean = n->def->code == RED_MEAN;
  for (int64_t i = 0; i < ir_numel(o); i++) const_set_f64(o, i, mean ? acc[i] / (double)count : acc[i]);
  return 0;
}


static int reduce_fwd(Emit *e, const Node *n, int j) {
  Tensor *X = em_t(e, n->in[0]), *Y = em_t(e, n->out[0]);
  int mask;
  if (reduce_axes(em_graph(e), (Node *)n, X, &mask)) return -1;
  int64_t cnt = 1;
  for (int i = 0; i < X->rank; i++)
    if (mask >> i & 1) cnt *= X->dims[i];
  /* The mean's scale is rounded to float once, here, as 1.0f / count would be in C. */
  float scale = n->def->code == RED_MEAN ? 1.0f / (float)cnt : 1.0f;
  int rs = SHAPE(e, "ReduceShape", em_name(e, "RED_%d", j), A_INT(X->rank), A_INTS(X->dims, X->rank), A_INT(mask), A_INT(ir_numel(X)),
                 A_INT(ir_numel(Y)), A_FLT(scale));
  if (X->dtype != DT_FLOAT) return err_set("node '%s' (%s): only float32 runs at training time", n->name, n->op);
  int k = n->def->code == RED_MAX ? K_REDUCE_MAX : K_REDUCE;
  CALL(e, PH_FWD, k, n, A_BUF(em_in(e, n, 0)), A_BUF(em_out(e, n, 0)), A_CONST(rs));
  return 0;
}

static int reduce_bwd(Emit *e, const Node *n, int j) {
  if (!em_needs(e, n, 0)) return 0;
  int acc, dx = em_grad(e, n, 0, &acc);
  if (n->def->code == RED_MAX) { /* the gradient goes to the elements equal to the max: it reads x and y, counts ties in cnt */
    int cnt = em_work(e, "cnt_", n->out[0], 4 * ir_numel(em_t(e, n->out[0])));
    CALL(e, PH_IGRAD, K_REDUCE_MAX_GRAD, n, A_BUF(em_in(e, n, 0)), A_BUF(em_out(e, n, 0)), A_BUF(em_dy(e, n, 0)), A_BUF(dx), A_BUF(cnt),
         A_CONST(em_shape_ref(e, em_name(e, "RED_%d", j))), A_INT(acc));
    return 0;
  }
  CALL(e, PH_IGRAD, K_REDUCE_GRAD, n, A_BUF(em_dy(e, n, 0)), A_BUF(dx), A_CONST(em_shape_ref(e, em_name(e, "RED_%d", j))), A_INT(acc));
  return 0;
}

static double reduce_flops(Graph *g, const Node *n) { return rule_numel(node_in(g, n, 0)); }

/* ---- ArgMax: int64 indices along one axis, forward only ---- */

/* The axis, or -1 with the error set (naming the node). */
static int argmax_axis(const Node *n, const Tensor *x) {
  int64_t axis = attr_int(n, "axis", 0);
  int a = norm_axis(axis, x->rank);
  if (a < 0) node_err(n, "axis %lld is out of range for %s", (long long)axis, shape_str(x));
  return a;
}

static int argmax_infer(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0);
  if (!x) return -1;
  int a = argmax_axis(n, x), keep = (int)attr_int(n, "keepdims", 1), r = 0;
  if (a < 0) return -1;
  if (x->dims[a] == 0) return node_err(n, "axis %d of %s is empty: it has no largest element", a, shape_str(x));
  int64_t dims[MAX_RANK];
  for (int i = 0; i < x->rank; i++)
    if (i != a) dims[r++] = x->dims[i];
    else if (keep) dims[r++] = 1;
  set_shape(node_out(g, n, 0), DT_INT64, r, dims);
  return 0;
}

/* The same rule as k_argmax: a NaN is larger than any number; ties go first or last. */
static int argmax_fold(Graph *g, Node *n) {
  Tensor *x = node_in(g, n, 0), *o = node_out(g, n, 0);
  fold_alloc(g, o);
  int64_t outer, inner, a = argmax_axis(n, x), last = attr_int(n, "select_last_index", 0);
  rule_around(x, (int)a, &outer, &inner);
  for (int64_t p = 0; p < outer; p++)
    for (int64_t k = 0; k < inner; k++) {
      int64_t at = 0, base = p * x->dims[a] * inner + k;
      for (int64_t j = 1; j < x->dims[a]; j++) {
        double v = const_f64(x, base + j * inner), best = const_f64(x, base + at * inner);
        int better = isnan(v) ? !isnan(best) || last : !isnan(best) && (v > best || (last && v == best));
        if (better) at = j;
      }
      const_set_i64(o, p * inner + k, at);
    }
  return 0;
}

static int argmax_fwd(Emit *e, const Node *n, int j) {
  (void)j;
  Tensor *X = em_t(e, n->in[0]);
  if (X->dtype != DT_FLOAT) return err_set("node '%s' (ArgMax): only float32 inputs run at training time", n->name);
  int64_t outer, inner, a = argmax_axis(n, X);
  rule_around(X, (int)a, &outer, &inner);
  CALL(e, PH_FWD, K_ARGMAX, n, A_BUF(em_in(e, n, 0)), A_BUF(em_out(e, n, 0)), A_INT(outer), A_INT(X->dims[a]), A_INT(inner),
       A_INT(attr_int(n, "select_last_index", 0) != 0));
  return 0;
}

const OpDef OPS_REDUCE[] = {
    {"ReduceMean", "reduce", reduce_infer, reduce_fold, 1, STASH_NONE, reduce_flops, 0, reduce_fwd, reduce_bwd, NULL, RED_MEAN, 0, 1},
    {"ReduceSum", "reduce", reduce_infer, reduce_fold, 1, STASH_NONE, reduce_flops, 0, reduce_fwd, reduce_bwd, NULL, RED_SUM, 0, 1},
    {"ReduceMax", "reduce", reduce_infer, reduce_fold, 1, STASH_BOTH, reduce_flops, 0, reduce_fwd, reduce_bwd, NULL, RED_MAX, 0, 1},
    {"ArgMax", "reduce", argmax_infer, argmax_fold, 0, STASH_NONE, reduce_flops, 0, argmax_fwd, NULL, NULL, 0, 0, 1},
    {0},
};
