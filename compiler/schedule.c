/* schedule.c - each rank's action list for one step, its ring slots, and a
 * timing simulation.
 *
 * Compute orders.  GPipe: F0..F(m-1), then B0..B(m-1) (torchgpipe runs the
 * backwards in reverse; ascending order takes the same time and sums the
 * weight gradients over micro-batches in the same order as 1F1B, so the
 * schedules give bit-identical weights).  1F1B (PipeDream-flush): stage s
 * runs min(p-s-1, m) warm-up forwards, then alternates F and B, then drains.
 * ZB-H1 (zero bubble, Qi et al. 2023): the backward is split into I (input
 * gradient, on the critical path) and W (weight gradient, free to move); a
 * unit-time simulation (F = I = W = 1) runs, on every stage but the first,
 * I as soon as it can, then F, and W when nothing else is ready; the first
 * stage's I feeds no one, so it runs F first, then W, then I.  Every stage
 * keeps at most p micro-batches whose W is not done: the peak of 1F1B (its
 * first stage), as the paper's H1 rule has it.  That gives a step of
 * 3m + p - 1 units for m >= p (up to two more for some shapes with p > 6)
 * (1F1B: 3m + 3(p - 1)).
 * Backwards, and W's, run in ascending micro-batch order in every schedule.
 *
 * Messages are actions too: SEND right after the F that makes the values,
 * SEND_GRAD right after the B/I that makes the gradients, and RECV /
 * RECV_GRAD posted as early as a ring slot is free for them (one slot more
 * than the compute order keeps live, so the next receive overlaps compute).
 * Slots are then assigned by running the list: lowest free slot first.
 *
 * Virtual stages (sc->nchunks > 1, schedchunk.c builds their orders): the
 * same per chunk, each chunk a stage with its own rings, and the simulation
 * follows stages (stage s's F waits for stage s-1's) wherever they run. */
#include "schedule.h"

#include "../runtime/actions.h" /* the one table of the action kinds' names */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *schedule_name(int kind) {
  return kind == SCHED_GPIPE ? "gpipe" : kind == SCHED_ZB1 ? "zb1" : kind == SCHED_PIPEFB ? "pipefb" : kind == SCHED_ASYNC ? "async"
         : kind == SCHED_INTERLEAVED ? "interleaved" : kind == SCHED_ZBV ? "zbv" : "1f1b";
}

double schedule_ideal_bubble(int p, int m) { return (double)(p - 1) / (double)(m + p - 1); }

const char *action_kind_name(int kind) { return pr_action_name(kind); }

const char *action_str(const Action *a, char *buf, size_t len) {
  if (a->kind == ACT_UPDATE || a->kind == ACT_SEND_WEIGHTS || a->kind == ACT_RECV_WEIGHTS)
    snprintf(buf, len, "%s", action_kind_name(a->kind));
  else if (a->chunk > 0) snprintf(buf, len, "%s%d@%d", action_kind_name(a->kind), a->mb, a->chunk);
  else snprintf(buf, len, "%s%d", action_kind_name(a->kind), a->mb);
  return buf;
}

Action action_make(int kind, int mb) { return (Action){kind, mb, -1, -1, -1, -1, -1, 0, 0, 0}; }
static Action act(int kind, int mb) { return action_make(kind, mb); }

/* ---- compute orders ---- */

static int order_gpipe(Action *a, int m, int fwd_only) {
  int k = 0;
  for (int i = 0; i < m; i++) a[k++] = act(ACT_F, i);
  for (int i = 0; i < m && !fwd_only; i++) a[k++] = act(ACT_B, i);
  return k;
}

static int order_1f1b(Action *a, int s, int p, int m) {
  int warm = p - s - 1 < m ? p - s - 1 : m, f = 0, b = 0, k = 0;
  for (; f < warm; f++) a[k++] = act(ACT_F, f);
  while (f < m) {
    a[k++] = act(ACT_F, f++);
    a[k++] = act(ACT_B, b++);
  }
  while (b < m) a[k++] = act(ACT_B, b++);
  return k;
}

/* ZB-H1 for all stages at once: each unit of time every stage runs the
 * first ready action in its order (I, F, W; the first stage F, W, I), F only
 * within the in-flight cap. */
static void order_zb1(Action **ord, int *len, int p, int m, Pool *pool) {
  int *nf = pool_alloc(pool, sizeof(int) * (size_t)p), *ni = pool_alloc(pool, sizeof(int) * (size_t)p);
  int *nw = pool_alloc(pool, sizeof(int) * (size_t)p);
  int *fend = pool_alloc(pool, sizeof(int) * (size_t)(p * m)), *iend = pool_alloc(pool, sizeof(int) * (size_t)(p * m));
  for (int k = 0; k < p * m; k++) fend[k] = iend[k] = -1;
  int left = 3 * m * p;
  for (int t = 0; left > 0 && t < 8 * (m + p) * p; t++) {
    for (int s = 0; s < p; s++) {
      int cap = stage_inflight(SCHED_ZB1, s, p, m), i = ni[s], f = nf[s];
      int dep = i < f ? (s == p - 1 ? fend[s * m + i] : iend[(s + 1) * m + i]) : -1;
      int ready[3] = {dep >= 0 && dep <= t,
                      f < m && f - nw[s] < cap && (s == 0 || (fend[(s - 1) * m + f] >= 0 && fend[(s - 1) * m + f] <= t)),
                      nw[s] < ni[s]};
      static const int later_stage[3] = {ACT_I, ACT_F, ACT_W}, first_stage[3] = {ACT_F, ACT_W, ACT_I};
      const int *order = s == 0 && p > 1 ? first_stage : later_stage;
      int k = 0;
      while (k < 3 && !ready[order[k] == ACT_I ? 0 : order[k] == ACT_F ? 1 : 2]) k++;
      if (k == 3) continue;
      if (order[k] == ACT_I) ord[s][len[s]++] = act(ACT_I, i), iend[s * m + i] = t + 1, ni[s]++;
      else if (order[k] == ACT_F) ord[s][len[s]++] = act(ACT_F, f), fend[s * m + f] = t + 1, nf[s]++;
      else ord[s][len[s]++] = act(ACT_W, nw[s]++);
      left--;
    }
  }
}

/* ---- messages ---- */

/* For each micro-batch, where its slot is taken in the compute order (F;
 * for gradients B/I) and after which action it is dead (B or W, or I for a
 * forward copy in the late layout of zb1 and zbv; F in a forward-only
 * program), and the most live at once. */
static int live_span(const Action *c, int n, int m, int grad, int late, int *take_at, int *release_at) {
  for (int i = 0; i < m; i++) take_at[i] = release_at[i] = -1;
  for (int k = 0; k < n; k++) {
    int kind = c[k].kind, mb = c[k].mb;
    if (mb < 0) continue; /* an UPDATE (async lists have one per step) */
    if (take_at[mb] < 0 && (grad ? kind == ACT_B || kind == ACT_I : kind == ACT_F)) take_at[mb] = k;
    if (grad ? kind == ACT_B || kind == ACT_W : late ? kind != ACT_W : kind != ACT_I) release_at[mb] = k;
  }
  int *delta = calloc((size_t)n + 1, sizeof(int)), live = 0, peak = 0;
  if (!delta) abort();
  for (int i = 0; i < m; i++)
    if (take_at[i] >= 0) delta[take_at[i]]++, delta[release_at[i] + 1]--;
  for (int k = 0; k < n; k++) live += delta[k], peak = live > peak ? live : peak;
  free(delta);
  return peak;
}

/* Interleaves the compute order with SEND/RECV/SEND_GRAD/RECV_GRAD, and
 * the UPDATE last unless the order has its own (final_update 0); late: the
 * stage's forward copy is free after I (the late layout), so receives
 * are posted by that. */
int schedule_add_messages(Action *out, const Action *c, int n, int s, int p, int m, int fwd_only, int final_update, int late) {
  int *take_at = malloc(sizeof(int) * (size_t)m), *rel = malloc(sizeof(int) * (size_t)m);
  int *gtake = malloc(sizeof(int) * (size_t)m), *grel = malloc(sizeof(int) * (size_t)m);
  if (!take_at || !rel || !gtake || !grel) abort();
  int cap = live_span(c, n, m, 0, late, take_at, rel) + 1, gcap = fwd_only ? 0 : live_span(c, n, m, 1, 0, gtake, grel) + 1;
  if (cap > m) cap = m;
  if (gcap > m) gcap = m;
  int k = 0, live = 0, glive = 0, nrecv = 0, ngrecv = 0, recv = s > 0, grecv = !fwd_only && s < p - 1;
  for (int j = 0; j < n; j++) {
    const Action *a = &c[j];
    int bwd = a->kind == ACT_B || a->kind == ACT_I;
    /* Post receives while a slot is free, and always the one this action needs. */
    while (recv && nrecv < m && (live < cap || (a->kind == ACT_F && a->mb >= nrecv))) out[k++] = act(ACT_RECV, nrecv++), live++;
    while (grecv && ngrecv < m && (glive < gcap || (bwd && a->mb >= ngrecv))) out[k++] = act(ACT_RECV_GRAD, ngrecv++), glive++;
    out[k++] = *a;
    if (a->mb < 0) continue;
    if (a->kind == ACT_F && s < p - 1) out[k++] = act(ACT_SEND, a->mb);
    if (bwd && s > 0) out[k++] = act(ACT_SEND_GRAD, a->mb);
    if (recv && rel[a->mb] == j) live--;
    if (grecv && grel[a->mb] == j) glive--;
  }
  if (!fwd_only && final_update) out[k++] = act(ACT_UPDATE, -1);
  free(take_at), free(rel), free(gtake), free(grel);
  return k;
}

/* Virtual stages: one chunk's receive state while a rank's order is
 * interleaved with messages (as schedule_add_messages keeps for its one). */
typedef struct ChunkMsg {
  int recv, grecv;          /* whether the chunk's stage receives values / gradients */
  int cap, gcap, nrecv, ngrecv, live, glive;
  int *rel, *grel;          /* per mb: the index in the whole order after which its slot / gslot is dead */
} ChunkMsg;

/* The live spans of chunk ch's actions alone, as indices into the whole order c (late: its stage has the
 * late layout). */
static void chunk_spans(const Action *c, int n, int m, int ch, int late, ChunkMsg *q) {
  Action *sub = malloc(sizeof(Action) * (size_t)(n + 1));
  int *idx = malloc(sizeof(int) * (size_t)(n + 1)), *take = malloc(sizeof(int) * (size_t)m), k = 0;
  if (!sub || !idx || !take) abort();
  for (int j = 0; j < n; j++)
    if (c[j].chunk == ch) sub[k] = c[j], idx[k++] = j;
  q->cap = live_span(sub, k, m, 0, late, take, q->rel) + 1, q->gcap = live_span(sub, k, m, 1, 0, take, q->grel) + 1;
  q->cap = q->cap > m ? m : q->cap, q->gcap = q->gcap > m ? m : q->gcap;
  for (int i = 0; i < m; i++) {
    if (q->rel[i] >= 0) q->rel[i] = idx[q->rel[i]];
    if (q->grel[i] >= 0) q->grel[i] = idx[q->grel[i]];
  }
  free(sub), free(idx), free(take);
}

/* Posts chunk ch's receives (grad: of gradients) while a slot is free, and
 * always up to micro-batch `need` (-1: none): the one the next action
 * computes, or, between two stages on this rank, the one its neighbour
 * stage's send is about to copy into. */
static int post_chunk(Action *out, int k, ChunkMsg *q, int ch, int m, int grad, int need) {
  int kind = grad ? ACT_RECV_GRAD : ACT_RECV, on = grad ? q->grecv : q->recv;
  int *posted = grad ? &q->ngrecv : &q->nrecv, *live = grad ? &q->glive : &q->live, cap = grad ? q->gcap : q->cap;
  while (on && *posted < m && (*live < cap || need >= *posted)) {
    out[k] = act(kind, (*posted)++), out[k++].chunk = ch;
    (*live)++;
  }
  return k;
}

int schedule_add_messages_chunked(const Schedule *sc, int r, Action *out, const Action *c, int n) {
  int V = sc->nchunks, S = sched_nvstages(sc), m = sc->m, k = 0;
  ChunkMsg *q = calloc((size_t)V, sizeof(ChunkMsg));
  int *spans = malloc(sizeof(int) * (size_t)(2 * V * m));
  if (!q || !spans) abort();
  for (int ch = 0; ch < V; ch++) {
    int st = sched_stage(sc, r, ch);
    q[ch].recv = st > 0, q[ch].grecv = st < S - 1, q[ch].rel = spans + 2 * ch * m, q[ch].grel = q[ch].rel + m;
    int split = 0;
    for (int j = 0; j < n; j++) split |= c[j].kind == ACT_I && c[j].chunk == ch;
    chunk_spans(c, n, m, ch, split && !(sc->hold && sc->hold[st]), &q[ch]);
  }
  for (int j = 0; j < n; j++) {
    const Action *a = &c[j];
    int bwd = a->kind == ACT_B || a->kind == ACT_I, st = sched_stage(sc, r, a->chunk);
    for (int ch = 0; ch < V; ch++) {
      k = post_chunk(out, k, &q[ch], ch, m, 0, a->kind == ACT_F && a->chunk == ch ? a->mb : -1);
      k = post_chunk(out, k, &q[ch], ch, m, 1, bwd && a->chunk == ch ? a->mb : -1);
    }
    out[k++] = *a;
    /* A send to a stage on this rank is a copy into the receive it posted: that receive first. */
    if (a->kind == ACT_F && st < S - 1) {
      if (sched_rank_of(sc, st + 1) == r) k = post_chunk(out, k, &q[sched_chunk_of(sc, st + 1)], sched_chunk_of(sc, st + 1), m, 0, a->mb);
      out[k] = act(ACT_SEND, a->mb), out[k++].chunk = a->chunk;
    }
    if (bwd && st > 0) {
      if (sched_rank_of(sc, st - 1) == r) k = post_chunk(out, k, &q[sched_chunk_of(sc, st - 1)], sched_chunk_of(sc, st - 1), m, 1, a->mb);
      out[k] = act(ACT_SEND_GRAD, a->mb), out[k++].chunk = a->chunk;
    }
    ChunkMsg *o = &q[a->chunk];
    if (o->recv && o->rel[a->mb] == j) o->live--;
    if (o->grecv && o->grel[a->mb] == j) o->glive--;
  }
  out[k++] = act(ACT_UPDATE, -1);
  free(q), free(spans);
  return k;
}

/* ---- slots ---- */

/* The actions that reach a micro-batch's copy of each ring (0 forward, 1 gradient, 2 late values).  In
 * a split list (zb1, zbv) W does not reach the forward ring: what it reads of the forward lives in the
 * late ring, which F fills and RECOMPUTE and I read too (memplan.c, "the late values"). */
static int reaches(int ring, int kind, int late) {
  if (ring == 0)
    return kind == ACT_F || kind == ACT_SEND || kind == ACT_B || kind == ACT_I || (!late && kind == ACT_W) || kind == ACT_RECOMPUTE ||
           kind == ACT_RECV;
  if (ring == 1) return kind == ACT_B || kind == ACT_I || kind == ACT_W || kind == ACT_SEND_GRAD || kind == ACT_RECV_GRAD;
  return late && (kind == ACT_F || kind == ACT_I || kind == ACT_W || kind == ACT_RECOMPUTE);
}

/* Takes the lowest free slot of a ring; grows the ring's size as needed. */
static int take(int *owner, int *size, int mb) {
  int k = 0;
  while (owner[k] >= 0) k++;
  owner[k] = mb;
  if (k + 1 > *size) *size = k + 1;
  return k;
}

/* The rings of chunk ch (-1: all of them) of the list a (n actions): each micro-batch takes the lowest
 * free copy at its first action reaching the ring and frees it after its last; size[r] is the most taken
 * at once.  A split list (its I's) in the hold layout keeps W on the forward ring; in the late one W
 * reaches the late ring.  dry: only the sizes, the actions as they are. */
static void assign_ring(Action *a, int n, int m, int ch, int hold, int dry, int *size[3]) {
  int split = 0;
  /* Per ring r: who owns each copy, mb's copy, the last action touching mb. */
  int *owner[3], *slot[3], *last[3];
  for (int r = 0; r < 3; r++) {
    owner[r] = malloc(sizeof(int) * (size_t)(m + 1)), slot[r] = malloc(sizeof(int) * (size_t)m), last[r] = malloc(sizeof(int) * (size_t)m);
    if (!owner[r] || !slot[r] || !last[r]) abort();
    for (int i = 0; i < m; i++) owner[r][i] = slot[r][i] = last[r][i] = -1;
    owner[r][m] = -1;
    *size[r] = 0;
  }
  for (int k = 0; k < n; k++) split |= a[k].kind == ACT_I && (ch < 0 || a[k].chunk == ch);
  int late = split && !hold;
  for (int k = 0; k < n; k++)
    for (int r = 0; r < 3; r++)
      if (a[k].mb >= 0 && a[k].mb < m && (ch < 0 || a[k].chunk == ch) && reaches(r, a[k].kind, late)) last[r][a[k].mb] = k;
  for (int k = 0; k < n; k++) {
    int mb = a[k].mb;
    if (ch >= 0 && a[k].chunk != ch) continue;
    int none[3], *field[3] = {&a[k].slot, &a[k].gslot, &a[k].wslot};
    for (int r = 0; r < 3 && dry; r++) field[r] = &none[r];
    for (int r = 0; r < 3; r++) {
      *field[r] = -1;
      if (mb < 0 || mb >= m || !reaches(r, a[k].kind, late)) continue;
      if (slot[r][mb] < 0) slot[r][mb] = take(owner[r], size[r], mb);
      *field[r] = slot[r][mb];
    }
    for (int r = 0; r < 3; r++)
      if (mb >= 0 && mb < m && last[r][mb] == k && slot[r][mb] >= 0) owner[r][slot[r][mb]] = -1;
  }
  if (!*size[0]) *size[0] = 1;
  if (!*size[1]) *size[1] = 1;
  for (int r = 0; r < 3; r++) free(owner[r]), free(slot[r]), free(last[r]);
}

void schedule_assign_slots(Schedule *sc, int s) {
  for (int ch = 0; ch < (sc->nchunks > 1 ? sc->nchunks : 1); ch++) {
    int st = sc->nchunks > 1 ? sched_stage(sc, s, ch) : s, hold = sc->hold && sc->hold[st];
    assign_ring(sc->act[s], sc->nact[s], sc->m, sc->nchunks > 1 ? ch : -1, hold, 0,
                (int *[3]){&sc->nslots[st], &sc->ngslots[st], &sc->nwslots[st]});
    if (!sc->rings) continue;
    /* The layout the list has: its sizes (an edited list's, the memory plan's: the other layout's stay). */
    RingSizes *z = &sc->rings[st];
    if (hold) z->hslots = sc->nslots[st];
    else z->slots = sc->nslots[st], z->wslots = sc->nwslots[st];
    if (!sc->hold || !sched_splits(sc->kind)) z->hslots = z->slots;
    z->gslots = sc->ngslots[st];
  }
}

RingSizes sched_rings(const Schedule *sc, int st) {
  if (sc->rings) return sc->rings[st];
  return (RingSizes){sc->nslots[st], sc->nslots[st], sc->ngslots[st], 0};
}

/* Rank r's list with its messages placed again for its stages' layouts (sc->hold), into out: its compute
 * order (with the replicas' sums) is the list's.  Returns the length, the list's own. */
static int place_again(const Schedule *sc, int r, Action *out) {
  int n = sc->nact[r], nc = 0;
  Action *c = malloc(sizeof(Action) * (size_t)(n + 1));
  if (!c) abort();
  for (int k = 0; k < n; k++) {
    int kind = sc->act[r][k].kind;
    if (action_is_compute(kind) || kind == ACT_REDUCE || kind == ACT_REDUCE_WAIT) c[nc++] = sc->act[r][k];
  }
  int k = sc->nchunks > 1 ? schedule_add_messages_chunked(sc, r, out, c, nc)
                          : schedule_add_messages(out, c, nc, r, sc->nstages, sc->m, sc->forward_only, 1,
                                                  sched_splits(sc->kind) && !(sc->hold && sc->hold[r]));
  free(c);
  if (k != n) abort(); /* the same actions, placed otherwise */
  return k;
}

void schedule_placed(const Schedule *sc, int r, int hold, Action *out) {
  Schedule u = *sc;
  int S = sched_nvstages(sc);
  u.hold = malloc(sizeof(int) * (size_t)(S + 1));
  if (!u.hold) abort();
  for (int st = 0; st < S; st++) u.hold[st] = sched_splits(sc->kind) && sched_rank_of(sc, st) == r ? hold : sc->hold ? sc->hold[st] : 0;
  place_again(&u, r, out);
  free(u.hold);
}

void schedule_ring_sizes(Schedule *sc, int s) {
  int V = sc->nchunks > 1 ? sc->nchunks : 1, junk;
  if (!sc->rings || !sc->hold || !sched_splits(sc->kind)) return;
  Action *tmp = malloc(sizeof(Action) * (size_t)(sc->nact[s] + 1));
  if (!tmp) abort();
  for (int h = 0; h < 2; h++) {
    schedule_placed(sc, s, h, tmp);
    for (int ch = 0; ch < V; ch++) {
      RingSizes *z = &sc->rings[sched_stage(sc, s, ch)];
      if (h) assign_ring(tmp, sc->nact[s], sc->m, V > 1 ? ch : -1, 1, 1, (int *[3]){&z->hslots, &junk, &junk});
      else assign_ring(tmp, sc->nact[s], sc->m, V > 1 ? ch : -1, 0, 1, (int *[3]){&z->slots, &z->gslots, &z->wslots});
    }
  }
  free(tmp);
}

void schedule_hold(Schedule *sc, int st, int hold) {
  if (!sc->hold || sc->hold[st] == hold) return;
  int r = sched_rank_of(sc, st);
  sc->hold[st] = hold;
  Action *tmp = malloc(sizeof(Action) * (size_t)(sc->nact[r] + 1));
  if (!tmp) abort();
  place_again(sc, r, tmp);
  memcpy(sc->act[r], tmp, sizeof(Action) * (size_t)sc->nact[r]);
  free(tmp);
  schedule_assign_slots(sc, r);
}

/* ---- timing ---- */

static double duration(const Action *a, const StageCost *c) {
  switch (a->kind) {
  case ACT_F: return c->fwd + c->comm / 2;
  case ACT_B: return c->bwd + c->comm / 2;
  case ACT_I: return c->bwd - c->bwd_w + c->comm / 2;
  case ACT_W: return c->bwd_w;
  case ACT_RECOMPUTE: return c->recompute;
  case ACT_UPDATE: return c->update;
  case ACT_REDUCE_WAIT: return c->reduce;
  default: return 0; /* posting a message or a transfer: not modelled */
  }
}

/* The part of an action's duration that is compute (docs/cost.md, "The bubble"): all of it but the
 * message time charged to F, B and I. */
static double compute_part(const Action *a, const StageCost *c) {
  double d = duration(a, c);
  return a->kind == ACT_F || a->kind == ACT_B || a->kind == ACT_I ? d - c->comm / 2 : d;
}

/* The timing simulation's state.  Transfers of the memory plan run beside
 * compute: each rank has one channel (its file copies, or its link to the
 * peer) that carries its OFFLOADs and PREFETCHes in the order they are
 * posted; a peer's copy leaves once the peer has posted its HOLD and comes
 * back once it has posted its RETURN (which waits for the data to be there).
 * An action that reuses an xslot waits for the offload out of it, and for
 * the SEND of a value that leaves from it to have met its receive (posted by
 * the next stages' RECV); so does that micro-batch's own OFFLOAD; the
 * backward of a micro-batch waits for its prefetch. */
typedef struct Sim {
  const Schedule *sc;
  const StageCost *cost;     /* per stage (chunked: chunk_costs's) */
  int p, m, S;               /* ranks, micro-batches, stages */
  double *fdone, *bdone;     /* [stage*m+mb] */
  double *rs_post, *upd_end; /* pipefb: RECV_STASH posted [s*m+mb]; UPDATE done, per rank */
  double *off_post, *off_end, *hold_t, *ret_t, *pre_post, *pre_end, *ret_slot;
  double *rv_post, *sent_x; /* [stage*m+mb]: RECV posted; 1: its SEND sent from its xslot */
  double *chan, *free_at;    /* per rank */
  double **xfree, **sfree;   /* per rank, per xslot / store slot: when its last transfer out completes (-1 unknown) */
  int **xowner;              /* per rank, per xslot: the micro-batch whose offload leaves it last (-1 none) */
  int **xsent;               /* per rank, per xslot: the micro-batch whose SEND left from it last (-1 none) */
} Sim;

#define IDX(s, mb) ((s) * sim->m + (mb))

/* Completes what can be completed: a peer's offload once its HOLD is posted,
 * a peer's prefetch once its RETURN is. */
static void sim_resolve(Sim *sim) {
  const Schedule *sc = sim->sc;
  for (int s = 0; s < sim->p; s++)
    for (int k = 0; k < sc->nact[s]; k++) {
      Action *a = &sc->act[s][k];
      int i = a->mb >= 0 ? IDX(s, a->mb) : 0;
      if (a->kind == ACT_OFFLOAD && a->peer >= 0 && sim->off_post[i] >= 0 && sim->off_end[i] < 0 && sim->hold_t[i] >= 0) {
        double st = fmax(fmax(sim->off_post[i], sim->hold_t[i]), sim->chan[s]);
        sim->off_end[i] = sim->chan[s] = a->end = st + sim->cost[s].xfer_out;
        sim->xfree[s][a->xslot] = sim->off_end[i];
      }
      if (a->kind == ACT_PREFETCH && a->peer >= 0 && sim->pre_post[i] >= 0 && sim->pre_end[i] < 0 && sim->ret_t[i] >= 0) {
        double st = fmax(fmax(sim->pre_post[i], sim->ret_t[i]), sim->chan[s]);
        sim->pre_end[i] = sim->chan[s] = a->end = st + sim->cost[s].xfer_in;
        sim->sfree[a->peer][(int)sim->ret_slot[i]] = sim->pre_end[i]; /* the peer's store slot is free again */
      }
    }
}

/* The latest of times[IDX(rank, mb)] over the ranks listed, or -1 if one is not known yet. */
static double latest(const Sim *sim, const double *times, const int *ranks, int n, int mb) {
  double r = 0;
  for (int i = 0; i < n; i++) {
    double t = times[ranks[i] * sim->m + mb];
    if (t < 0) return -1;
    r = fmax(r, t);
  }
  return r;
}

/* PipeFB: a forward waits for the previous forward rank, and for its stash
 * slot (two per rank: every backward rank it feeds has posted the receive
 * of mb - 2); a backward waits for the next backward rank's gradient and
 * for the forwards that made its stash; the weights come once every
 * backward rank holding them has updated. */
static double fb_ready(Sim *sim, const Action *a, int s) {
  const FbLinks *fb = sim->sc->fb;
  double r = 0, t;
  switch (a->kind) {
  case ACT_F:
    if (fb->prev[s] >= 0 && (r = sim->fdone[IDX(fb->prev[s], a->mb)]) < 0) return -1;
    if (a->mb >= 2 && (t = latest(sim, sim->rs_post, fb->stash_to[s], fb->nstash_to[s], a->mb - 2)) < 0) return -1;
    return a->mb >= 2 ? fmax(r, t) : r;
  case ACT_B:
    if (fb->next[s] >= 0 && (r = sim->bdone[IDX(fb->next[s], a->mb)]) < 0) return -1;
    if ((t = latest(sim, sim->fdone, fb->stash_from[s], fb->nstash_from[s], a->mb)) < 0) return -1;
    return fmax(r, t);
  case ACT_RECV_WEIGHTS:
    for (int i = 0; i < fb->nw_from[s]; i++) {
      if ((t = sim->upd_end[fb->w_from[s][i]]) < 0) return -1;
      r = fmax(r, t);
    }
    return r;
  default: return 0;
  }
}

/* The latest of times[IDX(r, mb)] over stage s's peers (src or dst lists,
 * which one-chunk schedules have, naming ranks = stages; without them the
 * neighbour stage s-1 or s+1), -1 if one is not known; `none` when there
 * are none. */
static double peers_done(const Sim *sim, int s, int mb, int fwd, const double *times, double none) {
  const Schedule *sc = sim->sc;
  if (!sc->src) {
    int r = fwd ? s - 1 : s + 1;
    return r < 0 || r >= sim->S ? none : times[IDX(r, mb)];
  }
  int n = fwd ? sc->nsrc[s] : sc->ndst[s];
  if (!n) return none;
  return latest(sim, times, fwd ? sc->src[s] : sc->dst[s], n, mb);
}

/* When rank s's action a can start, or -1 if that is not known yet. */
static double sim_ready(Sim *sim, const Action *a, int s, const int *has_pre) {
  double r = 0;
  if (sim->sc->fb) return fb_ready(sim, a, s);
  int st = sched_stage(sim->sc, s, a->chunk);
  if (a->kind == ACT_F) r = peers_done(sim, st, a->mb, 1, sim->fdone, 0);
  if (a->kind == ACT_B || a->kind == ACT_I) r = peers_done(sim, st, a->mb, 0, sim->bdone, sim->fdone[IDX(st, a->mb)]);
  if (r < 0) return -1;
  if (a->kind == ACT_HOLD) {
    if (a->xslot >= 0 && sim->sfree[s][a->xslot] < 0) return -1;
    return a->xslot >= 0 ? sim->sfree[s][a->xslot] : 0;
  }
  if (a->kind == ACT_RETURN) return sim->off_end[IDX(a->peer, a->mb)];
  if (a->kind == ACT_OFFLOAD && sim->sent_x[IDX(st, a->mb)] > 0) { /* after its SEND from the xslot completed */
    double t = peers_done(sim, st, a->mb, 0, sim->rv_post, 0);
    if (t < 0) return -1;
    r = fmax(r, t);
  }
  if (a->xslot >= 0 && a->kind != ACT_OFFLOAD) {
    if (sim->xowner[s][a->xslot] != a->mb) { /* a new holder: the offload out of it must be done */
      if (sim->xfree[s][a->xslot] < 0) return -1;
      r = fmax(r, sim->xfree[s][a->xslot]);
      int o = sim->xsent[s][a->xslot]; /* and the last send from it */
      if (o >= 0 && o != a->mb) {
        double t = peers_done(sim, st, o, 0, sim->rv_post, 0);
        if (t < 0) return -1;
        r = fmax(r, t);
      }
    }
    if (has_pre[a->mb] && a->kind != ACT_PREFETCH && a->kind != ACT_RECV && a->kind != ACT_F && a->kind != ACT_SEND) {
      double e = sim->pre_end[IDX(s, a->mb)];
      if (e < 0) return -1;
      r = fmax(r, e);
    }
  }
  return r;
}

/* Runs rank s's action a at its start time. */
static void sim_run(Sim *sim, Action *a, int s) {
  const StageCost *c = &sim->cost[s];
  int i = a->mb >= 0 ? IDX(sched_stage(sim->sc, s, a->chunk), a->mb) : 0; /* by stage (the memory plan's lists: one chunk, stage = rank) */
  if (a->xslot >= 0 && a->kind != ACT_HOLD && a->kind != ACT_RETURN) {
    if (sim->xowner[s][a->xslot] != a->mb) sim->xowner[s][a->xslot] = a->mb, sim->xfree[s][a->xslot] = 0;
  }
  switch (a->kind) {
  case ACT_F: sim->fdone[i] = a->end; break;
  case ACT_B: case ACT_I: sim->bdone[i] = a->end; break;
  case ACT_RECV: sim->rv_post[i] = a->start; break;
  case ACT_SEND:
    if (a->xslot >= 0) sim->sent_x[i] = 1, sim->xsent[s][a->xslot] = a->mb;
    break;
  case ACT_OFFLOAD:
    sim->off_post[i] = a->start;
    sim->xfree[s][a->xslot] = -1; /* until the copy is out */
    sim->xowner[s][a->xslot] = -1;
    if (a->peer < 0) {
      double st = fmax(a->start, sim->chan[s]);
      sim->off_end[i] = sim->chan[s] = a->end = st + c->xfer_out;
      sim->xfree[s][a->xslot] = sim->off_end[i];
    }
    break;
  case ACT_PREFETCH:
    sim->pre_post[i] = a->start;
    if (a->peer < 0) {
      double st = fmax(fmax(a->start, sim->chan[s]), sim->off_end[i]);
      sim->pre_end[i] = sim->chan[s] = a->end = st + c->xfer_in;
    }
    break;
  case ACT_HOLD:
    sim->hold_t[IDX(a->peer, a->mb)] = a->start;
    sim->sfree[s][a->xslot] = -1; /* until the data went back */
    break;
  case ACT_RETURN: sim->ret_t[IDX(a->peer, a->mb)] = a->start, sim->ret_slot[IDX(a->peer, a->mb)] = a->xslot; break;
  case ACT_RECV_STASH: sim->rs_post[i] = a->start; break;
  case ACT_UPDATE: sim->upd_end[s] = a->end; break;
  default: break;
  }
}

/* The costs of rank s's action a: its stage's. */
static const StageCost *cost_of(const Sim *sim, const Action *a, int s) { return &sim->cost[sched_stage(sim->sc, s, a->chunk)]; }

/* The part of stage s's message time on its link to the previous stage
 * (lower) or the next: in proportion to the bytes each way (half each when
 * not known); all of it where the stage has one link. */
static double link_share(const StageCost *c, int s, int S, int lower) {
  if (lower ? s == 0 : s == S - 1) return 0;
  if (lower ? s == S - 1 : s == 0) return c->comm;
  double in = c->recv_bytes, out = c->send_bytes;
  return c->comm * (in + out > 0 ? (lower ? in : out) / (in + out) : 0.5);
}

/* Chunked lists: the stage costs as the simulation charges them, or NULL
 * (one chunk: cost as it is).  Between two stages on one rank the values
 * are copied, not sent: that link's share of comm is dropped; and a rank's
 * one UPDATE updates all its chunks, so its stage of chunk 0 carries their
 * update times. */
static StageCost *chunk_costs(const Schedule *sc, const StageCost *cost) {
  int S = sched_nvstages(sc);
  if (sc->nchunks <= 1) return NULL;
  StageCost *c = malloc(sizeof(StageCost) * (size_t)S);
  if (!c) abort();
  memcpy(c, cost, sizeof(StageCost) * (size_t)S);
  for (int s = 0; s < S; s++) {
    int r = sched_rank_of(sc, s);
    double local = (s > 0 && sched_rank_of(sc, s - 1) == r ? link_share(&cost[s], s, S, 1) : 0) +
                   (s < S - 1 && sched_rank_of(sc, s + 1) == r ? link_share(&cost[s], s, S, 0) : 0);
    c[s].comm = fmax(0, cost[s].comm - local);
  }
  for (int r = 0; r < sc->nstages; r++) {
    double u = 0;
    for (int ch = 0; ch < sc->nchunks; ch++) u += cost[sched_stage(sc, r, ch)].update;
    c[sched_stage(sc, r, 0)].update = u;
  }
  return c;
}

/* Busy CPU: compute, recomputation and the update (a transfer runs beside them). */
static int uses_cpu(int kind) { return action_is_compute(kind) || kind == ACT_RECOMPUTE || kind == ACT_UPDATE; }

/* An action's duration where more replicas share the host than it has cores (sc->share > 1: each replica's
 * ranks get that fraction of one core, replica.c): its compute takes that much longer. */
static double shared(const Schedule *sc, const Action *a, const StageCost *c) {
  return duration(a, c) * (sc->share > 1 && uses_cpu(a->kind) ? sc->share : 1);
}

/* Pinned ranks (sc->core_of): the next action to run is the one, over all
 * ranks, that can start first; a CPU action also waits for its core, which
 * runs one action at a time at its own speed (Linux's time slices are longer
 * than most actions; a rank that waits yields its core).  A file transfer
 * of the memory plan runs on its rank's channel beside compute, as unpinned:
 * the kernel's io-wq workers (or the I/O thread) that copy are not pinned (runtime/xfer.c).  -1: none can start yet. */
static int pick_pinned(Sim *sim, const int *next, const int *has_pre, const double *core_free, double *start) {
  const Schedule *sc = sim->sc;
  int best = -1;
  for (int s = 0; s < sim->p; s++) {
    if (next[s] >= sc->nact[s]) continue;
    const Action *a = &sc->act[s][next[s]];
    double r = sim_ready(sim, a, s, has_pre + s * sim->m);
    if (r < 0) continue;
    double t = fmax(r, sim->free_at[s]);
    if (uses_cpu(a->kind)) t = fmax(t, core_free[sc->core_of[s]]);
    if (best < 0 || t < *start) best = s, *start = t;
  }
  return best;
}

/* One pass of the simulation; stretch[s][k] (NULL: 1) slows rank s's k-th action.  busy_too: the
 * stretch is the action's own time (schedule_jitter's draws), so its busy time stretches with it;
 * otherwise (sharing cores) the rank waits its turn, which is not busy. */
static int simulate(Schedule *sc, const StageCost *cost, double **stretch, int busy_too) {
  int p = sc->nstages, m = sched_mbs(sc), S = sched_nvstages(sc);
  Sim sv, *sim = &sv;
  memset(&sv, 0, sizeof sv);
  StageCost *own = chunk_costs(sc, cost);
  sv.sc = sc, sv.cost = own ? own : cost, sv.p = p, sv.m = m, sv.S = S;
  double *all = malloc(sizeof(double) * (size_t)(12 * S * m + 3 * p));
  int *next = calloc((size_t)p, sizeof(int)), remaining = 0, *has_pre = calloc((size_t)(p * m + 1), sizeof(int));
  sim->xfree = calloc((size_t)p, sizeof(double *)), sim->sfree = calloc((size_t)p, sizeof(double *));
  sim->xowner = calloc((size_t)p, sizeof(int *)), sim->xsent = calloc((size_t)p, sizeof(int *));
  if (!all || !next || !has_pre || !sim->xfree || !sim->sfree || !sim->xowner || !sim->xsent) abort();
  double *at = all;
  double **arr[] = {&sim->fdone, &sim->bdone,    &sim->off_post, &sim->off_end,  &sim->hold_t,
                    &sim->ret_t, &sim->pre_post, &sim->pre_end,  &sim->ret_slot, &sim->rs_post,
                    &sim->rv_post, &sim->sent_x};
  for (size_t k = 0; k < sizeof arr / sizeof arr[0]; k++, at += S * m) {
    *arr[k] = at;
    for (int q = 0; q < S * m; q++) at[q] = -1;
  }
  sim->chan = at, sim->free_at = at + p, sim->upd_end = at + 2 * p;
  for (int s = 0; s < p; s++) {
    int nx = sc->nxslots ? sc->nxslots[s] : 0, ns = sc->nstore ? sc->nstore[s] : 0;
    sim->xfree[s] = malloc(sizeof(double) * (size_t)(nx + 1)), sim->sfree[s] = malloc(sizeof(double) * (size_t)(ns + 1));
    sim->xowner[s] = malloc(sizeof(int) * (size_t)(nx + 1)), sim->xsent[s] = malloc(sizeof(int) * (size_t)(nx + 1));
    if (!sim->xfree[s] || !sim->sfree[s] || !sim->xowner[s] || !sim->xsent[s]) abort();
    for (int x = 0; x <= nx; x++) sim->xfree[s][x] = 0, sim->xowner[s][x] = -1, sim->xsent[s][x] = -1;
    for (int x = 0; x <= ns; x++) sim->sfree[s][x] = 0;
    sim->chan[s] = sim->free_at[s] = 0, sim->upd_end[s] = -1, sc->busy[s] = 0, remaining += sc->nact[s];
    for (int k = 0; k < sc->nact[s]; k++)
      if (sc->act[s][k].kind == ACT_PREFETCH && sc->act[s][k].mb >= 0 && sc->act[s][k].mb < m) has_pre[s * m + sc->act[s][k].mb] = 1;
  }
  int rc = 0;
  double *core_free = sc->core_of ? calloc((size_t)sc->cores + 1, sizeof(double)) : NULL;
  while (remaining > 0 && core_free) {
    double st = 0;
    int s = pick_pinned(sim, next, has_pre, core_free, &st);
    if (s < 0) {
      sim_resolve(sim);
      if ((s = pick_pinned(sim, next, has_pre, core_free, &st)) < 0) {
        rc = err_set("schedule: the timing simulation stalls (rank 0 at action %d)", next[0]);
        break;
      }
    }
    Action *a = &sc->act[s][next[s]];
    a->start = st, a->end = st + shared(sc, a, cost_of(sim, a, s));
    sim->free_at[s] = a->end;
    if (uses_cpu(a->kind)) core_free[sc->core_of[s]] = a->end;
    sc->busy[s] += compute_part(a, cost_of(sim, a, s));
    sim_run(sim, a, s);
    next[s]++, remaining--;
  }
  free(core_free);
  while (remaining > 0 && !sc->core_of) {
    int progressed = 0;
    for (int s = 0; s < p; s++) {
      while (next[s] < sc->nact[s]) {
        Action *a = &sc->act[s][next[s]];
        double ready = sim_ready(sim, a, s, has_pre + s * m);
        if (ready < 0) break;
        double k = stretch ? stretch[s][next[s]] : 1, dur = shared(sc, a, cost_of(sim, a, s)) * k;
        a->start = fmax(ready, sim->free_at[s]);
        a->end = a->start + dur;
        sim->free_at[s] = a->end;
        /* At its own speed when stretched for sharing: ranks that share
         * cores take turns in whole time slices, so an action runs unshared
         * once it runs (docs/cost.md, "Ranks that share cores"), and the
         * runtime's bubble, which counts wall time inside actions, sees it
         * so.  A jitter draw is the action's own time: busy, all of it. */
        sc->busy[s] += compute_part(a, cost_of(sim, a, s)) * (busy_too ? k : 1);
        sim_run(sim, a, s);
        next[s]++, remaining--, progressed = 1;
      }
    }
    sim_resolve(sim);
    if (!progressed) {
      sim_resolve(sim);
      int again = 0;
      for (int s = 0; s < p && !again; s++)
        if (next[s] < sc->nact[s] && sim_ready(sim, &sc->act[s][next[s]], s, has_pre + s * m) >= 0) again = 1;
      if (again) continue;
      rc = err_set("schedule: the timing simulation stalls (rank 0 at action %d)", next[0]);
      break;
    }
  }
  if (!rc) {
    /* A rank's step ends when its compute and its transfers do. */
    sc->step_time = 0;
    for (int s = 0; s < p; s++) sc->step_time = fmax(sc->step_time, fmax(sim->free_at[s], sim->chan[s]));
    double busy = 0;
    for (int s = 0; s < p; s++) busy += sc->busy[s];
    sc->bubble = sc->step_time > 0 ? 1 - busy / ((double)p * sc->step_time) : 0;
    if (sc->unroll > 0) schedule_async_period(sc); /* the step of a pipeline that never drains */
  }
  for (int s = 0; s < p; s++) free(sim->xfree[s]), free(sim->sfree[s]), free(sim->xowner[s]), free(sim->xsent[s]);
  free(sim->xfree), free(sim->sfree), free(sim->xowner), free(sim->xsent), free(all), free(next), free(has_pre), free(own);
  return rc;
}

typedef struct Edge {
  double t;
  int d;
} Edge;

static int edge_cmp(const void *a, const void *b) {
  const Edge *x = a, *y = b;
  return x->t < y->t ? -1 : x->t > y->t ? 1 : y->d - x->d;
}

/* More ranks than cores: ranks computing at once share the cores, while a
 * rank that waits gives its core away (the runtime yields between polls).
 * Pinned (schedule_pin), each core runs its ranks' actions one at a time
 * (simulate).  Unpinned, each CPU action is stretched by the mean number of
 * ranks computing over its span, divided by the cores, and the lists are
 * simulated again until the stretches settle (a mean-field fixed point; a
 * few passes). */
int schedule_time(Schedule *sc, const StageCost *cost) {
  int p = sc->nstages;
  if (sc->cores <= 0 || p <= sc->cores || sc->core_of) return simulate(sc, cost, NULL, 0);
  int total = 0;
  for (int s = 0; s < p; s++) total += sc->nact[s];
  double **stretch = malloc(sizeof(double *) * (size_t)p), *base = malloc(sizeof(double) * (size_t)(total + 1));
  double *level = malloc(sizeof(double) * (size_t)(2 * total + 1)), *area = malloc(sizeof(double) * (size_t)(2 * total + 1));
  Edge *ev = malloc(sizeof(Edge) * (size_t)(2 * total + 1));
  if (!stretch || !base || !level || !area || !ev) abort();
  for (int s = 0, at = 0; s < p; at += sc->nact[s], s++) {
    stretch[s] = base + at;
    for (int k = 0; k < sc->nact[s]; k++) stretch[s][k] = 1;
  }
  int rc = 0;
  for (int pass = 0; pass < 12; pass++) {
    if ((rc = simulate(sc, cost, stretch, 0))) break;
    /* The number of ranks computing, as a step function of time.  A rank's
     * copy to or from its file (the memory plan: an io-wq worker of the kernel,
     * or the I/O thread) takes a core too while it runs. */
    int ne = 0;
    for (int s = 0; s < p; s++)
      for (int k = 0; k < sc->nact[s]; k++) {
        const Action *a = &sc->act[s][k];
        int file = (a->kind == ACT_OFFLOAD || a->kind == ACT_PREFETCH) && a->peer < 0;
        if (file && a->end > a->start) {
          double d = fmin(a->end - a->start, a->kind == ACT_OFFLOAD ? cost[s].xfer_out : cost[s].xfer_in);
          ev[ne++] = (Edge){a->end - d, 1}, ev[ne++] = (Edge){a->end, -1};
        }
        if (!uses_cpu(a->kind) || a->end <= a->start) continue;
        ev[ne++] = (Edge){a->start, 1}, ev[ne++] = (Edge){a->end, -1};
      }
    qsort(ev, (size_t)ne, sizeof *ev, edge_cmp);
    /* area[i]: the integral of the count up to ev[i].t; level[i]: the count after it. */
    int c = 0;
    for (int i = 0; i < ne; i++) {
      area[i] = i ? area[i - 1] + level[i - 1] * (ev[i].t - ev[i - 1].t) : 0;
      c += ev[i].d, level[i] = c;
    }
    double moved = 0;
    for (int s = 0; s < p; s++)
      for (int k = 0; k < sc->nact[s]; k++) {
        const Action *a = &sc->act[s][k];
        if (!uses_cpu(a->kind) || a->end <= a->start) continue;
        double integral[2];
        for (int e = 0; e < 2; e++) {
          double t = e ? a->end : a->start;
          int lo = 0, hi = ne - 1; /* the last edge at or before t */
          while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (ev[mid].t <= t) lo = mid;
            else hi = mid - 1;
          }
          integral[e] = area[lo] + level[lo] * (t - ev[lo].t);
        }
        double busy = (integral[1] - integral[0]) / (a->end - a->start);
        double want = fmax(1, busy / sc->cores), now = stretch[s][k];
        /* The count includes this action's own share of the stretch: damp. */
        double next = fmax(1, 0.5 * (now + want));
        moved = fmax(moved, fabs(next - now));
        stretch[s][k] = next;
      }
    if (moved < 1e-3) break;
  }
  if (!rc) rc = simulate(sc, cost, stretch, 0);
  free(stretch), free(base), free(level), free(area), free(ev);
  return rc;
}

/* The step with ranks pinned as `core` says; -1 if the lists stall. */
static double pinned_step(Schedule *sc, const StageCost *cost, int *core) {
  sc->core_of = core;
  return schedule_time(sc, cost) ? -1 : sc->step_time;
}

/* Which ranks share a core decides what sharing costs: two that compute at
 * the same moments slow each other, while a rank that waits (polling and
 * yielding) gives its core to the one beside it.  Left to itself, Linux
 * balances the ranks by how many are runnable, and a polling rank is
 * runnable: two computing ranks can sit on one core while two polling ones
 * hold the other, for as long as the placement lasts.  On the GPT at n = 4
 * on 2 cores the three ways to pair the ranks measured 16.0, 11.7 and 12.4
 * ms a step under gpipe (docs/cost.md), and unpinned runs moved between
 * such figures within one run.  So the plan pins: it tries
 * the ranks dealt round-robin, in blocks, and mirrored (s beside p-1-s, as
 * 1F1B's busiest stages are the first), then swaps of two ranks while one
 * helps, each by the simulation above, and keeps the fastest. */
int schedule_pin(Schedule *sc, const StageCost *cost, Pool *pool) {
  int p = sc->nstages, C = sc->cores;
  sc->core_of = NULL, sc->step_unpinned = 0; /* plan_jitter sets it for the final lists */
  if (C <= 0 || p <= C) return 0;
  int *best = pool_alloc(pool, sizeof(int) * (size_t)p), *cand = malloc(sizeof(int) * (size_t)p);
  if (!cand) abort();
  double best_t = INFINITY;
  for (int way = 0; way < 3; way++) {
    for (int s = 0; s < p; s++) {
      int pair = s < p - 1 - s ? s : p - 1 - s; /* mirrored: s and p-1-s as one */
      cand[s] = way == 0 ? s % C : way == 1 ? (int)((int64_t)s * C / p) : pair % C;
    }
    double t = pinned_step(sc, cost, cand);
    if (t < 0) {
      free(cand), sc->core_of = NULL;
      return -1;
    }
    if (t < best_t * (1 - 1e-9)) best_t = t, memcpy(best, cand, sizeof(int) * (size_t)p);
  }
  /* Swaps, first improvement, within a budget of simulations. */
  int budget = 64, improved = 1;
  while (improved && budget > 0) {
    improved = 0;
    for (int a = 0; a < p && budget > 0 && !improved; a++)
      for (int b = a + 1; b < p && budget > 0 && !improved; b++) {
        if (best[a] == best[b]) continue;
        memcpy(cand, best, sizeof(int) * (size_t)p);
        cand[a] = best[b], cand[b] = best[a];
        double t = pinned_step(sc, cost, cand);
        budget--;
        if (t >= 0 && t < best_t * (1 - 1e-3)) best_t = t, memcpy(best, cand, sizeof(int) * (size_t)p), improved = 1;
      }
  }
  free(cand);
  return pinned_step(sc, cost, best) < 0 ? -1 : 0;
}

/* A reproducible normal deviate (xorshift64*, Box-Muller). */
static double draw_normal(uint64_t *x) {
  double u[2];
  for (int i = 0; i < 2; i++) {
    *x ^= *x >> 12, *x ^= *x << 25, *x ^= *x >> 27;
    u[i] = ((double)((*x * 0x2545F4914F6CDD1DULL) >> 11) + 0.5) / 9007199254740992.0; /* (0, 1) */
  }
  return sqrt(-2 * log(u[0])) * cos(2 * M_PI * u[1]);
}

int schedule_jitter(Schedule *sc, const StageCost *cost, double cv, int draws) {
  int p = sc->nstages, applies = cv > 0 && draws >= 1 && sc->unroll <= 0 && !(sc->cores > 0 && p > sc->cores);
  sc->jitter = 0, sc->jitter_draws = 0;
  int rc = applies ? simulate(sc, cost, NULL, 0) : schedule_time(sc, cost); /* the figures at the medians */
  sc->step_time_fixed = sc->step_time, sc->bubble_fixed = sc->bubble;
  if (rc || !applies) return rc;
  int total = 0;
  for (int s = 0; s < p; s++) total += sc->nact[s];
  double **mult = malloc(sizeof(double *) * (size_t)p), *base = malloc(sizeof(double) * (size_t)(total + 1));
  if (!mult || !base) abort();
  for (int s = 0, at = 0; s < p; at += sc->nact[s], s++) mult[s] = base + at;
  uint64_t x = 0x9E3779B97F4A7C15ULL;
  double t = 0, b = 0;
  for (int d = 0; d < draws && !rc; d++) {
    for (int s = 0; s < p; s++)
      for (int k = 0; k < sc->nact[s]; k++)
        mult[s][k] = uses_cpu(sc->act[s][k].kind) ? fmin(3, fmax(0.3, 1 + cv * draw_normal(&x))) : 1;
    if (!(rc = simulate(sc, cost, mult, 1))) t += sc->step_time, b += sc->bubble;
  }
  if (!rc) rc = simulate(sc, cost, NULL, 0); /* the actions' timing: their medians' */
  if (!rc) sc->step_time = t / draws, sc->bubble = b / draws, sc->jitter = cv, sc->jitter_draws = draws;
  free(mult), free(base);
  return rc;
}

/* ---- building ---- */

void schedule_build(Schedule *sc, int kind, int p, int m, int fwd_only, const StageCost *cost, Pool *pool) {
  if (!fwd_only && (kind == SCHED_INTERLEAVED || kind == SCHED_ZBV)) {
    /* The chunked kinds take their number of chunks from schedule_build_chunked's caller; here two.  A
     * refusal (interleaved with m not a multiple of p) leaves no ranks and its message in err_msg. */
    if (schedule_build_chunked(sc, kind, p, 2, m, cost, pool)) memset(sc, 0, sizeof *sc), sc->kind = kind, sc->m = m;
    return;
  }
  memset(sc, 0, sizeof *sc);
  sc->nstages = p, sc->m = m, sc->kind = kind, sc->forward_only = fwd_only;
  sc->act = pool_alloc(pool, sizeof(Action *) * (size_t)p);
  sc->nact = pool_alloc(pool, sizeof(int) * (size_t)p);
  sc->nslots = pool_alloc(pool, sizeof(int) * (size_t)p);
  sc->ngslots = pool_alloc(pool, sizeof(int) * (size_t)p);
  sc->nwslots = pool_alloc(pool, sizeof(int) * (size_t)p);
  sc->hold = pool_alloc(pool, sizeof(int) * (size_t)p);
  sc->rings = pool_alloc(pool, sizeof(RingSizes) * (size_t)p);
  sc->busy = pool_alloc(pool, sizeof(double) * (size_t)p);
  Action **ord = pool_alloc(pool, sizeof(Action *) * (size_t)p);
  int *len = pool_alloc(pool, sizeof(int) * (size_t)p);
  for (int s = 0; s < p; s++) ord[s] = pool_alloc(pool, sizeof(Action) * (size_t)(3 * m + 1));
  if (fwd_only || kind == SCHED_GPIPE)
    for (int s = 0; s < p; s++) len[s] = order_gpipe(ord[s], m, fwd_only);
  else if (kind == SCHED_ZB1) order_zb1(ord, len, p, m, pool);
  else
    for (int s = 0; s < p; s++) len[s] = order_1f1b(ord[s], s, p, m);
  for (int s = 0; s < p; s++) {
    /* At most 3 compute and 4 message actions per micro-batch, and the update. */
    sc->act[s] = pool_alloc(pool, sizeof(Action) * (size_t)(7 * m + 2));
    sc->nact[s] = schedule_add_messages(sc->act[s], ord[s], len[s], s, p, m, fwd_only, 1, kind == SCHED_ZB1);
    schedule_assign_slots(sc, s);
    schedule_ring_sizes(sc, s);
  }
  schedule_time(sc, cost); /* a stall is reported by schedule_validate, with names */
  err_clear();
}

/* ---- PipeFB ---- */

void fb_links_init(FbLinks *L, int n, int nf, Pool *pool) {
  memset(L, 0, sizeof *L);
  L->nf = nf;
  int **lists[] = {&L->prev, &L->next, &L->nstash_to, &L->nstash_from, &L->nw_from, &L->nw_to};
  for (size_t i = 0; i < sizeof lists / sizeof lists[0]; i++) *lists[i] = pool_alloc(pool, sizeof(int) * (size_t)n);
  int ***sets[] = {&L->stash_to, &L->stash_from, &L->w_from, &L->w_to};
  for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) {
    *sets[i] = pool_alloc(pool, sizeof(int *) * (size_t)n);
    for (int r = 0; r < n; r++) (*sets[i])[r] = pool_alloc(pool, sizeof(int) * (size_t)n);
  }
  for (int r = 0; r < n; r++) {
    int fwd = r < nf;
    L->prev[r] = fwd ? (r > 0 ? r - 1 : -1) : (r > nf ? r - 1 : -1);
    L->next[r] = fwd ? (r + 1 < nf ? r + 1 : -1) : (r + 1 < n ? r + 1 : -1);
  }
}

static void fb_add(Schedule *sc, int s, int kind, int mb, int slot, int gslot) {
  Action a = action_make(kind, mb);
  a.slot = slot, a.gslot = gslot;
  sc->act[s][sc->nact[s]++] = a;
}

void schedule_build_pipefb(Schedule *sc, const FbLinks *fb, int n, int m, const StageCost *cost, Pool *pool) {
  memset(sc, 0, sizeof *sc);
  sc->nstages = n, sc->m = m, sc->kind = SCHED_PIPEFB, sc->fb = fb;
  sc->act = pool_alloc(pool, sizeof(Action *) * (size_t)n);
  sc->nact = pool_alloc(pool, sizeof(int) * (size_t)n);
  sc->nslots = pool_alloc(pool, sizeof(int) * (size_t)n);
  sc->ngslots = pool_alloc(pool, sizeof(int) * (size_t)n);
  sc->nwslots = pool_alloc(pool, sizeof(int) * (size_t)n); /* no late values: pipefb does not split its backward */
  sc->busy = pool_alloc(pool, sizeof(double) * (size_t)n);
  int two = m < 2 ? m : 2; /* ring slots: one micro-batch computed while the other's messages leave */
  for (int s = 0; s < n; s++) {
    sc->act[s] = pool_alloc(pool, sizeof(Action) * (size_t)(6 * m + 4));
    sc->nslots[s] = two, sc->ngslots[s] = s < fb->nf ? 1 : two;
    int prev = fb->prev[s], next = fb->next[s];
    if (s < fb->nf) {
      for (int k = 0; k < two && prev >= 0; k++) fb_add(sc, s, ACT_RECV, k, k % 2, -1);
      for (int k = 0; k < m; k++) {
        fb_add(sc, s, ACT_F, k, k % 2, -1);
        if (next >= 0) fb_add(sc, s, ACT_SEND, k, k % 2, -1);
        fb_add(sc, s, ACT_SEND_STASH, k, k % 2, -1);
        if (prev >= 0 && k + 2 < m) fb_add(sc, s, ACT_RECV, k + 2, k % 2, -1);
      }
      fb_add(sc, s, ACT_RECV_WEIGHTS, -1, -1, -1);
    } else {
      for (int k = 0; k < two; k++) {
        fb_add(sc, s, ACT_RECV_STASH, k, k % 2, -1);
        if (next >= 0) fb_add(sc, s, ACT_RECV_GRAD, k, -1, k % 2);
      }
      for (int k = 0; k < m; k++) {
        fb_add(sc, s, ACT_B, k, k % 2, k % 2);
        if (prev >= 0) fb_add(sc, s, ACT_SEND_GRAD, k, -1, k % 2);
        if (k + 2 < m) {
          fb_add(sc, s, ACT_RECV_STASH, k + 2, k % 2, -1);
          if (next >= 0) fb_add(sc, s, ACT_RECV_GRAD, k + 2, -1, k % 2);
        }
      }
      fb_add(sc, s, ACT_UPDATE, -1, -1, -1);
      fb_add(sc, s, ACT_SEND_WEIGHTS, -1, -1, -1);
    }
  }
  schedule_time(sc, cost);
  err_clear(); /* a stall is reported by schedule_validate */
}
