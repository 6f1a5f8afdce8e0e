/* layout.c - pipecc --ranks P: how P ranks are spent, as stages or as replicas.
 *
 * A pipeline of S stages idles in its bubble and pays for the values at its
 * cuts; R replicas of it pay for summing their gradients and hold R copies of
 * the weights.  Which wins depends on the model and the machine, so the
 * planner does not guess: every S x R = P is planned in full, as pipecc -n S
 * --replicas R would plan it (cuts, schedule, memory plan under --mem-limit,
 * the step simulated with the sums' time over the links), under each
 * synchronous schedule when --schedule auto asks, and the fastest predicted
 * step that fits is kept.  All of them train the same global batch, so their
 * steps compare directly.  The listing shows every candidate and why the
 * winner won. */
#include "layout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "util.h"

/* The schedules compared per layout: the synchronous ones that replicate (interleaved and zbv do not yet). */
static const int KINDS[] = {SCHED_1F1B, SCHED_GPIPE, SCHED_ZB1};
enum { NKINDS = 3, MAX_LAYOUTS = 64 * NKINDS };

/* A candidate within this of the fastest's predicted step is as fast (driver.c's AUTO_SAME_STEP). */
#define LAYOUT_SAME_STEP 1.005

/* Why R replicas cannot train o's batch ("" when they can). */
static const char *unfit_batch(const Options *o, int R, char *buf, size_t len) {
  if (o->batch > 0 && o->batch % R) return snprintf(buf, len, "--batch %lld is not divisible by %d replicas", (long long)o->batch, R), buf;
  if (o->batch > 0 && o->microbatches > 0 && (o->batch / R) % o->microbatches)
    return snprintf(buf, len, "%lld samples per replica are not divisible by --microbatches %d", (long long)(o->batch / R), o->microbatches), buf;
  return "";
}

int layout_choose(Options *o, void (*plan)(Options t, SchedCand *c)) {
  static LayoutCand cand[MAX_LAYOUTS];
  int n = 0, best = -1, P = o->ranks;
  int nk = o->schedule_auto ? NKINDS : 1;
  for (int S = 1; S <= P && n + nk <= MAX_LAYOUTS; S++) {
    if (P % S) continue;
    for (int k = 0; k < nk; k++, n++) {
      LayoutCand *L = &cand[n];
      memset(L, 0, sizeof *L);
      L->stages = S, L->replicas = P / S, L->c.kind = o->schedule_auto ? KINDS[k] : o->schedule, L->c.chunks = 1;
      Options t = *o;
      t.nstages = t.nranks = S, t.replicas = P / S, t.schedule_auto = 0, t.ranks = 0;
      const char *why = unfit_batch(&t, P / S, L->c.why, sizeof L->c.why);
      if (!*why && P / S > 1 && args_check_replicas(&t, L->c.why, sizeof L->c.why)) why = L->c.why;
      if (*why) continue;
      plan(t, &L->c);
      L->zero = t.zero;
      /* Over --mem-limit with every replica holding all the optimizer state: sharded, it may fit. */
      char zwhy[320];
      if (!L->c.fits && P / S > 1 && !t.zero && !o->zero_given && o->mem_limit > 0) {
        SchedCand z = {.kind = L->c.kind, .chunks = 1};
        t.zero = 1;
        if (!args_check_replicas(&t, zwhy, sizeof zwhy)) plan(t, &z);
        if (z.fits) L->c = z, L->zero = 1;
      }
      if (L->c.fits && (best < 0 || L->c.step < cand[best].c.step)) best = n;
    }
  }
  if (best < 0) {
    Buf msg = {0};
    buf_printf(&msg, "%s: --ranks %d: no layout plans:", o->model, P);
    for (int i = 0; i < n; i++)
      buf_printf(&msg, "%s %d x %d %s: %.160s", i ? ";" : "", cand[i].stages, cand[i].replicas, schedule_name(cand[i].c.kind), cand[i].c.why);
    int rc = report_error("%s", msg.s);
    buf_free(&msg);
    return rc;
  }
  int keep = best;
  for (int i = 0; i < n; i++)
    if (cand[i].c.fits && cand[i].c.step <= cand[best].c.step * LAYOUT_SAME_STEP && cand[i].c.peak < cand[keep].c.peak) keep = i;
  o->nstages = o->nranks = cand[keep].stages, o->replicas = cand[keep].replicas, o->schedule = cand[keep].c.kind;
  o->zero = cand[keep].zero;
  o->schedule_auto = 0, o->layouts = cand, o->nlayouts = n, o->layout_kept = keep;
  return 0;
}
