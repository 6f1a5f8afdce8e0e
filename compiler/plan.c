/* plan.c - the compiler's middle: from a loaded model to a partitioned,
 * scheduled plan.  Each step is a pass of its own file; this one only
 * sequences them and gathers what the listing needs. */
#include "plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dagpart.h"
#include "onnx_load.h"
#include "ops.h"
#include "kcache.h"
#include "profile.h"
#include "stageprog.h"
#include "fuse.h"
#include "stash.h"

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

/* Per edge, the positions of its readers, ascending; and the gaps between
 * its producer (node 0 for the loader's) and readers (the loss at N-1)
 * that a stage may fall into and skip. */
static void collect_readers(Plan *p, const int *pos) {
  Graph *g = &p->g;
  Pool *pool = &g->pool;
  int *edge_of = pool_alloc(pool, sizeof(int) * (size_t)g->nt);
  for (int t = 0; t < g->nt; t++) edge_of[t] = -1;
  for (int q = 0; q < p->nedges; q++) edge_of[p->edge_tensor[q]] = q;
  p->ereaders = pool_alloc(pool, sizeof(int *) * (size_t)(p->nedges + 1));
  p->nereaders = pool_alloc(pool, sizeof(int) * (size_t)(p->nedges + 1));
  for (int q = 0; q < p->nedges; q++) p->ereaders[q] = pool_alloc(pool, sizeof(int) * (size_t)(p->nreaders[p->edge_tensor[q]] + 1));
  for (int k = 0; k < p->N; k++) {
    const Node *n = &g->n[p->node[k]];
    for (int r = 0; r < n->nin; r++) {
      int q = n->in[r] >= 0 ? edge_of[n->in[r]] : -1;
      if (q < 0 || (p->nereaders[q] && p->ereaders[q][p->nereaders[q] - 1] == k)) continue;
      p->ereaders[q][p->nereaders[q]++] = k;
    }
  }
  (void)pos;
  p->gaps = pool_alloc(pool, sizeof(PartGap) * (size_t)(p->nedges * 2 + g->nn + 1));
  p->ngaps = 0;
  for (int q = 0; q < p->nedges; q++) {
    const PartEdge *e = &p->edges[q];
    int prev = e->from >= 0 ? e->from : 0;
    for (int r = 0; r <= p->nereaders[q]; r++) {
      int at = r < p->nereaders[q] ? p->ereaders[q][r] : e->to >= p->N ? p->N - 1 : -1;
      if (at < 0) break;
      if (at - prev >= 2) p->gaps[p->ngaps++] = (PartGap){prev, at, e->bytes, e->grad_bytes};
      if (at > prev) prev = at;
    }
  }
}

int plan_reads_range(const Plan *p, int q, int a, int e) {
  if (e >= p->N && p->edges[q].to >= p->N) return 1; /* the loss, on the last stage */
  const int *r = p->ereaders[q];
  int lo = 0, hi = p->nereaders[q];
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (r[mid] < a) lo = mid + 1;
    else hi = mid;
  }
  return lo < p->nereaders[q] && r[lo] < e;
}

/* The rank holding compute node k. */
static int rank_of(const Plan *p, int k) {
  for (int s = 0; s < p->opt.nstages; s++)
    if (p->rbegin[s] <= k && k < p->rend[s]) return s;
  return p->opt.nstages - 1;
}

void plan_route(const Plan *p, int q, int s, int *from, int *to) {
  const PartEdge *e = &p->edges[q];
  int first = e->from >= 0 ? rank_of(p, e->from) : 0, last = e->to >= p->N ? p->opt.nstages - 1 : rank_of(p, e->to);
  *from = *to = -1;
#define ON(r) ((r) == first || ((r) > first && (r) <= last && (!p->direct || plan_reads_range(p, q, p->rbegin[r], p->rend[r]))))
  if (!ON(s)) return;
  for (int r = s - 1; r >= first && *from < 0; r--)
    if (ON(r)) *from = r;
  for (int r = s + 1; r <= last && *to < 0; r++)
    if (ON(r)) *to = r;
#undef ON
}

/* Direct sends: each rank's sources and destinations, from the values' routes.  Each value's route is
 * walked once (its ranks in order, as plan_route sees them) and each consecutive pair joins the lists:
 * O(values x n) rather than a plan_route per (rank, value).  Peers keep the order of the first value
 * that joins them, as before. */
static void route_peers(Plan *p, Schedule *sc) {
  int n = p->opt.nstages;
  Pool *pool = &p->g.pool;
  sc->src = pool_alloc(pool, sizeof(int *) * (size_t)n), sc->dst = pool_alloc(pool, sizeof(int *) * (size_t)n);
  sc->nsrc = pool_alloc(pool, sizeof(int) * (size_t)n), sc->ndst = pool_alloc(pool, sizeof(int) * (size_t)n);
  for (int s = 0; s < n; s++) sc->src[s] = pool_alloc(pool, sizeof(int) * (size_t)n), sc->dst[s] = pool_alloc(pool, sizeof(int) * (size_t)n);
  unsigned char *linked = calloc((size_t)n * (size_t)n, 1); /* [a * n + b]: a sends to b */
  int *route = malloc(sizeof(int) * (size_t)n);
  if (!linked || !route) abort();
  for (int q = 0; q < p->nedges; q++) {
    const PartEdge *e = &p->edges[q];
    int first = e->from >= 0 ? rank_of(p, e->from) : 0, last = e->to >= p->N ? n - 1 : rank_of(p, e->to), len = 0;
    for (int r = first; r <= last; r++)
      if (r == first || !p->direct || plan_reads_range(p, q, p->rbegin[r], p->rend[r])) route[len++] = r;
    for (int i = 0; i + 1 < len; i++) {
      int a = route[i], b = route[i + 1];
      if (linked[(size_t)a * (size_t)n + (size_t)b]) continue;
      linked[(size_t)a * (size_t)n + (size_t)b] = 1;
      sc->dst[a][sc->ndst[a]++] = b, sc->src[b][sc->nsrc[b]++] = a;
    }
  }
  free(linked), free(route);
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
  p->first_read = pool_alloc(&g->pool, sizeof(int) * (size_t)g->nt);
  p->last_read = pool_alloc(&g->pool, sizeof(int) * (size_t)g->nt);
  p->nreaders = pool_alloc(&g->pool, sizeof(int) * (size_t)g->nt);
  for (int i = 0; i < g->nt; i++) p->first_read[i] = p->last_read[i] = -1;
  for (int k = p->N - 1; k >= 0; k--) {
    Node *n = &g->n[p->node[k]];
    for (int q = 0; q < n->nin; q++)
      if (n->in[q] >= 0) {
        if (p->first_read[n->in[q]] != k) p->nreaders[n->in[q]]++; /* a node reading it twice counts once */
        p->first_read[n->in[q]] = k;
        if (p->last_read[n->in[q]] < 0) p->last_read[n->in[q]] = k;
      }
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
  collect_readers(p, pos);
}


/* ---- pricing candidate stages by their arena ---- */

/* Exact prices already computed, by (first node, end, ring slots, gradient
 * ring slots): open addressing, doubled when half full. */
typedef struct PriceKey {
  int i, j, nslots, ngslots;
} PriceKey;
struct PriceMemo {
  PriceKey *key;
  double *val;
  size_t cap, n;
};

static size_t price_hash(PriceKey k, size_t cap) {
  uint64_t h = (uint64_t)k.i * 0x9E3779B97F4A7C15ull ^ (uint64_t)k.j * 0xC2B2AE3D27D4EB4Full ^
               (uint64_t)k.nslots * 0x165667B19E3779F9ull ^ (uint64_t)k.ngslots * 0x27D4EB2F165667C5ull;
  return (size_t)(h ^ h >> 29) & (cap - 1);
}

static double *memo_slot(struct PriceMemo *m, PriceKey k, int *found) {
  if (2 * (m->n + 1) > m->cap) { /* grow */
    struct PriceMemo g = {calloc(m->cap ? 2 * m->cap : 1024, sizeof(PriceKey)), NULL, m->cap ? 2 * m->cap : 1024, 0};
    g.val = malloc(sizeof(double) * g.cap);
    if (!g.key || !g.val) abort();
    for (size_t a = 0; a < m->cap; a++)
      if (m->key[a].j) {
        int f;
        *memo_slot(&g, m->key[a], &f) = m->val[a];
      }
    free(m->key), free(m->val);
    *m = g;
  }
  size_t a = price_hash(k, m->cap);
  while (m->key[a].j && memcmp(&m->key[a], &k, sizeof k)) a = (a + 1) & (m->cap - 1);
  *found = m->key[a].j != 0; /* j >= 1 for every stage, so j = 0 marks an empty entry */
  if (!*found) m->key[a] = k, m->n++;
  return &m->val[a];
}

double plan_price_role(Plan *p, int role, int i, int j) {
  if (!p->memo) {
    p->memo = calloc(1, sizeof *p->memo);
    if (!p->memo) abort();
  }
  PriceKey k = {i, j, -100 - role, 0};
  int found;
  double *v = memo_slot(p->memo, k, &found);
  if (found) return *v;
  Pool tmp = {0};
  StageProg sp;
  if (stage_build(p, &sp, 0, i, j, 0, &tmp)) {
    err_clear();
    *v = INFINITY;
  } else {
    memplan_as(p, &sp, p->opt.microbatches < 2 ? p->opt.microbatches : 2, role == ROLE_FWD ? 1 : 2, role);
    *v = (double)sp.arena_bytes + plan_lib_bytes(p, i, j);
  }
  pool_free(&tmp);
  return *v;
}

/* The arena stage s would lay out if it held compute nodes [i, j): its
 * program built and laid out exactly as the emitted one will be.  A range
 * that cannot be built (a weight shared with another stage) never fits. */
static double price_stage(void *ctx, int s, int i, int j) {
  Plan *p = ctx;
  PriceKey k = {i, j, p->slots.nslots[s], p->slots.ngslots[s]};
  if (p->floor_pricing) k.nslots = -1 - s; /* a floor price is per stage */
  int found;
  double *v = memo_slot(p->memo, k, &found);
  if (found) return *v;
  if (p->floor_pricing) return *v = stash_floor(p, s, i, j) + plan_lib_bytes(p, i, j);
  Pool tmp = {0};
  StageProg sp;
  if (stage_build(p, &sp, s, i, j, 0, &tmp)) {
    err_clear();
    *v = INFINITY;
  } else {
    memplan(p, &sp, k.nslots, k.ngslots);
    *v = (double)sp.arena_bytes + plan_lib_bytes(p, i, j);
  }
  pool_free(&tmp);
  return *v;
}

/* Whether bwd call k of the whole-model program reads buffer b, a value any
 * stage holding both ends of [*lo, *hi] keeps in a ring: an activation its
 * backward reads (from its producer to the reader), or under zb1 a gradient
 * an input-gradient call writes and a weight-gradient call reads (from that
 * reader to the gradient's last writer, its tensor's last reader). */
static int kept_span(const Plan *p, const StageProg *sp, const Call *k, int id, const char *by_i, const int *pos, int *lo, int *hi) {
  const Buffer *b = &sp->bufs[id];
  const Tensor *t = b->tensor >= 0 ? &p->g.t[b->tensor] : NULL;
  int at = pos[k->node];
  if (!t || t->producer < 0) return 0;
  if (b->kind == BUF_RING && !b->is_grad) {
    *lo = pos[t->producer], *hi = at;
    return 1;
  }
  if (p->opt.schedule == SCHED_ZB1 && b->kind == BUF_TEMP && b->is_grad && by_i[id] && call_is_weight(sp, k) &&
      p->last_read[b->tensor] >= at) {
    *lo = at, *hi = p->last_read[b->tensor];
    return 1;
  }
  return 0;
}

/* From the whole model as one program: the values a stage keeps in rings
 * whenever it holds both ends of their span (kept_span), for the
 * partitioner's lower bound.  Each value once, with its narrowest span. */
static void stash_pairs(Plan *p, const StageProg *sp, PartProblem *pr) {
  Graph *g = &p->g;
  int *pos = pool_alloc(&g->pool, sizeof(int) * (size_t)g->nn), *slot = pool_alloc(&g->pool, sizeof(int) * (size_t)sp->nbufs);
  char *by_i = pool_alloc(&g->pool, (size_t)sp->nbufs + 1);
  PartEdge *e = pool_alloc(&g->pool, sizeof(PartEdge) * (size_t)sp->nbufs);
  for (int k = 0; k < p->N; k++) pos[p->node[k]] = k;
  for (int b = 0; b < sp->nbufs; b++) slot[b] = -1;
  for (int j = 0; j < sp->nbwd; j++)
    for (int w = 0; w < sp->bwd[j].nwrites && !call_is_weight(sp, &sp->bwd[j]); w++) by_i[sp->bwd[j].writes[w]] = 1;
  for (int k = 0; k < sp->nbwd; k++)
    for (int r = 0; r < sp->bwd[k].nreads && sp->bwd[k].node >= 0; r++) {
      int id = sp->bwd[k].reads[r], lo, hi;
      if (!kept_span(p, sp, &sp->bwd[k], id, by_i, pos, &lo, &hi)) continue;
      if (slot[id] < 0) slot[id] = pr->nstash++, e[slot[id]] = (PartEdge){lo, hi, (double)sp->bufs[id].bytes, 0};
      PartEdge *x = &e[slot[id]];
      if (hi - lo < x->to - x->from) x->from = lo, x->to = hi;
    }
  pr->stash = e;
}

/* Exact pricing needs every op's kernels; the whole model as one program
 * says whether they are there.  If not, the estimate decides (--plan-only on
 * a model pipecc cannot run yet) and p->mem_note says why. */
static void setup_pricing(Plan *p, PartProblem *pr) {
  Pool tmp = {0};
  StageProg sp;
  if (stage_build(p, &sp, 0, 0, p->N, 0, &tmp)) {
    p->mem_note = pool_printf(&p->g.pool, "estimate: no stage program (%s)", err_msg());
    err_clear();
  } else {
    p->memo = calloc(1, sizeof *p->memo);
    if (!p->memo) abort();
    pr->stage_mem = price_stage, pr->mem_ctx = p;
    pr->ring_copies = p->slots.nslots;
    pr->param_copies = p->opt.forward_only ? 1 : 2 + p->opt_slots;
    stash_pairs(p, &sp, pr);
  }
  pool_free(&tmp);
}

/* Cuts the current node order into stages (partition_solve), pricing
 * candidates by their arenas, and under a memory limit lets stashed values
 * leave where that is faster. */
static int cut_stages(Plan *p, PartProblem *pr) {
  Graph *g = &p->g;
  setup_pricing(p, pr);
  int limited = p->opt.mem_limit > 0;
  for (int s = 0; s < p->opt.nstages; s++) limited |= p->machine.dev[s].mem_bytes > 0;
  /* Async does not move stashed activations (its lists are not the memory plan's). */
  int may_leave = limited && pr->stage_mem && !p->opt.forward_only && p->opt.schedule != SCHED_ASYNC &&
                  (p->opt.offload != OFFLOAD_NONE || p->opt.recompute);
  int plain_fits = partition_solve(pr, &p->part, &g->pool) == 0;
  if (!plain_fits && !may_leave) return -1;
  if (may_leave) {
    /* Price each candidate stage by the least it can hold when its stashed
     * activations leave (stash.c): a cut that fits only so beats an
     * infeasible one, and beats a plain cut that fits if its stages are
     * faster (the plain one may fit only by piling nodes on a rank with room). */
    err_clear();
    Partition plain = p->part;
    stash_floor_slots(p);
    p->floor_pricing = 1;
    int *zero = pool_alloc(&g->pool, sizeof(int) * (size_t)p->opt.nstages);
    const int *copies = pr->ring_copies;
    pr->ring_copies = zero; /* the lower bound counts no ring copies now */
    struct PriceMemo *memo = p->memo;
    p->memo = calloc(1, sizeof *p->memo);
    if (!p->memo) abort();
    int floor_fits = partition_solve(pr, &p->part, &g->pool) == 0;
    if (!floor_fits && !plain_fits) {
      free(memo->key), free(memo->val), free(memo); /* p->memo (the floor prices) goes with plan_free */
      return -1;
    }
    if (!floor_fits || (plain_fits && !(p->part.max_time < plain.max_time * (1 - 1e-6)))) {
      /* The plain cut: priced as it stands. */
      p->part = plain, p->floor_pricing = 0, pr->ring_copies = copies;
      free(p->memo->key), free(p->memo->val), free(p->memo);
      p->memo = memo;
      err_clear();
    } else {
      free(memo->key), free(memo->val), free(memo);
    }
  }
  return 0;
}

/* Forgets what cut_stages decided, so that it can run on another order. */
static void reset_cuts(Plan *p, PartProblem *pr) {
  if (p->memo) free(p->memo->key), free(p->memo->val), free(p->memo);
  p->memo = NULL;
  pr->stage_mem = NULL, pr->mem_ctx = NULL, pr->ring_copies = NULL, pr->param_copies = 0;
  pr->stash = NULL, pr->nstash = 0;
  p->floor_pricing = 0, p->mem_note = NULL;
  memset(&p->part, 0, sizeof p->part);
  err_clear();
}

static const double *permuted(Pool *pool, const double *a, const int *order, int N) {
  double *b = pool_alloc(pool, sizeof(double) * (size_t)N);
  for (int q = 0; q < N; q++) b[q] = a[order[q]];
  return b;
}

/* Puts compute node order[q] at position q: the node list, every per-node
 * array the partitioner reads, the measured times, and the values' ends. */
static void apply_order(Plan *p, PartProblem *pr, const int *order) {
  Pool *pool = &p->g.pool;
  int N = p->N;
  int *node = pool_alloc(pool, sizeof(int) * (size_t)N);
  NodeCost *cost = pool_alloc(pool, sizeof(NodeCost) * (size_t)N);
  for (int q = 0; q < N; q++) node[q] = p->node[order[q]], cost[q] = p->cost[order[q]];
  p->node = node, p->cost = cost;
  pr->fwd_flops = permuted(pool, pr->fwd_flops, order, N), pr->bwd_flops = permuted(pool, pr->bwd_flops, order, N);
  pr->traffic = permuted(pool, pr->traffic, order, N), pr->param_bytes = permuted(pool, pr->param_bytes, order, N);
  pr->stash_bytes = permuted(pool, pr->stash_bytes, order, N), pr->work_bytes = permuted(pool, pr->work_bytes, order, N);
  if (p->costs) {
    Costs *c = p->costs;
    c->fwd = (double *)permuted(pool, c->fwd, order, N), c->bwd_input = (double *)permuted(pool, c->bwd_input, order, N);
    c->bwd_weight = (double *)permuted(pool, c->bwd_weight, order, N);
    if (c->src) {
      char *src = pool_alloc(pool, (size_t)N + 1);
      for (int q = 0; q < N; q++) src[q] = c->src[order[q]];
      c->src = src;
    }
    pr->fwd_s = c->fwd, pr->bwdi_s = c->bwd_input, pr->bwdw_s = c->bwd_weight;
  }
  collect_edges(p);
  pr->edges = p->edges, pr->nedges = p->nedges;
  if (p->direct) pr->gaps = p->gaps, pr->ngaps = p->ngaps;
}

/* The downset DP's view of the plan: who reads each value, and the orders
 * kept.  Autodiff sums a value's gradient over its readers in reverse
 * order of the compute order, and a tied weight's parts in that order
 * too; keeping the readers of every float value (and weight) in their
 * loaded order keeps those sums, and so the trained bits, the same for
 * every -n and plan. */
static void dag_problem(Plan *p, const PartProblem *pr, DagProblem *d) {
  Graph *g = &p->g;
  Pool *pool = &g->pool;
  int *edge_of = pool_alloc(pool, sizeof(int) * (size_t)g->nt), *prev = pool_alloc(pool, sizeof(int) * (size_t)g->nt);
  for (int t = 0; t < g->nt; t++) edge_of[t] = -1, prev[t] = -1;
  for (int e = 0; e < p->nedges; e++) edge_of[p->edge_tensor[e]] = e;
  int cap = 1;
  for (int k = 0; k < p->N; k++) cap += g->n[p->node[k]].nin;
  int *ue = pool_alloc(pool, sizeof(int) * (size_t)cap), *un = pool_alloc(pool, sizeof(int) * (size_t)cap);
  int *ka = pool_alloc(pool, sizeof(int) * (size_t)cap), *kb = pool_alloc(pool, sizeof(int) * (size_t)cap);
  memset(d, 0, sizeof *d);
  d->p = pr, d->use_edge = ue, d->use_node = un, d->keep_a = ka, d->keep_b = kb;
  for (int k = 0; k < p->N; k++) {
    const Node *n = &g->n[p->node[k]];
    for (int q = 0; q < n->nin; q++) {
      int t = n->in[q];
      if (t < 0 || prev[t] == k) continue; /* a node reading a value twice reads it once */
      if (edge_of[t] >= 0) ue[d->nuse] = edge_of[t], un[d->nuse++] = k;
      const Tensor *x = &g->t[t];
      if (prev[t] >= 0 && dtype_is_float(x->dtype) && (!x->data || x->is_param)) ka[d->nkeep] = prev[t], kb[d->nkeep++] = k;
      prev[t] = k;
    }
  }
}

/* The cuts: with --partition dag (and more than one stage), the downset DP
 * finds the best chain of downsets on the estimate; if it beats the loaded
 * order's cuts, the nodes are reordered so that its stages are ranges and
 * cut_stages prices that order by its arenas.  The faster of the two
 * orders is kept, so the DAG never plans worse than the chain. */
static int cut_plan(Plan *p, PartProblem *pr) {
  Pool *pool = &p->g.pool;
  if (p->opt.partition == PARTITION_CHAIN || p->opt.nstages == 1) {
    p->part_note = p->opt.nstages == 1 ? "one stage" : "ranges of the loaded node order (--partition chain)";
    return cut_stages(p, pr);
  }
  DagProblem d;
  DagResult dr;
  dag_problem(p, pr, &d);
  if (dagpart_solve(&d, &dr, pool)) return -1;
  int rc = cut_stages(p, pr);
  double chain = rc ? INFINITY : p->part.max_time;
  p->chain_time = rc ? 0 : chain;
  if (!dr.ok) {
    p->part_note = pool_printf(pool, "ranges of the loaded node order: the graph has more than %d downsets even with its "
                                     "chains contracted, over the downset DP's bound", dr.states);
    return rc;
  }
  const char *over = pool_printf(pool, "%d downsets%s", dr.states, dr.coarse ? " of the graph with its chains contracted (more than " : "");
  if (dr.coarse) over = pool_printf(pool, "%s%d of the graph itself)", over, DAG_MAX_STATES);
  if (!(dr.max_time < chain * (1 - 1e-9))) {
    p->part_note = pool_printf(pool, "downset DP over %s: no chain of them beats the loaded order's ranges, which are kept", over);
    return rc;
  }
  reset_cuts(p, pr);
  apply_order(p, pr, dr.order);
  if (cut_stages(p, pr) == 0 && p->part.max_time < chain * (1 - 1e-9)) {
    p->part_note = pool_printf(pool, "downset DP over %s: independent nodes reordered; slowest stage %s (the loaded "
                                     "order's best: %s)", over, fmt_time(p->part.max_time), rc ? "none fits" : fmt_time(chain));
    return 0;
  }
  /* Its arenas (or the memory plan) made the new order no better: back. */
  int *back = pool_alloc(pool, sizeof(int) * (size_t)p->N);
  for (int q = 0; q < p->N; q++) back[dr.order[q]] = q;
  reset_cuts(p, pr);
  apply_order(p, pr, back);
  p->part_note = pool_printf(pool, "downset DP over %s: its best order was no faster once its stages' arenas were laid "
                                   "out; the loaded order's ranges are kept", over);
  return cut_stages(p, pr);
}

int plan_build(Plan *p, const Options *o) {
  memset(p, 0, sizeof *p);
  p->opt = *o;
  if (onnx_load_file(o->model, &p->g)) return -1;
  p->g.conv_impl = o->conv_impl;
  return plan_from_graph(p);
}

/* A run-time tensor with a zero-sized axis (an empty Slice, a Reshape to 0)
 * has nothing to train on and would divide by zero in the rules that take
 * rows = numel / last axis: refuse it, naming the node. */
static int check_nonempty(Graph *g) {
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

int plan_from_graph(Plan *p) {
  const Options *o = &p->opt;
  Graph *g = &p->g;
  if (bind_inputs(p)) return -1;
  if (infer_and_fold(g)) {
    /* Name the file too: the node alone may not say which model. */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", err_msg());
    err_clear();
    return err_set("%s: %s", g->path, msg);
  }
  if (check_nonempty(g)) return -1;
  if (o->untie && untie_merged(g)) return -1;
  if (!o->no_fuse) p->nfused = fuse_graph(g);
  p->node = pool_alloc(&g->pool, sizeof(int) * (size_t)g->nn);
  for (int j = 0; j < g->nn; j++)
    if (!g->n[j].folded) p->node[p->N++] = j;
    else if (!g->n[j].fused) p->nfolded++;
  if (!p->N) return err_set("%s: every node is a constant; there is nothing to train", g->path);
  if (freeze_apply(p)) return -1; /* the layers; with --frozen, the first N frozen */
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
  /* --threads T on this machine's probe: GEMM, which most of the FLOPs are, splits over T cores about
   * evenly, so the FLOP model takes T times the one-core rate (a --devices file gives each rank's own
   * rate; the kernel cache's times at T threads, pipecc-probe --kernels --threads T, replace it). */
  if (o->threads > 1 && !o->devices)
    for (int r = 0; r < p->machine.nranks; r++) p->machine.dev[r].flops *= o->threads;
  /* oneDNN's scratch memory is in each convolution's workspace (conv.c); its code and descriptors are
   * beside the arena, and a memory limit counts them (plan_lib_bytes). */
  {
    int lib = 0;
    for (int k = 0; k < p->N; k++) lib += ir_conv_by_impl(g, &g->n[p->node[k]]);
    if (lib && g->conv_impl != CONV_GEMM)
      p->conv_note = "oneDNN: scratch memory in the arena; code and descriptors beside it, 96 KiB a convolution, "
                     "counted against a memory limit";
    else if (lib && o->conv_fallback)
      p->conv_note = "im2col + GEMM: no plan fits the memory limit with oneDNN's 96 KiB a convolution beside the arena";
  }
  const char *opt = o->optimizer ? o->optimizer : "sgd";
  p->opt_slots = !strcmp(opt, "sgd") ? (o->momentum > 0 ? 1 : 0) : 2;
  PartProblem *pr = &p->prob;
  pr->N = p->N;
  pr->fwd_flops = arr[0], pr->bwd_flops = arr[1], pr->traffic = arr[2];
  pr->param_bytes = arr[3], pr->stash_bytes = arr[4], pr->work_bytes = arr[5];
  pr->edges = p->edges, pr->nedges = p->nedges;
  /* Direct sends: a value goes only to the ranks that read it (pipefb's chains relay). */
  p->direct = !o->relay && o->schedule != SCHED_PIPEFB;
  if (p->direct) pr->gaps = p->gaps, pr->ngaps = p->ngaps;
  pr->nstages = o->nstages, pr->microbatches = p->opt.microbatches, pr->schedule = o->schedule;
  pr->opt_state_per_param = p->opt_slots;
  pr->machine = &p->machine;
  pr->mem_limit = o->mem_limit;
  if (o->costs) {
    Costs *c = p->costs = pool_alloc(&g->pool, sizeof *c);
    if (costs_load(c, o->costs, p, &g->pool)) return -1;
    /* Convolutions timed through oneDNN say nothing of im2col + GEMM (a plan under a memory limit
     * may fall back to it), nor the other way: theirs come from the FLOP model. */
    c->conv_mismatch = c->conv && c->conv != (g->conv_impl == CONV_GEMM ? 1 : 2);
    for (int q = 0; q < p->N && c->conv_mismatch; q++)
      if (ir_conv_by_impl(g, &g->n[p->node[q]]))
        kcache_flop_node(pr, q, c->rate, p->machine.memcpy_bw, &c->fwd[q], &c->bwd_input[q], &c->bwd_weight[q]);
    pr->fwd_s = c->fwd, pr->bwdi_s = c->bwd_input, pr->bwdw_s = c->bwd_weight;
    pr->time_rate = c->rate, pr->load_s = c->load, pr->loss_s = c->loss, pr->update_per_byte = c->update_per_param / 4;
    kcache_merge(p, c); /* the profile's times, under each node's shape key, for later plans */
  } else {
    kcache_apply(p, pr); /* nodes the kernel cache has times for (kcache.c); nothing changes when it has none */
  }
  /* Frozen layers: backwards that no longer run, weight gradients no longer made. */
  if (o->frozen) freeze_costs(p, arr[1], p->costs ? p->costs->bwd_input : NULL, p->costs ? p->costs->bwd_weight : NULL);
  if (o->schedule == SCHED_PIPEFB) return pipefb_plan(p);
  if (o->schedule == SCHED_ASYNC)
    for (int t = 0; t < g->nt; t++)
      if (g->t[t].is_param && p->nreaders[t] > 1)
        return err_set("--schedule async: weight '%s' is read by %d nodes (tied); async does not version tied weights yet "
                       "(use 1f1b, or --untie if an exporter merged them)", g->t[t].name, p->nreaders[t]);
  /* Ring sizes come from the order of each rank's actions, not from times:
   * the unit-time lists (the listing's table) give them before the cuts. */
  StageCost *unit = pool_alloc(&g->pool, sizeof(StageCost) * (size_t)o->nstages);
  for (int s = 0; s < o->nstages; s++) {
    unit[s].fwd = 1, unit[s].bwd = o->schedule == SCHED_ZB1 ? 2 : 1, unit[s].bwd_w = unit[s].bwd / 2;
  }
  if (o->schedule == SCHED_ASYNC) {
    if (schedule_build_async(&p->slots, o->nstages, p->opt.microbatches, o->staleness, unit, &g->pool)) return -1;
  } else {
    schedule_build(&p->slots, o->schedule, o->nstages, p->opt.microbatches, o->forward_only, unit, &g->pool);
  }
  if (cut_plan(p, pr)) return -1;
  p->rbegin = pool_alloc(&g->pool, sizeof(int) * (size_t)o->nstages);
  p->rend = pool_alloc(&g->pool, sizeof(int) * (size_t)o->nstages);
  p->role = pool_alloc(&g->pool, sizeof(int) * (size_t)o->nstages);
  for (int s = 0; s < o->nstages; s++) p->rbegin[s] = p->part.start[s], p->rend[s] = p->part.start[s + 1], p->role[s] = ROLE_BOTH;
  if (o->schedule == SCHED_ASYNC) {
    if (schedule_build_async(&p->sched, o->nstages, p->opt.microbatches, o->staleness, p->part.cost, &g->pool)) return -1;
  } else {
    schedule_build(&p->sched, o->schedule, o->nstages, p->opt.microbatches, o->forward_only, p->part.cost, &g->pool);
  }
  p->sched.cores = plan_core_groups(p);
  if (p->direct) route_peers(p, &p->sched);
  /* A rank of several threads is not pinned to one core (the runtime pins only single-threaded ranks). */
  if (!schedule_time(&p->sched, p->part.cost) && o->threads <= 1) schedule_pin(&p->sched, p->part.cost, &g->pool);
  err_clear(); /* a stall is reported by schedule_validate, with names */
  if (schedule_validate(&p->sched)) return -1;
  for (int s = 0; s < o->nstages; s++)
    if (p->sched.nslots[s] != p->slots.nslots[s] || p->sched.ngslots[s] != p->slots.ngslots[s])
      return err_set("internal error: stage %d's ring sizes depend on its times (%d/%d slots, %d/%d with unit times)", s,
                     p->sched.nslots[s], p->sched.ngslots[s], p->slots.nslots[s], p->slots.ngslots[s]);
  return 0;
}

/* Async keeps older copies of the weights region for the steps that
 * compute on them; state a forward updates there (BatchNorm's running
 * statistics) would be updated in a copy and lost.  Refused. */
static int forward_writes_state(Plan *p, const StageProg *sp) {
  for (int i = 0; i < sp->nfwd; i++)
    for (int w = 0; w < sp->fwd[i].nwrites; w++) {
      const Buffer *b = &sp->bufs[sp->fwd[i].writes[w]];
      if (b->kind == BUF_RING || b->kind == BUF_GRING || b->kind == BUF_TEMP || b->kind == BUF_LABELS || b->offset >= sp->weights_bytes) continue;
      int node = sp->fwd[i].node;
      return err_set("--schedule async: node '%s' (%s) updates state in its forward ('%s', such as BatchNorm's running statistics); "
                     "async does not version such state yet (use 1f1b, or export the model in eval mode)",
                     node >= 0 ? p->g.n[node].name : "?", node >= 0 ? p->g.n[node].op : "?", b->tensor >= 0 ? p->g.t[b->tensor].name : b->name);
    }
  return 0;
}

int plan_programs(Plan *p) {
  int n = p->opt.nstages;
  StageProg *progs = pool_alloc(&p->g.pool, sizeof(StageProg) * (size_t)n);
  if (autodiff_build(p, progs, &p->g.pool)) {
    if (!p->opt.plan_only) return -1;
    if (!p->mem_note) p->mem_note = pool_printf(&p->g.pool, "estimate: no stage program (%s)", err_msg());
    err_clear();
    return 0;
  }
  p->progs = progs;
  if (p->fb && pipefb_links(p, progs, p->fb, &p->g.pool)) return -1;
  p->arena = pool_alloc(&p->g.pool, sizeof(int64_t) * (size_t)n);
  for (int s = 0; s < n; s++) {
    memplan(p, &progs[s], p->sched.nslots[s], p->sched.ngslots[s]);
    plan_stage_memory(p, s);
    if (p->opt.schedule == SCHED_ASYNC && forward_writes_state(p, &progs[s])) return -1;
  }
  p->mem_note = NULL;
  return 0;
}

void plan_stage_memory(Plan *p, int s) {
  const StageProg *sp = &p->progs[s];
  StageCost *c = &p->part.cost[s];
  p->arena[s] = sp->arena_bytes;
  /* The listing states the arena, by what it holds. */
  c->mem_params = (double)sp->mem_weights, c->mem_grads = (double)sp->mem_grads, c->mem_opt = (double)sp->mem_opt;
  c->mem_stash = (double)sp->mem_stash, c->mem_recv = (double)sp->mem_cross, c->mem_work = (double)sp->mem_temps;
  c->mem_total = (double)sp->arena_bytes;
  c->copies = sp->nslots, c->gcopies = sp->ngslots;
  c->mem_versions = (double)sp->mem_versions;
}

/* Draws of the step simulation under the measured spread of action times (schedule_jitter): 64 put
 * the mean step within ~0.3% of a 4096-draw mean on the sample GPT at n = 2. */
enum { PLAN_JITTER_DRAWS = 64 };

int plan_jitter(Plan *p) {
  double cv = p->costs ? p->costs->jitter : 0;
  /* Pinned ranks: the listing gives the unpinned estimate beside, for the lists as they now are. */
  if (p->sched.core_of) {
    int *pin = p->sched.core_of;
    p->sched.core_of = NULL;
    int rc = schedule_time(&p->sched, p->part.cost);
    p->sched.step_unpinned = rc ? 0 : p->sched.step_time;
    p->sched.core_of = pin;
    if (rc || schedule_time(&p->sched, p->part.cost)) return -1;
  }
  /* Nothing measured: the figures stand.  pipefb's lists are simulated with costs of their own (pipefb.c). */
  if (cv <= 0 || p->sched.fb) return 0;
  return schedule_jitter(&p->sched, p->part.cost, cv, PLAN_JITTER_DRAWS);
}

/* oneDNN's convolutions hold their code and descriptors outside the arena (conv_dnnl.c; their scratch
 * memory is in the arena): 70 KiB a convolution measured on the sample ResNet (its -n 1 run's overhead
 * against --conv gemm), allowed 96 KiB. */
enum { PLAN_DNNL_CONV_BYTES = 96 << 10 };

double plan_lib_bytes(const Plan *p, int i, int j) {
  double b = 0;
  for (int k = i; k < j; k++) b += ir_conv_lib(&p->g, &p->g.n[p->node[k]]) ? PLAN_DNNL_CONV_BYTES : 0;
  return b;
}

int plan_core_groups(const Plan *p) {
  int c = p->machine.cores, t = p->opt.threads > 1 ? p->opt.threads : 1;
  return c <= 0 ? 0 : c / t > 0 ? c / t : 1;
}

/* What stage s's arena may take: the limit, less what its convolutions' library holds beside the arena
 * once the cut is made (the partitioner's prices add it instead). */
double plan_stage_limit(const Plan *p, int s) {
  double lim = p->machine.dev[s].mem_bytes;
  if (p->opt.mem_limit > 0 && (lim <= 0 || p->opt.mem_limit < lim)) lim = p->opt.mem_limit;
  if (lim > 0 && p->progs && p->part.start) lim -= plan_lib_bytes(p, p->part.start[s], p->part.start[s + 1]);
  return lim;
}

void plan_free(Plan *p) {
  if (p->memo) free(p->memo->key), free(p->memo->val), free(p->memo);
  ir_free(&p->g);
}

int plan_tie_readers(const Plan *p, int t, int *ks, int *same_kind) {
  int n = 0;
  *same_kind = 0;
  for (int k = 0; k < p->N; k++) {
    const Node *nd = &p->g.n[p->node[k]];
    int reads = 0;
    for (int q = 0; q < nd->nin; q++) reads |= nd->in[q] == t;
    if (!reads) continue;
    /* Slices of one weight (torch's LSTM export reorders its gates so) are parts, not an exporter's merge. */
    for (int j = 0; j < n; j++) *same_kind |= p->g.n[p->node[ks[j]]].def == nd->def && !(nd->def->flags & OPF_READS_PART);
    ks[n++] = k;
  }
  return n;
}
