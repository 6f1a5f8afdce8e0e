/* schedchunk.c - virtual stages: the model cut into S = n V stages, each
 * of the n ranks running V of them (its chunks), so that the pipeline
 * fills and drains in steps of a chunk rather than of a rank's whole
 * share, and the bubble shrinks about V-fold.
 *
 * Interleaved 1F1B (Megatron-LM, forward_backward_pipelining_with_
 * interleaving): rank r's chunk c is stage c n + r.  A rank runs its
 * forwards in groups of n micro-batches per chunk, chunk after chunk, and
 * its backwards the same way from the last chunk down; a warm-up of
 * (n - r - 1) 2 + (V - 1) n forwards, then one forward and one backward
 * alternately, then the remaining backwards.  m must be a multiple of n,
 * as the groups are.  Full backwards (B).
 *
 * ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", the V-shaped
 * schedule): two chunks, rank r holding stages r and 2n-1-r, so the
 * forward runs down the ranks and back up, and rank 0 holds both the
 * first and the last stage.  The backward is split into I and W as zb1
 * does, and the order comes from a unit-time simulation over all ranks
 * (see order_zbv).
 *
 * Messages per chunk as for one (schedule_add_messages_chunked); two
 * stages on one rank (ZB-V's middle, and everything at n = 1) pass their
 * values by a local copy into the receive posted before the send. */
#include <stdlib.h>
#include <string.h>

#include "schedule.h"

static Action chunk_act(int kind, int mb, int chunk) {
  Action a = action_make(kind, mb);
  a.chunk = chunk;
  return a;
}

/* ---- interleaved ---- */

/* A rank's k-th forward (or backward): chunk (k / n) mod V (backwards from
 * the last chunk down), micro-batch (k / (n V)) n + k mod n. */
static Action interleaved_at(int k, int n, int V, int backward) {
  int ch = (k / n) % V;
  return chunk_act(backward ? ACT_B : ACT_F, (k / (n * V)) * n + k % n, backward ? V - 1 - ch : ch);
}

static int order_interleaved(Action *a, int r, int n, int V, int m) {
  int total = m * V, warm = (n - r - 1) * 2 + (V - 1) * n, f = 0, b = 0, k = 0;
  if (m == n || warm > total) warm = total; /* Megatron: with m = n every forward is warm-up */
  for (; f < warm; f++) a[k++] = interleaved_at(f, n, V, 0);
  while (f < total) {
    a[k++] = interleaved_at(f++, n, V, 0);
    a[k++] = interleaved_at(b++, n, V, 1);
  }
  while (b < total) a[k++] = interleaved_at(b++, n, V, 1);
  return k;
}

/* ---- ZB-V ---- */

/* The unit-time simulation's state, per stage (nf, ni, nw: F's, I's and
 * W's run; fend, iend [stage m + mb]: when they end, -1 not yet) and per
 * rank (open: micro-batch chunks whose W is not done). */
typedef struct Zbv {
  const Schedule *sc;
  int n, m, S, t;
  int *nf, *ni, *nw, *fend, *iend, *open;
} Zbv;

static int done_by(int end, int t) { return end >= 0 && end <= t; }

/* Whether rank r can run (kind, chunk) at time z->t.  Activation memory: a
 * rank keeps at most 2n micro-batch chunks without their W (each chunk is
 * about half a 1F1B stage, so this is 1F1B's first stage's peak), and a
 * chunk-0 forward leaves one of them free: a chunk-1 forward always finds
 * room for the micro-batch it carries on, so the lists cannot lock up with
 * every rank full of forwards waiting for the way back. */
static int zbv_ready(const Zbv *z, int r, int kind, int ch) {
  int st = sched_stage(z->sc, r, ch), m = z->m, cap = 2 * z->n;
  int f = z->nf[st], i = z->ni[st];
  switch (kind) {
  case ACT_F:
    if (f >= m || z->open[r] + (ch == 0) >= cap) return 0;
    return st == 0 || done_by(z->fend[(st - 1) * m + f], z->t);
  case ACT_I:
    if (i >= f) return 0;
    return done_by(st == z->S - 1 ? z->fend[st * m + i] : z->iend[(st + 1) * m + i], z->t);
  default: return z->nw[st] < i;
  }
}

static void zbv_run(Zbv *z, int r, int kind, int ch, Action *ord, int *len) {
  int st = sched_stage(z->sc, r, ch), m = z->m;
  int *count = kind == ACT_F ? z->nf : kind == ACT_I ? z->ni : z->nw, mb = count[st]++;
  if (kind == ACT_F) z->fend[st * m + mb] = z->t + 1, z->open[r]++;
  if (kind == ACT_I) z->iend[st * m + mb] = z->t + 1;
  if (kind == ACT_W) z->open[r]--;
  ord[(*len)++] = chunk_act(kind, mb, ch);
}

/* Each unit every rank runs the first ready action of its order: I's first
 * (the way back is the critical path; chunk 0's, of an older micro-batch
 * whose W then frees its memory, before chunk 1's), then forwards (chunk
 * 1's first: they lead to the loss and so to the next I's; chunk 0's first
 * starves the way back, to about 1F1B's bubble), then W's, which fill
 * what is left.  Stage 0's I feeds no one, so on rank 0 it comes after the
 * forwards, as zb1 runs its first stage's.  In unit time (F = I = W = 1 per
 * chunk) that gives a step within 3 units of 6m + n - 1 for n <= 6,
 * m <= 16 (rank n-1 cannot start before n - 1 units; 1F1B over the same
 * work: 6(m + n - 1)). */
static int order_zbv(const Schedule *sc, Action **ord, int *len, Pool *pool) {
  int n = sc->nstages, m = sc->m, S = 2 * n;
  Zbv z = {sc, n, m, S, 0, NULL, NULL, NULL, NULL, NULL, NULL};
  int **arrs[] = {&z.nf, &z.ni, &z.nw, &z.open};
  for (size_t k = 0; k < sizeof arrs / sizeof arrs[0]; k++) *arrs[k] = pool_alloc(pool, sizeof(int) * (size_t)S);
  z.fend = pool_alloc(pool, sizeof(int) * (size_t)(S * m)), z.iend = pool_alloc(pool, sizeof(int) * (size_t)(S * m));
  for (int k = 0; k < S * m; k++) z.fend[k] = z.iend[k] = -1;
  static const int later[6][2] = {{ACT_I, 0}, {ACT_I, 1}, {ACT_F, 1}, {ACT_F, 0}, {ACT_W, 1}, {ACT_W, 0}};
  static const int first[6][2] = {{ACT_I, 1}, {ACT_F, 1}, {ACT_F, 0}, {ACT_I, 0}, {ACT_W, 1}, {ACT_W, 0}};
  int left = 3 * m * S;
  for (; left > 0 && z.t < 16 * (m + S) * S; z.t++)
    for (int r = 0; r < n; r++) {
      const int(*order)[2] = r == 0 && n > 1 ? first : later;
      for (int k = 0; k < 6; k++)
        if (zbv_ready(&z, r, order[k][0], order[k][1])) {
          zbv_run(&z, r, order[k][0], order[k][1], ord[r], &len[r]);
          left--;
          break;
        }
    }
  return left ? err_set("schedule: zbv n=%d m=%d: the unit-time order does not finish (%d actions left)", n, m, left) : 0;
}

/* ---- building ---- */

static int chunked_refusal(int kind, int n, int V, int m) {
  if (kind != SCHED_INTERLEAVED && kind != SCHED_ZBV) return err_set("schedule: %s has no chunks (virtual stages)", schedule_name(kind));
  if (n < 1 || m < 1) return err_set("schedule: %s needs at least one rank and one micro-batch (got %d and %d)", schedule_name(kind), n, m);
  if (kind == SCHED_ZBV && V != 2) return err_set("schedule: zbv runs exactly 2 chunks per rank (got %d)", V);
  if (kind == SCHED_INTERLEAVED && V < 2) return err_set("schedule: interleaved needs at least 2 chunks per rank (got %d)", V);
  if (kind == SCHED_INTERLEAVED && m % n)
    return err_set("schedule: interleaved needs the micro-batches (m = %d) to be a multiple of the ranks (n = %d), as it runs them in "
                   "groups of n per chunk", m, n);
  return 0;
}

int schedule_build_chunked(Schedule *sc, int kind, int n, int V, int m, const StageCost *cost, Pool *pool) {
  if (chunked_refusal(kind, n, V, m)) return -1;
  int S = n * V;
  memset(sc, 0, sizeof *sc);
  sc->nstages = n, sc->m = m, sc->kind = kind, sc->nchunks = V;
  sc->act = pool_alloc(pool, sizeof(Action *) * (size_t)n);
  sc->nact = pool_alloc(pool, sizeof(int) * (size_t)n);
  sc->busy = pool_alloc(pool, sizeof(double) * (size_t)n);
  int **per_stage[] = {&sc->nslots, &sc->ngslots, &sc->nwslots, &sc->nxslots, &sc->nstore}; /* no offload with chunks: nxslots, nstore 0 */
  for (size_t k = 0; k < sizeof per_stage / sizeof per_stage[0]; k++) *per_stage[k] = pool_alloc(pool, sizeof(int) * (size_t)S);
  sc->hold = pool_alloc(pool, sizeof(int) * (size_t)S);
  sc->rings = pool_alloc(pool, sizeof(RingSizes) * (size_t)S);
  Action **ord = pool_alloc(pool, sizeof(Action *) * (size_t)n);
  int *len = pool_alloc(pool, sizeof(int) * (size_t)n);
  for (int r = 0; r < n; r++) ord[r] = pool_alloc(pool, sizeof(Action) * (size_t)(3 * V * m + 1));
  if (kind == SCHED_ZBV) {
    if (order_zbv(sc, ord, len, pool)) return -1;
  } else {
    for (int r = 0; r < n; r++) len[r] = order_interleaved(ord[r], r, n, V, m);
  }
  for (int r = 0; r < n; r++) {
    /* Per chunk at most 3 compute and 4 message actions per micro-batch, and the update. */
    sc->act[r] = pool_alloc(pool, sizeof(Action) * (size_t)(7 * V * m + 2));
    sc->nact[r] = schedule_add_messages_chunked(sc, r, sc->act[r], ord[r], len[r]);
    schedule_assign_slots(sc, r);
    schedule_ring_sizes(sc, r);
  }
  schedule_time(sc, cost); /* a stall is reported by schedule_validate, with names */
  err_clear();
  return 0;
}
