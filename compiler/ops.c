/* ops.c - the operator table and the pass that infers shapes and folds
 * constants over the whole graph. */
#include "ops.h"

#include <string.h>

#include "fold.h"
#include "shape.h"

#define ALL 0xffffffffu
/* Compile-time values bigger than this stay run-time work (or, for fold-only
 * ops, are an error) rather than exhausting the compiler's memory. */
#define MAX_FOLD_BYTES ((int64_t)256 << 20)
/* name, shape rule, evaluator, inputs with gradients, stash, runs in training */
static const OpDef OPS[] = {
    {"Conv", infer_Conv, NULL, 7, STASH_INPUTS, 1},
    {"BatchNormalization", infer_BatchNorm, NULL, 7, STASH_INPUTS, 1},
    {"MaxPool", infer_Pool, NULL, 1, STASH_INPUTS, 1},
    {"AveragePool", infer_Pool, NULL, 1, STASH_NONE, 1},
    {"GlobalAveragePool", infer_GlobalPool, NULL, 1, STASH_NONE, 1},
    {"Relu", infer_Unary, fold_Unary, 1, STASH_OUTPUT, 1},
    {"LeakyRelu", infer_Unary, NULL, 1, STASH_INPUTS, 0},
    {"Sigmoid", infer_Unary, fold_Unary, 1, STASH_OUTPUT, 1},
    {"Tanh", infer_Unary, fold_Unary, 1, STASH_OUTPUT, 1},
    {"Erf", infer_Unary, fold_Unary, 1, STASH_INPUTS, 1},
    {"Gelu", infer_Unary, NULL, 1, STASH_INPUTS, 0},
    {"Sqrt", infer_Unary, fold_Unary, 1, STASH_OUTPUT, 1},
    {"Add", infer_Binary, fold_Binary, 3, STASH_NONE, 1},
    {"Sub", infer_Binary, fold_Binary, 3, STASH_NONE, 1},
    {"Mul", infer_Binary, fold_Binary, 3, STASH_INPUTS, 1},
    {"Div", infer_Binary, fold_Binary, 3, STASH_INPUTS, 1},
    {"Pow", infer_Binary, fold_Binary, 3, STASH_INPUTS, 1},
    {"MatMul", infer_MatMul, NULL, 3, STASH_INPUTS, 1},
    {"Gemm", infer_Gemm, NULL, 7, STASH_INPUTS, 1},
    {"Transpose", infer_Transpose, fold_Transpose, 1, STASH_NONE, 1},
    {"Reshape", infer_Reshape, fold_Copy, 1, STASH_NONE, 1},
    {"Flatten", infer_Flatten, fold_Copy, 1, STASH_NONE, 1},
    {"Squeeze", infer_Squeeze, fold_Copy, 1, STASH_NONE, 1},
    {"Unsqueeze", infer_Unsqueeze, fold_Copy, 1, STASH_NONE, 1},
    {"Concat", infer_Concat, fold_Concat, ALL, STASH_NONE, 0},
    {"Split", infer_Split, fold_Split, 1, STASH_NONE, 1},
    {"Slice", infer_Slice, fold_Slice, 1, STASH_NONE, 0},
    {"Gather", infer_Gather, fold_Gather, 1, STASH_INPUTS, 1},
    {"Softmax", infer_Unary, NULL, 1, STASH_OUTPUT, 1},
    {"LogSoftmax", infer_Unary, NULL, 1, STASH_OUTPUT, 1},
    {"LayerNormalization", infer_LayerNorm, NULL, 7, STASH_INPUTS, 1},
    {"ReduceMean", infer_Reduce, fold_Reduce, 1, STASH_NONE, 1},
    {"ReduceSum", infer_Reduce, fold_Reduce, 1, STASH_NONE, 1},
    {"Where", infer_Where, fold_Where, 6, STASH_INPUTS, 1},
    {"Dropout", infer_Dropout, NULL, 1, STASH_OUTPUT, 0},
    {"Identity", infer_Unary, fold_Unary, 1, STASH_NONE, 1},
    {"Cast", infer_Cast, fold_Cast, 1, STASH_NONE, 0},
    {"Expand", infer_Expand, fold_Expand, 1, STASH_NONE, 0},
    {"Pad", infer_Pad, NULL, 1, STASH_NONE, 1},
    /* Shape arithmetic and masks: evaluated at compile time only.  (LeakyRelu, Gelu,
     * Concat, Slice, Cast, Expand and Dropout above have shape rules but no training
     * kernels yet: they run only when constant folding can evaluate them.) */
    {"Constant", infer_Constant, fold_Constant, 0, STASH_NONE, 0},
    {"ConstantOfShape", infer_ConstantOfShape, fold_ConstantOfShape, 0, STASH_NONE, 0},
    {"Shape", infer_Shape, fold_Shape, 0, STASH_NONE, 0},
    {"Size", infer_Size, fold_Size, 0, STASH_NONE, 0},
    {"Range", infer_Range, fold_Range, 0, STASH_NONE, 0},
    {"Equal", infer_Compare, fold_Binary, 0, STASH_NONE, 0},
    {"Less", infer_Compare, fold_Binary, 0, STASH_NONE, 0},
    {"Greater", infer_Compare, fold_Binary, 0, STASH_NONE, 0},
    {"LessOrEqual", infer_Compare, fold_Binary, 0, STASH_NONE, 0},
    {"GreaterOrEqual", infer_Compare, fold_Binary, 0, STASH_NONE, 0},
    {"And", infer_Compare, fold_Binary, 0, STASH_NONE, 0},
    {"Or", infer_Compare, fold_Binary, 0, STASH_NONE, 0},
    {"Not", infer_Unary, fold_Unary, 0, STASH_NONE, 0},
    {"Trilu", infer_Unary, fold_Trilu, 0, STASH_NONE, 0},
    {"Neg", infer_Unary, fold_Unary, 0, STASH_NONE, 0},
    {"Exp", infer_Unary, fold_Unary, 0, STASH_NONE, 0},
    {"Log", infer_Unary, fold_Unary, 0, STASH_NONE, 0},
    {"Abs", infer_Unary, fold_Unary, 0, STASH_NONE, 0},
    {"Reciprocal", infer_Unary, fold_Unary, 0, STASH_NONE, 0},
    {"Floor", infer_Unary, fold_Unary, 0, STASH_NONE, 0},
    {"Ceil", infer_Unary, fold_Unary, 0, STASH_NONE, 0},
    {"Max", infer_Binary, fold_Binary, 0, STASH_NONE, 0},
    {"Min", infer_Binary, fold_Binary, 0, STASH_NONE, 0},
    {"Mod", infer_Binary, fold_Binary, 0, STASH_NONE, 0},
};
#define NOPS (int)(sizeof OPS / sizeof OPS[0])

const OpDef *op_find(const char *name) {
  for (int i = 0; i < NOPS; i++)
    if (!strcmp(OPS[i].name, name)) return &OPS[i];
  return NULL;
}

const char *op_supported_list(void) {
  static char list[1024];
  if (!list[0]) {
    size_t len = 0;
    for (int i = 0; i < NOPS; i++)
      if (OPS[i].runtime) len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", len ? ", " : "", OPS[i].name);
  }
  return list;
}

/* A float initializer is trainable when a gradient can reach it: walk back
 * from the graph outputs through the inputs that carry gradients.  Masks and
 * statistics stop at Equal, Shape, BatchNorm's running stats and the like. */
static void mark_params(Graph *g) {
  char *grad = pool_alloc(&g->pool, (size_t)g->nt);
  for (int i = 0; i < g->noutputs; i++) grad[g->outputs[i]] = 1;
  for (int j = g->nn - 1; j >= 0; j--) {
    Node *n = &g->n[j];
    int live = 0;
    for (int k = 0; k < n->nout; k++) live |= n->out[k] >= 0 && grad[n->out[k]];
    const OpDef *d = op_find(n->op);
    if (!live || !d) continue;
    for (int k = 0; k < n->nin; k++)
      if (n->in[k] >= 0 && (d->diff_inputs >> (k < 31 ? k : 31) & 1)) grad[n->in[k]] = 1;
  }
  for (int i = 0; i < g->nt; i++) {
    Tensor *t = &g->t[i];
    t->is_param = t->is_initializer && grad[i] && t->dtype == DT_FLOAT && ir_numel(t) > 1;
  }
}

static int foldable(Graph *g, const Node *n, const OpDef *d) {
  if (!d->fold) return 0;
  /* Shape and Size need only the (static) shape, never the values. */
  if (!strcmp(n->op, "Shape") || !strcmp(n->op, "Size")) return 1;
  for (int k = 0; k < n->nout; k++)
    if (n->out[k] >= 0 && tensor_bytes(&g->t[n->out[k]]) > MAX_FOLD_BYTES) return 0;
  for (int k = 0; k < n->nin; k++) {
    const Tensor *t = node_in(g, n, k);
    /* Folding a transform of a weight would freeze the weight. */
    if (t && (!t->data || t->is_param)) return 0;
  }
  return 1;
}

static void count_uses(Graph *g) {
  for (int i = 0; i < g->nt; i++) g->t[i].nuses = 0;
  for (int j = 0; j < g->nn; j++)
    if (!g->n[j].folded)
      for (int k = 0; k < g->n[j].nin; k++)
        if (g->n[j].in[k] >= 0) g->t[g->n[j].in[k]].nuses++;
  for (int i = 0; i < g->nt; i++)
    if (g->t[i].is_param && !g->t[i].nuses) g->t[i].is_param = 0;
}

/* Shapes come from the file: keep every tensor addressable. */
#define MAX_TENSOR_ELEMS ((int64_t)1 << 38)
static int check_size(const Node *n, const Tensor *o) {
  int64_t numel = 1;
  for (int i = 0; i < o->rank; i++) {
    if (o->dims[i] < 0) return err_set("node '%s' (%s): output '%s' has a negative dimension", n->name, n->op, o->name);
    if (o->dims[i] && numel > MAX_TENSOR_ELEMS / o->dims[i])
      return err_set("node '%s' (%s): output '%s' %s is too large", n->name, n->op, o->name, shape_str(o));
    numel *= o->dims[i];
  }
  return 0;
}

int infer_and_fold(Graph *g) {
  mark_params(g);
  for (int j = 0; j < g->nn; j++) {
    Node *n = &g->n[j];
    const OpDef *d = op_find(n->op);
    if (!d)
      return err_set("node '%s' uses operator '%s', which pipecc does not support (supported: %s)", n->name, n->op,
                     op_supported_list());
    if (n->nout < 1 || n->out[0] < 0) return err_set("node '%s' (%s) has no output", n->name, n->op);
    if (d->infer(g, n)) return -1;
    for (int k = 0; k < n->nout; k++) {
      Tensor *o = node_out(g, n, k);
      if (o && (o->rank < 0 || !dtype_size(o->dtype)))
        return err_set("node '%s' (%s): the shape of output '%s' cannot be inferred", n->name, n->op, o->name);
      if (o && check_size(n, o)) return -1;
    }
    if (foldable(g, n, d)) {
      if (d->fold(g, n)) return -1;
      n->folded = 1;
    }
  }
  for (int j = 0; j < g->nn; j++) {
    Node *n = &g->n[j];
    if (!n->folded && !op_find(n->op)->runtime)
      return err_set("node '%s' (%s) depends on run-time data, but pipecc evaluates %s only at compile time "
                     "(supported at run time: %s)", n->name, n->op, n->op, op_supported_list());
  }
  count_uses(g);
  return 0;
}
