/* plan.c - the compiler's middle: from a loaded model to a partitioned,
 * scheduled plan.  Each step is a pass of its own file; this one only
 * sequences them and gathers what the listing needs. */
#include "plan.h"

#include <string.h>

#include "onnx_load.h"
#include "ops.h"

/* Gives every graph input its static shape: the batch axis becomes the
 * micro-batch size; any other symbolic axis is an error. */
static int bind_inputs(Plan *p) {
  Graph *g = &p->g;
  int64_t declared = 0;
  for (int i = 0; i < g->ninputs; i++) {
    Tensor *t = &g->t[g->inputs[i]];
    if (t->declared_rank < 0) return err_set("%s: graph input '%s' has no declared shape", g->path, t->name);
    if (t->declared_rank >= 1 && t->declared_dims[0] > 0) declared = t->declared_dims[0];
  }
  int64_t batch = p->opt.batch > 0 ? p->opt.batch : declared > 0 ? declared : 32;
  int m = p->opt.microbatches;
  if (m <= 0) {
    /* Default: one micro-batch per stage twice over, as a divisor of the batch. */
    m = 1;
    if (p->opt.nstages > 1)
      for (m = 2 * p->opt.nstages; m < batch && batch % m; m++) {
      }
    if (m > batch) m = (int)batch;
  }
  if (batch % m)
    return err_set("--batch %lld is not divisible by --microbatches %d", (long long)batch, m);
  p->batch = batch;
  p->opt.microbatches = m;
  p->mb_size = batch / m;
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

/* Values that flow between compute nodes (or from the loader, or to the loss). */
static void collect_edges(Plan *p) {
  Graph *g = &p->g;
  int *pos = pool_alloc(&g->pool, sizeof(int) * (size_t)g->nn);
  for (int j = 0; j < g->nn; j++) pos[j] = -1;
  for (int k = 0; k < p->N; k++) pos[p->node[k]] = k;
  int *from = pool_alloc(&g->pool, sizeof(int) * (size_t)g->nt), *to = pool_alloc(&g->pool, sizeof(int) * (size_t)g->nt);
  for (int i = 0; i < g->nt; i++) {
    Tensor *t = &g->t[i];
    from[i] = t->producer >= 0 ? pos[t->producer] : -1;
    to[i] = t->is_output ? p->N : -2;
  }
  for (int k = 0; k < p->N; k++) {
    Node *n = &g->n[p->node[k]];
    for (int q = 0; q < n->nin; q++)
      if (n->in[q] >= 0 && to[n->in[q]] < k && to[n->in[q]] != p->N) to[n->in[q]] = k;
  }
  p->edges = pool_alloc(&g->pool, sizeof(PartEdge) * (size_t)g->nt);
  p->edge_tensor = pool_alloc(&g->pool, sizeof(int) * (size_t)g->nt);
  p->nedges = 0;
  for (int i = 0; i < g->nt; i++) {
    Tensor *t = &g->t[i];
    if (t->data || to[i] < 0 || (t->producer >= 0 && from[i] < 0 && !t->is_input)) continue;
    PartEdge *e = &p->edges[p->nedges];
    e->from = from[i];
    e->to = to[i];
    e->bytes = (double)tensor_bytes(t);
    e->grad_bytes = dtype_is_float(t->dtype) && !t->is_input ? e->bytes : 0;
    p->edge_tensor[p->nedges++] = i;
  }
}

int plan_build(Plan *p, const Options *o) {
  memset(p, 0, sizeof *p);
  p->opt = *o;
  if (onnx_load_file(o->model, &p->g)) return -1;
  Graph *g = &p->g;
  if (bind_inputs(p)) return -1;
  if (infer_and_fold(g)) {
    /* Name the file too: the node alone may not say which model. */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", err_msg());
    err_clear();
    return err_set("%s: %s", g->path, msg);
  }
  p->node = pool_alloc(&g->pool, sizeof(int) * (size_t)g->nn);
  for (int j = 0; j < g->nn; j++)
    if (!g->n[j].folded) p->node[p->N++] = j;
    else p->nfolded++;
  if (!p->N) return err_set("%s: every node is a constant; there is nothing to train", g->path);
  NodeCost *all = pool_alloc(&g->pool, sizeof(NodeCost) * (size_t)g->nn);
  cost_nodes(g, all);
  p->cost = pool_alloc(&g->pool, sizeof(NodeCost) * (size_t)p->N);
  double *arr[6];
  for (int k = 0; k < 6; k++) arr[k] = pool_alloc(&g->pool, sizeof(double) * (size_t)p->N);
  for (int k = 0; k < p->N; k++) {
    NodeCost *c = &p->cost[k];
    *c = all[p->node[k]];
    arr[0][k] = c->fwd_flops, arr[1][k] = c->bwd_flops, arr[2][k] = c->traffic_bytes;
    arr[3][k] = c->param_bytes, arr[4][k] = c->stash_bytes, arr[5][k] = c->work_bytes;
    p->params += c->param_count;
  }
  collect_edges(p);
  if (o->nstages > p->N)
    return err_set("-n %d is larger than the number of compute nodes in %s (%d after constant folding): each stage needs "
                   "at least one", o->nstages, g->path, p->N);
  if (machine_load(&p->machine, o->nstages, o->devices, &g->pool)) return -1;
  const char *opt = o->optimizer ? o->optimizer : "sgd";
  p->opt_slots = !strcmp(opt, "sgd") ? (o->momentum > 0 ? 1 : 0) : 2;
  PartProblem *pr = &p->prob;
  pr->N = p->N;
  pr->fwd_flops = arr[0], pr->bwd_flops = arr[1], pr->traffic = arr[2];
  pr->param_bytes = arr[3], pr->stash_bytes = arr[4], pr->work_bytes = arr[5];
  pr->edges = p->edges, pr->nedges = p->nedges;
  pr->nstages = o->nstages, pr->microbatches = p->opt.microbatches, pr->schedule = o->schedule;
  pr->opt_state_per_param = p->opt_slots;
  pr->machine = &p->machine;
  pr->mem_limit = o->mem_limit;
  if (partition_solve(pr, &p->part, &g->pool)) return -1;
  schedule_build(&p->sched, o->schedule, o->nstages, p->opt.microbatches, o->forward_only, p->part.cost, &g->pool);
  if (schedule_validate(&p->sched)) return -1;
  /* The listing's table: unit times (zb1: F = I = W = 1, as in the zero-bubble paper). */
  StageCost *unit = pool_alloc(&g->pool, sizeof(StageCost) * (size_t)o->nstages);
  for (int s = 0; s < o->nstages; s++) {
    unit[s].fwd = 1, unit[s].bwd = o->schedule == SCHED_ZB1 ? 2 : 1, unit[s].bwd_w = unit[s].bwd / 2;
  }
  schedule_build(&p->slots, o->schedule, o->nstages, p->opt.microbatches, o->forward_only, unit, &g->pool);
  return 0;
}

void plan_free(Plan *p) { ir_free(&p->g); }
