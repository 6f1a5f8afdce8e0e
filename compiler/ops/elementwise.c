/* elementwise.c - activations, unary maths, broadcasting arithmetic and comparisons:
 * Relu, LeakyRelu, Tanh, Sigmoid, Gelu, Erf, Sqrt, Neg, Exp, Log, Abs, Reciprocal,
 * Clip, HardSigmoid, HardSwish, Add, Sub, Mul, Div, Pow, Max, Min, Where,
 * Equal, Less, Greater, Not. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "ops/elementwise.h"

#include "ops/rule.h"

/* The runtime's op codes (runtime/opcodes.def, one list for both sides): the enums, as the runtime has
 * them, and each code's symbol, which the stage programs pass to k_unary, k_binary and k_compare. */
enum {
#define BIN_OP(name, value) name = value,
#define UN_OP(name, value) name = value,
#define CMP_OP(name, value) name = value,
#include "../../runtime/opcodes.def"
};
static const char *const BIN_NAMES[] = {
#define BIN_OP(name, value) [value] = #name,
#include "../../runtime/opcodes.def"
};
static const char *const UN_NAMES[] = {
#define UN_OP(name, value) [value] = #name,
#include "../../runtime/opcodes.def"
};
static const char *const CMP_NAMES[] = {
#define CMP_OP(name, value) [value] = #name,
#include "../../runtime/opcodes.def"
};

static int64_t out_numel(Emit *e, const Node *n) { return ir_numel(em_t(e, n->out[0])); }
static int64_t binary_i(Node *n, int code, int64_t a, int64_t b, int *err);
static double binary_f(int code, double a, double b);

/* ---- activations whose gradient needs only their output y ---- */

static int act_kernel(const Node *n, int grad) {
  switch (n->def->code) {
  case EW_RELU: return grad ? K_RELU_GRAD : K_RELU;
  case EW_TANH: return grad ? K_TANH_GRAD : K_TANH;
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

/* ---- Neg, Exp, Log, Abs, Reciprocal, Clip, HardSigmoid, HardSwish: k_unary ---- */

static const char *un_code(const Node *n) {
  switch (n->def->code) {
  case EW_NEG: return UN_NAMES[UN_NEG];
  case EW_EXP: return UN_NAMES[UN_EXP];
  case EW_LOG: return UN_NAMES[UN_LOG];
  case EW_ABS: return UN_NAMES[UN_ABS];
  case EW_RECIPROCAL: return UN_NAMES[UN_RECIPROCAL];
  case EW_CLIP: return UN_NAMES[UN_CLIP];
  case EW_HARDSIGMOID: return UN_NAMES[UN_HARDSIGMOID];
  default: return UN_NAMES[UN_HARDSWISH];
  }
}

/* Clip's bound k (1 = min, 2 = max): an attribute before opset 11 (default
 * the float range), an optional constant scalar input from 11 (default none). */
static int clip_bound(Emit *e, const Node *n, int k, float *v) {
  const char *name = k == 1 ? "min" : "max";
  float open = k == 1 ? -INFINITY : INFINITY;
  if (em_graph(e)->opset < 11) {
    *v = attr_float(n, name, k == 1 ? -FLT_MAX : FLT_MAX);
    return 0;
  }
  Tensor *t = k < n->nin && n->in[k] >= 0 ? em_t(e, n->in[k]) : NULL;
  *v = open;
  if (!t) return 0;
  if (!t->data || t->is_param || ir_numel(t) != 1)
    return err_set("node '%s' (Clip): %s (input '%s') must be a constant scalar at training time", n->name, name, t->name);
  *v = (float)const_f64(t, 0);
  return 0;
}

/* The kernel's two numbers: Clip's bounds, HardSigmoid's alpha and beta. */
static int un_params(Emit *e, const Node *n, float *a, float *b) {
  *a = *b = 0;
  if (n->def->code == EW_CLIP) return clip_bound(e, n, 1, a) || clip_bound(e, n, 2, b) ? -1 : 0;
  if (n->def->code == EW_HARDSIGMOID) *a = attr_float(n, "alpha", 0.2f), *b = attr_float(n, "beta", 0.5f);
  return 0;
}

static int un_fwd(Emit *e, const Node *n, int j) {
  (void)j;
  float a, b;
  if (em_t(e, n->in[0])->dtype != DT_FLOAT)
    return err_set("node '%s' (%s): only float32 runs at training time, not %s", n->name, n->op, dtype_name(em_t(e, n->in[0])->dtype));
  if (un_params(e, n, &a, &b)) return -1;
  CALL(e, PH_FWD, K_UNARY, n, A_SYM(un_code(n)), A_BUF(em_in(e, n, 0)), A_BUF(em_out(e, n, 0)), A_INT(out_numel(e, n)), A_FLT(a),
       A_FLT(b));
  return 0;
}

static int un_bwd(Emit *e, const Node *n, int j) {
  (void)j;
  if (!em_needs(e, n, 0)) return 0;
  float a, b;
  if (un_params(e, n, &a, &b)) return -1;
  /* Only what the row stashes is passed: Exp and Reciprocal read y, Neg nothing, the rest x. */
  int x = n->def->stash & STASH_INPUTS ? em_in(e, n, 0) : -1, y = n->def->stash & STASH_OUTPUT ? em_out(e, n, 0) : -1;
  int acc, dx = em_grad(e, n, 0, &acc);
  CALL(e, PH_IGRAD, K_UNARY_GRAD, n, A_SYM(un_code(n)), A_BUF(x), A_BUF(y), A_BUF(em_dy(e, n, 0)), A_BUF(dx), A_INT(out_numel(e, n)),
       A_FLT(a), A_FLT(b), A_INT(acc));
  return 0;
}

/* ---- Add, Sub, Mul, Div, Pow with numpy broadcasting ---- */

/* The runtime's name for the op (runtime/opcodes.def's BIN_OP). */
static const char *bin_code(const Node *n) {
  switch (n->def->code) {
  case EW_ADD: return BIN_NAMES[BIN_ADD];
  case EW_SUB: return BIN_NAMES[BIN_SUB];
  case EW_MUL: return BIN_NAMES[BIN_MUL];
  case EW_DIV: return BIN_NAMES[BIN_DIV];
  case EW_MAX: return BIN_NAMES[BIN_MAX];
  case EW_MIN: return BIN_NAMES[BIN_MIN];
  default: return BIN_NAMES[BIN_POW];
  }
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

/* Whether the gradient of input `which` reads input k (k_binary_grad's
 * formulas).  A sum or difference reads neither; a product's gradient for
 * one side reads the other alone, and a quotient's for its numerator the
 * denominator alone.  What a gradient does not read is not stashed: the
 * attention scores before their scale (q k^T, times a constant) would
 * otherwise stay alive from the forward to the backward for nothing. */
static int bin_grad_reads(int code, int which, int k) {
  switch (code) {
  case EW_ADD:
  case EW_SUB: return 0;
  case EW_MUL: return k != which;
  case EW_DIV: return which == 1 || k == 1;
  default: return 1; /* Max, Min, Pow: both */
  }
}

static int binary_bwd(Emit *e, const Node *n, int j) {
  const char *code = bin_code(n);
  int a = em_in(e, n, 0), b = em_in(e, n, 1), acc, op = n->def->code;
  int bs = em_shape_ref(e, em_name(e, "BIN_%d", j));
  /* Reverse input order, as the other rules: the second input's gradient first. */
  for (int which = 1; which >= 0; which--) {
    if (!em_needs(e, n, which)) continue;
    int d = em_grad(e, n, which, &acc);
    /* A bias added to an activation is a weight: its gradient is W work. */
    int ph = em_t(e, n->in[which])->is_param ? PH_WGRAD : PH_IGRAD;
    CALL(e, ph, K_BINARY_GRAD, n, A_SYM(code), A_INT(which), A_BUF(bin_grad_reads(op, which, 0) ? a : -1),
         A_BUF(bin_grad_reads(op, which, 1) ? b : -1), A_BUF(em_dy(e, n, 0)), A_BUF(d), A_CONST(bs), A_INT(acc));
  }
  return 0;
}

/* ---- Max, Min: variadic in ONNX; one input is a copy, two the broadcasting
 * k_binary (ties split the gradient as torch.maximum does) ---- */

static int maxmin_infer(Graph *g, Node *n) {
  if (n->nin < 1) return node_err(n, "needs at least one input");
  for (int k = 0; k < n->nin; k++) {
    Tensor *x = need_in(g, n, k);
    if (!x) return -1;
    if (x->dtype != node_in(g, n, 0)->dtype)
      return node_err(n, "input types differ (%s and %s)", dtype_name(node_in(g, n, 0)->dtype), dtype_name(x->dtype));
  }
  return broadcast_outputs(g, n, 0, n->nin, node_in(g, n, 0)->dtype);
}

/* All inputs folded in order, pairwise, as chained Max(Max(a, b), c). */
static int maxmin_fold(Graph *g, Node *n) {
  Tensor *o = node_out(g, n, 0);
  fold_alloc(g, o);
  int64_t st[MAX_RANK], m = ir_numel(o);
  int intpath = !dtype_is_float(o->dtype), code = n->def->code, err = 0;
  for (int k = 0; k < n->nin; k++) {
    Tensor *x = node_in(g, n, k);
    bcast_strides(x, o->rank, st);
    for (int64_t i = 0; i < m; i++) {
      int64_t at = bcast_offset(i, o, st);
      if (intpath) const_set_i64(o, i, k ? binary_i(n, code, const_i64(o, i), const_i64(x, at), &err) : const_i64(x, at));
      else const_set_f64(o, i, k ? binary_f(code, const_f64(o, i), const_f64(x, at)) : const_f64(x, at));
    }
  }
  return err;
}

/* Three inputs or more: y = max(x0, x1), then y = max(y, xk) for each next
 * input, one call each, every call broadcast to y's shape (BIN_<j>_<k>). */
static int maxmin_chain(Emit *e, const Node *n, int j) {
  Tensor *Y = em_t(e, n->out[0]);
  int y = em_out(e, n, 0);
  for (int k = 1; k < n->nin; k++) {
    Tensor *A = k == 1 ? em_t(e, n->in[0]) : Y, *B = em_t(e, n->in[k]);
    int64_t sa[MAX_RANK], sb[MAX_RANK];
    rule_bcast_strides(Y, A, sa), rule_bcast_strides(Y, B, sb);
    char fmt[32];
    snprintf(fmt, sizeof fmt, "BIN_%%d_%d", k);
    int bs = SHAPE(e, "BcastShape", em_name(e, fmt, j), A_INT(Y->rank), A_INTS(Y->dims, Y->rank), A_INTS(sa, Y->rank), A_INTS(sb, Y->rank),
                   A_INT(ir_numel(A)), A_INT(ir_numel(B)), A_INT(ir_numel(Y)));
    CALL(e, PH_FWD, K_BINARY, n, A_SYM(bin_code(n)), A_BUF(k == 1 ? em_in(e, n, 0) : y), A_BUF(em_in(e, n, k)), A_BUF(y), A_CONST(bs));
  }
  return 0;
}

static int chain_shape(Emit *e, int j, int k) {
  char fmt[32];
  snprintf(fmt, sizeof fmt, "BIN_%%d_%d", k);
  return em_shape_ref(e, em_name(e, fmt, j));
}

/* The gradient of that chain, as autograd through nested torch.maximum calls
 * gives it: the partial results m_k = max(m_(k-1), x_k) (the forward wrote
 * over them) are recomputed into workspaces, then the output's gradient walks
 * back through each pair: x_k takes its share, m_(k-1) the rest, split at
 * ties as with two inputs.  Every call is input-gradient work, so the
 * workspaces live within the one action. */
static int maxmin_chain_bwd(Emit *e, const Node *n, int j) {
  int N = n->nin, acc, *part = calloc((size_t)N, sizeof *part);
  if (!part) return err_set("out of memory");
  int64_t bytes = 4 * out_numel(e, n);
  const char *op = bin_code(n);
  part[0] = em_in(e, n, 0);
  for (int k = 1; k < N - 1; k++) {
    part[k] = em_work(e, em_name(e, "mx%d_", k), n->out[0], bytes);
    CALL(e, PH_IGRAD, K_BINARY, n, A_SYM(op), A_BUF(part[k - 1]), A_BUF(em_in(e, n, k)), A_BUF(part[k]), A_CONST(chain_shape(e, j, k)));
  }
  int g = em_dy(e, n, 0), gbuf[2] = {-1, -1}; /* the walk's dy, alternating between two workspaces */
  for (int k = N - 1; k >= 1; k--) {
    int bs = chain_shape(e, j, k), below = 0;
    if (em_needs(e, n, k)) {
      int d = em_grad(e, n, k, &acc);
      CALL(e, PH_IGRAD, K_BINARY_GRAD, n, A_SYM(op), A_INT(1), A_BUF(part[k - 1]), A_BUF(em_in(e, n, k)), A_BUF(g), A_BUF(d), A_CONST(bs),
           A_INT(acc));
    }
    for (int q = 0; q < k; q++) below |= em_needs(e, n, q);
    if (!below) break;
    /* m_(k-1)'s share: x0's gradient itself at k = 1, else the next dy of the walk */
    if (k > 1 && gbuf[k % 2] < 0) gbuf[k % 2] = em_work(e, em_name(e, "mxg%d_", k % 2), n->out[0], bytes);
    int d = k == 1 ? em_grad(e, n, 0, &acc) : gbuf[k % 2];
    if (k > 1) acc = 0;
    CALL(e, PH_IGRAD, K_BINARY_GRAD, n, A_SYM(op), A_INT(0), A_BUF(part[k - 1]), A_BUF(em_in(e, n, k)), A_BUF(g), A_BUF(d), A_CONST(bs),
         A_INT(acc));
    g = d;
  }
  free(part);
  return 0;
}

static int maxmin_fwd(Emit *e, const Node *n, int j) {
  for (int k = 0; k < n->nin; k++)
    if (em_t(e, n->in[k])->dtype != DT_FLOAT) return err_set("node '%s' (%s): only float32 runs at training time", n->name, n->op);
  if (n->nin == 2) return binary_fwd(e, n, j);
  if (n->nin > 2) return maxmin_chain(e, n, j);
  CALL(e, PH_FWD, K_COPY, n, A_BUF(em_in(e, n, 0)), A_BUF(em_out(e, n, 0)), A_INT(out_numel(e, n)));
  return 0;
}

static int maxmin_bwd(Emit *e, const Node *n, int j) {
  if (n->nin == 2) return binary_bwd(e, n, j);
  if (n->nin > 2) return maxmin_chain_bwd(e, n, j);
  if (!em_needs(e, n, 0)) return 0;
  int acc, dx = em_grad(e, n, 0, &acc);
  CALL(e, PH_IGRAD, K_COPY_GRAD, n, A_BUF(em_dy(e, n, 0)), A_BUF(dx), A_INT(out_numel(e, n)), A_INT(acc));
  return 0;
}

/* ---- Equal, Less, Greater on float inputs, and Not: bool results, no gradient ---- */

static int compare_fwd(Emit *e, const Node *n, int j) {
  Tensor *A = em_t(e, n->in[0]), *B = em_t(e, n->in[1]), *Y = em_t(e, n->out[0]);
  if (A->dtype != DT_FLOAT || B->dtype != DT_FLOAT)
    return err_set("node '%s' (%s): only float32 inputs are compared at training time, not %s and %s", n->name, n->op,
                   dtype_name(A->dtype), dtype_name(B->dtype));
  int64_t sa[MAX_RANK], sb[MAX_RANK];
  rule_bcast_strides(Y, A, sa), rule_bcast_strides(Y, B, sb);
  int bs = SHAPE(e, "BcastShape", em_name(e, "CMP_%d", j), A_INT(Y->rank), A_INTS(Y->dims, Y->rank), A_INTS(sa, Y->rank),
                 A_INTS(sb, Y->rank), A_INT(ir_numel(A)), A_INT(ir_numel(B)), A_INT(ir_numel(Y)));
  const char *op = CMP_NAMES[n->def->code == EW_EQUAL ? CMP_EQUAL : n->def->code == EW_LESS ? CMP_LESS : CMP_GREATER];
  CALL(e, PH_FWD, K_COMPARE, n, A_SYM(op), A_BUF(em_in(e, n, 0)), A_BUF(em_in(e, n, 1)), A_BUF(em_out(e, n, 0)), A_CONST(bs));
  return 0;
}

static int not_infer(Graph *g, Node *n) {
  if (infer_same(g, n)) return -1;
  if (node_in(g, n, 0)->dtype != DT_BOOL) return node_err(n, "input must be bool");
  return 0;
}

static int not_fwd(Emit *e, const Node *n, int j) {
  (void)j;
  CALL(e, PH_FWD, K_NOT, n, A_BUF(em_in(e, n, 0)), A_BUF(em_out(e, n, 0)), A_INT(out_numel(e, n)));
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

/* ---- shape and fold rules: one of each for all elementwise ops, the scalar
 * function picked by OpDef.code ---- */

int ew_infer_binary(Graph *g, Node *n) {
  Tensor *a = need_in(g, n, 0), *b = need_in(g, n, 1);
  if (!a || !b) return -1;
  if (a->dtype != b->dtype)
    return node_err(n, "input types differ (%s and %s)", dtype_name(a->dtype), dtype_name(b->dtype));
  return broadcast_outputs(g, n, 0, 2, a->dtype);
}

/* Pow alone may raise one element type to another (float ** int). */
static int pow_infer(Graph *g, Node *n) {
  Tensor *a = need_in(g, n, 0), *b = need_in(g, n, 1);
  if (!a || !b) return -1;
  return broadcast_outputs(g, n, 0, 2, a->dtype);
}

int ew_infer_compare(Graph *g, Node *n) {
  Tensor *a = need_in(g, n, 0), *b = need_in(g, n, 1);
  if (!a || !b) return -1;
  return broadcast_outputs(g, n, 0, 2, DT_BOOL);
}

static double unary_f(int code, double x) {
  switch (code) {
  case EW_SQRT: return sqrt(x);
  case EW_NEG: return -x;
  case EW_RELU: return x > 0 ? x : 0;
  case EW_EXP: return exp(x);
  case EW_LOG: return log(x);
  case EW_ABS: return fabs(x);
  case EW_ERF: return erf(x);
  case EW_TANH: return tanh(x);
  case EW_SIGMOID: return 1 / (1 + exp(-x));
  case EW_RECIPROCAL: return 1 / x;
  case EW_NOT: return x == 0;
  case EW_FLOOR: return floor(x);
  case EW_CEIL: return ceil(x);
  default: return x;
  }
}

/* Integers stay exact in int64; the ops without an integer form leave them as they are. */
static int64_t unary_i(int code, int64_t v) {
  switch (code) {
  case EW_NEG: return -v;
  case EW_ABS: return v < 0 ? -v : v;
  case EW_NOT: return !v;
  case EW_RELU: return v > 0 ? v : 0;
  default: return v;
  }
}

int ew_fold_unary(Graph *g, Node *n) {
  Tensor *x = node_in(g, n, 0), *o = node_out(g, n, 0);
  int code = n->def->code;
  fold_alloc(g, o);
  int64_t m = ir_numel(o);
  /* Sqrt of an integer goes through double: it has no exact integer form. */
  int intpath = !dtype_is_float(x->dtype) && !dtype_is_float(o->dtype) && code != EW_SQRT;
  for (int64_t i = 0; i < m; i++)
    if (intpath) const_set_i64(o, i, unary_i(code, const_i64(x, i)));
    else const_set_f64(o, i, unary_f(code, const_f64(x, i)));
  return 0;
}

/* Wrapping (unsigned) arithmetic: overflow in a model's constants is not UB in the compiler. */
static int64_t binary_i(Node *n, int code, int64_t a, int64_t b, int *err) {
  switch (code) {
  case EW_ADD: return (int64_t)((uint64_t)a + (uint64_t)b);
  case EW_SUB: return (int64_t)((uint64_t)a - (uint64_t)b);
  case EW_MUL: return (int64_t)((uint64_t)a * (uint64_t)b);
  case EW_DIV:
  case EW_MOD:
    if (b == 0 || (a == INT64_MIN && b == -1)) {
      *err = node_err(n, "integer division by zero at compile time");
      return 0;
    }
    return code == EW_DIV ? a / b : a % b;
  case EW_POW: {
    int64_t r = 1;
    for (int64_t k = 0; k < b && k < 64; k++) r *= a;
    return r;
  }
  case EW_EQUAL: return a == b;
  case EW_LESS: return a < b;
  case EW_GREATER: return a > b;
  case EW_LESS_EQUAL: return a <= b;
  case EW_GREATER_EQUAL: return a >= b;
  case EW_AND: return a && b;
  case EW_OR: return a || b;
  case EW_MAX: return a > b ? a : b;
  case EW_MIN: return a < b ? a : b;
  default: return 0;
  }
}

static double binary_f(int code, double a, double b) {
  switch (code) {
  case EW_ADD: return a + b;
  case EW_SUB: return a - b;
  case EW_MUL: return a * b;
  case EW_DIV: return a / b;
  case EW_POW: return pow(a, b);
  case EW_EQUAL: return a == b;
  case EW_LESS: return a < b;
  case EW_GREATER: return a > b;
  case EW_LESS_EQUAL: return a <= b;
  case EW_GREATER_EQUAL: return a >= b;
  case EW_AND: return a && b;
  case EW_OR: return a || b;
  case EW_MAX: return a > b || a != a ? a : b; /* a NaN wins, as in k_binary and torch.maximum */
  case EW_MIN: return a < b || a != a ? a : b;
  case EW_MOD: return fmod(a, b);
  default: return 0;
  }
}

int ew_fold_binary(Graph *g, Node *n) {
  Tensor *a = node_in(g, n, 0), *b = node_in(g, n, 1), *o = node_out(g, n, 0);
  fold_alloc(g, o);
  int64_t sa[MAX_RANK], sb[MAX_RANK], m = ir_numel(o);
  bcast_strides(a, o->rank, sa);
  bcast_strides(b, o->rank, sb);
  int intpath = !dtype_is_float(a->dtype) && !dtype_is_float(b->dtype), err = 0, code = n->def->code;
  for (int64_t i = 0; i < m && !err; i++) {
    int64_t ia = bcast_offset(i, o, sa), ib = bcast_offset(i, o, sb);
    if (intpath) const_set_i64(o, i, binary_i(n, code, const_i64(a, ia), const_i64(b, ib), &err));
    else const_set_f64(o, i, binary_f(code, const_f64(a, ia), const_f64(b, ib)));
  }
  return err;
}

static int where_infer(Graph *g, Node *n) {
  Tensor *c = need_in(g, n, 0), *x = need_in(g, n, 1), *y = need_in(g, n, 2);
  if (!c || !x || !y) return -1;
  if (c->dtype != DT_BOOL) return node_err(n, "condition must be bool, not %s", dtype_name(c->dtype));
  if (x->dtype != y->dtype) return node_err(n, "X and Y types differ");
  return broadcast_outputs(g, n, 0, 3, x->dtype);
}

static int where_fold(Graph *g, Node *n) {
  Tensor *c = node_in(g, n, 0), *x = node_in(g, n, 1), *y = node_in(g, n, 2), *o = node_out(g, n, 0);
  fold_alloc(g, o);
  int64_t sc[MAX_RANK], sx[MAX_RANK], sy[MAX_RANK], m = ir_numel(o), esz = dtype_size(o->dtype);
  bcast_strides(c, o->rank, sc);
  bcast_strides(x, o->rank, sx);
  bcast_strides(y, o->rank, sy);
  for (int64_t i = 0; i < m; i++) {
    int pick = const_i64(c, bcast_offset(i, o, sc)) != 0;
    const Tensor *src = pick ? x : y;
    int64_t off = bcast_offset(i, o, pick ? sx : sy);
    memcpy((char *)o->data + i * esz, (const char *)src->data + off * esz, (size_t)esz);
  }
  return 0;
}

static double flops_1(Graph *g, const Node *n) { return rule_numel(node_out(g, n, 0)); }
static double flops_8(Graph *g, const Node *n) { return 8 * rule_numel(node_out(g, n, 0)); }

#define ALU(name, stash, code, infer) \
  {name, "elementwise", infer, ew_fold_binary, 3, stash, flops_1, 0, binary_fwd, binary_bwd, NULL, code, 0, 3}
const OpDef OPS_ELEMENTWISE[] = {
    {"Relu", "elementwise", infer_same, ew_fold_unary, 1, STASH_OUTPUT, flops_1, 0, act_fwd, act_bwd, NULL, EW_RELU, 0, 1},
    {"Tanh", "elementwise", infer_same, ew_fold_unary, 1, STASH_OUTPUT, flops_8, 0, act_fwd, act_bwd, NULL, EW_TANH, 0, 1},
    {"Sigmoid", "elementwise", infer_same, ew_fold_unary, 1, STASH_OUTPUT, flops_8, 0, act_fwd, act_bwd, NULL, EW_SIGMOID, 0, 1},
    {"LeakyRelu", "elementwise", infer_same, NULL, 1, STASH_INPUTS, flops_1, 0, leaky_fwd, leaky_bwd, NULL, 0, 0, 1},
    {"Gelu", "elementwise", infer_same, NULL, 1, STASH_INPUTS, flops_8, 0, gelu_fwd, gelu_bwd, NULL, 0, 0, 1},
    {"Erf", "elementwise", infer_same, ew_fold_unary, 1, STASH_INPUTS, flops_8, 0, erf_fwd, erf_bwd, NULL, EW_ERF, 0, 1},
    {"Sqrt", "elementwise", infer_same, ew_fold_unary, 1, STASH_OUTPUT, flops_1, 0, sqrt_fwd, sqrt_bwd, NULL, EW_SQRT, 0, 1},
    ALU("Add", STASH_NONE, EW_ADD, ew_infer_binary),
    ALU("Sub", STASH_NONE, EW_SUB, ew_infer_binary),
    ALU("Mul", STASH_INPUTS, EW_MUL, ew_infer_binary),
    ALU("Div", STASH_INPUTS, EW_DIV, ew_infer_binary),
    ALU("Pow", STASH_INPUTS, EW_POW, pow_infer),
    {"Neg", "elementwise", infer_same, ew_fold_unary, 1, STASH_NONE, flops_1, 0, un_fwd, un_bwd, NULL, EW_NEG, 0, 1},
    {"Exp", "elementwise", infer_same, ew_fold_unary, 1, STASH_OUTPUT, flops_8, 0, un_fwd, un_bwd, NULL, EW_EXP, 0, 1},
    {"Log", "elementwise", infer_same, ew_fold_unary, 1, STASH_INPUTS, flops_8, 0, un_fwd, un_bwd, NULL, EW_LOG, 0, 1},
    {"Abs", "elementwise", infer_same, ew_fold_unary, 1, STASH_INPUTS, flops_1, 0, un_fwd, un_bwd, NULL, EW_ABS, 0, 1},
    {"Reciprocal", "elementwise", infer_same, ew_fold_unary, 1, STASH_OUTPUT, flops_1, 0, un_fwd, un_bwd, NULL, EW_RECIPROCAL, 0, 1},
    {"Clip", "elementwise", infer_same, NULL, 1, STASH_INPUTS, flops_1, 0, un_fwd, un_bwd, NULL, EW_CLIP, 0, 1},
    {"HardSigmoid", "elementwise", infer_same, NULL, 1, STASH_INPUTS, flops_1, 0, un_fwd, un_bwd, NULL, EW_HARDSIGMOID, 0, 1},
    {"HardSwish", "elementwise", infer_same, NULL, 1, STASH_INPUTS, flops_1, 0, un_fwd, un_bwd, NULL, EW_HARDSWISH, 0, 1},
    {"Max", "elementwise", maxmin_infer, maxmin_fold, ~0u, STASH_INPUTS, flops_1, 0, maxmin_fwd, maxmin_bwd, NULL, EW_MAX, 0, ~0u},
    {"Min", "elementwise", maxmin_infer, maxmin_fold, ~0u, STASH_INPUTS, flops_1, 0, maxmin_fwd, maxmin_bwd, NULL, EW_MIN, 0, ~0u},
    {"Equal", "elementwise", ew_infer_compare, ew_fold_binary, 0, STASH_NONE, flops_1, 0, compare_fwd, NULL, NULL, EW_EQUAL, 0, 3},
    {"Less", "elementwise", ew_infer_compare, ew_fold_binary, 0, STASH_NONE, flops_1, 0, compare_fwd, NULL, NULL, EW_LESS, 0, 3},
    {"Greater", "elementwise", ew_infer_compare, ew_fold_binary, 0, STASH_NONE, flops_1, 0, compare_fwd, NULL, NULL, EW_GREATER, 0, 3},
    {"Not", "elementwise", not_infer, ew_fold_unary, 0, STASH_NONE, flops_1, 0, not_fwd, NULL, NULL, EW_NOT, 0, 0},
    {"Where", "elementwise", where_infer, where_fold, 6, STASH_INPUTS, flops_1, 0, where_fwd, where_bwd, NULL, 0, 0, 6},
    {0},
};
