/* elementwise.c - activations, unary maths and broadcasting arithmetic:
 * Relu, LeakyRelu, Tanh, Sigmoid, Gelu, Erf, Sqrt, Add, Sub, Mul, Div, Pow, Where. */
#include "ops/rule.h"

static int64_t out_numel(Emit *e, const Node *n) { return ir_numel(em_t(e, n->out[0])); }

/* ---- activations whose gradient needs only their output y ---- */

static int act_kernel(const Node *n, int grad) {
  switch (n->def->name[0]) {
  case 'R': return grad ? K_RELU_GRAD : K_RELU;
  case 'T': return grad ? K_TANH_GRAD : K_TANH;
  default: return grad ? K_SIGMOID_GRAD : K_SIGMOID;
  }
}

static int act_fwd(Emit *e, const Node *n, int j) {
  (void)j;
  CALL(e, PH_FWD, act_kernel(n, 0), n, A_BUF(em_in(e, n, 0)), A_BUF(em_out(e, n, 0)), A_INT(out_numel(e, n)));
  return 0;
}

static int act_bwd(Emit *e, const Node *n, int j) {
  (void)j;
  if (!em_needs(e, n, 0)) return 0;
  int acc, dx = em_grad(e, n, 0, &acc);
  CALL(e, PH_IGRAD, act_kernel(n, 1), n, A_BUF(em_out(e, n, 0)), A_BUF(em_dy(e, n, 0)), A_BUF(dx), A_INT(out_numel(e, n)), A_INT(acc));
  return 0;
}

/* ---- Erf (gradient from x) and Sqrt (gradient from y) ---- */

static int erf_fwd(Emit *e, const Node *n, int j) {
  (void)j;
  CALL(e, PH_FWD, K_ERF, n, A_BUF(em_in(e, n, 0)), A_BUF(em_out(e, n, 0)), A_INT(out_numel(e, n)));
  return 0;
}
static int erf_bwd(Emit *e, const Node *n, int j) {
  (void)j;
  if (!em_needs(e, n, 0)) return 0;
  int acc, dx = em_grad(e, n, 0, &acc);
  CALL(e, PH_IGRAD, K_ERF_GRAD, n, A_BUF(em_in(e, n, 0)), A_BUF(em_dy(e, n, 0)), A_BUF(dx), A_INT(out_numel(e, n)), A_INT(acc));
  return 0;
}
static int sqrt_fwd(Emit *e, const Node *n, int j) {
  (void)j;
  CALL(e, PH_FWD, K_SQRT, n, A_BUF(em_in(e, n, 0)), A_BUF(em_out(e, n, 0)), A_INT(out_numel(e, n)));
  return 0;
}
static int sqrt_bwd(Emit *e, const Node *n, int j) {
  (void)j;
  if (!em_needs(e, n, 0)) return 0;
  int acc, dx = em_grad(e, n, 0, &acc);
  CALL(e, PH_IGRAD, K_SQRT_GRAD, n, A_BUF(em_out(e, n, 0)), A_BUF(em_dy(e, n, 0)), A_BUF(dx), A_INT(out_numel(e, n)), A_INT(acc));
  return 0;
}

/* ---- Gelu (opset 20): approximate = "none" (erf) or "tanh" ---- */

static int gelu_tanh(const Node *n) { return !strcmp(attr_str(n, "approximate", "none"), "tanh"); }

static int gelu_fwd(Emit *e, const Node *n, int j) {
  (void)j;
  const char *ap = attr_str(n, "approximate", "none");
  if (strcmp(ap, "none") && strcmp(ap, "tanh"))
    return err_set("node '%s' (Gelu): approximate='%s' is not one of 'none', 'tanh'", n->name, ap);
  CALL(e, PH_FWD, K_GELU, n, A_BUF(em_in(e, n, 0)), A_BUF(em_out(e, n, 0)), A_INT(out_numel(e, n)), A_INT(gelu_tanh(n)));
  return 0;
}
static int gelu_bwd(Emit *e, const Node *n, int j) {
  (void)j;
  if (!em_needs(e, n, 0)) return 0;
  int acc, dx = em_grad(e, n, 0, &acc);
  CALL(e, PH_IGRAD, K_GELU_GRAD, n, A_BUF(em_in(e, n, 0)), A_BUF(em_dy(e, n, 0)), A_BUF(dx), A_INT(out_numel(e, n)),
       A_INT(gelu_tanh(n)), A_INT(acc));
  return 0;
}

/* ---- LeakyRelu: y = x > 0 ? x : alpha x ---- */

static int leaky_fwd(Emit *e, const Node *n, int j) {
  (void)j;
  CALL(e, PH_FWD, K_LEAKYRELU, n, A_BUF(em_in(e, n, 0)), A_BUF(em_out(e, n, 0)), A_INT(out_numel(e, n)),
       A_FLT(attr_float(n, "alpha", 0.01f)));
  return 0;
}
static int leaky_bwd(Emit *e, const Node *n, int j) {
  (void)j;
  if (!em_needs(e, n, 0)) return 0;
  int acc, dx = em_grad(e, n, 0, &acc);
  CALL(e, PH_IGRAD, K_LEAKYRELU_GRAD, n, A_BUF(em_in(e, n, 0)), A_BUF(em_dy(e, n, 0)), A_BUF(dx), A_INT(out_numel(e, n)),
       A_FLT(attr_float(n, "alpha", 0.01f)), A_INT(acc));
  return 0;
}

/* ---- Add, Sub, Mul, Div, Pow with numpy broadcasting ---- */

static const char *bin_code(const Node *n) {
  static const char *names[] = {"Add", "Sub", "Mul", "Div", "Pow"}, *codes[] = {"BIN_ADD", "BIN_SUB", "BIN_MUL", "BIN_DIV", "BIN_POW"};
  for (int i = 0; i < 5; i++)
    if (!strcmp(n->def->name, names[i])) return codes[i];
  return "BIN_POW";
}

static int binary_fwd(Emit *e, const Node *n, int j) {
  Tensor *A = em_t(e, n->in[0]), *B = em_t(e, n->in[1]), *Y = em_t(e, n->out[0]);
  if (A->dtype != DT_FLOAT || B->dtype != DT_FLOAT)
    return err_set("node '%s' (%s): only float32 arithmetic runs at training time", n->name, n->op);
  int64_t sa[MAX_RANK], sb[MAX_RANK];
  rule_bcast_strides(Y, A, sa), rule_bcast_strides(Y, B, sb);
  int bs = SHAPE(e, "BcastShape", em_name(e, "BIN_%d", j), A_INT(Y->rank), A_INTS(Y->dims, Y->rank), A_INTS(sa, Y->rank),
                 A_INTS(sb, Y->rank), A_INT(ir_numel(A)), A_INT(ir_numel(B)), A_INT(ir_numel(Y)));
  int a = em_in(e, n, 0), b = em_in(e, n, 1);
  CALL(e, PH_FWD, K_BINARY, n, A_SYM(bin_code(n)), A_BUF(a), A_BUF(b), A_BUF(em_out(e, n, 0)), A_CONST(bs));
  return 0;
}

static int binary_bwd(Emit *e, const Node *n, int j) {
  const char *code = bin_code(n);
  int lin = !strcmp(code, "BIN_ADD") || !strcmp(code, "BIN_SUB"), a = em_in(e, n, 0), b = em_in(e, n, 1), acc;
  int bs = em_shape_ref(e, em_name(e, "BIN_%d", j));
  /* Reverse input order, as the other rules: the second input's gradient first. */
  for (int which = 1; which >= 0; which--) {
    if (!em_needs(e, n, which)) continue;
    int d = em_grad(e, n, which, &acc);
    /* A bias added to an activation is a weight: its gradient is W work. */
    int ph = em_t(e, n->in[which])->is_param ? PH_WGRAD : PH_IGRAD;
    CALL(e, ph, K_BINARY_GRAD, n, A_SYM(code), A_INT(which), A_BUF(lin ? -1 : a), A_BUF(lin ? -1 : b), A_BUF(em_dy(e, n, 0)), A_BUF(d),
         A_CONST(bs), A_INT(acc));
  }
  return 0;
}

/* ---- Where(cond, x, y) with broadcasting ---- */

static int where_fwd(Emit *e, const Node *n, int j) {
  Tensor *C = em_t(e, n->in[0]), *X = em_t(e, n->in[1]), *Yv = em_t(e, n->in[2]), *O = em_t(e, n->out[0]);
  if (X->dtype != DT_FLOAT) return err_set("node '%s' (Where): only float values run at training time", n->name);
  int64_t sc[MAX_RANK], sx[MAX_RANK], sy[MAX_RANK];
  rule_bcast_strides(O, C, sc), rule_bcast_strides(O, X, sx), rule_bcast_strides(O, Yv, sy);
  int ws = SHAPE(e, "WhereShape", em_name(e, "WHERE_%d", j), A_INT(O->rank), A_INTS(O->dims, O->rank), A_INTS(sc, O->rank),
                 A_INTS(sx, O->rank), A_INTS(sy, O->rank), A_INT(ir_numel(X)), A_INT(ir_numel(Yv)), A_INT(ir_numel(O)));
  CALL(e, PH_FWD, K_WHERE, n, A_BUF(em_in(e, n, 0)), A_BUF(em_in(e, n, 1)), A_BUF(em_in(e, n, 2)), A_BUF(em_out(e, n, 0)), A_CONST(ws));
  return 0;
}

static int where_bwd(Emit *e, const Node *n, int j) {
  int cb = em_in(e, n, 0), ws = em_shape_ref(e, em_name(e, "WHERE_%d", j)), acc;
  for (int which = 2; which >= 1; which--) {
    if (!em_needs(e, n, which)) continue;
    int d = em_grad(e, n, which, &acc);
    CALL(e, PH_IGRAD, K_WHERE_GRAD, n, A_BUF(cb), A_BUF(em_dy(e, n, 0)), A_BUF(d), A_INT(which), A_CONST(ws), A_INT(acc));
  }
  return 0;
}

static double flops_1(Graph *g, const Node *n) { return rule_numel(node_out(g, n, 0)); }
static double flops_8(Graph *g, const Node *n) { return 8 * rule_numel(node_out(g, n, 0)); }

#define ALU(name, stash, fold) {name, "elementwise", infer_Binary, fold, 3, stash, flops_1, 0, binary_fwd, binary_bwd, NULL}
const OpDef OPS_ELEMENTWISE[] = {
    {"Relu", "elementwise", infer_Unary, fold_Unary, 1, STASH_OUTPUT, flops_1, 0, act_fwd, act_bwd, NULL},
    {"Tanh", "elementwise", infer_Unary, fold_Unary, 1, STASH_OUTPUT, flops_8, 0, act_fwd, act_bwd, NULL},
    {"Sigmoid", "elementwise", infer_Unary, fold_Unary, 1, STASH_OUTPUT, flops_8, 0, act_fwd, act_bwd, NULL},
    {"LeakyRelu", "elementwise", infer_Unary, NULL, 1, STASH_INPUTS, flops_1, 0, leaky_fwd, leaky_bwd, NULL},
    {"Gelu", "elementwise", infer_Unary, NULL, 1, STASH_INPUTS, flops_8, 0, gelu_fwd, gelu_bwd, NULL},
    {"Erf", "elementwise", infer_Unary, fold_Unary, 1, STASH_INPUTS, flops_8, 0, erf_fwd, erf_bwd, NULL},
    {"Sqrt", "elementwise", infer_Unary, fold_Unary, 1, STASH_OUTPUT, flops_1, 0, sqrt_fwd, sqrt_bwd, NULL},
    ALU("Add", STASH_NONE, fold_Binary),
    ALU("Sub", STASH_NONE, fold_Binary),
    ALU("Mul", STASH_INPUTS, fold_Binary),
    ALU("Div", STASH_INPUTS, fold_Binary),
    ALU("Pow", STASH_INPUTS, fold_Binary),
    {"Where", "elementwise", infer_Where, fold_Where, 6, STASH_INPUTS, flops_1, 0, where_fwd, where_bwd, NULL},
    {0},
};
