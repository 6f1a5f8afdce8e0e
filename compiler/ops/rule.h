/* rule.h - what an operator's rules may use while building a stage program.
 *
 * Each file in compiler/ops/ owns one family of operators: for each, its
 * entry in the operator table (ops.h) with its shape rule, fold rule, cost,
 * forward rule and backward rule.  A forward rule appends the calls that
 * compute a node; a backward rule the calls that compute the gradients of
 * its inputs, each marked PH_IGRAD (input gradient) or PH_WGRAD (weight
 * gradient).  Buffers are handed out by autodiff.c through the em_*
 * functions below; a rule never lays out memory or prints C. */
#ifndef PIPECC_OPS_RULE_H
#define PIPECC_OPS_RULE_H
#include <string.h>

#include "fold.h"
#include "ops.h"
#include "shape.h"
#include "stageprog.h"

Graph *em_graph(Emit *e);
Tensor *em_t(Emit *e, int tensor);
/* The buffer holding input k's value (a weight, an activation, or a constant
 * placed in the weights region); -1 if the input is absent. */
int em_in(Emit *e, const Node *n, int k);
/* The buffer output k is written to. */
int em_out(Emit *e, const Node *n, int k);
/* Output k exists and something reads it (or it is a graph output). */
int em_used(Emit *e, const Node *n, int k);
/* A workspace of `bytes` named after `tensor` (im2col columns), live within one action. */
int em_work(Emit *e, const char *prefix, int tensor, int64_t bytes);
/* Input k needs a gradient. */
int em_needs(Emit *e, const Node *n, int k);
/* The buffer input k's gradient goes to, and whether this call adds to it
 * (acc = 1) or is its first contribution (acc = 0). */
int em_grad(Emit *e, const Node *n, int k, int *acc);
/* The same for a kernel that always adds into it (a weight gradient summed
 * over micro-batches: Conv's dW, the norms' dscale): when input k is not a
 * weight but a value computed at run time, its gradient is zeroed first. */
int em_grad_add(Emit *e, const Node *n, int k);
/* The gradient of output k, or -1 when none reached it. */
int em_dy(Emit *e, const Node *n, int k);
/* Shape constants: define one (its name must be unique in the stage), or find one by name. */
int em_shape(Emit *e, const char *type, const char *name, const Arg *fields, int nfields);
int em_shape_ref(Emit *e, const char *name);
/* The schedule runs weight gradients apart (zb1's W): a kernel that computes
 * an input gradient and a weight gradient in one pass is then called twice,
 * once for each (NULL for the other), so the W half can wait for the bubble. */
int em_split_wgrad(Emit *e);
/* A training program (1), or an inference one (--forward-only, 0): ops whose
 * ONNX meaning depends on it (Dropout before opset 12) ask. */
int em_training(Emit *e);
void em_call(Emit *e, int phase, int kernel, const Node *n, const Arg *args, int nargs);
/* A variant (VAR_EVAL, VAR_RECOMPUTE) of the forward call just made, where the eval forward or a
 * recomputation runs the op otherwise; it may touch only buffers the call touches. */
void em_variant(Emit *e, int which, int kernel, const Arg *args, int nargs);
const char *em_name(Emit *e, const char *fmt, int j); /* "CONV_%d" -> pooled string */

#define NARGS(...) ((int)(sizeof((Arg[]){__VA_ARGS__}) / sizeof(Arg)))
/* CALL(e, PH_FWD, K_RELU, n, A_BUF(x), A_BUF(y), A_INT(count)) */
#define CALL(e, phase, kernel, n, ...) em_call(e, phase, kernel, n, (Arg[]){__VA_ARGS__}, NARGS(__VA_ARGS__))
#define VARIANT(e, which, kernel, ...) em_variant(e, which, kernel, (Arg[]){__VA_ARGS__}, NARGS(__VA_ARGS__))
#define SHAPE(e, type, name, ...) em_shape(e, type, name, (Arg[]){__VA_ARGS__}, NARGS(__VA_ARGS__))

/* [outer, inner] sizes of t around axis a. */
static inline void rule_around(const Tensor *t, int a, int64_t *outer, int64_t *inner) {
  *outer = *inner = 1;
  for (int i = 0; i < a; i++) *outer *= t->dims[i];
  for (int i = a + 1; i < t->rank; i++) *inner *= t->dims[i];
}

/* Strides of src along each axis of the broadcast output y (0 where src is broadcast). */
static inline void rule_bcast_strides(const Tensor *y, const Tensor *src, int64_t *st) {
  for (int i = 0; i < y->rank; i++) {
    int si = i - (y->rank - src->rank), z = si + 1;
    int64_t m = 1;
    if (si < 0) { /* an axis src lacks: broadcast */
      st[i] = 0;
      continue;
    }
    for (; z < src->rank; z++) m *= src->dims[z];
    st[i] = src->dims[si] == 1 ? 0 : m;
  }
}

static inline double rule_numel(const Tensor *t) { return t ? (double)ir_numel(t) : 0; }

/* OpDef.code of the elementwise ops.  One shape rule and one fold rule serve
 * all of them (elementwise.c); compile_time.c's arithmetic, comparisons and
 * logic use the same rules, so each scalar function is written once. */
enum {
  EW_NONE,
  /* unary */
  EW_SQRT, EW_NEG, EW_RELU, EW_EXP, EW_LOG, EW_ABS, EW_ERF, EW_TANH, EW_SIGMOID, EW_RECIPROCAL, EW_NOT, EW_FLOOR, EW_CEIL,
  EW_CLIP, EW_HARDSIGMOID, EW_HARDSWISH, /* run time only: their parameters are not the fold rule's */
  /* binary */
  EW_ADD, EW_SUB, EW_MUL, EW_DIV, EW_POW, EW_MOD, EW_MAX, EW_MIN,
  EW_EQUAL, EW_LESS, EW_GREATER, EW_LESS_EQUAL, EW_GREATER_EQUAL, EW_AND, EW_OR,
};
/* Inputs of one element type, broadcast (Add, Max...). */
int ew_infer_binary(Graph *g, Node *n);
/* Any two inputs, broadcast, a bool result (Equal, And...). */
int ew_infer_compare(Graph *g, Node *n);
/* y = f(x) per element, f chosen by n->def->code. */
int ew_fold_unary(Graph *g, Node *n);
/* y = f(a, b) per element with broadcasting, f chosen by n->def->code. */
int ew_fold_binary(Graph *g, Node *n);
#endif
