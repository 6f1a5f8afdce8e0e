/* optim.c - around the stage program's optimizer step (compiler/update.c):
 * the learning-rate schedule and the run's hyper-parameters into pr_opt,
 * the MPI exchange of tied weights' parts before the program sums them, and
 * the NaN/Inf checks.  The arithmetic is the program's calls, run where the
 * weights live. */
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "run.h"

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

/* A gradient (or weights) that is not finite stops the run, naming the element (x: device memory). */
static void check_finite(const Run *r, const char *what, const char *name, const float *x, int64_t n) {
  int64_t i = pr_dev_kernels.nonfinite(x, n);
  if (i < 0) return;
  float bad;
  pr_dev_to_host(&bad, (const unsigned char *)(x + i), sizeof bad);
  die(3, "step %lld: %s of '%s' is %s at element %lld; stopping (lower --lr?)", (long long)r->step + 1, what, name,
      isnan(bad) ? "NaN" : "Inf", (long long)i);
}

/* Tied weights: every stage holding one sends the parts it computed to the
 * other holders and receives theirs, then sums all parts in graph order, so
 * each copy gets the same gradient, bit for bit, and the same update. */
static int tie_tag(const PrParam *p, int part) {
  uint64_t h = 1469598103934665603ull;
  for (const char *c = p->name; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
  return TAG_SPAN + (int)(h % 4096) * 1024 + part % 1024; /* the same on every stage; messages of one pair keep their order */
}

/* Moves each tied weight's parts computed here to the other stages holding it, and theirs here; the
 * stage program's sum_ties() then adds them up in graph order. */
static void exchange_ties(Run *r) {
  const PrStage *st = r->st;
  for (int i = 0; i < st->nparams; i++) {
    const PrParam *p = &st->params[i];
    if (!p->nparts) continue;
    int bytes = (int)(p->count * 4), n = 0;
    MPI_Request *req = r->tie_req;
    for (int j = 0; j < p->nparts; j++) {
      unsigned char *dev = dev_at(r, p->parts[j].offset);
      if (p->parts[j].stage != st->stage) {
        unsigned char *buf = pr_dev_msg_in(dev, bytes);
        MPI_Irecv(buf, bytes, MPI_BYTE, p->parts[j].stage, tie_tag(p, j), g_pipe, &req[n++]);
        continue;
      }
      /* To every other holder, once each. */
      unsigned char *buf = pr_dev_msg_out(dev, bytes);
      for (int h = 0; h < p->nparts; h++) {
        int to = p->parts[h].stage, seen = to == st->stage;
        for (int e = 0; e < h && !seen; e++) seen = p->parts[e].stage == to;
        if (!seen) MPI_Isend(buf, bytes, MPI_BYTE, to, tie_tag(p, j), g_pipe, &req[n++]), r->sent_bytes += bytes;
      }
    }
    wait_all(r, req, n, -1, "to exchange a tied weight's gradient parts");
    for (int j = 0; j < p->nparts; j++)
      if (p->parts[j].stage != st->stage) pr_dev_msg_landed(dev_at(r, p->parts[j].offset), bytes);
  }
}

/* UPDATE: the tied sums, a check that every gradient is finite (naming the first weight that is not),
 * then the stage program's update() with this step's hyper-parameters in pr_opt. */
static void optimizer_step(Run *r) {
  const PrStage *st = r->st;
  pr_dev_sync(); /* the parts the backwards wrote are sent from device memory */
  exchange_ties(r);
  if (st->sum_ties) st->sum_ties();
  float mom = r->a.have_momentum ? (float)r->a.momentum : st->momentum;
  const float *gbase;
  int64_t lo, hi;
  replica_shard(r, &gbase, &lo, &hi); /* --zero 1: this replica's shard of the gradients, the only part summed here */
  for (int i = 0; i < st->nparams; i++) {
    const PrParam *p = &st->params[i];
    const float *g = (const float *)dev_at(r, p->goffset);
    int64_t at = g - gbase, a = lo > at ? lo - at : 0, b = hi - at < p->count ? hi - at : p->count;
    if (!p->grad_in_file && b > a) /* else the update's stream checks it (pr_optstore_check) */
      check_finite(r, "the gradient", p->name, g + a, b - a);
    if (st->optimizer == PR_SGD && mom != 0 && p->m1offset < 0 && !st->zero)
      die(2, "--momentum needs the optimizer state: compile with pipecc --momentum X");
  }
  pr_opt = (OptCtx){.lr = (float)lr_at(r, r->step), .momentum = mom,
                    .weight_decay = r->a.have_wd ? (float)r->a.weight_decay : st->weight_decay, .beta1 = st->beta1,
                    .beta2 = st->beta2, .eps = st->eps, .step = r->step, .grad_base = gbase, .shard_lo = lo, .shard_hi = hi};
  unsigned char *was = pr_weights;
  pr_weights = r->dev; /* async: the update writes the newest weights (the device's arena) */
  if (st->update) st->update();
  optstore_drain(r); /* --offload-optimizer: the state's last blocks are back in its file */
  replica_gather(r); /* --zero 1: the other replicas' new weights */
  pr_weights = was;
}

/* Nothing non-finite is written (a checkpoint, --save): resuming from NaN
 * weights could only reproduce them.  0, or -1 with msg naming the tensor. */
int weights_finite(const Run *r, const char *what, char *msg, size_t len) {
  const PrStage *st = r->st;
  for (int i = 0; i < st->nparams; i++) {
    const float *w = (const float *)dev_at(r, st->params[i].offset);
    int64_t k = pr_dev_kernels.nonfinite(w, st->params[i].count);
    if (k < 0) continue;
    float bad;
    pr_dev_to_host(&bad, (const unsigned char *)(w + k), sizeof bad);
    return snprintf(msg, len, "after step %lld: weight '%s' is %s at element %lld; not writing %s of non-finite weights",
                    (long long)r->step, st->params[i].name, isnan(bad) ? "NaN" : "Inf", (long long)k, what), -1;
  }
  return 0;
}

/* Weight gradients (and this stage's parts of tied ones) start each step at zero: the stage program's
 * zero_grads(). */
void zero_grads(Run *r) {
  if (r->st->zero_grads) r->st->zero_grads();
  optstore_fresh(r); /* --offload-optimizer: the gradients in the file start from zeros too */
}

/* UPDATE: the optimizer step, once the weights the last one sent have left. */
void do_update(Run *r) {
  const PrStage *st = r->st;
  wait_all(r, r->wreq, st->nwsend, -1, "to take the last step's weights"); /* pipefb: the update rewrites what they send */
  double t0 = now();
  /* async: the weights before this update stay, for the steps that compute on them; the update writes the newest. */
  if (st->nwversions) pr_dev_copy(dev_at(r, st->wversion_base + (r->step % st->nwversions) * st->wversion_bytes), dev_at(r, 0), st->weights_bytes);
  optimizer_step(r);
  r->nupdates = r->step + 1;
  r->prof.update += now() - t0;
}

/* The requests of the tied weights' part exchange: nparts * nstages at most. */
void optim_open(Run *r) {
  const PrStage *st = r->st;
  int most_parts = 1;
  for (int i = 0; i < st->nparams; i++) most_parts = st->params[i].nparts > most_parts ? st->params[i].nparts : most_parts;
  r->tie_req = malloc(sizeof(MPI_Request) * (size_t)most_parts * (size_t)st->nstages);
  if (!r->tie_req) die(2, "out of memory for the tied weights' requests%s", "");
}
