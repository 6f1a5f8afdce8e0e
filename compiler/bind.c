/* bind.c - the graph's inputs bound to the micro-batch size, and a check
 * that no run-time tensor is empty, before the plan is costed. */
#include "bind.h"

/* Gives every graph input its static shape: the batch axis becomes the
 * micro-batch size; any other symbolic axis is an error. */
int bind_inputs(Plan *p) {
  Graph *g = &p->g;
  int64_t declared = 0;
  for (int i = 0; i < g->ninputs; i++) {
    Tensor *t = &g->t[g->inputs[i]];
    if (t->declared_rank < 0) return err_set("%s: graph input '%s' has no declared shape", g->path, t->name);
    if (t->declared_rank >= 1 && t->declared_dims[0] > 0) declared = t->declared_dims[0];
  }
  int64_t batch = p->opt.batch > 0 ? p->opt.batch : declared > 0 ? declared : 32;
  /* --replicas R: each copy of the pipeline trains batch / R of the (global) batch, in M micro-batches. */
  int R = p->opt.replicas > 1 ? p->opt.replicas : 1;
  if (batch % R)
    return err_set("--batch %lld is not divisible by --replicas %d (each replica trains an equal share of the batch)", (long long)batch, R);
  int64_t share = batch / R;
  int m = p->opt.microbatches;
  if (m <= 0) {
    /* Default: one micro-batch per stage twice over, as a divisor of the batch (a replica's share). */
    m = 1;
    if (p->opt.nstages > 1)
      for (m = 2 * p->opt.nstages; m < share && share % m; m++) {
      }
    if (m > share) m = (int)share;
  }
  if (share % m) {
    if (R > 1)
      return err_set("--batch %lld over --replicas %d is %lld samples per replica, not divisible by --microbatches %d", (long long)batch, R,
                     (long long)share, m);
    return err_set("--batch %lld is not divisible by --microbatches %d", (long long)batch, m);
  }
  p->batch = batch;
  p->opt.microbatches = m;
  p->mb_size = share / m;
  for (int i = 0; i < g->ninputs; i++) {
    Tensor *t = &g->t[g->inputs[i]];
    t->rank = t->declared_rank;
    for (int d = 0; d < t->rank; d++) {
      t->dims[d] = t->declared_dims[d];
      /* An inference program keeps static shapes as declared (inputs need not share a batch axis). */
      if (d == 0 && t->rank >= 1 && !(p->opt.forward_only && t->declared_dims[0] > 0)) t->dims[0] = p->mb_size;
      else if (t->declared_params[d] || t->dims[d] < 0)
        return err_set("%s: graph input '%s' has a symbolic dimension '%s' at axis %d; pipecc needs every axis "
                       "but the batch to be fixed (export with a static size)", g->path, t->name,
                       t->declared_params[d] ? t->declared_params[d] : "?", d);
    }
    if (t->rank == 0) return err_set("%s: graph input '%s' is a scalar; the first axis must be the batch", g->path, t->name);
    if (!dtype_size(t->dtype)) return err_set("%s: graph input '%s' has an unsupported element type", g->path, t->name);
    /* The data loader writes float32 images or int64 token ids; any other
     * declared type would be read as one of those and train on garbage. */
    if (!p->opt.forward_only && t->dtype != DT_FLOAT && t->dtype != DT_INT64)
      return err_set("%s: graph input '%s' is %s; a training program's data inputs must be float32 (images) or int64 "
                     "(token ids)", g->path, t->name, dtype_name(t->dtype));
  }
  if (!g->ninputs) return err_set("%s: the graph has no data inputs", g->path);
  g->batch = declared;
  return 0;
}

/* A run-time tensor with a zero-sized axis (an empty Slice, a Reshape to 0)
 * has nothing to train on and would divide by zero in the rules that take
 * rows = numel / last axis: refuse it, naming the node. */
int check_nonempty(Graph *g) {
  for (int j = 0; j < g->nn; j++) {
    const Node *n = &g->n[j];
    if (n->folded) continue;
    for (int side = 0; side < 2; side++)
      for (int k = 0; k < (side ? n->nout : n->nin); k++) {
        if ((side ? n->out[k] : n->in[k]) < 0) continue;
        const Tensor *t = side ? node_out(g, n, k) : node_in(g, n, k);
        /* A constant input (ReduceSum's empty `axes`) is read at compile time, never run. */
        if (!side && (t->data || t->is_initializer || (t->producer >= 0 && g->n[t->producer].folded))) continue;
        for (int d = 0; d < t->rank; d++)
          if (t->dims[d] == 0)
            return err_set("%s: node '%s' (%s): %s '%s' is empty (axis %d has size 0); pipecc does not run empty "
                           "tensors", g->path, n->name, n->op, side ? "output" : "input", t->name, d);
      }
  }
  return 0;
}
