/* stash.c - the memory plan: the fate of every stashed activation.
 *
 * Under --mem-limit, a stage whose arena does not fit keeps some of the
 * values its backward reads (kept: a ring copy per slot, as before) and lets
 * the others leave between a micro-batch's forward and its backward:
 *   offloaded  copied out after the forward (to a peer rank's memory, or to a
 *              file, as the runtime's io_uring requests) and prefetched back
 *              before the backward;
 *   recomputed dropped, and made again before the backward by re-running the
 *              forward calls that made them, from what stayed (the same
 *              kernels in the same order, so the same bits).
 * Leaving values live in a few xslot copies instead of one per ring slot.
 * A micro-batch whose forward is followed at once by its backward (the last
 * stage under 1F1B) keeps its xslot and moves nothing; any other leaves.
 *
 * Each over-limit stage tries a few plans (prefetch one compute action ahead
 * or just before the backward; values largest first, offloaded first,
 * recomputed first, or whichever is cheaper per value; or the value that
 * costs least per byte first), adds values until its arena fits,
 * inserts OFFLOAD / PREFETCH / RECOMPUTE actions (HOLD / RETURN on the peer
 * that holds its data, placed by the predicted times), and keeps the plan
 * with the shortest predicted step that the validator accepts. */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "stash.h"

#include "autodiff.h"
#include "memplan.h"
#include "optstore.h"
#include "planq.h"

/* ---- which values can leave ---- */

/* A value sent to the next stage (the loss's logits and their gradient are not: the loss reads them
 * in their ring slot). */
static int is_sent(const StageProg *sp, int id) {
  for (int i = 0; i < sp->nsend; i++)
    if (sp->send[i].buf == id) return 1;
  return 0;
}

static int is_loss(const StageProg *sp, int id) { return id == sp->loss_buf || id == sp->dloss_buf; }

static int is_received(const StageProg *sp, int id) {
  for (int i = 0; i < sp->nrecv; i++)
    if (sp->recv[i].buf == id) return 1;
  return 0;
}

/* Buffers written by forward calls (per buffer): 1 by an ordinary write, 2
 * when the writer is a training BatchNorm's running statistics (state). */
static char *fwd_writes(const StageProg *sp) {
  char *w = calloc((size_t)sp->nbufs + 1, 1);
  if (!w) abort();
  for (int i = 0; i < sp->nfwd; i++) {
    const Call *k = &sp->fwd[i];
    for (int q = 0; q < k->nwrites; q++) {
      int id = k->writes[q];
      w[id] = sp->bufs[id].kind == BUF_PARAM ? 2 : w[id] ? w[id] : 1;
    }
  }
  return w;
}

/* The forward calls that make the values marked in `want` again, from
 * values that stay (kept, offloaded and prefetched, weights, unchanging
 * constants): into call[] (1 = re-run).  0, or -1 if some value cannot be
 * made again (it is received, or depends on state the forward changes). */
static int closure(const StageProg *sp, const char *fates, const char *fw, char *call) {
  memset(call, 0, (size_t)sp->nfwd + 1);
  char *need = calloc((size_t)sp->nbufs + 1, 1);
  if (!need) abort();
  for (int b = 0; b < sp->nbufs; b++) need[b] = fates[b] == FATE_RECOMPUTE;
  int rc = 0;
  for (int i = sp->nfwd - 1; i >= 0 && !rc; i--) {
    /* A recomputation runs the call's recompute variant where its op rule made one (a training
     * BatchNorm's leaves the running statistics alone): its accesses are what must hold. */
    const Call *k = sp->fwd[i].recompute ? sp->fwd[i].recompute : &sp->fwd[i];
    int hit = 0;
    for (int q = 0; q < k->nwrites; q++) hit |= need[k->writes[q]];
    if (!hit) continue;
    call[i] = 1;
    for (int q = 0; q < k->nwrites; q++) {
      const Buffer *b = &sp->bufs[k->writes[q]];
      if (b->kind == BUF_PARAM) rc = -1; /* state the forward already moved would move twice */
      if (b->kind == BUF_GRING || b->kind == BUF_LABELS || b->kind == BUF_PGRAD || b->kind == BUF_OPT) rc = -1;
    }
    for (int q = 0; q < k->nreads; q++) {
      int id = k->reads[q];
      const Buffer *b = &sp->bufs[id];
      if (b->kind == BUF_PARAM) {
        if (fw[id] == 2) rc = -1; /* reads state that changes per micro-batch */
      } else if (b->kind == BUF_TEMP) {
        need[id] = 1;
      } else if (b->kind == BUF_RING) {
        if (fates[id] == FATE_RECOMPUTE) need[id] = 1;
        /* a cut's value in flight is gone by then: made again if it was made here */
        if (fates[id] == FATE_TRANSIT) {
          if (is_received(sp, id)) rc = -1;
          else need[id] = 1;
        }
        /* kept or offloaded: there at RECOMPUTE time */
      } else {
        rc = -1;
      }
    }
  }
  for (int b = 0; b < sp->nbufs && !rc; b++)
    if (fates[b] == FATE_RECOMPUTE && is_received(sp, b)) rc = -1;
  free(need);
  return rc;
}

typedef struct Cand {
  int buf;
  int64_t bytes;
  int recv;        /* received from the previous stage */
  int transit;     /* crosses a cut (received or sent) and the backward does not read it: in flight only */
} Cand;

static int by_bytes(const void *a, const void *b) {
  const Cand *x = a, *y = b;
  return x->bytes < y->bytes ? 1 : x->bytes > y->bytes ? -1 : x->buf - y->buf;
}

/* The stage's values that could leave: rings of the forward's values (made
 * here or received, sent on or not) that the backward reads, and the values
 * crossing a cut that it does not read (they wait in a ring copy per slot only
 * because the ring's slot is held until the backward: in flight, they need an
 * xslot from their RECV or forward until that forward is done and their SEND
 * has completed).  The loss's logits stay: the loss reads them in their slot. */
static int candidates(const StageProg *sp, const char *fw, Cand *out) {
  char *bread = calloc((size_t)sp->nbufs + 1, 1);
  if (!bread) abort();
  for (int i = 0; i < sp->nbwd; i++)
    for (int q = 0; q < sp->bwd[i].nreads; q++) bread[sp->bwd[i].reads[q]] = 1;
  int n = 0;
  for (int b = 0; b < sp->nbufs; b++) {
    const Buffer *x = &sp->bufs[b];
    if (x->kind != BUF_RING || x->is_grad || is_loss(sp, b)) continue;
    int recv = is_received(sp, b), cut = recv || is_sent(sp, b);
    if (!fw[b] && !recv) continue;
    if (!bread[b] && !cut) continue;
    out[n++] = (Cand){b, x->bytes, recv, !bread[b]};
  }
  free(bread);
  qsort(out, (size_t)n, sizeof *out, by_bytes);
  return n;
}

/* ---- the actions ---- */

/* What a stage's plan needs of its action list. */
typedef struct Shape {
  int has_out, has_rc, xrecv; /* offloaded values, recomputed values, a received value leaves */
  int lead;                   /* 1: RECV and PREFETCH one compute action early; 0: just before */
  int peer;                   /* where OFFLOAD goes: a rank, or -1 the file */
  int xsend;                  /* a sent value leaves: SEND sends it from the xslot */
  int has_tr;                 /* values in flight (FATE_TRANSIT) */
} Shape;

static int is_compute(int kind) { return action_is_compute(kind); }

/* The actions that use mb's xslot: its RECV (a received value leaves), its forward, its SEND (a sent
 * value leaves), its backward's (values come back or are made again for it), the transfers. */
static int touches_x(const Shape *sh, int kind) {
  if (kind == ACT_RECV) return sh->xrecv;
  if (kind == ACT_SEND) return sh->xsend;
  if (kind == ACT_F) return 1;
  if (is_compute(kind)) return sh->has_out || sh->has_rc;
  return kind == ACT_OFFLOAD || kind == ACT_PREFETCH || kind == ACT_RECOMPUTE;
}

/* The shape of fates f. */
static Shape shape_of(const StageProg *sp, const char *f, int lead, int peer) {
  Shape sh = {0, 0, 0, lead, peer, 0, 0};
  for (int x = 0; x < sp->nbufs; x++) {
    sh.has_out |= f[x] == FATE_OFFLOAD;
    sh.has_rc |= f[x] == FATE_RECOMPUTE;
    sh.has_tr |= f[x] == FATE_TRANSIT;
    sh.xrecv |= (f[x] == FATE_OFFLOAD || f[x] == FATE_TRANSIT) && is_received(sp, x);
    sh.xsend |= f[x] != FATE_KEEP && is_sent(sp, x);
  }
  return sh;
}

/* Rank s's list with the memory plan's actions, from its plain list `in`;
 * xslots assigned.  Returns the length; *nx the xslot copies. */
static int rebuild(const Action *in, int n, int m, const Shape *sh, Action *out, int *nx) {
  int *cpos = malloc(sizeof(int) * (size_t)(n + 1)), nc = 0;
  char *leaves = calloc((size_t)m + 1, 1), *had_recv = calloc((size_t)m + 1, 1);
  if (!cpos || !leaves || !had_recv) abort();
  for (int k = 0; k < n; k++)
    if (in[k].kind == ACT_RECV) had_recv[in[k].mb] = 1; /* stage 0's loader inputs have none: F loads them */
  for (int k = 0; k < n; k++)
    if (is_compute(in[k].kind)) cpos[nc++] = k;
  /* A micro-batch leaves unless its forward's next compute action is its own backward. */
  for (int c = 0; c < nc; c++) {
    const Action *a = &in[cpos[c]];
    if (a->kind != ACT_F) continue;
    int stays = c + 1 < nc && (in[cpos[c + 1]].kind == ACT_B || in[cpos[c + 1]].kind == ACT_I) && in[cpos[c + 1]].mb == a->mb;
    leaves[a->mb] = !stays && (sh->has_out || sh->has_rc);
  }
  int k2 = 0;
  for (int c = 0, k = 0; k < n; k++) {
    const Action *a = &in[k];
    if (a->kind == ACT_RECV && sh->xrecv) continue; /* placed below */
    if (is_compute(a->kind)) {
      /* What the compute action `lead` ahead needs, posted now. */
      int t = c + sh->lead;
      if (t < nc) {
        const Action *b = &in[cpos[t]];
        if (b->kind == ACT_F && sh->xrecv && had_recv[b->mb]) out[k2++] = action_make(ACT_RECV, b->mb);
        if ((b->kind == ACT_B || b->kind == ACT_I) && leaves[b->mb] && sh->has_out) {
          out[k2] = action_make(ACT_PREFETCH, b->mb);
          out[k2++].peer = sh->peer;
        }
      }
      if ((a->kind == ACT_B || a->kind == ACT_I) && leaves[a->mb] && sh->has_rc) out[k2++] = action_make(ACT_RECOMPUTE, a->mb);
      c++;
    }
    out[k2++] = *a;
    /* Copy-out right after the forward (and its SEND). */
    int after_f = a->kind == ACT_F && !(k + 1 < n && in[k + 1].kind == ACT_SEND && in[k + 1].mb == a->mb);
    int after_send = a->kind == ACT_SEND;
    if ((after_f || after_send) && leaves[a->mb] && sh->has_out) {
      out[k2] = action_make(ACT_OFFLOAD, a->mb);
      out[k2++].peer = sh->peer;
    }
  }
  /* xslots: a holding starts at the first action touching mb's leaving values
   * and ends at its OFFLOAD, or at the last one (the backward; the SEND or
   * the forward when only values in flight leave). */
  int *last = malloc(sizeof(int) * (size_t)(m + 1)), *slot = malloc(sizeof(int) * (size_t)(m + 1)), *owner = calloc((size_t)m + 2, sizeof(int));
  if (!last || !slot || !owner) abort();
  for (int i = 0; i < m; i++) last[i] = -1, slot[i] = -1;
  *nx = 0;
  if (sh->has_out || sh->has_rc || sh->has_tr) {
    for (int k = 0; k < k2; k++) {
      int kind = out[k].kind, mb = out[k].mb;
      if (mb >= 0 && touches_x(sh, kind)) last[mb] = k;
    }
    for (int x = 0; x <= m; x++) owner[x] = -1;
    for (int k = 0; k < k2; k++) {
      Action *a = &out[k];
      int kind = a->kind, mb = a->mb;
      if (mb < 0 || !touches_x(sh, kind)) continue;
      if (slot[mb] < 0) {
        int x = 0;
        while (owner[x] >= 0) x++;
        owner[x] = mb, slot[mb] = x;
        if (x + 1 > *nx) *nx = x + 1;
      }
      a->xslot = slot[mb];
      if (kind == ACT_OFFLOAD || last[mb] == k) owner[slot[mb]] = -1, slot[mb] = -1;
      /* After an R-only leave, the holding ends with the forward, or with the SEND of a sent value
       * that leaves (the xslot's next holder waits for that send to complete). */
      if (kind == (sh->xsend ? ACT_SEND : ACT_F) && leaves[mb] && !sh->has_out && slot[mb] >= 0) owner[a->xslot] = -1, slot[mb] = -1;
    }
  }
  free(cpos), free(leaves), free(had_recv), free(last), free(slot), free(owner);
  return k2;
}

/* ---- the planner ---- */

typedef struct Work {
  Plan *p;
  Schedule sc;        /* the lists being planned */
  StageCost *cost;
  Action **base;      /* the plain lists */
  int *nbase;
  int *host_of;       /* per rank: the rank holding its offloaded values, -1 */
  int *hosts;         /* per rank: the rank whose values it holds, -1 */
  char **fates;       /* per rank: per buffer */
  Shape *shape;
  double file_bw, file_lat;
  const char *file_note;
  double opt_bw, opt_lat;  /* --offload-optimizer file:DIR: the store's speed */
  double *upd0, *bwd0, *bwdw0; /* per rank: its update's, backward's and W half's predicted seconds with all in its arena */
} Work;

/* What of rank s's weights' side lives in the store (mode OPTSTORE_*), and its update's and backward's times with it. */
static void set_opt_out(Work *w, int s, int mode) {
  StageProg *sp = &w->p->progs[s];
  StageCost *c = &w->cost[s];
  optstore_set(sp, mode);
  c->opt_stream = optstore_time(sp, w->upd0[s], w->opt_bw, w->opt_lat);
  c->update = w->upd0[s] + c->opt_stream;
  c->grad_stream = optstore_bwd_time(sp, w->bwdw0[s], w->opt_bw, w->opt_lat);
  c->time += w->bwd0[s] + c->grad_stream - c->bwd;
  c->bwd = w->bwd0[s] + c->grad_stream, c->bwd_w = w->bwdw0[s] + c->grad_stream;
}


/* Lays out rank s with fates f and the current xslots/store. */
static int64_t layout(Work *w, int s, const char *f) {
  StageProg *sp = &w->p->progs[s];
  for (int b = 0; b < sp->nbufs; b++) sp->bufs[b].fate = f ? f[b] : FATE_KEEP;
  /* zb1: in the layout the stage has (plan_programs, other_layout), with its list's rings as they stand */
  memplan_keep(w->p, sp, (RingSizes){w->sc.nslots[s], w->sc.nslots[s], w->sc.ngslots[s], w->sc.nwslots[s]});
  return sp->arena_bytes;
}

static double node_fwd_time(const Plan *p, int s, int node) {
  for (int k = 0; k < p->N; k++)
    if (p->node[k] == node) return part_node_fwd(&p->prob, s, k);
  return 0;
}

/* Seconds to re-run the marked calls (each node once). */
static double rc_time(const Plan *p, const StageProg *sp, int s, const char *call) {
  double t = 0;
  int prev = -2;
  for (int i = 0; i < sp->nfwd; i++)
    if (call[i] && sp->fwd[i].node != prev) {
      int dup = 0;
      for (int j = 0; j < i && !dup; j++) dup = call[j] && sp->fwd[j].node == sp->fwd[i].node;
      if (!dup && sp->fwd[i].node >= 0) t += node_fwd_time(p, s, sp->fwd[i].node);
      prev = sp->fwd[i].node;
    }
  return t;
}

static Link link_between(const Plan *p, int a, int b) {
  Link l = p->machine.link[a < b ? a : b];
  for (int i = (a < b ? a : b); i < (a < b ? b : a); i++)
    if (p->machine.link[i].bandwidth < l.bandwidth) l = p->machine.link[i];
  return l;
}

static int place_peer(Work *w, int s, int q);

/* Sets rank s's list from its shape and its transfer and recompute times. */
static void apply(Work *w, int s, const Shape *sh, const char *f, const char *fw) {
  Plan *p = w->p;
  StageProg *sp = &p->progs[s];
  int nx;
  int n = rebuild(w->base[s], w->nbase[s], w->sc.m, sh, w->sc.act[s], &nx);
  w->sc.nact[s] = n;
  /* K ring slots by the new list (a later RECV shrinks them). */
  schedule_assign_slots(&w->sc, s);
  /* schedule_assign_slots clears xslots? it keeps them: it only sets slot/gslot. */
  w->sc.nxslots[s] = nx;
  sp->nxslots = nx;
  w->shape[s] = *sh;
  layout(w, s, f);
  StageCost *c = &w->cost[s];
  double bw = w->file_bw, lat = w->file_lat;
  if (sh->peer >= 0) {
    Link l = link_between(p, s, sh->peer);
    bw = l.bandwidth, lat = l.latency;
  }
  c->xfer_out = c->xfer_in = sh->has_out ? (double)sp->xout / bw + lat : 0;
  c->recompute = 0;
  if (w->hosts[s] >= 0) place_peer(w, w->hosts[s], s);
  if (sh->has_rc) {
    char *call = malloc((size_t)sp->nfwd + 1);
    if (!call) abort();
    closure(sp, f, fw, call);
    c->recompute = rc_time(p, sp, s, call);
    free(call);
  }
}

/* Places HOLD/RETURN for owner s's offloads on host q by the predicted
 * times of a run in which s's copies go to a file at the link's speed; store
 * slots assigned.  Returns the store slots. */
static int place_peer(Work *w, int s, int q) {
  Schedule *sc = &w->sc;
  int m = sc->m, n = sc->nact[s];
  for (int k = 0; k < n; k++)
    if (sc->act[s][k].kind == ACT_OFFLOAD || sc->act[s][k].kind == ACT_PREFETCH) sc->act[s][k].peer = -1;
  schedule_time(sc, w->cost);
  err_clear();
  double *t_f = malloc(sizeof(double) * (size_t)m), *t_pre = malloc(sizeof(double) * (size_t)m);
  char *off = calloc((size_t)m, 1);
  if (!t_f || !t_pre || !off) abort();
  for (int k = 0; k < n; k++) {
    Action *a = &sc->act[s][k];
    if (a->kind == ACT_F) t_f[a->mb] = a->start;
    if (a->kind == ACT_PREFETCH) t_pre[a->mb] = a->start;
    if (a->kind == ACT_OFFLOAD) off[a->mb] = 1;
    if (a->kind == ACT_OFFLOAD || a->kind == ACT_PREFETCH) a->peer = q;
  }
  /* Insert on q: HOLD(mb) before q's first action starting at or after s's
   * F(mb); RETURN(mb) before its first action starting after s posts the
   * PREFETCH, minus nothing (q waits there for the data if it is late). */
  int nq = sc->nact[q], k2 = 0;
  Action *out = malloc(sizeof(Action) * (size_t)(nq + 2 * m + 1)), *old = sc->act[q];
  if (!out) abort();
  int nexth = 0, nextr = 0;
  for (int k = 0; k <= nq; k++) {
    double t = k < nq ? old[k].start : INFINITY;
    int last = k == nq || old[k].kind == ACT_UPDATE;
    for (; nexth < m || nextr < m;) {
      while (nexth < m && !off[nexth]) nexth++;
      while (nextr < m && !off[nextr]) nextr++;
      int h = nexth < m && (t_f[nexth] <= t || last), r = nextr < m && nextr < nexth && (t_pre[nextr] <= t || last);
      if (r && (!h || t_pre[nextr] <= t_f[nexth])) {
        out[k2] = action_make(ACT_RETURN, nextr++);
        out[k2++].peer = s;
      } else if (h) {
        out[k2] = action_make(ACT_HOLD, nexth++);
        out[k2++].peer = s;
      } else {
        break;
      }
    }
    if (k < nq) out[k2++] = old[k];
  }
  /* UPDATE must stay last: move anything after it before it. */
  for (int k = 0; k < k2 - 1; k++)
    if (out[k].kind == ACT_UPDATE) {
      Action u = out[k];
      memmove(&out[k], &out[k + 1], sizeof(Action) * (size_t)(k2 - 1 - k));
      out[k2 - 1] = u;
      break;
    }
  memcpy(old, out, sizeof(Action) * (size_t)k2);
  sc->nact[q] = k2;
  /* Store slots: taken at HOLD, free after RETURN (the runtime waits for the send before reuse). */
  int *owner = malloc(sizeof(int) * (size_t)(m + 1)), *slot = malloc(sizeof(int) * (size_t)(m + 1)), ns = 0;
  if (!owner || !slot) abort();
  for (int i = 0; i <= m; i++) owner[i] = -1, slot[i] = -1;
  for (int k = 0; k < k2; k++) {
    Action *a = &old[k];
    if (a->kind == ACT_HOLD) {
      int x = 0;
      while (owner[x] >= 0) x++;
      owner[x] = a->mb, slot[a->mb] = x, a->xslot = x;
      if (x + 1 > ns) ns = x + 1;
    } else if (a->kind == ACT_RETURN) {
      a->xslot = slot[a->mb];
      owner[a->xslot] = -1;
    }
  }
  sc->nstore[q] = ns;
  free(owner), free(slot), free(out), free(t_f), free(t_pre), free(off);
  return ns;
}

/* The greedy fill: values given a fate by the strategy, until rank s fits
 * `lim`.  The first three take the values largest first: offload first,
 * recompute first, or whichever is cheaper for that value (recomputing its
 * calls against copying its bytes).  ST_CHEAPEST takes next the value whose
 * own added cost per byte is least, given what is already recomputed: a
 * GELU's output or a softmax's, made again from an input that stays anyway,
 * leaves before a GEMM's output that needs the GEMM run again (selective
 * recomputation, as Megatron-LM does by hand).  0 and f filled, or -1 if it
 * never fits. */
enum { ST_OFFLOAD, ST_RECOMPUTE, ST_CHEAPER, ST_CHEAPEST, ST_N };

/* Whether value b can be recomputed on top of the fates f (its fate is left
 * as it was), and into *extra the recompute time it adds to rc_now. */
static int rc_extra(const Plan *p, const StageProg *sp, int s, char *f, const char *fw, char *call, int b, double rc_now,
                    double *extra) {
  char was = f[b];
  f[b] = FATE_RECOMPUTE;
  int ok = closure(sp, f, fw, call) == 0;
  *extra = ok ? rc_time(p, sp, s, call) - rc_now : 0;
  f[b] = was;
  return ok;
}

static int fill(Work *w, int s, int strat, int lead, int peer, int rxkeep, double lim, const Cand *cand, int nc, const char *fw,
                char *f) {
  Plan *p = w->p;
  StageProg *sp = &p->progs[s];
  int allow_out = p->opt.offload != OFFLOAD_NONE, allow_rc = p->opt.recompute;
  char *call = malloc((size_t)sp->nfwd + 1), *used = calloc((size_t)nc + 1, 1);
  if (!call || !used) abort();
  memset(f, FATE_KEEP, (size_t)sp->nbufs);
  double bw = w->file_bw;
  if (peer >= 0) bw = link_between(p, s, peer).bandwidth;
  int ok = -1;
  double rc_now = 0;
  /* The cut's values that the backward does not read go first: in flight they cost no copy and no
   * recomputation, only the ring copies they no longer take.  rxkeep: a received one is kept instead,
   * for recomputation to start from (a value in flight is gone by the backward). */
  int ntr = 0;
  for (int c = 0; c < nc; c++)
    if (cand[c].transit) {
      used[c] = 1;
      if ((allow_out || allow_rc) && !(rxkeep && cand[c].recv)) f[cand[c].buf] = FATE_TRANSIT, ntr++;
    }
  if (ntr) {
    Shape sh = shape_of(sp, f, lead, peer);
    apply(w, s, &sh, f, fw);
    if ((double)sp->arena_bytes <= lim) ok = 0;
  }
  for (int step = 0; step < nc && ok; step++) {
    int i = step, can_rc = 0;
    double extra = 0;
    if (strat != ST_CHEAPEST && used[i]) continue;
    if (strat == ST_CHEAPEST) {
      /* The unused value whose cheaper way out costs least per byte (its recomputation kept). */
      double best = INFINITY;
      i = -1;
      for (int c = 0; c < nc; c++) {
        if (used[c]) continue;
        double x = 0, t = allow_out ? (double)cand[c].bytes / bw : INFINITY;
        int rc = allow_rc && !cand[c].recv && rc_extra(p, sp, s, f, fw, call, cand[c].buf, rc_now, &x);
        if (rc) t = fmin(t, x);
        if (t / (double)cand[c].bytes < best) best = t / (double)cand[c].bytes, i = c, can_rc = rc, extra = x;
      }
      if (i < 0) break; /* nothing left can leave */
    } else if (allow_rc && !cand[i].recv) {
      can_rc = rc_extra(p, sp, s, f, fw, call, cand[i].buf, rc_now, &extra);
    }
    used[i] = 1;
    int b = cand[i].buf, fate = -1;
    if (strat == ST_OFFLOAD) fate = allow_out ? FATE_OFFLOAD : can_rc ? FATE_RECOMPUTE : -1;
    else if (strat == ST_RECOMPUTE) fate = can_rc ? FATE_RECOMPUTE : allow_out ? FATE_OFFLOAD : -1;
    else fate = can_rc && (!allow_out || extra <= (double)cand[i].bytes / bw) ? FATE_RECOMPUTE : allow_out ? FATE_OFFLOAD : -1;
    if (fate < 0) continue;
    f[b] = (char)fate;
    if (fate == FATE_RECOMPUTE) rc_now += extra;
    Shape sh = shape_of(sp, f, lead, peer);
    apply(w, s, &sh, f, fw);
    if ((double)sp->arena_bytes <= lim) {
      ok = 0;
      break;
    }
  }
  free(call), free(used);
  return ok;
}

/* Saves / restores the planner's lists of every rank (a tried plan that
 * loses is undone). */
typedef struct Saved {
  Action **act;
  int *nact, *nslots, *ngslots, *nwslots, *nxslots, *nstore, *hold;
  StageCost *cost;
  Shape *shape;
} Saved;

static void save(Work *w, Saved *v, int maxact) {
  int p = w->sc.nstages;
  v->act = malloc(sizeof(Action *) * (size_t)p);
  v->nact = malloc(sizeof(int) * (size_t)p * 7);
  v->cost = malloc(sizeof(StageCost) * (size_t)p);
  v->shape = malloc(sizeof(Shape) * (size_t)p);
  if (!v->act || !v->nact || !v->cost || !v->shape) abort();
  v->nslots = v->nact + p, v->ngslots = v->nact + 2 * p, v->nxslots = v->nact + 3 * p, v->nstore = v->nact + 4 * p;
  v->nwslots = v->nact + 5 * p, v->hold = v->nact + 6 * p;
  for (int s = 0; s < p; s++) {
    v->act[s] = malloc(sizeof(Action) * (size_t)maxact);
    if (!v->act[s]) abort();
    memcpy(v->act[s], w->sc.act[s], sizeof(Action) * (size_t)w->sc.nact[s]);
    v->nact[s] = w->sc.nact[s], v->nslots[s] = w->sc.nslots[s], v->ngslots[s] = w->sc.ngslots[s], v->nwslots[s] = w->sc.nwslots[s];
    v->nxslots[s] = w->sc.nxslots[s], v->nstore[s] = w->sc.nstore[s], v->hold[s] = w->sc.hold ? w->sc.hold[s] : 0;
  }
  memcpy(v->cost, w->cost, sizeof(StageCost) * (size_t)p);
  memcpy(v->shape, w->shape, sizeof(Shape) * (size_t)p);
}

static void restore(Work *w, const Saved *v) {
  int p = w->sc.nstages;
  for (int s = 0; s < p; s++) {
    memcpy(w->sc.act[s], v->act[s], sizeof(Action) * (size_t)v->nact[s]);
    w->sc.nact[s] = v->nact[s], w->sc.nslots[s] = v->nslots[s], w->sc.ngslots[s] = v->ngslots[s], w->sc.nwslots[s] = v->nwslots[s];
    w->sc.nxslots[s] = v->nxslots[s], w->sc.nstore[s] = v->nstore[s];
    if (w->sc.hold) w->sc.hold[s] = v->hold[s];
    w->p->progs[s].nxslots = v->nxslots[s];
  }
  memcpy(w->cost, v->cost, sizeof(StageCost) * (size_t)p);
  memcpy(w->shape, v->shape, sizeof(Shape) * (size_t)p);
}

static void saved_free(Saved *v, int p) {
  for (int s = 0; s < p; s++) free(v->act[s]);
  free(v->act), free(v->nact), free(v->cost), free(v->shape);
}

/* Lays out host q with a store for owner s's offloads. */
static int64_t host_layout(Work *w, int q, int64_t stride) {
  StageProg *sp = &w->p->progs[q];
  sp->nstore = w->sc.nstore[q];
  sp->store_stride = stride;
  sp->nxslots = w->sc.nxslots[q];
  return layout(w, q, w->fates[q]);
}

/* Hosts to try for owner s: the mirror rank p-1-s first (under 1F1B it
 * stashes least when s stashes most, as BPipe pairs them), then by free memory. */
static int hosts_for(Work *w, int s, int *out) {
  int p = w->sc.nstages, n = 0;
  double *spare = malloc(sizeof(double) * (size_t)p);
  if (!spare) abort();
  for (int q = 0; q < p; q++) {
    double lim = plan_stage_limit(w->p, q);
    spare[q] = (lim > 0 ? lim : 1e300) - (double)w->p->progs[q].arena_bytes;
  }
  int mirror = p - 1 - s;
  if (mirror != s && w->hosts[mirror] < 0) out[n++] = mirror;
  for (int pass = 0; pass < p; pass++) {
    int best = -1;
    for (int q = 0; q < p; q++) {
      int seen = q == s || w->hosts[q] >= 0;
      for (int i = 0; i < n; i++) seen |= out[i] == q;
      if (!seen && (best < 0 || spare[q] > spare[best])) best = q;
    }
    if (best < 0) break;
    out[n++] = best;
  }
  free(spare);
  return n;
}

/* Where rank s's values may go, each tried in turn: the file (-1), peers with room, recompute alone (-2). */
static int targets_for(Work *w, int s, int *targets) {
  const Plan *p = w->p;
  int hostlist[MAX_RANKS], nt = 0;
  if (p->opt.offload == OFFLOAD_FILE) targets[nt++] = -1;
  if (p->opt.offload == OFFLOAD_PEER || p->opt.offload == OFFLOAD_AUTO) {
    int nh = hosts_for(w, s, hostlist);
    for (int i = 0; i < nh; i++) targets[nt++] = hostlist[i];
  }
  if (p->opt.offload == OFFLOAD_NONE || p->opt.offload == OFFLOAD_AUTO) targets[nt++] = -2; /* recompute only */
  return nt;
}

/* Rank s fits no plan under lim: the error names the least arena any reached (floor). */
static int refuse_stage(Plan *p, int s, double lim, int64_t floor) {
  const StageProg *sp = &p->progs[s];
  int64_t side = optstore_state_bytes(sp) + optstore_grad_bytes(sp);
  return err_set("stage %d does not fit --mem-limit %s: its arena is %s, and offloading or recomputing every stashed "
                 "activation it may (--offload %s, --recompute %s%s) leaves %s; raise --mem-limit to at least %lldK, or use more "
                 "stages or smaller micro-batches%s", s, fmt_bytes(lim), fmt_bytes((double)p->arena[s]),
                 offload_name(p->opt.offload), p->opt.recompute ? "auto" : "none",
                 optstore_modes(p, sp) ? ", --offload-optimizer file" : "", fmt_bytes((double)floor),
                 (long long)((floor + 1023) / 1024),
                 optstore_modes(p, sp) || !side ? ""
                 : pool_printf(&p->g.pool, " (its optimizer state and gradients, %s, could leave with --offload-optimizer file:DIR)",
                               fmt_bytes((double)side)));
}

/* Plans rank s to fit `lim`; 0, or -1 with err_set naming the smallest limit it could fit. */
static int plan_stage(Work *w, int s, double lim, int maxact) {
  Plan *p = w->p;
  StageProg *sp = &p->progs[s];
  char *fw = fwd_writes(sp);
  Cand *cand = malloc(sizeof(Cand) * (size_t)(sp->nbufs + 1));
  char *f = malloc((size_t)sp->nbufs + 1), *bestf = malloc((size_t)sp->nbufs + 1);
  if (!cand || !f || !bestf) abort();
  int nc = candidates(sp, fw, cand);
  int targets[MAX_RANKS + 1], nt = targets_for(w, s, targets);
  Saved start, best;
  save(w, &start, maxact);
  double best_t = INFINITY;
  int have = 0, fit_no_host = 0, best_oo = 0;
  int64_t host_need = 0;
  int64_t floor = sp->arena_bytes;
  /* With its optimizer state in the store (oo 1) when --offload-optimizer allows, and without. */
  for (int oo = 0; oo <= optstore_modes(p, sp); oo++) {
  restore(w, &start);
  set_opt_out(w, s, oo);
  if (oo) { /* the state alone leaves: the lists stay as they are */
    layout(w, s, NULL);
    if ((int64_t)sp->arena_bytes < floor) floor = sp->arena_bytes;
    if ((double)sp->arena_bytes <= lim && !schedule_time(&w->sc, w->cost) && !schedule_validate(&w->sc) && w->sc.step_time < best_t) {
      if (have) saved_free(&best, p->opt.nstages);
      save(w, &best, maxact);
      memset(bestf, FATE_KEEP, (size_t)sp->nbufs);
      best_t = w->sc.step_time, have = 1, best_oo = oo;
    }
    err_clear();
  }
  for (int ti = 0; ti < nt; ti++) {
    int tgt = targets[ti];
    int peer = tgt >= 0 ? tgt : -1;
    int saved_off = p->opt.offload;
    if (tgt == -2) p->opt.offload = OFFLOAD_NONE;
    int rxkeeps = 0; /* with recomputation, also try keeping the received values the backward does not read (fill) */
    for (int c = 0; c < nc; c++) rxkeeps |= cand[c].transit && cand[c].recv && p->opt.recompute;
    for (int rxkeep = 0; rxkeep <= rxkeeps; rxkeep++)
    for (int lead = 1; lead >= 0; lead--)
      for (int strat = 0; strat < ST_N; strat++) {
        restore(w, &start);
        set_opt_out(w, s, oo);
        int fits = fill(w, s, strat, lead, peer, rxkeep, lim, cand, nc, fw, f) == 0;
        if ((int64_t)sp->arena_bytes < floor) floor = sp->arena_bytes;
        if (!fits) continue;
        const char *dbg = getenv("PIPECC_DEBUG_STASH");
        if (peer >= 0) {
          int ns = place_peer(w, s, peer);
          double hl = plan_stage_limit(p, peer);
          int64_t ha = host_layout(w, peer, sp->xout);
          if (hl > 0 && (double)ha > hl) {
            fit_no_host = 1, host_need = sp->xout;
            if (dbg) fprintf(stderr, "stash: stage %d lead %d strat %d peer %d: host arena %lld > %.0f (%d store slots)\n", s, lead, strat, peer, (long long)ha, hl, ns);
            continue;
          }
        }
        if (schedule_time(&w->sc, w->cost)) {
          if (dbg) fprintf(stderr, "stash: stage %d lead %d strat %d target %d: %s\n", s, lead, strat, tgt, err_msg());
          if (dbg)
            for (int q = 0; q < p->opt.nstages; q++) {
              fprintf(stderr, "  rank %d:", q);
              for (int k = 0; k < w->sc.nact[q]; k++) {
                char b[32];
                fprintf(stderr, " %s/x%d", action_str(&w->sc.act[q][k], b, sizeof b), w->sc.act[q][k].xslot);
              }
              fprintf(stderr, "\n");
            }
          err_clear();
          continue;
        }
        if (schedule_validate(&w->sc)) {
          if (dbg) fprintf(stderr, "stash: stage %d lead %d strat %d target %d: %s\n", s, lead, strat, tgt, err_msg());
          err_clear();
          continue;
        }
        if (dbg) fprintf(stderr, "stash: stage %d lead %d strat %d target %d: arena %lld, step %.6f\n", s, lead, strat, tgt, (long long)sp->arena_bytes, w->sc.step_time);
        if (w->sc.step_time < best_t) {
          if (have) saved_free(&best, p->opt.nstages);
          save(w, &best, maxact);
          memcpy(bestf, f, (size_t)sp->nbufs);
          best_t = w->sc.step_time, have = 1, best_oo = oo;
        }
      }
    p->opt.offload = saved_off;
  }
  }
  int rc = 0;
  if (have) {
    restore(w, &best);
    set_opt_out(w, s, best_oo);
    memcpy(w->fates[s], bestf, (size_t)sp->nbufs);
    int q = w->shape[s].peer, moves = 0;
    for (int k = 0; k < w->sc.nact[s]; k++) moves += w->sc.act[s][k].kind == ACT_OFFLOAD;
    if (q >= 0 && w->shape[s].has_out && moves) w->host_of[s] = q, w->hosts[q] = s;
    saved_free(&best, p->opt.nstages);
  } else if (fit_no_host) {
    restore(w, &start);
    rc = err_set("stage %d fits --mem-limit %s only if another rank holds its offloaded activations (%s per micro-batch), and "
                 "no rank has that room under the limit; use --offload file:DIR or --recompute auto, raise --mem-limit, or use "
                 "more stages", s, fmt_bytes(lim), fmt_bytes((double)host_need));
  } else {
    restore(w, &start);
    set_opt_out(w, s, 0);
    rc = refuse_stage(p, s, lim, floor);
  }
  /* Every rank's layout as planned: owners first (a host's store slot is
   * its owner's copy-out, known once the owner is laid out), then again. */
  for (int pass = 0; pass < 2; pass++)
  for (int q = 0; q < p->opt.nstages; q++) {
    StageProg *x = &p->progs[q];
    x->nxslots = w->sc.nxslots[q];
    x->nstore = w->sc.nstore[q];
    x->store_stride = w->hosts[q] >= 0 ? p->progs[w->hosts[q]].xout : 0;
    layout(w, q, w->fates[q]);
  }
  saved_free(&start, p->opt.nstages);
  free(fw), free(cand), free(f), free(bestf);
  return rc;
}

const char *offload_name(int o) {
  return o == OFFLOAD_NONE ? "none" : o == OFFLOAD_PEER ? "peer" : o == OFFLOAD_FILE ? "file" : "auto";
}

/* Write and read bandwidth of DIR: a 16 MiB block written and read back,
 * three times; the best round counts, since the runtime rewrites the same
 * blocks every step (the first write of a block also allocates it). */
static void probe_dir(const char *dir, double *bw, double *lat) {
  *bw = 1e9, *lat = 50e-6;
  char path[4096];
  snprintf(path, sizeof path, "%s/.pipecc-probe-%ld", dir, (long)getpid());
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return;
  unlink(path);
  size_t n = 16u << 20;
  char *buf = calloc(n, 1);
  if (!buf) abort();
  double best = INFINITY;
  for (int round = 0; round < 3; round++) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    ssize_t wr = pwrite(fd, buf, n, 0);
    ssize_t rd = wr == (ssize_t)n ? pread(fd, buf, n, 0) : -1;
    clock_gettime(CLOCK_MONOTONIC, &b);
    double t = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
    if (rd == (ssize_t)n && t > 0 && t < best) best = t;
  }
  if (best < INFINITY) *bw = 2.0 * (double)n / best; /* bytes moved (out and back) per second */
  free(buf);
  close(fd);
}

/* --chunks V: nothing leaves yet (args.c refuses --offload and --recompute); each rank's joined arena
 * against the limit, the smallest that fits named when one is over. */
static int chunks_fit(const Plan *p) {
  for (int r = 0; r < opt_ranks(&p->opt); r++) {
    double lim = plan_rank_limit(p, r);
    if (lim > 0 && (double)p->rarena[r] > lim)
      return err_set("rank %d runs %d stages (--chunks %d) in %lld bytes (%s), over its memory limit of %s; stages of several "
                     "chunks per rank do not offload or recompute yet: the smallest --mem-limit for this plan is %s (or use fewer "
                     "--chunks, or --schedule 1f1b)", r, p->opt.chunks, p->opt.chunks, (long long)p->rarena[r],
                     fmt_bytes((double)p->rarena[r]), fmt_bytes(lim), fmt_bytes((double)p->rarena[r] + (p->opt.mem_limit - lim)));
  }
  return 0;
}

/* zb1: stage s in the other layout (memplan.c): its base lists placed for it (and the table's), the
 * planner's list from them. */
static void other_layout(Work *w, int s) {
  Plan *p = w->p;
  int h = !p->progs[s].hold;
  schedule_hold(&p->sched, s, h), schedule_hold(&p->slots, s, h); /* the base lists are p->sched's */
  schedule_time(&p->slots, p->unit);
  err_clear();
  p->progs[s].hold = h;
  memcpy(w->sc.act[s], w->base[s], sizeof(Action) * (size_t)w->nbase[s]);
  w->sc.nact[s] = w->nbase[s];
  schedule_assign_slots(&w->sc, s);
  layout(w, s, w->fates[s]);
}

int stash_plan(Plan *p) {
  int n = p->opt.nstages;
  Schedule *sc = &p->sched;
  sc->nxslots = pool_alloc(&p->g.pool, sizeof(int) * (size_t)n);
  sc->nstore = pool_alloc(&p->g.pool, sizeof(int) * (size_t)n);
  if (p->rprogs) return chunks_fit(p); /* no memory plan: nothing to compare a plain plan with */
  p->plain_arena = pool_alloc(&p->g.pool, sizeof(int64_t) * (size_t)n);
  p->plain_step = sc->step_time;
  for (int s = 0; s < n; s++) p->plain_arena[s] = p->arena[s];
  int over = 0;
  for (int s = 0; s < n; s++) {
    double lim = plan_stage_limit(p, s);
    over |= lim > 0 && (double)p->arena[s] > lim;
  }
  if (over && p->fb) { /* pipefb keeps every stash where it is for now */
    for (int s = 0; s < n; s++) {
      double lim = plan_stage_limit(p, s);
      if (lim > 0 && (double)p->arena[s] > lim)
        return err_set("--schedule pipefb: rank %d (%s rank) needs %lld bytes (%s), over its memory limit of %s; pipefb does not "
                       "offload or recompute to fit a limit yet (1f1b, gpipe and zb1 do)", s, p->role[s] == ROLE_FWD ? "forward" : "backward",
                       (long long)p->arena[s], fmt_bytes((double)p->arena[s]), fmt_bytes(lim));
    }
  }
  if (!over || !p->progs || p->opt.forward_only) return 0;
  if (p->opt.offload == OFFLOAD_NONE && !p->opt.recompute && p->opt.opt_offload == OPTOFF_NONE) return 0; /* the partitioner's error stands */
  Work w;
  memset(&w, 0, sizeof w);
  w.p = p, w.sc = *sc, w.cost = p->part.cost;
  int maxact = 0;
  for (int s = 0; s < n; s++) maxact = sc->nact[s] > maxact ? sc->nact[s] : maxact;
  maxact += 6 * sc->m + 8;
  w.base = pool_alloc(&p->g.pool, sizeof(Action *) * (size_t)n);
  w.nbase = pool_alloc(&p->g.pool, sizeof(int) * (size_t)n);
  w.host_of = pool_alloc(&p->g.pool, sizeof(int) * (size_t)n);
  w.hosts = pool_alloc(&p->g.pool, sizeof(int) * (size_t)n);
  w.fates = pool_alloc(&p->g.pool, sizeof(char *) * (size_t)n);
  w.shape = pool_alloc(&p->g.pool, sizeof(Shape) * (size_t)n);
  w.sc.act = pool_alloc(&p->g.pool, sizeof(Action *) * (size_t)n);
  w.sc.nact = pool_alloc(&p->g.pool, sizeof(int) * (size_t)n);
  for (int s = 0; s < n; s++) {
    w.base[s] = sc->act[s], w.nbase[s] = sc->nact[s];
    w.sc.act[s] = pool_alloc(&p->g.pool, sizeof(Action) * (size_t)maxact);
    memcpy(w.sc.act[s], sc->act[s], sizeof(Action) * (size_t)sc->nact[s]);
    w.sc.nact[s] = sc->nact[s];
    w.host_of[s] = w.hosts[s] = -1;
    w.fates[s] = pool_alloc(&p->g.pool, (size_t)p->progs[s].nbufs + 1);
    w.shape[s] = (Shape){0, 0, 0, 0, -1, 0, 0};
  }
  if (p->opt.offload == OFFLOAD_FILE) probe_dir(p->opt.offload_dir, &w.file_bw, &w.file_lat);
  else w.file_bw = 1e9, w.file_lat = 50e-6;
  w.opt_bw = 1e9, w.opt_lat = 50e-6;
  if (p->opt.opt_offload == OPTOFF_FILE) probe_dir(p->opt.opt_offload_dir, &w.opt_bw, &w.opt_lat);
  w.upd0 = pool_alloc(&p->g.pool, sizeof(double) * (size_t)n * 3);
  w.bwd0 = w.upd0 + n, w.bwdw0 = w.upd0 + 2 * n;
  for (int s = 0; s < n; s++) w.upd0[s] = w.cost[s].update, w.bwd0[s] = w.cost[s].bwd, w.bwdw0[s] = w.cost[s].bwd_w;
  /* The fullest stages first: they need the most room on a peer. */
  int *order = pool_alloc(&p->g.pool, sizeof(int) * (size_t)n);
  for (int s = 0; s < n; s++) order[s] = s;
  for (int a = 0; a < n; a++)
    for (int b = a + 1; b < n; b++)
      if (p->arena[order[b]] > p->arena[order[a]]) {
        int t = order[a];
        order[a] = order[b], order[b] = t;
      }
  for (int i = 0; i < n; i++) {
    int s = order[i];
    double lim = plan_stage_limit(p, s);
    if (lim <= 0 || (double)p->progs[s].arena_bytes <= lim) continue;
    if (!plan_stage(&w, s, lim, maxact)) continue;
    if (!sched_splits(p->opt.schedule) || p->opt.split_layout != SPLIT_AUTO) return -1;
    /* zb1: the stage kept the layout whose plain arena is smaller (plan_programs); with values leaving the
     * other may be the one that fits: its lists, and the search again. */
    err_clear();
    other_layout(&w, s);
    if (plan_stage(&w, s, lim, maxact)) return -1;
  }
  for (int s = 0; s < n; s++) {
    double lim = plan_stage_limit(p, s);
    if (lim > 0 && (double)p->progs[s].arena_bytes > lim)
      return err_set("stage %d holds stage %d's offloaded activations and no longer fits --mem-limit %s (%s); raise the "
                     "limit, or use --offload file:DIR or --recompute auto", s, w.hosts[s], fmt_bytes(lim),
                     fmt_bytes((double)p->progs[s].arena_bytes));
  }
  if (schedule_time(&w.sc, w.cost) || schedule_validate(&w.sc)) return -1;
  for (int q = 0; q < n; q++)
    if (w.hosts[q] >= 0 && p->progs[q].store_stride != p->progs[w.hosts[q]].xout)
      return err_set("internal error: stage %d's store slots (%lld bytes) do not match stage %d's offloads (%lld bytes)", q,
                     (long long)p->progs[q].store_stride, w.hosts[q], (long long)p->progs[w.hosts[q]].xout);
  /* The plan takes the planner's lists. */
  for (int s = 0; s < n; s++) {
    sc->act[s] = w.sc.act[s], sc->nact[s] = w.sc.nact[s];
    sc->nslots[s] = w.sc.nslots[s], sc->ngslots[s] = w.sc.ngslots[s], sc->nwslots[s] = w.sc.nwslots[s];
    sc->nxslots[s] = w.sc.nxslots[s], sc->nstore[s] = w.sc.nstore[s];
    StageProg *sp = &p->progs[s];
    sp->nslots = sc->nslots[s], sp->ngslots = sc->ngslots[s], sp->nwslots = sc->nwslots[s];
    p->host_of = w.host_of;
    /* The recomputation's calls. */
    if (w.shape[s].has_rc) {
      char *fw = fwd_writes(sp);
      sp->recompute = pool_alloc(&p->g.pool, (size_t)sp->nfwd + 1);
      closure(sp, w.fates[s], fw, sp->recompute);
      free(fw);
    }
    if (sp->opt_out) { /* the update streams the state: its calls name the store's offsets and the staging buffers */
      int nb = sp->nbufs;
      optstore_finish(sp, &p->g.pool);
      char *f = pool_alloc(&p->g.pool, (size_t)sp->nbufs + 1); /* the staging buffers it added are kept, as every non-ring */
      memset(f, FATE_KEEP, (size_t)sp->nbufs + 1);
      memcpy(f, w.fates[s], (size_t)nb);
      w.fates[s] = f;
      layout(&w, s, w.fates[s]);
    }
    plan_stage_memory(p, s);
  }
  sc->step_time = w.sc.step_time, sc->bubble = w.sc.bubble;
  memcpy(sc->busy, w.sc.busy, sizeof(double) * (size_t)n);
  p->file_bw = w.file_bw;
  return 0;
}

/* stash_floor_what's request: where stash_floor describes the least arena it finds (NULL: it does not). */
static char *floor_what;
static size_t floor_what_len;

/* What a stage's least arena holds, by region, and what would take it lower: a flag that moves more, or else
 * the largest region that stays. */
static void describe_floor(const Plan *p, const StageProg *sp) {
  struct { const char *name; int64_t bytes; const char *how; } r[] = {
      {"weights", sp->mem_weights, " (no plan moves weights: use more stages)"},
      {"gradients", sp->mem_grads, ""},
      {"optimizer state", sp->mem_opt, ""},
      {"kept activations", sp->mem_stash + sp->mem_leaving,
       p->opt.offload == OFFLOAD_FILE ? " (what one micro-batch's backward reads: use more stages or smaller micro-batches)"
                                      : " (--offload file:DIR moves every one)"},
      {"values at the cuts", sp->mem_cross, ""},
      {"temporaries", sp->mem_temps, " (they live within one action: use more stages or smaller micro-batches)"}};
  int most = 0, n = (int)(sizeof r / sizeof r[0]);
  for (int i = 1; i < n; i++)
    if (r[i].bytes > r[most].bytes) most = i;
  int k = snprintf(floor_what, floor_what_len, "; with every move its flags allow, the fullest stage holds");
  for (int i = 0; i < n && k < (int)floor_what_len; i++)
    if (r[i].bytes) k += snprintf(floor_what + k, floor_what_len - (size_t)k, "%s %s %s", i ? "," : "", r[i].name, fmt_bytes((double)r[i].bytes));
  if (k >= (int)floor_what_len) return;
  if (p->opt.opt_offload == OPTOFF_NONE && optstore_state_bytes(sp) + optstore_grad_bytes(sp) > 0)
    snprintf(floor_what + k, floor_what_len - (size_t)k, "; --offload-optimizer file:DIR would move its gradients%s",
             optstore_state_bytes(sp) ? " and optimizer state" : "");
  else
    snprintf(floor_what + k, floor_what_len - (size_t)k, ": to go lower its %s would have to move%s", r[most].name, r[most].how);
}

const char *stash_floor_what(Plan *p, int s, int a, int e) {
  static char buf[600];
  buf[0] = 0;
  floor_what = buf, floor_what_len = sizeof buf;
  stash_floor(p, s, a, e);
  floor_what = NULL;
  return buf;
}

double stash_floor(Plan *p, int s, int a, int e) {
  Pool tmp = {0};
  StageProg sp;
  double v = INFINITY;
  if (!stage_build(p, &sp, s, a, e, 0, &tmp)) {
    char *fw = fwd_writes(&sp);
    Cand *cand = malloc(sizeof(Cand) * (size_t)(sp.nbufs + 1));
    char *f = calloc((size_t)sp.nbufs + 1, 1), *call = malloc((size_t)sp.nfwd + 1);
    if (!cand || !f || !call) abort();
    int nc = candidates(&sp, fw, cand);
    /* With a place that always has room (a file), or only a peer, every value
     * may be offloaded; under auto only what recomputation alone reaches is
     * sure to be reachable (a peer may have no room), so the floor - and the
     * smallest limit an error names - is what recomputation gives.  The cut's
     * values the backward does not read are in flight; a received one may
     * rather be kept where recomputation starts from it (rxkeep, as fill). */
    int offload_all = p->opt.offload == OFFLOAD_FILE || p->opt.offload == OFFLOAD_PEER || (p->opt.offload == OFFLOAD_AUTO && !p->opt.recompute);
    int any = offload_all || p->opt.recompute;
    for (int rxkeep = 0; rxkeep <= (!offload_all && p->opt.recompute); rxkeep++) {
      int xrecv = 0;
      memset(f, FATE_KEEP, (size_t)sp.nbufs);
      for (int i = 0; i < nc && any; i++) {
        int b = cand[i].buf;
        if (cand[i].transit) {
          if (!(rxkeep && cand[i].recv)) f[b] = FATE_TRANSIT, xrecv |= cand[i].recv;
        } else if (offload_all) {
          f[b] = FATE_OFFLOAD, xrecv |= cand[i].recv;
        } else if (p->opt.recompute && !cand[i].recv) {
          f[b] = FATE_RECOMPUTE;
          if (closure(&sp, f, fw, call)) f[b] = FATE_KEEP;
        }
      }
      for (int b = 0; b < sp.nbufs; b++) sp.bufs[b].fate = f[b];
      sp.nxslots = xrecv ? p->floor_nx[2 * s + 1] : p->floor_nx[2 * s];
      /* --offload-optimizer: the state and gradients may leave too, whichever leaves least (moving the gradients
       * keeps two copies of the largest, more than all of them where one weight is most) */
      for (int mode = 0; mode <= optstore_modes(p, &sp); mode++) {
        optstore_set(&sp, mode);
        memplan(p, &sp, p->floor_rings[2 * s + (xrecv ? 1 : 0)]);
        if ((double)sp.arena_bytes < v && floor_what) describe_floor(p, &sp);
        if ((double)sp.arena_bytes < v) v = (double)sp.arena_bytes;
      }
    }
    free(fw), free(cand), free(f), free(call);
  } else {
    err_clear();
  }
  pool_free(&tmp);
  return v;
}

void stash_floor_slots(Plan *p) {
  int n = p->opt.nstages;
  p->floor_rings = pool_alloc(&p->g.pool, sizeof(RingSizes) * (size_t)(2 * n));
  p->floor_nx = pool_alloc(&p->g.pool, sizeof(int) * (size_t)(2 * n));
  Schedule t = p->slots;
  t.act = pool_alloc(&p->g.pool, sizeof(Action *) * (size_t)n);
  t.nact = pool_alloc(&p->g.pool, sizeof(int) * (size_t)n);
  t.nslots = pool_alloc(&p->g.pool, sizeof(int) * (size_t)n);
  t.ngslots = pool_alloc(&p->g.pool, sizeof(int) * (size_t)n);
  t.nwslots = pool_alloc(&p->g.pool, sizeof(int) * (size_t)n);
  t.rings = pool_alloc(&p->g.pool, sizeof(RingSizes) * (size_t)n);
  t.hold = pool_alloc(&p->g.pool, sizeof(int) * (size_t)n);
  Action *base = pool_alloc(&p->g.pool, sizeof(Action) * (size_t)(p->slots.nact[0] + 1));
  for (int s = 0; s < n; s++) {
    t.act[s] = pool_alloc(&p->g.pool, sizeof(Action) * (size_t)(p->slots.nact[s] + 6 * p->slots.m + 8));
    base = pool_realloc(&p->g.pool, base, sizeof(Action) * (size_t)(p->slots.nact[s] + 1));
    for (int xr = 0; xr < 2; xr++) {
      Shape sh = {1, 0, xr, 0, -1, 1, 1};
      int nx;
      RingSizes *z = &p->floor_rings[2 * s + xr];
      /* zb1: each layout's rings with its own receives' places (schedule_placed); one layout only otherwise */
      for (int h = 0; h < (sched_splits(t.kind) ? 2 : 1); h++) {
        if (sched_splits(t.kind)) schedule_placed(&p->slots, s, h, base);
        else memcpy(base, p->slots.act[s], sizeof(Action) * (size_t)p->slots.nact[s]);
        t.hold[s] = h;
        t.nact[s] = rebuild(base, p->slots.nact[s], p->slots.m, &sh, t.act[s], &nx);
        schedule_assign_slots(&t, s);
        if (h) z->hslots = t.nslots[s];
        else *z = sched_rings(&t, s);
      }
      p->floor_nx[2 * s + xr] = nx;
    }
  }
}

int stash_offloads(const Plan *p, int s) {
  int n = 0;
  for (int k = 0; k < p->sched.nact[s]; k++) n += p->sched.act[s][k].kind == ACT_OFFLOAD;
  return n;
}
