/* ops.h - the operator table: what pipecc knows about each ONNX op.
 *
 * Each family of operators lives in one file of compiler/ops/ and exports
 * its rows: the shape rule, the compile-time evaluator for constant folding,
 * the cost, which inputs carry gradients, what backward reads, and the rules
 * that emit the forward and backward calls.  ops.c gathers the families; a
 * node keeps a pointer to its row (Node.def), so no pass dispatches on the
 * op's name: one place says everything about an op.  docs/adding-an-op.md is
 * the recipe for a new op. */
#ifndef PIPECC_OPS_H
#define PIPECC_OPS_H
#include "ir.h"

typedef int (*InferFn)(Graph *g, Node *n);
typedef int (*FoldFn)(Graph *g, Node *n);
typedef struct Emit Emit; /* a stage program being built (build.h) */
typedef int (*RuleFn)(Emit *e, const Node *n, int j); /* j: the node's graph index */
typedef double (*FlopsFn)(Graph *g, const Node *n);

/* What backward reads from the forward pass, in terms of tensors: the values
 * a stage must keep (stash) for each micro-batch in flight. */
enum { STASH_NONE = 0, STASH_INPUTS = 1, STASH_OUTPUT = 2, STASH_BOTH = 3 };

/* OpDef.flags */
enum {
  OPF_FOLD_FROM_SHAPE = 1, /* fold needs only the input's (static) shape, never its values (Shape, Size) */
  OPF_FIRST_OUTPUT_OPTIONAL = 2, /* output 0 may be omitted when another output is there (LSTM's Y) */
  OPF_READS_PART = 4,            /* reads a part of its input (Slice): several such readers of one weight are not a merge */
};

typedef struct OpDef {
  const char *name;
  const char *family;   /* the compiler/ops/ file it lives in */
  InferFn infer;
  FoldFn fold;          /* NULL: never evaluated at compile time */
  unsigned diff_inputs; /* bit k set: input k carries a gradient */
  int stash;            /* STASH_*: must cover every forward value bwd reads (checked by tests) */
  FlopsFn flops;        /* forward FLOPs per micro-batch; NULL: data movement only */
  int weighted;         /* backward costs twice the forward (input and weight gradients) */
  RuleFn fwd;           /* NULL: the op runs only at compile time (folded) */
  RuleFn bwd;           /* NULL with fwd set: forward only (no gradient flows through it) */
  int64_t (*workspace)(Graph *g, const Node *n); /* bytes of scratch one call needs (im2col), or NULL */
  int code;             /* tells apart the ops that share one rule (EW_ADD, a pool's kind); family-defined */
  unsigned flags;       /* OPF_* */
  unsigned f32_inputs;  /* bit k set: input k is read at run time by a float32 kernel (the only float type the kernels
                         * have): a node that runs with another element type there is refused (ops.c), never read
                         * past its buffer or built into C that does not compile */
} OpDef;

/* Recounts each tensor's readers among the live nodes (Tensor.nuses); a parameter nothing reads is
 * no longer one.  After inference, and after fuse.c rewires nodes. */
void count_uses(Graph *g);
const OpDef *op_find(const char *name);
/* Comma-separated list of ops pipecc can run, for error messages. */
const char *op_supported_list(void);
/* The whole table, in family order, for --list-ops and the docs. */
int op_count(void);
const OpDef *op_at(int i);
/* Prints the table: op, family, trainable / forward only / compile-time only. */
void op_list_print(void);

/* Shape inference for every live node, folding constants as it goes; sets
 * Node.def.  Returns -1 with err_set() naming the node on failure. */
int infer_and_fold(Graph *g);
#endif
