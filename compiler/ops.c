/* ops.c - the operator table and the pass that infers shapes and folds
 * constants over the whole graph. */
#include "ops.h"

#include <stdio.h>
#include <string.h>


/* Compile-time values bigger than this stay run-time work (or, for fold-only
 * ops, are an error) rather than exhausting the compiler's memory. */
#define MAX_FOLD_BYTES ((int64_t)256 << 20)

/* The families, one file each in compiler/ops/; each table ends with an empty row. */
extern const OpDef OPS_GEMM[], OPS_CONV[], OPS_POOL[], OPS_NORM[], OPS_ELEMENTWISE[], OPS_REDUCE[], OPS_MOVEMENT[],
    OPS_RNN[], OPS_COMPILE_TIME[];
static const OpDef *const FAMILIES[] = {OPS_GEMM, OPS_CONV, OPS_POOL, OPS_NORM, OPS_ELEMENTWISE, OPS_REDUCE, OPS_MOVEMENT,
                                        OPS_RNN, OPS_COMPILE_TIME};
#define NFAMILIES (int)(sizeof FAMILIES / sizeof FAMILIES[0])

int op_count(void) {
  int n = 0;
  for (int f = 0; f < NFAMILIES; f++)
    for (const OpDef *d = FAMILIES[f]; d->name; d++) n++;
  return n;
}

const OpDef *op_at(int i) {
  for (int f = 0; f < NFAMILIES; f++)
    for (const OpDef *d = FAMILIES[f]; d->name; d++)
      if (i-- == 0) return d;
  return NULL;
}

const OpDef *op_find(const char *name) {
  for (int f = 0; f < NFAMILIES; f++)
    for (const OpDef *d = FAMILIES[f]; d->name; d++)
      if (!strcmp(d->name, name)) return d;
  return NULL;
}

const char *op_supported_list(void) {
  static char list[2048];
  if (!list[0]) {
    size_t len = 0;
    for (int i = 0; i < op_count(); i++)
      if (op_at(i)->fwd) len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", len ? ", " : "", op_at(i)->name);
  }
  return list;
}

static const char *op_kind(const OpDef *d) {
  return d->fwd && d->bwd ? "trainable" : d->fwd ? "forward only" : "compile-time only";
}

void op_list_print(void) {
  printf("%-20s %-13s %-18s %s\n", "op", "family", "runs", "folds at compile time");
  for (int i = 0; i < op_count(); i++) {
    const OpDef *d = op_at(i);
    printf("%-20s %-13s %-18s %s\n", d->name, d->family, op_kind(d), d->fold ? "yes" : "no");
  }
}

/* A float initializer is trainable when a gradient can reach it: walk back
 * from the graph outputs through the inputs that carry gradients.  Masks and
 * statistics stop at Equal, Shape, BatchNorm's running stats and the like.
 * Two more are constants: an initializer --constant declares (a buffer:
 * PyTorch's register_buffer exports one as an initializer like any weight),
 * and one holding NaN or an infinity - a causal mask's -inf - which no weight
 * can hold: trained, its finite entries would move, and no checkpoint or
 * --save could write it.  Tensor.kept_const says which (the listing's why). */
static void mark_params(Graph *g) {
  char *grad = pool_alloc(&g->pool, (size_t)g->nt);
  for (int i = 0; i < g->noutputs; i++) grad[g->outputs[i]] = 1;
  for (int j = g->nn - 1; j >= 0; j--) {
    Node *n = &g->n[j];
    int live = 0;
    for (int k = 0; k < n->nout; k++) live |= n->out[k] >= 0 && grad[n->out[k]];
    const OpDef *d = n->def ? n->def : op_find(n->op);
    if (!live || !d) continue;
    for (int k = 0; k < n->nin; k++)
      if (n->in[k] >= 0 && (d->diff_inputs >> (k < 31 ? k : 31) & 1)) grad[n->in[k]] = 1;
  }
  for (int i = 0; i < g->nt; i++) {
    Tensor *t = &g->t[i];
    t->is_param = t->is_initializer && grad[i] && t->dtype == DT_FLOAT && ir_numel(t) > 1;
    if (t->is_param && !t->kept_const && const_first_nonfinite(t) >= 0) t->kept_const = KEPT_NONFINITE;
    if (t->kept_const) t->is_param = 0;
  }
}

static int foldable(Graph *g, const Node *n, const OpDef *d) {
  if (!d->fold) return 0;
  /* Shape and Size need only the (static) shape, never the values. */
  if (d->flags & OPF_FOLD_FROM_SHAPE) return 1;
  for (int k = 0; k < n->nout; k++)
    if (n->out[k] >= 0 && tensor_bytes(&g->t[n->out[k]]) > MAX_FOLD_BYTES) return 0;
  for (int k = 0; k < n->nin; k++) {
    const Tensor *t = node_in(g, n, k);
    /* Folding a transform of a weight would freeze the weight. */
    if (t && (!t->data || t->is_param)) return 0;
  }
  return 1;
}

void count_uses(Graph *g) {
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

/* The kernels compute in float32 only.  ONNX's type constraints let more through (MatMul on int64, float16 or
 * float64 anywhere), and an exporter may leave a weight in another type than the values it meets: read as float32,
 * a float16 weight is read past its buffer, a float64 one as garbage, and an int64 one builds into C that does not
 * compile.  So every input a kernel reads as float32 (the op's f32_inputs) must be float32 when the node runs. */
static int check_input_types(Graph *g, const Node *n) {
  for (int k = 0; k < n->nin && k < 32; k++) {
    const Tensor *t = node_in(g, n, k);
    if (!t || !(n->def->f32_inputs >> k & 1) || t->dtype == DT_FLOAT) continue;
    int weight = t->data && dtype_is_float(t->dtype);
    return err_set("node '%s' (%s): input %d ('%s' %s, %s) is %s, but pipecc runs %s on float32 only (its kernels have no "
                   "other element type)%s", n->name, n->op, k, t->name, shape_str(t),
                   t->is_initializer ? "an initializer" : t->data ? "a constant" : t->is_input ? "a graph input" : "computed at run time",
                   dtype_name(t->dtype), n->op,
                   weight ? "; store it as float32 to train it (read through a Cast to float32 it folds into a constant)" : "");
  }
  return 0;
}

int infer_and_fold(Graph *g) {
  mark_params(g);
  for (int j = 0; j < g->nn; j++) {
    Node *n = &g->n[j];
    const OpDef *d = n->def = op_find(n->op);
    if (!d)
      return err_set("node '%s' uses operator '%s', which pipecc does not support (supported: %s)", n->name, n->op,
                     op_supported_list());
    int any = 0; /* a recurrent op's Y may be omitted when only Y_h is read */
    for (int k = (d->flags & OPF_FIRST_OUTPUT_OPTIONAL) ? 0 : n->nout; k < n->nout; k++) any |= n->out[k] >= 0;
    if (n->nout < 1 || (n->out[0] < 0 && !any)) return err_set("node '%s' (%s) has no output", n->name, n->op);
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
    if (!n->folded && !n->def->fwd)
      return err_set("node '%s' (%s) depends on run-time data, but pipecc evaluates %s only at compile time "
                     "(supported at run time: %s)", n->name, n->op, n->op, op_supported_list());
    if (!n->folded && check_input_types(g, n)) return -1;
  }
  count_uses(g);
  return 0;
}
