/* test_schedule.c - the action lists and their validator.
 *
 * (a) Every schedule the compiler builds - gpipe, 1f1b, zb1, and forward
 * only - for n = 1..8 stages and m = 1..16 micro-batches passes the
 * validator; its rings are no larger than the partitioner's memory bounds;
 * backwards and W's run in ascending micro-batch order; zb1 keeps at most
 * p micro-batches without their W on any stage (1F1B's peak), and in unit
 * time (F = I = W = 1) is never slower than 1F1B (F = 1, B = 2) and, for
 * m >= p, within two units of the ZB-H1 step 3m + p - 1.
 * (b) Planted mistakes are rejected with a message naming the rank: forwards
 * out of order, a missing SEND, a slot taken while still live, and a
 * deadlock between two ranks.
 * (c) async (--schedule async --staleness K) for n = 1..8, m = 1..16, K = 1..3:
 * every list it builds passes the validator (weight versions, and a barrier
 * between steps); where it refuses, the smallest m it names builds and the
 * one below it does not; in unit time its steady step is m (F + B) - the
 * bubble 1F1B pays every step is gone - and never longer than 1F1B's step;
 * an UPDATE moved before a step's last backward, a forward moved ahead of
 * the update it needs, and a staleness lowered below the lists' lookahead
 * are refused by the validator.
 * (d) schedule_jitter (see jitter_case).
 * (e) schedule_pin (see pin_case): with a core per rank nothing is pinned and
 * the step is the unshared one; with more ranks than cores, every schedule
 * at n = 3..8 on 1..3 cores pins each rank to a core, no core ever runs two
 * compute actions at once in the simulation, the step is at least the work
 * over the cores and the busiest core's work, and no other pairing of n = 4
 * ranks on 2 cores simulates faster than the one kept. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schedule.h"

#include "check.h"

static void unit_costs(StageCost *c, int p, double bwd) {
  memset(c, 0, sizeof(StageCost) * (size_t)p);
  for (int s = 0; s < p; s++) c[s].fwd = 1, c[s].bwd = bwd, c[s].bwd_w = bwd / 2;
}

/* Backwards (B or I) and W's ascending; the most micro-batches without their W (zb1) or B. */
static int order_ok(const Schedule *sc, int s, int *peak) {
  int lastb = -1, lastw = -1, open = 0, ok = 1;
  *peak = 0;
  for (int k = 0; k < sc->nact[s]; k++) {
    const Action *a = &sc->act[s][k];
    if (a->kind == ACT_F) open++;
    if (a->kind == ACT_B || a->kind == ACT_W) open--;
    if (a->kind == ACT_B || a->kind == ACT_I) ok &= a->mb == lastb + 1, lastb = a->mb;
    if (a->kind == ACT_W) ok &= a->mb == lastw + 1, lastw = a->mb;
    if (open > *peak) *peak = open;
  }
  return ok;
}

static void accepts(int kind, int p, int m, int fwd_only) {
  Pool pool = {0};
  StageCost c[8];
  unit_costs(c, p, kind == SCHED_ZB1 ? 2 : 1);
  Schedule sc;
  schedule_build(&sc, kind, p, m, fwd_only, c, &pool);
  const char *name = fwd_only ? "forward-only" : schedule_name(kind);
  int rc = schedule_validate(&sc);
  CHECK(rc == 0, "%s n=%d m=%d rejected: %s\n", name, p, m, rc ? err_msg() : "");
  for (int s = 0; s < p && !fwd_only; s++) {
    int peak;
    CHECK(order_ok(&sc, s, &peak), "%s n=%d m=%d rank %d: backwards or W's out of order\n", name, p, m, s);
    CHECK(peak <= stage_inflight(kind, s, p, m), "%s n=%d m=%d rank %d: %d micro-batches open, 1f1b allows %d\n", name, p, m, s, peak,
          stage_inflight(kind, s, p, m));
    CHECK(sc.nslots[s] <= stage_copies(kind, s, p, m) && sc.ngslots[s] <= stage_gcopies(kind, s, p, m),
          "%s n=%d m=%d rank %d: rings %d/%d over the partitioner's bounds %d/%d\n", name, p, m, s, sc.nslots[s], sc.ngslots[s],
          stage_copies(kind, s, p, m), stage_gcopies(kind, s, p, m));
  }
  if (kind == SCHED_ZB1 && !fwd_only) {
    Schedule ref;
    schedule_build(&ref, SCHED_1F1B, p, m, 0, c, &pool);
    CHECK(sc.step_time <= ref.step_time + 1e-9, "zb1 n=%d m=%d: %g units, 1f1b %g\n", p, m, sc.step_time, ref.step_time);
    if (m >= p)
      CHECK(sc.step_time <= 3 * m + p + 1 + 1e-9, "zb1 n=%d m=%d: %g units, ZB-H1 takes %d\n", p, m, sc.step_time, 3 * m + p - 1);
  }
  pool_free(&pool);
}

/* Builds 1f1b n=4 m=8, applies a mistake, and expects a message naming rank `rank` and containing `what`. */
static void rejects(const char *label, void (*plant)(Schedule *), int rank, const char *what) {
  Pool pool = {0};
  StageCost c[4];
  unit_costs(c, 4, 1);
  Schedule sc;
  schedule_build(&sc, SCHED_1F1B, 4, 8, 0, c, &pool);
  plant(&sc);
  char want[32];
  snprintf(want, sizeof want, "rank %d", rank);
  int rc = schedule_validate(&sc);
  const char *msg = rc ? err_msg() : "";
  CHECK(rc == -1 && strstr(msg, want) && strstr(msg, what), "%s: got %s'%s', want a message with '%s' and '%s'\n", label,
        rc ? "" : "acceptance ", msg, want, what);
  if (rc == -1) printf("ok - rejects %s: %s\n", label, msg);
  err_clear();
  pool_free(&pool);
}

static int find(const Schedule *sc, int s, int kind, int mb) {
  for (int k = 0; k < sc->nact[s]; k++)
    if (sc->act[s][k].kind == kind && sc->act[s][k].mb == mb) return k;
  return -1;
}

/* Rank 2 runs F3 (and SEND3) where F2 was, and F2 where F3 was. */
static void swap_forwards(Schedule *sc) {
  for (int kind = ACT_F; kind <= ACT_SEND; kind += ACT_SEND - ACT_F) {
    int a = find(sc, 2, kind, 2), b = find(sc, 2, kind, 3);
    Action t = sc->act[2][a];
    sc->act[2][a] = sc->act[2][b], sc->act[2][b] = t;
  }
}

/* Rank 1 forgets to send micro-batch 3 on. */
static void drop_send(Schedule *sc) {
  int k = find(sc, 1, ACT_SEND, 3);
  memmove(&sc->act[1][k], &sc->act[1][k + 1], sizeof(Action) * (size_t)(sc->nact[1] - k - 1));
  sc->nact[1]--;
}

/* Rank 1 receives micro-batch 1 into micro-batch 0's slot. */
static void reuse_slot(Schedule *sc) {
  int slot0 = sc->act[1][find(sc, 1, ACT_F, 0)].slot;
  for (int k = 0; k < sc->nact[1]; k++)
    if (sc->act[1][k].mb == 1 && sc->act[1][k].slot >= 0) sc->act[1][k].slot = slot0;
}

/* Rank 1 runs B0 before F1; rank 2 needs F1 (from rank 1) before its B0. */
static void deadlock(Schedule *sc) {
  int f = find(sc, 1, ACT_F, 1), b = find(sc, 1, ACT_B, 0);
  Action moved = sc->act[1][b];
  memmove(&sc->act[1][f + 1], &sc->act[1][f], sizeof(Action) * (size_t)(b - f));
  sc->act[1][f] = moved;
}

/* The paper's figure: n = 4, m = 8, F = I = W = 1 takes 27 units (1F1B 33). */
static void zb1_paper_case(void) {
  Pool pool = {0};
  StageCost c[4];
  unit_costs(c, 4, 2);
  Schedule zb, ref;
  schedule_build(&zb, SCHED_ZB1, 4, 8, 0, c, &pool);
  schedule_build(&ref, SCHED_1F1B, 4, 8, 0, c, &pool);
  CHECK(fabs(zb.step_time - 27) < 1e-9 && fabs(ref.step_time - 33) < 1e-9, "zb1 n=4 m=8: %g units (want 27), 1f1b %g (want 33)\n",
        zb.step_time, ref.step_time);
  if (fabs(zb.step_time - 27) < 1e-9) printf("ok - zb1 n=4 m=8 in unit time: 27 units, 1f1b 33\n");
  pool_free(&pool);
}

/* PipeFB's lists over links like pipefb_links makes: nf forward ranks, each
 * feeding every backward rank (the most links a split can have). */
static void fb_links(FbLinks *L, int n, int nf, Pool *pool) {
  fb_links_init(L, n, nf, pool);
  for (int f = 0; f < nf; f++)
    for (int b = nf; b < n; b++) {
      L->stash_to[f][L->nstash_to[f]++] = b, L->stash_from[b][L->nstash_from[b]++] = f;
      L->w_from[f][L->nw_from[f]++] = b, L->w_to[b][L->nw_to[b]++] = f;
    }
}

static void fb_case(void) {
  Pool pool = {0};
  int f0 = failed;
  for (int n = 2; n <= 8; n++)
    for (int nf = 1; nf < n; nf++)
      for (int m = 1; m <= 12; m++) {
        FbLinks L;
        fb_links(&L, n, nf, &pool);
        StageCost *c = pool_alloc(&pool, sizeof(StageCost) * (size_t)n);
        for (int r = 0; r < n; r++) c[r].fwd = r < nf ? 1 : 0, c[r].bwd = r < nf ? 0 : 2, c[r].update = 0.5;
        Schedule sc;
        schedule_build_pipefb(&sc, &L, n, m, c, &pool);
        CHECK(!schedule_validate(&sc), "pipefb n=%d nf=%d m=%d passes the validator (%s)", n, nf, m, err_msg());
        CHECK(sc.step_time > 0, "pipefb n=%d nf=%d m=%d has a predicted step", n, nf, m);
        /* The forward chain's compute alone takes m forwards, the backward's m backwards and the update. */
        CHECK(sc.step_time >= m * 2 + 0.5 - 1e-9, "pipefb n=%d nf=%d m=%d: step %.2f covers a backward rank's work", n, nf, m, sc.step_time);
        err_clear();
      }
  if (failed == f0) printf("ok - pipefb lists for n = 2..8, every split, m = 1..12 pass the validator\n");
  /* Broken lists are refused, naming what is wrong. */
  FbLinks L;
  fb_links(&L, 4, 2, &pool);
  StageCost c[4] = {{.fwd = 1}, {.fwd = 1}, {.bwd = 2}, {.bwd = 2}};
  Schedule sc;
  schedule_build_pipefb(&sc, &L, 4, 4, c, &pool);
  /* 1: rank 0 drops its RECV_WEIGHTS. */
  sc.nact[0]--;
  CHECK(schedule_validate(&sc) && strstr(err_msg(), "RECV_WEIGHTS"), "pipefb without RECV_WEIGHTS is refused (%s)", err_msg());
  err_clear();
  sc.nact[0]++;
  /* 2: two backwards swapped on rank 2. */
  Action *a = sc.act[2];
  int i0 = -1, i1 = -1;
  for (int k = 0; k < sc.nact[2]; k++)
    if (a[k].kind == ACT_B && a[k].mb == 0) i0 = k;
    else if (a[k].kind == ACT_B && a[k].mb == 1) i1 = k;
  Action t = a[i0];
  a[i0] = a[i1], a[i1] = t;
  CHECK(schedule_validate(&sc) != 0, "pipefb with backwards out of order is refused (%s)", err_msg());
  err_clear();
  a[i1] = a[i0], a[i0] = t;
  /* 3: a stash link known from one end only. */
  L.nstash_from[3] = 1; /* rank 3 no longer expects rank 1's stash */
  CHECK(schedule_validate(&sc) && strstr(err_msg(), "does not expect"), "a one-sided stash link is refused (%s)", err_msg());
  err_clear();
  L.nstash_from[3] = 2;
  CHECK(!schedule_validate(&sc), "the repaired list passes again (%s)", err_msg());
  err_clear();
  pool_free(&pool);
}

/* Index of the u-th UPDATE on rank s. */
static int nth_upd(const Schedule *sc, int s, int u) {
  for (int k = 0; k < sc->nact[s]; k++)
    if (sc->act[s][k].kind == ACT_UPDATE && u-- == 0) return k;
  return -1;
}

static void async_case(void) {
  Pool pool = {0};
  StageCost c[8];
  int f0 = failed;
  for (int K = 1; K <= 3; K++)
    for (int p = 1; p <= 8; p++)
      for (int m = 1; m <= 16; m++) {
        unit_costs(c, p, 1);
        Schedule sc, sync;
        int rc = schedule_build_async(&sc, p, m, K, c, &pool);
        if (rc) {
          int need = 0;
          const char *at = strstr(err_msg(), "needs --microbatches ");
          CHECK(at && sscanf(at, "needs --microbatches %d", &need) == 1 && need > m, "async n=%d m=%d K=%d: refusal names no larger m (%s)\n", p, m, K,
                err_msg());
          if (need > m && need <= 64) {
            Schedule ok;
            CHECK(schedule_build_async(&ok, p, need, K, c, &pool) == 0, "async n=%d K=%d: the m=%d it names is refused too\n", p, K, need);
            if (need - 1 > m) CHECK(schedule_build_async(&ok, p, need - 1, K, c, &pool) != 0, "async n=%d K=%d: m=%d also builds, so %d is not the smallest\n", p, K, need - 1, need);
          }
          continue;
        }
        CHECK(schedule_validate(&sc) == 0, "async n=%d m=%d K=%d: refused by the validator: %s\n", p, m, K, err_msg());
        CHECK(fabs(sc.step_time - 2.0 * m) < 1e-9, "async n=%d m=%d K=%d: steady step %g units, want %d\n", p, m, K, sc.step_time, 2 * m);
        schedule_build(&sync, SCHED_1F1B, p, m, 0, c, &pool);
        CHECK(sc.step_time <= sync.step_time + 1e-9, "async n=%d m=%d K=%d: step %g units, longer than 1f1b's %g\n", p, m, K, sc.step_time, sync.step_time);
        CHECK(p == 1 || sc.fill_drain > 0, "async n=%d m=%d K=%d: no fill or drain predicted\n", p, m, K);
      }
  if (failed == f0) printf("ok - async lists for n = 1..8, m = 1..16, K = 1..3 pass the validator or name the smallest m; steady step m (F+B)\n");
  /* Planted mistakes, on n = 4, m = 4, K = 1. */
  unit_costs(c, 4, 1);
  Schedule sc;
  CHECK(schedule_build_async(&sc, 4, 4, 1, c, &pool) == 0, "async n=4 m=4 K=1 builds (%s)\n", err_msg());
  /* The UPDATE of step 1 on rank 2 moved one place earlier, before a backward of step 1. */
  int u = nth_upd(&sc, 2, 1);
  while (sc.act[2][u - 1].kind != ACT_B) {
    sc.act[2][u] = sc.act[2][u - 1], sc.act[2][u - 1] = (Action){ACT_UPDATE, -1, -1, -1, -1, -1, 0, 0}, u--;
  }
  sc.act[2][u] = sc.act[2][u - 1], sc.act[2][u - 1] = (Action){ACT_UPDATE, -1, -1, -1, -1, -1, 0, 0};
  CHECK(schedule_validate(&sc) != 0 && strstr(err_msg(), "rank 2") && strstr(err_msg(), "backward"),
        "an UPDATE before its step's last backward is refused (%s)\n", err_msg());
  /* Staleness 0 with lists that run forwards a step ahead: a version that does not exist yet. */
  CHECK(schedule_build_async(&sc, 4, 4, 1, c, &pool) == 0, "async n=4 m=4 K=1 builds again\n");
  sc.staleness = 0;
  CHECK(schedule_validate(&sc) != 0 && strstr(err_msg(), "needs the weights of step"), "lists running ahead of staleness 0 are refused (%s)\n",
        err_msg());
  /* A forward of step 2 moved before rank 0's UPDATE of step 0 (staleness 1: it needs W_1). */
  CHECK(schedule_build_async(&sc, 4, 4, 1, c, &pool) == 0, "async n=4 m=4 K=1 builds again\n");
  u = nth_upd(&sc, 0, 0);
  int f = -1;
  for (int k = u + 1; k < sc.nact[0] && f < 0; k++)
    if (sc.act[0][k].kind == ACT_F && sc.act[0][k].mb == 8) f = k;
  CHECK(f > u, "rank 0 runs F8 after its first UPDATE\n");
  if (f > u) {
    Action a = sc.act[0][f];
    memmove(&sc.act[0][u + 1], &sc.act[0][u], sizeof(Action) * (size_t)(f - u));
    sc.act[0][u] = a;
    CHECK(schedule_validate(&sc) != 0 && strstr(err_msg(), "rank 0") && strstr(err_msg(), "F8"), "F8 before the update it needs is refused (%s)\n",
          err_msg());
  }
  pool_free(&pool);
}

/* (d) schedule_jitter: spread action times make a balanced 1F1B wait at its exchanges, so the
 * mean step and bubble grow with the spread; the same call gives the same figures (a fixed seed);
 * the actions keep their median timing; no spread changes nothing. */
static void jitter_case(void) {
  Pool pool = {0};
  StageCost c[2];
  unit_costs(c, 2, 2);
  Schedule sc;
  schedule_build(&sc, SCHED_1F1B, 2, 8, 0, c, &pool);
  CHECK(schedule_time(&sc, c) == 0, "jitter: 1f1b n=2 m=8 simulates\n");
  double t0 = sc.step_time, b0 = sc.bubble, end0 = sc.act[0][sc.nact[0] - 1].end;
  CHECK(schedule_jitter(&sc, c, 0, 64) == 0 && sc.step_time == t0 && sc.bubble == b0 && sc.jitter == 0,
        "jitter: no spread leaves the step (%g vs %g)\n", sc.step_time, t0);
  double prev = t0, prevb = b0;
  for (double cv = 0.05; cv < 0.31; cv += 0.125) {
    CHECK(schedule_jitter(&sc, c, cv, 64) == 0, "jitter %g: simulates\n", cv);
    double t = sc.step_time, b = sc.bubble;
    CHECK(t > prev && b > prevb, "jitter %g: step %g and bubble %g grow (from %g, %g)\n", cv, t, b, prev, prevb);
    CHECK(sc.step_time_fixed == t0 && sc.bubble_fixed == b0 && sc.act[0][sc.nact[0] - 1].end == end0,
          "jitter %g: the figures at the medians (%g) and the actions' timing are kept\n", cv, sc.step_time_fixed);
    CHECK(schedule_jitter(&sc, c, cv, 64) == 0 && sc.step_time == t && sc.bubble == b, "jitter %g: the same figures again\n", cv);
    prev = t, prevb = b;
  }
  printf("ok - schedule_jitter: 1f1b n=2 m=8, spread 0.05..0.30: mean step %.2f units (%.2f at the medians)\n", prev, t0);
  /* One stage: nothing waits, so the bubble is 0 whatever the draws (a draw's busy time is its own,
   * drawn time; counted at the medians, a draw shorter than them made the bubble negative). */
  Schedule one;
  schedule_build(&one, SCHED_1F1B, 1, 8, 0, c, &pool);
  for (double cv = 0.05; cv < 0.31; cv += 0.125) {
    CHECK(schedule_jitter(&one, c, cv, 64) == 0 && fabs(one.bubble) < 1e-9,
          "jitter %g: one stage's bubble is %g, not 0\n", cv, one.bubble);
  }
  pool_free(&pool);
}

static int is_cpu(int kind) { return action_is_compute(kind) || kind == ACT_RECOMPUTE || kind == ACT_UPDATE; }

/* Two compute actions on one core at once (the pinned simulation's rule), or 0. */
static int core_overlap(const Schedule *sc, char *what, size_t len) {
  for (int a = 0; a < sc->nstages; a++)
    for (int b = a; b < sc->nstages; b++) {
      if (sc->core_of[a] != sc->core_of[b]) continue;
      for (int i = 0; i < sc->nact[a]; i++)
        for (int j = a == b ? i + 1 : 0; j < sc->nact[b]; j++) {
          const Action *x = &sc->act[a][i], *y = &sc->act[b][j];
          if (!is_cpu(x->kind) || !is_cpu(y->kind) || x->end <= x->start || y->end <= y->start) continue;
          if (x->start < y->end - 1e-9 && y->start < x->end - 1e-9) {
            snprintf(what, len, "ranks %d and %d on core %d: [%g, %g] and [%g, %g]", a, b, sc->core_of[a], x->start, x->end, y->start,
                     y->end);
            return 1;
          }
        }
    }
  return 0;
}

static void pin_case(void) {
  Pool pool = {0};
  int f0 = failed;
  StageCost c[8];
  for (int kind = 0; kind <= SCHED_ZB1; kind++)
    for (int p = 1; p <= 8; p++) {
      /* Uneven stages: the middle ones heavier, so the pairing matters. */
      unit_costs(c, p, 2);
      for (int s = 0; s < p; s++) c[s].fwd = 1 + 0.5 * (s > 0 && s < p - 1), c[s].bwd = 2 * c[s].fwd, c[s].bwd_w = c[s].fwd;
      Schedule plain;
      schedule_build(&plain, kind, p, 8, 0, c, &pool);
      CHECK(schedule_time(&plain, c) == 0, "pin: kind %d n=%d simulates\n", kind, p);
      for (int cores = 1; cores <= 3; cores++) {
        Schedule sc;
        schedule_build(&sc, kind, p, 8, 0, c, &pool);
        sc.cores = cores;
        CHECK(schedule_time(&sc, c) == 0 && schedule_pin(&sc, c, &pool) == 0, "pin: kind %d n=%d cores=%d pins\n", kind, p, cores);
        if (p <= cores) {
          CHECK(!sc.core_of && sc.step_time == plain.step_time, "pin: kind %d n=%d cores=%d: a core per rank, not pinned (%g vs %g)\n",
                kind, p, cores, sc.step_time, plain.step_time);
          continue;
        }
        CHECK(sc.core_of != NULL, "pin: kind %d n=%d cores=%d: pinned\n", kind, p, cores);
        if (!sc.core_of) continue;
        double work = 0, per[3] = {0, 0, 0};
        int bad = 0;
        for (int s = 0; s < p; s++) {
          bad |= sc.core_of[s] < 0 || sc.core_of[s] >= cores;
          if (bad) break;
          for (int k = 0; k < sc.nact[s]; k++)
            if (is_cpu(sc.act[s][k].kind)) work += sc.act[s][k].end - sc.act[s][k].start, per[sc.core_of[s]] += sc.act[s][k].end - sc.act[s][k].start;
        }
        CHECK(!bad, "pin: kind %d n=%d cores=%d: every rank on one of the cores\n", kind, p, cores);
        if (bad) continue;
        char what[256];
        CHECK(!core_overlap(&sc, what, sizeof what), "pin: kind %d n=%d cores=%d: a core runs one action at a time (%s)\n", kind, p, cores,
              what);
        double most = fmax(per[0], fmax(per[1], per[2]));
        CHECK(sc.step_time >= work / cores - 1e-9 && sc.step_time >= most - 1e-9 && sc.step_time >= plain.step_time - 1e-9,
              "pin: kind %d n=%d cores=%d: step %g is at least the work over the cores %g, the busiest core's %g and the unshared %g\n",
              kind, p, cores, sc.step_time, work / cores, most, plain.step_time);
        if (p == 4 && cores == 2) {
          /* The three ways to pair 4 ranks: none faster than the one kept. */
          static const int pairs[3][4] = {{0, 0, 1, 1}, {0, 1, 0, 1}, {0, 1, 1, 0}};
          double kept = sc.step_time;
          int *chosen = sc.core_of;
          for (int w = 0; w < 3; w++) {
            sc.core_of = (int *)pairs[w];
            CHECK(schedule_time(&sc, c) == 0 && sc.step_time >= kept - 1e-9, "pin: kind %d n=4: pairing %d%d%d%d simulates %g, the kept one %g\n",
                  kind, pairs[w][0], pairs[w][1], pairs[w][2], pairs[w][3], sc.step_time, kept);
          }
          sc.core_of = chosen;
        }
      }
    }
  if (failed == f0)
    printf("ok - schedule_pin: gpipe, 1f1b, zb1 at n = 1..8 on 1..3 cores: a core per rank is not pinned; otherwise one action at a "
           "time per core, the step at least the work over the cores, the kept pairing the fastest of n = 4's three\n");
  pool_free(&pool);
}

int main(void) {
  pin_case();
  jitter_case();
  fb_case();
  async_case();
  int f0 = failed;
  for (int kind = 0; kind <= SCHED_ZB1; kind++)
    for (int p = 1; p <= 8; p++)
      for (int m = 1; m <= 16; m++) accepts(kind, p, m, 0);
  for (int p = 1; p <= 8; p++)
    for (int m = 1; m <= 16; m++) accepts(SCHED_GPIPE, p, m, 1);
  if (failed == f0)
    printf("ok - gpipe, 1f1b, zb1 and forward-only lists for n = 1..8, m = 1..16 pass the validator, within the memory bounds\n");
  zb1_paper_case();
  rejects("forwards out of order", swap_forwards, 2, "ascending");
  rejects("a missing SEND", drop_send, 1, "SEND3");
  rejects("a slot reused while live", reuse_slot, 1, "still holds");
  rejects("a deadlock", deadlock, 2, "deadlock");
  return check_finish();
}
