/* replica.c - data-parallel replicas of the pipeline (pipecc --replicas R).
 *
 * R copies of the S-stage pipeline run side by side: world rank w is stage
 * w mod S of replica w / S.  Each replica's stages talk on a communicator of
 * their own (g_pipe, in which a rank's number is its stage, as the stage
 * tables assume), and each stage's R ranks on another (dcomm), over which
 * the weight gradients are summed before every update.
 *
 * The sum is ours, not MPI's reduction, so that its order is fixed whatever
 * MPI's algorithm: the gradient region [grad_lo, grad_hi) is cut into R
 * shards, replica j owns shard j, and the owner adds the R copies of it as
 * g_0 + g_1 + ... + g_{R-1}, in replica order, one element at a time; then
 * sends the sums to the others.  Every replica ends with the same bits, and
 * for a fixed R so does every -n.
 *
 * Overlap: the region is summed in buckets (compiler/replica.c).  REDUCE
 * arms them; the step's last backward, which follows it, calls
 * k_grad_ready(b) right after the last call writing bucket b's gradients,
 * and bucket b's copies leave for their owners then.  Whenever a bucket's
 * copies have all arrived (tested at each k_grad_ready and in REDUCE_WAIT),
 * its owner sums them and sends the sums back.  REDUCE_WAIT waits for the
 * rest: its time is the sum's exposed time, which the summary reports. */
#include <stdlib.h>
#include <string.h>

#include "run.h"

MPI_Comm g_pipe = MPI_COMM_WORLD;
int g_replica = 0, g_nreplicas = 1, g_world_rank = -1;

/* A bucket's state in this step: not posted, its copies on their way to the owners (phase 1), summed and the
 * sums on their way back (phase 2), done. */
enum { B_IDLE, B_TO_OWNERS, B_SUMMED, B_BACK, B_DONE };

typedef struct Red {
  Run *r;
  MPI_Comm dcomm;
  int R, me, armed;
  int64_t n, shard;     /* floats in the region, in one shard (the last may be shorter) */
  int *state;           /* per bucket, B_* */
  MPI_Request *req;     /* per bucket: 2 (R - 1) of phase 1 (sends, receives), then as many of phase 2 */
  double t_exposed;     /* REDUCE_WAIT's seconds, all steps */
} Red;
static Red g_red;

/* The world's size matches S x R and this rank's stage is its program's; then the communicators. */
int replica_start(const PrStage *st, int size) {
  int R = st->replicas > 1 ? st->replicas : 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_world_rank);
  if (size != st->nstages * R || g_world_rank % st->nstages != st->stage) {
    if (g_world_rank == 0)
      fprintf(stderr, "piperun: error: this is a %d-stage program%s%.0d%s; start it with run.sh (mpirun started %d ranks, stage %d got rank %d)\n",
              st->nstages, R > 1 ? " of " : "", R > 1 ? R : 0, R > 1 ? " replicas" : "", size, st->stage, g_world_rank);
    return -1;
  }
  g_nreplicas = R, g_replica = g_world_rank / st->nstages;
  if (R > 1) {
    MPI_Comm_split(MPI_COMM_WORLD, g_replica, st->stage, &g_pipe);
    MPI_Comm_split(MPI_COMM_WORLD, st->stage, g_replica, &g_red.dcomm);
    MPI_Comm_set_errhandler(g_pipe, MPI_ERRORS_ARE_FATAL);
    MPI_Comm_set_errhandler(g_red.dcomm, MPI_ERRORS_ARE_FATAL);
  }
  MPI_Comm_rank(g_pipe, &g_rank);
  return 0;
}

void replica_open(Run *r) {
  const PrStage *st = r->st;
  Red *d = &g_red;
  d->r = r, d->R = g_nreplicas, d->me = g_replica;
  if (d->R <= 1 || !st->nbuckets) return;
  d->n = (st->grad_hi - st->grad_lo) / 4, d->shard = st->shard_floats; /* the compiler's, as it laid the region out */
  if (d->shard * d->R < d->n) die(2, "the program's shard of %lld floats does not cover its gradients' %lld over %d replicas (regenerate with pipecc)",
                                   (long long)d->shard, (long long)d->n, d->R);
  d->state = calloc((size_t)st->nbuckets, sizeof(int));
  d->req = malloc(sizeof(MPI_Request) * (size_t)st->nbuckets * 4 * (size_t)(d->R - 1));
  if (!d->state || !d->req) die(2, "out of memory for the replicas' gradient buckets%s", "");
  for (int64_t i = 0; i < (int64_t)st->nbuckets * 4 * (d->R - 1); i++) d->req[i] = MPI_REQUEST_NULL;
}

/* Shard j: floats [*lo, *hi) of the region (the last one shorter). */
static void shard_of(const Red *d, int j, int64_t *lo, int64_t *hi) {
  *lo = (int64_t)j * d->shard, *hi = *lo + d->shard < d->n ? *lo + d->shard : d->n;
}

/* Bucket b's floats within shard j: [*lo, *hi) of the region (empty: lo >= hi). */
static void part_of(const Red *d, int b, int j, int64_t *lo, int64_t *hi) {
  const PrBucket *k = &d->r->st->buckets[b];
  int64_t blo = (k->lo - d->r->st->grad_lo) / 4, bhi = (k->hi - d->r->st->grad_lo) / 4, slo, shi;
  shard_of(d, j, &slo, &shi);
  *lo = blo > slo ? blo : slo, *hi = bhi < shi ? bhi : shi;
}

static float *region(const Red *d) { return (float *)dev_at(d->r, d->r->st->grad_lo); }
/* Where replica k's copy of this rank's shard lands (k != me). */
static float *piece(const Red *d, int k) { return (float *)dev_at(d->r, d->r->st->reduce_base) + (int64_t)(k < d->me ? k : k - 1) * d->shard; }
static MPI_Request *reqs(const Red *d, int b, int phase) { return d->req + ((int64_t)b * 2 + phase) * 2 * (d->R - 1); }

/* Phase 1: each other owner's part of bucket b goes to it; this rank's part comes from each other replica. */
static void post_to_owners(Red *d, int b) {
  MPI_Request *q = reqs(d, b, 0);
  int64_t lo, hi, mlo, mhi;
  part_of(d, b, d->me, &mlo, &mhi);
  for (int k = 0, n = 0; k < d->R; k++) {
    if (k == d->me) continue;
    part_of(d, b, k, &lo, &hi);
    if (hi > lo) MPI_Isend(region(d) + lo, (int)((hi - lo) * 4), MPI_BYTE, k, 2 * b, d->dcomm, &q[n]), d->r->sent_bytes += (double)(hi - lo) * 4;
    if (mhi > mlo) MPI_Irecv(piece(d, k) + (mlo - d->me * d->shard), (int)((mhi - mlo) * 4), MPI_BYTE, k, 2 * b, d->dcomm, &q[d->R - 1 + n]);
    n++;
  }
  d->state[b] = B_TO_OWNERS;
}

/* The owner's sum of its part of bucket b, in replica order, one element at a time. */
static void sum_part(Red *d, int b) {
  int64_t lo, hi;
  part_of(d, b, d->me, &lo, &hi);
  float *g = region(d);
  const float *v[1024];
  for (int k = 0; k < d->R; k++) v[k] = k == d->me ? g + d->me * d->shard : piece(d, k);
  for (int64_t x = lo - d->me * d->shard; x < hi - d->me * d->shard; x++) {
    float acc = v[0][x];
    for (int k = 1; k < d->R; k++) acc += v[k][x];
    g[d->me * d->shard + x] = acc;
  }
  d->state[b] = B_SUMMED;
}

/* Phase 2, once this rank's copies have left (its receives land where they were): the sum to every other
 * replica, theirs here. */
static void post_back(Red *d, int b) {
  MPI_Request *q = reqs(d, b, 1);
  int64_t lo, hi, mlo, mhi;
  part_of(d, b, d->me, &mlo, &mhi);
  for (int k = 0, n = 0; k < d->R; k++) {
    if (k == d->me) continue;
    part_of(d, b, k, &lo, &hi);
    if (mhi > mlo) MPI_Isend(region(d) + mlo, (int)((mhi - mlo) * 4), MPI_BYTE, k, 2 * b + 1, d->dcomm, &q[n]), d->r->sent_bytes += (double)(mhi - mlo) * 4;
    if (hi > lo) MPI_Irecv(region(d) + lo, (int)((hi - lo) * 4), MPI_BYTE, k, 2 * b + 1, d->dcomm, &q[d->R - 1 + n]);
    n++;
  }
  d->state[b] = B_BACK;
}

/* Moves every posted bucket as far as its messages allow; 1 when all are done. */
static int advance(Red *d) {
  int all = 1, nb = d->r->st->nbuckets, n = 2 * (d->R - 1), ok;
  for (int b = 0; b < nb; b++) {
    if (d->state[b] == B_TO_OWNERS) {
      MPI_Testall(d->R - 1, reqs(d, b, 0) + d->R - 1, &ok, MPI_STATUSES_IGNORE); /* the copies received */
      if (ok) sum_part(d, b);
    }
    if (d->state[b] == B_SUMMED) {
      MPI_Testall(d->R - 1, reqs(d, b, 0), &ok, MPI_STATUSES_IGNORE); /* this rank's copies left */
      if (ok && d->r->st->zero) d->state[b] = B_DONE; /* --zero 1: the update goes first; the new weights come back after */
      else if (ok) post_back(d, b);
    }
    if (d->state[b] == B_BACK) {
      MPI_Testall(n, reqs(d, b, 1), &ok, MPI_STATUSES_IGNORE);
      if (ok) d->state[b] = B_DONE;
    }
    all &= d->state[b] == B_DONE;
  }
  return all;
}

/* k_grad_ready (runtime/cpu/optim.h): bucket b is final in this backward; after a REDUCE, its exchange starts. */
void k_grad_ready(int b) {
  Red *d = &g_red;
  if (!d->armed || d->state[b] != B_IDLE) return;
  post_to_owners(d, b);
  advance(d);
}

/* REDUCE: the next weight-gradient action is the step's last; its k_grad_ready calls post the buckets. */
void do_reduce(Run *r) {
  Red *d = &g_red;
  if (d->R <= 1 || !r->st->nbuckets) return;
  memset(d->state, 0, sizeof(int) * (size_t)r->st->nbuckets);
  d->armed = 1;
}

/* REDUCE_WAIT: the buckets no backward posted, then every sum done (under the watchdog). */
void do_reduce_wait(Run *r) {
  Red *d = &g_red;
  if (d->R <= 1 || !r->st->nbuckets) return;
  double t0 = now();
  d->armed = 0;
  for (int b = 0; b < r->st->nbuckets; b++)
    if (d->state[b] == B_IDLE) post_to_owners(d, b);
  while (!advance(d)) {
    if (now() - t0 > r->timeout)
      die(4, "step %lld: no progress for %.1f s summing the weight gradients over the replicas of stage %d; a replica stopped or hung, "
             "stopping the job (run.sh --timeout S)", (long long)r->step + 1, r->timeout, r->st->stage);
    sched_yield();
  }
  double t1 = now();
  d->t_exposed += t1 - t0, r->t_wait += t1 - t0;
  trace_add(&r->trace, -1, -1, -1, r->step, t0, t1);
}

double replica_exposed(void) { return g_red.t_exposed; }

/* --zero 1: this replica's shard, [lo, hi) floats of the region, for the update's kernels (pr_opt). */
void replica_shard(const Run *r, const float **base, int64_t *lo, int64_t *hi) {
  const Red *d = &g_red;
  *base = (const float *)dev_at(r, r->st->grad_lo);
  *lo = 0, *hi = INT64_MAX;
  if (!r->st->zero || d->R <= 1) return;
  shard_of(d, d->me, lo, hi);
}

/* --zero 1, after the update: the new weights, which each replica wrote over its shard of the region, go to
 * the other replicas (every shard to every replica), and each weight's elements outside this replica's shard
 * are copied from the region into the weights. */
void replica_gather(Run *r) {
  Red *d = &g_red;
  const PrStage *st = r->st;
  if (!st->zero || d->R <= 1 || !st->nbuckets) return;
  double t0 = now();
  MPI_Request *q = d->req; /* the buckets' requests are all done by now */
  int n = 0;
  float *g = region(d);
  int64_t lo, hi, mlo, mhi;
  shard_of(d, d->me, &mlo, &mhi);
  for (int k = 0; k < d->R; k++) {
    shard_of(d, k, &lo, &hi);
    if (k == d->me || hi <= lo) continue;
    if (mhi > mlo) MPI_Isend(g + mlo, (int)((mhi - mlo) * 4), MPI_BYTE, k, 1 << 20, d->dcomm, &q[n++]), r->sent_bytes += (double)(mhi - mlo) * 4;
    MPI_Irecv(g + lo, (int)((hi - lo) * 4), MPI_BYTE, k, 1 << 20, d->dcomm, &q[n++]);
  }
  wait_watched(r, q, n, -1, "for the other replicas' new weights (--zero 1)");
  for (int i = 0; i < st->nparams; i++) {
    const PrParam *p = &st->params[i];
    if (p->goffset < 0) continue;
    int64_t at = (p->goffset - st->grad_lo) / 4;
    float *w = (float *)dev_at(r, p->offset);
    /* The parts before and after this replica's shard. */
    int64_t a0 = at, a1 = at + p->count < mlo ? at + p->count : mlo, b0 = at > mhi ? at : mhi, b1 = at + p->count;
    if (a1 > a0) memcpy(w + (a0 - at), g + a0, sizeof(float) * (size_t)(a1 - a0));
    if (b1 > b0) memcpy(w + (b0 - at), g + b0, sizeof(float) * (size_t)(b1 - b0));
  }
  double t1 = now();
  d->t_exposed += t1 - t0, r->t_wait += t1 - t0;
}

/* The step's loss (and --val's hits, unless NULL) over the whole batch: every replica's, added in replica order
 * on replica 0's loss rank, which reports; the other replicas' loss ranks keep their own. */
void replica_sums(double *loss, double *hits) {
  if (g_nreplicas <= 1) return;
  double mine[2] = {*loss, hits ? *hits : 0}, all[2 * 1024];
  MPI_Gather(mine, 2, MPI_DOUBLE, all, 2, MPI_DOUBLE, 0, g_red.dcomm);
  if (g_replica) return;
  *loss = all[0];
  for (int k = 1; k < g_nreplicas; k++) *loss += all[2 * k];
  if (!hits) return;
  *hits = all[1];
  for (int k = 1; k < g_nreplicas; k++) *hits += all[2 * k + 1];
}

/* The samples of replica g_replica's share, idx[0 .. batch) of the global batch's indices (idx has room for
 * all of them, batch x replicas). */
void replica_indices(int64_t *idx, int batch) {
  if (g_nreplicas > 1 && g_replica) memmove(idx, idx + (int64_t)g_replica * batch, sizeof(int64_t) * (size_t)batch);
}

void replica_close(void) {
  Red *d = &g_red;
  free(d->state), free(d->req);
  d->state = NULL, d->req = NULL;
  if (g_nreplicas > 1) MPI_Comm_free(&d->dcomm), MPI_Comm_free(&g_pipe);
}
