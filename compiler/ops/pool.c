/* pool.c - 2-D pooling: MaxPool, AveragePool, GlobalAveragePool. */
#include "ops/rule.h"

static int pool_fwd(Emit *e, const Node *n, int j) {
  Tensor *X = em_t(e, n->in[0]), *Y = em_t(e, n->out[0]);
  int global = !strcmp(n->def->name, "GlobalAveragePool"), max = !strcmp(n->def->name, "MaxPool");
  if (X->rank != 4) return err_set("node '%s' (%s): only 2-D pooling trains so far", n->name, n->op);
  int64_t ks[2] = {X->dims[2], X->dims[3]}, pads[4] = {0, 0, 0, 0}, st[2] = {1, 1}, dl[2] = {1, 1};
  if (!global) {
    attr_ints(n, "kernel_shape", ks, 2), attr_ints(n, "pads", pads, 4), attr_ints(n, "strides", st, 2);
    attr_ints(n, "dilations", dl, 2);
    if (strcmp(attr_str(n, "auto_pad", "NOTSET"), "NOTSET"))
      return err_set("node '%s' (%s): auto_pad does not train yet; export with explicit pads", n->name, n->op);
  }
  int ps = SHAPE(e, "PoolShape", em_name(e, "POOL_%d", j), A_INT(X->dims[0]), A_INT(X->dims[1]), A_INT(X->dims[2]), A_INT(X->dims[3]),
                 A_INT(Y->dims[2]), A_INT(Y->dims[3]), A_INT(ks[0]), A_INT(ks[1]), A_INT(st[0]), A_INT(st[1]), A_INT(pads[0]),
                 A_INT(pads[1]), A_INT(dl[0]), A_INT(dl[1]), A_INT(attr_int(n, "count_include_pad", 0)));
  CALL(e, PH_FWD, max ? K_MAXPOOL : K_AVGPOOL, n, A_BUF(em_in(e, n, 0)), A_BUF(em_out(e, n, 0)), A_CONST(ps));
  return 0;
}

static int pool_bwd(Emit *e, const Node *n, int j) {
  if (!em_needs(e, n, 0)) return 0;
  int ps = em_shape_ref(e, em_name(e, "POOL_%d", j)), dy = em_dy(e, n, 0), acc;
  int dx = em_grad(e, n, 0, &acc);
  if (!strcmp(n->def->name, "MaxPool"))
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
    {"MaxPool", "pool", infer_Pool, NULL, 1, STASH_INPUTS, pool_flops, 0, pool_fwd, pool_bwd, NULL},
    {"AveragePool", "pool", infer_Pool, NULL, 1, STASH_NONE, pool_flops, 0, pool_fwd, pool_bwd, NULL},
    {"GlobalAveragePool", "pool", infer_GlobalPool, NULL, 1, STASH_NONE, global_flops, 0, pool_fwd, pool_bwd, NULL},
    {0},
};
