/* reduce.c - ReduceMean and ReduceSum over any set of axes. */
#include "ops/rule.h"

static int reduce_fwd(Emit *e, const Node *n, int j) {
  Tensor *X = em_t(e, n->in[0]), *Y = em_t(e, n->out[0]);
  int mask;
  if (reduce_axes(em_graph(e), (Node *)n, X, &mask)) return -1;
  int64_t cnt = 1;
  for (int i = 0; i < X->rank; i++)
    if (mask >> i & 1) cnt *= X->dims[i];
  /* The mean's scale is rounded to float once, here, as 1.0f / count would be in C. */
  float scale = n->def->name[6] == 'M' ? 1.0f / (float)cnt : 1.0f;
  int rs = SHAPE(e, "ReduceShape", em_name(e, "RED_%d", j), A_INT(X->rank), A_INTS(X->dims, X->rank), A_INT(mask), A_INT(ir_numel(X)),
                 A_INT(ir_numel(Y)), A_FLT(scale));
  CALL(e, PH_FWD, K_REDUCE, n, A_BUF(em_in(e, n, 0)), A_BUF(em_out(e, n, 0)), A_CONST(rs));
  return 0;
}

static int reduce_bwd(Emit *e, const Node *n, int j) {
  if (!em_needs(e, n, 0)) return 0;
  int acc, dx = em_grad(e, n, 0, &acc);
  CALL(e, PH_IGRAD, K_REDUCE_GRAD, n, A_BUF(em_dy(e, n, 0)), A_BUF(dx), A_CONST(em_shape_ref(e, em_name(e, "RED_%d", j))), A_INT(acc));
  return 0;
}

static double reduce_flops(Graph *g, const Node *n) { return rule_numel(node_in(g, n, 0)); }

const OpDef OPS_REDUCE[] = {
    {"ReduceMean", "reduce", infer_Reduce, fold_Reduce, 1, STASH_NONE, reduce_flops, 0, reduce_fwd, reduce_bwd, NULL},
    {"ReduceSum", "reduce", infer_Reduce, fold_Reduce, 1, STASH_NONE, reduce_flops, 0, reduce_fwd, reduce_bwd, NULL},
    {0},
};
