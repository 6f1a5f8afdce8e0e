/* schedcheck.c - the schedule validator, run on every plan before code is
 * emitted, so that a wrong list is a compile-time error naming ranks and
 * actions rather than a hang or silently wrong gradients at run time.
 *
 * Per rank, statically: every micro-batch has its F, its backward (B, or I
 * then W), and exactly the messages its position needs (no RECV on stage 0,
 * no SEND on the last, none of the gradient ones in a forward-only
 * program), each after what it depends on; F's, backwards and W's run in
 * ascending micro-batch order (the loss sum, BatchNorm's running statistics
 * and the weight-gradient sums depend on it: that is what makes every
 * schedule and -n bit-identical); UPDATE once, last; and no slot or gslot
 * is taken while another micro-batch still holds it.
 *
 * Then all ranks run together under MPI's blocking rules as the runtime
 * uses them: F waits for the previous rank's SEND, B/I for the next rank's
 * SEND_GRAD; and before anything refills a slot (RECV, F) or gslot
 * (RECV_GRAD, B/I) it waits until the neighbour has posted the receive of
 * what was sent from it (a rendezvous send completes only then).  Tags are
 * unique per (step, mb, value, direction), so any matching order is
 * compatible; no progress while actions remain is a deadlock.
 *
 * Virtual stages (sc->nchunks > 1): the per-rank checks hold per chunk,
 * each chunk being a stage with its own rings; messages match by stage
 * (the SEND of stage s with the RECV of stage s+1, wherever that runs).
 * Two stages on one rank pass values by a copy into the receive already
 * posted, so there the receive must come before the send in the list. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schedule.h"

typedef struct Chk {
  const Schedule *sc;
  int **pos;   /* pos[st][kind * m + mb]: index of that action of stage st in its rank's list, -1; -2 if it appears twice */
  int **done;  /* done[st][kind * m + mb]: executed in the joint run */
  int *nupd;   /* async, with a barrier between steps: UPDATEs each rank has run (NULL: no barrier) */
} Chk;

/* With one chunk per rank, stage = rank: the indices above are the ranks'. */
static int at(const Chk *c, int st, int kind, int mb) { return c->pos[st][kind * sched_mbs(c->sc) + mb]; }

/* How messages name a rank's chunk: "rank 1", or "rank 1, chunk 0 (stage 1)". */
static const char *who(const Schedule *sc, int rank, int chunk, char *b, size_t len) {
  if (sc->nchunks <= 1) snprintf(b, len, "rank %d", rank);
  else snprintf(b, len, "rank %d, chunk %d (stage %d)", rank, chunk, sched_stage(sc, rank, chunk));
  return b;
}
static const char *who_stage(const Schedule *sc, int st, char *b, size_t len) {
  return who(sc, sched_rank_of(sc, st), sched_chunk_of(sc, st), b, len);
}

/* Chunked lists: each action names one of the rank's chunks, and none is
 * the memory plan's (its offload is not planned with chunks). */
static int chunk_ok(const Schedule *sc, int s, int k) {
  const Action *a = &sc->act[s][k];
  int V = sc->nchunks > 1 ? sc->nchunks : 1;
  char b[32];
  if (a->chunk < 0 || a->chunk >= V)
    return err_set("schedule: rank %d: action %d (%s) names chunk %d of %d", s, k, action_str(a, b, sizeof b), a->chunk, V);
  if (V > 1 && a->kind > ACT_RECV_GRAD && a->kind != ACT_UPDATE)
    return err_set("schedule: rank %d: action %d (%s): the memory plan's actions are not supported with chunks", s, k,
                   action_str(a, b, sizeof b));
  return 0;
}

static int index_actions(Chk *c, int s) {
  const Schedule *sc = c->sc;
  int m = sched_mbs(sc), nupd = 0;
  char b[32];
  for (int k = 0; k < sc->nact[s]; k++) {
    const Action *a = &sc->act[s][k];
    if (a->kind == ACT_UPDATE) {
      /* Async lists update once per step (schedule_validate_async checks where). */
      if (sc->unroll > 0) {
        nupd++;
        continue;
      }
      if (k != sc->nact[s] - 1 || nupd++) return err_set("schedule: rank %d: UPDATE at action %d must be once and last", s, k);
      continue;
    }
    if (a->kind == ACT_REDUCE || a->kind == ACT_REDUCE_WAIT) continue; /* check_reduce */
    if (a->kind < 0 || a->kind >= ACT_NKINDS || a->mb < 0 || a->mb >= m)
      return err_set("schedule: rank %d: action %d (%s) is not a valid action of %d micro-batches", s, k, action_str(a, b, sizeof b), m);
    if (chunk_ok(sc, s, k)) return -1;
    int *p = &c->pos[sched_stage(sc, s, a->chunk)][a->kind * m + a->mb];
    if (*p >= 0) return err_set("schedule: rank %d: %s appears twice (actions %d and %d)", s, action_str(a, b, sizeof b), *p, k);
    *p = k;
  }
  if (!sc->forward_only && !nupd) return err_set("schedule: rank %d: no UPDATE", s);
  if (sc->forward_only && nupd) return err_set("schedule: rank %d: UPDATE in a forward-only program", s);
  return 0;
}

/* Which kinds stage s must have for every micro-batch, and which it must not. */
static int wanted(const Schedule *sc, int s, int kind, int split) {
  int p = sched_nvstages(sc), train = !sc->forward_only;
  switch (kind) {
  case ACT_F: return 1;
  case ACT_B: return train && !split;
  case ACT_I: case ACT_W: return train && split;
  case ACT_SEND: return s < p - 1;
  case ACT_RECV: return s > 0;
  case ACT_SEND_GRAD: return train && s > 0;
  case ACT_RECV_GRAD: return train && s < p - 1;
  default: return 0;
  }
}

/* "x must come after y" for every micro-batch: kinds whose position depends on another. */
static const int AFTER[][2] = {{ACT_F, ACT_RECV},       {ACT_SEND, ACT_F},           {ACT_B, ACT_F},
                               {ACT_I, ACT_F},          {ACT_W, ACT_I},              {ACT_B, ACT_RECV_GRAD},
                               {ACT_I, ACT_RECV_GRAD},  {ACT_SEND_GRAD, ACT_B},      {ACT_SEND_GRAD, ACT_I},
                               {ACT_OFFLOAD, ACT_F},    {ACT_PREFETCH, ACT_OFFLOAD}, {ACT_RECOMPUTE, ACT_F},
                               {ACT_RECOMPUTE, ACT_PREFETCH}, {ACT_B, ACT_PREFETCH}, {ACT_I, ACT_PREFETCH},
                               {ACT_B, ACT_RECOMPUTE},  {ACT_I, ACT_RECOMPUTE},      {ACT_RETURN, ACT_HOLD}};

/* The memory plan's actions come in pairs: an OFFLOAD with its PREFETCH
 * (both to the same place), a peer's OFFLOAD with that peer's HOLD and
 * RETURN; a RECOMPUTE precedes a backward. */
static int check_memory_actions(Chk *c, int s) {
  const Schedule *sc = c->sc;
  int m = sched_mbs(sc), p = sc->nstages;
  for (int mb = 0; mb < m; mb++) {
    int o = at(c, s, ACT_OFFLOAD, mb), f = at(c, s, ACT_PREFETCH, mb);
    if ((o >= 0) != (f >= 0))
      return err_set("schedule: rank %d has %s%d without %s%d", s, o >= 0 ? "OFFLOAD" : "PREFETCH", mb, o >= 0 ? "PREFETCH" : "OFFLOAD", mb);
    if (o < 0) continue;
    int snd = at(c, s, ACT_SEND, mb);
    if (snd > o && sc->act[s][snd].xslot >= 0)
      return err_set("schedule: rank %d: OFFLOAD%d (action %d) comes before SEND%d (action %d), which sends from its xslot", s, mb, o, mb, snd);
    int q = sc->act[s][o].peer;
    if (q != sc->act[s][f].peer) return err_set("schedule: rank %d: OFFLOAD%d and PREFETCH%d go to different places", s, mb, mb);
    if (q >= p || q == s) return err_set("schedule: rank %d: OFFLOAD%d names rank %d", s, mb, q);
    if (q >= 0 && (at(c, q, ACT_HOLD, mb) < 0 || at(c, q, ACT_RETURN, mb) < 0 || sc->act[q][at(c, q, ACT_HOLD, mb)].peer != s))
      return err_set("schedule: rank %d offloads micro-batch %d to rank %d, which has no HOLD%d and RETURN%d for it", s, mb, q, mb, mb);
  }
  return 0;
}

/* Rank r's chunk ch (stage st): every message its place needs, each after what it depends on, and
 * compute in ascending micro-batch order. */
static int check_stage(Chk *c, int r, int ch) {
  const Schedule *sc = c->sc;
  int m = sched_mbs(sc), st = sched_stage(sc, r, ch);
  int split = m > 0 && at(c, st, ACT_I, 0) >= 0;
  char w[64], where[32] = "";
  who(sc, r, ch, w, sizeof w);
  if (sc->nchunks <= 1) snprintf(where, sizeof where, " (stage %d of %d", st, sc->nstages);
  else snprintf(where, sizeof where, " (of %d stages", sched_nvstages(sc));
  for (int kind = 0; kind <= ACT_RECV_GRAD; kind++)
    for (int mb = 0; mb < m; mb++) {
      int have = at(c, st, kind, mb) >= 0, want = wanted(sc, st, kind, split);
      if (have != want)
        return err_set("schedule: %s %s %s%d%s%s)", w, have ? "must not have" : "has no", action_kind_name(kind), mb, where,
                       sc->forward_only ? ", forward only" : "");
    }
  for (size_t q = 0; q < sizeof AFTER / sizeof AFTER[0]; q++)
    for (int mb = 0; mb < m; mb++) {
      int x = at(c, st, AFTER[q][0], mb), y = at(c, st, AFTER[q][1], mb);
      if (x >= 0 && y >= 0 && x < y)
        return err_set("schedule: %s: %s%d (action %d) comes before %s%d (action %d)", w, action_kind_name(AFTER[q][0]), mb, x,
                       action_kind_name(AFTER[q][1]), mb, y);
    }
  static const int ascending[] = {ACT_F, ACT_B, ACT_I, ACT_W};
  for (int q = 0; q < 4; q++)
    for (int mb = 1; mb < m; mb++) {
      int x = at(c, st, ascending[q], mb - 1), y = at(c, st, ascending[q], mb);
      if (x >= 0 && y >= 0 && y < x)
        return err_set("schedule: %s: %s%d (action %d) runs before %s%d (action %d); %s actions must run in ascending "
                       "micro-batch order (the sums over micro-batches depend on it)", w, action_kind_name(ascending[q]), mb, y,
                       action_kind_name(ascending[q]), mb - 1, x, action_kind_name(ascending[q]));
    }
  return 0;
}

/* Two consecutive stages on one rank: the send from one is a copy into the
 * other's posted receive, so for every micro-batch the receive comes first
 * (values: stage lo's SEND into hi's RECV; gradients: hi's SEND_GRAD into
 * lo's RECV_GRAD). */
static int check_local(Chk *c, int lo) {
  const Schedule *sc = c->sc;
  int m = sched_mbs(sc), hi = lo + 1;
  char w[64], v[64];
  for (int grad = 0; grad < 2; grad++)
    for (int mb = 0; mb < m; mb++) {
      int from = grad ? hi : lo, to = grad ? lo : hi;
      int snd = at(c, from, grad ? ACT_SEND_GRAD : ACT_SEND, mb), rcv = at(c, to, grad ? ACT_RECV_GRAD : ACT_RECV, mb);
      if (snd >= 0 && rcv >= 0 && rcv > snd)
        return err_set("schedule: %s: %s%d (action %d) goes to %s on the same rank, a copy into its %s%d, which is posted later "
                       "(action %d); the receive must come before the send", who_stage(sc, from, w, sizeof w),
                       grad ? "SEND_GRAD" : "SEND", mb, snd, who_stage(sc, to, v, sizeof v), grad ? "RECV_GRAD" : "RECV", mb, rcv);
    }
  return 0;
}

/* --replicas: a rank that trains sums its weight gradients over the replicas once per step: REDUCE after
 * every weight-gradient action (B, W) but the step's last and before that one (whose backward posts the
 * buckets), REDUCE_WAIT after it and right before the UPDATE; with one replica neither. */
static int check_reduce(const Schedule *sc, int s) {
  int red = -1, wait = -1, last = -1, prev = -1, n = sc->nact[s];
  for (int k = 0; k < n; k++) {
    int kind = sc->act[s][k].kind;
    if (kind == ACT_B || kind == ACT_W) prev = last, last = k;
    if (kind != ACT_REDUCE && kind != ACT_REDUCE_WAIT) continue;
    if (!sc->replicas) return err_set("schedule: rank %d: %s at action %d, but the plan has one replica", s, action_kind_name(kind), k);
    if (sc->act[s][k].mb != -1) return err_set("schedule: rank %d: %s at action %d names micro-batch %d (it is once per step)", s, action_kind_name(kind), k, sc->act[s][k].mb);
    int *at = kind == ACT_REDUCE ? &red : &wait;
    if (*at >= 0) return err_set("schedule: rank %d: %s twice (actions %d and %d)", s, action_kind_name(kind), *at, k);
    *at = k;
  }
  if (!sc->replicas || sc->forward_only || last < 0) {
    if (sc->replicas && (red >= 0 || wait >= 0)) return err_set("schedule: rank %d: REDUCE or REDUCE_WAIT, but no weight-gradient action", s);
    return 0;
  }
  if (red < 0 || wait < 0) return err_set("schedule: rank %d: %s missing: its weight gradients are never summed over the %d replicas", s,
                                          red < 0 ? "REDUCE" : "REDUCE_WAIT", sc->replicas);
  if (red > last || red < prev)
    return err_set("schedule: rank %d: REDUCE at action %d must come after the weight-gradient action %d and before the step's last one (%d)",
                   s, red, prev, last);
  if (wait < last || wait != n - 2 || sc->act[s][n - 1].kind != ACT_UPDATE)
    return err_set("schedule: rank %d: REDUCE_WAIT at action %d must come after the last weight-gradient action (%d) and right before the UPDATE",
                   s, wait, last);
  return 0;
}

static int check_rank(Chk *c, int s) {
  const Schedule *sc = c->sc;
  int V = sc->nchunks > 1 ? sc->nchunks : 1, S = sched_nvstages(sc);
  if (index_actions(c, s) || check_reduce(sc, s)) return -1;
  for (int ch = 0; ch < V; ch++)
    if (check_stage(c, s, ch)) return -1;
  for (int st = 0; st + 1 < S && V > 1; st++)
    if (sched_rank_of(sc, st) == s && sched_rank_of(sc, st + 1) == s && check_local(c, st)) return -1;
  return 0;
}

/* The xslots (and a peer's store slots): a micro-batch holds one from the
 * first action touching its leaving values until its OFFLOAD or its last
 * such action (with its values recomputed, none offloaded: its forward, or
 * the SEND of a value that leaves); none is taken while another holds it. */
static int check_xring(const Schedule *sc, int s) {
  int m = sched_mbs(sc), n = sc->nact[s];
  int nx = sc->nxslots ? sc->nxslots[s] : 0, ns = sc->nstore ? sc->nstore[s] : 0;
  int *last = malloc(sizeof(int) * (size_t)(2 * m + 1)), *owner = malloc(sizeof(int) * (size_t)(nx + ns + 2)), *slot = last + m;
  if (!last || !owner) abort();
  for (int i = 0; i < m; i++) last[i] = -1, slot[i] = -1;
  for (int i = 0; i < nx + ns + 2; i++) owner[i] = -1;
  for (int k = 0; k < n; k++) {
    const Action *a = &sc->act[s][k];
    if (a->mb >= 0 && a->xslot >= 0 && a->kind != ACT_HOLD && a->kind != ACT_RETURN) last[a->mb] = k;
  }
  int rc = 0;
  char b[32];
  for (int k = 0; k < n && !rc; k++) {
    const Action *a = &sc->act[s][k];
    if (a->mb < 0 || a->xslot < 0) continue;
    int store = a->kind == ACT_HOLD || a->kind == ACT_RETURN, size = store ? ns : nx, x = a->xslot, key = store ? nx + 1 + x : x;
    if (x >= size) {
      rc = err_set("schedule: rank %d: %s uses %s %d of %d", s, action_str(a, b, sizeof b), store ? "store slot" : "xslot", x, size);
      break;
    }
    if (store) {
      if (a->kind == ACT_HOLD && owner[key] >= 0)
        rc = err_set("schedule: rank %d: %s (action %d) takes store slot %d while micro-batch %d still holds it", s, action_str(a, b, sizeof b), k, x, owner[key]);
      if (a->kind == ACT_HOLD) owner[key] = a->mb;
      else if (owner[key] != a->mb) rc = err_set("schedule: rank %d: %s (action %d) returns store slot %d, held by micro-batch %d", s, action_str(a, b, sizeof b), k, x, owner[key]);
      else owner[key] = -1;
      continue;
    }
    if (slot[a->mb] < 0) {
      if (owner[x] >= 0)
        rc = err_set("schedule: rank %d: %s (action %d) takes xslot %d while micro-batch %d still holds it", s, action_str(a, b, sizeof b), k, x, owner[x]);
      owner[x] = a->mb, slot[a->mb] = x;
    } else if (slot[a->mb] != x) {
      rc = err_set("schedule: rank %d: %s (action %d) uses xslot %d, but micro-batch %d holds xslot %d", s, action_str(a, b, sizeof b), k, x, a->mb, slot[a->mb]);
    }
    if (a->kind == ACT_OFFLOAD || last[a->mb] == k) owner[x] = -1, slot[a->mb] = -1;
    /* A forward whose leaving values are all recomputed (a RECOMPUTE follows, no OFFLOAD) lets go of them at once,
     * or at its SEND when that sends from the xslot. */
    if (a->kind == ACT_F || a->kind == ACT_SEND) {
      int recomputed = 0, offloaded = 0, xsend = 0;
      for (int j = k + 1; j < n; j++) {
        const Action *c = &sc->act[s][j];
        if (c->mb != a->mb || c->kind == ACT_HOLD || c->kind == ACT_RETURN) continue;
        recomputed |= c->kind == ACT_RECOMPUTE, offloaded |= c->kind == ACT_OFFLOAD;
        xsend |= c->kind == ACT_SEND && c->xslot >= 0;
      }
      if (recomputed && !offloaded && !xsend) owner[x] = -1, slot[a->mb] = -1;
    }
  }
  free(last), free(owner);
  return rc;
}

/* Whether a compute action's function reaches ring r (0 forward, 1 gradient, 2 late values): the forward
 * ring's values for F, B and I (and W, unless the stage's split backward has the late layout: then what W
 * reads of the forward lives in the late ring, which F fills and I and W read); the gradient ring for
 * every backward. */
static int ring_needed(int kind, int late, int r) {
  if (r == 1) return kind == ACT_B || kind == ACT_I || kind == ACT_W;
  if (r == 2) return late && (kind == ACT_F || kind == ACT_I || kind == ACT_W);
  return kind == ACT_F || kind == ACT_B || kind == ACT_I || (!late && kind == ACT_W);
}

static int ring_of(const Action *a, int r) { return r == 0 ? a->slot : r == 1 ? a->gslot : a->wslot; }

/* One ring (rank s's, or with chunks its chunk ch's): every compute action has the copy its function
 * reaches, every action of mb uses the slot mb took, and a slot is taken only once its previous
 * holder's last action has run. */
static int check_ring(const Schedule *sc, int s, int ch, int grad) {
  int m = sched_mbs(sc), n = sc->nact[s], st = sched_stage(sc, s, ch);
  int size = grad == 2 ? (sc->nwslots ? sc->nwslots[st] : 0) : grad ? sc->ngslots[st] : sc->nslots[st];
  int *slot = malloc(sizeof(int) * (size_t)m), *last = malloc(sizeof(int) * (size_t)m), *owner = malloc(sizeof(int) * (size_t)(size + 1));
  if (!slot || !last || !owner) abort();
  for (int i = 0; i < m; i++) slot[i] = last[i] = -1;
  for (int i = 0; i < size; i++) owner[i] = -1;
  for (int k = 0; k < n; k++) {
    const Action *a = &sc->act[s][k];
    if (a->mb >= 0 && ring_of(a, grad) >= 0 && a->chunk == ch) last[a->mb] = k;
  }
  int rc = 0, split = 0;
  char b[32], w[64];
  const char *ring = grad == 2 ? "wslot" : grad ? "gslot" : "slot";
  who(sc, s, ch, w, sizeof w);
  for (int k = 0; k < n; k++) split |= sc->act[s][k].kind == ACT_I && sc->act[s][k].chunk == ch;
  int late = split && !(sc->hold && sc->hold[st]);
  for (int k = 0; k < n && !rc; k++) {
    const Action *a = &sc->act[s][k];
    int x = ring_of(a, grad);
    if (a->mb >= 0 && a->chunk == ch && x < 0 && ring_needed(a->kind, late, grad) && !(grad && sc->forward_only))
      rc = err_set("schedule: %s: %s (action %d) has no %s, but its function reaches that ring%s", w, action_str(a, b, sizeof b), k, ring,
                   grad == 2 ? " (under a split backward the forward writes there what W reads)" : "");
    if (a->mb < 0 || x < 0 || a->chunk != ch) continue;
    if (x >= size) {
      rc = err_set("schedule: %s: %s uses %s %d of a ring of %d", w, action_str(a, b, sizeof b), ring, x, size);
    } else if (slot[a->mb] < 0) {
      if (owner[x] >= 0)
        rc = err_set("schedule: %s: %s (action %d) takes %s %d while micro-batch %d still holds it", w, action_str(a, b, sizeof b), k,
                     ring, x, owner[x]);
      slot[a->mb] = x, owner[x] = a->mb;
    } else if (slot[a->mb] != x) {
      rc = err_set("schedule: %s: %s (action %d) uses %s %d, but micro-batch %d holds %s %d", w, action_str(a, b, sizeof b), k, ring,
                   x, a->mb, ring, slot[a->mb]);
    }
    if (!rc && last[a->mb] == k) owner[x] = -1;
  }
  free(slot), free(last), free(owner);
  return rc;
}

/* ---- the joint run ---- */

/* Stage s's peers: the stages its forward values come from (fwd) or go to
 * (direct sends: the schedule's lists, of ranks = stages; else the
 * neighbour stage). */
static int peers_of(const Schedule *sc, int s, int fwd, const int **list, int *one) {
  if (sc->src) {
    *list = fwd ? sc->src[s] : sc->dst[s];
    return fwd ? sc->nsrc[s] : sc->ndst[s];
  }
  *one = fwd ? s - 1 : s + 1;
  *list = one;
  return *one >= 0 && *one < sched_nvstages(sc);
}

/* Rank s may not refill ring slot x (of the action's chunk) until every send from it has a posted
 * receive; *peer_out: the stage whose receive is missing. */
static int sends_matched(const Chk *c, int s, int k, int grad, int *peer_out, int *mb_out) {
  const Schedule *sc = c->sc;
  const Action *a = &sc->act[s][k];
  int x = grad ? a->gslot : a->slot, kind = grad ? ACT_SEND_GRAD : ACT_SEND, rkind = grad ? ACT_RECV_GRAD : ACT_RECV;
  const int *peers;
  int one, np = peers_of(sc, sched_stage(sc, s, a->chunk), grad, &peers, &one); /* gradients go back to the stages values came from */
  for (int j = 0; j < k; j++) {
    const Action *b = &sc->act[s][j];
    if (b->kind != kind || b->chunk != a->chunk || (grad ? b->gslot : b->slot) != x || b->mb == a->mb) continue;
    for (int i = 0; i < np; i++)
      if (!c->done[peers[i]][rkind * sched_mbs(sc) + b->mb]) return *peer_out = peers[i], *mb_out = b->mb, 0;
  }
  return 1;
}

/* The first of stage s's peers (fwd: sources) that has not run (kind, mb), or -1. */
static int peer_missing(const Chk *c, int s, int fwd, int kind, int mb) {
  const int *peers;
  int one, np = peers_of(c->sc, s, fwd, &peers, &one);
  for (int i = 0; i < np; i++)
    if (!c->done[peers[i]][kind * sched_mbs(c->sc) + mb]) return peers[i];
  return -1;
}

/* Whether rank s can run its action k now; if not, says what it waits for. */
static int can_run(const Chk *c, int s, int k, char *why, size_t len) {
  const Schedule *sc = c->sc;
  const Action *a = &sc->act[s][k];
  int m = sched_mbs(sc), p = sc->nstages, S = sched_nvstages(sc), st = sched_stage(sc, s, a->chunk), peer, mb;
  char w[64];
  /* A barrier after every step (a checkpoint): no rank starts step t+1's
   * part before every rank has finished step t's. */
  if (c->nupd)
    for (int r = 0; r < p; r++)
      if (c->nupd[r] < c->nupd[s]) return snprintf(why, len, "rank %d to finish step %d (a barrier between steps)", r, c->nupd[s]), 0;
  /* The memory plan's messages: a peer's copy-out completes once the peer
   * has posted its HOLD, the copy back once it has posted its RETURN, and
   * RETURN waits for the copy-out to arrive; a store slot is refilled once
   * its data went back. */
  if (a->kind == ACT_RETURN && !c->done[a->peer][ACT_OFFLOAD * m + a->mb])
    return snprintf(why, len, "OFFLOAD%d on rank %d", a->mb, a->peer), 0;
  if (a->kind == ACT_HOLD)
    for (int j = k - 1; j >= 0; j--) {
      const Action *b = &sc->act[s][j];
      if (b->kind == ACT_RETURN && b->xslot == a->xslot) {
        if (!c->done[b->peer][ACT_PREFETCH * m + b->mb]) return snprintf(why, len, "PREFETCH%d on rank %d", b->mb, b->peer), 0;
        break;
      }
    }
  if (a->xslot >= 0 && a->kind != ACT_HOLD && a->kind != ACT_RETURN && a->kind != ACT_OFFLOAD)
    for (int j = k - 1; j >= 0; j--) {
      const Action *b = &sc->act[s][j];
      if (b->kind == ACT_OFFLOAD && b->xslot == a->xslot && b->mb != a->mb) {
        if (b->peer >= 0 && !c->done[b->peer][ACT_HOLD * m + b->mb]) return snprintf(why, len, "HOLD%d on rank %d (xslot %d)", b->mb, b->peer, a->xslot), 0;
        break;
      }
    }
  /* A value sent from an xslot: the send completes once every next stage has posted its RECV; the
   * micro-batch's OFFLOAD waits for that, and so does the xslot's next holder. */
  if (a->kind == ACT_OFFLOAD) {
    int j = at(c, st, ACT_SEND, a->mb);
    if (j >= 0 && sc->act[s][j].xslot >= 0 && (peer = peer_missing(c, st, 0, ACT_RECV, a->mb)) >= 0)
      return snprintf(why, len, "RECV%d on %s (its SEND leaves xslot %d)", a->mb, who_stage(sc, peer, w, sizeof w), a->xslot), 0;
  } else if (a->xslot >= 0 && a->kind != ACT_HOLD && a->kind != ACT_RETURN) {
    for (int j = k - 1; j >= 0; j--) {
      const Action *b = &sc->act[s][j];
      if (b->kind == ACT_SEND && b->xslot == a->xslot && b->mb != a->mb) {
        if ((peer = peer_missing(c, st, 0, ACT_RECV, b->mb)) >= 0)
          return snprintf(why, len, "RECV%d on %s (its SEND leaves xslot %d)", b->mb, who_stage(sc, peer, w, sizeof w), a->xslot), 0;
        break;
      }
    }
  }
  if (action_is_compute(a->kind) || a->kind == ACT_RECOMPUTE) {
    int f = at(c, st, ACT_PREFETCH, a->mb);
    if (f >= 0 && f < k && sc->act[s][f].peer >= 0 && !c->done[sc->act[s][f].peer][ACT_RETURN * m + a->mb])
      return snprintf(why, len, "RETURN%d on rank %d", a->mb, sc->act[s][f].peer), 0;
  }
  if (a->kind == ACT_F && (peer = peer_missing(c, st, 1, ACT_SEND, a->mb)) >= 0)
    return snprintf(why, len, "SEND%d on %s", a->mb, who_stage(sc, peer, w, sizeof w)), 0;
  if ((a->kind == ACT_B || a->kind == ACT_I) && (peer = peer_missing(c, st, 0, ACT_SEND_GRAD, a->mb)) >= 0)
    return snprintf(why, len, "SEND_GRAD%d on %s", a->mb, who_stage(sc, peer, w, sizeof w)), 0;
  if ((a->kind == ACT_RECV || a->kind == ACT_F) && st < S - 1 && !sends_matched(c, s, k, 0, &peer, &mb))
    return snprintf(why, len, "RECV%d on %s (its send leaves slot %d)", mb, who_stage(sc, peer, w, sizeof w), a->slot), 0;
  if ((a->kind == ACT_RECV_GRAD || a->kind == ACT_B || a->kind == ACT_I) && st > 0 && !sends_matched(c, s, k, 1, &peer, &mb))
    return snprintf(why, len, "RECV_GRAD%d on %s (its send leaves gslot %d)", mb, who_stage(sc, peer, w, sizeof w), a->gslot), 0;
  return 1;
}

static int run_jointly(Chk *c) {
  const Schedule *sc = c->sc;
  int p = sc->nstages, m = sched_mbs(sc), left = 0;
  int *next = calloc((size_t)p, sizeof(int));
  if (!next) abort();
  for (int s = 0; s < p; s++) left += sc->nact[s];
  char why[160];
  for (int progressed = 1; left > 0 && progressed;) {
    progressed = 0;
    for (int s = 0; s < p; s++)
      while (next[s] < sc->nact[s] && can_run(c, s, next[s], why, sizeof why)) {
        const Action *a = &sc->act[s][next[s]++];
        if (a->mb >= 0) c->done[sched_stage(sc, s, a->chunk)][a->kind * m + a->mb] = 1;
        if (a->kind == ACT_UPDATE && c->nupd) c->nupd[s]++;
        left--, progressed = 1;
      }
  }
  if (left > 0) {
    Buf msg = {0};
    buf_printf(&msg, "schedule: deadlock:");
    for (int s = 0; s < p; s++) {
      if (next[s] >= sc->nact[s]) continue;
      char b[32], w[64];
      const Action *a = &sc->act[s][next[s]];
      can_run(c, s, next[s], why, sizeof why);
      buf_printf(&msg, " %s waits at %s (action %d) for %s;", who(sc, s, a->chunk, w, sizeof w), action_str(a, b, sizeof b), next[s], why);
    }
    msg.s[msg.len - 1] = 0;
    err_set("%s", msg.s);
    buf_free(&msg);
  }
  free(next);
  return left > 0 ? -1 : 0;
}

/* ---- PipeFB ---- */

/* Position of (kind, mb) on rank s, -1 if absent, -2 if twice. */
static int fb_pos(const Schedule *sc, int s, int kind, int mb) {
  int at = -1;
  for (int k = 0; k < sc->nact[s]; k++)
    if (sc->act[s][k].kind == kind && sc->act[s][k].mb == mb) at = at == -1 ? k : -2;
  return at;
}

/* Action (kind, mb) is on rank s exactly once iff `want`, and then after `after` (a position, -1: anywhere). */
static int fb_need(const Schedule *sc, int s, int kind, int mb, int want, int after, const char *why) {
  int at = fb_pos(sc, s, kind, mb);
  char b[32];
  Action a = action_make(kind, mb);
  if (at == -2) return err_set("schedule: rank %d has %s twice", s, action_str(&a, b, sizeof b));
  if (want && at < 0) return err_set("schedule: rank %d has no %s (%s)", s, action_str(&a, b, sizeof b), why);
  if (!want && at >= 0) return err_set("schedule: rank %d has %s, which it must not (%s)", s, action_str(&a, b, sizeof b), why);
  if (want && after >= 0 && at < after) return err_set("schedule: rank %d runs %s too early (%s)", s, action_str(&a, b, sizeof b), why);
  return 0;
}

/* A slot refilled (RECV, RECV_STASH) only after its last holder is done with it. */
static int fb_slots(const Schedule *sc, int s, int fill, int use) {
  for (int k = 0; k < sc->nact[s]; k++) {
    const Action *a = &sc->act[s][k];
    if (a->kind != fill) continue;
    for (int j = k + 1; j < sc->nact[s]; j++) {
      const Action *u = &sc->act[s][j];
      if (u->kind == use && u->slot == a->slot && u->mb < a->mb) {
        char b1[32], b2[32];
        return err_set("schedule: rank %d refills slot %d with %s before %s is done with it", s, a->slot,
                       action_str(a, b1, sizeof b1), action_str(u, b2, sizeof b2));
      }
    }
  }
  return 0;
}

static int fb_validate(const Schedule *sc) {
  const FbLinks *fb = sc->fb;
  int n = sc->nstages, m = sched_mbs(sc);
  for (int s = 0; s < n; s++) {
    int fwd = s < fb->nf, prev = fb->prev[s], next = fb->next[s], last = -1;
    for (int k = 0; k < m; k++) {
      int c = fb_pos(sc, s, fwd ? ACT_F : ACT_B, k);
      if (fb_need(sc, s, fwd ? ACT_F : ACT_B, k, 1, last, "in ascending micro-batch order")) return -1;
      if (fb_need(sc, s, fwd ? ACT_B : ACT_F, k, 0, -1, fwd ? "a forward rank" : "a backward rank")) return -1;
      if (fwd && (fb_need(sc, s, ACT_RECV, k, prev >= 0, -1, "the first forward rank loads its inputs") ||
                  fb_need(sc, s, ACT_SEND, k, next >= 0, c, "the last forward rank sends nothing on") ||
                  fb_need(sc, s, ACT_SEND_STASH, k, 1, c, "after its forward")))
        return -1;
      if (fwd && prev >= 0 && fb_pos(sc, s, ACT_RECV, k) > c) return err_set("schedule: rank %d receives micro-batch %d after its forward", s, k);
      if (!fwd && (fb_need(sc, s, ACT_RECV_STASH, k, 1, -1, "its stash") ||
                   fb_need(sc, s, ACT_RECV_GRAD, k, next >= 0, -1, "the gradient of what it sent") ||
                   fb_need(sc, s, ACT_SEND_GRAD, k, prev >= 0, c, "after its backward")))
        return -1;
      if (!fwd && (fb_pos(sc, s, ACT_RECV_STASH, k) > c || (next >= 0 && fb_pos(sc, s, ACT_RECV_GRAD, k) > c)))
        return err_set("schedule: rank %d posts micro-batch %d's receives after its backward", s, k);
      last = c;
    }
    int upd = fb_pos(sc, s, ACT_UPDATE, -1);
    if (fb_need(sc, s, ACT_UPDATE, -1, !fwd, last, "once, after the backwards") ||
        fb_need(sc, s, ACT_SEND_WEIGHTS, -1, !fwd, upd, "after the update") ||
        fb_need(sc, s, ACT_RECV_WEIGHTS, -1, fwd, last, "after the forwards"))
      return -1;
    if (fb_slots(sc, s, fwd ? ACT_RECV : ACT_RECV_STASH, fwd ? ACT_F : ACT_B)) return -1;
    /* Every link is known from both ends. */
    for (int i = 0; fwd && i < fb->nstash_to[s]; i++) {
      int b = fb->stash_to[s][i], ok = 0;
      for (int j = 0; j < fb->nstash_from[b]; j++) ok |= fb->stash_from[b][j] == s;
      if (!ok) return err_set("schedule: rank %d sends stash to rank %d, which does not expect it", s, b);
    }
  }
  /* All ranks together: the timing simulation stalls where the lists deadlock. */
  Schedule copy = *sc;
  Action **acts = malloc(sizeof(Action *) * (size_t)n);
  if (!acts) abort();
  int rc = 0;
  for (int s = 0; s < n; s++) {
    acts[s] = malloc(sizeof(Action) * (size_t)(sc->nact[s] + 1));
    if (!acts[s]) abort();
    memcpy(acts[s], sc->act[s], sizeof(Action) * (size_t)sc->nact[s]);
  }
  copy.act = acts;
  copy.busy = malloc(sizeof(double) * (size_t)n);
  if (!copy.busy) abort();
  StageCost *unit = calloc((size_t)n, sizeof(StageCost));
  if (!unit) abort();
  for (int s = 0; s < n; s++) unit[s].fwd = 1, unit[s].bwd = 2, unit[s].update = 1;
  copy.cores = 0;
  if (schedule_time(&copy, unit)) {
    char why[512];
    snprintf(why, sizeof why, "%s", err_msg());
    rc = err_set("schedule: the pipefb lists deadlock (%s)", why);
  }
  for (int s = 0; s < n; s++) free(acts[s]);
  free(acts), free(copy.busy), free(unit);
  return rc;
}

/* Rank s's rings: forward, gradient and late values, per chunk. */
static int check_rings(const Schedule *sc, int s) {
  for (int ch = 0; ch < (sc->nchunks > 1 ? sc->nchunks : 1); ch++)
    for (int r = 0; r < 3; r++)
      if (check_ring(sc, s, ch, r)) return -1;
  return check_xring(sc, s);
}

int schedule_validate(const Schedule *sc) {
  if (sc->fb) return fb_validate(sc);
  if (sc->nstages < 1) return err_set("schedule: %s lists for no ranks", schedule_name(sc->kind)); /* e.g. a refused schedule_build */
  if (sc->nchunks > 1 && (sc->src || sc->unroll > 0))
    return err_set("schedule: %s lists with %d chunks: direct sends and async steps are not supported with chunks", schedule_name(sc->kind),
                   sc->nchunks);
  int p = sc->nstages, S = sched_nvstages(sc), m = sched_mbs(sc), rc = 0;
  Chk c = {sc, calloc((size_t)S, sizeof(int *)), calloc((size_t)S, sizeof(int *)), NULL};
  if (!c.pos || !c.done) abort();
  for (int s = 0; s < S; s++) {
    c.pos[s] = malloc(sizeof(int) * (size_t)(ACT_NKINDS * m));
    c.done[s] = calloc((size_t)(ACT_NKINDS * m), sizeof(int));
    if (!c.pos[s] || !c.done[s]) abort();
    for (int i = 0; i < ACT_NKINDS * m; i++) c.pos[s][i] = -1;
  }
  for (int s = 0; s < p && !rc; s++) rc = check_rank(&c, s) || check_rings(sc, s) ? -1 : 0;
  for (int s = 0; s < p && !rc; s++) rc = check_memory_actions(&c, s);
  if (!rc) rc = run_jointly(&c);
  if (!rc && sc->unroll > 0) rc = schedule_validate_async(sc);
  for (int s = 0; s < S; s++) free(c.pos[s]), free(c.done[s]);
  free(c.pos), free(c.done);
  return rc;
}

/* ---- async ---- */

/* Per rank: an UPDATE per step, each after its step's backwards and before
 * the next step's; every compute action of step j finds W_max(0, j-K)
 * among the versions kept (the newest, which counts the UPDATEs run, and
 * the K before it). */
static int async_versions(const Schedule *sc, int s) {
  int m = sc->m, K = sc->staleness, newest = 0;
  char b[32];
  for (int k = 0; k < sc->nact[s]; k++) {
    const Action *a = &sc->act[s][k];
    if (a->kind == ACT_UPDATE) {
      newest++;
      continue;
    }
    if (!action_is_compute(a->kind)) continue;
    int j = a->mb / m, v = j - K > 0 ? j - K : 0;
    if (a->kind != ACT_F && j != newest)
      return err_set("schedule: rank %d: %s (action %d) is step %d's backward but runs after %d update(s); a step's backwards "
                     "must run between its previous step's UPDATE and its own", s, action_str(a, b, sizeof b), k, j, newest);
    if (v > newest)
      return err_set("schedule: rank %d: %s (action %d) of step %d needs the weights of step %d, but only %d update(s) have run "
                     "(staleness %d)", s, action_str(a, b, sizeof b), k, j, v, newest, K);
    if (v < newest - K)
      return err_set("schedule: rank %d: %s (action %d) of step %d needs the weights of step %d, older than the %d kept besides "
                     "the newest (step %d)", s, action_str(a, b, sizeof b), k, j, v, K, newest);
  }
  if (newest != sc->unroll) return err_set("schedule: rank %d runs %d UPDATEs over %d steps", s, newest, sc->unroll);
  return 0;
}

int schedule_validate_async(const Schedule *sc) {
  int p = sc->nstages > 0 ? sc->nstages : 1, m = sched_mbs(sc) > 0 ? sched_mbs(sc) : 1, rc = 0;
  for (int s = 0; s < p && !rc; s++) rc = async_versions(sc, s);
  if (rc) return rc;
  /* Ranks stop between steps together (a checkpoint's collectives): the
   * lists must not deadlock with a barrier there either. */
  Chk c = {sc, calloc((size_t)p, sizeof(int *)), calloc((size_t)p, sizeof(int *)), calloc((size_t)p, sizeof(int))};
  if (!c.pos || !c.done || !c.nupd) abort();
  for (int s = 0; s < p; s++) {
    c.pos[s] = malloc(sizeof(int) * (size_t)(ACT_NKINDS * m));
    c.done[s] = calloc((size_t)(ACT_NKINDS * m), sizeof(int));
    if (!c.pos[s] || !c.done[s]) abort();
    for (int i = 0; i < ACT_NKINDS * m; i++) c.pos[s][i] = -1;
  }
  for (int s = 0; s < p && !rc; s++) rc = index_actions(&c, s);
  if (!rc && run_jointly(&c)) {
    char why[1024];
    snprintf(why, sizeof why, "%s", err_msg());
    rc = err_set("%s (with every rank stopping between two steps, as a checkpoint does)", why);
  }
  for (int s = 0; s < p; s++) free(c.pos[s]), free(c.done[s]);
  free(c.pos), free(c.done), free(c.nupd);
  return rc;
}
