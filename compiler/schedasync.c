/* schedasync.c - the asynchronous schedule: 1F1B that never drains between
 * steps, with weights of bounded staleness (APapo; PipeDream-2BW for K = 1).
 *
 * The rule (docs/async.md): step t runs the forwards and backwards of its
 * micro-batches on W_max(0, t-K); the optimizer then applies the step's
 * summed gradient to the newest weights, W_t+1 = update(W_t, g(W_t-K; t)).
 *
 * The order.  Number the micro-batches of the whole run g = t*m + i.  Stage
 * s runs w = p-s-1 warm-up forwards, then F(g + w), B(g) pairs, one after
 * the other across step boundaries, and UPDATE(t) right after B(t*m + m-1):
 * the order is periodic with period m.  Step t's body is the span between
 * UPDATE(t-1) and UPDATE(t); its forwards of micro-batches g >= (t+1)*m are
 * the next step's (up to `lookahead` steps ahead).  Messages are placed by
 * the synchronous rule (schedule_add_messages) over a long unrolled order,
 * and the body is cut from its middle, where the rule has settled; that the
 * cut repeats with period m is checked.  The program runs the body once per
 * step from t = -L (the fill) to the last step (whose later micro-batches
 * are skipped: the drain), so the lists the validator checks and the
 * simulation times are that, unrolled over L + 4 steps.
 *
 * Weights.  Step j needs W_max(0, j-K).  Before UPDATE(t) a stage holds
 * W_t (the newest, which the optimizer updates in place) and the K older
 * ones it still needs: K copies besides the weights themselves.  A forward
 * of step j in body t runs before UPDATE(t), so j - K <= t: the lookahead
 * L must not exceed K.  That bounds the micro-batches from below; the
 * builder names the smallest m that works. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "schedule.h"

static Action act(int kind, int mb) { return action_make(kind, mb); }

/* Stage s's compute order over U steps of m micro-batches, UPDATEs included. */
static int order_async(Action *a, int s, int p, int m, int U) {
  int M = U * m, warm = p - s - 1 < M ? p - s - 1 : M, f = 0, b = 0, k = 0;
  for (; f < warm; f++) a[k++] = act(ACT_F, f);
  while (b < M) {
    if (f < M) a[k++] = act(ACT_F, f++);
    a[k++] = act(ACT_B, b);
    if (++b % m == 0) a[k++] = act(ACT_UPDATE, -1);
  }
  return k;
}

/* Index of the u-th UPDATE (from 0) in a list, -1 if none. */
static int nth_update(const Action *a, int n, int u) {
  for (int k = 0; k < n; k++)
    if (a[k].kind == ACT_UPDATE && u-- == 0) return k;
  return -1;
}

static int touches_fwd(int kind) { return kind == ACT_F || kind == ACT_SEND || kind == ACT_B || kind == ACT_RECV; }
static int touches_grad(int kind) { return kind == ACT_B || kind == ACT_SEND_GRAD || kind == ACT_RECV_GRAD; }

/* Whether a ring of `size` copies indexed by micro-batch modulo size holds:
 * a micro-batch takes its copy at its first action touching the ring and
 * lets go after its last, and no copy is taken while held. */
static int ring_fits(const Action *a, int n, int nmb, int size, int grad) {
  int *last = malloc(sizeof(int) * (size_t)nmb), *owner = malloc(sizeof(int) * (size_t)size), ok = 1;
  if (!last || !owner) abort();
  for (int i = 0; i < nmb; i++) last[i] = -1;
  for (int i = 0; i < size; i++) owner[i] = -1;
  for (int k = 0; k < n; k++)
    if (a[k].mb >= 0 && (grad ? touches_grad(a[k].kind) : touches_fwd(a[k].kind))) last[a[k].mb] = k;
  for (int k = 0; k < n && ok; k++) {
    int mb = a[k].mb;
    if (mb < 0 || !(grad ? touches_grad(a[k].kind) : touches_fwd(a[k].kind))) continue;
    int x = mb % size;
    if (owner[x] >= 0 && owner[x] != mb) ok = 0;
    owner[x] = mb;
    if (last[mb] == k) owner[x] = -1;
  }
  free(last), free(owner);
  return ok;
}

/* The smallest ring that fits, from `from` up. */
static int ring_size(const Action *a, int n, int nmb, int from, int grad) {
  int size = from > 1 ? from : 1;
  while (!ring_fits(a, n, nmb, size, grad)) size++;
  return size;
}

/* Cuts stage s's body from the unrolled list `full` (Ub steps): the span
 * after UPDATE(t0-1) through UPDATE(t0), micro-batches made relative to
 * step t0.  -1 with err_set if the next span is not the same shifted by m. */
static int cut_body(Schedule *sc, int s, const Action *full, int n, int t0, Pool *pool) {
  int m = sc->m, a0 = nth_update(full, n, t0 - 1), a1 = nth_update(full, n, t0), b1 = nth_update(full, n, t0 + 1);
  if (a0 < 0 || b1 < 0) return err_set("internal error: async: rank %d's unrolled order is too short", s);
  int len = a1 - a0;
  if (b1 - a1 != len) return err_set("internal error: async: rank %d's steps %d and %d differ in length (%d, %d actions)", s, t0, t0 + 1, len, b1 - a1);
  sc->body[s] = pool_alloc(pool, sizeof(Action) * (size_t)len);
  sc->nbody[s] = len;
  for (int k = 0; k < len; k++) {
    Action x = full[a0 + 1 + k], y = full[a1 + 1 + k];
    if (x.kind != y.kind || (x.mb >= 0) != (y.mb >= 0) || (x.mb >= 0 && y.mb != x.mb + m))
      return err_set("internal error: async: rank %d's body is not periodic at action %d", s, k);
    if (x.mb >= 0) x.mb -= t0 * m;
    if (x.kind != ACT_UPDATE && x.mb < 0) return err_set("internal error: async: rank %d's step %d names an earlier micro-batch", s, t0);
    x.slot = x.gslot = -1;
    sc->body[s][k] = x;
    if (x.mb >= 0 && x.mb / m > sc->lookahead) sc->lookahead = x.mb / m;
  }
  return 0;
}

/* The lists the ranks run over U steps: the body for t = -L .. U-1, an
 * action kept when its global micro-batch is in the run (an UPDATE when t >= 0). */
static void expand(Schedule *sc, int s, int U, Pool *pool) {
  int m = sc->m, L = sc->lookahead, n = 0;
  Action *out = pool_alloc(pool, sizeof(Action) * (size_t)((U + L) * sc->nbody[s] + 1));
  for (int t = -L; t < U; t++)
    for (int k = 0; k < sc->nbody[s]; k++) {
      Action a = sc->body[s][k];
      if (a.kind == ACT_UPDATE) {
        if (t >= 0) out[n++] = a;
        continue;
      }
      int g = t * m + a.mb;
      if (g < 0 || g >= U * m) continue;
      a.mb = g;
      out[n++] = a;
    }
  sc->act[s] = out, sc->nact[s] = n;
}

/* Rings: global micro-batch g uses copy g % size; the body's slot fields
 * say which copies an action touches (the runtime adds t*m). */
static void assign_rings(Schedule *sc, int s) {
  int nmb = sched_mbs(sc);
  Action *a = sc->act[s];
  int n = sc->nact[s];
  sc->nslots[s] = ring_size(a, n, nmb, 1, 0);
  sc->ngslots[s] = ring_size(a, n, nmb, 1, 1);
  for (int k = 0; k < n; k++) {
    a[k].slot = a[k].mb >= 0 && touches_fwd(a[k].kind) ? a[k].mb % sc->nslots[s] : -1;
    a[k].gslot = a[k].mb >= 0 && touches_grad(a[k].kind) ? a[k].mb % sc->ngslots[s] : -1;
  }
  for (int k = 0; k < sc->nbody[s]; k++) {
    Action *b = &sc->body[s][k];
    b->slot = b->mb >= 0 && touches_fwd(b->kind) ? b->mb % sc->nslots[s] : -1;
    b->gslot = b->mb >= 0 && touches_grad(b->kind) ? b->mb % sc->ngslots[s] : -1;
  }
}

static int build(Schedule *sc, int p, int m, int K, const StageCost *cost, Pool *pool) {
  memset(sc, 0, sizeof *sc);
  sc->nstages = p, sc->m = m, sc->kind = SCHED_ASYNC, sc->staleness = K;
  sc->act = pool_alloc(pool, sizeof(Action *) * (size_t)p);
  sc->body = pool_alloc(pool, sizeof(Action *) * (size_t)p);
  int **ints[] = {&sc->nact, &sc->nbody, &sc->nslots, &sc->ngslots, &sc->nwslots}; /* nwslots: 0 (no late values) */
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) *ints[i] = pool_alloc(pool, sizeof(int) * (size_t)p);
  sc->busy = pool_alloc(pool, sizeof(double) * (size_t)p);
  /* Unrolled long enough that the middle step is past the warm-up and before the drain. */
  int Lmax = (p + m - 2) / m + 1, Ub = 2 * Lmax + 4, t0 = Lmax + 1;
  for (int s = 0; s < p; s++) {
    Action *ord = malloc(sizeof(Action) * (size_t)(3 * Ub * m + Ub + 1));
    Action *full = malloc(sizeof(Action) * (size_t)(7 * Ub * m + Ub + 2));
    if (!ord || !full) abort();
    int n = order_async(ord, s, p, m, Ub);
    n = schedule_add_messages(full, ord, n, s, p, Ub * m, 0, 0, 0);
    int rc = cut_body(sc, s, full, n, t0, pool);
    free(ord), free(full);
    if (rc) return -1;
  }
  sc->unroll = sc->lookahead + 4;
  for (int s = 0; s < p; s++) expand(sc, s, sc->unroll, pool), assign_rings(sc, s);
  schedule_time(sc, cost);
  err_clear(); /* a stall is reported by schedule_validate, with names */
  return 0;
}

/* How many steps ahead of its update a rank computes: the most, over the
 * bodies' forwards, of their micro-batch's step. */
static int compute_ahead(const Schedule *sc) {
  int most = 0;
  for (int s = 0; s < sc->nstages; s++)
    for (int k = 0; k < sc->nbody[s]; k++)
      if (action_is_compute(sc->body[s][k].kind) && sc->body[s][k].mb / sc->m > most) most = sc->body[s][k].mb / sc->m;
  return most;
}

int schedule_build_async(Schedule *sc, int p, int m, int K, const StageCost *cost, Pool *pool) {
  if (build(sc, p, m, K, cost, pool)) return -1;
  int ahead = compute_ahead(sc);
  if (ahead <= K) return 0;
  /* Stage 0 runs forwards up to lookahead steps ahead of its update; find the smallest m that keeps them within K. */
  int need = m + 1;
  Schedule probe;
  while (need < 1 << 20) {
    if (build(&probe, p, need, K, cost, pool)) return -1;
    if (compute_ahead(&probe) <= K) break;
    need++;
  }
  return err_set("--schedule async --staleness %d with %d stages needs --microbatches %d or more (got %d): the first stage runs "
                 "forwards %d step(s) ahead of its update, and a step may compute on weights at most %d update(s) old",
                 K, p, need, m, ahead, K);
}

/* The steady state: between the UPDATEs of steps L+1 and L+2 every rank has
 * filled; the pipeline's fill and drain happen once per run. */
void schedule_async_period(Schedule *sc) {
  int p = sc->nstages, U = sc->unroll, t0 = sc->lookahead + 1;
  double period = 0, busy = 0, end = 0;
  for (int s = 0; s < p; s++) {
    int n = sc->nact[s], u0 = nth_update(sc->act[s], n, t0), u1 = nth_update(sc->act[s], n, t0 + 1);
    if (u0 < 0 || u1 < 0) return;
    period = fmax(period, sc->act[s][u1].end - sc->act[s][u0].end);
    busy += sc->busy[s] / U;
    if (n) end = fmax(end, sc->act[s][n - 1].end);
  }
  sc->step_time = period;
  sc->bubble = period > 0 ? fmax(0, 1 - busy / ((double)p * period)) : 0;
  sc->fill_drain = fmax(0, end - U * period);
}
