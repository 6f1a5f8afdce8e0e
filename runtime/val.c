/* val.c - run.sh --val: the held-out set, forward only, between steps. */
#include <stdio.h>
#include <string.h>

#include "run.h"

/* ---- run.sh --val: a forward-only pass over a held-out set ----
 * Between two steps of a synchronous schedule every ring is free, so each
 * rank runs, per held-out micro-batch, its RECV, F and SEND through ring
 * slot 0, with the held-out set in place of the training one (batches in
 * order, unshuffled; whole batches only).  Each F is the stage's eval
 * forward (forward_eval where the compiler emitted one: training-mode
 * BatchNorm on its running statistics, Dropout off).  The last rank sums the
 * loss and counts the rows whose largest logit is the label. */

/* A held-out token file, checked as the training one is (load.c, open_data): every id below the input's
 * vocabulary and the loss's classes (an id past them would index past the embedding or the logits), and
 * one batch at least. */
static int val_check_tokens(Run *r, char *msg, size_t len) {
  const PrStage *st = r->st;
  for (int v = 0; v < st->nrecv; v++)
    if (st->recv[v].source == PR_FROM_TOKENS &&
        data_check_tokens(&r->val, (int)st->vocab, (int64_t)st->batch * st->recv[v].dims[1] + 1, msg, len))
      return -1;
  if (st->loss && data_check_tokens(&r->val, (int)st->loss_classes, (int64_t)st->batch * (st->loss_rows / st->mb_size) + 1, msg, len))
    return -1;
  return 0;
}

void val_open(Run *r) {
  const PrStage *st = r->st;
  char msg[1024] = "";
  int ok = 1;
  if (st->staleness || st->role != PR_ROLE_BOTH) ok = 0, snprintf(msg, sizeof msg, "--val: async and pipefb programs do not validate yet");
  else if (needs_data(st)) {
    ok = data_open_named(&r->val, r->a.val, (r->data.kind == DATA_TOKENS ? DATA_TOKENS : 0) | DATA_HELD_OUT, r->a.data_x, r->a.data_y, msg,
                         sizeof msg) == 0;
    if (ok && r->val.kind != r->data.kind) ok = 0, snprintf(msg, sizeof msg, "--val %s is not in the training data's format", r->a.val);
    if (ok && r->val.kind == DATA_ARRAYS) ok = check_arrays(st, &r->val, msg, sizeof msg) == 0;
    if (ok && r->val.kind == DATA_TOKENS) ok = val_check_tokens(r, msg, sizeof msg) == 0;
    if (ok && r->val.kind != DATA_TOKENS && r->val.kind != DATA_ARRAYS && (r->val.c != r->data.c || r->val.h != r->data.h || r->val.w != r->data.w))
      ok = 0, snprintf(msg, sizeof msg, "--val %s: images of %dx%dx%d, the training data's are %dx%dx%d", r->a.val, r->val.c, r->val.h,
                       r->val.w, r->data.c, r->data.h, r->data.w);
    if (ok && r->val.kind != DATA_TOKENS && r->val.kind != DATA_ARRAYS && st->loss)
      ok = data_check_images(&r->val, r->val.c, r->val.h, r->val.w, (int)st->loss_classes, msg, sizeof msg) == 0;
    if (ok && r->val.kind != DATA_TOKENS && r->val.n < st->batch)
      ok = 0, snprintf(msg, sizeof msg, "--val %s has %lld samples, fewer than one batch of %d", r->a.val, (long long)r->val.n, st->batch);
  }
  agree(ok, msg);
}

/* The rows of the micro-batch in ring slot 0 whose largest logit is the label (host views of both). */
static double val_hits(Run *r) {
  const PrStage *st = r->st;
  int64_t zb = (int64_t)sizeof(float) * st->loss_rows * st->loss_classes, yb = (int64_t)sizeof(int64_t) * st->loss_rows;
  const float *z = pr_dev_view(dev_at(r, st->logits_offset), zb, PR_VIEW_READ);
  const int64_t *y = pr_dev_view(dev_at(r, st->labels_offset), yb, PR_VIEW_READ);
  double hits = 0;
  for (int64_t row = 0; row < st->loss_rows; row++) {
    int64_t best = 0;
    for (int64_t c = 1; c < st->loss_classes; c++)
      if (z[row * st->loss_classes + c] > z[row * st->loss_classes + best]) best = c;
    hits += best == y[row];
  }
  pr_dev_release((void *)z, dev_at(r, st->logits_offset), zb, PR_VIEW_READ);
  pr_dev_release((void *)y, dev_at(r, st->labels_offset), yb, PR_VIEW_READ);
  return hits;
}

void val_pass(Run *r, int64_t after) {
  const PrStage *st = r->st;
  int64_t nb = 0, T = 1; /* whole batches of the held-out set; every rank learns the data ranks' count */
  for (int v = 0; v < st->nrecv; v++)
    if (st->recv[v].source == PR_FROM_TOKENS) T = st->recv[v].dims[1];
  if (st->loss && r->val.kind == DATA_TOKENS) T = st->loss_rows / st->mb_size;
  if (needs_data(st)) nb = r->val.kind == DATA_TOKENS ? (r->val.n - 1) / ((int64_t)st->batch * T) : r->val.n / st->batch;
  MPI_Allreduce(MPI_IN_PLACE, &nb, 1, MPI_INT64_T, MPI_MAX, g_pipe);
  DataSet train = r->data;
  int64_t step = r->step, *idx = r->idx;
  r->data = r->val;
  r->in_val = 1;
  double loss = 0, hits = 0;
  for (int64_t v = g_replica; v < nb; v += g_nreplicas) { /* --replicas: replica k evaluates batches k, k + R, ... */
    r->step = v; /* the tags and the token loader's batch; nothing of training is in flight between steps */
    for (int i = 0; i < st->batch; i++) r->idx[i] = v * st->batch + i;
    for (int k = 0; k < st->microbatches; k++) {
      g_val_at = (ValAt){after, v, k};
      /* Every chunk's receive first: a chunk's send to another chunk of this rank copies into it. */
      PrAction a[PR_MAX_CHUNKS];
      for (int c = 0; c < r->nchunks; c++) {
        a[c] = (PrAction){PR_RECV, k, 0, 0, 0, st->nxslots ? 0 : -1, -1, c}; /* between steps no transfer holds copy 0 of the leaving block */
        r->cur = &a[c]; /* the loader and the trace read the running action */
        do_recv(r, &a[c]);
      }
      for (int c = 0; c < r->nchunks; c++) {
        r->cur = &a[c];
        a[c].kind = PR_F;
        double l = do_forward(r, &a[c]);
        if (r->chunk[c].loss) {
          loss += l;
          hits += val_hits(r);
        }
        a[c].kind = PR_SEND;
        do_send(r, &a[c]);
      }
    }
  }
  r->data = train, r->step = step, r->idx = idx, r->in_val = 0;
  g_val_at.after = -1;
  if (st->loss) replica_sums(&loss, &hits); /* --replicas: every replica's batches, added on replica 0, which reports */
  if (!reports(st) || !nb) return;
  double rows = (double)nb * st->microbatches * st->loss_rows;
  loss /= rows;
  r->val_acc = hits / rows, r->have_val_acc = 1; /* shown on the terminal's progress line from now on */
  if (!r->a.quiet) {
    progress_clear();
    printf("validation after step %lld: loss %.6f, accuracy %.2f%% (%.0f rows)\n", (long long)after, loss, 100 * hits / rows, rows);
  }
  if (r->val_log) {
    char what[64];
    long long at = (long long)ftello(r->val_log);
    snprintf(what, sizeof what, "the row after step %lld", (long long)after);
    fprintf(r->val_log, "%lld,%.9g,%.9g\n", (long long)after, loss, hits / rows);
    log_row_end(r->val_log, at, r->val_log_path, what);
  }
  fflush(stdout);
}

