/* optstore.c - the optimizer state in a file (pipecc --offload-optimizer file:DIR; compiler/optstore.c).
 *
 * A stage whose plan keeps its optimizer state out of the arena has one file
 * for it, DIR/pipecc-optstate-<stage>-<pid>.bin, removed from the directory as
 * soon as it is open (nothing is left behind, even by a crash), sized to hold
 * every state and starting as zeros, as the arena's state does.  The update's
 * kernels (k_sgd_stream, k_adam_stream in cpu/optim.h) stream each weight's
 * state through two staging blocks: they queue the reads and write-backs here
 * (xfer.c: io_uring requests, or an I/O thread), and wait here for a block's
 * copies.  Checkpoints, --resume and freeze events read and write the state
 * through optstore_io, after the update's copies are done. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "run.h"

static Run *g_run;
static PrXfer *g_store;
static unsigned char *g_fresh; /* per piece of a stored gradient (k_grad_fetch's id): zeros this step, not yet read */

enum { SLOT_SYNC = 2 }; /* slots 0 and 1: the two staging blocks; 2: checkpoint and resume copies */

void optstore_open(Run *r) {
  const PrStage *st = r->st;
  char msg[1200] = "";
  g_run = r;
  if (st->opt_store_bytes) {
    const char *dir = r->a.offload_dir ? r->a.offload_dir : st->opt_dir;
    g_store = xfer_open(dir && *dir ? dir : ".", "optstate", st->stage, SLOT_SYNC + 1, r->timeout, msg, sizeof msg);
    if (g_store && xfer_size(g_store, st->opt_store_bytes, msg, sizeof msg)) xfer_close(g_store), g_store = NULL;
  }
  agree(g_store || !st->opt_store_bytes, msg);
}

/* Waits for a slot's copies under the watchdog; a failed copy stops the job naming the file. */
void pr_optstore_wait(int slot) {
  Run *r = g_run;
  double t0 = now();
  int waited = 0;
  while (xfer_pending(g_store, slot)) {
    if (now() - t0 > r->timeout)
      die(4, "step %lld: the optimizer state's file I/O took more than %.1f s; stopping", (long long)r->step + 1, r->timeout);
    xfer_nap(g_store), waited = 1;
  }
  const char *e = xfer_error(g_store);
  if (e) die(5, "step %lld: moving the optimizer state failed: %s", (long long)r->step + 1, e);
  if (!waited) return;
  double t1 = now();
  r->t_wait += t1 - t0, r->t_xfer_wait += t1 - t0;
  trace_add(&r->trace, -1, -1, 0, r->step, t0, t1);
}

void pr_optstore_read(int slot, float *dst, int64_t off, int64_t n) { xfer_submit(g_store, 0, slot, dst, 4 * n, off); }

void pr_optstore_write(int slot, const float *src, int64_t off, int64_t n) {
  xfer_submit(g_store, 1, slot, (void *)src, 4 * n, off);
  g_run->sent_bytes += (double)(4 * n);
}

/* After the update: its last write-backs are done (a checkpoint may read the file next). */
void optstore_drain(Run *r) {
  (void)r;
  if (!g_store) return;
  pr_optstore_wait(0), pr_optstore_wait(1);
}

void optstore_io(Run *r, int write, void *host, int64_t bytes, int64_t off) {
  optstore_drain(r);
  xfer_submit(g_store, write, SLOT_SYNC, host, bytes, off);
  pr_optstore_wait(SLOT_SYNC);
}

void optstore_close(Run *r) {
  optstore_drain(r);
  xfer_close(g_store);
  g_store = NULL;
  free(g_fresh);
  g_fresh = NULL;
}

/* ---- the gradients in the file ---- */


void optstore_fresh(Run *r) {
  if (!g_store) return;
  if (!g_fresh) {
    g_fresh = malloc((size_t)r->st->ngrad_pieces + 1);
    if (!g_fresh) die(2, "out of memory for the stored gradients' flags%s", "");
  }
  memset(g_fresh, 1, (size_t)r->st->ngrad_pieces + 1);
}

void k_grad_fetch(float *stage, int slot, int id, int64_t off, int64_t n) {
  pr_optstore_wait(slot); /* the copy this slot held last is back in the file */
  if (g_fresh[id]) {
    memset(stage, 0, (size_t)n * 4);
    g_fresh[id] = 0;
    return;
  }
  pr_optstore_read(slot, stage, off, n);
}

void k_grad_wait(const float *stage, int slot) {
  (void)stage;
  pr_optstore_wait(slot);
}

void k_grad_put(const float *stage, int slot, int64_t off, int64_t n) { pr_optstore_write(slot, stage, off, n); }

void pr_optstore_check(int id, const float *g, int64_t n, int64_t at) {
  for (int64_t i = 0; i < n; i++)
    if (!isfinite(g[i]))
      die(3, "step %lld: the gradient of '%s' is %s at element %lld; stopping (lower --lr?)", (long long)g_run->step + 1,
          g_run->st->params[id].name, isnan(g[i]) ? "NaN" : "Inf", (long long)(at + i));
}
