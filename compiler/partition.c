/* partition.c - the optimal contiguous partition.
 *
 * Stage time is what one micro-batch costs a stage: forward + backward
 * compute on that stage's rank, plus sending and receiving every value that
 * crosses its two cuts (a skip connection that crosses three cuts is sent
 * three times, since each stage in between forwards it).  The pipeline's
 * step time grows with the slowest stage, so the DP minimises the maximum
 * stage time, subject to each stage's memory under the chosen schedule: the
 * arena its program lays out (stage_mem), or the closed-form estimate.
 * A second DP, limited to stages no slower than that optimum, minimises the
 * sum of squared stage times, so that among equally fast plans the most even
 * one is chosen. */
#include "partition.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct PartCtx {
  const PartProblem *p;
  double *pf_fwd, *pf_bwd, *pf_traffic, *pf_param, *pf_stash, *pf_work; /* prefix sums, N + 1 */
  double *pf_fs, *pf_bis, *pf_bws;                             /* of the measured times (fwd_s ...), if any */
  double *cut_bytes, *cut_grad, *cut_count;                    /* per cut b = 0..N */
  /* Direct sends: per cut i, the gaps open there (lo < i < hi), by hi
   * descending, with running sums of their bytes: entries open_at[i] ..
   * open_at[i + 1] - 1 of the arrays below.  NULL: relays. */
  int64_t *open_at;
  int *open_hi;
  double *open_bytes, *open_grad;
  int screen;        /* with stage_mem: a candidate whose estimate fits is taken as fitting without building it */
  int bound_only;    /* the leanest plan (mode 2) by the lower bound alone, building no stage (a long order's error) */
  double built;      /* stage programs built for their memory: the sum of their nodes squared (memplan's work) */
};

/* Past this much building (the sum over built stages of their nodes squared: some seconds of memplan),
 * a candidate fits by its closed-form estimate alone, which has stayed above the arena on every sample
 * model; the plan chosen is still checked by its arenas (partition_solve). */
#define PART_BUILD_WORK 4e8

/* Micro-batches whose stash a stage holds at once: all of them under GPipe;
 * p - s under 1F1B; p on every stage under ZB-H1, whose deferred W's keep
 * the stash longer (the peak of 1F1B's first stage, now on each stage). */
int stage_inflight(int schedule, int s, int nstages, int m) {
  if (schedule == SCHED_GPIPE) return m;
  /* Interleaved and ZB-V: a chunk's warm-up holds up to about 2n of its micro-batches (n ranks, nstages = V n
   * stages, V >= 2): the stage count bounds it (an estimate's bound; the rings come from the lists). */
  if (sched_chunked(schedule)) return nstages < m ? nstages : m;
  int k = schedule == SCHED_ZB1 ? nstages : nstages - s;
  return k < m ? k : m;
}

int stage_copies(int schedule, int s, int nstages, int m) {
  int k = stage_inflight(schedule, s, nstages, m) + 1;
  return k < m ? k : m;
}

int stage_gcopies(int schedule, int s, int nstages, int m) {
  if (sched_splits(schedule) || sched_chunked(schedule)) return stage_copies(schedule, s, nstages, m);
  return 2;
}

static int by_hi_desc(const void *a, const void *b) {
  const PartGap *x = *(const PartGap *const *)a, *y = *(const PartGap *const *)b;
  return x->hi != y->hi ? y->hi - x->hi : (x->lo > y->lo) - (x->lo < y->lo);
}

/* The gaps open at each cut, for pass_through(); skipped (relay pricing)
 * when they would take more than OPEN_MAX entries. */
#define OPEN_MAX 4000000
static void open_gaps(PartCtx *c) {
  const PartProblem *p = c->p;
  int N = p->N;
  int64_t total = 0;
  for (int g = 0; g < p->ngaps; g++) total += p->gaps[g].hi - p->gaps[g].lo - 1 > 0 ? p->gaps[g].hi - p->gaps[g].lo - 1 : 0;
  if (!p->gaps || !total || total > OPEN_MAX) return;
  const PartGap **by = malloc(sizeof(PartGap *) * (size_t)p->ngaps);
  c->open_at = calloc((size_t)N + 2, sizeof(int64_t));
  c->open_hi = malloc(sizeof(int) * (size_t)total);
  c->open_bytes = malloc(sizeof(double) * (size_t)total), c->open_grad = malloc(sizeof(double) * (size_t)total);
  if (!by || !c->open_at || !c->open_hi || !c->open_bytes || !c->open_grad) abort();
  for (int g = 0; g < p->ngaps; g++) by[g] = &p->gaps[g];
  qsort(by, (size_t)p->ngaps, sizeof *by, by_hi_desc);
  for (int g = 0; g < p->ngaps; g++)
    for (int i = by[g]->lo + 1; i < by[g]->hi && i <= N; i++) c->open_at[i + 1]++;
  for (int i = 0; i <= N; i++) c->open_at[i + 1] += c->open_at[i];
  int64_t *fill = malloc(sizeof(int64_t) * (size_t)(N + 1));
  if (!fill) abort();
  memcpy(fill, c->open_at, sizeof(int64_t) * (size_t)(N + 1));
  for (int g = 0; g < p->ngaps; g++) /* by hi descending: each cut's list comes out sorted */
    for (int i = by[g]->lo + 1; i < by[g]->hi && i <= N; i++) {
      int64_t k = fill[i]++;
      c->open_hi[k] = by[g]->hi;
      c->open_bytes[k] = by[g]->bytes + (k > c->open_at[i] ? c->open_bytes[k - 1] : 0);
      c->open_grad[k] = by[g]->grad_bytes + (k > c->open_at[i] ? c->open_grad[k - 1] : 0);
    }
  free(fill), free(by);
}

/* What stage [i, j) skips under direct sends: values made before it and
 * read after it, by none of its nodes (gaps open at i with hi >= j). */
static void pass_through(const PartCtx *c, int i, int j, PartSums *hi) {
  hi->pass_bytes = hi->pass_grad = hi->pass_count = 0;
  if (!c->open_at || i <= 0 || i >= c->p->N) return;
  int64_t a = c->open_at[i], e = c->open_at[i + 1], lo = a, up = e; /* the first entry with open_hi < j */
  while (lo < up) {
    int64_t mid = (lo + up) / 2;
    if (c->open_hi[mid] >= j) lo = mid + 1;
    else up = mid;
  }
  if (lo == a) return;
  hi->pass_bytes = c->open_bytes[lo - 1], hi->pass_grad = c->open_grad[lo - 1], hi->pass_count = (double)(lo - a);
}

PartCtx *part_prepare(const PartProblem *p) {
  PartCtx *c = calloc(1, sizeof *c);
  int N = p->N;
  c->p = p;
  double **arrs[] = {&c->pf_fwd,    &c->pf_bwd,   &c->pf_traffic, &c->pf_param, &c->pf_stash, &c->pf_work,
                     &c->cut_bytes, &c->cut_grad, &c->cut_count,  &c->pf_fs,    &c->pf_bis,   &c->pf_bws};
  for (size_t k = 0; k < sizeof arrs / sizeof arrs[0]; k++) {
    *arrs[k] = calloc((size_t)N + 2, sizeof(double));
    if (!*arrs[k]) abort();
  }
  for (int i = 0; i < N; i++) {
    c->pf_fwd[i + 1] = c->pf_fwd[i] + p->fwd_flops[i];
    if (p->fwd_s) {
      c->pf_fs[i + 1] = c->pf_fs[i] + p->fwd_s[i];
      c->pf_bis[i + 1] = c->pf_bis[i] + p->bwdi_s[i];
      c->pf_bws[i + 1] = c->pf_bws[i] + p->bwdw_s[i];
    }
    c->pf_bwd[i + 1] = c->pf_bwd[i] + p->bwd_flops[i];
    c->pf_traffic[i + 1] = c->pf_traffic[i] + p->traffic[i];
    c->pf_param[i + 1] = c->pf_param[i] + p->param_bytes[i];
    c->pf_stash[i + 1] = c->pf_stash[i] + p->stash_bytes[i];
    c->pf_work[i + 1] = c->pf_work[i] + p->work_bytes[i];
  }
  /* A value made by node `from` and last read by node `to` crosses every cut
   * b with from < b <= to (cut b lies just before node b).  Difference array. */
  double *d1 = calloc((size_t)N + 3, sizeof(double)), *d2 = calloc((size_t)N + 3, sizeof(double)),
         *d3 = calloc((size_t)N + 3, sizeof(double));
  for (int e = 0; e < p->nedges; e++) {
    /* Cuts lo..hi; cut 0 holds the loader's inputs, cut N the loss's outputs. */
    int lo = p->edges[e].from + 1, hi = p->edges[e].to;
    if (lo < 0) lo = 0;
    if (hi > N) hi = N;
    if (lo > hi) continue;
    d1[lo] += p->edges[e].bytes, d1[hi + 1] -= p->edges[e].bytes;
    d2[lo] += p->edges[e].grad_bytes, d2[hi + 1] -= p->edges[e].grad_bytes;
    d3[lo] += 1, d3[hi + 1] -= 1;
  }
  double a1 = 0, a2 = 0, a3 = 0;
  for (int b = 0; b <= N; b++) {
    a1 += d1[b], a2 += d2[b], a3 += d3[b];
    c->cut_bytes[b] = a1;
    c->cut_grad[b] = b >= 1 && b < N ? a2 : 0; /* no gradient goes to the loader; the loss's is local */
    c->cut_count[b] = round(a3);
  }
  free(d1), free(d2), free(d3);
  open_gaps(c);
  return c;
}

void part_ctx_free(PartCtx *c) {
  if (!c) return;
  free(c->pf_fwd), free(c->pf_bwd), free(c->pf_traffic), free(c->pf_param), free(c->pf_stash), free(c->pf_work);
  free(c->pf_fs), free(c->pf_bis), free(c->pf_bws);
  free(c->cut_bytes), free(c->cut_grad), free(c->cut_count);
  free(c->open_at), free(c->open_hi), free(c->open_bytes), free(c->open_grad);
  free(c);
}

double part_boundary_bytes(const PartCtx *c, int b) { return c->cut_bytes[b]; }

double part_node_fwd(const PartProblem *p, int s, int k) {
  const Machine *m = p->machine;
  if (p->fwd_s) return p->fwd_s[k] * p->time_rate / m->dev[s].flops;
  return p->fwd_flops[k] / m->dev[s].flops + p->traffic[k] / m->memcpy_bw;
}

static double link_time(const Link *l, double bytes, double messages) {
  if (messages <= 0) return 0;
  return bytes / l->bandwidth + messages * l->latency;
}

/* The sums at cut b of the order (before node b). */
static void sums_at(const PartCtx *c, int b, PartSums *o) {
  *o = (PartSums){.fwd = c->pf_fwd[b], .bwd = c->pf_bwd[b], .traffic = c->pf_traffic[b], .param = c->pf_param[b],
                  .stash = c->pf_stash[b], .work = c->pf_work[b], .fs = c->pf_fs[b], .bis = c->pf_bis[b], .bws = c->pf_bws[b],
                  .cut_bytes = c->cut_bytes[b], .cut_grad = c->cut_grad[b], .cut_count = c->cut_count[b],
                  .first = b == 0, .last = b == c->p->N};
}

double part_evals;

void part_stage_cost(const PartCtx *c, int s, int i, int j, StageCost *o) {
  PartSums lo, hi;
  part_evals++;
  sums_at(c, i, &lo);
  sums_at(c, j, &hi);
  pass_through(c, i, j, &hi);
  part_cost_sums(c->p, s, &lo, &hi, o);
}

void part_cost_sums(const PartProblem *p, int s, const PartSums *lo, const PartSums *hi, StageCost *o) {
  const Machine *m = p->machine;
  memset(o, 0, sizeof *o);
  double rate = m->dev[s].flops, mbw = m->memcpy_bw;
  if (p->fwd_s) {
    /* Measured: scaled from the profiled device's rate to this rank's. */
    double k = p->time_rate / rate;
    o->fwd = (hi->fs - lo->fs + (lo->first ? p->load_s : 0) + (hi->last ? p->loss_s : 0)) * k;
    o->bwd_w = (hi->bws - lo->bws) * k;
    o->bwd = (hi->bis - lo->bis) * k + o->bwd_w;
    o->update = p->update_per_byte * (hi->param - lo->param) * k;
  } else {
    double traffic = hi->traffic - lo->traffic;
    o->fwd = (hi->fwd - lo->fwd) / rate + traffic / mbw;
    o->bwd = (hi->bwd - lo->bwd) / rate + 2 * traffic / mbw;
    /* Without a profile, half of the backward is taken as the weight
     * gradient (a weighted op's backward is two GEMMs of equal size). */
    o->bwd_w = o->bwd / 2;
    /* The optimizer reads each weight and gradient and writes the weight,
     * and reads and writes each optimizer slot. */
    o->update = (3 + 2 * p->opt_state_per_param) * (hi->param - lo->param) / mbw;
  }
  if (p->only == PART_FORWARD) o->bwd = o->bwd_w = o->update = 0;
  if (p->only == PART_BACKWARD) o->fwd = 0;
  /* Values the stage skips (direct sends) neither arrive nor leave; a
   * direct send is priced on the link it would have entered or left by. */
  double pb = hi->pass_bytes, pg = hi->pass_grad, pn = hi->pass_count;
  o->recv_bytes = lo->cut_bytes - pb;
  o->send_bytes = !hi->last ? hi->cut_bytes - pb : 0;
  if (s > 0) o->comm += link_time(&m->link[s - 1], lo->cut_bytes - pb + lo->cut_grad - pg, 2 * (lo->cut_count - pn));
  if (s + 1 < p->nstages) o->comm += link_time(&m->link[s], hi->cut_bytes - pb + hi->cut_grad - pg, 2 * (hi->cut_count - pn));
  o->time = o->fwd + o->bwd + o->comm;
  /* The closed-form estimate of the arena (what the DP trusts when it fits,
   * see partition_solve; exact pricing is stage_mem): ring copies of the
   * stashed activations and of everything crossing either cut (the loss's
   * logits and their gradient on the last stage), two copies of each
   * gradient crossing a cut, and every temporary without sharing. */
  o->inflight = stage_inflight(p->schedule, s, p->nstages, p->microbatches);
  o->copies = stage_copies(p->schedule, s, p->nstages, p->microbatches);
  o->gcopies = stage_gcopies(p->schedule, s, p->nstages, p->microbatches);
  o->mem_params = hi->param - lo->param;
  o->mem_grads = o->mem_params * (1 + p->reduce_share);
  o->mem_opt = o->mem_params * p->opt_state_per_param * (p->zero_share > 0 ? p->zero_share : 1);
  o->mem_stash = o->copies * (hi->stash - lo->stash);
  double last = hi->last ? hi->cut_bytes : 0; /* d(logits); the labels take no more than the logits */
  o->mem_recv = o->copies * (lo->cut_bytes + hi->cut_bytes - 2 * pb + last) + last + o->gcopies * (lo->cut_grad + hi->cut_grad - 2 * pg);
  o->mem_work = hi->work - lo->work;
  o->mem_total = o->mem_params + o->mem_grads + o->mem_opt + o->mem_stash + o->mem_recv + o->mem_work;
}

double part_stage_limit(const PartProblem *p, int s) {
  double lim = p->machine->dev[s].mem_bytes;
  if (p->mem_limit > 0 && (lim <= 0 || p->mem_limit < lim)) lim = p->mem_limit;
  return lim;
}

double part_stage_mem(const PartCtx *c, int s, int i, int j) {
  const PartProblem *p = c->p;
  if (p->stage_mem) {
    ((PartCtx *)c)->built += (double)(j - i) * (j - i); /* (the context is the DP's scratch, not its input) */
    return p->stage_mem(p->mem_ctx, s, i, j);
  }
  StageCost sc;
  part_stage_cost(c, s, i, j, &sc);
  return sc.mem_total;
}

/* Per start i of a stage ending at j: bytes of the activations made and
 * kept for backward within [i, j). */
static void stash_within(const PartProblem *p, int j, double *kept) {
  for (int i = 0; i <= j; i++) kept[i] = 0;
  for (int k = 0; k < p->nstash; k++)
    if (p->stash[k].to < j && p->stash[k].from >= 0) kept[p->stash[k].from] += p->stash[k].bytes;
  for (int i = j - 1; i >= 0; i--) kept[i] += kept[i + 1];
}

/* A bound from below on stage s's exact memory, from sums alone: its
 * parameters' weights, gradients and optimizer state, and a ring copy per
 * slot of the values it receives and the activations it keeps (all distinct
 * buffers), or of those it sends if more. */
static double mem_lower(const PartCtx *c, int s, int i, int j, const double *kept) {
  const PartProblem *p = c->p;
  if (!p->stage_mem) return part_stage_mem(c, s, i, j);
  double params = c->pf_param[j] - c->pf_param[i];
  return params * p->param_copies + p->ring_copies[s] * fmax(c->cut_bytes[i] + kept[i], c->cut_bytes[j]);
}

/* One candidate of a DP cell: stage s = [i, j) after the best plan of [0, i). */
typedef struct Cand {
  double key; /* the value it gives if its memory fits (mode 2: a bound from below) */
  double est; /* its estimated memory */
  int i;
} Cand;

static int by_key(const void *a, const void *b) {
  const Cand *x = a, *y = b;
  return x->key < y->key ? -1 : x->key > y->key ? 1 : x->i - y->i;
}

/* Where the DP may cut: cut s (the start of stage s; cut n is N) at one of the positions
 * pos[lo[s]] .. pos[hi[s]], positions ascending.  The exact DP allows every position a stage can
 * start at; a long order is first planned over blocks of nodes, then again within windows around
 * that plan's cuts (partition_solve). */
typedef struct Grid {
  const int *pos;
  const int *lo, *hi; /* per cut s = 0..n, indices into pos */
} Grid;

/* The best i for cell (s, j), or -1; *best gets its value.  Without a
 * memory limit, the smallest value (ties: smallest i); with one, candidates
 * are tried best value first (ties: smallest i, as a plain scan keeps), so
 * the exact memory is computed only for those that could win; a lower bound
 * rules out most without building anything. */
static int best_cut(const PartCtx *c, int mode, double cap, const double *prev, int s, int j, const Grid *gr, Cand *cand,
                    double *kept, double *best) {
  double lim = part_stage_limit(c->p, s);
  StageCost sc;
  int nc = 0;
  if (lim > 0 && c->p->stage_mem) stash_within(c->p, j, kept);
  for (int k = gr->lo[s]; k <= gr->hi[s] && gr->pos[k] < j; k++) {
    int i = gr->pos[k];
    if (prev[i] == INFINITY) continue;
    double key;
    sc.mem_total = INFINITY;
    if (mode == 2) {
      key = fmax(prev[i], lim > 0 ? mem_lower(c, s, i, j, kept) / lim : mem_lower(c, s, i, j, kept));
    } else {
      part_stage_cost(c, s, i, j, &sc);
      if (mode == 1 && sc.time > cap) continue;
      if (lim > 0 && mem_lower(c, s, i, j, kept) > lim) continue;
      key = mode == 0 ? fmax(prev[i], sc.time) : prev[i] + sc.time * sc.time;
    }
    cand[nc++] = (Cand){key, sc.mem_total, i};
  }
  *best = INFINITY;
  if (mode != 2 && lim <= 0) { /* every candidate fits: the first smallest (candidates come by i ascending) */
    int barg = -1;
    for (int k = 0; k < nc; k++)
      if (cand[k].key < *best) *best = cand[k].key, barg = cand[k].i;
    return barg;
  }
  qsort(cand, (size_t)nc, sizeof *cand, by_key);
  int barg = -1;
  for (int k = 0; k < nc; k++) {
    int i = cand[k].i;
    if (mode != 2) {
      int fits = lim <= 0 || ((c->screen || c->built > PART_BUILD_WORK) && cand[k].est <= lim) ||
                 (c->built <= PART_BUILD_WORK && part_stage_mem(c, s, i, j) <= lim);
      if (!fits) continue;
      *best = cand[k].key;
      return i;
    }
    if (cand[k].key > *best) break;
    if (c->bound_only) return *best = cand[k].key, i;
    double m = part_stage_mem(c, s, i, j), v = fmax(prev[i], lim > 0 ? m / lim : m);
    if (v < *best || (v == *best && i < barg)) *best = v, barg = i;
  }
  return barg;
}

/* One DP over (stages, prefix length) on the grid's cuts.  mode 0: minimise the max stage time;
 * mode 1: minimise the sum of squared times with every stage <= cap;
 * mode 2: minimise the max of memory / limit, ignoring limits (for errors). */
static double run_dp(const PartCtx *c, int mode, double cap, const Grid *gr, int *start) {
  const PartProblem *p = c->p;
  int N = p->N, n = p->nstages;
  size_t W = (size_t)N + 1;
  double *f = malloc(sizeof(double) * (size_t)(n + 1) * W);
  int *arg = malloc(sizeof(int) * (size_t)(n + 1) * W);
  Cand *cand = malloc(sizeof(Cand) * W);
  double *kept = malloc(sizeof(double) * (W + 1));
  if (!f || !arg || !cand || !kept) abort();
  for (size_t k = 0; k < (size_t)(n + 1) * W; k++) f[k] = INFINITY, arg[k] = -1;
  f[0] = 0;
  for (int s = 0; s < n; s++) /* stage s covers [i, j): i at cut s, j at cut s + 1 */
    for (int k = gr->lo[s + 1]; k <= gr->hi[s + 1]; k++) {
      int j = gr->pos[k];
      size_t at = (size_t)(s + 1) * W + (size_t)j;
      arg[at] = best_cut(c, mode, cap, f + (size_t)s * W, s, j, gr, cand, kept, &f[at]);
    }
  double res = f[(size_t)n * W + (size_t)N];
  if (start && res < INFINITY) {
    start[n] = N;
    for (int s = n, j = N; s > 0; s--) {
      j = arg[(size_t)s * W + (size_t)j];
      start[s - 1] = j;
    }
  }
  free(f), free(arg), free(cand), free(kept);
  return res;
}

/* The fullest rank's memory in the leanest plan, as an error. */
static double solve_blocked(PartCtx *c, int mode, int *start, int *blocks, Pool *pool);
static int no_fit(PartCtx *c, const Grid *whole, int blocked, Partition *out, Pool *pool) {
  const PartProblem *p = c->p;
  int *tmp = pool_alloc(pool, sizeof(int) * (size_t)(p->nstages + 1)), blocks;
  /* a long order: the plan leanest by the bound, then its stages built (building every candidate's
   * took minutes at 20,000 nodes) */
  c->bound_only = blocked;
  if (blocked) solve_blocked(c, 2, tmp, &blocks, pool);
  else run_dp(c, 2, 0, whole, tmp);
  double need = 0;
  for (int s = 0; s < p->nstages; s++) need = fmax(need, part_stage_mem(c, s, tmp[s], tmp[s + 1]));
  out->max_time = need; /* the caller may weigh it (pipefb's splits) */
  if (out->start) memcpy(out->start, tmp, sizeof(int) * (size_t)(p->nstages + 1)); /* ... and say what its fullest stage holds */
  return err_set("no partition into %d stage%s fits the memory limit (%s per rank); the leanest plan needs %.0f bytes "
                 "(%s) on its fullest rank: raise --mem-limit to at least %.0fK, or use more stages, fewer "
                 "micro-batches or 1f1b", p->nstages, p->nstages == 1 ? "" : "s",
                 fmt_bytes(p->mem_limit > 0 ? p->mem_limit : p->machine->dev[0].mem_bytes), ceil(need), fmt_bytes(need),
                 ceil(need / 1024));
}

/* Whether every stage of the plan fits by its exact memory (the screen
 * trusted estimates). */
static int plan_fits(const PartCtx *c, const int *start) {
  for (int s = 0; s < c->p->nstages; s++) {
    double lim = part_stage_limit(c->p, s);
    if (lim > 0 && part_stage_mem(c, s, start[s], start[s + 1]) > lim) return 0;
  }
  return 1;
}

/* The best plan on the grid's cuts into out->start, or INFINITY.  Building a stage's program costs
 * far more than its estimate, and the estimate has stayed above the arena on every sample model, so
 * a candidate whose estimate fits is taken as fitting; the chosen plan is then checked by its
 * arenas, and if the screen misjudged one, planned again on arenas alone.  Accepting more
 * candidates can only lower the DP's value, so a plan that passes the check is optimal. */
static double solve_on(PartCtx *c, const Grid *gr, int *start) {
  for (c->screen = c->p->stage_mem != NULL;; c->screen = 0) {
    double best = run_dp(c, 0, 0, gr, start);
    if (best == INFINITY) return best;
    /* Among plans as fast as the optimum, the most even (ties within 1e-9 relative). */
    run_dp(c, 1, best * (1 + 1e-9), gr, start);
    if (!c->screen || plan_fits(c, start)) return best;
  }
}

/* Stage-cost evaluations the exact DP may take (about n N^2 / 2): about a second here.  Past
 * it the order is planned over blocks first (PART_BLOCKS_AUTO). */
#define PART_EXACT_EVALS 1e7

static double exact_bound(const PartProblem *p) { return p->exact_evals > 0 ? p->exact_evals : PART_EXACT_EVALS; }

/* Cut s may fall at positions [s, N - (n - s)] of pos (the identity, or block boundaries), each
 * stage keeping at least one position's worth. */
static void grid_whole(int *lo, int *hi, int n, int npos) {
  for (int s = 0; s <= n; s++) lo[s] = s, hi[s] = npos - 1 - (n - s);
  lo[0] = hi[0] = 0, lo[n] = hi[n] = npos - 1;
}

/* The plan (mode 0: the fastest that fits, solve_on; mode 2: the leanest, run_dp) on the grid. */
static double solve_grid(PartCtx *c, int mode, const Grid *gr, int *start) {
  return mode == 2 ? run_dp(c, 2, 0, gr, start) : solve_on(c, gr, start);
}

/* A long order: B blocks of about equal work (FLOPs and bytes), the DP over their boundaries, then
 * the exact DP again over every position within two blocks of each cut it chose.  Returns the plan's
 * value; *blocks gets B. */
static double solve_blocked(PartCtx *c, int mode, int *start, int *blocks, Pool *pool) {
  const PartProblem *p = c->p;
  int N = p->N, n = p->nstages;
  int B = (int)sqrt(2 * exact_bound(p) / n);
  if (B < 2 * n) B = 2 * n;
  if (B > N) B = N;
  int *pos = pool_alloc(pool, sizeof(int) * (size_t)(N + 1)), *lo = pool_alloc(pool, sizeof(int) * (size_t)(n + 1)),
      *hi = pool_alloc(pool, sizeof(int) * (size_t)(n + 1));
  double total = c->pf_fwd[N] + c->pf_bwd[N] + c->pf_traffic[N];
  int np = 0;
  pos[np++] = 0;
  for (int i = 1; i < N; i++) { /* a boundary where the running work passes the next share, or every N/B nodes */
    double w = c->pf_fwd[i] + c->pf_bwd[i] + c->pf_traffic[i];
    int by_work = total > 0 && w * B >= total * np, by_count = (int64_t)i * B >= (int64_t)N * np;
    if ((by_work || by_count) && np < B) pos[np++] = i;
  }
  pos[np++] = N;
  *blocks = np - 1;
  grid_whole(lo, hi, n, np);
  Grid coarse = {pos, lo, hi};
  if (solve_grid(c, mode, &coarse, start) == INFINITY) return INFINITY;
  /* the window: the widest block on either side of each cut, twice */
  int wide = 1;
  for (int k = 1; k < np; k++) wide = pos[k] - pos[k - 1] > wide ? pos[k] - pos[k - 1] : wide;
  for (int i = 0; i <= N; i++) pos[i] = i;
  for (int s = 1; s < n; s++) {
    lo[s] = start[s] - 2 * wide > s ? start[s] - 2 * wide : s;
    hi[s] = start[s] + 2 * wide < N - (n - s) ? start[s] + 2 * wide : N - (n - s);
  }
  lo[0] = hi[0] = 0, lo[n] = hi[n] = N;
  Grid fine = {pos, lo, hi};
  return solve_grid(c, mode, &fine, start);
}

int partition_solve(const PartProblem *p, Partition *out, Pool *pool) {
  if (p->nstages < 1) return err_set("-n must be at least 1");
  if (p->nstages > p->N)
    return err_set("-n %d is larger than the number of compute nodes (%d): each stage needs at least one", p->nstages, p->N);
  PartCtx *c = part_prepare(p);
  out->start = pool_alloc(pool, sizeof(int) * (size_t)(p->nstages + 1));
  out->cost = pool_alloc(pool, sizeof(StageCost) * (size_t)p->nstages);
  out->blocks = 0;
  int N = p->N, n = p->nstages;
  int *pos = pool_alloc(pool, sizeof(int) * (size_t)(N + 1)), *lo = pool_alloc(pool, sizeof(int) * (size_t)(n + 1)),
      *hi = pool_alloc(pool, sizeof(int) * (size_t)(n + 1));
  for (int i = 0; i <= N; i++) pos[i] = i;
  grid_whole(lo, hi, n, N + 1);
  Grid whole = {pos, lo, hi};
  int blocked = p->blocks == PART_BLOCKS_ALWAYS || (p->blocks == PART_BLOCKS_AUTO && 0.5 * n * (double)N * N > exact_bound(p));
  double best = blocked ? solve_blocked(c, 0, out->start, &out->blocks, pool) : solve_on(c, &whole, out->start);
  if (best == INFINITY) {
    int rc = no_fit(c, &whole, blocked, out, pool);
    part_ctx_free(c);
    return rc;
  }
  if (c->built > PART_BUILD_WORK && !plan_fits(c, out->start)) { /* estimates only, and one misjudged */
    part_ctx_free(c);
    return err_set("planning %d nodes under the memory limit built stage programs past its bound (PART_BUILD_WORK), and the plan "
                   "chosen by the memory estimates then does not fit: raise --mem-limit, or use more stages", N);
  }
  out->budget_spent = c->built > PART_BUILD_WORK;
  out->max_time = 0;
  for (int s = 0; s < p->nstages; s++) {
    part_stage_cost(c, s, out->start[s], out->start[s + 1], &out->cost[s]);
    out->cost[s].mem_estimate = out->cost[s].mem_total;
    if (out->cost[s].time > out->max_time) out->max_time = out->cost[s].time;
  }
  part_ctx_free(c);
  return 0;
}
