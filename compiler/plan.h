/* plan.h - everything the compiler decides for one model: shapes, costs,
 * the partition and the schedule, as types only.  The passes that fill a
 * Plan are run in order by driver.c; planq.h answers questions about one,
 * price.h prices candidate stages. */
#ifndef PIPECC_PLAN_H
#define PIPECC_PLAN_H
#include "schedule.h"

typedef struct Options {
  const char *model, *outdir, *devices, *optimizer;
  int nstages, microbatches, schedule, listing, dump_shapes, plan_only;
  int forward_only;  /* an inference program: no loss, no backward (conformance tests) */
  int loss_mse;      /* MSE against one-hot labels instead of softmax cross-entropy */
  int untie;         /* --untie: a weight nodes of one kind share gets a copy per reader (untie.c) */
  int no_fuse;       /* --no-fuse: every node its own call (fuse.c) */
  int offload;       /* --offload: OFFLOAD_* */
  const char *offload_dir; /* --offload file:DIR */
  int recompute;     /* --recompute auto (1) or none (0) */
  int opt_offload;   /* --offload-optimizer: OPTOFF_* (optstore.c) */
  const char *opt_offload_dir; /* --offload-optimizer file:DIR */
  int partition;     /* --partition: PARTITION_DAG (the default) or PARTITION_CHAIN */
  int split_layout;  /* --split-layout (zb1, zbv): SPLIT_AUTO (the default: each stage the smaller), SPLIT_LATE, SPLIT_HOLD */
  int relay;         /* --route relay: a value crossing several cuts passes through every stage between */
  int fb_split;      /* --fb-split NF: pipefb's forward ranks (0: the planner chooses) */
  int poll;          /* --progress poll: the stage programs let MPI progress between nodes */
  const char *frozen; /* --frozen FILE: the first N parameterised layers' weights are constants (freeze.c) */
  const char **constants; /* --constant NAME[,NAME...], each flag's value: initializers that are constants, never trained */
  int nconstants;
  /* The command line (without the model, -o and --frozen), written into run.sh so that a freeze
   * event can plan the frozen model the same way (FreezePipe's re-planning). */
  const char *const *args;
  int nargs;
  int staleness;     /* --staleness K: async's weight delay (0: not given; async's default is 1) */
  int profile;       /* --profile: timing marks in the stage programs (run.sh --profile FILE) */
  const char *costs; /* --costs FILE: measured node times to plan with (profile.c) */
  int64_t batch;
  double mem_limit, lr, momentum, weight_decay;
  int conv_impl;          /* --conv: CONV_AUTO, CONV_GEMM, CONV_DNNL (ir.h) */
  int conv_fallback;      /* CONV_GEMM because no plan with oneDNN fit the memory limit (driver.c) */
  int have_lr;            /* --lr given (0 is a learning rate too: only the running statistics move) */
  int threads;            /* --threads T: each rank computes on T threads (0 or 1: one) */
  const char *target;     /* --target: the device the stages are rendered for ("cpu", "cuda"; render.c) */
  int precision;          /* --precision: PREC_FP32, PREC_TF32, PREC_BF16 (the GPU's matrix products) */
  /* --chunks V (interleaved, zbv): nstages is the V x nranks stages the model is cut into, rank r running
   * V of them (schedule.h, sched_stage); nranks is -n.  Every other schedule: chunks 1, nranks = nstages. */
  int chunks, nranks;
  /* --replicas R: R copies of the S-stage pipeline side by side (S x R ranks), each training batch / R of
   * the global batch, their weight gradients summed across a stage's R ranks before the update (replica.c). */
  int replicas;
  /* --ranks P: the planner chooses -n and --replicas (layout.c); every layout it compared, the one kept. */
  int ranks, nstages_given;
  int zero;          /* --zero 1: the optimizer state sharded over the replicas (replica.c) */
  int zero_given;    /* --zero given (else --ranks may shard where a layout does not fit --mem-limit otherwise) */
  const struct LayoutCand *layouts;
  int nlayouts, layout_kept;
  int schedule_auto;      /* --schedule auto: each synchronous schedule planned, the fastest that fits kept (driver.c) */
  const struct SchedCand *cands; /* ... what each candidate's plan predicted, for the listing */
  int ncands;
} Options;

/* The ranks (programs) of a plan: -n, whichever the stage count. */
static inline int opt_ranks(const Options *o) { return o->chunks > 1 ? o->nranks : o->nstages; }

/* --schedule auto's candidates: one plan each, its predicted step, bubble and busiest arena, or why it
 * did not plan (over --mem-limit, a refusal). */
typedef struct SchedCand {
  int kind;        /* SCHED_GPIPE, SCHED_1F1B, SCHED_ZB1, SCHED_INTERLEAVED, SCHED_ZBV */
  int chunks;      /* the chunked ones: stages per rank (2) */
  int fits;
  double step, bubble;
  int64_t peak;    /* the busiest stage's arena (bytes) */
  char why[240];   /* when it does not fit */
} SchedCand;

/* --precision, numbered as the runtime's PR_PREC_* (runtime/cuda/precision.h). */
enum { PREC_FP32 = 0, PREC_TF32 = 1, PREC_BF16 = 2 };

/* How stages are cut (cut.c): the downset DP, which may reorder independent
 * nodes (dagpart.c), or ranges of the loaded node order alone. */
enum { PARTITION_DAG = 0, PARTITION_CHAIN = 1 };
enum { SPLIT_AUTO = 0, SPLIT_LATE = 1, SPLIT_HOLD = 2 };

enum { OFFLOAD_AUTO, OFFLOAD_NONE, OFFLOAD_PEER, OFFLOAD_FILE };
/* --offload-optimizer: where a stage's optimizer state may live between updates to fit --mem-limit. */
enum { OPTOFF_NONE, OPTOFF_FILE };

/* What a rank's program runs: forwards and backwards (every schedule but
 * pipefb), or under pipefb only forwards or only backwards. */
enum { ROLE_BOTH = 0, ROLE_FWD = 1, ROLE_BWD = 2 };

/* PipeFB (pipefb.c): a stashed value per micro-batch, from the forward rank
 * that has it to the backward rank that needs it (id: its index, the same on
 * both ends); a weight, from the backward rank that updates it to a forward
 * rank that reads it. */
typedef struct FbMsg {
  int tensor, from, to, id;
  int dloss;         /* the gradient of the logits, which the loss (on the last forward rank) computes */
} FbMsg;
typedef struct FbPlan {
  FbLinks links;
  FbMsg *stash, *w;
  int nstash, nw;
  double *stash_bytes; /* per rank: stash bytes sent (forward) or received (backward) per micro-batch */
} FbPlan;

typedef struct Plan {
  Options opt;
  const char *conv_note; /* how convolutions run and what they hold outside the arena (the listing) */
  Graph g;
  int N;             /* live compute nodes */
  int *node;         /* node[k]: graph index of the k-th compute node */
  NodeCost *cost;    /* per compute node */
  PartEdge *edges;
  int *edge_tensor;  /* tensor index of each edge */
  int nedges;
  /* Per edge: the positions of the nodes reading it, ascending (the loss
   * counts as a reader at N-1, on the last stage), and the spans between
   * its producer and readers that skip nodes (the partitioner's pricing of
   * direct sends). */
  int **ereaders, *nereaders;
  PartGap *gaps;
  int ngaps;
  int direct;        /* values travel only between the stages that make or read them (not --route relay, not pipefb) */
  /* --frozen (freeze.c): the parameterised layers (graph ids of the compute nodes reading a trained weight,
   * in the loaded order), how many of them are frozen, and the weights that became constants. */
  int *frozen_layers, nlayers, nfrozen, frozen_params;
  int64_t batch, mb_size;
  int nfolded;
  int nfused;        /* nodes fuse.c absorbed into another */
  double params, opt_slots;
  Machine machine;
  Machine rmachine;    /* --replicas R: the figures of all S x R ranks (world rank k S + s runs stage s of replica k), whose links
                        * the sums over the replicas cross (replica.c) */
  PartProblem prob;
  Partition part;
  const char *part_note;   /* which partitioner decided the cuts, and why (the listing's "partition" line) */
  double chain_time;       /* the slowest stage of the loaded order's best cuts (0: not computed) */
  Schedule sched, slots; /* predicted timing, and the unit-time table */
  StageCost *unit;       /* the unit times the table is timed with (pass_partition) */
  int64_t *arena;    /* per stage, once the stage programs are laid out (NULL before) */
  int *first_read, *last_read; /* per tensor: first and last compute node (k) reading it, -1 if none */
  int *nreaders;                /* per tensor: how many compute nodes read it (a weight read by several is tied) */
  char *needs;       /* per tensor: it needs a gradient (plan_needs, planq.c, built on first use) */
  struct StageProg *progs; /* per stage, laid out by plan_programs (driver.c) (NULL before, or if they cannot be built) */
  /* --chunks V: per rank, its stages' programs joined and laid out (chunks.c), and their arenas; the specs
   * and the emitted sources are these (NULL with one stage per rank: progs and arena are the ranks'). */
  struct StageProg *rprogs;
  int64_t *rarena;
  struct StageSpec *specs; /* per stage, what the renderers print and plan.json's messages state (spec_all; NULL before) */
  const char *mem_note;    /* NULL: each stage's memory is its arena; else why it is only the estimate */
  struct PriceMemo *memo;  /* exact prices of candidate stages (price.c) */
  int floor_pricing;       /* no plain plan fits --mem-limit: candidates are priced as if every stashed value that may leave does */
  RingSizes *floor_rings;       /* per stage, under floor pricing: ring sizes of the leanest list (at 2 s + 1: with its received values leaving) */
  int *floor_nx;                /* ... and its xslots */
  /* The memory plan (stash.c): each stage's arena and the step before it, the
   * rank holding each stage's offloaded values (-1), the file bandwidth used. */
  int64_t *plain_arena;
  double plain_step, file_bw;
  int *host_of;
  struct Costs *costs;     /* --costs: the measured times (NULL: FLOPs over the machine's rate) */
  /* Each rank's program: the compute nodes [rbegin, rend) and its role. */
  int *rbegin, *rend, *role;
  FbPlan *fb;              /* pipefb's links and messages (NULL for the other schedules) */
} Plan;

#endif
