/* spec.c - deciding a stage: the plan and the stage's laid-out program in,
 * a closed StageSpec out (spec.h).
 *
 * Everything the generated program states is settled here: which copy of a
 * buffer each function reaches, which calls each function runs (the op
 * rules' eval and recompute variants chosen), where the profile's marks and
 * the polls go, every message's peer and tag, pipefb's tables, the memory
 * plan's owner of a peer's store.  The renderers only print. */
#include <stdlib.h>
#include <string.h>

#include "freeze.h"
#include "memplan.h"
#include "ops/conv.h"
#include "pipefb.h"
#include "planq.h"
#include "profile.h"
#include "spec.h"
#include "stash.h"

static const char *kind_name(int k) {
  switch (k) {
  case BUF_PARAM: return "weight";
  case BUF_PGRAD: return "weight gradient";
  case BUF_OPT: return "optimizer state";
  case BUF_RING: return "one copy per micro-batch in flight";
  case BUF_GRING: return "gradient, one copy per gradient slot";
  case BUF_LABELS: return "labels";
  case BUF_OPTSTAGE: return "the update's staging blocks of the optimizer state it streams from its file";
  case BUF_GSTAGE: return "a staging copy of the gradients the backward keeps in the file";
  default: return "temporary";
  }
}

/* A workspace's comment, by the prefix its op's rule named it with (em_work). */
static const char *work_what(const Buffer *b) {
  return strncmp(b->name, "rnn_", 4) && strncmp(b->name, "drnn_", 5)
             ? "workspace of one kernel (im2col columns)"
             : "workspace of one kernel (a recurrent layer's gates and states at every step)";
}

/* What a buffer holds, for its comment: the tensor's shape and its role.
 * Labels are one int64 per loss row, whatever shape the logits have. */
static const char *buf_what(const Graph *g, const Buffer *b, Pool *pool) {
  if (b->is_workspace) return work_what(b);
  if (b->kind == BUF_LABELS) return pool_printf(pool, "[%lld] int64, labels", (long long)(b->bytes / 8));
  if (b->late) return pool_printf(pool, "%s, kept from its forward to its weight gradients (W): one copy per late slot (wslot)", shape_str(&g->t[b->tensor]));
  if (b->kind == BUF_GRING && b->tensor >= 0 && !b->is_grad)
    return pool_printf(pool, "%s, kept from I to W: one copy per gradient slot", shape_str(&g->t[b->tensor]));
  if (b->tensor >= 0) return pool_printf(pool, "%s, %s", shape_str(&g->t[b->tensor]), kind_name(b->kind));
  return kind_name(b->kind);
}

static int buf_view(const StageProg *sp, const Buffer *b) {
  if (b->kind == BUF_RING) return b->fate != FATE_KEEP ? VIEW_XSLOT : b->late ? VIEW_WSLOT : VIEW_SLOT;
  if (b->kind == BUF_GRING) return VIEW_GSLOT;
  if (b->in_store) return VIEW_STORE;
  if (sp->nwversions && b->offset < sp->weights_bytes) return VIEW_WEIGHTS;
  return VIEW_PLAIN;
}

static void spec_buffers(const Plan *p, const StageProg *sp, StageSpec *o, Pool *pool) {
  o->nbufs = sp->nbufs;
  o->bufs = pool_alloc(pool, sizeof(SpecBuffer) * (size_t)(sp->nbufs + 1));
  for (int i = 0; i < sp->nbufs; i++) {
    const Buffer *b = &sp->bufs[i];
    SpecBuffer *x = &o->bufs[i];
    if (b->unused) continue; /* pipefb: the other half of the program (name stays NULL) */
    x->name = b->name, x->offset = b->offset, x->bytes = b->bytes;
    x->is_int64 = b->dtype == DT_INT64 || b->kind == BUF_LABELS;
    x->view = buf_view(sp, b);
    x->what = buf_what(&p->g, b, pool);
    if (b->copy_of && b->kind != BUF_GRING) /* the hold layout (memplan.c): laid out on the value it copies */
      x->what = pool_printf(pool, "the same bytes as %s (W reads it in its own copy: the copy during I does nothing)",
                            sp->bufs[b->copy_of - 1].name);
    if (x->view == VIEW_XSLOT)
      x->leaves = b->fate == FATE_OFFLOAD     ? "offloaded between its forward and backward"
                  : b->fate == FATE_RECOMPUTE ? "recomputed before its backward"
                                              : "crosses the cut, held only while in flight";
  }
}

/* The calls function `fn` runs, in order: all of them, the input- or weight-gradient half, the
 * recomputed ones, or the eval forward's (every call, as its eval variant where it has one). */
static const Call *selected(const StageProg *sp, const Call *k, int i, int fn) {
  switch (fn) {
  case FN_RECOMPUTE: return sp->recompute[i] ? (k->recompute ? k->recompute : k) : NULL;
  case FN_FORWARD_EVAL: return k->eval ? k->eval : k;
  case FN_BACKWARD_INPUT: return call_is_weight(sp, k) ? NULL : k;
  case FN_BACKWARD_WEIGHT: return call_is_weight(sp, k) ? k : NULL;
  case FN_ZERO_GRADS: return k->phase == PH_ZERO ? k : NULL;
  case FN_SUM_TIES: return k->phase == PH_TIES ? k : NULL;
  case FN_UPDATE: return k->phase == PH_UPDATE ? k : NULL;
  default: return k;
  }
}

static int mark_dir(const StageProg *sp, const Call *k) {
  return k->phase == PH_FWD ? MARK_FWD : call_is_weight(sp, k) ? MARK_BWD_WEIGHT : MARK_BWD_INPUT;
}

/* Fills function fn from calls[0..n).  Under --profile (local: a graph node's row of the profile, else
 * NULL) a mark follows the last call of a node and direction, so glue such as zeroing a gradient is
 * charged to the node after it; under --progress poll, pr_poll() follows the last call of each node. */
static void spec_fn(const StageProg *sp, SpecFn *f, const Call *calls, int n, int fn, const int *local, Pool *pool) {
  f->present = 1;
  f->calls = pool_alloc(pool, sizeof(SpecCall) * (size_t)(n + 1));
  const Call **orig = malloc(sizeof(Call *) * (size_t)(n + 1));
  if (!orig) abort();
  for (int i = 0; i < n; i++) {
    const Call *k = selected(sp, &calls[i], i, fn);
    if (!k) continue;
    orig[f->ncalls] = &calls[i];
    f->calls[f->ncalls++] = (SpecCall){.call = k, .mark = -1};
  }
  int timed = fn == FN_FORWARD || fn == FN_BACKWARD || fn == FN_BACKWARD_INPUT || fn == FN_BACKWARD_WEIGHT;
  int marks = local && timed, polls = sp->poll && timed;
  f->profiled = marks;
  for (int i = 0; i < f->ncalls; i++) {
    const Call *k = orig[i], *next = i + 1 < f->ncalls ? orig[i + 1] : NULL;
    int same_node = next && next->node == k->node;
    if (marks && k->node >= 0 && local[k->node] >= 0 && !(same_node && mark_dir(sp, next) == mark_dir(sp, k)))
      f->calls[i].mark = local[k->node], f->calls[i].mark_dir = mark_dir(sp, k);
    f->calls[i].poll = polls && !same_node;
  }
  free(orig);
}

static int has_eval_variant(const StageProg *sp) {
  for (int i = 0; i < sp->nfwd; i++)
    if (sp->fwd[i].eval) return 1;
  return 0;
}

/* The functions' names in the C a renderer prints (a chunk's: NAME_c<c>). */
static const char *const FN_NAMES[FN_COUNT] = {"forward",         "forward_eval", "recompute", "backward", "backward_input",
                                              "backward_weight", "zero_grads",   "sum_ties",  "update"};

/* A rank of chunks: chunk c's forward and backward functions, from its calls alone. */
static void spec_chunk_fns(const Plan *p, const StageProg *sp, StageSpec *o, const int *local, int c, Pool *pool) {
  static const char *const docs[FN_ZERO_GRADS] = {"Chunk %d (stage %d): the forward of the micro-batch in its ring slot `slot`.",
                                                  "Chunk %d (stage %d): the eval forward (run.sh --val).", "", "Chunk %d (stage %d): the backward.",
                                                  "Chunk %d (stage %d): the input-gradient half (I).",
                                                  "Chunk %d (stage %d): the weight-gradient half (W), run later for the same slots."};
  int split = sched_splits(p->opt.schedule), nf = 0, nb = 0, eval = 0;
  Call *fwd = pool_alloc(pool, sizeof(Call) * (size_t)(sp->nfwd + 1)), *bwd = pool_alloc(pool, sizeof(Call) * (size_t)(sp->nbwd + 1));
  for (int i = 0; i < sp->nfwd; i++)
    if (sp->fwd[i].chunk == c) fwd[nf++] = sp->fwd[i], eval |= sp->fwd[i].eval != NULL;
  for (int i = 0; i < sp->nbwd; i++)
    if (sp->bwd[i].chunk == c) bwd[nb++] = sp->bwd[i];
  int want[FN_ZERO_GRADS] = {1, eval, 0, 1, split, split};
  for (int fn = 0; fn < FN_ZERO_GRADS; fn++) {
    SpecFn *f = &o->chunk_fn[c * FN_COUNT + fn];
    f->name = pool_printf(pool, "%s_c%d", FN_NAMES[fn], c), f->doc = pool_printf(pool, docs[fn], c, sp->cstage[c]);
    f->args = fn >= FN_BACKWARD ? FN_ARGS_BACKWARD : FN_ARGS_FORWARD;
    if (!want[fn]) continue;
    if (f->args == FN_ARGS_BACKWARD) spec_fn(sp, f, bwd, nb, fn, local, pool);
    else spec_fn(sp, f, fwd, nf, fn, local, pool);
  }
}

/* Marks each shape constant some printed call of f names. */
static void mark_shapes(StageSpec *o, const SpecFn *f) {
  for (int i = 0; i < f->ncalls; i++) {
    const Call *k = f->calls[i].call;
    for (int a = 0; a < k->nargs; a++)
      if (k->args[a].kind == ARG_CONST) o->shape_used[k->args[a].i] = 1;
  }
}

static void spec_functions(const Plan *p, const StageProg *sp, StageSpec *o, const int *local, Pool *pool) {

  static const char *const docs[FN_COUNT] = {
      "The forward of the micro-batch in ring slot `slot` (unused by a stage that reads only weights and constants).",
      "The eval forward (run.sh --val): training-mode BatchNorm normalises with its running statistics and\n"
      " * leaves them as they are; Dropout keeps every element.",
      "RECOMPUTE: the forward calls that make the recomputed values again, from what stayed.",
      "",
      "The input-gradient half (zb1's I): everything but the weight gradients.",
      "The weight-gradient half (zb1's W), run later for the same slots.",
      "The optimizer step, before the step's first backward: its weight gradients start from zero.",
      "The optimizer step, at UPDATE once every part is here: a tied weight's gradient is the sum of its\n"
      " * readers' parts in graph order, the same sums on every stage that holds a copy.",
      "The optimizer step, at UPDATE: one update per weight with the run's hyper-parameters (pr_opt)."};
  int role = o->role, split = sched_splits(p->opt.schedule), train = role != ROLE_FWD;
  int want[FN_COUNT] = {role != ROLE_BWD, role != ROLE_BWD && has_eval_variant(sp), sp->recompute != NULL, role != ROLE_FWD,
                        role != ROLE_FWD && split, role != ROLE_FWD && split, train, train, train};
  if (sp->nchunks) { /* a rank of chunks: the forwards and backwards are its chunks' */
    o->chunk_fn = pool_alloc(pool, sizeof(SpecFn) * (size_t)(sp->nchunks * FN_COUNT));
    for (int c = 0; c < sp->nchunks; c++) spec_chunk_fns(p, sp, o, local, c, pool);
    for (int fn = 0; fn < FN_ZERO_GRADS; fn++) want[fn] = 0;
  }
  for (int fn = 0; fn < FN_COUNT; fn++) {
    SpecFn *f = &o->fn[fn];
    f->name = FN_NAMES[fn], f->doc = docs[fn];
    f->args = fn >= FN_ZERO_GRADS ? FN_ARGS_NONE : fn >= FN_BACKWARD ? FN_ARGS_BACKWARD : FN_ARGS_FORWARD;
    if (!want[fn]) continue;
    if (fn >= FN_ZERO_GRADS) spec_fn(sp, f, sp->step, sp->nstep, fn, NULL, pool);
    else if (f->args == FN_ARGS_BACKWARD) spec_fn(sp, f, sp->bwd, sp->nbwd, fn, local, pool);
    else spec_fn(sp, f, sp->fwd, sp->nfwd, fn, local, pool);
    if (fn >= FN_ZERO_GRADS && !f->ncalls) f->present = 0; /* nothing to do: the runtime skips it */
  }
  /* A shape constant is printed where a printed call names it (an unused static constant is a warning). */
  o->shape_used = pool_alloc(pool, (size_t)sp->nshapes + 1);
  memset(o->shape_used, 0, (size_t)sp->nshapes + 1);
  for (int fn = 0; fn < FN_COUNT; fn++) mark_shapes(o, &o->fn[fn]);
  for (int i = 0; o->chunk_fn && i < sp->nchunks * FN_COUNT; i++) mark_shapes(o, &o->chunk_fn[i]);
}

/* The compute nodes [a, e) of stage s: its range; a rank of chunks: each chunk's in turn (into lo/hi, at most nc). */
static int node_ranges(const Plan *p, const StageProg *sp, int *lo, int *hi) {
  if (!sp->nchunks) return lo[0] = p->rbegin[sp->stage], hi[0] = p->rend[sp->stage], 1;
  for (int c = 0; c < sp->nchunks; c++) lo[c] = p->rbegin[sp->cstage[c]], hi[c] = p->rend[sp->cstage[c]];
  return sp->nchunks;
}

/* --profile: each node's key in PROFILE_NODES, and per graph node its row (else -1). */
static int *spec_profile(const Plan *p, const StageProg *sp, StageSpec *o, Pool *pool) {
  const Graph *g = &p->g;
  int lo[64] = {0}, hi[64] = {0}, nr = node_ranges(p, sp, lo, hi), total = 0;
  int *local = pool_alloc(pool, sizeof(int) * (size_t)(g->nn + 1));
  for (int j = 0; j < g->nn; j++) local[j] = -1;
  for (int q = 0; q < nr; q++) total += hi[q] - lo[q];
  o->nprof = total;
  o->prof_nodes = pool_alloc(pool, sizeof(char *) * (size_t)(total + 1));
  int row = 0;
  for (int q = 0; q < nr; q++)
    for (int k = lo[q]; k < hi[q]; k++) {
      char key[PROFILE_KEY_MAX];
      profile_key(g, p->node[k], key, sizeof key);
      local[p->node[k]] = row;
      o->prof_nodes[row++] = pool_strdup(pool, key);
    }
  o->prof_rate = p->machine.dev[sp->nchunks ? sp->cstage[0] : o->stage].flops;
  o->prof_conv = conv_profile_kind(g, p->node + lo[0], hi[0] - lo[0]);
  for (int q = 1; q < nr; q++) {
    int k = conv_profile_kind(g, p->node + lo[q], hi[q] - lo[q]);
    if (k > o->prof_conv) o->prof_conv = k;
  }
  return local;
}

/* The rank value x comes from (recv) or goes to on its route; -1 for the loader's and the loss's. */
static int value_peer(const Plan *p, const StageProg *sp, const Crossing *x, int recv, const int *edge_of) {
  int q = edge_of[x->tensor], s = sp->stage;
  if (x->from_loader) return -1;
  if (p->fb) return recv ? p->fb->links.prev[s] : p->fb->links.next[s];
  /* A rank of chunks: values go stage to stage (relayed), to the rank of the neighbouring stage. */
  if (sp->nchunks) {
    int st = sp->cstage[x->chunk] + (recv ? -1 : 1);
    return st < 0 || st >= p->opt.nstages ? -1 : sched_rank_of(&p->sched, st);
  }
  if (q < 0) return -1;
  int from, to;
  plan_route(p, q, s, &from, &to);
  return recv ? from : to;
}

/* A RECV or SEND table.  A value's tag is its number among the values between the two ranks, the
 * same in both ranks' tables.  edge_of: each tensor's edge (-1), so a table costs O(values). */
static SpecValue *spec_values(const Plan *p, const StageProg *sp, const Crossing *xs, int n, int recv, const int *edge_of, Pool *pool) {
  SpecValue *v = pool_alloc(pool, sizeof(SpecValue) * (size_t)(n + 1));
  for (int i = 0; i < n; i++) {
    const Tensor *t = &p->g.t[xs[i].tensor];
    const Buffer *b = &sp->bufs[xs[i].buf];
    v[i] = (SpecValue){.name = t->name, .shape = pool_strdup(pool, shape_str(t)), .bytes = tensor_bytes(t), .buf = xs[i].buf,
                       .gbuf = xs[i].gbuf, .dtype = t->dtype, .rank = t->rank, .dims = t->dims,
                       .xring = b->kind == BUF_RING && b->fate != FATE_KEEP};
    v[i].source = !xs[i].from_loader ? SRC_PREV : t->dtype == DT_FLOAT ? SRC_IMAGES : SRC_TOKENS;
    v[i].peer = value_peer(p, sp, &xs[i], recv, edge_of);
    v[i].chunk = xs[i].chunk;
    for (int j = 0; j < i; j++) v[i].tag += v[j].peer == v[i].peer;
  }
  return v;
}

static void spec_messages(const Plan *p, const StageProg *sp, StageSpec *o, Pool *pool) {
  int *edge_of = malloc(sizeof(int) * (size_t)(p->g.nt + 1));
  if (!edge_of) abort();
  for (int t = 0; t < p->g.nt; t++) edge_of[t] = -1;
  for (int q = p->nedges - 1; q >= 0; q--) edge_of[p->edge_tensor[q]] = q; /* the first edge of a tensor, as the scan found */
  o->recv = spec_values(p, sp, sp->recv, sp->nrecv, 1, edge_of, pool), o->nrecv = sp->nrecv;
  o->send = spec_values(p, sp, sp->send, sp->nsend, 0, edge_of, pool), o->nsend = sp->nsend;
  free(edge_of);
}

/* PipeFB's messages of this rank: those it sends (mine_from) or receives. */
static SpecFbMsg *fb_list(const Plan *p, const StageProg *sp, const FbMsg *ms, int n, int weight, int mine_from, int *count, Pool *pool) {
  SpecFbMsg *out = pool_alloc(pool, sizeof(SpecFbMsg) * (size_t)(n + 1));
  for (int i = 0; i < n; i++) {
    const FbMsg *m = &ms[i];
    if ((mine_from ? m->from : m->to) != sp->stage) continue;
    int b = pipefb_buf(sp, m, weight);
    out[(*count)++] = (SpecFbMsg){.name = weight ? NULL : m->dloss ? "(the logits' gradient)" : p->g.t[m->tensor].name, .buf = b,
                                  .bytes = sp->bufs[b].bytes, .peer = mine_from ? m->to : m->from, .id = m->id};
  }
  return out;
}

static void spec_pipefb(const Plan *p, const StageProg *sp, StageSpec *o, Pool *pool) {
  const FbPlan *fb = p->fb;
  o->pipefb = 1;
  o->stash_send = fb_list(p, sp, fb->stash, fb->nstash, 0, 1, &o->nstash_send, pool);
  o->stash_recv = fb_list(p, sp, fb->stash, fb->nstash, 0, 0, &o->nstash_recv, pool);
  o->wsend = fb_list(p, sp, fb->w, fb->nw, 1, 1, &o->nwsend, pool);
  o->wrecv = fb_list(p, sp, fb->w, fb->nw, 1, 0, &o->nwrecv, pool);
}

static void spec_params(const Plan *p, const StageProg *sp, StageSpec *o, Pool *pool) {
  o->nparams = sp->nparams;
  o->params = pool_alloc(pool, sizeof(SpecParam) * (size_t)(sp->nparams + 1));
  for (int i = 0; i < sp->nparams; i++) {
    const Buffer *b = &sp->bufs[sp->params[i]];
    int tied = sp->nparts && sp->nparts[i];
    o->params[i] = (SpecParam){.name = p->g.t[b->tensor].name, .buf = sp->params[i], .gbuf = sp->pgrad[i], .m1 = sp->opt1[i],
                               .m2 = sp->opt2[i], .floats = b->bytes / 4, .parts = tied ? sp->parts[i] : NULL,
                               .nparts = tied ? sp->nparts[i] : 0, .layer = freeze_layer_of(p, b->tensor),
                               .grad_in_file = sp->pgrad[i] >= 0 && sp->bufs[sp->pgrad[i]].in_store};
  }
}

/* The memory plan: the rank holding this stage's offloaded values (-1 the file, -2 none: nothing is
 * offloaded) and the stage whose values this rank holds (-1). */
static void spec_memory(const Plan *p, const StageProg *sp, StageSpec *o) {
  int s = o->stage;
  o->memory_plan = sp->nxslots || sp->nstore;
  o->nxslots = sp->nxslots, o->nstore = sp->nstore, o->recomputes = sp->recompute != NULL;
  o->xbase = sp->xbase, o->xstride = sp->xstride, o->xout = sp->xout;
  o->store_base = sp->store_base, o->store_stride = sp->store_stride;
  int host = p->host_of ? p->host_of[s] : -1;
  o->offload_to = sp->xout && stash_offloads(p, s) ? host : -2;
  o->store_owner = -1;
  for (int q = 0; p->host_of && q < p->opt.nstages; q++)
    if (p->host_of[q] == s) o->store_owner = q;
  o->offload_dir = p->opt.offload_dir ? p->opt.offload_dir : "";
  o->opt_store_bytes = sp->opt_out ? sp->opt_store_bytes : 0;
  o->opt_block = sp->opt_block, o->opt_stage_bytes = sp->opt_stage_bytes, o->grad_out = sp->grad_out, o->ngrad_pieces = sp->ngrad_units;
  o->opt_dir = p->opt.opt_offload_dir ? p->opt.opt_offload_dir : "";
  o->replicas = p->opt.replicas > 1 ? p->opt.replicas : 1;
  o->nbuckets = o->replicas > 1 ? sp->nbuckets : 0, o->buckets = sp->buckets;
  o->grad_lo = sp->grad_lo, o->grad_hi = sp->grad_hi, o->reduce_base = sp->reduce_base, o->zero = sp->zero;
  o->shard_floats = o->replicas > 1 ? replica_shard_floats(o->replicas, sp) : 0;
}

static void spec_loss(const StageProg *sp, StageSpec *o) {
  o->loss = NULL, o->loss_buf = o->labels_buf = -1;
  if (!sp->loss || o->role == ROLE_BWD) return;
  o->loss = sp->loss;
  o->loss_buf = sp->loss_buf, o->labels_buf = sp->labels_buf;
  o->loss_rows = sp->loss_rows, o->loss_classes = sp->loss_classes;
}

/* The header's facts, the constants and the descriptor's fields. */
static void spec_facts(const Plan *p, const StageProg *sp, StageSpec *o, int64_t vocab, Pool *pool) {
  const Graph *g = &p->g;
  int s = o->stage, n = p->opt.nstages, a = p->rbegin[s], e = p->rend[s];
  const StageCost *c = &p->part.cost[s];
  o->nstages = n, o->microbatches = p->opt.microbatches, o->role = p->role[s];
  o->mb_size = p->mb_size, o->batch = p->batch / (p->opt.replicas > 1 ? p->opt.replicas : 1), o->nslots = sp->nslots, o->ngslots = sp->ngslots;
  o->threads = p->opt.threads > 1 ? p->opt.threads : 1;
  o->arena_bytes = sp->arena_bytes, o->weights_bytes = sp->weights_bytes;
  o->model = g->path, o->version = PIPECC_VERSION;
  o->target = p->opt.target ? p->opt.target : "cpu", o->precision = p->opt.precision;
  o->node_lo = a, o->node_hi = e - 1, o->first_node = g->n[p->node[a]].name, o->last_node = g->n[p->node[e - 1]].name;
  o->nops = e - a;
  o->ops = pool_alloc(pool, sizeof(char *) * (size_t)(e - a + 1));
  for (int k = a; k < e; k++) o->ops[k - a] = g->n[p->node[k]].op;
  o->last_stage = s == n - 1;
  o->schedule_name = schedule_name(p->opt.schedule);
  o->fwd_time = pool_strdup(pool, fmt_time(c->fwd)), o->bwd_time = pool_strdup(pool, fmt_time(c->bwd));
  o->shared_cores = p->sched.core_of ? p->sched.cores : 0;
  o->pin_core = p->sched.core_of ? p->sched.core_of[s] : 0, o->pin_cores = o->shared_cores;
  o->async = p->sched.unroll > 0;
  o->staleness = p->sched.staleness, o->lookahead = p->sched.lookahead, o->nwversions = sp->nwversions;
  o->wversion_base = sp->wversion_base, o->wversion_stride = sp->wversion_stride;
  o->actions = o->async ? p->sched.body[s] : p->sched.act[s];
  o->nactions = o->async ? p->sched.nbody[s] : p->sched.nact[s];
  const char *opt = p->opt.optimizer ? p->opt.optimizer : "sgd";
  o->optimizer = !strcmp(opt, "sgd") ? OPT_SGD : !strcmp(opt, "adam") ? OPT_ADAM : OPT_ADAMW;
  o->lr = p->opt.have_lr ? p->opt.lr : o->optimizer == OPT_SGD ? 0.01 : 0.001;
  o->momentum = p->opt.momentum, o->weight_decay = p->opt.weight_decay;
  o->vocab = vocab, o->predicted_bytes = c->mem_total, o->predicted_step = p->sched.step_time;
  o->forward_only = p->opt.forward_only;
  o->prev_rank = p->fb ? p->fb->links.prev[s] : s - 1;
  o->next_rank = p->fb ? p->fb->links.next[s] : s + 1 < n ? s + 1 : -1;
  o->loss_rank = p->fb ? p->fb->links.nf - 1 : n - 1;
  o->nfrozen = p->nfrozen, o->nlayers = p->nlayers;
}

/* A rank of chunks: the facts that are the rank's, not one stage's.  Its header names each chunk's stage
 * and nodes; its times are the sums of its chunks' per micro-batch. */
static void spec_chunk_facts(const Plan *p, const StageProg *sp, StageSpec *o, Pool *pool) {
  const Graph *g = &p->g;
  const Schedule *sc = &p->sched;
  int S = p->opt.nstages, nops = 0;
  double fwd = 0, bwd = 0, mem = 0;
  o->nstages = opt_ranks(&p->opt), o->nchunks = sp->nchunks, o->chunk_stage = sp->cstage, o->loss_chunk = sp->loss_chunk;
  o->chunk_line = pool_alloc(pool, sizeof(char *) * (size_t)sp->nchunks);
  for (int c = 0; c < sp->nchunks; c++) nops += p->rend[sp->cstage[c]] - p->rbegin[sp->cstage[c]];
  o->ops = pool_alloc(pool, sizeof(char *) * (size_t)(nops + 1));
  o->nops = 0;
  for (int c = 0; c < sp->nchunks; c++) {
    int st = sp->cstage[c], a = p->rbegin[st], e = p->rend[st];
    const StageCost *k = &p->part.cost[st];
    fwd += k->fwd, bwd += k->bwd, mem += k->mem_total;
    o->chunk_line[c] = pool_printf(pool, "chunk %d: stage %d of %d, nodes %d..%d, %s .. %s (%d slot%s, %d gradient slot%s)", c, st, S, a, e - 1,
                                   g->n[p->node[a]].name, g->n[p->node[e - 1]].name, sp->cslots[c], sp->cslots[c] == 1 ? "" : "s",
                                   sp->cgslots[c], sp->cgslots[c] == 1 ? "" : "s");
    for (int k2 = a; k2 < e; k2++) o->ops[o->nops++] = g->n[p->node[k2]].op;
  }
  o->node_lo = p->rbegin[sp->cstage[0]], o->node_hi = p->rend[sp->cstage[0]] - 1;
  o->first_node = g->n[p->node[o->node_lo]].name, o->last_node = g->n[p->node[o->node_hi]].name;
  o->last_stage = sp->loss_chunk >= 0;
  o->fwd_time = pool_strdup(pool, fmt_time(fwd)), o->bwd_time = pool_strdup(pool, fmt_time(bwd));
  o->predicted_bytes = mem;
  o->prev_rank = sp->cstage[0] == 0 ? -1 : sched_rank_of(sc, sp->cstage[0] - 1);
  o->next_rank = sp->cstage[0] + 1 < S ? sched_rank_of(sc, sp->cstage[0] + 1) : -1;
  o->loss_rank = sched_rank_of(sc, S - 1);
}

void spec_build(const Plan *p, const StageProg *progs, int s, StageSpec *o, Pool *pool) {
  const StageProg *sp = &progs[s];
  memset(o, 0, sizeof *o);
  o->prog = sp, o->stage = s;
  spec_facts(p, sp, o, sp->nchunks ? p->progs[p->opt.nstages - 1].loss_classes : progs[p->opt.nstages - 1].loss_classes, pool);
  if (sp->nchunks) spec_chunk_facts(p, sp, o, pool);
  spec_buffers(p, sp, o, pool);
  const int *local = p->opt.profile ? spec_profile(p, sp, o, pool) : NULL;
  spec_functions(p, sp, o, local, pool);
  spec_loss(sp, o);
  spec_messages(p, sp, o, pool);
  if (p->fb) spec_pipefb(p, sp, o, pool);
  spec_params(p, sp, o, pool);
  spec_memory(p, sp, o);
}

void spec_all(Plan *p) {
  if (!p->progs) return;
  /* With chunks the programs a rank runs are its stages' joined (chunks.c). */
  const StageProg *progs = p->rprogs ? p->rprogs : p->progs;
  int n = opt_ranks(&p->opt);
  p->specs = pool_alloc(&p->g.pool, sizeof(StageSpec) * (size_t)n);
  for (int s = 0; s < n; s++) spec_build(p, progs, s, &p->specs[s], &p->g.pool);
}
