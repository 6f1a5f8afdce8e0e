/* load.c - data into the arena: the weights file at start-up, the data set
 * (opened and checked against the model), and per micro-batch the loader's
 * inputs and labels into their slots, under a guard against data files that
 * shrink during the run. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "run.h"

static int load_file(const char *path, void *dst, int64_t bytes, char *msg, size_t len) {
  FILE *f = fopen(path, "rb");
  if (!f) return snprintf(msg, len, "cannot open %s: %s", path, strerror(errno)), -1;
  struct stat sb;
  if (fstat(fileno(f), &sb) || sb.st_size != bytes) {
    fclose(f);
    return snprintf(msg, len, "%s has %lld bytes, this stage expects %lld (regenerate with pipecc)", path,
                    (long long)sb.st_size, (long long)bytes), -1;
  }
  int ok = bytes == 0 || fread(dst, 1, (size_t)bytes, f) == (size_t)bytes;
  fclose(f);
  if (!ok) return snprintf(msg, len, "cannot read %s", path), -1;
  return 0;
}

int needs_data(const PrStage *st) {
  if (st->loss) return 1;
  for (int v = 0; v < st->nrecv; v++)
    if (st->recv[v].source != PR_FROM_PREV) return 1;
  return 0;
}

/* NumPy arrays (training or held-out) against the stage: x against each loader input it feeds, y against
 * the loss (d->n, the samples, is checked against the batch by the caller). */
int check_arrays(const PrStage *st, const DataSet *d, char *msg, size_t len) {
  for (int v = 0; v < st->nrecv; v++) {
    const PrValue *pv = &st->recv[v];
    if (pv->source != PR_FROM_PREV &&
        data_check_arrays(d, pv->source == PR_FROM_TOKENS, pv->rank, pv->dims, pv->source == PR_FROM_TOKENS ? st->vocab : 0, msg, len))
      return -1;
  }
  if (st->loss && data_check_array_labels(d, st->loss_rows / st->mb_size, (int)st->loss_classes, msg, len)) return -1;
  return 0;
}

/* Images or tokens against the stage's loader inputs and loss. */
static int check_formats(Run *r, char *msg, size_t len) {
  const PrStage *st = r->st;
  int ok = 1;
  for (int v = 0; ok && v < st->nrecv; v++) {
    const PrValue *pv = &st->recv[v];
    if (pv->source == PR_FROM_IMAGES) {
      if (r->data.kind == DATA_TOKENS)
        ok = 0, snprintf(msg, len, "%s holds tokens, but the model's input '%s' is an image batch", r->a.data, pv->name);
      else if (pv->rank != 4)
        ok = 0, snprintf(msg, len, "input '%s' has rank %d; image data needs [batch, channels, height, width] (NumPy arrays take any shape)",
                         pv->name, pv->rank);
      else
        ok = data_check_images(&r->data, (int)pv->dims[1], (int)pv->dims[2], (int)pv->dims[3], st->loss ? (int)st->loss_classes : 256,
                               msg, len) == 0;
    } else if (pv->source == PR_FROM_TOKENS) {
      if (r->data.kind != DATA_TOKENS)
        ok = 0, snprintf(msg, len, "%s holds images, but the model's input '%s' is token ids", r->a.data, pv->name);
      else
        ok = data_check_tokens(&r->data, (int)st->vocab, (int64_t)st->batch * pv->dims[1] + 1, msg, len) == 0;
    }
  }
  if (ok && st->loss && r->data.kind != DATA_TOKENS)
    ok = data_check_images(&r->data, r->data.c, r->data.h, r->data.w, (int)st->loss_classes, msg, len) == 0;
  if (ok && st->loss && r->data.kind == DATA_TOKENS)
    ok = data_check_tokens(&r->data, (int)st->loss_classes, (int64_t)st->batch * (st->loss_rows / st->mb_size) + 1, msg, len) == 0;
  return ok ? 0 : -1;
}

void open_data(Run *r) {
  const PrStage *st = r->st;
  char msg[1024] = "";
  int ok = 1;
  if (needs_data(st)) {
    ok = data_open_named(&r->data, r->a.data, 0, r->a.data_x, r->a.data_y, msg, sizeof msg) == 0;
    r->have_data = ok;
    if (ok) ok = (r->data.kind == DATA_ARRAYS ? check_arrays(st, &r->data, msg, sizeof msg) : check_formats(r, msg, sizeof msg)) == 0;
    if (ok && r->data.kind != DATA_TOKENS && r->data.n < st->batch)
      ok = 0, snprintf(msg, sizeof msg, "%s has %lld samples, fewer than one batch of %d", r->a.data, (long long)r->data.n, st->batch);
  }
  agree(ok, msg);
}

/* A data file changed under its mapping since the checks at the start (data_tokens, data_images): an id or
 * label past them would index past the model's tables, so the run stops here naming it. */
static void data_changed(const Run *r, const char *msg) {
  if (r->in_val) die(5, "validation after step %lld: %s; stopping", (long long)g_val_at.after, msg);
  die(5, "step %lld: %s; stopping", (long long)r->step + 1, msg);
}

/* Token data: the first sequence of micro-batch mb in the global batch (its replica's share first; a --val
 * pass reads the held-out batches whole, of one replica's size). */
static int first_seq(const Run *r, int mb) { return (r->in_val ? 0 : g_replica * r->st->batch) + mb * r->st->mb_size; }

/* Fills a loader input of micro-batch mb. */
static void load_input(Run *r, const PrValue *pv, int mb, int slot) {
  const PrStage *st = r->st;
  const int64_t *idx = r->idx + (int64_t)mb * st->mb_size;
  /* An input that leaves between forward and backward lives in the xslot block. */
  unsigned char *dev = pv->xring ? dev_at(r, pv->offset + (int64_t)r->cur->xslot * st->xslot_bytes) : ring(r, pv->offset, pv->bytes, slot);
  void *to = pr_dev_view(dev, pv->bytes, PR_VIEW_WRITE);
  char msg[1024];
  int rc = r->data.kind == DATA_ARRAYS
               ? data_rows(&r->data, idx, st->mb_size, pv->source == PR_FROM_IMAGES ? (float *)to : NULL,
                           pv->source == PR_FROM_TOKENS ? (int64_t *)to : NULL, NULL, msg, sizeof msg)
           : pv->source == PR_FROM_IMAGES
               ? data_images(&r->data, idx, st->mb_size, (float *)to, r->in_labels, msg, sizeof msg)
               : data_tokens(&r->data, r->step, global_batch(st), (int)pv->dims[1], first_seq(r, mb), st->mb_size, (int64_t *)to, r->in_y, msg,
                             sizeof msg);
  if (rc) data_changed(r, msg);
  pr_dev_release(to, dev, pv->bytes, PR_VIEW_WRITE);
}

static void load_labels(Run *r, int mb, int64_t *labels) {
  const PrStage *st = r->st;
  char msg[1024];
  int rc = r->data.kind == DATA_ARRAYS
               ? data_rows(&r->data, r->idx + (int64_t)mb * st->mb_size, st->mb_size, NULL, NULL, labels, msg, sizeof msg)
           : r->data.kind == DATA_TOKENS
               ? data_tokens(&r->data, r->step, global_batch(st), (int)(st->loss_rows / st->mb_size), first_seq(r, mb), st->mb_size, r->lab_x,
                             labels, msg, sizeof msg)
               : data_images(&r->data, r->idx + (int64_t)mb * st->mb_size, st->mb_size, r->lab_img, labels, msg, sizeof msg);
  if (rc) data_changed(r, msg);
}

/* The data files are mapped: if one shrinks during the run (truncated,
 * rewritten in place), reading the lost pages raises SIGBUS, which would kill
 * the rank with no word of why.  Loads run under a handler that jumps back
 * here, and the rank stops naming the file. */
static sigjmp_buf g_data_jmp;
static volatile sig_atomic_t g_in_data;
static void *volatile g_fault_addr;
static struct sigaction g_old_sigbus; /* Open MPI's (a stack trace), for a SIGBUS elsewhere */

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
  (void)uc;
  if (!g_in_data) { /* not a data read: what was there before (Open MPI's stack trace, or a core) */
    sigaction(sig, &g_old_sigbus, NULL);
    raise(sig);
    return;
  }
  g_fault_addr = si->si_addr;
  siglongjmp(g_data_jmp, 1);
}

static void data_fault(const Run *r) {
  long long was = 0, is = 0;
  const char *file = data_mapped_file(&r->data, g_fault_addr, &was, &is);
  if (!file) die(5, "step %lld: reading the data %s failed (SIGBUS): did a data file change during the run?", (long long)r->step + 1, r->a.data);
  die(5, "step %lld: data file %s changed during the run: %lld bytes when opened, %lld now (truncated or rewritten?); stopping",
      (long long)r->step + 1, file, was, is);
}

/* A loader input (pv) or, pv NULL, the labels of micro-batch mb, under the SIGBUS guard. */
void load_guarded(Run *r, const PrValue *pv, int mb, int slot, int64_t *labels) {
  if (sigsetjmp(g_data_jmp, 1)) {
    g_in_data = 0;
    data_fault(r);
  }
  g_in_data = 1;
  if (pv) load_input(r, pv, mb, slot);
  else load_labels(r, mb, labels);
  g_in_data = 0;
}

void guard_data_reads(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, &g_old_sigbus);
}

/* The loader's scratch, sized once the data is open: nothing is allocated in the step loop. */
void alloc_scratch(Run *r) {
  const PrStage *st = r->st;
  int64_t T = 1;
  for (int v = 0; v < st->nrecv; v++)
    if (st->recv[v].source == PR_FROM_TOKENS && st->recv[v].dims[1] > T) T = st->recv[v].dims[1];
  r->in_labels = malloc(sizeof(int64_t) * (size_t)st->mb_size);
  r->in_y = malloc(sizeof(int64_t) * (size_t)(st->mb_size * T));
  r->lab_x = malloc(sizeof(int64_t) * (size_t)(st->loss_rows + 1));
  int64_t img = r->have_data && r->data.kind != DATA_TOKENS && r->data.kind != DATA_ARRAYS ? (int64_t)st->mb_size * r->data.c * r->data.h * r->data.w : 1;
  r->lab_img = malloc(sizeof(float) * (size_t)img);
  if (!r->in_labels || !r->in_y || !r->lab_x || !r->lab_img) die(2, "out of memory for the loader's buffers");
}

/* Every trained weight in w (the weights region as loaded from path) is finite.  A NaN or Inf there
 * (a model's initializer, or a damaged weights file) used to surface at step 1 or 2 as a NaN gradient
 * blamed on the learning rate ("lower --lr?"): it is named here, before any step. */
static int initial_weights_finite(const PrStage *st, const unsigned char *w, const char *path, char *msg, size_t len) {
  for (int i = 0; i < st->nparams; i++) {
    const PrParam *p = &st->params[i];
    if (p->offset < 0 || p->count < 0 || p->offset > st->weights_bytes || p->count > (st->weights_bytes - p->offset) / 4) continue;
    const float *v = (const float *)(const void *)(w + p->offset);
    for (int64_t k = 0; k < p->count; k++)
      if (!isfinite(v[k]))
        return snprintf(msg, len, "weight '%s' is %s at element %lld at load (%s), before any step: a weight that is not finite cannot "
                                  "train (is the model's initializer NaN or Inf?)", p->name, isnan(v[k]) ? "NaN" : "Inf", (long long)k, path), -1;
  }
  return 0;
}

/* The weights region from the stage's weights file (pipecc wrote it beside the program), through a host view. */
void load_weights(Run *r) {
  const PrStage *st = r->st;
  char path[4096], msg[1024] = "";
  snprintf(path, sizeof path, "%s/weights/stage_%d.bin", pr_stage_dir(), st->stage);
  void *w = pr_dev_view(dev_at(r, 0), st->weights_bytes, PR_VIEW_WRITE);
  int ok = load_file(path, w, st->weights_bytes, msg, sizeof msg) == 0;
  if (ok) ok = initial_weights_finite(st, w, path, msg, sizeof msg) == 0;
  pr_dev_release(w, dev_at(r, 0), st->weights_bytes, PR_VIEW_WRITE);
  agree(ok, msg);
}

/* The weights region back into the program's own arena, which pr_save_onnx reads (the CPU's device
 * arena is that arena: nothing is copied). */
void weights_to_host(Run *r) { pr_dev_to_host(r->st->arena, dev_at(r, 0), r->st->weights_bytes); }
