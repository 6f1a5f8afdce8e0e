/* pool.c - 1-D, 2-D and 3-D pooling: MaxPool, AveragePool, GlobalAveragePool. */
#include "ops/rule.h"

enum { POOL_MAX = 1, POOL_AVG, POOL_GLOBAL }; /* OpDef.code */

static int pool_infer(Graph *g, Node *n) {
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
  if (window_attrs(n, x, kernel, &w) || window_out(n, x, &w, ceil_mode, dims + 2)) return -1;
  set_shape(node_out(g, n, 0), x->dtype, x->rank, dims);
  Tensor *idx = node_out(g, n, 1);
  if (idx) set_shape(idx, DT_INT64, x->rank, dims);
  return 0;
}

static int global_infer(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0);
  if (!x) return -1;
  if (x->rank < 3) return node_err(n, "input %s needs rank >= 3", shape_str(x));
  int64_t dims[MAX_RANK];
  for (int i = 0; i < x->rank; i++) dims[i] = i < 2 ? x->dims[i] : 1;
  set_shape(node_out(g, n, 0), x->dtype, x->rank, dims);
  return 0;
}

/* A global pool is the window that covers the whole input once. */
static int global_window(const Tensor *X, Window *w) {
  w->nsp = X->rank - 2;
  for (int i = 0; i < w->nsp; i++) w->k[i] = X->dims[i + 2], w->s[i] = w->d[i] = 1, w->pb[i] = w->pe[i] = 0;
  return 0;
}

static int pool_fwd(Emit *e, const Node *n, int j) {
  Tensor *X = em_t(e, n->in[0]), *Y = em_t(e, n->out[0]);
  int64_t kernel[MAX_RANK];
  Window w;
  WinSlots ws; /* pads resolved here from auto_pad and the static shapes */
  attr_ints(n, "kernel_shape", kernel, MAX_RANK);
  if (n->def->code == POOL_GLOBAL ? global_window(X, &w) : window_attrs(n, X, kernel, &w)) return -1;
  if (window_slots(n, &w, X, Y, &ws)) return -1;
  int ps = SHAPE(e, "PoolShape", em_name(e, "POOL_%d", j), A_INT(X->dims[0]), A_INT(X->dims[1]), A_INT(ws.in[0]),
                 A_INT(ws.in[1]), A_INT(ws.in[2]), A_INT(ws.out[0]), A_INT(ws.out[1]), A_INT(ws.out[2]), A_INT(ws.k[0]),
                 A_INT(ws.k[1]), A_INT(ws.k[2]), A_INT(ws.s[0]), A_INT(ws.s[1]), A_INT(ws.s[2]), A_INT(ws.pb[0]),
                 A_INT(ws.pb[1]), A_INT(ws.pb[2]), A_INT(ws.d[0]), A_INT(ws.d[1]), A_INT(ws.d[2]), A_INT(ws.pe[0]),
                 A_INT(ws.pe[1]), A_INT(ws.pe[2]), A_INT(attr_int(n, "count_include_pad", 0)));
  CALL(e, PH_FWD, n->def->code == POOL_MAX ? K_MAXPOOL : K_AVGPOOL, n, A_BUF(em_in(e, n, 0)), A_BUF(em_out(e, n, 0)),
       A_CONST(ps));
  return 0;
}

static int pool_bwd(Emit *e, const Node *n, int j) {
  if (!em_needs(e, n, 0)) return 0;
  int ps = em_shape_ref(e, em_name(e, "POOL_%d", j)), dy = em_dy(e, n, 0), acc;
  int dx = em_grad(e, n, 0, &acc);
  if (n->def->code == POOL_MAX)
    CALL(e, PH_IGRAD, K_MAXPOOL_GRAD, n, A_BUF(em_in(e, n, 0)), A_BUF(dy), A_BUF(dx), A_CONST(ps), A_INT(acc));
  else
    CALL(e, PH_IGRAD, K_AVGPOOL_GRAD, n, A_BUF(dy), A_BUF(dx), A_CONST(ps), A_INT(acc));
  return 0;
}

static double pool_flops(Graph *g, const Node *n) {
  int64_t k[MAX_RANK];
  int c = attr_ints(n, "kernel_shape", k, MAX_RANK);
  double w = 1;
  for (int i = 0; i < c; i++) w *= (double)k[i];
  return rule_numel(node_out(g, n, 0)) * w;
}

static double global_flops(Graph *g, const Node *n) { return rule_numel(node_in(g, n, 0)); }

const OpDef OPS_POOL[] = {
    {"MaxPool", "pool", pool_infer, NULL, 1, STASH_INPUTS, pool_flops, 0, pool_fwd, pool_bwd, NULL, POOL_MAX, 0, 1},
    {"AveragePool", "pool", pool_infer, NULL, 1, STASH_NONE, pool_flops, 0, pool_fwd, pool_bwd, NULL, POOL_AVG, 0, 1},
    {"GlobalAveragePool", "pool", global_infer, NULL, 1, STASH_NONE, global_flops, 0, pool_fwd, pool_bwd, NULL, POOL_GLOBAL, 0, 1},
    {0},
};
