/* profile.h - measured node times for the cost model.
 *
 * `pipecc --profile` puts a timing mark after each node's calls in the
 * stage programs (emit.c); `run.sh --profile FILE` writes what each node
 * took per micro-batch (runtime/profile.c); `pipecc --costs FILE` plans
 * with those times instead of FLOPs over the probed rate (docs/cost.md).
 * The file is untrusted text: every line is checked, and a profile of
 * another model is refused naming the first node that differs. */
#ifndef PIPECC_PROFILE_H
#define PIPECC_PROFILE_H
#include "ir.h"

/* Measured seconds per micro-batch at the plan's micro-batch size, on a
 * device of `rate` FLOP/s (the probe's when the profile was taken). */
typedef struct Costs {
  const char *path;
  double *fwd, *bwd_input, *bwd_weight; /* per compute node k */
  double load, loss;       /* the loader (stage 0) and the loss (last stage) */
  double update_per_param; /* the optimizer's seconds per trained float */
  double rate;
  int64_t profile_mb;      /* the micro-batch size it was measured at (times scale linearly to the plan's) */
  double jitter;           /* the actions' relative spread (the ranks' `jitter` lines, their mean); 0: not measured */
  int conv;                /* how its convolutions ran: 0 not said (none, or an older profile), 1 im2col + GEMM, 2 oneDNN */
  int conv_mismatch;       /* the plan runs them the other way: their times are the FLOP model's, and not merged */
  int threads;             /* the threads each rank computed on (pipecc --threads; 1 when the profile does not say) */
  /* The kernel cache (kcache.c).  Without --costs, path is NULL and these
   * say where the times came from: src[k] = 1 where node k's are the cache's
   * (else the FLOP model's), ncached of them; aux: how many of the loader,
   * the loss and the update were found there.  With --costs: merged, how
   * many entries the profile wrote into the cache (merge_note: why none). */
  const char *cache_path;
  char *src;               /* 1 the kernel cache's, 2 the op probe's (opcost.c), 0 the FLOP model's */
  int ncached, aux, merged;
  int nprobed;             /* nodes costed from the op probe's grid (ops_path: its cache) */
  int aux_probed;          /* of the loss and the update, how many the op probe costed (opcost_loss, opcost_update) */
  const char *ops_path;
  const char *merge_note;
} Costs;

/* "K OP NAME" of graph node `node`, the K-th compute node in the model's
 * own order (not the partition's, which --partition dag may change: a
 * profile taken at one -n plans another): the key of its line, with bytes
 * outside printable ASCII as '?', cut to PROFILE_KEY_MAX - 1 bytes (the
 * stage programs and the reader cut it alike). */
enum { PROFILE_KEY_MAX = 2048 };
void profile_key(const Graph *g, int node, char *out, size_t len);

struct Plan;
/* Reads path for the N compute nodes of p (p->node, p->mb_size set).
 * 0, or -1 with err_set naming the file, the line and what is wrong. */
int costs_load(Costs *c, const char *path, const struct Plan *p, Pool *pool);
#endif
