/* async.c - the async schedule (compiler/schedasync.c): the body runs once
 * per step t from first - lookahead: an action of micro-batch k is the run's
 * micro-batch g = t*m + k, of step g / m, run only when that step is one of
 * this run's (before: the fill; after the last: the drain).  Each F and B
 * computes on its step's weight version. */
#include <stdlib.h>

#include "run.h"

static unsigned char *weights_for(Run *r, int64_t step) {
  const PrStage *st = r->st;
  int64_t v = step > st->staleness ? step - st->staleness : 0;
  if (v == r->nupdates || !st->nwversions) return r->dev;
  if (v > r->nupdates || v < r->nupdates - st->nwversions)
    die(2, "internal error: step %lld needs the weights of step %lld; the newest are step %lld's and %d older are kept", (long long)step + 1,
        (long long)v, (long long)r->nupdates, st->nwversions);
  return dev_at(r, st->wversion_base + (v % st->nwversions) * st->wversion_bytes);
}

/* The sample indices of step `step`'s batch (computed once per step). */
static void batch_of(Run *r, int64_t step) {
  const PrStage *st = r->st;
  int64_t k = step % (st->lookahead + 1);
  r->idx = r->idx_ring + k * st->batch;
  if (r->idx_of[k] != step) data_batch_indices(&r->data, step, st->batch, r->a.seed, r->a.shuffle, r->idx), r->idx_of[k] = step;
}

static void async_body(Run *r, int64_t t, int64_t first) {
  const PrStage *st = r->st;
  int64_t m = st->microbatches, L1 = st->lookahead + 1;
  for (int k = 0; k < st->nactions; k++) {
    const PrAction *b = &st->actions[k];
    PrAction a = *b;
    int64_t step = t;
    if (b->kind == PR_UPDATE) {
      if (t < first) continue;
    } else {
      int64_t g = t * m + b->mb;
      if (g < first * m || g >= r->a.steps * m) continue;
      step = g / m, a.mb = (int)(g % m);
      if (b->slot >= 0) a.slot = (int)(g % st->nslots);
      if (b->gslot >= 0) a.gslot = (int)(g % st->ngslots);
    }
    r->step = step;
    if (a.kind == PR_F || a.kind == PR_B) {
      pr_weights = weights_for(r, step);
      if (a.kind == PR_F && r->have_data && r->data.kind != DATA_TOKENS) batch_of(r, step);
    }
    r->aloss[step % L1] += timed_action(r, &a, step);
    pr_weights = r->dev;
  }
  r->step = t;
}

void run_async(Run *r, StepLog *sl) {
  const PrStage *st = r->st;
  int64_t first = r->step, L1 = st->lookahead + 1, *own = r->idx;
  r->nupdates = first;
  r->idx_ring = malloc(sizeof(int64_t) * (size_t)(L1 * st->batch));
  r->idx_of = malloc(sizeof(int64_t) * (size_t)L1);
  r->aloss = calloc((size_t)L1, sizeof(double));
  if (!r->idx_ring || !r->idx_of || !r->aloss) die(2, "out of memory for the async schedule's bookkeeping");
  for (int64_t k = 0; k < L1; k++) r->idx_of[k] = -1;
  for (int64_t t = first - st->lookahead; t < r->a.steps; t++) {
    double t0 = now(), busy0 = r->t_busy;
    if (t >= first) zero_grads(r); /* the body's backwards are all step t's, after step t-1's UPDATE */
    async_body(r, t, first);
    if (t < first) continue; /* the fill: forwards of the first steps only */
    double loss = r->aloss[t % L1], dt = now() - t0;
    r->aloss[t % L1] = 0;
    bubble_step(r, t, first, busy0, dt);
    end_step(r, sl, loss, dt);
  }
  r->step = r->a.steps;
  free(r->idx_ring), free(r->idx_of), free(r->aloss);
  r->idx_ring = r->idx_of = NULL, r->aloss = NULL, r->idx = own;
}
