/* norm.c - normalisations: BatchNormalization (training and inference, running
 * statistics as PyTorch), LayerNormalization, Softmax and LogSoftmax. */
#include <stdio.h>
#include <stdlib.h>


#include "ops/rule.h"

enum { SOFTMAX = 1, LOG_SOFTMAX, BN_RELU }; /* OpDef.code */

/* ---- BatchNormalization ---- */

static int bn_infer(Graph *g, Node *n) {
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

/* The double a float attribute was written from: its shortest decimal
 * (0.9f -> 0.9).  PyTorch updates running statistics with its momentum in
 * double (0.1, so 1 - 0.1 = 0.9 exactly where 1 - 0.9f is 0.100000024); the
 * exported float would move every running statistic by 2e-7 relative. */
static double decimal_of(float f) {
  char num[32];
  for (int p = 1; p <= 9; p++) {
    snprintf(num, sizeof num, "%.*g", p, f);
    if ((float)strtod(num, NULL) == f) return strtod(num, NULL);
  }
  return f;
}

static int bn_training(Emit *e, const Node *n) {
  return em_graph(e)->opset >= 14 ? (int)attr_int(n, "training_mode", 0) : n->nout > 1;
}

static int bn_fwd(Emit *e, const Node *n, int j) {
  Tensor *X = em_t(e, n->in[0]);
  int64_t sp = X->rank > 2 ? ir_numel(X) / (X->dims[0] * X->dims[1]) : 1;
  int rm = em_in(e, n, 3), rv = em_in(e, n, 4);
  int training = bn_training(e, n);
#define BN_SHAPE(name, train)                                                                                                    \
  SHAPE(e, "BnShape", name, A_INT(X->dims[0]), A_INT(X->dims[1]), A_INT(sp), A_FLT(attr_float(n, "epsilon", 1e-5f)),             \
        A_DBL(decimal_of(attr_float(n, "momentum", 0.9f))), A_INT(n->def->code == BN_RELU), A_INT(train))
  int bs = BN_SHAPE(em_name(e, "BN_%d", j), training);
  int x = em_in(e, n, 0), scale = em_in(e, n, 1), bias = em_in(e, n, 2), y = em_out(e, n, 0);
  CALL(e, PH_FWD, K_BATCHNORM, n, A_BUF(x), A_BUF(scale), A_BUF(bias), A_BUF(rm), A_BUF(rv), A_BUF(y), A_CONST(bs));
  if (training) {
    /* The eval forward normalises with the running statistics and leaves them; a recomputation
     * normalises with the batch's and leaves them too: the forward already moved them. */
    int eval = BN_SHAPE(em_name(e, "BN_%d_EVAL", j), 0);
    VARIANT(e, VAR_EVAL, K_BATCHNORM, A_BUF(x), A_BUF(scale), A_BUF(bias), A_BUF(rm), A_BUF(rv), A_BUF(y), A_CONST(eval));
    VARIANT(e, VAR_RECOMPUTE, K_BATCHNORM, A_BUF(x), A_BUF(scale), A_BUF(bias), A_BUF(-1), A_BUF(-1), A_BUF(y), A_CONST(bs));
  }
#undef BN_SHAPE
  /* Training mode's other outputs are the updated running statistics. */
  for (int q = 1; q < 3 && q < n->nout; q++)
    if (em_used(e, n, q)) CALL(e, PH_FWD, K_COPY, n, A_BUF(q == 1 ? rm : rv), A_BUF(em_out(e, n, q)), A_INT(X->dims[1]));
  return 0;
}

static int bn_bwd(Emit *e, const Node *n, int j) {
  int accx = 0;
  int dg = em_needs(e, n, 1) ? em_grad_add(e, n, 1) : -1;
  int dbt = em_needs(e, n, 2) ? em_grad_add(e, n, 2) : -1;
  int dx = em_needs(e, n, 0) ? em_grad(e, n, 0, &accx) : -1;
  int shape = em_shape_ref(e, em_name(e, "BN_%d", j));
  /* One pass computes dx, dgamma and dbeta together; when W runs apart it is
   * two passes, the same sums in the same order, so the weights do not change. */
  int apart = em_split_wgrad(e) && dx >= 0 && (dg >= 0 || dbt >= 0);
  for (int half = 0; half <= apart; half++) {
    int wx = apart && half == 1 ? -1 : dx, wg = apart && half == 0 ? -1 : dg, wb = apart && half == 0 ? -1 : dbt;
    CALL(e, wx >= 0 ? PH_IGRAD : PH_WGRAD, K_BATCHNORM_GRAD, n, A_BUF(em_in(e, n, 0)), A_BUF(em_in(e, n, 1)), A_BUF(em_in(e, n, 3)),
         A_BUF(em_in(e, n, 4)), A_BUF(em_dy(e, n, 0)), A_BUF(n->def->code == BN_RELU ? em_out(e, n, 0) : -1), A_BUF(wx), A_BUF(wg),
         A_BUF(wb), A_CONST(shape), A_INT(accx));
  }
  return 0;
}

static double bn_flops(Graph *g, const Node *n) { return (n->def && n->def->code == BN_RELU ? 6 : 5) * rule_numel(node_in(g, n, 0)); }

/* ---- LayerNormalization over the trailing axes from `axis` ---- */

static int ln_infer(Graph *g, Node *n) {
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

static int64_t ln_cols(Emit *e, const Node *n) {
  Tensor *X = em_t(e, n->in[0]);
  int64_t axis = attr_int(n, "axis", -1), cols = 1;
  if (axis < 0) axis += X->rank;
  for (int i = (int)axis; i < X->rank; i++) cols *= X->dims[i];
  return cols;
}

static int ln_fwd(Emit *e, const Node *n, int j) {
  (void)j;
  Tensor *X = em_t(e, n->in[0]);
  int64_t cols = ln_cols(e, n), rows = ir_numel(X) / cols;
  float eps = attr_float(n, "epsilon", 1e-5f);
  if (ir_numel(em_t(e, n->in[1])) != cols)
    return err_set("node '%s' (LayerNormalization): a broadcast scale does not train yet", n->name);
  int x = em_in(e, n, 0);
  CALL(e, PH_FWD, K_LAYERNORM, n, A_BUF(x), A_BUF(em_in(e, n, 1)), A_BUF(em_in(e, n, 2)), A_BUF(em_out(e, n, 0)), A_INT(rows),
       A_INT(cols), A_FLT(eps));
  /* The optional Mean and InvStdDev outputs, when something reads them. */
  int mo = em_used(e, n, 1) ? em_out(e, n, 1) : -1, io = em_used(e, n, 2) ? em_out(e, n, 2) : -1;
  if (mo >= 0 || io >= 0) CALL(e, PH_FWD, K_LAYERNORM_STATS, n, A_BUF(x), A_BUF(mo), A_BUF(io), A_INT(rows), A_INT(cols), A_FLT(eps));
  return 0;
}

static int ln_bwd(Emit *e, const Node *n, int j) {
  (void)j;
  int64_t cols = ln_cols(e, n), rows = ir_numel(em_t(e, n->in[0])) / cols;
  int accx = 0, hasb = n->nin > 2 && n->in[2] >= 0;
  int ds = em_needs(e, n, 1) ? em_grad_add(e, n, 1) : -1;
  int db = hasb && em_needs(e, n, 2) ? em_grad_add(e, n, 2) : -1;
  int dx = em_needs(e, n, 0) ? em_grad(e, n, 0, &accx) : -1;
  /* As for BatchNormalization: two passes when W runs apart, one otherwise. */
  int apart = em_split_wgrad(e) && dx >= 0 && (ds >= 0 || db >= 0);
  for (int half = 0; half <= apart; half++) {
    int wx = apart && half == 1 ? -1 : dx, ws = apart && half == 0 ? -1 : ds, wb = apart && half == 0 ? -1 : db;
    CALL(e, wx >= 0 ? PH_IGRAD : PH_WGRAD, K_LAYERNORM_GRAD, n, A_BUF(em_in(e, n, 0)), A_BUF(em_in(e, n, 1)), A_BUF(em_dy(e, n, 0)),
         A_BUF(wx), A_BUF(ws), A_BUF(wb), A_INT(rows), A_INT(cols), A_FLT(attr_float(n, "epsilon", 1e-5f)), A_INT(accx));
  }
  return 0;
}

static double ln_flops(Graph *g, const Node *n) { return 8 * rule_numel(node_in(g, n, 0)); }

/* ---- Softmax / LogSoftmax over the last axis ---- */

static int softmax_fwd(Emit *e, const Node *n, int j) {
  (void)j;
  Tensor *X = em_t(e, n->in[0]);
  int64_t axis = attr_int(n, "axis", em_graph(e)->opset >= 13 ? -1 : 1);
  if (axis < 0) axis += X->rank;
  if (axis != X->rank - 1) return err_set("node '%s' (%s): only the last axis trains so far", n->name, n->op);
  int64_t cols = X->dims[X->rank - 1];
  CALL(e, PH_FWD, K_SOFTMAX, n, A_BUF(em_in(e, n, 0)), A_BUF(em_out(e, n, 0)), A_INT(ir_numel(X) / cols), A_INT(cols),
       A_INT(n->def->code == LOG_SOFTMAX));
  return 0;
}

static int softmax_bwd(Emit *e, const Node *n, int j) {
  (void)j;
  if (!em_needs(e, n, 0)) return 0;
  Tensor *X = em_t(e, n->in[0]);
  int64_t cols = X->dims[X->rank - 1];
  int acc, dx = em_grad(e, n, 0, &acc);
  CALL(e, PH_IGRAD, K_SOFTMAX_GRAD, n, A_BUF(em_out(e, n, 0)), A_BUF(em_dy(e, n, 0)), A_BUF(dx),
       A_INT(ir_numel(X) / cols), A_INT(cols), A_INT(n->def->code == LOG_SOFTMAX), A_INT(acc));
  return 0;
}

static double softmax_flops(Graph *g, const Node *n) { return 5 * rule_numel(node_in(g, n, 0)); }

/* BatchNormalization with the Relu that alone reads its output (fuse.c): one pass less each way.  Its
 * backward reads the output too, for the Relu's mask.  Not in the table: no model names it. */
const OpDef OP_BATCHNORM_RELU = {"BatchNormalization+Relu", "norm", bn_infer, NULL, 7, STASH_BOTH, bn_flops, 0, bn_fwd, bn_bwd,
                                 NULL, BN_RELU, 0, 0x1F};

const OpDef OPS_NORM[] = {
    {"BatchNormalization", "norm", bn_infer, NULL, 7, STASH_INPUTS, bn_flops, 0, bn_fwd, bn_bwd, NULL, 0, 0, 0x1F},
    {"LayerNormalization", "norm", ln_infer, NULL, 7, STASH_INPUTS, ln_flops, 0, ln_fwd, ln_bwd, NULL, 0, 0, 7},
    {"Softmax", "norm", infer_same, NULL, 1, STASH_OUTPUT, softmax_flops, 0, softmax_fwd, softmax_bwd, NULL, SOFTMAX, 0, 1},
    {"LogSoftmax", "norm", infer_same, NULL, 1, STASH_OUTPUT, softmax_flops, 0, softmax_fwd, softmax_bwd, NULL, LOG_SOFTMAX, 0, 1},
    {0},
};

