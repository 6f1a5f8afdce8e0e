/* autodiff.c - each stage's forward and backward program.
 *
 * Forward: one kernel call per node, in order.  Backward: the nodes in
 * reverse, one call per gradient (the gradient for an op's input and the one
 * for its weights are separate calls, so schedules can later split them).
 * A tensor read by several nodes gets its gradient summed in reverse node
 * order - the first contribution writes, the rest add - and a value that
 * crosses into later stages starts from the gradient those stages send back.
 * This order is the same whatever the partition, so -n 1 and -n 4 compute
 * the same sums in the same order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff.h"

#include "replica.h"
#include "ops/loss.h"
#include "update.h"

#include "build.h"
#include "memplan.h"
#include "ops.h"
#include "planq.h"

static void glue_call(Emit *c, int kernel, const char *comment, const Arg *args, int nargs) {
  call_add(c->sp, c->pool, PH_IGRAD, kernel, -1, comment, args, nargs);
}

/* The stage holding compute node k under the plan's partition; -1 while a
 * candidate stage is priced (the other stages are not decided yet). */
static int stage_of(Emit *c, int k) {
  if (!c->named) return -1;
  for (int s = 0; s < c->p->opt.nstages; s++)
    if (c->p->role[s] != ROLE_FWD && c->p->rbegin[s] <= k && k < c->p->rend[s]) return s;
  return -1;
}

/* Param i (tensor t) is tied: every reading node's partial gradient, in graph
 * order - this stage's, and a buffer to receive each other stage's into. */
static void tie_parts(Emit *c, int i, int t) {
  Plan *p = c->p;
  StageProg *sp = c->sp;
  int *ks = pool_alloc(c->pool, sizeof(int) * (size_t)p->nreaders[t]), same;
  int nk = plan_tie_readers(p, t, ks, &same);
  sp->nparts[i] = 0;
  sp->parts[i] = pool_alloc(c->pool, sizeof(struct TiePart) * (size_t)nk);
  for (int r = 0; r < nk; r++) {
    int k = ks[r];
    int local = c->a <= k && k < c->e;
    /* A local reader no gradient reached still has its (zero) part. */
    int b = local ? build_partial(c, t, p->node[k]) : build_buf(c, "dP_", t, BUF_PGRAD, tensor_bytes(&c->p->g.t[t]), DT_FLOAT);
    c->sp->bufs[b].is_grad = 1;
    sp->parts[i][sp->nparts[i]++] = (struct TiePart){b, local ? c->s : stage_of(c, k), p->node[k]};
  }
}

/* The weights this stage reads (in ONNX initializer order), and what it receives across its left cut. */
static void add_inputs(Emit *c) {
  Plan *p = c->p;
  Graph *g = &p->g;
  StageProg *sp = c->sp;
  /* Parameters this stage reads, in ONNX initializer (tensor) order. */
  sp->params = pool_alloc(c->pool, sizeof(int) * (size_t)g->nt);
  sp->consts = pool_alloc(c->pool, sizeof(int) * (size_t)g->nt);
  char *here = pool_alloc(c->pool, (size_t)g->nt);
  for (int k = c->a; k < c->e; k++)
    for (int q = 0; q < g->n[p->node[k]].nin; q++)
      if (g->n[p->node[k]].in[q] >= 0) here[g->n[p->node[k]].in[q]] = 1;
  for (int i = 0; i < g->nt; i++) {
    if (!g->t[i].is_param || !here[i]) continue;
    int b = build_buf(c, "W_", i, BUF_PARAM, tensor_bytes(&g->t[i]), DT_FLOAT);
    c->fbuf[i] = b;
    sp->params[sp->nparams++] = b;
  }
  /* What crosses the stage's cuts: received on the left, sent on the right. */
  sp->recv = pool_alloc(c->pool, sizeof(Crossing) * (size_t)(p->nedges + 1));
  sp->send = pool_alloc(c->pool, sizeof(Crossing) * (size_t)(p->nedges + 1));
  for (int q = 0; q < p->nedges; q++) {
    PartEdge *ed = &p->edges[q];
    int t = p->edge_tensor[q];
    /* With direct sends a rank takes only the values it reads (rank 0 every loader input). */
    if (ed->from < c->a && c->a <= ed->to && (!p->direct || (ed->from < 0 && c->a == 0) || plan_reads_range(p, q, c->a, c->e))) {
      Crossing *x = &sp->recv[sp->nrecv++];
      x->tensor = t;
      x->from_loader = ed->from < 0 && c->a == 0;
      x->buf = c->fbuf[t] = build_buf(c, "v_", t, BUF_RING, tensor_bytes(&g->t[t]), g->t[t].dtype);
      x->gbuf = -1;
      if (c->a > 0 && c->needs[t]) {
        x->gbuf = build_buf(c, "d_", t, BUF_GRING, tensor_bytes(&g->t[t]), DT_FLOAT);
        sp->bufs[x->gbuf].is_grad = 1;
      }
    }
  }
}

/* What it sends across its right cut (or, on the last stage, the loss's logits or the outputs of an
 * inference program).  0, or -1 with err_set. */
static int add_sends(Emit *c, int last) {
  Plan *p = c->p;
  Graph *g = &p->g;
  StageProg *sp = c->sp;
  for (int q = 0; q < p->nedges; q++) {
    PartEdge *ed = &p->edges[q];
    int t = p->edge_tensor[q];
    if (!(ed->from < c->e && c->e <= ed->to)) continue;
    /* With direct sends it passes on only what it makes or takes (it reads). */
    if (p->direct && !(ed->from < 0 ? c->a == 0 : ed->from >= c->a) && !plan_reads_range(p, q, c->a, c->e)) continue;
    if (last && c->p->opt.forward_only) { /* an inference program hands its outputs back */
      if (c->fbuf[t] < 0) {
        const Tensor *o = &g->t[t];
        return err_set("output '%s' of node '%s' (%s) is not computed by pipecc's kernel (only the op's main output is)", o->name,
                       o->producer >= 0 ? g->n[o->producer].name : "?", o->producer >= 0 ? g->n[o->producer].op : "?");
      }
      Crossing *x = &sp->send[sp->nsend++];
      x->tensor = t, x->buf = c->fbuf[t], x->gbuf = -1;
      sp->bufs[x->buf].kind = BUF_RING;
      continue;
    }
    if (last) { /* the graph output the loss reads */
      if (!dtype_is_float(g->t[t].dtype)) return err_set("graph output '%s' is not float; the loss needs logits", g->t[t].name);
      if (sp->loss_buf >= 0) return err_set("the model has more than one output; the loss takes one (logits)");
      Tensor *L = &g->t[t];
      if (L->rank < 2) return err_set("graph output '%s' %s must be [batch, classes] or [batch, seq, vocab]", L->name, shape_str(L));
      sp->loss_buf = c->fbuf[t];
      sp->bufs[sp->loss_buf].kind = BUF_RING;
      sp->loss_classes = L->dims[L->rank - 1];
      sp->loss_rows = ir_numel(L) / sp->loss_classes;
      sp->dloss_buf = c->gbuf[t] = build_buf(c, "d_", t, BUF_RING, tensor_bytes(L), DT_FLOAT);
      sp->bufs[sp->dloss_buf].is_grad = 1;
      c->gcount[t] = 1;
      sp->labels_buf = build_buf(c, "L_", t, BUF_LABELS, 8 * sp->loss_rows, DT_INT64);
      continue;
    }
    Crossing *x = &sp->send[sp->nsend++];
    x->tensor = t;
    x->buf = c->fbuf[t];
    sp->bufs[x->buf].kind = BUF_RING;
    x->gbuf = -1;
    if (c->needs[t]) {
      /* Receiving the gradient is its first contribution; local readers add. */
      x->gbuf = c->gbuf[t] = build_buf(c, "d_", t, BUF_GRING, tensor_bytes(&g->t[t]), DT_FLOAT);
      sp->bufs[x->gbuf].is_grad = 1;
      c->gcount[t] = 1;
    }
  }
  return 0;
}

/* Gradient and optimizer buffers for every weight. */
static void add_weight_state(Emit *c) {
  Plan *p = c->p;
  Graph *g = &p->g;
  StageProg *sp = c->sp;
  const char *optname = p->opt.optimizer ? p->opt.optimizer : "sgd";
  int slots = !strcmp(optname, "sgd") ? (p->opt.momentum > 0) : 2;
  sp->pgrad = pool_alloc(c->pool, sizeof(int) * (size_t)(sp->nparams + 1));
  sp->opt1 = pool_alloc(c->pool, sizeof(int) * (size_t)(sp->nparams + 1));
  sp->opt2 = pool_alloc(c->pool, sizeof(int) * (size_t)(sp->nparams + 1));
  sp->parts = pool_alloc(c->pool, sizeof(*sp->parts) * (size_t)(sp->nparams + 1));
  sp->nparts = pool_alloc(c->pool, sizeof(int) * (size_t)(sp->nparams + 1));
  for (int i = 0; i < sp->nparams; i++) {
    int t = sp->bufs[sp->params[i]].tensor;
    if (c->gbuf[t] < 0) {
      int acc;
      build_grad_target(c, t, &acc, -1);
    }
    sp->pgrad[i] = c->gbuf[t];
    if (build_is_tied(c, t)) tie_parts(c, i, t);
    int zero = p->opt.zero && p->opt.replicas > 1; /* --zero 1: the shard's state instead (replica_zero_state) */
    sp->opt1[i] = slots >= 1 && !zero ? build_buf(c, "M1_", t, BUF_OPT, tensor_bytes(&g->t[t]), DT_FLOAT) : -1;
    sp->opt2[i] = slots >= 2 && !zero ? build_buf(c, "M2_", t, BUF_OPT, tensor_bytes(&g->t[t]), DT_FLOAT) : -1;
  }
  replica_zero_state(p, sp, slots, c->pool);
}

/* Whether call k reads buffer id. */
static int call_reads(const Call *k, int id) {
  for (int r = 0; r < k->nreads; r++)
    if (k->reads[r] == id) return 1;
  return 0;
}

/* zb1, zbv: in the late layout a micro-batch's forward ring copy is free after its I, and what its W
 * reads lives until W elsewhere (memplan.c, the late values).  A value at a cut (received, sent, the
 * loss's gradient) stays where its messages or the loss put it, so a W that reads one reads a copy
 * made during I, right before the first such W call (where the whole backward, B, reaches it too).
 * In the hold layout the copy is laid out on the value itself, and copies nothing. */
static int split_copies(Emit *c) {
  StageProg *sp = c->sp;
  int nb = sp->nbufs;
  for (int id = 0; id < nb; id++) {
    int at = -1, cross = buf_at_cut(sp, id);
    for (int k = 0; k < sp->nbwd && cross && at < 0; k++)
      if (sp->bwd[k].phase == PH_WGRAD && call_reads(&sp->bwd[k], id)) at = k;
    if (at < 0) continue;
    int t = sp->bufs[id].tensor, dt = sp->bufs[id].dtype, i64 = dt == DT_INT64;
    int64_t bytes = sp->bufs[id].bytes;
    if (!i64 && bytes % 4)
      return err_set("--schedule %s: a weight gradient reads '%s' (%s) at a cut, which the input-gradient half cannot keep for it "
                     "(use 1f1b)", schedule_name(c->p->opt.schedule), t >= 0 ? c->p->g.t[t].name : sp->bufs[id].name, dtype_name(dt));
    int copy = build_buf(c, "late_", t, BUF_TEMP, bytes, dt);
    sp->bufs[copy].is_grad = 1; /* made by the backward: nothing offloads or recomputes it */
    sp->bufs[copy].copy_of = 1 + id;
    call_add(sp, c->pool, PH_IGRAD, i64 ? K_COPY_I64 : K_COPY, -1, "kept for the weight gradients (W), which run after this slot is free",
             (Arg[]){A_BUF(id), A_BUF(copy), A_INT(bytes / (i64 ? 8 : 4))}, 3);
    Call moved = sp->bwd[sp->nbwd - 1];
    memmove(&sp->bwd[at + 1], &sp->bwd[at], sizeof(Call) * (size_t)(sp->nbwd - 1 - at));
    sp->bwd[at] = moved;
    for (int k = at + 1; k < sp->nbwd; k++) {
      Call *w = &sp->bwd[k];
      if (w->phase != PH_WGRAD) continue;
      for (int r = 0; r < w->nreads; r++)
        if (w->reads[r] == id) w->reads[r] = copy;
      for (int a = 0; a < w->nargs; a++)
        if (w->args[a].kind == ARG_BUF && w->args[a].buf == id) w->args[a].buf = copy;
    }
  }
  return 0;
}

static int build_stage(Emit *c) {
  Plan *p = c->p;
  Graph *g = &p->g;
  StageProg *sp = c->sp;
  int last = c->e == p->N; /* it ends with the graph's outputs: the loss reads them */
  add_inputs(c);
  for (int k = c->a; k < c->e; k++) {
    Node *nd = &g->n[p->node[k]];
    if (!nd->def->fwd)
      return err_set("node '%s' uses %s, which has no run-time kernel yet (run time: %s)", nd->name, nd->op, op_supported_list());
    if (nd->def->fwd(c, nd, p->node[k])) return -1;
  }
  if (add_sends(c, last)) return -1;
  if (c->p->opt.forward_only) {
    /* No training: the weights are read-only constants of the program. */
    sp->pgrad = sp->opt1 = sp->opt2 = pool_alloc(c->pool, sizeof(int) * (size_t)(sp->nparams + 1));
    for (int i = 0; i < sp->nparams; i++) sp->pgrad[i] = -1;
    return 0;
  }
  if (last && sp->loss_buf < 0) return err_set("the last stage has no graph output for the loss");
  for (int k = c->e - 1; k >= c->a; k--) {
    Node *nd = &g->n[p->node[k]];
    int reached = 0;
    for (int q = 0; q < nd->nout; q++) reached |= nd->out[q] >= 0 && c->gbuf[nd->out[q]] >= 0 && c->gcount[nd->out[q]];
    if (!reached) continue; /* no gradient reaches it */
    if (!nd->def->bwd)
      return err_set("node '%s' (%s) has no gradient rule, but a gradient reaches it", nd->name, nd->op);
    if (nd->def->bwd(c, nd, p->node[k])) return -1;
  }
  /* Gradients this stage sends back: received values it (or later stages) used. */
  for (int r = 0; r < sp->nrecv; r++) {
    Crossing *x = &sp->recv[r];
    if (x->gbuf < 0) continue;
    int t = x->tensor, have = c->gbuf[t];
    if (have < 0 || !c->gcount[t]) {
      glue_call(c, K_ZERO, "no gradient reaches it here", (Arg[]){A_BUF(x->gbuf), A_INT(ir_numel(&g->t[t]))}, 2);
    } else if (have != x->gbuf) {
      /* Retarget: the gradient was summed in a temporary; the ring copy is what is sent. */
      glue_call(c, K_COPY_GRAD, "to the send buffer", (Arg[]){A_BUF(have), A_BUF(x->gbuf), A_INT(ir_numel(&g->t[t])), A_INT(0)}, 4);
    }
  }
  /* A forward value that backward reads must survive until its micro-batch's
   * backward: one copy per micro-batch in flight. */
  for (int k = 0; k < sp->nbwd; k++)
    for (int r = 0; r < sp->bwd[k].nreads; r++) {
      Buffer *b = &sp->bufs[sp->bwd[k].reads[r]];
      if (b->kind == BUF_TEMP && !b->is_grad && b->tensor >= 0 && c->fbuf[b->tensor] == sp->bwd[k].reads[r]) b->kind = BUF_RING;
    }
  if (sched_splits(p->opt.schedule) && split_copies(c)) return -1;
  add_weight_state(c);
  return 0;
}

int stage_build(Plan *p, StageProg *sp, int s, int a, int e, int named, Pool *pool) {
  Graph *g = &p->g;
  plan_needs(p);
  memset(sp, 0, sizeof *sp);
  sp->stage = s;
  sp->loss_buf = sp->dloss_buf = sp->labels_buf = -1;
  Emit c = {p, sp, pool, s, a, e, NULL, NULL, NULL, p->needs, named, NULL, 0, 0};
  c.fbuf = pool_alloc(pool, sizeof(int) * (size_t)g->nt);
  c.gbuf = pool_alloc(pool, sizeof(int) * (size_t)g->nt);
  c.gcount = pool_alloc(pool, sizeof(int) * (size_t)g->nt);
  for (int i = 0; i < g->nt; i++) c.fbuf[i] = c.gbuf[i] = -1;
  return build_stage(&c);
}

int autodiff_build(Plan *p, StageProg *progs, Pool *pool) {
  for (int s = 0; s < p->opt.nstages; s++) {
    if (stage_build(p, &progs[s], s, p->rbegin[s], p->rend[s], 1, pool)) return -1;
    loss_call(p, &progs[s], pool);
    update_calls(p, &progs[s], pool);
  }
  return 0;
}
