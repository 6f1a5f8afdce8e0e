/* pipefb.c - PipeFB: forwards on some ranks, backwards on others.
 *
 * Ranks 0..nf-1 run only forwards, a chain that ends in the loss; ranks
 * nf..n-1 run only backwards, a chain that carries gradients back (rank n-1
 * holds the last layers).  The two chains are cut independently: a forward
 * costs about half a backward, so fewer forward ranks with more layers each
 * balance more backward ranks with fewer.  Each forward rank sends every
 * value a backward rank's program reads from the forward (its stash) straight
 * to that rank, once; the backward ranks own the weight gradients and the
 * optimizer, update, and send the new weights to the forward ranks that read
 * them, which wait for them before the next step - so a step computes
 * exactly what 1F1B computes with the same micro-batches, bit for bit.
 *
 * The planner tries every nf (or --fb-split's), cuts each chain with the
 * partition DP (forwards alone, backwards alone), builds the programs to
 * find the messages, simulates the lists and keeps the fastest. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pipefb.h"

#include "autodiff.h"
#include "memplan.h"
#include "planq.h"
#include "price.h"

static int rank_of(const Plan *p, int role, int k) {
  for (int r = 0; r < p->opt.nstages; r++)
    if (p->role[r] == role && p->rbegin[r] <= k && k < p->rend[r]) return r;
  return -1;
}

/* The buffer of rank r's program holding tensor t's forward value, or -1. */
static int value_buf(const StageProg *sp, int t) {
  for (int i = 0; i < sp->nbufs; i++)
    if (sp->bufs[i].tensor == t && !sp->bufs[i].is_grad && sp->bufs[i].kind != BUF_TEMP && sp->bufs[i].kind != BUF_LABELS) return i;
  return -1;
}

int pipefb_buf(const StageProg *sp, const FbMsg *m, int weight) {
  if (weight) {
    for (int i = 0; i < sp->nparams; i++)
      if (sp->bufs[sp->params[i]].tensor == m->tensor) return sp->params[i];
    return -1;
  }
  return m->dloss ? sp->dloss_buf : value_buf(sp, m->tensor);
}

static int read_by_backward(const StageProg *sp, int id) {
  for (int k = 0; k < sp->nbwd; k++)
    for (int r = 0; r < sp->bwd[k].nreads; r++)
      if (sp->bwd[k].reads[r] == id) return 1;
  return 0;
}

static void add_link(int **list, int *n, int rank) {
  for (int i = 0; i < *n; i++)
    if ((*list)[i] == rank) return;
  (*list)[(*n)++] = rank;
}

int pipefb_links(Plan *p, StageProg *progs, FbPlan *fb, Pool *pool) {
  const Graph *g = &p->g;
  int n = p->opt.nstages, nf = fb->links.nf;
  int *kof = pool_alloc(pool, sizeof(int) * (size_t)(g->nn + 1)); /* graph node -> compute index */
  for (int j = 0; j < g->nn; j++) kof[j] = -1;
  for (int k = 0; k < p->N; k++) kof[p->node[k]] = k;
  FbLinks *L = &fb->links;
  fb_links_init(L, n, nf, pool);
  int cap = 16, capw = 16;
  fb->nstash = fb->nw = 0;
  fb->stash = pool_alloc(pool, sizeof(FbMsg) * (size_t)cap);
  fb->w = pool_alloc(pool, sizeof(FbMsg) * (size_t)capw);
  fb->stash_bytes = pool_alloc(pool, sizeof(double) * (size_t)n);
  for (int b = nf; b < n; b++) {
    const StageProg *sp = &progs[b];
    for (int i = 0; i < sp->nbufs; i++) {
      const Buffer *bf = &sp->bufs[i];
      int dloss = i == sp->dloss_buf;
      if (!dloss && (bf->kind != BUF_RING || bf->is_grad || bf->tensor < 0 || !read_by_backward(sp, i))) continue;
      if (dloss && !read_by_backward(sp, i)) continue;
      int t = bf->tensor, from;
      if (dloss) from = nf - 1;
      else if (g->t[t].is_input || g->t[t].producer < 0) from = 0;
      else from = rank_of(p, ROLE_FWD, kof[g->t[t].producer]);
      if (from < 0) return err_set("pipefb: no forward rank computes '%s', which rank %d's backward reads", g->t[t].name, b);
      int fbid = dloss ? progs[from].dloss_buf : value_buf(&progs[from], t);
      if (fbid < 0 || progs[from].bufs[fbid].kind != BUF_RING)
        return err_set("pipefb: internal error: forward rank %d does not keep '%s' for rank %d", from, g->t[t].name, b);
      if (fb->nstash == cap) fb->stash = pool_realloc(pool, fb->stash, sizeof(FbMsg) * (size_t)(cap *= 2));
      fb->stash[fb->nstash] = (FbMsg){t, from, b, fb->nstash, dloss};
      fb->nstash++;
      fb->stash_bytes[from] += (double)bf->bytes, fb->stash_bytes[b] += (double)bf->bytes;
      add_link(&L->stash_to[from], &L->nstash_to[from], b);
      add_link(&L->stash_from[b], &L->nstash_from[b], from);
    }
  }
  /* Weights: each is read by one node (tied weights are refused), whose backward rank updates it. */
  for (int f = 0; f < nf; f++) {
    const StageProg *sp = &progs[f];
    for (int i = 0; i < sp->nparams; i++) {
      int t = sp->bufs[sp->params[i]].tensor, owner = -1;
      for (int k = p->rbegin[f]; k < p->rend[f] && owner < 0; k++) {
        const Node *nd = &g->n[p->node[k]];
        for (int q = 0; q < nd->nin; q++)
          if (nd->in[q] == t) owner = rank_of(p, ROLE_BWD, k);
      }
      if (owner < 0) return err_set("pipefb: internal error: no backward rank updates '%s'", g->t[t].name);
      if (fb->nw == capw) fb->w = pool_realloc(pool, fb->w, sizeof(FbMsg) * (size_t)(capw *= 2));
      fb->w[fb->nw] = (FbMsg){t, owner, f, fb->nw, 0};
      fb->nw++;
      add_link(&L->w_from[f], &L->nw_from[f], owner);
      add_link(&L->w_to[owner], &L->nw_to[owner], f);
    }
  }
  return 0;
}

/* The DP's price of a candidate rank: its role's arena. */
typedef struct Pricing {
  Plan *p;
  int role;
} Pricing;

static double price(void *ctx, int s, int i, int j) {
  (void)s;
  const Pricing *c = ctx;
  return plan_price_role(c->p, c->role, i, j);
}

/* Cuts `chain` ranks (forward or backward alone) over the compute nodes: the
 * partition DP on the plan's problem with the other half priced at zero, the
 * chain's own ranks' figures, and each candidate rank priced by its role's
 * arena where a memory limit applies. */
static int cut_chain(Plan *p, int only, int first, int nranks, Partition *out, Machine *mach) {
  PartProblem pr = p->prob;
  Pricing ctx = {p, only == PART_FORWARD ? ROLE_FWD : ROLE_BWD};
  int *two = pool_alloc(&p->g.pool, sizeof(int) * (size_t)nranks);
  for (int r = 0; r < nranks; r++) two[r] = p->opt.microbatches < 2 ? p->opt.microbatches : 2;
  *mach = p->machine;
  for (int r = 0; r < nranks; r++) {
    mach->dev[r] = p->machine.dev[first + r];
    if (first + r < MAX_RANKS) mach->link[r] = p->machine.link[first + r];
  }
  mach->nranks = nranks;
  pr.machine = mach;
  pr.nstages = nranks, pr.only = only;
  pr.stage_mem = price, pr.mem_ctx = &ctx, pr.ring_copies = two, pr.mem_limit = p->opt.mem_limit;
  pr.param_copies = only == PART_FORWARD ? 1 : 2 + p->opt_slots;
  pr.stash = NULL, pr.nstash = 0;
  pr.schedule = SCHED_1F1B;
  return partition_solve(&pr, out, &p->g.pool);
}

/* One candidate: nf forward ranks.  Fills the plan's ranges, programs,
 * links, costs and schedule; its predicted step in *step. */
static int try_split(Plan *p, int nf, FbPlan *fb, StageCost *cost, Schedule *sc, double *step) {
  int n = p->opt.nstages, nb = n - nf;
  Machine mf, mb;
  Partition pf, pb;
  int rf = cut_chain(p, PART_FORWARD, 0, nf, &pf, &mf);
  double need = rf ? pf.max_time : 0;
  err_clear();
  int rb = cut_chain(p, PART_BACKWARD, nf, nb, &pb, &mb);
  if (rb) need = fmax(need, pb.max_time);
  if (rf || rb) { /* no cut fits: the least limit this split needs */
    err_clear();
    *step = need;
    return 1;
  }
  for (int r = 0; r < n; r++) {
    int fwd = r < nf, j = fwd ? r : r - nf;
    const Partition *pp = fwd ? &pf : &pb;
    p->role[r] = fwd ? ROLE_FWD : ROLE_BWD;
    p->rbegin[r] = pp->start[j], p->rend[r] = pp->start[j + 1];
    cost[r] = pp->cost[j];
  }
  StageProg *progs = pool_alloc(&p->g.pool, sizeof(StageProg) * (size_t)n);
  for (int r = 0; r < n; r++)
    if (stage_build(p, &progs[r], r, p->rbegin[r], p->rend[r], 0, &p->g.pool)) return -1;
  fb->links.nf = nf;
  if (pipefb_links(p, progs, fb, &p->g.pool)) return -1;
  /* Each stash message crosses a link once per micro-batch: charge it to both ends. */
  for (int r = 0; r < n; r++) {
    const Link *l = &p->machine.link[r < n - 1 ? r : n - 2 >= 0 ? n - 2 : 0];
    cost[r].comm += fb->stash_bytes[r] / l->bandwidth;
    cost[r].time = cost[r].fwd + cost[r].bwd + cost[r].comm;
  }
  schedule_build_pipefb(sc, &fb->links, n, p->opt.microbatches, cost, &p->g.pool);
  sc->cores = plan_core_groups(p);
  if (schedule_time(sc, cost) || (p->opt.threads <= 1 && schedule_pin(sc, cost, &p->g.pool))) return -1;
  *step = sc->step_time;
  return 0;
}

int pipefb_plan(Plan *p) {
  int n = p->opt.nstages;
  Graph *g = &p->g;
  if (n < 2) return err_set("--schedule pipefb needs at least 2 ranks (-n 2 or more): one for forwards, one for backwards");
  for (int t = 0; t < g->nt; t++)
    if (g->t[t].is_param && p->nreaders[t] > 1)
      return err_set("--schedule pipefb: weight '%s' is read by %d nodes (tied); pipefb does not train tied weights yet "
                     "(use 1f1b, or --untie if an exporter merged them)", g->t[t].name, p->nreaders[t]);
  p->rbegin = pool_alloc(&g->pool, sizeof(int) * (size_t)n);
  p->rend = pool_alloc(&g->pool, sizeof(int) * (size_t)n);
  p->role = pool_alloc(&g->pool, sizeof(int) * (size_t)n);
  int lo = p->opt.fb_split ? p->opt.fb_split : 1, hi = p->opt.fb_split ? p->opt.fb_split : n - 1, best = -1;
  double best_step = INFINITY;
  double least = INFINITY;
  int least_nf = 0;
  for (int nf = lo; nf <= hi; nf++) {
    if (nf > p->N || n - nf > p->N) continue; /* every rank needs a node */
    FbPlan fb = {0};
    StageCost *cost = pool_alloc(&g->pool, sizeof(StageCost) * (size_t)n);
    Schedule sc;
    double step;
    int rc = try_split(p, nf, &fb, cost, &sc, &step);
    if (rc < 0) return -1;
    if (rc > 0) { /* this split does not fit the memory: the least limit it needs */
      if (step < least) least = step, least_nf = nf;
      continue;
    }
    if (step < best_step) best_step = step, best = nf;
  }
  if (best < 0 && least < INFINITY)
    return err_set("--schedule pipefb: no split into forward and backward ranks fits the memory limit (%s per rank); the leanest, "
                   "with %d forward rank%s, needs %.0f bytes (%s) on its fullest rank: raise --mem-limit to at least %.0fK, or use "
                   "more ranks or 1f1b with --offload", fmt_bytes(plan_stage_limit(p, 0)), least_nf, least_nf == 1 ? "" : "s",
                   ceil(least), fmt_bytes(least), ceil(least / 1024));
  if (best < 0)
    return err_set("-n %d --schedule pipefb: %s has %d compute nodes, too few for %s", n, g->path, p->N,
                   p->opt.fb_split ? "that --fb-split" : "two chains");
  /* Again for the one kept: its ranges, costs and lists are the plan's. */
  p->fb = pool_alloc(&g->pool, sizeof *p->fb);
  StageCost *cost = pool_alloc(&g->pool, sizeof(StageCost) * (size_t)n);
  double step;
  if (try_split(p, best, p->fb, cost, &p->sched, &step)) return -1;
  p->opt.fb_split = best;
  p->part.cost = cost;
  p->part.start = NULL;
  p->part.max_time = 0;
  for (int r = 0; r < n; r++) p->part.max_time = fmax(p->part.max_time, cost[r].time);
  /* The listing's table: the same lists with unit times. */
  StageCost *unit = pool_alloc(&g->pool, sizeof(StageCost) * (size_t)n);
  for (int r = 0; r < n; r++) unit[r].fwd = unit[r].bwd = 1;
  schedule_build_pipefb(&p->slots, &p->fb->links, n, p->opt.microbatches, unit, &g->pool);
  return schedule_validate(&p->sched);
}
