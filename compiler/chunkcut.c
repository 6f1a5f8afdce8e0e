/* chunkcut.c - balancing the ranks of a chunked plan.
 *
 * The partitioner (partition.c, dagpart.c) cuts the V x n stages so that the slowest stage is as fast as it
 * can be.  A rank runs V of them, and what its pipeline waits for is the rank: its time is the sum of its
 * chunks' (interleaved: stages r, r + n, ...; zbv: r and 2n - 1 - r).  Stages that are each balanced can
 * still leave one rank with two heavy ones.  This pass starts from the partitioner's cuts and moves one cut
 * by one node at a time, taking the move that lowers the slowest rank's time most (or, at the same slowest
 * rank, the sum of the ranks' squared times: the most even), until no move helps.  A move must keep every
 * stage non-empty and within its memory (part_stage_mem against part_stage_limit, the prices the
 * partitioner decided with).  Which nodes sit on which stage does not change any sum's order, so the
 * trained bits are the same for any cuts. */
#include "chunkcut.h"

#include <math.h>

typedef struct Bal {
  Plan *p;
  PartCtx *ctx;
  int S, n;
  int *start;
  StageCost *cost;
} Bal;

/* The slowest rank's time and the sum of the ranks' squared times. */
static void rank_times(const Bal *b, double *worst, double *squares) {
  *worst = 0, *squares = 0;
  for (int r = 0; r < b->n; r++) {
    double t = 0;
    for (int c = 0; c < b->p->opt.chunks; c++) t += b->cost[sched_stage(&b->p->slots, r, c)].time;
    *worst = fmax(*worst, t), *squares += t * t;
  }
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
  Bal b = {p, part_prepare(&p->prob), S, opt_ranks(&p->opt), p->part.start, p->part.cost};
  double w0, q0, w1, q1;
  rank_times(&b, &w0, &q0);
  int moves = 0;
  while (moves < 64 * p->N && best_move(&b)) moves++;
  part_ctx_free(b.ctx);
  p->part.max_time = 0;
  for (int s = 0; s < S; s++) p->part.max_time = fmax(p->part.max_time, p->part.cost[s].time);
  rank_times(&b, &w1, &q1);
  if (moves)
    p->part_note = pool_printf(&p->g.pool, "%s; then %d cut move%s balanced the ranks' chunks: slowest rank %s (the stages' "
                                           "best cuts: %s)", p->part_note ? p->part_note : "cuts", moves, moves == 1 ? "" : "s",
                               fmt_time(w1), fmt_time(w0));
  return 0;
}
