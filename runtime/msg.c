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

/* Sends still leaving slot / gslot must finish before anything refills it. */
void wait_sends(Run *r, int slot) {
  wait_all(r, r->sreq + (size_t)slot * r->st->nsend, r->st->nsend, r->st->nsend ? r->st->send[0].peer : -1, "to take the forward values it was sent");
  wait_all(r, r->ssreq + (size_t)slot * r->st->nstash_send, r->st->nstash_send, -1, "to take the stashed values it was sent");
}

void wait_grad_sends(Run *r, int gslot) {
  wait_all(r, r->gsreq + (size_t)gslot * r->st->nrecv, r->st->nrecv, r->st->nrecv ? r->st->recv[0].peer : -1, "to take the gradients it was sent");
}

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
    if (v[i].peer < 0 || v[i].source != PR_FROM_PREV || (grads && v[i].goffset < 0)) continue;
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
  MPI_Testall(st->nslots * st->nrecv, r->rreq, &flag, MPI_STATUSES_IGNORE);
  MPI_Testall(st->ngslots * st->nsend, r->greq, &flag, MPI_STATUSES_IGNORE);
  MPI_Testall(st->nslots * st->nsend, r->sreq, &flag, MPI_STATUSES_IGNORE);
  MPI_Testall(st->ngslots * st->nrecv, r->gsreq, &flag, MPI_STATUSES_IGNORE);
}

void do_recv(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  wait_sends(r, a->slot);
  if (a->xslot >= 0) wait_xslot_free(r, a->xslot);
  for (int v = 0; v < st->nrecv; v++) {
    const PrValue *pv = &st->recv[v];
    if (pv->source != PR_FROM_PREV) continue;
    MPI_Irecv(pr_dev_msg_in(value_at(r, pv, a), pv->bytes), (int)pv->bytes, MPI_BYTE, pv->peer, tag_of(r->step, a->mb, pv->tag, 0),
              MPI_COMM_WORLD, &r->rreq[(size_t)a->slot * st->nrecv + v]);
  }
  recv_times(r, r->tgot_f + a->slot * r->nfsrc, r->trreq_f + a->slot * r->nfsrc, r->fsrc, r->nfsrc, tag_of(r->step, a->mb, 0, 0));
}

void do_send(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  pr_dev_await(&r->slot_done[a->slot]); /* the forward that filled the slot */
  for (int v = 0; v < st->nsend; v++) {
    const PrValue *pv = &st->send[v];
    r->sent_bytes += (double)pv->bytes;
    MPI_Isend(pr_dev_msg_out(ring(r, pv->offset, pv->bytes, a->slot), pv->bytes), (int)pv->bytes, MPI_BYTE, pv->peer, tag_of(r->step, a->mb, pv->tag, 0),
              MPI_COMM_WORLD, &r->sreq[(size_t)a->slot * st->nsend + v]);
  }
  send_times(r, r->tsent_f + a->slot * r->nfdst, r->tsreq_f + a->slot * r->nfdst, r->fdst, r->nfdst, tag_of(r->step, a->mb, 0, 0));
}

void do_recv_grad(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  wait_grad_sends(r, a->gslot);
  for (int v = 0; v < st->nsend; v++) {
    const PrValue *pv = &st->send[v];
    if (pv->goffset < 0) continue;
    MPI_Irecv(pr_dev_msg_in(ring(r, pv->goffset, pv->bytes, a->gslot), pv->bytes), (int)pv->bytes, MPI_BYTE, pv->peer, tag_of(r->step, a->mb, pv->tag, 1),
              MPI_COMM_WORLD, &r->greq[(size_t)a->gslot * st->nsend + v]);
  }
  recv_times(r, r->tgot_g + a->gslot * r->ngsrc, r->trreq_g + a->gslot * r->ngsrc, r->gsrc, r->ngsrc, tag_of(r->step, a->mb, 0, 1));
}

void do_send_grad(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  pr_dev_await(&r->gslot_done[a->gslot]); /* the backward that filled the gradient slot */
  for (int v = 0; v < st->nrecv; v++) {
    const PrValue *pv = &st->recv[v];
    if (pv->goffset < 0 || pv->source != PR_FROM_PREV) continue;
    r->sent_bytes += (double)pv->bytes;
    MPI_Isend(pr_dev_msg_out(ring(r, pv->goffset, pv->bytes, a->gslot), pv->bytes), (int)pv->bytes, MPI_BYTE, pv->peer, tag_of(r->step, a->mb, pv->tag, 1),
              MPI_COMM_WORLD, &r->gsreq[(size_t)a->gslot * st->nrecv + v]);
  }
  send_times(r, r->tsent_g + a->gslot * r->ngdst, r->tsreq_g + a->gslot * r->ngdst, r->gdst, r->ngdst, tag_of(r->step, a->mb, 0, 1));
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
  for (int v = 0; v < st->nrecv; v++)
    if (st->recv[v].source == PR_FROM_PREV) pr_dev_msg_landed(value_at(r, &st->recv[v], a), st->recv[v].bytes);
}
void landed_grads(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  for (int v = 0; v < st->nsend; v++)
    if (st->send[v].goffset >= 0) pr_dev_msg_landed(ring(r, st->send[v].goffset, st->send[v].bytes, a->gslot), st->send[v].bytes);
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

/* Exposed communication: the peers, and the send times that follow the messages, per slot and gslot. */
static void times_open(Run *r) {
  const PrStage *st = r->st;
  int ns = st->nslots, ngs = st->ngslots;
  MPI_Comm_dup(MPI_COMM_WORLD, &r->tcomm);
  r->fsrc = malloc(sizeof(int) * (size_t)(2 * st->nrecv + 2 * st->nsend + 4));
  if (!r->fsrc) die(2, "out of memory for the message bookkeeping%s", "");
  r->gdst = r->fsrc + st->nrecv + 1, r->fdst = r->gdst + st->nrecv + 1, r->gsrc = r->fdst + st->nsend + 1;
  r->nfsrc = peers_of(st->recv, st->nrecv, 0, r->fsrc), r->ngdst = peers_of(st->recv, st->nrecv, 1, r->gdst);
  r->nfdst = peers_of(st->send, st->nsend, 0, r->fdst), r->ngsrc = peers_of(st->send, st->nsend, 1, r->gsrc);
  int nts = ns * (r->nfsrc + r->nfdst) + ngs * (r->ngsrc + r->ngdst) + 1;
  r->tsent_f = calloc((size_t)nts, sizeof(double));
  r->tsreq_f = requests(nts);
  if (!r->tsent_f) die(2, "out of memory for the message bookkeeping");
  r->tgot_f = r->tsent_f + ns * r->nfdst, r->tsent_g = r->tgot_f + ns * r->nfsrc, r->tgot_g = r->tsent_g + ngs * r->ngdst;
  r->trreq_f = r->tsreq_f + ns * r->nfdst, r->tsreq_g = r->trreq_f + ns * r->nfsrc, r->trreq_g = r->tsreq_g + ngs * r->ngdst;
}

/* The message state: requests per slot and gslot, the events that fill them, PipeFB's communicator
 * and requests, the send times' communicator and the other ranks' clocks. */
void msg_open(Run *r) {
  const PrStage *st = r->st;
  int ns = st->nslots, ngs = st->ngslots;
  r->rreq = requests(ns * st->nrecv), r->sreq = requests(ns * st->nsend);
  r->greq = requests(ngs * st->nsend), r->gsreq = requests(ngs * st->nrecv);
  r->slot_done = calloc((size_t)(ns + ngs + 1), sizeof(PrDevEvent));
  if (!r->slot_done) die(2, "out of memory for the message bookkeeping%s", "");
  r->gslot_done = r->slot_done + ns;
  times_open(r);
  measure_clocks(r);
  MPI_Comm_dup(MPI_COMM_WORLD, &r->fcomm);
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
  int ns = st->nslots, ngs = st->ngslots;
  g_poll_run = NULL;
  static const PrAction drain = {PR_UPDATE, -1, -1, -1, -1, -1};
  r->cur = &drain;
  wait_all(r, r->sreq, ns * st->nsend, r->nfdst ? r->fdst[0] : -1, "to take the last forward values");
  wait_all(r, r->gsreq, ngs * st->nrecv, r->ngdst ? r->gdst[0] : -1, "to take the last gradients");
  wait_all(r, r->ssreq, ns * st->nstash_send, -1, "to take the last stashed values");
  wait_all(r, r->wreq, st->nwsend, -1, "to take the last weights");
  wait_all(r, r->tsreq_f, ns * r->nfdst, -1, "to take the last send times");
  wait_all(r, r->tsreq_g, ngs * r->ngdst, -1, "to take the last send times");
  cancel_all(r->trreq_f, ns * r->nfsrc);
  cancel_all(r->trreq_g, ngs * r->ngsrc);
  MPI_Comm_free(&r->tcomm);
  free(r->clock);
  MPI_Comm_free(&r->fcomm);
  cancel_all(r->rreq, ns * st->nrecv);
  cancel_all(r->greq, ngs * st->nsend);
}

void msg_close(Run *r) {
  free(r->rreq), free(r->sreq), free(r->greq), free(r->gsreq), free(r->ssreq), free(r->tsent_f), free(r->tsreq_f), free(r->fsrc);
  free(r->slot_done);
}
