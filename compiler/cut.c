/* cut.c - the cuts: the current node order cut into stages by
 * partition_solve, candidates priced by their arenas (price.c), under a
 * memory limit by the least they hold when stashed values leave; with
 * --partition dag the downset DP's order is tried too, and the faster of
 * the two orders kept. */
#include "cut.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff.h"
#include "dagpart.h"
#include "edges.h"
#include "memplan.h"
#include "planq.h"
#include "price.h"
#include "profile.h"
#include "stash.h"

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
  if (sched_splits(p->opt.schedule) && b->kind == BUF_TEMP && b->is_grad && by_i[id] && call_is_weight(sp, k) &&
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
/* Ring copies the lower bound may count per stage: under zb1 the fewest of either layout's (the hold one's
 * forward ring; the late one's forward ring or late ring, whichever is smaller), since a stage takes the
 * smaller layout (memplan.c). */
static const int *bound_copies(Plan *p) {
  if (!sched_splits(p->opt.schedule) || !p->slots.rings) return p->slots.nslots;
  int n = p->opt.nstages, *c = pool_alloc(&p->g.pool, sizeof(int) * (size_t)n);
  for (int s = 0; s < n; s++) {
    RingSizes r = p->slots.rings[s];
    int late = r.wslots && r.wslots < r.slots ? r.wslots : r.slots;
    c[s] = late < r.hslots ? late : r.hslots;
  }
  return c;
}

static void setup_pricing(Plan *p, PartProblem *pr) {
  Pool tmp = {0};
  StageProg sp;
  if (stage_build(p, &sp, 0, 0, p->N, 0, &tmp)) {
    p->mem_note = pool_printf(&p->g.pool, "estimate: no stage program (%s)", err_msg());
    err_clear();
  } else {
    p->memo = price_memo_new();
    pr->stage_mem = price_stage, pr->mem_ctx = p;
    pr->ring_copies = bound_copies(p);
    pr->param_copies = p->opt.forward_only ? 1 : 2 + pr->opt_state_per_param * (pr->zero_share > 0 ? pr->zero_share : 1) + pr->reduce_share;
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
  int limited = plan_limited(p);
  /* Async and the chunked schedules do not move stashed activations (their lists are not the memory plan's). */
  int may_leave = limited && pr->stage_mem && !p->opt.forward_only && p->opt.schedule != SCHED_ASYNC && !sched_chunked(p->opt.schedule) &&
                  (p->opt.offload != OFFLOAD_NONE || p->opt.recompute || p->opt.opt_offload != OPTOFF_NONE);
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
    double param_copies = pr->param_copies;
    if (p->opt.opt_offload != OPTOFF_NONE && pr->param_copies > 1) pr->param_copies = 1; /* nor state and gradients that may leave */
    struct PriceMemo *memo = p->memo;
    p->memo = price_memo_new();
    int floor_fits = partition_solve(pr, &p->part, &g->pool) == 0;
    if (!floor_fits && !plain_fits) {
      price_memo_free(memo); /* p->memo (the floor prices) goes with plan_free */
      /* The leanest cut's fullest stage: what it holds when everything that can move does. */
      int full = 0;
      for (int s = 1; s < p->opt.nstages; s++)
        if (price_stage(p, s, p->part.start[s], p->part.start[s + 1]) > price_stage(p, full, p->part.start[full], p->part.start[full + 1])) full = s;
      const char *what = stash_floor_what(p, full, p->part.start[full], p->part.start[full + 1]);
      if (*what) {
        char *msg = pool_printf(&g->pool, "%s%s", err_msg(), what);
        err_clear();
        err_set("%s", msg);
      }
      return -1;
    }
    if (!floor_fits || (plain_fits && !(p->part.max_time < plain.max_time * (1 - 1e-6)))) {
      /* The plain cut: priced as it stands. */
      p->part = plain, p->floor_pricing = 0, pr->ring_copies = copies, pr->param_copies = param_copies;
      price_memo_free(p->memo);
      p->memo = memo;
      err_clear();
    } else {
      price_memo_free(memo);
    }
  }
  return 0;
}

/* Forgets what cut_stages decided, so that it can run on another order. */
static void reset_cuts(Plan *p, PartProblem *pr) {
  price_memo_free(p->memo);
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
  plan_edges(p);
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
int cut_plan(Plan *p, PartProblem *pr) {
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
