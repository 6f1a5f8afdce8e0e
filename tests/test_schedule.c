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
 * ranks on 2 cores simulates faster than the one kept.
 * (f) Virtual stages (schedule_build_chunked): interleaved (V = 2, 3) for
 * n = 1..6 and m = n..16 a multiple of n, and zbv (V = 2) for n = 1..6,
 * m = 1..16, build lists the validator passes; every chunk of every rank
 * runs each micro-batch's F and backward once with the messages its stage
 * needs, each carrying the chunk, and the stage <-> (rank, chunk) maps
 * invert each other.  Interleaved refuses m not a multiple of n (naming
 * both).  In unit time (per stage F = 1, B = 2, I = W = 1; 1F1B over the
 * same work: F = V, B = 2V per rank), interleaved's bubble is at most
 * Megatron's (n-1)/(V m + n - 1) (the fraction (n-1)/(V m) of the ideal
 * time) and, for n > 1, below 1F1B's (n-1)/(m + n - 1); zbv keeps at most
 * 2n micro-batch chunks without their W on a rank, its step is never longer
 * than 1F1B's, for m >= n within 3 units of 6m + n - 1, and for m >= 2n
 * its bubble is at most a third of 1F1B's.  Two stages on one rank cost no
 * link time.  schedule_pin and schedule_jitter run on chunked lists.
 * Planted mistakes are rejected naming rank and chunk: a chunk's forwards
 * out of order, a missing SEND of chunk 1, a local SEND before its RECV
 * (zbv, n = 2, rank 1), a slot of chunk 1 taken while live, and a deadlock
 * between two ranks' chunks. */
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

/* Builds `kind` (1f1b, zb1) n=4 m=8, applies a mistake, and expects a message naming rank `rank` and containing `what`. */
static void rejects_kind(const char *label, int kind, void (*plant)(Schedule *), int rank, const char *what) {
  Pool pool = {0};
  StageCost c[4];
  unit_costs(c, 4, 1);
  Schedule sc;
  schedule_build(&sc, kind, 4, 8, 0, c, &pool);
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

static void rejects(const char *label, void (*plant)(Schedule *), int rank, const char *what) { rejects_kind(label, SCHED_1F1B, plant, rank, what); }

/* zb1: the forward writes what W reads into the late ring, so F must carry a wslot. */
static void drop_forward_wslot(Schedule *sc) { sc->act[1][find(sc, 1, ACT_F, 2)].wslot = -1; }

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

/* The memory plan on rank 1: micro-batch 0's values, a sent one among them, leave through xslot 0
 * (F0 and SEND0 in it, OFFLOAD0 after the SEND, or before it when `early`, PREFETCH0 before B0). */
static void xslot_send(Schedule *sc, int early) {
  static int nx[4];
  static Action buf[256];
  nx[1] = 1, sc->nxslots = nx;
  int n = 0;
  for (int k = 0; k < sc->nact[1]; k++) {
    Action a = sc->act[1][k];
    int mine = a.mb == 0 && (a.kind == ACT_F || a.kind == ACT_SEND || a.kind == ACT_B);
    if (mine) a.xslot = 0;
    if (a.kind == ACT_B && a.mb == 0) buf[n] = action_make(ACT_PREFETCH, 0), buf[n].xslot = 0, buf[n++].peer = -1;
    if (early && a.kind == ACT_SEND && a.mb == 0) buf[n] = action_make(ACT_OFFLOAD, 0), buf[n].xslot = 0, buf[n++].peer = -1;
    buf[n++] = a;
    if (!early && a.kind == ACT_SEND && a.mb == 0) buf[n] = action_make(ACT_OFFLOAD, 0), buf[n].xslot = 0, buf[n++].peer = -1;
  }
  sc->act[1] = buf, sc->nact[1] = n;
}
static void xslot_offload_early(Schedule *sc) { xslot_send(sc, 1); }

static void xslot_send_case(void) {
  Pool pool = {0};
  StageCost c[4];
  unit_costs(c, 4, 1);
  Schedule sc;
  schedule_build(&sc, SCHED_1F1B, 4, 8, 0, c, &pool);
  xslot_send(&sc, 0);
  CHECK(!schedule_validate(&sc), "a value sent from an xslot, OFFLOAD after its SEND, passes the validator (%s)\n", err_msg());
  err_clear();
  pool_free(&pool);
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
    sc.act[2][u] = sc.act[2][u - 1], sc.act[2][u - 1] = (Action){ACT_UPDATE, -1, -1, -1, -1, -1, -1, 0, 0, 0}, u--;
  }
  sc.act[2][u] = sc.act[2][u - 1], sc.act[2][u - 1] = (Action){ACT_UPDATE, -1, -1, -1, -1, -1, -1, 0, 0, 0};
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


/* ---- (f) virtual stages ---- */

static void unit_stages(StageCost *c, int S) {
  memset(c, 0, sizeof(StageCost) * (size_t)S);
  for (int s = 0; s < S; s++) c[s].fwd = 1, c[s].bwd = 2, c[s].bwd_w = 1;
}

/* Each (chunk, kind, mb) of rank r counted once; compute, messages and the chunks' stages as they should be. */
static int chunk_counts_ok(const Schedule *sc, int r, char *why, size_t len) {
  int V = sc->nchunks, m = sc->m, S = sched_nvstages(sc), zb = sc->kind == SCHED_ZBV;
  int *n = calloc((size_t)(V * ACT_NKINDS * m), sizeof(int)), ok = 1;
  if (!n) abort();
  for (int k = 0; k < sc->nact[r]; k++) {
    const Action *a = &sc->act[r][k];
    if (a->kind == ACT_UPDATE) continue;
    if (a->chunk < 0 || a->chunk >= V || a->mb < 0 || a->mb >= m) {
      snprintf(why, len, "action %d names chunk %d, micro-batch %d", k, a->chunk, a->mb);
      free(n);
      return 0;
    }
    n[(a->chunk * ACT_NKINDS + a->kind) * m + a->mb]++;
  }
  for (int ch = 0; ch < V && ok; ch++) {
    int st = sched_stage(sc, r, ch);
    for (int mb = 0; mb < m && ok; mb++) {
      int want[ACT_NKINDS] = {0};
      want[ACT_F] = 1, want[ACT_B] = !zb, want[ACT_I] = want[ACT_W] = zb;
      want[ACT_SEND] = want[ACT_RECV_GRAD] = st < S - 1, want[ACT_RECV] = want[ACT_SEND_GRAD] = st > 0;
      for (int kind = 0; kind < ACT_NKINDS && ok; kind++)
        if (kind != ACT_UPDATE && n[(ch * ACT_NKINDS + kind) * m + mb] != want[kind])
          ok = 0, snprintf(why, len, "chunk %d (stage %d) has %s%d %d times, want %d", ch, st, action_kind_name(kind), mb,
                           n[(ch * ACT_NKINDS + kind) * m + mb], want[kind]);
    }
  }
  free(n);
  return ok;
}

/* The most micro-batch chunks rank r holds without their W (zbv) or B. */
static int chunk_open_peak(const Schedule *sc, int r) {
  int open = 0, peak = 0;
  for (int k = 0; k < sc->nact[r]; k++) {
    int kind = sc->act[r][k].kind;
    open += kind == ACT_F ? 1 : kind == ACT_B || kind == ACT_W ? -1 : 0;
    peak = open > peak ? open : peak;
  }
  return peak;
}

/* 1F1B over the same work as S = n V unit stages: each rank F = V, B = 2V.  Its bubble; *step its step. */
static double ref_1f1b_bubble(int n, int V, int m, Pool *pool, double *step) {
  StageCost *c = pool_alloc(pool, sizeof(StageCost) * (size_t)n);
  for (int r = 0; r < n; r++) c[r].fwd = V, c[r].bwd = 2 * V, c[r].bwd_w = V;
  Schedule ref;
  schedule_build(&ref, SCHED_1F1B, n, m, 0, c, pool);
  if (step) *step = ref.step_time;
  return ref.bubble;
}

static void chunked_accepts(int kind, int V, int n, int m) {
  Pool pool = {0};
  StageCost c[18];
  unit_stages(c, n * V);
  Schedule sc;
  const char *name = schedule_name(kind);
  int rc = schedule_build_chunked(&sc, kind, n, V, m, c, &pool);
  CHECK(rc == 0, "%s V=%d n=%d m=%d refused: %s\n", name, V, n, m, err_msg());
  if (rc) {
    err_clear();
    pool_free(&pool);
    return;
  }
  rc = schedule_validate(&sc);
  CHECK(rc == 0, "%s V=%d n=%d m=%d rejected: %s\n", name, V, n, m, rc ? err_msg() : "");
  err_clear();
  char why[128];
  for (int r = 0; r < n; r++) {
    CHECK(chunk_counts_ok(&sc, r, why, sizeof why), "%s V=%d n=%d m=%d rank %d: %s\n", name, V, n, m, r, why);
    for (int ch = 0; ch < V; ch++) {
      int st = sched_stage(&sc, r, ch);
      CHECK(sched_rank_of(&sc, st) == r && sched_chunk_of(&sc, st) == ch && sc.nxslots[st] == 0 && sc.nstore[st] == 0 &&
            sc.nslots[st] >= 1 && sc.ngslots[st] >= 1, "%s V=%d n=%d m=%d rank %d chunk %d: stage %d maps back, rings %d/%d\n", name,
            V, n, m, r, ch, st, sc.nslots[st], sc.ngslots[st]);
    }
    if (kind == SCHED_ZBV)
      CHECK(chunk_open_peak(&sc, r) <= 2 * n, "zbv n=%d m=%d rank %d: %d micro-batch chunks open, the cap is %d\n", n, m, r,
            chunk_open_peak(&sc, r), 2 * n);
  }
  double ref_step, ref = ref_1f1b_bubble(n, V, m, &pool, &ref_step), meg = (double)(n - 1) / (V * m + n - 1);
  if (kind == SCHED_INTERLEAVED) {
    CHECK(sc.bubble <= meg + 1e-9 && (n == 1 || sc.bubble < ref - 1e-9), "interleaved V=%d n=%d m=%d: bubble %.4f, Megatron's %.4f, 1f1b %.4f\n",
          V, n, m, sc.bubble, meg, ref);
  } else {
    /* Fewer micro-batches than ranks: one micro-batch's way down and back (4n + 1 units) dominates. */
    CHECK(sc.step_time <= ref_step + 1e-9 && (m < n || sc.step_time <= 6 * m + n + 2 + 1e-9),
          "zbv n=%d m=%d: step %g units, want at most %d (m >= n) and 1f1b's %g\n", n, m, sc.step_time, 6 * m + n + 2, ref_step);
    if (m >= 2 * n) CHECK(sc.bubble <= ref / 3 + 1e-9, "zbv n=%d m=%d: bubble %.4f, over a third of 1f1b's %.4f\n", n, m, sc.bubble, ref);
  }
  pool_free(&pool);
}

/* The maps, the names, the refusals, and local pairs' link time. */
static void chunked_basics(void) {
  Schedule z = {.nstages = 3, .nchunks = 2, .kind = SCHED_ZBV}, il = {.nstages = 3, .nchunks = 3, .kind = SCHED_INTERLEAVED};
  CHECK(sched_stage(&z, 0, 0) == 0 && sched_stage(&z, 0, 1) == 5 && sched_stage(&z, 2, 0) == 2 && sched_stage(&z, 2, 1) == 3 &&
        sched_rank_of(&z, 4) == 1 && sched_chunk_of(&z, 4) == 1 && sched_nvstages(&z) == 6, "zbv n=3: rank r holds stages r and 5-r\n");
  CHECK(sched_stage(&il, 1, 2) == 7 && sched_rank_of(&il, 7) == 1 && sched_chunk_of(&il, 7) == 2 && sched_nvstages(&il) == 9,
        "interleaved n=3 V=3: rank 1's chunk 2 is stage 7\n");
  char b[32];
  Action a = action_make(ACT_F, 3);
  CHECK(!strcmp(action_str(&a, b, sizeof b), "F3"), "chunk 0 prints as before: %s\n", b);
  a.chunk = 1;
  CHECK(!strcmp(action_str(&a, b, sizeof b), "F3@1"), "chunk 1 prints F3@1: %s\n", b);
  Pool pool = {0};
  StageCost c[18];
  unit_stages(c, 18);
  Schedule sc;
  for (int n = 2; n <= 6; n++) {
    char mm[16], nn[16];
    snprintf(mm, sizeof mm, "m = %d", n + 1), snprintf(nn, sizeof nn, "n = %d", n);
    CHECK(schedule_build_chunked(&sc, SCHED_INTERLEAVED, n, 2, n + 1, c, &pool) && strstr(err_msg(), mm) && strstr(err_msg(), nn),
          "interleaved n=%d m=%d is refused naming m and n (%s)\n", n, n + 1, err_msg());
    err_clear();
  }
  CHECK(schedule_build_chunked(&sc, SCHED_ZBV, 2, 3, 4, c, &pool) && strstr(err_msg(), "2 chunks"), "zbv with 3 chunks is refused (%s)\n",
        err_msg());
  err_clear();
  CHECK(schedule_build_chunked(&sc, SCHED_INTERLEAVED, 2, 1, 4, c, &pool) != 0, "interleaved with 1 chunk is refused\n");
  err_clear();
  /* schedule_build of a chunked kind: two chunks; a refusal leaves no ranks, which the validator refuses. */
  schedule_build(&sc, SCHED_ZBV, 3, 6, 0, c, &pool);
  CHECK(sc.nchunks == 2 && sc.nstages == 3 && schedule_validate(&sc) == 0, "schedule_build zbv n=3 m=6: 2 chunks, valid (%s)\n", err_msg());
  schedule_build(&sc, SCHED_INTERLEAVED, 3, 4, 0, c, &pool);
  CHECK(sc.nstages == 0 && strstr(err_msg(), "multiple") && schedule_validate(&sc) != 0, "schedule_build interleaved n=3 m=4: refused (%s)\n",
        err_msg());
  err_clear();
  /* zbv at n = 1: both stages on rank 0, the link between them a copy: no message time, and the one UPDATE updates both. */
  for (int s = 0; s < 2; s++) c[s].comm = 2, c[s].recv_bytes = c[s].send_bytes = 1, c[s].update = 0.5;
  CHECK(schedule_build_chunked(&sc, SCHED_ZBV, 1, 2, 4, c, &pool) == 0 && fabs(sc.step_time - 25) < 1e-9 && fabs(sc.busy[0] - 25) < 1e-9,
        "zbv n=1 m=4: a local link costs nothing (step %g units, busy %g, want 25 and 25)\n", sc.step_time, sc.busy[0]);
  printf("ok - chunk maps, names F3@1, refusals, local links\n");
  pool_free(&pool);
}


static int find_chunk(const Schedule *sc, int r, int kind, int mb, int chunk) {
  for (int k = 0; k < sc->nact[r]; k++)
    if (sc->act[r][k].kind == kind && sc->act[r][k].mb == mb && sc->act[r][k].chunk == chunk) return k;
  return -1;
}

/* Moves rank r's action `from` to index `to` (the others shift). */
static void move_action(Schedule *sc, int r, int from, int to) {
  Action a = sc->act[r][from];
  if (from < to) memmove(&sc->act[r][from], &sc->act[r][from + 1], sizeof(Action) * (size_t)(to - from));
  else memmove(&sc->act[r][to + 1], &sc->act[r][to], sizeof(Action) * (size_t)(from - to));
  sc->act[r][to] = a;
}

/* Interleaved n=4 m=8: rank 2 runs F3@1 (and its SEND) where F2@1 was, and F2@1 where F3@1 was. */
static void chunk_swap_forwards(Schedule *sc) {
  for (int kind = ACT_F; kind <= ACT_SEND; kind += ACT_SEND - ACT_F) {
    int a = find_chunk(sc, 2, kind, 2, 1), b = find_chunk(sc, 2, kind, 3, 1);
    Action t = sc->act[2][a];
    sc->act[2][a] = sc->act[2][b], sc->act[2][b] = t;
  }
}

/* Interleaved n=4 m=8: rank 1 forgets to send micro-batch 3 on from its chunk 1 (stage 5). */
static void chunk_drop_send(Schedule *sc) {
  move_action(sc, 1, find_chunk(sc, 1, ACT_SEND, 3, 1), sc->nact[1] - 1);
  sc->nact[1]--;
}

/* Interleaved n=4 m=8: rank 1 receives micro-batch 1 of chunk 1 into micro-batch 0's slot. */
static void chunk_reuse_slot(Schedule *sc) {
  int slot0 = sc->act[1][find_chunk(sc, 1, ACT_F, 0, 1)].slot;
  for (int k = 0; k < sc->nact[1]; k++)
    if (sc->act[1][k].mb == 1 && sc->act[1][k].chunk == 1 && sc->act[1][k].slot >= 0) sc->act[1][k].slot = slot0;
}

/* zbv n=2 m=4: rank 1 holds stages 1 and 2; it posts stage 2's RECV2 only after stage 1's SEND2 copied into it. */
static void chunk_local_late(Schedule *sc) {
  move_action(sc, 1, find_chunk(sc, 1, ACT_RECV, 2, 1), find_chunk(sc, 1, ACT_SEND, 2, 0));
}

/* Interleaved n=2 m=4 (stages 0, 2 on rank 0; 1, 3 on rank 1): rank 0 runs B0@1 (stage 2) before F1@1,
 * and rank 1 F1@1 (stage 3) before B0@1.  Rank 0's B0@1 waits for rank 1's, after its F1@1, which waits
 * for rank 0's F1@1, after its B0@1. */
static void chunk_deadlock(Schedule *sc) {
  int f = find_chunk(sc, 0, ACT_F, 1, 1), b = find_chunk(sc, 0, ACT_B, 0, 1);
  move_action(sc, 0, b, f);         /* B0@1 before F1@1 ... */
  move_action(sc, 0, b + 1, f + 1); /* ... and its SEND_GRAD0@1 right after it */
  f = find_chunk(sc, 1, ACT_F, 1, 1), b = find_chunk(sc, 1, ACT_B, 0, 1);
  if (f > b) move_action(sc, 1, f, b);
  schedule_assign_slots(sc, 0), schedule_assign_slots(sc, 1);
}

/* Builds kind over n ranks (2 chunks, m micro-batches), applies a mistake, and expects a message with
 * `rank` and `what` in it. */
static void chunk_rejects(const char *label, int kind, int n, int m, void (*plant)(Schedule *), const char *rank, const char *what) {
  Pool pool = {0};
  StageCost c[8];
  unit_stages(c, 2 * n);
  Schedule sc;
  CHECK(schedule_build_chunked(&sc, kind, n, 2, m, c, &pool) == 0 && schedule_validate(&sc) == 0, "%s: the lists build and pass (%s)\n", label,
        err_msg());
  plant(&sc);
  int rc = schedule_validate(&sc);
  const char *msg = rc ? err_msg() : "";
  CHECK(rc == -1 && strstr(msg, rank) && strstr(msg, what), "%s: got %s'%s', want a message with '%s' and '%s'\n", label,
        rc ? "" : "acceptance ", msg, rank, what);
  if (rc == -1) printf("ok - rejects %s: %s\n", label, msg);
  err_clear();
  pool_free(&pool);
}

/* schedule_pin and schedule_jitter run on chunked lists as on any others. */
static void chunked_pin_jitter(void) {
  Pool pool = {0};
  StageCost c[8];
  unit_stages(c, 8);
  Schedule sc;
  CHECK(schedule_build_chunked(&sc, SCHED_INTERLEAVED, 4, 2, 8, c, &pool) == 0, "interleaved n=4 m=8 builds\n");
  double t0 = sc.step_time;
  CHECK(schedule_jitter(&sc, c, 0.2, 16) == 0 && sc.step_time > t0 && sc.step_time_fixed == t0, "jitter on interleaved: %g > %g\n",
        sc.step_time, t0);
  sc.cores = 2;
  CHECK(schedule_time(&sc, c) == 0 && schedule_pin(&sc, c, &pool) == 0 && sc.core_of && sc.step_time >= t0 - 1e-9,
        "pin interleaved n=4 on 2 cores: step %g (unshared %g)\n", sc.step_time, t0);
  pool_free(&pool);
}

static void chunked_case(void) {
  int f0 = failed;
  chunked_basics();
  for (int n = 1; n <= 6; n++)
    for (int m = 1; m <= 16; m++) {
      for (int V = 2; V <= 3 && m % n == 0; V++) chunked_accepts(SCHED_INTERLEAVED, V, n, m);
      chunked_accepts(SCHED_ZBV, 2, n, m); /* m < n too: fewer micro-batches than ranks still build */
    }
  chunked_pin_jitter();
  if (failed == f0)
    printf("ok - interleaved (V = 2, 3; m = n..16) and zbv (m = 1..16) lists for n = 1..6 pass the validator; in unit time interleaved's bubble is at "
           "most Megatron's (n-1)/(Vm+n-1), zbv's at most a third of 1f1b's for m >= 2n, with at most 2n chunks open\n");
  for (int n = 2; n <= 4; n += 2)
    for (int m = 4; m <= 16; m *= 2) {
      Pool pool = {0};
      StageCost c[8];
      unit_stages(c, 2 * n);
      Schedule il, zb;
      if (schedule_build_chunked(&il, SCHED_INTERLEAVED, n, 2, m, c, &pool) || schedule_build_chunked(&zb, SCHED_ZBV, n, 2, m, c, &pool)) {
        CHECK(0, "n=%d m=%d: %s\n", n, m, err_msg());
        continue;
      }
      printf("ok - unit time n=%d m=%2d: 1f1b bubble %.3f, interleaved (V=2) %.3f (step %g), zbv %.3f (step %g)\n", n, m,
             ref_1f1b_bubble(n, 2, m, &pool, NULL), il.bubble, il.step_time, zb.bubble, zb.step_time);
      pool_free(&pool);
    }
  chunk_rejects("a chunk's forwards out of order", SCHED_INTERLEAVED, 4, 8, chunk_swap_forwards, "rank 2, chunk 1", "ascending");
  chunk_rejects("a missing SEND of chunk 1", SCHED_INTERLEAVED, 4, 8, chunk_drop_send, "rank 1, chunk 1", "SEND3");
  chunk_rejects("a local SEND before its RECV", SCHED_ZBV, 2, 4, chunk_local_late, "rank 1, chunk 0", "receive must come before");
  chunk_rejects("a slot of chunk 1 taken while live", SCHED_INTERLEAVED, 4, 8, chunk_reuse_slot, "rank 1, chunk 1", "still holds");
  chunk_rejects("a deadlock between two ranks' chunks", SCHED_INTERLEAVED, 2, 4, chunk_deadlock, "rank 0, chunk 1", "deadlock");
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
  rejects_kind("a zb1 forward without the late slot its W-read values go to", SCHED_ZB1, drop_forward_wslot, 1, "F2 (action");
  xslot_send_case();
  rejects("an OFFLOAD before the SEND from its xslot", xslot_offload_early, 1, "comes before SEND0");
  chunked_case();
  return check_finish();
}
