/* ops.h - the operator table: what pipecc knows about each ONNX op.
 *
 * One row per op: its shape rule (shape.c), its compile-time evaluator for
 * constant folding (fold.c), its cost rule (cost.c), and which inputs carry
 * gradients.  An op absent from the table is rejected with the list below. */
#ifndef PIPECC_OPS_H
#define PIPECC_OPS_H
#include "ir.h"

typedef int (*InferFn)(Graph *g, Node *n);
typedef int (*FoldFn)(Graph *g, Node *n);

/* How much backward must keep from the forward pass, in terms of tensors. */
enum { STASH_NONE = 0, STASH_INPUTS = 1, STASH_OUTPUT = 2, STASH_BOTH = 3 };

typedef struct OpDef {
  const char *name;
  InferFn infer;
  FoldFn fold;          /* NULL: never evaluated at compile time */
  unsigned diff_inputs; /* bit k set: input k carries a gradient */
  int stash;            /* STASH_* */
  int runtime;          /* 1: pipecc can run it in a training program; 0: fold-only */
} OpDef;

const OpDef *op_find(const char *name);
/* Comma-separated list of ops pipecc can run, for error messages. */
const char *op_supported_list(void);

/* Shape inference for every live node, folding constants as it goes.
 * Returns -1 with err_set() naming the node on failure. */
int infer_and_fold(Graph *g);
#endif
