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

#include "ops/rule.h"
#include "ops/loss.h"
#include "update.h"

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
typedef struct Emit Ctx;

/* A buffer's C identifier: its role's prefix (v_ value, d_ gradient, dW_
 * weight gradient, W_ weight, C_ constant, M1_/M2_ optimizer state, L_
 * labels, col_/dcol_ workspace) and the tensor's name with every other byte
 * made '_'.  The prefix keeps a name from the model from ever being a C
 * keyword, a kernel, a runtime field or a function the stage defines
 * ("main", "forward", "k_gemm", "offset" as L_offset...); add_buf makes it unique. */
static const char *cname(Pool *pool, const char *prefix, const char *name) {
  char *s = pool_printf(pool, "%s%s", prefix, name);
  for (char *c = s; *c; c++)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9'))) *c = '_';
  return s;
}

static int add_buf(Ctx *c, const char *prefix, int tensor, int kind, int64_t bytes, int dtype) {
  StageProg *sp = c->sp;
  if (sp->nbufs == sp->capbufs) {
    sp->capbufs = sp->capbufs ? 2 * sp->capbufs : 64;
    sp->bufs = pool_realloc(c->pool, sp->bufs, sizeof(Buffer) * (size_t)sp->capbufs);
  }
  Buffer *b = &sp->bufs[sp->nbufs];
  memset(b, 0, sizeof *b);
  const char *base = tensor >= 0 ? c->p->g.t[tensor].name : "work";
  b->name = c->named ? cname(c->pool, prefix, base) : prefix;
  /* Names must be unique C identifiers: add the buffer number when needed. */
  for (int i = 0; i < sp->nbufs && c->named; i++)
    if (!strcmp(sp->bufs[i].name, b->name)) {
      b->name = pool_printf(c->pool, "%s_%d", b->name, sp->nbufs);
      break;
    }
  b->tensor = tensor, b->kind = kind, b->bytes = bytes, b->dtype = dtype;
  b->first = b->last = -1;
  return sp->nbufs++;
}

static Tensor *T(Ctx *c, int idx) { return &c->p->g.t[idx]; }

/* The buffer holding tensor t's value in this stage: a parameter, an
 * activation produced here or received, or a constant, which is placed in the
 * weights region with its value (BatchNorm's running statistics live there
 * too, and change as the stage trains). */
static int fb(Ctx *c, int t) {
  if (c->fbuf[t] < 0 && T(c, t)->data) {
    c->fbuf[t] = add_buf(c, "C_", t, BUF_PARAM, tensor_bytes(T(c, t)), T(c, t)->dtype);
    c->sp->consts[c->sp->nconsts++] = c->fbuf[t];
  }
  return c->fbuf[t];
}

static int is_tied(Ctx *c, int t) { return T(c, t)->is_param && c->p->nreaders[t] > 1; }

/* The partial gradient of tied weight t that node `node` adds into. */
static int partial(Ctx *c, int t, int node) {
  for (int i = 0; i < c->npart; i++)
    if (c->part[i].t == t && c->part[i].node == node) return c->part[i].buf;
  if (c->npart == c->cappart) {
    c->cappart = c->cappart ? 2 * c->cappart : 8;
    c->part = pool_realloc(c->pool, c->part, sizeof *c->part * (size_t)c->cappart);
  }
  int b = add_buf(c, "dP_", t, BUF_PGRAD, tensor_bytes(T(c, t)), DT_FLOAT);
  c->sp->bufs[b].is_grad = 1;
  c->part[c->npart++] = (struct Partial){t, node, b};
  return b;
}

/* Gradient buffer for input tensor t of graph node `node` (-1: none), and whether to add. */
static int grad_target(Ctx *c, int t, int *acc, int node) {
  Tensor *x = T(c, t);
  if (node >= 0 && is_tied(c, t)) { /* summed over micro-batches, like any weight gradient */
    *acc = 1;
    return partial(c, t, node);
  }
  if (c->gbuf[t] < 0) {
    if (x->is_param) c->gbuf[t] = add_buf(c, "dW_", t, BUF_PGRAD, tensor_bytes(x), DT_FLOAT);
    else c->gbuf[t] = add_buf(c, "d_", t, BUF_TEMP, tensor_bytes(x), DT_FLOAT);
    c->sp->bufs[c->gbuf[t]].is_grad = 1;
  }
  /* Weight gradients always add: they are zeroed once per step and summed over micro-batches. */
  *acc = x->is_param ? 1 : c->gcount[t] > 0;
  c->gcount[t]++;
  return c->gbuf[t];
}

static int out_buf(Ctx *c, int t) {
  if (c->fbuf[t] < 0) c->fbuf[t] = add_buf(c, "v_", t, BUF_TEMP, tensor_bytes(T(c, t)), T(c, t)->dtype);
  return c->fbuf[t];
}

static void glue_call(Ctx *c, int kernel, const char *comment, const Arg *args, int nargs) {
  call_add(c->sp, c->pool, PH_IGRAD, kernel, -1, comment, args, nargs);
}

/* ---- what operator rules see (ops/rule.h) ---- */

Graph *em_graph(Emit *e) { return &e->p->g; }
Tensor *em_t(Emit *e, int tensor) { return T(e, tensor); }
int em_in(Emit *e, const Node *n, int k) { return k < n->nin && n->in[k] >= 0 ? fb(e, n->in[k]) : -1; }
int em_out(Emit *e, const Node *n, int k) { return out_buf(e, n->out[k]); }
int em_used(Emit *e, const Node *n, int k) {
  return k < n->nout && n->out[k] >= 0 && (T(e, n->out[k])->is_output || T(e, n->out[k])->nuses);
}
int em_work(Emit *e, const char *prefix, int tensor, int64_t bytes) {
  int b = add_buf(e, prefix, tensor, BUF_TEMP, bytes, DT_FLOAT);
  e->sp->bufs[b].is_workspace = 1;
  return b;
}
int em_split_wgrad(Emit *e) { return e->p->opt.schedule == SCHED_ZB1 && !e->p->opt.forward_only; }
int em_training(Emit *e) { return !e->p->opt.forward_only; }
int em_needs(Emit *e, const Node *n, int k) { return k < n->nin && n->in[k] >= 0 && e->needs[n->in[k]]; }
int em_grad(Emit *e, const Node *n, int k, int *acc) { return grad_target(e, n->in[k], acc, (int)(n - e->p->g.n)); }
int em_grad_add(Emit *e, const Node *n, int k) {
  int acc, node = (int)(n - e->p->g.n), b = grad_target(e, n->in[k], &acc, node);
  if (!acc) /* an activation's gradient (a scale computed at run time): its first contribution must not add to garbage */
    call_add(e->sp, e->pool, PH_IGRAD, K_ZERO, node, "its first contribution, and the kernel below adds",
             (Arg[]){A_BUF(b), A_INT(ir_numel(T(e, n->in[k])))}, 2);
  return b;
}
int em_dy(Emit *e, const Node *n, int k) {
  int t = k < n->nout ? n->out[k] : -1;
  return t >= 0 && e->gbuf[t] >= 0 && e->gcount[t] ? e->gbuf[t] : -1;
}
int em_shape(Emit *e, const char *type, const char *name, const Arg *fields, int nfields) {
  return shape_add(e->sp, e->pool, type, name, fields, nfields);
}
int em_shape_ref(Emit *e, const char *name) {
  int id = shape_find(e->sp, name);
  if (id < 0) {
    fprintf(stderr, "pipecc: internal error: backward rule refers to shape constant %s, which its forward rule did not define\n", name);
    abort();
  }
  return id;
}
void em_call(Emit *e, int phase, int kernel, const Node *n, const Arg *args, int nargs) {
  /* A fused node's call says what it runs (fuse.c): "/bn1/BatchNormalization (BatchNormalization+Relu)". */
  const char *comment = n->fusion ? pool_printf(e->pool, "%s (%s)", n->name, n->fusion) : n->name;
  Call *k = call_add(e->sp, e->pool, phase, kernel, (int)(n - e->p->g.n), comment, args, nargs);
  /* W work may only produce weight gradients: a call that also writes the
   * gradient of an activation (a Gemm whose B is computed) is input-gradient
   * work, which the next I action upstream needs. */
  for (int w = 0; w < k->nwrites && k->phase == PH_WGRAD; w++) {
    const Buffer *b = &e->sp->bufs[k->writes[w]];
    if (b->is_grad && b->kind != BUF_PGRAD) k->phase = PH_IGRAD;
  }
}
void em_variant(Emit *e, int which, int kernel, const Arg *args, int nargs) {
  if (!e->sp->nfwd) abort();
  call_variant(e->sp, e->pool, &e->sp->fwd[e->sp->nfwd - 1], which, kernel, args, nargs);
}
const char *em_name(Emit *e, const char *fmt, int j) { return pool_printf(e->pool, fmt, j); }

/* Tensors on a path from a parameter: they need gradients. */
static char *needs_grad(Plan *p, Pool *pool) {
  Graph *g = &p->g;
  char *need = pool_alloc(pool, (size_t)g->nt);
  for (int i = 0; i < g->nt; i++) need[i] = g->t[i].is_param;
  for (int k = 0; k < p->N; k++) {
    Node *n = &g->n[p->node[k]];
    const OpDef *d = n->def;
    int any = 0;
    for (int q = 0; q < n->nin; q++)
      if (n->in[q] >= 0 && need[n->in[q]] && (d->diff_inputs >> (q < 31 ? q : 31) & 1)) any = 1;
    for (int q = 0; q < n->nout; q++)
      if (n->out[q] >= 0 && any && dtype_is_float(g->t[n->out[q]].dtype)) need[n->out[q]] = 1;
  }
  return need;
}

const char *plan_needs(Plan *p) {
  if (!p->needs) p->needs = p->opt.forward_only ? pool_alloc(&p->g.pool, (size_t)p->g.nt) : needs_grad(p, &p->g.pool);
  return p->needs;
}

/* The stage holding compute node k under the plan's partition; -1 while a
 * candidate stage is priced (the other stages are not decided yet). */
static int stage_of(Ctx *c, int k) {
  if (!c->named) return -1;
  for (int s = 0; s < c->p->opt.nstages; s++)
    if (c->p->role[s] != ROLE_FWD && c->p->rbegin[s] <= k && k < c->p->rend[s]) return s;
  return -1;
}

/* Param i (tensor t) is tied: every reading node's partial gradient, in graph
 * order - this stage's, and a buffer to receive each other stage's into. */
static void tie_parts(Ctx *c, int i, int t) {
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
    int b = local ? partial(c, t, p->node[k]) : add_buf(c, "dP_", t, BUF_PGRAD, tensor_bytes(T(c, t)), DT_FLOAT);
    c->sp->bufs[b].is_grad = 1;
    sp->parts[i][sp->nparts[i]++] = (struct TiePart){b, local ? c->s : stage_of(c, k), p->node[k]};
  }
}

static int build_stage(Ctx *c) {
  Plan *p = c->p;
  Graph *g = &p->g;
  StageProg *sp = c->sp;
  int last = c->e == p->N; /* it ends with the graph's outputs: the loss reads them */
  /* Parameters this stage reads, in ONNX initializer (tensor) order. */
  sp->params = pool_alloc(c->pool, sizeof(int) * (size_t)g->nt);
  sp->consts = pool_alloc(c->pool, sizeof(int) * (size_t)g->nt);
  char *here = pool_alloc(c->pool, (size_t)g->nt);
  for (int k = c->a; k < c->e; k++)
    for (int q = 0; q < g->n[p->node[k]].nin; q++)
      if (g->n[p->node[k]].in[q] >= 0) here[g->n[p->node[k]].in[q]] = 1;
  for (int i = 0; i < g->nt; i++) {
    if (!g->t[i].is_param || !here[i]) continue;
    int b = add_buf(c, "W_", i, BUF_PARAM, tensor_bytes(&g->t[i]), DT_FLOAT);
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
      x->buf = c->fbuf[t] = add_buf(c, "v_", t, BUF_RING, tensor_bytes(&g->t[t]), g->t[t].dtype);
      x->gbuf = -1;
      if (c->a > 0 && c->needs[t]) {
        x->gbuf = add_buf(c, "d_", t, BUF_GRING, tensor_bytes(&g->t[t]), DT_FLOAT);
        sp->bufs[x->gbuf].is_grad = 1;
      }
    }
  }
  for (int k = c->a; k < c->e; k++) {
    Node *nd = &g->n[p->node[k]];
    if (!nd->def->fwd)
      return err_set("node '%s' uses %s, which has no run-time kernel yet (run time: %s)", nd->name, nd->op, op_supported_list());
    if (nd->def->fwd(c, nd, p->node[k])) return -1;
  }
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
      sp->dloss_buf = c->gbuf[t] = add_buf(c, "d_", t, BUF_RING, tensor_bytes(L), DT_FLOAT);
      sp->bufs[sp->dloss_buf].is_grad = 1;
      c->gcount[t] = 1;
      sp->labels_buf = add_buf(c, "L_", t, BUF_LABELS, 8 * sp->loss_rows, DT_INT64);
      continue;
    }
    Crossing *x = &sp->send[sp->nsend++];
    x->tensor = t;
    x->buf = c->fbuf[t];
    sp->bufs[x->buf].kind = BUF_RING;
    x->gbuf = -1;
    if (c->needs[t]) {
      /* Receiving the gradient is its first contribution; local readers add. */
      x->gbuf = c->gbuf[t] = add_buf(c, "d_", t, BUF_GRING, tensor_bytes(&g->t[t]), DT_FLOAT);
      sp->bufs[x->gbuf].is_grad = 1;
      c->gcount[t] = 1;
    }
  }
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
  /* Gradient and optimizer buffers for every weight. */
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
      grad_target(c, t, &acc, -1);
    }
    sp->pgrad[i] = c->gbuf[t];
    if (is_tied(c, t)) tie_parts(c, i, t);
    sp->opt1[i] = slots >= 1 ? add_buf(c, "M1_", t, BUF_OPT, tensor_bytes(&g->t[t]), DT_FLOAT) : -1;
    sp->opt2[i] = slots >= 2 ? add_buf(c, "M2_", t, BUF_OPT, tensor_bytes(&g->t[t]), DT_FLOAT) : -1;
  }
  return 0;
}

int stage_build(Plan *p, StageProg *sp, int s, int a, int e, int named, Pool *pool) {
  Graph *g = &p->g;
  if (!p->needs) p->needs = p->opt.forward_only ? pool_alloc(&g->pool, (size_t)g->nt) : needs_grad(p, &g->pool);
  memset(sp, 0, sizeof *sp);
  sp->stage = s;
  sp->loss_buf = sp->dloss_buf = sp->labels_buf = -1;
  Ctx c = {p, sp, pool, s, a, e, NULL, NULL, NULL, p->needs, named, NULL, 0, 0};
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
