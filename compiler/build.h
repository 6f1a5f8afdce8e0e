/* build.h - the builder a stage program is made with (build.c): the
 * operators' rules (ops/) append their calls through the em_* functions,
 * autodiff.c (which runs the rules) through the build_* ones.  Below ops/:
 * it knows buffers and calls, never an operator. */
#ifndef PIPECC_BUILD_H
#define PIPECC_BUILD_H
#include "ops.h"
#include "stageprog.h"

/* One stage program being built (typedef'd as Emit in ops.h). */
struct Emit {
  Plan *p;
  StageProg *sp;
  Pool *pool;
  int s, a, e;        /* stage and its compute-node range */
  int *fbuf, *gbuf;   /* tensor -> forward / gradient buffer in this stage (-1) */
  int *gcount;        /* gradient contributions so far */
  const char *needs;  /* tensor needs a gradient */
  int named;          /* give buffers their C names (pricing a candidate stage needs only sizes) */
  struct Partial { int t, node, buf; } *part; /* a tied weight's partial gradient per reading node here */
  int npart, cappart;
};

/* ---- for autodiff.c ---- */

/* A new buffer named after `tensor` (prefix + its name, made a unique C identifier when e->named). */
int build_buf(Emit *e, const char *prefix, int tensor, int kind, int64_t bytes, int dtype);
/* Weight t is read by several compute nodes (a tied weight: one partial gradient per reader). */
int build_is_tied(Emit *e, int t);
/* The partial gradient of tied weight t that graph node `node` adds into. */
int build_partial(Emit *e, int t, int node);
/* Gradient buffer for input tensor t of graph node `node` (-1: none), and whether to add (*acc). */
int build_grad_target(Emit *e, int t, int *acc, int node);

/* ---- for the operators' rules (ops/rule.h) ---- */

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
#endif
