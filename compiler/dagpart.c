/* dagpart.c - the optimal partition over the graph's downsets (dagpart.h).
 *
 * The states are the downsets, found breadth first from {} by adding one
 * node whose predecessors are all in, and hashed as bitsets.  f[s][D] is the
 * best slowest-stage time of s stages covering D; f[s+1][D'] = min over
 * downsets D < D' of max(f[s][D], T(s, D' \ D)).  Every pair is a candidate,
 * so the candidates of D' are scanned from the largest compute below D'
 * downwards, and the scan stops once the compute between them alone exceeds
 * the best found: D' \ D's compute is a bound from below on its stage time.
 *
 * A branchy graph has many downsets (k parallel chains of length L give
 * (L+1)^k).  Past the bound, chains (a node whose one successor has it as
 * its one predecessor) are contracted into one unit, and if that is still
 * too many the caller keeps its topological order and says so. */
#include "dagpart.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct Dag {
  const DagProblem *d;
  int N, G, W;         /* nodes, units (nodes or contracted chains), 64-bit words per state */
  int *unit;           /* node -> unit */
  int *pstart, *pred;  /* units' predecessor units, CSR */
  int *rstart, *rnode; /* values' reading nodes, CSR over p->edges */
  int *usize;          /* nodes per unit */
  /* The downsets: bitsets over units, their node counts and sums. */
  uint64_t *bits;
  int *size;
  PartSums *sums;
  int S, cap;
  int *hash;
  size_t hcap;
} Dag;

static int has(const uint64_t *set, int u) { return (int)(set[u >> 6] >> (u & 63) & 1); }

/* Distinct predecessors of each node: producers of what it reads, and kept orders. */
static int *node_preds(const DagProblem *d, int **start_out, Pool *pool) {
  int N = d->p->N, M = d->nuse + d->nkeep;
  int *a = pool_alloc(pool, sizeof(int) * (size_t)(M + 1)), *b = pool_alloc(pool, sizeof(int) * (size_t)(M + 1));
  int m = 0;
  for (int u = 0; u < d->nuse; u++)
    if (d->p->edges[d->use_edge[u]].from >= 0) a[m] = d->p->edges[d->use_edge[u]].from, b[m++] = d->use_node[u];
  for (int q = 0; q < d->nkeep; q++) a[m] = d->keep_a[q], b[m++] = d->keep_b[q];
  int *start = pool_alloc(pool, sizeof(int) * (size_t)(N + 1)), *fill = pool_alloc(pool, sizeof(int) * (size_t)(N + 1));
  int *pred = pool_alloc(pool, sizeof(int) * (size_t)(m + 1)), *last = pool_alloc(pool, sizeof(int) * (size_t)(N + 1));
  for (int k = 0; k < m; k++) start[b[k] + 1]++;
  for (int k = 0; k < N; k++) start[k + 1] += start[k];
  memcpy(fill, start, sizeof(int) * (size_t)N);
  for (int k = 0; k < N; k++) last[k] = -1;
  /* Duplicates (a node reading two values of one producer) are dropped per node. */
  for (int k = 0; k < m; k++) pred[fill[b[k]]++] = a[k];
  for (int v = 0; v < N; v++) {
    int w = start[v];
    for (int k = start[v]; k < fill[v]; k++) {
      int dup = 0;
      for (int q = start[v]; q < w && !dup; q++) dup = pred[q] == pred[k];
      if (!dup) pred[w++] = pred[k];
    }
    fill[v] = w;
  }
  /* Compact: start[v]..fill[v] -> start[v]..start[v+1]. */
  int w = 0;
  for (int v = 0; v < N; v++) {
    int s0 = start[v], e0 = fill[v];
    start[v] = w;
    for (int k = s0; k < e0; k++) pred[w++] = pred[k];
  }
  start[N] = w;
  *start_out = start;
  return pred;
}

/* Units: every node alone, or (coarse) chains contracted: v joins its one
 * predecessor u's unit when v is u's one successor. */
static void make_units(Dag *g, const int *nstart, const int *npred, int coarse, Pool *pool) {
  int N = g->N;
  int *nsucc = pool_alloc(pool, sizeof(int) * (size_t)N);
  for (int k = 0; k < nstart[N]; k++) nsucc[npred[k]]++;
  g->unit = pool_alloc(pool, sizeof(int) * (size_t)N);
  g->G = 0;
  for (int v = 0; v < N; v++) {
    int one = nstart[v + 1] - nstart[v] == 1 ? npred[nstart[v]] : -1;
    g->unit[v] = coarse && one >= 0 && nsucc[one] == 1 ? g->unit[one] : g->G++;
  }
  g->usize = pool_alloc(pool, sizeof(int) * (size_t)g->G);
  for (int v = 0; v < N; v++) g->usize[g->unit[v]]++;
  /* Units' predecessors: their nodes' predecessors in other units (repeats are harmless). */
  g->pstart = pool_alloc(pool, sizeof(int) * (size_t)(g->G + 1));
  g->pred = pool_alloc(pool, sizeof(int) * (size_t)(nstart[N] + 1));
  for (int v = 0; v < N; v++)
    for (int k = nstart[v]; k < nstart[v + 1]; k++) g->pstart[g->unit[v] + 1] += g->unit[npred[k]] != g->unit[v];
  for (int u = 0; u < g->G; u++) g->pstart[u + 1] += g->pstart[u];
  int *fill = pool_alloc(pool, sizeof(int) * (size_t)(g->G + 1));
  memcpy(fill, g->pstart, sizeof(int) * (size_t)g->G);
  for (int v = 0; v < N; v++)
    for (int k = nstart[v]; k < nstart[v + 1]; k++)
      if (g->unit[npred[k]] != g->unit[v]) g->pred[fill[g->unit[v]]++] = g->unit[npred[k]];
  g->W = (g->G + 63) / 64;
}

static size_t hash_bits(const uint64_t *b, int W, size_t cap) {
  uint64_t h = 0x9E3779B97F4A7C15ull;
  for (int w = 0; w < W; w++) h = (h ^ b[w]) * 0xC2B2AE3D27D4EB4Full, h ^= h >> 29;
  return (size_t)h & (cap - 1);
}

/* Index of the downset `b`, adding it if new; -1 past the bound. */
static int find_or_add(Dag *g, const uint64_t *b, int nodes) {
  size_t a = hash_bits(b, g->W, g->hcap);
  while (g->hash[a] >= 0) {
    if (!memcmp(g->bits + (size_t)g->hash[a] * (size_t)g->W, b, sizeof(uint64_t) * (size_t)g->W)) return g->hash[a];
    a = (a + 1) & (g->hcap - 1);
  }
  if (g->S == g->cap) return -1;
  memcpy(g->bits + (size_t)g->S * (size_t)g->W, b, sizeof(uint64_t) * (size_t)g->W);
  g->size[g->S] = nodes;
  g->hash[a] = g->S;
  return g->S++;
}

/* Breadth first from {}: 0, or -1 when there are more than cap downsets. */
static int enumerate(Dag *g, int cap) {
  g->cap = cap;
  g->bits = calloc((size_t)cap * (size_t)g->W, sizeof(uint64_t));
  g->size = calloc((size_t)cap, sizeof(int));
  for (g->hcap = 1024; g->hcap < 2 * (size_t)cap; g->hcap *= 2) {
  }
  g->hash = malloc(sizeof(int) * g->hcap);
  uint64_t *next = malloc(sizeof(uint64_t) * (size_t)g->W);
  if (!g->bits || !g->size || !g->hash || !next) abort();
  memset(g->hash, 0xff, sizeof(int) * g->hcap);
  g->S = 0;
  memset(next, 0, sizeof(uint64_t) * (size_t)g->W);
  find_or_add(g, next, 0); /* {} */
  int rc = 0;
  for (int i = 0; i < g->S && !rc; i++)
    for (int u = 0; u < g->G && !rc; u++) {
      const uint64_t *cur = g->bits + (size_t)i * (size_t)g->W;
      if (has(cur, u)) continue;
      int ready = 1;
      for (int k = g->pstart[u]; k < g->pstart[u + 1] && ready; k++) ready = has(cur, g->pred[k]);
      if (!ready) continue;
      memcpy(next, cur, sizeof(uint64_t) * (size_t)g->W);
      next[u >> 6] |= 1ull << (u & 63);
      rc = find_or_add(g, next, g->size[i] + g->usize[u]) < 0 ? -1 : 0;
    }
  free(next);
  return rc;
}

/* The sums over each downset's nodes, and what crosses its boundary: a
 * value made inside (or by the loader) and read outside (or by the loss). */
static void state_sums(Dag *g) {
  const PartProblem *p = g->d->p;
  g->sums = calloc((size_t)g->S, sizeof(PartSums));
  if (!g->sums) abort();
  for (int i = 0; i < g->S; i++) {
    const uint64_t *b = g->bits + (size_t)i * (size_t)g->W;
    PartSums *o = &g->sums[i];
    for (int k = 0; k < g->N; k++) {
      if (!has(b, g->unit[k])) continue;
      o->fwd += p->fwd_flops[k], o->bwd += p->bwd_flops[k], o->traffic += p->traffic[k];
      o->param += p->param_bytes[k], o->stash += p->stash_bytes[k], o->work += p->work_bytes[k];
      if (p->fwd_s) o->fs += p->fwd_s[k], o->bis += p->bwdi_s[k], o->bws += p->bwdw_s[k];
    }
    o->first = g->size[i] == 0, o->last = g->size[i] == g->N;
    for (int e = 0; e < p->nedges; e++) {
      const PartEdge *ed = &p->edges[e];
      if (ed->from >= 0 && !has(b, g->unit[ed->from])) continue;
      int out = ed->to >= p->N;
      for (int r = g->rstart[e]; r < g->rstart[e + 1] && !out; r++) out = !has(b, g->unit[g->rnode[r]]);
      if (!out) continue;
      o->cut_bytes += ed->bytes, o->cut_count += 1;
      if (!o->first && !o->last) o->cut_grad += ed->grad_bytes; /* none to the loader; the loss's is local */
    }
  }
}

/* Seconds of D's nodes' compute on stage s's rank: T(s, D' \ D) is at least
 * key(D') - key(D). */
static double compute_key(const PartProblem *p, int s, const PartSums *o) {
  double rate = p->machine->dev[s].flops, f, b;
  if (p->fwd_s) {
    f = o->fs * p->time_rate / rate, b = (o->bis + o->bws) * p->time_rate / rate;
  } else {
    f = o->fwd / rate + o->traffic / p->machine->memcpy_bw, b = o->bwd / rate + 2 * o->traffic / p->machine->memcpy_bw;
  }
  return (p->only == PART_BACKWARD ? 0 : f) + (p->only == PART_FORWARD ? 0 : b);
}

static const double *sort_key; /* for by_key (qsort has no context argument) */
static int by_key(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return sort_key[x] < sort_key[y] ? -1 : sort_key[x] > sort_key[y] ? 1 : x - y;
}

static int subset(const uint64_t *a, const uint64_t *b, int W) {
  for (int w = 0; w < W; w++)
    if (a[w] & ~b[w]) return 0;
  return 1;
}

/* One layer: stage s from every downset D (prev) to every larger D' (cur).
 * mode 0: the slowest stage; mode 1: the sum of squared times, each stage
 * within cap (the most even of the fastest plans). */
static void layer(const Dag *g, int s, int mode, double cap, const double *prev, double *cur, int *arg, double *key,
                  int *ord, int *rank) {
  const PartProblem *p = g->d->p;
  int n = p->nstages, N = g->N;
  double lim = part_stage_limit(p, s), tol = 1e-9;
  for (int i = 0; i < g->S; i++) key[i] = compute_key(p, s, &g->sums[i]), ord[i] = i;
  sort_key = key;
  qsort(ord, (size_t)g->S, sizeof *ord, by_key);
  for (int r = 0; r < g->S; r++) rank[ord[r]] = r;
  for (int j = 0; j < g->S; j++) {
    cur[j] = INFINITY, arg[j] = -1;
    /* Stage s ends at D' with room for one node per later stage; the last ends at everything. */
    if (g->size[j] < s + 1 || g->size[j] > N - (n - s - 1) || (s == n - 1 && g->size[j] != N)) continue;
    const uint64_t *bj = g->bits + (size_t)j * (size_t)g->W;
    int top = rank[j];
    while (top + 1 < g->S && key[ord[top + 1]] <= key[j] * (1 + tol) + 1e-15) top++; /* nodes of no cost */
    for (int r = top; r >= 0; r--) {
      int i = ord[r];
      double bound = mode == 0 ? cur[j] : cap;
      if (key[j] - key[i] > bound * (1 + tol) + 1e-15) break;
      if (prev[i] == INFINITY || g->size[i] >= g->size[j] || g->size[i] < s) continue;
      if (!subset(g->bits + (size_t)i * (size_t)g->W, bj, g->W)) continue;
      StageCost sc;
      part_cost_sums(p, s, &g->sums[i], &g->sums[j], &sc);
      if (lim > 0 && sc.mem_total > lim) continue;
      if (mode == 1 && sc.time > cap) continue;
      double v = mode == 0 ? fmax(prev[i], sc.time) : prev[i] + sc.time * sc.time;
      if (v < cur[j]) cur[j] = v, arg[j] = i;
    }
  }
}

/* The DP; returns the optimum and fills chain[0..n] with the downsets. */
static double run(const Dag *g, int mode, double cap, int *chain) {
  int n = g->d->p->nstages, S = g->S;
  double *f = malloc(sizeof(double) * (size_t)(n + 1) * (size_t)S), *key = malloc(sizeof(double) * (size_t)S);
  int *arg = malloc(sizeof(int) * (size_t)n * (size_t)S), *ord = malloc(sizeof(int) * (size_t)S),
      *rank = malloc(sizeof(int) * (size_t)S);
  if (!f || !key || !arg || !ord || !rank) abort();
  for (int i = 0; i < S; i++) f[i] = g->size[i] == 0 ? 0 : INFINITY;
  for (int s = 0; s < n; s++)
    layer(g, s, mode, cap, f + (size_t)s * (size_t)S, f + (size_t)(s + 1) * (size_t)S, arg + (size_t)s * (size_t)S, key,
          ord, rank);
  int all = 0;
  for (int i = 0; i < S; i++)
    if (g->size[i] == g->N) all = i;
  double best = f[(size_t)n * (size_t)S + (size_t)all];
  if (best < INFINITY) {
    chain[n] = all;
    for (int s = n; s > 0; s--) chain[s - 1] = arg[(size_t)(s - 1) * (size_t)S + (size_t)chain[s]];
  }
  free(f), free(key), free(arg), free(ord), free(rank);
  return best;
}

/* The order: stage by stage, each stage's nodes in their original order. */
static void make_order(const Dag *g, const int *chain, DagResult *out, Pool *pool) {
  int n = g->d->p->nstages, N = g->N;
  out->order = pool_alloc(pool, sizeof(int) * (size_t)N);
  out->start = pool_alloc(pool, sizeof(int) * (size_t)(n + 1));
  int q = 0;
  for (int s = 0; s < n; s++) {
    out->start[s] = q;
    const uint64_t *lo = g->bits + (size_t)chain[s] * (size_t)g->W, *hi = g->bits + (size_t)chain[s + 1] * (size_t)g->W;
    for (int k = 0; k < N; k++)
      if (has(hi, g->unit[k]) && !has(lo, g->unit[k])) out->order[q++] = k;
  }
  out->start[n] = q;
}

static void dag_free(Dag *g) {
  free(g->bits), free(g->size), free(g->hash), free(g->sums);
  g->bits = NULL, g->size = NULL, g->hash = NULL, g->sums = NULL;
}

/* Each value's reading nodes, CSR. */
static void readers(Dag *g, Pool *pool) {
  const DagProblem *d = g->d;
  int E = d->p->nedges;
  g->rstart = pool_alloc(pool, sizeof(int) * (size_t)(E + 1));
  g->rnode = pool_alloc(pool, sizeof(int) * (size_t)(d->nuse + 1));
  int *fill = pool_alloc(pool, sizeof(int) * (size_t)(E + 1));
  for (int u = 0; u < d->nuse; u++) g->rstart[d->use_edge[u] + 1]++;
  for (int e = 0; e < E; e++) g->rstart[e + 1] += g->rstart[e];
  memcpy(fill, g->rstart, sizeof(int) * (size_t)E);
  for (int u = 0; u < d->nuse; u++) g->rnode[fill[d->use_edge[u]]++] = d->use_node[u];
}

int dagpart_solve(const DagProblem *d, DagResult *out, Pool *pool) {
  const PartProblem *p = d->p;
  memset(out, 0, sizeof *out);
  if (p->nstages < 1 || p->nstages > p->N) return err_set("the downset DP needs 1 <= stages <= nodes (%d, %d)", p->nstages, p->N);
  Dag g = {.d = d, .N = p->N};
  int *nstart, *npred = node_preds(d, &nstart, pool);
  readers(&g, pool);
  int cap = d->max_states > 0 ? d->max_states : DAG_MAX_STATES;
  for (int coarse = 0; coarse < 2 && !out->ok; coarse++) {
    make_units(&g, nstart, npred, coarse, pool);
    out->ok = enumerate(&g, cap) == 0 && g.G >= p->nstages;
    out->coarse = coarse, out->states = g.S;
    if (!out->ok) dag_free(&g);
  }
  if (!out->ok) return 0;
  state_sums(&g);
  int *chain = pool_alloc(pool, sizeof(int) * (size_t)(p->nstages + 1));
  out->max_time = run(&g, 0, 0, chain);
  if (out->max_time < INFINITY) {
    run(&g, 1, out->max_time * (1 + 1e-9), chain); /* among equally fast chains, the most even */
    make_order(&g, chain, out, pool);
  }
  dag_free(&g);
  return 0;
}
