/* msg.c - the messages between stages: forward values and gradients per
 * micro-batch (tagged by step, micro-batch and value), PipeFB's stash and
 * weights, waits under the --timeout watchdog, and the exposed part of each
 * wait (the send times that follow the messages).  Message buffers are
 * device memory (device.h); a send is posted after the device work that
 * filled it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "run.h"

/* A message's tag names its step (mod 64), micro-batch, value and direction. */
static int tag_of(int64_t step, int mb, int v, int grad) { return ((int)(step % 64) * 256 * 64 + (mb % 256) * 64 + v % 64) * 2 + grad; }

unsigned char *ring(const Run *r, int64_t off, int64_t bytes, int slot) { return dev_at(r, off + (int64_t)slot * bytes); }

/* Completes requests, or stops the job when they take longer than --timeout:
 * a peer that stopped (kill -STOP, a hung node, a lost link) would otherwise
 * leave every rank waiting forever.  MPI_Testall in a loop is what
 * MPI_Waitall does inside; sched_yield lets an oversubscribed peer run.
 * peer < 0: a collective (any stage may be the one missing). */
void wait_watched(const Run *r, MPI_Request *req, int n, int peer, const char *what) {
  double t0 = now();
  for (;;) {
    int done = 0;
    MPI_Testall(n, req, &done, MPI_STATUSES_IGNORE);
    if (done) return;
    if (now() - t0 > r->timeout) break;
    sched_yield();
  }
  if (peer >= 0)
    die(4, "step %lld: no progress for %.1f s waiting for stage %d (%s); stage %d stopped or hung, stopping the job (run.sh --timeout S)",
        (long long)r->step + 1, r->timeout, peer, what, peer);
  die(4, "no progress for %.1f s waiting for the other stages (%s); one of them stopped or hung, stopping the job (run.sh --timeout S)",
      r->timeout, what);
}

void wait_all(Run *r, MPI_Request *req, int n, int peer, const char *what) {
  int any = 0;
  for (int i = 0; i < n; i++) any |= req[i] != MPI_REQUEST_NULL;
  if (!any) return;
  double t0 = now();
  wait_watched(r, req, n, peer, what);
  double t1 = now();
  r->t_wait += t1 - t0;
  trace_add(&r->trace, -1, r->cur->mb, r->cur->slot, r->step, t0, t1);
}

/* Sends still leaving the action's slot / gslot must finish before anything refills it. */
void wait_sends(Run *r, const PrAction *a) {
  const PrChunk *c = &r->chunk[a->chunk];
  int e = eslot(r, a), peer = c->send_hi > c->send_lo ? r->st->send[c->send_lo].peer : -1;
  wait_all(r, r->sreq + (size_t)e * r->st->nsend, r->st->nsend, peer, "to take the forward values it was sent");
  wait_all(r, r->ssreq + (size_t)e * r->st->nstash_send, r->st->nstash_send, -1, "to take the stashed values it was sent");
}

void wait_grad_sends(Run *r, const PrAction *a) {
  const PrChunk *c = &r->chunk[a->chunk];
  int peer = c->recv_hi > c->recv_lo ? r->st->recv[c->recv_lo].peer : -1;
  wait_all(r, r->gsreq + (size_t)egslot(r, a) * r->st->nrecv, r->st->nrecv, peer, "to take the gradients it was sent");
}

/* A value between two chunks of this rank: copied at its send into the slot its receive was posted
 * into (the compiler's lists post the receive first; the validator checks it). */
static int is_local(const PrValue *pv) { return pv->peer == g_rank && pv->source == PR_FROM_PREV; }

/* The row of the other table that a local value lands in (the same tag): found once, at msg_open. */
static int local_row(const PrValue *to, int nto, const PrValue *pv) {
  for (int i = 0; i < nto; i++)
    if (is_local(&to[i]) && to[i].tag == pv->tag) return i;
  die(2, "internal error: local value '%s' has no row to land in (regenerate with pipecc)", pv->name);
}

/* Per SEND row (and RECV row) of a local value, the RECV (SEND) row it lands in; -1 for the others. */
static void local_rows_open(Run *r) {
  const PrStage *st = r->st;
  r->lto_send = malloc(sizeof(int) * (size_t)(st->nsend + st->nrecv + 1));
  if (!r->lto_send) die(2, "out of memory for the message bookkeeping%s", "");
  r->lto_recv = r->lto_send + st->nsend;
  for (int v = 0; v < st->nsend; v++) r->lto_send[v] = is_local(&st->send[v]) ? local_row(st->recv, st->nrecv, &st->send[v]) : -1;
  for (int v = 0; v < st->nrecv; v++) r->lto_recv[v] = is_local(&st->recv[v]) ? local_row(st->send, st->nsend, &st->recv[v]) : -1;
}

static void local_copy(Run *r, int *posted, int mb, unsigned char *dst_base, int64_t bytes, const unsigned char *src, const char *name) {
  int m = r->st->microbatches, slot = posted[mb % m];
  if (slot < 0) die(2, "internal error: micro-batch %d's local copy of '%s' comes before its receive (regenerate with pipecc)", mb, name);
  pr_dev_copy(dst_base + (int64_t)slot * bytes, src, bytes);
  posted[mb % m] = -1;
}

/* The time tag of a chunk's message: the sending stage's (a rank of one stage: 0, as ever). */
static int time_tag(const Run *r, int sender_stage) { return r->nchunks > 1 ? sender_stage % 64 : 0; }

/* Where value pv of the action's micro-batch lives: its ring slot, or its
 * xslot's block when it is one of the values that leave. */
static unsigned char *value_at(const Run *r, const PrValue *pv, const PrAction *a) {
  if (pv->xring) return dev_at(r, pv->offset + (int64_t)a->xslot * r->st->xslot_bytes);
  return ring(r, pv->offset, pv->bytes, a->slot);
}

/* The distinct peers of a table's values (forward: those coming from a
 * rank; with grads, only those whose gradient travels back). */
static int peers_of(const PrValue *v, int n, int grads, int *out) {
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (v[i].peer < 0 || v[i].source != PR_FROM_PREV || (grads && v[i].goffset < 0) || is_local(&v[i])) continue;
    int seen = 0;
    for (int j = 0; j < k; j++) seen |= out[j] == v[i].peer;
    if (!seen) out[k++] = v[i].peer;
  }
  return k;
}

/* After an action's sends: the time they were posted goes to each peer. */
static void send_times(Run *r, double *when, MPI_Request *req, const int *peers, int np, int tag) {
  for (int k = 0; k < np; k++) {
    wait_watched(r, &req[k], 1, peers[k], "to take a message's send time");
    when[k] = now();
    MPI_Isend(&when[k], 1, MPI_DOUBLE, peers[k], tag, r->tcomm, &req[k]);
  }
}

static void recv_times(Run *r, double *got, MPI_Request *req, const int *peers, int np, int tag) {
  for (int k = 0; k < np; k++) MPI_Irecv(&got[k], 1, MPI_DOUBLE, peers[k], tag, r->tcomm, &req[k]);
}

/* Waits for an action's messages, then for their send times: the part of
 * the wait after the last sender had posted (in this rank's clock) is exposed. */
void wait_message(Run *r, MPI_Request *req, int n, MPI_Request *treq, const double *sent, const int *peers, int np,
                         const char *what) {
  int any = 0;
  for (int i = 0; i < n; i++) any |= req[i] != MPI_REQUEST_NULL;
  double t0 = now();
  if (any) wait_all(r, req, n, np ? peers[0] : -1, what);
  double t1 = now(), last = -INFINITY;
  for (int k = 0; k < np; k++) {
    if (treq[k] == MPI_REQUEST_NULL) continue;
    wait_watched(r, &treq[k], 1, peers[k], what);
    last = fmax(last, sent[k] - r->clock[peers[k]]);
  }
  if (!any || last == -INFINITY) return; /* already arrived (a poll between nodes completed it): nothing exposed */
  double e = fmax(0, t1 - fmax(t0, last));
  r->t_exposed += e;
  trace_exposed(&r->trace, e);
}

/* --progress poll: between nodes (pr_poll in the generated code) the
 * outstanding receives and sends are tested, so that MPI moves large
 * messages while the rank computes instead of at the wait. */
static Run *g_poll_run;

void pr_poll(void) {
  Run *r = g_poll_run;
  if (!r) return;
  int flag;
  const PrStage *st = r->st;
  int ns = st->nslots * r->nchunks, ngs = st->ngslots * r->nchunks;
  MPI_Testall(ns * st->nrecv, r->rreq, &flag, MPI_STATUSES_IGNORE);
  MPI_Testall(ngs * st->nsend, r->greq, &flag, MPI_STATUSES_IGNORE);
  MPI_Testall(ns * st->nsend, r->sreq, &flag, MPI_STATUSES_IGNORE);
  MPI_Testall(ngs * st->nrecv, r->gsreq, &flag, MPI_STATUSES_IGNORE);
  if (r->xsreq) MPI_Testall(st->nxslots * st->nsend, r->xsreq, &flag, MPI_STATUSES_IGNORE);
}

void do_recv(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  const PrChunk *c = &r->chunk[a->chunk];
  ChunkMsg *cm = &r->cm[a->chunk];
  int e = eslot(r, a), m = st->microbatches;
  wait_sends(r, a);
  if (a->xslot >= 0) wait_xslot_free(r, a->xslot);
  for (int v = c->recv_lo; v < c->recv_hi; v++) {
    const PrValue *pv = &st->recv[v];
    if (pv->source != PR_FROM_PREV) continue;
    if (is_local(pv)) { /* the sending chunk copies it here */
      r->lslot[v * m + a->mb % m] = a->slot;
      continue;
    }
    MPI_Irecv(pr_dev_msg_in(value_at(r, pv, a), pv->bytes), (int)pv->bytes, MPI_BYTE, pv->peer, tag_of(r->step, a->mb, pv->tag, 0),
              g_pipe, &r->rreq[(size_t)e * st->nrecv + v]);
  }
  recv_times(r, cm->tgot_f + a->slot * cm->nfsrc, cm->trreq_f + a->slot * cm->nfsrc, cm->fsrc, cm->nfsrc,
             tag_of(r->step, a->mb, time_tag(r, c->stage - 1), 0));
}

void do_send(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  const PrChunk *c = &r->chunk[a->chunk];
  ChunkMsg *cm = &r->cm[a->chunk];
  int e = eslot(r, a), m = st->microbatches;
  pr_dev_await(&r->slot_done[e]); /* the forward that filled the slot */
  for (int v = c->send_lo; v < c->send_hi; v++) {
    const PrValue *pv = &st->send[v];
    unsigned char *src = value_at(r, pv, a);
    if (is_local(pv)) {
      int to = r->lto_send[v];
      local_copy(r, r->lslot + to * m, a->mb, dev_at(r, st->recv[to].offset), pv->bytes, src, pv->name);
      continue;
    }
    r->sent_bytes += (double)pv->bytes;
    /* A value that leaves is sent from the xslot: the xslot's next holder (and its OFFLOAD) waits for it. */
    MPI_Request *q = pv->xring ? &r->xsreq[(size_t)a->xslot * st->nsend + v] : &r->sreq[(size_t)e * st->nsend + v];
    MPI_Isend(pr_dev_msg_out(src, pv->bytes), (int)pv->bytes, MPI_BYTE, pv->peer, tag_of(r->step, a->mb, pv->tag, 0), g_pipe, q);
  }
  send_times(r, cm->tsent_f + a->slot * cm->nfdst, cm->tsreq_f + a->slot * cm->nfdst, cm->fdst, cm->nfdst,
             tag_of(r->step, a->mb, time_tag(r, c->stage), 0));
}

void do_recv_grad(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  const PrChunk *c = &r->chunk[a->chunk];
  ChunkMsg *cm = &r->cm[a->chunk];
  int e = egslot(r, a), m = st->microbatches;
  wait_grad_sends(r, a);
  for (int v = c->send_lo; v < c->send_hi; v++) {
    const PrValue *pv = &st->send[v];
    if (pv->goffset < 0) continue;
    if (is_local(pv)) {
      r->lgslot[v * m + a->mb % m] = a->gslot;
      continue;
    }
    MPI_Irecv(pr_dev_msg_in(ring(r, pv->goffset, pv->bytes, a->gslot), pv->bytes), (int)pv->bytes, MPI_BYTE, pv->peer, tag_of(r->step, a->mb, pv->tag, 1),
              g_pipe, &r->greq[(size_t)e * st->nsend + v]);
  }
  recv_times(r, cm->tgot_g + a->gslot * cm->ngsrc, cm->trreq_g + a->gslot * cm->ngsrc, cm->gsrc, cm->ngsrc,
             tag_of(r->step, a->mb, time_tag(r, c->stage + 1), 1));
}

void do_send_grad(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  const PrChunk *c = &r->chunk[a->chunk];
  ChunkMsg *cm = &r->cm[a->chunk];
  int e = egslot(r, a), m = st->microbatches;
  pr_dev_await(&r->gslot_done[e]); /* the backward that filled the gradient slot */
  for (int v = c->recv_lo; v < c->recv_hi; v++) {
    const PrValue *pv = &st->recv[v];
    if (pv->goffset < 0 || pv->source != PR_FROM_PREV) continue;
    unsigned char *src = ring(r, pv->goffset, pv->bytes, a->gslot);
    if (is_local(pv)) {
      int to = r->lto_recv[v];
      local_copy(r, r->lgslot + to * m, a->mb, dev_at(r, st->send[to].goffset), pv->bytes, src, pv->name);
      continue;
    }
    r->sent_bytes += (double)pv->bytes;
    MPI_Isend(pr_dev_msg_out(src, pv->bytes), (int)pv->bytes, MPI_BYTE, pv->peer, tag_of(r->step, a->mb, pv->tag, 1), g_pipe,
              &r->gsreq[(size_t)e * st->nrecv + v]);
  }
  send_times(r, cm->tsent_g + a->gslot * cm->ngdst, cm->tsreq_g + a->gslot * cm->ngdst, cm->gdst, cm->ngdst,
             tag_of(r->step, a->mb, time_tag(r, c->stage), 1));
}

/* Stash tags name (step, mb, value); weights come once per step, after them. */
static int fb_tag(int64_t step, int mb, int id) { return ((int)(step % 4) * 256 + mb % 256) * 4096 + id % 4096; }
#define FB_WTAG (4 * 256 * 4096)

void do_send_stash(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  pr_dev_await(&r->slot_done[a->slot]); /* the forward that stashed them */
  for (int v = 0; v < st->nstash_send; v++) {
    const PrStash *x = &st->stash_send[v];
    r->sent_bytes += (double)x->bytes;
    MPI_Isend(pr_dev_msg_out(ring(r, x->offset, x->bytes, a->slot), x->bytes), (int)x->bytes, MPI_BYTE, x->peer, fb_tag(r->step, a->mb, x->id), r->fcomm,
              &r->ssreq[(size_t)a->slot * st->nstash_send + v]);
  }
}

void do_recv_stash(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  for (int v = 0; v < st->nstash_recv; v++) {
    const PrStash *x = &st->stash_recv[v];
    MPI_Irecv(pr_dev_msg_in(ring(r, x->offset, x->bytes, a->slot), x->bytes), (int)x->bytes, MPI_BYTE, x->peer, fb_tag(r->step, a->mb, x->id), r->fcomm,
              &r->srreq[(size_t)a->slot * st->nstash_recv + v]);
  }
}

void do_send_weights(Run *r) {
  const PrStage *st = r->st;
  pr_dev_sync(); /* the update that wrote them */
  for (int v = 0; v < st->nwsend; v++) {
    const PrWeight *w = &st->wsend[v];
    r->sent_bytes += 4.0 * (double)w->count;
    MPI_Isend(pr_dev_msg_out(dev_at(r, w->offset), 4 * w->count), (int)w->count, MPI_FLOAT, w->peer, FB_WTAG + w->id % 4096, r->fcomm, &r->wreq[v]);
  }
}

/* The forwards of the next step use the weights of this step's update: wait for them. */
void do_recv_weights(Run *r) {
  const PrStage *st = r->st;
  for (int v = 0; v < st->nwrecv; v++) {
    const PrWeight *w = &st->wrecv[v];
    MPI_Irecv(pr_dev_msg_in(dev_at(r, w->offset), 4 * w->count), (int)w->count, MPI_FLOAT, w->peer, FB_WTAG + w->id % 4096, r->fcomm, &r->wreq[v]);
  }
  wait_all(r, r->wreq, st->nwrecv, -1, "the weights the backward ranks updated");
  for (int v = 0; v < st->nwrecv; v++) pr_dev_msg_landed(dev_at(r, st->wrecv[v].offset), 4 * st->wrecv[v].count);
}

/* The device's copies of what an action's receives brought (device.h: the CPU's are in place). */
void landed_values(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  const PrChunk *c = &r->chunk[a->chunk];
  for (int v = c->recv_lo; v < c->recv_hi; v++)
    if (st->recv[v].source == PR_FROM_PREV && !is_local(&st->recv[v])) pr_dev_msg_landed(value_at(r, &st->recv[v], a), st->recv[v].bytes);
}
void landed_grads(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  const PrChunk *c = &r->chunk[a->chunk];
  for (int v = c->send_lo; v < c->send_hi; v++)
    if (st->send[v].goffset >= 0 && !is_local(&st->send[v]))
      pr_dev_msg_landed(ring(r, st->send[v].goffset, st->send[v].bytes, a->gslot), st->send[v].bytes);
}
void landed_stash(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  for (int v = 0; v < st->nstash_recv; v++)
    pr_dev_msg_landed(ring(r, st->stash_recv[v].offset, st->stash_recv[v].bytes, a->slot), st->stash_recv[v].bytes);
}

/* Requests, all MPI_REQUEST_NULL: n of them, and one more so that none is malloc(0). */
static MPI_Request *requests(int n) {
  MPI_Request *q = malloc(sizeof(MPI_Request) * (size_t)(n + 1));
  if (!q) die(2, "out of memory for the message bookkeeping%s", "");
  for (int i = 0; i < n; i++) q[i] = MPI_REQUEST_NULL;
  return q;
}

/* Exposed communication of chunk c: its peers, and the send times that follow its messages, per slot and gslot. */
static void times_open_chunk(Run *r, int c) {
  const PrStage *st = r->st;
  const PrChunk *k = &r->chunk[c];
  ChunkMsg *cm = &r->cm[c];
  int ns = st->nslots, ngs = st->ngslots, nr = k->recv_hi - k->recv_lo, nsd = k->send_hi - k->send_lo;
  cm->fsrc = malloc(sizeof(int) * (size_t)(2 * nr + 2 * nsd + 4));
  if (!cm->fsrc) die(2, "out of memory for the message bookkeeping%s", "");
  cm->gdst = cm->fsrc + nr + 1, cm->fdst = cm->gdst + nr + 1, cm->gsrc = cm->fdst + nsd + 1;
  cm->nfsrc = peers_of(st->recv + k->recv_lo, nr, 0, cm->fsrc), cm->ngdst = peers_of(st->recv + k->recv_lo, nr, 1, cm->gdst);
  cm->nfdst = peers_of(st->send + k->send_lo, nsd, 0, cm->fdst), cm->ngsrc = peers_of(st->send + k->send_lo, nsd, 1, cm->gsrc);
  int nts = ns * (cm->nfsrc + cm->nfdst) + ngs * (cm->ngsrc + cm->ngdst) + 1;
  cm->tsent_f = calloc((size_t)nts, sizeof(double));
  cm->tsreq_f = requests(nts);
  if (!cm->tsent_f) die(2, "out of memory for the message bookkeeping");
  cm->tgot_f = cm->tsent_f + ns * cm->nfdst, cm->tsent_g = cm->tgot_f + ns * cm->nfsrc, cm->tgot_g = cm->tsent_g + ngs * cm->ngdst;
  cm->trreq_f = cm->tsreq_f + ns * cm->nfdst, cm->tsreq_g = cm->trreq_f + ns * cm->nfsrc, cm->trreq_g = cm->tsreq_g + ngs * cm->ngdst;
}

static void times_open(Run *r) {
  MPI_Comm_dup(g_pipe, &r->tcomm);
  r->cm = calloc((size_t)r->nchunks, sizeof(ChunkMsg));
  if (!r->cm) die(2, "out of memory for the message bookkeeping%s", "");
  for (int c = 0; c < r->nchunks; c++) times_open_chunk(r, c);
}

/* The chunks this rank runs: the descriptor's, or one of its own functions and every value. */
void chunks_open(Run *r) {
  const PrStage *st = r->st;
  if (st->nchunks > 0) {
    if (st->nchunks > PR_MAX_CHUNKS) die(2, "this program runs %d chunks; the runtime runs at most %d (regenerate with pipecc)", st->nchunks, PR_MAX_CHUNKS);
    r->chunk = st->chunks, r->nchunks = st->nchunks;
    return;
  }
  r->one = (PrChunk){st->stage, st->forward, st->forward_eval, st->backward, st->backward_input, st->backward_weight,
                     0, st->nrecv, 0, st->nsend, st->loss != NULL};
  r->chunk = &r->one, r->nchunks = 1;
}

/* The message state: requests per slot and gslot, the events that fill them, PipeFB's communicator
 * and requests, the send times' communicator and the other ranks' clocks. */
void msg_open(Run *r) {
  const PrStage *st = r->st;
  int ns = st->nslots * r->nchunks, ngs = st->ngslots * r->nchunks, m = st->microbatches;
  r->lslot = malloc(sizeof(int) * (size_t)((st->nrecv + st->nsend) * m + 1));
  if (!r->lslot) die(2, "out of memory for the message bookkeeping%s", "");
  r->lgslot = r->lslot + st->nrecv * m;
  for (int i = 0; i < (st->nrecv + st->nsend) * m; i++) r->lslot[i] = -1;
  local_rows_open(r);
  r->rreq = requests(ns * st->nrecv), r->sreq = requests(ns * st->nsend);
  r->greq = requests(ngs * st->nsend), r->gsreq = requests(ngs * st->nrecv);
  r->slot_done = calloc((size_t)(ns + ngs + 1), sizeof(PrDevEvent));
  if (!r->slot_done) die(2, "out of memory for the message bookkeeping%s", "");
  r->gslot_done = r->slot_done + ns;
  times_open(r);
  measure_clocks(r);
  MPI_Comm_dup(g_pipe, &r->fcomm);
  int nw = st->nwsend > st->nwrecv ? st->nwsend : st->nwrecv;
  r->ssreq = requests(ns * st->nstash_send + ns * st->nstash_recv + nw);
  r->srreq = r->ssreq + ns * st->nstash_send, r->wreq = r->srreq + ns * st->nstash_recv;
  /* A stage that sends or receives pages its host image in once (device.h; the CPU: nothing).  The
   * whole image, not each ring: a copy may not straddle a page-locked range and one that is not. */
  int msgs = st->nsend > 0 || st->nstash_send || st->nstash_recv || st->nwsend || st->nwrecv || st->offload_to >= 0 || st->nstore;
  for (int v = 0; v < st->nrecv; v++) msgs |= st->recv[v].source == PR_FROM_PREV;
  if (msgs) pr_dev_pin(dev_at(r, 0), st->arena_bytes);
}

void msg_poll_start(Run *r) { g_poll_run = r; }

/* Cancels the receives still posted (nothing will come for them). */
static void cancel_all(MPI_Request *q, int n) {
  for (int i = 0; i < n; i++)
    if (q[i] != MPI_REQUEST_NULL) MPI_Cancel(&q[i]), MPI_Request_free(&q[i]);
}

/* After the last step: what is still in flight is waited for (sends) or cancelled (receives posted
 * ahead of a step that never came), and the message state freed. */
void msg_drain(Run *r) {
  const PrStage *st = r->st;
  int ns = st->nslots * r->nchunks, ngs = st->ngslots * r->nchunks;
  g_poll_run = NULL;
  static const PrAction drain = {PR_UPDATE, -1, -1, -1, -1, -1, -1, 0};
  r->cur = &drain;
  const ChunkMsg *c0 = &r->cm[0];
  wait_all(r, r->sreq, ns * st->nsend, c0->nfdst ? c0->fdst[0] : -1, "to take the last forward values");
  wait_all(r, r->gsreq, ngs * st->nrecv, c0->ngdst ? c0->gdst[0] : -1, "to take the last gradients");
  wait_all(r, r->ssreq, ns * st->nstash_send, -1, "to take the last stashed values");
  wait_all(r, r->wreq, st->nwsend, -1, "to take the last weights");
  for (int c = 0; c < r->nchunks; c++) {
    ChunkMsg *cm = &r->cm[c];
    wait_all(r, cm->tsreq_f, st->nslots * cm->nfdst, -1, "to take the last send times");
    wait_all(r, cm->tsreq_g, st->ngslots * cm->ngdst, -1, "to take the last send times");
    cancel_all(cm->trreq_f, st->nslots * cm->nfsrc);
    cancel_all(cm->trreq_g, st->ngslots * cm->ngsrc);
  }
  MPI_Comm_free(&r->tcomm);
  free(r->clock);
  MPI_Comm_free(&r->fcomm);
  cancel_all(r->rreq, ns * st->nrecv);
  cancel_all(r->greq, ngs * st->nsend);
}

void msg_close(Run *r) {
  free(r->rreq), free(r->sreq), free(r->greq), free(r->gsreq), free(r->ssreq);
  for (int c = 0; c < r->nchunks; c++) free(r->cm[c].tsent_f), free(r->cm[c].tsreq_f), free(r->cm[c].fsrc);
  free(r->cm), free(r->slot_done), free(r->lslot), free(r->lto_send);
}
