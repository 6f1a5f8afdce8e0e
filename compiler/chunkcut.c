/* chunkcut.c - balancing the ranks of a chunked plan.
 *
 * The partitioner (partition.c, dagpart.c) cuts the V x n stages so that the slowest stage is as fast as it
 * can be.  A rank runs V of them, and what its pipeline waits for is the rank: its time is the sum of its
 * chunks' (interleaved: stages r, r + n, ...; zbv: r and 2n - 1 - r), and how its chunks' actions
 * interleave with the other ranks' decides the bubble.  Stages that are each balanced can still leave one
 * rank with two heavy ones, or a V whose way back waits.  This pass starts from the partitioner's cuts and
 * moves one cut by one node at a time, taking the move that shortens the step the lists predict most: the
 * unit-time lists (p->slots: their order does not depend on times) simulated with the moved stages' costs,
 * the cores shared as the plan will share them (schedule_time).  At the same step, the sum of the ranks'
 * squared times breaks the tie (the most even).  It stops when no move helps.  A move keeps every stage
 * non-empty and within its memory (part_stage_mem against part_stage_limit, the prices the partitioner
 * decided with).  Which nodes sit on which stage does not change any sum's order, so the trained bits are
 * the same for any cuts. */
#include "chunkcut.h"

#include <math.h>
#include <string.h>

#include "planq.h"

/* At most this many moves (each a simulation per cut and direction): a long order's cuts move a node at
 * a time, so past it the DP's cuts stand where the search stopped. */
#define CHUNKCUT_MOVES 2000

typedef struct Bal {
  Plan *p;
  PartCtx *ctx;
  int S, n;
  int *start;
  StageCost *cost;
  Schedule sim;       /* the unit-time lists, copied: simulating them writes their actions' times */
} Bal;

/* The step the lists predict with the stages' costs (the first figure), and the sum of the ranks' squared
 * times (the second). */
static void rank_times(Bal *b, double *step, double *squares) {
  *squares = 0;
  for (int r = 0; r < b->n; r++) {
    double t = 0;
    for (int c = 0; c < b->p->opt.chunks; c++) t += b->cost[sched_stage(&b->sim, r, c)].time;
    *squares += t * t;
  }
  *step = schedule_time(&b->sim, b->cost) ? INFINITY : b->sim.step_time;
  err_clear();
}

/* A copy of the unit-time lists to simulate, on the cores the plan's ranks will share. */
static void sim_copy(Bal *b) {
  const Schedule *u = &b->p->slots;
  Pool *pool = &b->p->g.pool;
  b->sim = *u;
  b->sim.act = pool_alloc(pool, sizeof(Action *) * (size_t)u->nstages);
  b->sim.busy = pool_alloc(pool, sizeof(double) * (size_t)u->nstages);
  for (int r = 0; r < u->nstages; r++) {
    b->sim.act[r] = pool_alloc(pool, sizeof(Action) * (size_t)(u->nact[r] + 1));
    memcpy(b->sim.act[r], u->act[r], sizeof(Action) * (size_t)u->nact[r]);
  }
  b->sim.cores = plan_core_groups(b->p), b->sim.core_of = NULL;
}

/* Stage s holding [i, j) fits its memory. */
static int fits(const Bal *b, int s, int i, int j) {
  double lim = part_stage_limit(&b->p->prob, s);
  return lim <= 0 || part_stage_mem(b->ctx, s, i, j) <= lim;
}

/* Tries cut k at `at`: 1 and the stages' new costs in a, c when both stages fit. */
static int try_cut(const Bal *b, int k, int at, StageCost *a, StageCost *c) {
  if (at <= b->start[k - 1] || at >= b->start[k + 1]) return 0;
  if (!fits(b, k - 1, b->start[k - 1], at) || !fits(b, k, at, b->start[k + 1])) return 0;
  part_stage_cost(b->ctx, k - 1, b->start[k - 1], at, a);
  part_stage_cost(b->ctx, k, at, b->start[k + 1], c);
  return 1;
}

/* One pass over every cut and direction: applies the best improving move.  1 when one was applied. */
static int best_move(Bal *b) {
  double w0, q0;
  rank_times(b, &w0, &q0);
  int bk = -1, bat = 0;
  double bw = w0, bq = q0;
  for (int k = 1; k < b->S; k++)
    for (int d = -1; d <= 1; d += 2) {
      StageCost a, c, sa = b->cost[k - 1], sc = b->cost[k];
      if (!try_cut(b, k, b->start[k] + d, &a, &c)) continue;
      b->cost[k - 1] = a, b->cost[k] = c;
      double w, q;
      rank_times(b, &w, &q);
      b->cost[k - 1] = sa, b->cost[k] = sc;
      if (w < bw * (1 - 1e-9) || (w <= bw * (1 + 1e-12) && q < bq * (1 - 1e-9))) bk = k, bat = b->start[k] + d, bw = w, bq = q;
    }
  if (bk < 0) return 0;
  StageCost a, c;
  try_cut(b, bk, bat, &a, &c);
  b->start[bk] = bat, b->cost[bk - 1] = a, b->cost[bk] = c;
  return 1;
}

int chunks_balance(Plan *p) {
  int S = p->opt.nstages;
  if (p->opt.chunks <= 1 || S < 2) return 0;
  Bal b = {p, part_prepare(&p->prob), S, opt_ranks(&p->opt), p->part.start, p->part.cost, {0}};
  sim_copy(&b);
  double w0, q0, w1, q1;
  rank_times(&b, &w0, &q0);
  int moves = 0;
  while (moves < CHUNKCUT_MOVES && best_move(&b)) moves++;
  part_ctx_free(b.ctx);
  p->part.max_time = 0;
  for (int s = 0; s < S; s++) p->part.max_time = fmax(p->part.max_time, p->part.cost[s].time);
  rank_times(&b, &w1, &q1);
  if (moves)
    p->part_note = pool_printf(&p->g.pool, "%s; then %d cut move%s balanced the ranks' chunks: step %s simulated (the stages' "
                                           "best cuts: %s)", p->part_note ? p->part_note : "cuts", moves, moves == 1 ? "" : "s",
                               fmt_time(w1), fmt_time(w0));
  return 0;
}
