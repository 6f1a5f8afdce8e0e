/* partition.h - splitting the topologically ordered nodes into n contiguous
 * stages, optimally, by dynamic programming.
 *
 * The problem is stated over plain numbers so that tests can build random
 * instances and check the DP against brute force. */
#ifndef PIPECC_PARTITION_H
#define PIPECC_PARTITION_H
#include "cost.h"

enum { SCHED_GPIPE = 0, SCHED_1F1B = 1, SCHED_ZB1 = 2, SCHED_PIPEFB = 3 /* forwards and backwards on different ranks (pipefb.c) */,
       SCHED_ASYNC = 4 /* 1F1B that never drains: step t runs on the weights of step t - K (schedasync.c) */,
       SCHED_INTERLEAVED = 5 /* Megatron-LM's interleaved 1F1B: each rank runs V stages (chunks), round-robin */,
       SCHED_ZBV = 6 /* ZB-V (zero bubble, V-shaped): two chunks per rank, rank r holding stages r and 2n-1-r */ };

/* The schedules that split a backward into its input-gradient (I) and weight-gradient (W) halves. */
static inline int sched_splits(int kind) { return kind == SCHED_ZB1 || kind == SCHED_ZBV; }
/* The schedules that run several stages (chunks) on each rank. */
static inline int sched_chunked(int kind) { return kind == SCHED_INTERLEAVED || kind == SCHED_ZBV; }

/* A value crossing from the node that makes it to the last node that reads
 * it.  from = -1: the data loader (stage 0); to = N: the loss (last stage). */
typedef struct PartEdge {
  int from, to;
  double bytes;      /* forward activation bytes */
  double grad_bytes; /* bytes of its gradient sent back (0 for integer data) */
} PartEdge;

/* A value made (or read) at node lo and next read at node hi > lo + 1: a
 * stage [i, j) with lo < i and j <= hi holds none of its readers, and with
 * direct sends neither receives nor sends it (with relays it passes it on). */
typedef struct PartGap {
  int lo, hi;
  double bytes, grad_bytes;
} PartGap;

typedef struct PartProblem {
  int N;                        /* compute nodes */
  const double *fwd_flops, *bwd_flops, *traffic; /* per node, per micro-batch */
  const double *param_bytes, *stash_bytes;
  const double *work_bytes;     /* bound on a node's temporaries, workspace and constants (summed per stage) */
  const PartEdge *edges;
  int nedges;
  int nstages, microbatches, schedule;
  double opt_state_per_param; /* optimizer slots per parameter: sgd 0, momentum 1, adam 2 */
  double zero_share;          /* --zero 1: 1/R, the part of the optimizer state (and of the update) a replica has; else 1 */
  double reduce_share;        /* --replicas R: (R - 1) / R, the other replicas' shards a rank sums, per gradient byte */
  const Machine *machine;
  double mem_limit;             /* per rank, bytes; 0 = none beyond the devices' own */
  /* The exact memory of stage s holding [i, j): the arena its program lays
   * out.  When given, the DP prices candidates with it (lazily: only where a
   * limit applies and the candidate could be chosen, after the lower bound
   * below) and the closed-form estimate is not used for decisions.  NULL:
   * the estimate (tests of the DP alone). */
  double (*stage_mem)(void *ctx, int s, int i, int j);
  void *mem_ctx;
  const int *ring_copies;       /* with stage_mem, per stage: ring slots of the schedule (for the lower bound) */
  double param_copies;          /* with stage_mem: weight + gradient + optimizer bytes per parameter byte */
  /* With stage_mem, for the lower bound: activations backward keeps, each
   * made by node `from` and read by the backward of node `to` (the first
   * such reader), so kept by any stage holding both. */
  const PartEdge *stash;
  int nstash;
  /* Measured seconds per node and micro-batch (pipecc --costs, profile.c)
   * on a device of time_rate FLOP/s: the forward, the backward's
   * input-gradient and weight-gradient parts; the loader's and the loss's
   * seconds; the optimizer's per parameter byte.  NULL: times come from
   * the FLOPs, the traffic and the machine. */
  const double *fwd_s, *bwdi_s, *bwdw_s;
  double time_rate, load_s, loss_s, update_per_byte;
  int only;                     /* PART_BOTH; pipefb prices its forward chain by forwards alone, its backward chain by backwards */
  const PartGap *gaps;          /* direct sends: values a stage may skip (NULL: every value crossing a cut is relayed) */
  int ngaps;
  int blocks;                   /* PART_BLOCKS_AUTO: a long order is planned over blocks first (partition_solve) */
  double exact_evals;           /* the exact DP's bound in stage costs (0: PART_EXACT_EVALS; tests set less) */
} PartProblem;

enum { PART_BOTH = 0, PART_FORWARD = 1, PART_BACKWARD = 2 };
/* The exact DP takes about n N^2 / 2 stage costs.  Past PART_EXACT_EVALS of them (AUTO), the order is
 * cut into blocks of about equal work, planned over their boundaries, then planned exactly again
 * within two blocks of each cut chosen: near-linear, and optimal among the cuts in those windows.
 * NEVER and ALWAYS are for tests. */
enum { PART_BLOCKS_AUTO = 0, PART_BLOCKS_NEVER = 1, PART_BLOCKS_ALWAYS = 2 };

typedef struct StageCost {
  double fwd, bwd;              /* compute seconds per micro-batch */
  double bwd_w;                 /* of bwd, the weight-gradient part (zb1's W; the rest is I) */
  double comm;                  /* seconds per micro-batch sending/receiving */
  double time;                  /* fwd + bwd + comm */
  double mem_params, mem_grads, mem_opt, mem_stash, mem_recv, mem_work, mem_total;
  double mem_estimate;          /* the closed-form estimate of mem_total (part_stage_cost); once the stage
                                   programs are laid out, mem_* above are their arena's (plan_programs) */
  int inflight;                 /* micro-batches whose activations are held at once */
  int copies;                   /* ring copies the arena keeps: inflight + 1 (at most m), so receives post early */
  int gcopies;                  /* gradient ring copies: 2, or under zb1 as many as ring copies (W reads the gradient late) */
  int wcopies;                  /* zb1, zbv: late-value copies (what W reads of the forward, held from F to W); 0 otherwise */
  double recv_bytes, send_bytes;/* forward activations per micro-batch */
  /* The memory plan's (stash.c), per micro-batch: seconds to copy the
   * offloaded values out and back in, and to recompute the recomputed ones. */
  double xfer_out, xfer_in, recompute;
  double update;                /* seconds of the optimizer step (once per step) */
  double opt_stream;            /* of update: what streaming the optimizer state from its file adds (optstore.c) */
  double grad_stream;           /* of bwd (and bwd_w): what waiting for stored gradients adds per micro-batch */
  double mem_versions;          /* async: the older weight versions (schedasync.c) */
  double reduce;                /* --replicas: the gradients' sum over replicas that the last backward does not hide (REDUCE_WAIT) */
  double reduce_total;          /* ... and all of its time */
} StageCost;

typedef struct Partition {
  int *start;                   /* nstages + 1 boundaries: stage s holds nodes [start[s], start[s+1]) */
  double max_time;
  StageCost *cost;
  int blocks;                   /* 0: the exact DP; else the blocks the order was first planned over */
  int budget_spent;             /* under a memory limit, past PART_BUILD_WORK: candidates fitted by their estimate */
} Partition;

/* What a stage's cost depends on at each of its two cuts: the sums of the
 * per-node figures over every node before the cut, and what crosses it.  A
 * stage is the nodes between two cuts, so its cost is a function of the two
 * (part_cost_sums): for a range [i, j) of the order they are prefix sums
 * (part_stage_cost), for a set of nodes closed under predecessors the sums
 * over that set (the downset DP, dagpart.c). */
typedef struct PartSums {
  double fwd, bwd, traffic, param, stash, work; /* FLOPs, bytes */
  double fs, bis, bws;                          /* measured seconds (fwd_s, bwdi_s, bwdw_s), if any */
  double cut_bytes, cut_grad, cut_count;        /* values crossing the cut, their gradients' bytes, how many */
  double pass_bytes, pass_grad, pass_count;     /* hi only: of those, the ones a direct-send stage [lo, hi) skips */
  int first, last;                              /* the cut before every node (the loader's), after every node (the loss's) */
} PartSums;
/* Stage s between the cuts lo and hi (lo's nodes are a subset of hi's). */
void part_cost_sums(const PartProblem *p, int s, const PartSums *lo, const PartSums *hi, StageCost *out);

/* Per-stage cost of nodes [i, j) on stage s; boundary bytes must be ready
 * (part_prepare). */
typedef struct PartCtx PartCtx;
PartCtx *part_prepare(const PartProblem *p);
void part_ctx_free(PartCtx *c);
void part_stage_cost(const PartCtx *c, int s, int i, int j, StageCost *out);
/* The memory the DP decides with: stage_mem if given, else the estimate. */
double part_stage_mem(const PartCtx *c, int s, int i, int j);
/* Stage s's memory limit: the smaller of mem_limit and its rank's own; 0 = none. */
double part_stage_limit(const PartProblem *p, int s);
/* Seconds of node k's forward on stage s's rank, per micro-batch. */
double part_node_fwd(const PartProblem *p, int s, int k);
/* Bytes of everything crossing the cut before node b (1 <= b < N). */
double part_boundary_bytes(const PartCtx *c, int b);

/* Solves; returns 0, or -1 with err_set saying the smallest memory limit that
 * would fit (and out->max_time holding it, in bytes).  out->start and
 * out->cost are allocated from pool. */
int partition_solve(const PartProblem *p, Partition *out, Pool *pool);
/* Stage costs priced so far (part_stage_cost), for tests that count the DP's work. */
extern double part_evals;

/* Micro-batches stage s holds at once under the schedule, and the ring
 * copies its arena keeps for them: the partitioner's bounds, before the
 * action lists exist.  The lists' own simulation sizes the real rings
 * (schedule.c), never larger than these (tests/test_schedule.c). */
int stage_inflight(int schedule, int s, int nstages, int m);
int stage_copies(int schedule, int s, int nstages, int m);
int stage_gcopies(int schedule, int s, int nstages, int m);
#endif
