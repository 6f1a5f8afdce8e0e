/* replica.c - data-parallel replicas of the pipeline (pipecc --replicas R).
 *
 * R copies of the S-stage pipeline run side by side on S x R ranks, replica k
 * training samples [k B/R, (k+1) B/R) of each global batch.  Before a stage's
 * update, its weight gradients are summed over the stage's R ranks.  The sum
 * is the runtime's own (runtime/replica.c), not MPI's reduction, so that its
 * order is fixed: the weight-gradient region is cut into R shards, rank j
 * sums shard j as g_0 + g_1 + ... + g_{R-1} in replica order and sends the
 * sum to the others.  Every replica gets the same bits, and for a fixed R
 * every -n does too (each replica's gradients are already the same bits at
 * every -n; the sum is elementwise).
 *
 * This pass plans three things:
 *   - the actions: REDUCE right before the step's last weight-gradient action
 *     (B, or zb1's W) arms the buckets, and REDUCE_WAIT before the UPDATE
 *     finishes the sums (replica_actions; schedcheck.c checks where);
 *   - the buckets: the region in pieces of about REPLICA_BUCKET_BYTES, each
 *     posted by a k_grad_ready call in the backward right after the last call
 *     that writes its gradients, so that the exchange runs beside the rest of
 *     the last backward (replica_buckets);
 *   - the time the sum adds to the step, REDUCE_WAIT's (replica_costs).
 * The region that receives the other replicas' copies of a rank's shard,
 * (R - 1) shards, is laid out by memplan.c after the gradients. */
#include "replica.h"

#include "memplan.h"

#include <stdlib.h>
#include <string.h>

/* The index of the last action of rank s's list of kind B or W (a weight-gradient action), -1 none. */
static int last_grad_action(const Schedule *sc, int s) {
  int last = -1;
  for (int k = 0; k < sc->nact[s]; k++)
    if (sc->act[s][k].kind == ACT_B || sc->act[s][k].kind == ACT_W) last = k;
  return last;
}

void replica_actions(Schedule *sc, int replicas, Pool *pool) {
  sc->replicas = replicas > 1 ? replicas : 0;
  if (!sc->replicas || sc->forward_only) return;
  for (int s = 0; s < sc->nstages; s++) {
    int last = last_grad_action(sc, s), n = sc->nact[s];
    if (last < 0 || n < 1 || sc->act[s][n - 1].kind != ACT_UPDATE) continue;
    Action *out = pool_alloc(pool, sizeof(Action) * (size_t)(n + 2));
    int k = 0;
    for (int j = 0; j < n; j++) {
      if (j == last) out[k++] = action_make(ACT_REDUCE, -1);
      if (j == n - 1) out[k++] = action_make(ACT_REDUCE_WAIT, -1);
      out[k++] = sc->act[s][j];
    }
    sc->act[s] = out, sc->nact[s] = k;
  }
}

/* Seconds to sum `bytes` of stage s's gradients over R replicas of S stages: each rank sends (R - 1) shards and
 * receives as many, twice (the copies to their owners, the sums back), over the slowest link between its
 * replicas (world ranks s, S + s, ...: links s .. (R - 1) S + s - 1 of the S x R ranks' figures). */
static double sum_time(const Machine *m, int s, int S, double bytes, int R) {
  double bw = 0, lat = 0;
  for (int w = s; w < (R - 1) * S + s && w < MAX_RANKS; w++)
    if (m->link[w].bandwidth > 0 && (bw <= 0 || m->link[w].bandwidth < bw)) bw = m->link[w].bandwidth, lat = m->link[w].latency;
  if (!(bw > 0)) bw = m->memcpy_bw / 2, lat = 2e-6; /* no figure: a copy through shared memory, as the probe's fallback */
  if (!(bw > 0)) return 0;
  double moved = 2.0 * bytes * (R - 1) / R;
  /* The owner's sum reads R shards and writes one: memory-bound. */
  double add = m->memcpy_bw > 0 ? bytes * (R + 1) / R / m->memcpy_bw : 0;
  return moved / bw + 2.0 * (R - 1) * lat + add;
}

void replica_costs(const Plan *p, StageCost *c, int n) {
  int R = p->opt.replicas;
  for (int s = 0; s < n; s++) {
    c[s].reduce = c[s].reduce_total = 0;
    if (R <= 1 || !(c[s].mem_grads > 0)) continue;
    double t = sum_time(&p->rmachine, s, n, c[s].mem_grads / (1 + p->prob.reduce_share), R); /* the gradients, not the shards' room */
    /* The buckets' first half (the copies to their owners) runs beside the last micro-batch's backward
     * (its weight-gradient part under zb1); what it does not cover, and the sums' way back, wait. */
    double hide = sched_splits(p->opt.schedule) ? c[s].bwd_w : c[s].bwd;
    double exposed = t - hide > t / 2 ? t - hide : t / 2;
    c[s].reduce_total = t, c[s].reduce = exposed;
    /* --zero 1: each replica updates 1/R of the elements (however the update's time was found). */
    if (p->opt.zero) c[s].update /= R;
  }
}

/* Per gradient buffer: the last backward call that writes it (-1: none, it is ready when REDUCE arms). */
static int last_writer(const StageProg *sp, int b) {
  for (int j = sp->nbwd - 1; j >= 0; j--)
    for (int w = 0; w < sp->bwd[j].nwrites; w++)
      if (sp->bwd[j].writes[w] == b) return j;
  return -1;
}

static int by_offset(const void *x, const void *y, void *arg) {
  const Buffer *b = arg;
  int64_t a = b[*(const int *)x].offset, c = b[*(const int *)y].offset;
  return (a > c) - (a < c);
}

/* The buckets: the region [grad_lo, grad_hi) cut at gradient boundaries into pieces of about
 * REPLICA_BUCKET_BYTES from its end (the backward writes the last weights' gradients first), each ready
 * after the last writer of any gradient in it. */
static void make_buckets(StageProg *sp, Pool *pool, const int *ids, int n) {
  sp->buckets = pool_alloc(pool, sizeof(Bucket) * (size_t)(n + 1));
  sp->nbuckets = 0;
  int64_t hi = sp->grad_hi;
  int ready = -1;
  for (int q = n - 1; q >= 0; q--) {
    const Buffer *b = &sp->bufs[ids[q]];
    int w = last_writer(sp, ids[q]);
    if (w > ready) ready = w;
    int64_t lo = q ? b->offset : sp->grad_lo;
    if (hi - lo >= REPLICA_BUCKET_BYTES || q == 0) {
      sp->buckets[sp->nbuckets++] = (Bucket){lo, hi, ready};
      hi = lo, ready = -1;
    }
  }
}

/* The k_grad_ready calls: bucket b's after its ready call (in its phase: the W half's under zb1), those
 * ready before any call at the backward's start. */
static void add_ready_calls(StageProg *sp, Pool *pool) {
  Call *out = pool_alloc(pool, sizeof(Call) * (size_t)(sp->nbwd + sp->nbuckets + 1));
  int n = 0;
  for (int b = 0; b < sp->nbuckets; b++)
    if (sp->buckets[b].ready < 0)
      out[n++] = *call_new(sp, pool, PH_WGRAD, K_GRAD_READY, -1, pool_printf(pool, "bucket %d of the gradients is final", b),
                           (Arg[]){A_INT(b)}, 1);
  for (int j = 0; j < sp->nbwd; j++) {
    out[n++] = sp->bwd[j];
    for (int b = 0; b < sp->nbuckets; b++)
      if (sp->buckets[b].ready == j)
        out[n++] = *call_new(sp, pool, sp->bwd[j].phase == PH_IGRAD ? PH_IGRAD : PH_WGRAD, K_GRAD_READY, -1,
                             pool_printf(pool, "bucket %d of the gradients is final: its sum over the replicas starts", b),
                             (Arg[]){A_INT(b)}, 1);
  }
  sp->bwd = out, sp->nbwd = sp->capbwd = n;
}

void replica_buckets(const Plan *p, StageProg *sp, Pool *pool) {
  sp->nbuckets = 0;
  if (p->opt.replicas <= 1 || sp->grad_hi <= sp->grad_lo) return;
  int *ids = malloc(sizeof(int) * (size_t)(sp->nbufs + 1)), n = 0;
  if (!ids) abort();
  for (int i = 0; i < sp->nbufs; i++)
    if (sp->bufs[i].kind == BUF_PGRAD && !sp->bufs[i].unused && !sp->bufs[i].in_store) ids[n++] = i;
  qsort_r(ids, (size_t)n, sizeof(int), by_offset, sp->bufs);
  make_buckets(sp, pool, ids, n);
  free(ids);
  add_ready_calls(sp, pool);
}

/* --zero 1 (ZeRO stage 1): replica k keeps the optimizer state of shard k of the weight-gradient region
 * only, and updates only the weights' elements there; the new weights travel to the other replicas in the
 * shards' places of the region, where the gradients were (runtime/replica.c).  Each element gets the
 * update it gets without sharding, so the bits are the same. */
void replica_zero_state(const Plan *p, StageProg *sp, int slots, Pool *pool) {
  sp->zero = p->opt.zero && p->opt.replicas > 1;
  sp->zero_state[0] = sp->zero_state[1] = -1;
  if (!sp->zero) return;
  sp->shard_floats = replica_shard_floats(p->opt.replicas, sp);
  static const char *const names[2] = {"ZERO_M1", "ZERO_M2"};
  for (int k = 0; k < slots && k < 2; k++) sp->zero_state[k] = buf_add(sp, pool, names[k], BUF_OPT, sp->shard_floats * 4);
}
