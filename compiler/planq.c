/* planq.c - questions about a plan: who reads a value, its route through
 * the ranks, tied weights, the gradients needed, a stage's memory limit. */
#include "planq.h"

#include <stdlib.h>

#include "ops.h"
#include "ops/conv.h"
#include "stageprog.h"

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
void plan_route_peers(Plan *p, Schedule *sc) {
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

void plan_stage_memory(Plan *p, int s) {
  const StageProg *sp = &p->progs[s];
  StageCost *c = &p->part.cost[s];
  p->arena[s] = sp->arena_bytes;
  /* The listing states the arena, by what it holds. */
  c->mem_params = (double)sp->mem_weights, c->mem_grads = (double)sp->mem_grads, c->mem_opt = (double)sp->mem_opt;
  c->mem_stash = (double)sp->mem_stash, c->mem_recv = (double)sp->mem_cross, c->mem_work = (double)sp->mem_temps;
  c->mem_total = (double)sp->arena_bytes;
  c->copies = sp->nslots, c->gcopies = sp->ngslots, c->wcopies = sp->nwslots;
  c->mem_versions = (double)sp->mem_versions;
}


double plan_lib_bytes(const Plan *p, int i, int j) {
  double b = 0;
  for (int k = i; k < j; k++) b += conv_beside_bytes(&p->g, &p->g.n[p->node[k]]);
  return b;
}

int plan_core_groups(const Plan *p) {
  /* --replicas R: the replicas share the host's cores evenly, each its R-th (run.sh starts them all on it). */
  int c = p->machine.cores, t = (p->opt.threads > 1 ? p->opt.threads : 1) * (p->opt.replicas > 1 ? p->opt.replicas : 1);
  return c <= 0 ? 0 : c / t > 0 ? c / t : 1;
}

int plan_limited(const Plan *p) {
  int limited = p->opt.mem_limit > 0;
  for (int s = 0; s < p->opt.nstages; s++) limited |= p->machine.dev[s].mem_bytes > 0;
  return limited;
}

/* What stage s's arena may take: the limit, less what its convolutions' library holds beside the arena
 * once the cut is made (the partitioner's prices add it instead). */
/* The smaller of a device's memory and --mem-limit, either 0 for none. */
static double capped(double dev, double limit) { return limit > 0 && (dev <= 0 || limit < dev) ? limit : dev; }

double plan_stage_limit(const Plan *p, int s) {
  /* --chunks V: a rank holds V stages, each cut to its share (machine_spread gives each stage 1/V of its rank's
   * memory; the joined arena is checked whole, plan_rank_limit). */
  double lim = capped(p->machine.dev[s].mem_bytes, p->opt.chunks > 1 ? p->opt.mem_limit / p->opt.chunks : p->opt.mem_limit);
  if (lim > 0 && p->progs && p->part.start) lim -= plan_lib_bytes(p, p->part.start[s], p->part.start[s + 1]);
  return lim;
}

double plan_rank_limit(const Plan *p, int r) {
  if (p->opt.chunks <= 1) return plan_stage_limit(p, r);
  double lim = capped(p->machine.dev[sched_stage(&p->sched, r, 0)].mem_bytes * p->opt.chunks, p->opt.mem_limit);
  for (int c = 0; lim > 0 && p->progs && p->part.start && c < p->opt.chunks; c++) {
    int s = sched_stage(&p->sched, r, c);
    lim -= plan_lib_bytes(p, p->part.start[s], p->part.start[s + 1]);
  }
  return lim;
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
