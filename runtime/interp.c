/* interp.c - the action interpreter: each optimizer step executes the
 * stage's action list as the compiler wrote it, slots included; the runtime
 * decides nothing of its own.  RECV / RECV_GRAD post non-blocking receives
 * into a slot (the compiler placed them as early as the slot is free, so
 * messages travel while the stage computes); F waits for its slot's
 * receives, runs the generated forward (and the loss on the last stage);
 * SEND / SEND_GRAD post non-blocking sends; B, or I then W under zb1, run
 * the generated backward halves; UPDATE applies the optimizer: gradients
 * were summed over the micro-batches in a fixed order, so the step is the
 * same as one large batch.  Before anything refills a slot it waits for the
 * sends from it. */
#include "run.h"

double do_forward(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  const PrChunk *c = &r->chunk[a->chunk];
  const ChunkMsg *cm = &r->cm[a->chunk];
  wait_sends(r, a); /* the forward writes the slot's outgoing values */
  if (a->xslot >= 0) wait_xslot_free(r, a->xslot);
  double l0 = now();
  for (int v = c->recv_lo; v < c->recv_hi; v++)
    if (st->recv[v].source != PR_FROM_PREV) load_guarded(r, &st->recv[v], a->mb, a->slot, NULL);
  r->prof.load += now() - l0;
  wait_message(r, r->rreq + (size_t)eslot(r, a) * st->nrecv, st->nrecv, cm->trreq_f + a->slot * cm->nfsrc, cm->tgot_f + a->slot * cm->nfsrc,
               cm->fsrc, cm->nfsrc, "the forward values of a micro-batch");
  landed_values(r, a);
  double t0 = now(), loss = 0;
  (r->in_val && c->forward_eval ? c->forward_eval : c->forward)(a->slot, a->xslot, a->gslot, a->wslot);
  if (c->loss) {
    /* The labels are loaded through a host view and the loss reads them where they are on the device. */
    unsigned char *dev = dev_at(r, st->labels_offset);
    int64_t bytes = (int64_t)sizeof(int64_t) * st->loss_rows;
    double t1 = now();
    int64_t *labels = pr_dev_view(dev, bytes, PR_VIEW_WRITE);
    load_guarded(r, NULL, a->mb, a->slot, labels);
    pr_dev_release(labels, dev, bytes, PR_VIEW_WRITE);
    double t2 = now();
    loss = st->loss(a->slot, (int64_t *)dev);
    r->prof.load += t2 - t1, r->prof.loss += now() - t2;
  }
  pr_dev_record(&r->slot_done[eslot(r, a)]); /* SEND posts the slot's values after it */
  double dt = now() - t0;
  r->t_compute += dt;
  if (st->nprof) prof_action(a->kind, dt);
  return loss;
}

static void do_recompute(Run *r, const PrAction *a) {
  wait_xslot_sends(r, a->xslot); /* a value sent from it by the micro-batch before */
  wait_xslot_in(r, a->xslot);
  double t0 = now();
  r->st->recompute(a->slot, a->xslot, a->gslot, a->wslot);
  r->t_compute += now() - t0;
}

static void do_backward(Run *r, const PrAction *a, void (*fn)(int, int, int, int)) {
  const PrStage *st = r->st;
  const PrChunk *c = &r->chunk[a->chunk];
  const ChunkMsg *cm = &r->cm[a->chunk];
  if (a->kind != PR_W) {
    if (!c->loss)
      wait_message(r, r->greq + (size_t)egslot(r, a) * st->nsend, st->nsend, cm->trreq_g + a->gslot * cm->ngsrc,
                   cm->tgot_g + a->gslot * cm->ngsrc, cm->gsrc, cm->ngsrc, "the gradients of a micro-batch");
    if (!c->loss) landed_grads(r, a);
    wait_all(r, r->srreq + (size_t)a->slot * st->nstash_recv, st->nstash_recv, -1, "the stashed values of a micro-batch");
    landed_stash(r, a);
    wait_grad_sends(r, a); /* it writes the gradients sent back from gslot */
  }
  if (a->xslot >= 0) wait_xslot_in(r, a->xslot);
  double t0 = now();
  fn(a->slot, a->xslot, a->gslot, a->wslot);
  if (a->kind != PR_W && a->gslot >= 0) pr_dev_record(&r->gslot_done[egslot(r, a)]); /* SEND_GRAD posts the gradients after it */
  double dt = now() - t0;
  r->t_compute += dt;
  if (st->nprof) prof_action(a->kind, dt);
}

/* Runs one action; returns the loss it adds (F on the last stage). */
static double run_action(Run *r, const PrAction *a) {
  r->cur = a;
  if (a->kind == PR_F || a->kind == PR_B || a->kind == PR_I || a->kind == PR_W || a->kind == PR_RECOMPUTE)
    pr_rand.step = r->step, pr_rand.mb = a->mb; /* the backward (and a recomputation) redraws the forward's Dropout masks */
  switch (a->kind) {
  case PR_F: return do_forward(r, a);
  case PR_B: do_backward(r, a, r->chunk[a->chunk].backward); break;
  case PR_I: do_backward(r, a, r->chunk[a->chunk].backward_input); break;
  case PR_W: do_backward(r, a, r->chunk[a->chunk].backward_weight); break;
  case PR_SEND: do_send(r, a); break;
  case PR_RECV: do_recv(r, a); break;
  case PR_SEND_GRAD: do_send_grad(r, a); break;
  case PR_RECV_GRAD: do_recv_grad(r, a); break;
  case PR_UPDATE: do_update(r); break;
  case PR_OFFLOAD: do_offload(r, a); break;
  case PR_PREFETCH: do_prefetch(r, a); break;
  case PR_RECOMPUTE: do_recompute(r, a); break;
  case PR_HOLD: do_hold(r, a); break;
  case PR_RETURN: do_return(r, a); break;
  case PR_SEND_STASH: do_send_stash(r, a); break;
  case PR_RECV_STASH: do_recv_stash(r, a); break;
  case PR_SEND_WEIGHTS: do_send_weights(r); break;
  case PR_RECV_WEIGHTS: do_recv_weights(r); break;
  case PR_REDUCE: do_reduce(r); break;
  case PR_REDUCE_WAIT: do_reduce_wait(r); break;
  default: die(2, "action kind %d is not supported by this runtime (regenerate with pipecc)", a->kind);
  }
  return 0;
}

/* Runs action a and times it: the trace span, and the busy time of a compute action (F, B, I, W,
 * RECOMPUTE, UPDATE: its wall time, a core shared with another rank included, less its waits for
 * messages and transfers, which are bubble).  Returns the loss it adds. */
double timed_action(Run *r, const PrAction *a, int64_t step) {
  double w0 = r->t_wait, a0 = now();
  double loss = run_action(r, a);
  double a1 = now();
  trace_action(&r->trace, a, a->kind == PR_SEND_GRAD || a->kind == PR_RECV_GRAD ? a->gslot : a->slot, step, a0, a1);
  if (a->kind == PR_F || a->kind == PR_B || a->kind == PR_I || a->kind == PR_W || a->kind == PR_RECOMPUTE || a->kind == PR_UPDATE)
    r->t_busy += (a1 - a0) - (r->t_wait - w0);
  return loss;
}

/* Adds a step's busy time (t_busy less busy0) and wall time to the bubble's sums: the first step of
 * the run warms pages and caches, and counts only when it is the only one. */
void bubble_step(Run *r, int64_t step, int64_t first, double busy0, double wall) {
  if (step == first && r->a.steps - first > 1) return;
  r->bub_busy += r->t_busy - busy0, r->bub_wall += wall;
}

/* The synchronous schedules (gpipe, 1f1b, zb1, pipefb): each step runs the action list once. */
void run_sync(Run *r, StepLog *sl) {
  const PrStage *st = r->st;
  for (; r->step < r->a.steps; r->step++) {
    double t0 = now(), loss = 0, busy0 = r->t_busy;
    if (r->have_data && r->data.kind != DATA_TOKENS) {
      data_batch_indices(&r->data, r->step, global_batch(st), r->a.seed, r->a.shuffle, r->idx);
      replica_indices(r->idx, st->batch); /* --replicas: this replica's share */
    }
    zero_grads(r);
    for (int k = 0; k < st->nactions; k++) loss += timed_action(r, &st->actions[k], r->step);
    double dt = now() - t0;
    bubble_step(r, r->step, sl->first_step, busy0, dt);
    end_step(r, sl, loss, dt);
  }
}
