/* offload.c - the memory plan's transfers (compiler/stash.c): the values that
 * leave between a micro-batch's forward and its backward go out of their
 * xslot to a peer rank (which HOLDs them in a store slot and RETURNs them)
 * or to the offload file (xfer.c), and come back before the backward. */
#include <stdlib.h>
#include <string.h>

#include "run.h"

/* Offload traffic has a communicator of its own; its tag names the step, the
 * micro-batch and the direction (0: to the peer, 1: back to the owner). */
static int otag(int64_t step, int mb, int back) { return ((int)(step % 64) * 4096 + mb % 4096) * 2 + back; }

static unsigned char *xblock(const Run *r, int xslot) { return dev_at(r, r->st->xslot_base + (int64_t)xslot * r->st->xslot_bytes); }

/* The file's I/O reads and writes host memory: a view of the xslot's block (device.h), held until
 * its copy is done (the CPU: the block itself). */
static void file_release(Run *r, int xslot);
static void *file_view(Run *r, int xslot, int mode) {
  file_release(r, xslot); /* the I/O keeps the order of one xslot's copies */
  r->xview[xslot] = pr_dev_view(xblock(r, xslot), r->st->xout_bytes, mode);
  r->xview_mode[xslot] = mode;
  return r->xview[xslot];
}

static void file_release(Run *r, int xslot) {
  if (!r->xview[xslot]) return;
  pr_dev_release(r->xview[xslot], xblock(r, xslot), r->st->xout_bytes, r->xview_mode[xslot]);
  r->xview[xslot] = NULL;
}

/* Waits for the file's copies of xslot (the I/O thread), under the watchdog. */
static void wait_file(Run *r, int xslot, const char *what) {
  if (!r->xfer) return;
  double t0 = now();
  int waited = 0;
  while (xfer_pending(r->xfer, xslot)) {
    if (now() - t0 > r->timeout) die(4, "step %lld: the offload file's I/O took more than %.1f s (%s); stopping", (long long)r->step + 1, r->timeout, what);
    xfer_nap(r->xfer), waited = 1;
  }
  /* Whether or not this xslot waited: a copy that failed is not retried, and what it left must not be read. */
  const char *e = xfer_error(r->xfer);
  if (e) die(5, "step %lld: offloading activations failed: %s", (long long)r->step + 1, e);
  file_release(r, xslot);
  if (!waited) return;
  double t1 = now();
  r->t_wait += t1 - t0, r->t_xfer_wait += t1 - t0;
  trace_add(&r->trace, -1, r->cur->mb, r->cur->slot, r->step, t0, t1);
}

/* The sends of values that leave (SEND from the xslot: the cut's values) are done: before the xslot's
 * OFFLOAD copies it out, and before another micro-batch takes it. */
void wait_xslot_sends(Run *r, int xslot) {
  const PrStage *st = r->st;
  if (!r->xsreq || !st->nsend) return;
  wait_all(r, &r->xsreq[(size_t)xslot * st->nsend], st->nsend, st->send[0].peer, "to take the forward values it was sent");
}

/* Before an xslot takes another micro-batch's values: the copy out of it is done, and the sends from it. */
void wait_xslot_free(Run *r, int xslot) {
  const PrStage *st = r->st;
  wait_xslot_sends(r, xslot);
  if (st->offload_to >= 0) {
    double t0 = now();
    wait_all(r, &r->oreq[xslot], 1, st->offload_to, "to take offloaded activations");
    r->t_xfer_wait += now() - t0;
  } else {
    wait_file(r, xslot, "writing offloaded activations");
  }
}

/* Before the values in an xslot are read: the copy in is done. */
void wait_xslot_in(Run *r, int xslot) {
  const PrStage *st = r->st;
  if (st->offload_to >= 0) {
    double t0 = now();
    int arriving = r->ireq[xslot] != MPI_REQUEST_NULL;
    wait_all(r, &r->ireq[xslot], 1, st->offload_to, "to send back offloaded activations");
    if (arriving) pr_dev_msg_landed(xblock(r, xslot), st->xout_bytes);
    r->t_xfer_wait += now() - t0;
  } else {
    wait_file(r, xslot, "reading offloaded activations back");
  }
}

void do_offload(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  wait_xslot_sends(r, a->xslot); /* its SEND from the xslot (the compiler's simulation and validator know it waits) */
  pr_dev_sync(); /* the forward that wrote the leaving values */
  if (st->offload_to >= 0) {
    wait_all(r, &r->oreq[a->xslot], 1, st->offload_to, "to take offloaded activations");
    r->sent_bytes += (double)st->xout_bytes;
    MPI_Isend(pr_dev_msg_out(xblock(r, a->xslot), st->xout_bytes), (int)st->xout_bytes, MPI_BYTE, st->offload_to, otag(r->step, a->mb, 0), r->ocomm, &r->oreq[a->xslot]);
  } else {
    r->sent_bytes += (double)st->xout_bytes;
    xfer_submit(r->xfer, 1, a->xslot, file_view(r, a->xslot, PR_VIEW_READ), st->xout_bytes, (int64_t)a->mb * st->xout_bytes);
  }
}

void do_prefetch(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  wait_xslot_free(r, a->xslot);
  if (st->offload_to >= 0)
    MPI_Irecv(pr_dev_msg_in(xblock(r, a->xslot), st->xout_bytes), (int)st->xout_bytes, MPI_BYTE, st->offload_to, otag(r->step, a->mb, 1), r->ocomm, &r->ireq[a->xslot]);
  else
    xfer_submit(r->xfer, 0, a->xslot, file_view(r, a->xslot, PR_VIEW_WRITE), st->xout_bytes, (int64_t)a->mb * st->xout_bytes);
}

static unsigned char *store(const Run *r, int y) { return dev_at(r, r->st->store_base + (int64_t)y * r->st->store_bytes); }

void do_hold(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  wait_all(r, &r->hreq[a->xslot], 1, a->peer, "to take back the activations it offloaded here");
  MPI_Irecv(pr_dev_msg_in(store(r, a->xslot), st->store_bytes), (int)st->store_bytes, MPI_BYTE, a->peer, otag(r->step, a->mb, 0), r->ocomm, &r->hreq[a->xslot]);
}

void do_return(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  wait_all(r, &r->hreq[a->xslot], 1, a->peer, "the activations it offloads here");
  r->sent_bytes += (double)st->store_bytes;
  /* The store is a pass-through: what HOLD received goes back from where it landed, never via the device. */
  MPI_Isend(pr_dev_msg_in(store(r, a->xslot), st->store_bytes), (int)st->store_bytes, MPI_BYTE, a->peer, otag(r->step, a->mb, 1), r->ocomm, &r->hreq[a->xslot]);
}

/* The memory plan's state: requests per xslot and store slot on a communicator of their own, and
 * the offload file's I/O (every rank agrees it opened). */
void offload_open(Run *r) {
  const PrStage *st = r->st;
  char msg[1024] = "";
  MPI_Comm_dup(g_pipe, &r->ocomm);
  int nx = st->nxslots, nst = st->nstore;
  r->oreq = malloc(sizeof(MPI_Request) * (size_t)(2 * nx + nst + 1));
  r->xview = calloc((size_t)nx + 1, sizeof(void *));
  r->xview_mode = calloc((size_t)nx + 1, sizeof(int));
  if (!r->oreq || !r->xview || !r->xview_mode) die(2, "out of memory for the memory plan's requests%s", "");
  r->ireq = r->oreq + nx, r->hreq = r->oreq + 2 * nx;
  for (int i = 0; i < 2 * nx + nst; i++) r->oreq[i] = MPI_REQUEST_NULL;
  r->xsreq = malloc(sizeof(MPI_Request) * (size_t)(nx * st->nsend + 1));
  if (!r->xsreq) die(2, "out of memory for the memory plan's requests%s", "");
  for (int i = 0; i < nx * st->nsend; i++) r->xsreq[i] = MPI_REQUEST_NULL;
  if (nx && st->offload_to == -1) {
    const char *dir = r->a.offload_dir ? r->a.offload_dir : st->offload_dir;
    /* The I/O thread may run on any of the CPUs the rank had before pin_rank: its copies fill
     * whichever core idles (the plan does not charge them to the rank's core). */
    cpu_set_t mine;
    int repin = r->pinned_cpu >= 0 && !sched_getaffinity(0, sizeof mine, &mine) && !sched_setaffinity(0, sizeof r->cpus, &r->cpus);
    r->xfer = xfer_open(dir && *dir ? dir : ".", "offload", st->stage, nx, r->timeout, msg, sizeof msg);
    if (repin) sched_setaffinity(0, sizeof mine, &mine);
    agree(r->xfer != NULL, msg);
  } else {
    agree(1, msg);
  }
}

/* After the last step: the transfers still moving are done, the file closed; records how its copies ran. */
void offload_close(Run *r) {
  const PrStage *st = r->st;
  wait_all(r, r->oreq, 2 * st->nxslots + st->nstore, -1, "to finish moving offloaded activations");
  wait_all(r, r->xsreq, st->nxslots * st->nsend, -1, "to take the last forward values sent from an xslot");
  for (int x = 0; r->xfer && x < st->nxslots; x++) wait_file(r, x, "the last offloaded activations");
  r->xfer_how = !r->xfer ? 0 : !strcmp(xfer_kind(r->xfer), "io_uring") ? 1 : 2;
  xfer_close(r->xfer);
  MPI_Comm_free(&r->ocomm);
  free(r->oreq), free(r->xview), free(r->xview_mode), free(r->xsreq);
  r->xsreq = NULL;
}
