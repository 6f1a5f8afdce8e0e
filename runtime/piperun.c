/* piperun.c - the runtime of a generated stage program.
 *
 * One process per stage.  Each optimizer step executes the stage's action
 * list as the compiler wrote it, slots included; the runtime decides
 * nothing of its own.  RECV / RECV_GRAD post non-blocking receives into a
 * slot (the compiler placed them as early as the slot is free, so messages
 * travel while the stage computes); F waits for its slot's receives, runs
 * the generated forward (and the loss on the last stage); SEND / SEND_GRAD
 * post non-blocking sends; B, or I then W under zb1, run the generated
 * backward halves; UPDATE applies the optimizer: gradients were summed over
 * the micro-batches in a fixed order, so the step is the same as one large
 * batch.  Before anything refills a slot it waits for the sends from it. */
#include "piperun.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <mpi.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "data.h"
#include "trace.h"

void openblas_set_num_threads(int);

typedef struct Args {
  const char *data, *log, *save, *checkpoint, *resume, *lr_schedule, *trace;
  int64_t steps, ckpt_every, warmup;
  uint64_t seed;
  int shuffle, quiet;
  double lr, momentum, weight_decay, min_lr;
  int have_lr, have_momentum, have_wd;
} Args;

typedef struct Run {
  const PrStage *st;
  Args a;
  int rank;
  DataSet data;
  int have_data;
  /* message state, per slot */
  MPI_Request *rreq;  /* [nslots][nrecv] forward receives */
  MPI_Request *sreq;  /* [nslots][nsend] forward sends */
  MPI_Request *greq;  /* [ngslots][nsend] gradient receives */
  MPI_Request *gsreq; /* [ngslots][nrecv] gradient sends */
  int64_t *idx;       /* sample indices of the step's batch */
  /* scratch for the loader, allocated once: labels/targets it also returns, images/tokens the labels come with */
  int64_t *in_labels, *in_y, *lab_x;
  float *lab_img;
  int64_t step;
  const PrAction *cur; /* the action running, for the trace's wait spans */
  PrTrace trace;
  double t_compute, t_wait, t_total;
} Run;

static int g_rank = -1;

static void die(int code, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void die(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "piperun: stage %d: error: ", g_rank);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  MPI_Abort(MPI_COMM_WORLD, code);
  exit(code);
}

static double now(void) { return MPI_Wtime(); }

/* ---- arguments ---- */

static void usage_error(const char *fmt, const char *arg) {
  if (g_rank == 0) {
    fprintf(stderr, "piperun: error: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nusage: run.sh --data PATH --steps N [--lr X] [--momentum X] [--weight-decay X] [--seed S]\n"
                    "       [--shuffle|--no-shuffle] [--log FILE] [--save FILE.onnx] [--checkpoint DIR]\n"
                    "       [--checkpoint-every K] [--resume DIR] [--lr-schedule constant|cosine] [--warmup K] [--quiet]\n"
                    "       [--trace FILE.json]\n");
  }
  MPI_Finalize();
  exit(2);
}

static double num(const char *flag, const char *v, double lo) {
  char *end;
  double x = v ? strtod(v, &end) : 0;
  if (!v || end == v || *end || x != x || x < lo) usage_error("bad value for %s", flag);
  return x;
}

static void parse_args(Args *a, int argc, char **argv) {
  memset(a, 0, sizeof *a);
  a->steps = -1, a->seed = 1, a->lr_schedule = "constant";
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define TAKE() (i++, v)
    if (!strcmp(f, "--data")) a->data = TAKE();
    else if (!strcmp(f, "--steps")) a->steps = (int64_t)num(f, TAKE(), 1);
    else if (!strcmp(f, "--lr")) a->lr = num(f, TAKE(), 0), a->have_lr = 1;
    else if (!strcmp(f, "--momentum")) a->momentum = num(f, TAKE(), 0), a->have_momentum = 1;
    else if (!strcmp(f, "--weight-decay")) a->weight_decay = num(f, TAKE(), 0), a->have_wd = 1;
    else if (!strcmp(f, "--seed")) a->seed = (uint64_t)num(f, TAKE(), 0);
    else if (!strcmp(f, "--shuffle")) a->shuffle = 1;
    else if (!strcmp(f, "--no-shuffle")) a->shuffle = 0;
    else if (!strcmp(f, "--log")) a->log = TAKE();
    else if (!strcmp(f, "--save")) a->save = TAKE();
    else if (!strcmp(f, "--checkpoint")) a->checkpoint = TAKE();
    else if (!strcmp(f, "--checkpoint-every")) a->ckpt_every = (int64_t)num(f, TAKE(), 1);
    else if (!strcmp(f, "--resume")) a->resume = TAKE();
    else if (!strcmp(f, "--lr-schedule")) a->lr_schedule = TAKE();
    else if (!strcmp(f, "--warmup")) a->warmup = (int64_t)num(f, TAKE(), 0);
    else if (!strcmp(f, "--min-lr")) a->min_lr = num(f, TAKE(), 0);
    else if (!strcmp(f, "--quiet")) a->quiet = 1;
    else if (!strcmp(f, "--trace")) a->trace = TAKE();
    else usage_error("unknown flag '%s'", f);
    if (i >= argc) usage_error("flag '%s' needs a value", f);
  }
  if (!a->data) usage_error("--data PATH is required%s", "");
  if (a->steps < 0) usage_error("--steps N is required%s", "");
  if (!a->lr_schedule || (strcmp(a->lr_schedule, "constant") && strcmp(a->lr_schedule, "cosine")))
    usage_error("--lr-schedule '%s': expected constant or cosine", a->lr_schedule ? a->lr_schedule : "");
  if (a->checkpoint && !a->ckpt_every) a->ckpt_every = 100;
}

/* ---- start-up checks: every rank agrees before the first step ---- */

/* All ranks learn whether any failed, and print the first failure's message. */
static void agree(int ok, const char *msg) {
  int bad = ok ? INT32_MAX : g_rank, first;
  MPI_Allreduce(&bad, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (first == INT32_MAX) return;
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", msg ? msg : "");
  MPI_Bcast(buf, sizeof buf, MPI_CHAR, first, MPI_COMM_WORLD);
  fprintf(stderr, "piperun: stage %d: error: %s%s\n", g_rank, first == g_rank ? "" : "(reported by another stage) ", buf);
  MPI_Finalize();
  exit(2);
}

static const char *stage_dir(void) {
  const char *d = getenv("PIPERUN_DIR");
  return d && *d ? d : ".";
}

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

static int needs_data(const PrStage *st) {
  if (st->loss) return 1;
  for (int v = 0; v < st->nrecv; v++)
    if (st->recv[v].source != PR_FROM_PREV) return 1;
  return 0;
}

static void open_data(Run *r) {
  const PrStage *st = r->st;
  char msg[1024] = "";
  int ok = 1;
  if (needs_data(st)) {
    ok = data_open(&r->data, r->a.data, 0, msg, sizeof msg) == 0;
    r->have_data = ok;
    for (int v = 0; ok && v < st->nrecv; v++) {
      const PrValue *pv = &st->recv[v];
      if (pv->source == PR_FROM_IMAGES) {
        if (r->data.kind == DATA_TOKENS)
          ok = 0, snprintf(msg, sizeof msg, "%s holds tokens, but the model's input '%s' is an image batch", r->a.data, pv->name);
        else if (pv->rank != 4)
          ok = 0, snprintf(msg, sizeof msg, "input '%s' has rank %d; image data needs [batch, channels, height, width]", pv->name, pv->rank);
        else
          ok = data_check_images(&r->data, (int)pv->dims[1], (int)pv->dims[2], (int)pv->dims[3], st->loss ? (int)st->loss_classes : 256,
                                 msg, sizeof msg) == 0;
      } else if (pv->source == PR_FROM_TOKENS) {
        if (r->data.kind != DATA_TOKENS)
          ok = 0, snprintf(msg, sizeof msg, "%s holds images, but the model's input '%s' is token ids", r->a.data, pv->name);
        else
          ok = data_check_tokens(&r->data, (int)st->vocab, (int64_t)st->batch * pv->dims[1] + 1, msg, sizeof msg) == 0;
      }
    }
    if (ok && st->loss && r->data.kind != DATA_TOKENS)
      ok = data_check_images(&r->data, r->data.c, r->data.h, r->data.w, (int)st->loss_classes, msg, sizeof msg) == 0;
    if (ok && st->loss && r->data.kind == DATA_TOKENS)
      ok = data_check_tokens(&r->data, (int)st->loss_classes, (int64_t)st->batch * (st->loss_rows / st->mb_size) + 1, msg, sizeof msg) == 0;
    if (ok && r->data.kind != DATA_TOKENS && r->data.n < st->batch)
      ok = 0, snprintf(msg, sizeof msg, "%s has %lld samples, fewer than one batch of %d", r->a.data, (long long)r->data.n, st->batch);
  }
  agree(ok, msg);
}

/* ---- messages ---- */

/* A message's tag names its step (mod 64), micro-batch, value and direction. */
static int tag_of(int64_t step, int mb, int v, int grad) { return ((int)(step % 64) * 256 * 64 + (mb % 256) * 64 + v % 64) * 2 + grad; }
#define TAG_SPAN (64 * 256 * 64 * 2)

static unsigned char *ring(const Run *r, int64_t off, int64_t bytes, int slot) { return r->st->arena + off + (int64_t)slot * bytes; }

static void wait_all(Run *r, MPI_Request *req, int n) {
  int any = 0;
  for (int i = 0; i < n; i++) any |= req[i] != MPI_REQUEST_NULL;
  if (!any) return;
  double t0 = now();
  MPI_Waitall(n, req, MPI_STATUSES_IGNORE);
  double t1 = now();
  r->t_wait += t1 - t0;
  trace_add(&r->trace, -1, r->cur->mb, r->cur->slot, r->step, t0, t1);
}

/* Sends still leaving slot / gslot must finish before anything refills it. */
static void wait_sends(Run *r, int slot) { wait_all(r, r->sreq + (size_t)slot * r->st->nsend, r->st->nsend); }
static void wait_grad_sends(Run *r, int gslot) { wait_all(r, r->gsreq + (size_t)gslot * r->st->nrecv, r->st->nrecv); }

static void do_recv(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  wait_sends(r, a->slot);
  for (int v = 0; v < st->nrecv; v++) {
    const PrValue *pv = &st->recv[v];
    if (pv->source != PR_FROM_PREV) continue;
    MPI_Irecv(ring(r, pv->offset, pv->bytes, a->slot), (int)pv->bytes, MPI_BYTE, st->stage - 1, tag_of(r->step, a->mb, v, 0),
              MPI_COMM_WORLD, &r->rreq[(size_t)a->slot * st->nrecv + v]);
  }
}

static void do_send(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  for (int v = 0; v < st->nsend; v++) {
    const PrValue *pv = &st->send[v];
    MPI_Isend(ring(r, pv->offset, pv->bytes, a->slot), (int)pv->bytes, MPI_BYTE, st->stage + 1, tag_of(r->step, a->mb, v, 0),
              MPI_COMM_WORLD, &r->sreq[(size_t)a->slot * st->nsend + v]);
  }
}

static void do_recv_grad(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  wait_grad_sends(r, a->gslot);
  for (int v = 0; v < st->nsend; v++) {
    const PrValue *pv = &st->send[v];
    if (pv->goffset < 0) continue;
    MPI_Irecv(ring(r, pv->goffset, pv->bytes, a->gslot), (int)pv->bytes, MPI_BYTE, st->stage + 1, tag_of(r->step, a->mb, v, 1),
              MPI_COMM_WORLD, &r->greq[(size_t)a->gslot * st->nsend + v]);
  }
}

static void do_send_grad(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  for (int v = 0; v < st->nrecv; v++) {
    const PrValue *pv = &st->recv[v];
    if (pv->goffset < 0 || pv->source != PR_FROM_PREV) continue;
    MPI_Isend(ring(r, pv->goffset, pv->bytes, a->gslot), (int)pv->bytes, MPI_BYTE, st->stage - 1, tag_of(r->step, a->mb, v, 1),
              MPI_COMM_WORLD, &r->gsreq[(size_t)a->gslot * st->nrecv + v]);
  }
}

/* Fills a loader input of micro-batch mb. */
static void load_input(Run *r, const PrValue *pv, int mb, int slot) {
  const PrStage *st = r->st;
  const int64_t *idx = r->idx + (int64_t)mb * st->mb_size;
  if (pv->source == PR_FROM_IMAGES)
    data_images(&r->data, idx, st->mb_size, (float *)ring(r, pv->offset, pv->bytes, slot), r->in_labels);
  else
    data_tokens(&r->data, r->step, st->batch, (int)pv->dims[1], mb * st->mb_size, st->mb_size, (int64_t *)ring(r, pv->offset, pv->bytes, slot),
                r->in_y);
}

static void load_labels(Run *r, int mb, int64_t *labels) {
  const PrStage *st = r->st;
  if (r->data.kind == DATA_TOKENS)
    data_tokens(&r->data, r->step, st->batch, (int)(st->loss_rows / st->mb_size), mb * st->mb_size, st->mb_size, r->lab_x, labels);
  else
    data_images(&r->data, r->idx + (int64_t)mb * st->mb_size, st->mb_size, r->lab_img, labels);
}

/* The loader's scratch, sized once the data is open: nothing is allocated in the step loop. */
static void alloc_scratch(Run *r) {
  const PrStage *st = r->st;
  int64_t T = 1;
  for (int v = 0; v < st->nrecv; v++)
    if (st->recv[v].source == PR_FROM_TOKENS && st->recv[v].dims[1] > T) T = st->recv[v].dims[1];
  r->in_labels = malloc(sizeof(int64_t) * (size_t)st->mb_size);
  r->in_y = malloc(sizeof(int64_t) * (size_t)(st->mb_size * T));
  r->lab_x = malloc(sizeof(int64_t) * (size_t)(st->loss_rows + 1));
  int64_t img = r->have_data && r->data.kind != DATA_TOKENS ? (int64_t)st->mb_size * r->data.c * r->data.h * r->data.w : 1;
  r->lab_img = malloc(sizeof(float) * (size_t)img);
  if (!r->in_labels || !r->in_y || !r->lab_x || !r->lab_img) die(2, "out of memory for the loader's buffers");
}

static double do_forward(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  wait_sends(r, a->slot); /* the forward writes the slot's outgoing values */
  for (int v = 0; v < st->nrecv; v++)
    if (st->recv[v].source != PR_FROM_PREV) load_input(r, &st->recv[v], a->mb, a->slot);
  wait_all(r, r->rreq + (size_t)a->slot * st->nrecv, st->nrecv);
  double t0 = now(), loss = 0;
  st->forward(a->slot);
  if (st->loss) {
    int64_t *labels = (int64_t *)(st->arena + st->labels_offset);
    load_labels(r, a->mb, labels);
    loss = st->loss(a->slot, labels);
  }
  r->t_compute += now() - t0;
  return loss;
}

static void do_backward(Run *r, const PrAction *a, void (*fn)(int, int)) {
  const PrStage *st = r->st;
  if (a->kind != PR_W) {
    if (!st->loss) wait_all(r, r->greq + (size_t)a->gslot * st->nsend, st->nsend);
    wait_grad_sends(r, a->gslot); /* it writes the gradients sent back from gslot */
  }
  double t0 = now();
  fn(a->slot, a->gslot);
  r->t_compute += now() - t0;
}

static void optimizer_step(Run *r);

/* Runs one action; returns the loss it adds (F on the last stage). */
static double run_action(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  r->cur = a;
  switch (a->kind) {
  case PR_F: return do_forward(r, a);
  case PR_B: do_backward(r, a, st->backward); break;
  case PR_I: do_backward(r, a, st->backward_input); break;
  case PR_W: do_backward(r, a, st->backward_weight); break;
  case PR_SEND: do_send(r, a); break;
  case PR_RECV: do_recv(r, a); break;
  case PR_SEND_GRAD: do_send_grad(r, a); break;
  case PR_RECV_GRAD: do_recv_grad(r, a); break;
  case PR_UPDATE: optimizer_step(r); break;
  default: die(2, "action kind %d is not supported by this runtime (regenerate with pipecc)", a->kind);
  }
  return 0;
}

const char *pr_kind_name(int kind) {
  static const char *names[PR_NKINDS] = {"F", "B", "I", "W", "SEND", "RECV", "SEND_GRAD", "RECV_GRAD", "UPDATE",
                                         "OFFLOAD", "PREFETCH", "RECOMPUTE"};
  return kind >= 0 && kind < PR_NKINDS ? names[kind] : "?";
}

/* ---- the optimizer ---- */

static double lr_at(const Run *r, int64_t step) {
  double lr = r->a.have_lr ? r->a.lr : r->st->lr;
  if (r->a.warmup > 0 && step < r->a.warmup) return lr * (double)(step + 1) / (double)r->a.warmup;
  if (!strcmp(r->a.lr_schedule, "cosine")) {
    double span = (double)(r->a.steps - r->a.warmup), t = (double)(step - r->a.warmup);
    double min = r->a.min_lr;
    return min + 0.5 * (lr - min) * (1 + cos(M_PI * (span > 0 ? t / span : 1)));
  }
  return lr;
}

static void check_finite(const Run *r, const char *what, const char *name, const float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (!isfinite(x[i]))
      die(3, "step %lld: %s of '%s' is %s at element %lld; stopping (lower --lr?)", (long long)r->step + 1, what, name,
          isnan(x[i]) ? "NaN" : "Inf", (long long)i);
}

static void optimizer_step(Run *r) {
  const PrStage *st = r->st;
  float lr = (float)lr_at(r, r->step);
  float mom = r->a.have_momentum ? (float)r->a.momentum : st->momentum;
  float wd = r->a.have_wd ? (float)r->a.weight_decay : st->weight_decay;
  for (int i = 0; i < st->nparams; i++) {
    const PrParam *p = &st->params[i];
    float *w = (float *)(st->arena + p->offset), *g = (float *)(st->arena + p->goffset);
    check_finite(r, "the gradient", p->name, g, p->count);
    float *m1 = p->m1offset >= 0 ? (float *)(st->arena + p->m1offset) : NULL;
    float *m2 = p->m2offset >= 0 ? (float *)(st->arena + p->m2offset) : NULL;
    if (st->optimizer == PR_SGD) {
      if (mom != 0 && !m1) die(2, "--momentum needs the optimizer state: compile with pipecc --momentum X");
      k_sgd(w, g, m1, p->count, lr, mom, wd, r->step == 0);
    } else {
      k_adam(w, g, m1, m2, p->count, lr, st->beta1, st->beta2, st->eps, wd, st->optimizer == PR_ADAMW, r->step + 1);
    }
  }
}

/* ---- checkpoints: each stage its own file, written whole or not at all ---- */

typedef struct CkptHeader {
  char magic[8];
  int32_t stage, nstages;
  int64_t step, arena_bytes, weights_bytes;
} CkptHeader;

/* Everything a step changes: weights and optimizer state (weights come first
 * in the arena; optimizer slots are found through the parameter table). */
static void ckpt_regions(const PrStage *st, int64_t *off, int64_t *len, int *n) {
  *n = 0;
  off[(*n)] = 0, len[(*n)++] = st->weights_bytes;
  for (int i = 0; i < st->nparams; i++) {
    if (st->params[i].m1offset >= 0) off[*n] = st->params[i].m1offset, len[(*n)++] = st->params[i].count * 4;
    if (st->params[i].m2offset >= 0) off[*n] = st->params[i].m2offset, len[(*n)++] = st->params[i].count * 4;
  }
}

static void save_checkpoint(Run *r, const char *dir) {
  const PrStage *st = r->st;
  mkdir(dir, 0755);
  char path[4096], tmp[4200];
  snprintf(path, sizeof path, "%s/stage_%d.ckpt", dir, st->stage);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "wb");
  if (!f) die(2, "cannot write checkpoint %s: %s", tmp, strerror(errno));
  CkptHeader h = {"PIPECKP", st->stage, st->nstages, r->step, st->arena_bytes, st->weights_bytes};
  int ok = fwrite(&h, sizeof h, 1, f) == 1;
  int64_t *off = malloc(sizeof(int64_t) * (size_t)(2 * st->nparams + 1)), *len = malloc(sizeof(int64_t) * (size_t)(2 * st->nparams + 1));
  int n;
  ckpt_regions(st, off, len, &n);
  for (int i = 0; i < n; i++) ok &= fwrite(st->arena + off[i], 1, (size_t)len[i], f) == (size_t)len[i];
  free(off), free(len);
  ok &= fflush(f) == 0 && fsync(fileno(f)) == 0;
  ok &= fclose(f) == 0;
  if (!ok || rename(tmp, path)) die(2, "cannot write checkpoint %s: %s", path, strerror(errno));
  /* The step file names a checkpoint whose every stage file is written. */
  MPI_Barrier(MPI_COMM_WORLD);
  if (st->stage == 0) {
    snprintf(path, sizeof path, "%s/step", dir);
    snprintf(tmp, sizeof tmp, "%s/step.tmp", dir);
    FILE *s = fopen(tmp, "w");
    if (!s || fprintf(s, "%lld\n", (long long)r->step) < 0 || fclose(s) || rename(tmp, path))
      die(2, "cannot write %s", path);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

static void load_checkpoint(Run *r, const char *dir) {
  const PrStage *st = r->st;
  char path[4096], msg[1024] = "";
  int ok = 1;
  snprintf(path, sizeof path, "%s/stage_%d.ckpt", dir, st->stage);
  FILE *f = fopen(path, "rb");
  CkptHeader h;
  if (!f) ok = 0, snprintf(msg, sizeof msg, "--resume %s: cannot open %s: %s", dir, path, strerror(errno));
  else if (fread(&h, sizeof h, 1, f) != 1 || memcmp(h.magic, "PIPECKP", 8) || h.stage != st->stage || h.nstages != st->nstages ||
           h.arena_bytes != st->arena_bytes || h.weights_bytes != st->weights_bytes)
    ok = 0, snprintf(msg, sizeof msg, "--resume %s: %s is not a checkpoint of this stage program", dir, path);
  if (ok) {
    int64_t *off = malloc(sizeof(int64_t) * (size_t)(2 * st->nparams + 1)), *len = malloc(sizeof(int64_t) * (size_t)(2 * st->nparams + 1));
    int n;
    ckpt_regions(st, off, len, &n);
    for (int i = 0; i < n && ok; i++) ok = fread(st->arena + off[i], 1, (size_t)len[i], f) == (size_t)len[i];
    if (!ok) snprintf(msg, sizeof msg, "--resume %s: %s is truncated", dir, path);
    free(off), free(len);
    r->step = h.step;
  }
  if (f) fclose(f);
  agree(ok, msg);
  int64_t s0 = r->step, s1;
  MPI_Allreduce(&s0, &s1, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  agree(s0 == s1, "the stages' checkpoints are from different steps");
}

/* ---- the run ---- */

static void on_signal(int sig) {
  char msg[96];
  int n = snprintf(msg, sizeof msg, "piperun: stage %d: stopped by signal %d (another stage failed?)\n", g_rank, sig);
  if (write(2, msg, (size_t)n) < 0) _exit(1);
  _exit(1);
}

int pr_main(int argc, char **argv, const PrStage *st) {
  if (st->forward_only) return pr_eval(argc, argv, st);
  MPI_Init(&argc, &argv);
  int size;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  signal(SIGTERM, on_signal);
  if (size != st->nstages || g_rank != st->stage) {
    if (g_rank == 0)
      fprintf(stderr, "piperun: error: this is a %d-stage program; start it with run.sh (mpirun started %d ranks, stage %d got rank %d)\n",
              st->nstages, size, st->stage, g_rank);
    MPI_Finalize();
    return 2;
  }
  openblas_set_num_threads(1);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
  int *tag_ub, flag;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &flag);
  if (flag && *tag_ub < TAG_SPAN) die(2, "this MPI allows tags up to %d; piperun needs %d", *tag_ub, TAG_SPAN);
  Run r;
  memset(&r, 0, sizeof r);
  r.st = st;
  r.rank = g_rank;
  parse_args(&r.a, argc, argv);
  char path[4096], msg[1024] = "";
  snprintf(path, sizeof path, "%s/weights/stage_%d.bin", stage_dir(), st->stage);
  agree(load_file(path, st->arena, st->weights_bytes, msg, sizeof msg) == 0, msg);
  open_data(&r);
  if (r.a.resume) load_checkpoint(&r, r.a.resume);
  int ns = st->nslots, ngs = st->ngslots;
  r.rreq = malloc(sizeof(MPI_Request) * (size_t)(ns * st->nrecv + 1));
  r.sreq = malloc(sizeof(MPI_Request) * (size_t)(ns * st->nsend + 1));
  r.greq = malloc(sizeof(MPI_Request) * (size_t)(ngs * st->nsend + 1));
  r.gsreq = malloc(sizeof(MPI_Request) * (size_t)(ngs * st->nrecv + 1));
  for (int i = 0; i < ns * st->nrecv; i++) r.rreq[i] = MPI_REQUEST_NULL;
  for (int i = 0; i < ns * st->nsend; i++) r.sreq[i] = MPI_REQUEST_NULL;
  for (int i = 0; i < ngs * st->nsend; i++) r.greq[i] = MPI_REQUEST_NULL;
  for (int i = 0; i < ngs * st->nrecv; i++) r.gsreq[i] = MPI_REQUEST_NULL;
  alloc_scratch(&r);
  /* The trace: one span per action, and room for waits; capped (a very long run keeps its first events). */
  if (r.a.trace) {
    int64_t cap = (r.a.steps - r.step) * st->nactions * 4 + 16;
    trace_init(&r.trace, cap < (1 << 22) ? cap : (1 << 22));
  }
  r.idx = malloc(sizeof(int64_t) * (size_t)st->batch);
  FILE *log = NULL;
  if (st->loss && r.a.log) {
    log = fopen(r.a.log, r.a.resume ? "a" : "w");
    if (!log) die(2, "cannot write --log %s: %s", r.a.log, strerror(errno));
    if (!r.a.resume) fprintf(log, "step,loss,samples_per_s,time_s\n");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  double t_start = now(), first_loss = NAN, last_loss = NAN;
  r.trace.start = t_start;
  int64_t first_step = r.step;
  for (; r.step < r.a.steps; r.step++) {
    double t0 = now(), loss = 0;
    if (r.have_data && r.data.kind != DATA_TOKENS)
      data_batch_indices(&r.data, r.step, st->batch, r.a.seed, r.a.shuffle, r.idx);
    for (int i = 0; i < st->nparams; i++) memset(st->arena + st->params[i].goffset, 0, (size_t)st->params[i].count * 4);
    for (int k = 0; k < st->nactions; k++) {
      const PrAction *a = &st->actions[k];
      double a0 = now();
      loss += run_action(&r, a);
      trace_add(&r.trace, a->kind, a->mb, a->kind == PR_SEND_GRAD || a->kind == PR_RECV_GRAD ? a->gslot : a->slot, r.step, a0, now());
    }
    double dt = now() - t0;
    if (st->loss) {
      loss /= (double)(st->loss_rows * st->microbatches);
      if (!isfinite(loss)) die(3, "step %lld: the loss is %s; stopping (lower --lr?)", (long long)r.step + 1, isnan(loss) ? "NaN" : "Inf");
      if (r.step == first_step) first_loss = loss;
      last_loss = loss;
      double elapsed = now() - t_start, sps = st->batch / dt;
      double eta = elapsed / (double)(r.step + 1 - first_step) * (double)(r.a.steps - r.step - 1);
      if (log) fprintf(log, "%lld,%.9g,%.1f,%.6f\n", (long long)r.step + 1, loss, sps, elapsed);
      if (!r.a.quiet)
        printf("step %lld/%lld  loss %.6f  %.1f samples/s  eta %.1f s\n", (long long)r.step + 1, (long long)r.a.steps, loss, sps, eta);
      fflush(stdout);
    }
    if (r.a.checkpoint && (r.step + 1) % r.a.ckpt_every == 0) {
      r.step++;
      save_checkpoint(&r, r.a.checkpoint);
      r.step--;
    }
  }
  /* Drain what is still in flight. */
  static const PrAction drain = {PR_UPDATE, -1, -1, -1};
  r.cur = &drain;
  wait_all(&r, r.sreq, ns * st->nsend);
  wait_all(&r, r.gsreq, ngs * st->nrecv);
  for (int i = 0; i < ns * st->nrecv; i++)
    if (r.rreq[i] != MPI_REQUEST_NULL) MPI_Cancel(&r.rreq[i]), MPI_Request_free(&r.rreq[i]);
  for (int i = 0; i < ngs * st->nsend; i++)
    if (r.greq[i] != MPI_REQUEST_NULL) MPI_Cancel(&r.greq[i]), MPI_Request_free(&r.greq[i]);
  r.t_total = now() - t_start;
  if (r.a.trace) {
    if (r.trace.dropped && g_rank == 0) fprintf(stderr, "piperun: the trace kept its first %lld events\n", (long long)r.trace.cap);
    if (trace_write(&r.trace, r.a.trace, g_rank, st->nstages) && g_rank == 0) fprintf(stderr, "piperun: cannot write --trace %s\n", r.a.trace);
    trace_free(&r.trace);
  }
  if (log) fclose(log);
  if (r.a.save) pr_save_onnx(st, r.a.save, stage_dir());
  /* The summary: every stage's compute, wait and memory, on the last stage. */
  /* Each rank's own wall time: another rank's would make comm+other negative. */
  double mine[5] = {r.t_compute, r.t_wait, (double)st->arena_bytes, st->predicted_bytes, r.t_total}, *all = NULL;
  if (st->loss) all = malloc(sizeof(double) * 5 * (size_t)st->nstages);
  MPI_Gather(mine, 5, MPI_DOUBLE, all, 5, MPI_DOUBLE, st->nstages - 1, MPI_COMM_WORLD);
  if (st->loss && !r.a.quiet) {
    int64_t steps = r.a.steps - first_step;
    double busy = 0;
    for (int s = 0; s < st->nstages; s++) busy += all[5 * s];
    printf("done: %lld steps in %.2f s, %.1f samples/s, loss %.6f -> %.6f\n", (long long)steps, r.t_total,
           steps ? (double)steps * st->batch / r.t_total : 0, first_loss, last_loss);
    printf("step time %.3f ms measured, %.3f ms predicted; bubble %.1f%% measured\n", steps ? 1e3 * r.t_total / (double)steps : 0,
           1e3 * st->predicted_step_s, r.t_total > 0 ? 100 * (1 - busy / (st->nstages * r.t_total)) : 0);
    printf("stage  compute_s  wait_s  comm+other_s  arena_bytes  predicted_bytes\n");
    for (int s = 0; s < st->nstages; s++) {
      const double *x = &all[5 * s];
      printf("%5d  %9.3f  %6.3f  %12.3f  %11.0f  %15.0f\n", s, x[0], x[1], fmax(0, x[4] - x[0] - x[1]), x[2], x[3]);
    }
  }
  free(all);
  if (r.have_data) data_close(&r.data);
  free(r.rreq), free(r.sreq), free(r.greq), free(r.gsreq), free(r.idx);
  free(r.in_labels), free(r.in_y), free(r.lab_x), free(r.lab_img);
  MPI_Finalize();
  return 0;
}
