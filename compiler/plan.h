/* plan.h - everything the compiler decides for one model: shapes, costs,
 * the partition and the schedule.  Built by plan_build, read by the
 * listing writer and (later) the emitters. */
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
  int partition;     /* --partition: PARTITION_DAG (the default) or PARTITION_CHAIN */
  int relay;         /* --route relay: a value crossing several cuts passes through every stage between */
  int fb_split;      /* --fb-split NF: pipefb's forward ranks (0: the planner chooses) */
  int poll;          /* --progress poll: the stage programs let MPI progress between nodes */
  const char *frozen; /* --frozen FILE: the first N parameterised layers' weights are constants (freeze.c) */
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
  int conv_fallback;      /* CONV_GEMM because no plan with oneDNN fit the memory limit (main.c) */
  int have_lr;            /* --lr given (0 is a learning rate too: only the running statistics move) */
  int threads;            /* --threads T: each rank computes on T threads (0 or 1: one) */
} Options;

/* How stages are cut (plan.c): the downset DP, which may reorder independent
 * nodes (dagpart.c), or ranges of the loaded node order alone. */
enum { PARTITION_DAG = 0, PARTITION_CHAIN = 1 };

enum { OFFLOAD_AUTO, OFFLOAD_NONE, OFFLOAD_PEER, OFFLOAD_FILE };

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
  PartProblem prob;
  Partition part;
  const char *part_note;   /* which partitioner decided the cuts, and why (the listing's "partition" line) */
  double chain_time;       /* the slowest stage of the loaded order's best cuts (0: not computed) */
  Schedule sched, slots; /* predicted timing, and the unit-time table */
  int64_t *arena;    /* per stage, once the stage programs are laid out (NULL before) */
  int *first_read, *last_read; /* per tensor: first and last compute node (k) reading it, -1 if none */
  int *nreaders;                /* per tensor: how many compute nodes read it (a weight read by several is tied) */
  char *needs;       /* per tensor: it needs a gradient (autodiff.c, built on first use) */
  struct StageProg *progs; /* per stage, laid out by plan_programs (NULL before, or if they cannot be built) */
  struct StageSpec *specs; /* per stage, what the renderers print and plan.json's messages state (spec_all; NULL before) */
  const char *mem_note;    /* NULL: each stage's memory is its arena; else why it is only the estimate */
  struct PriceMemo *memo;  /* exact prices of candidate stages (plan.c) */
  int floor_pricing;       /* no plain plan fits --mem-limit: candidates are priced as if every stashed value that may leave does */
  int *floor_nslots, *floor_nx; /* per stage, under floor pricing: ring slots and xslots of the leanest list */
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

/* Loads, infers, costs, partitions and schedules.  -1 with err_set on failure. */
int plan_build(Plan *p, const Options *o);
/* The same from a graph already in p->g (loaded from memory: the fuzzer), with p->opt set. */
int plan_from_graph(Plan *p);
/* Builds and lays out every stage's program and makes each stage's memory
 * in p->part.cost the arena's (the estimate is kept in mem_estimate).  -1
 * with err_set when a stage cannot be built; with --plan-only that is not an
 * error: the memory stays the estimate and p->mem_note says why. */
int plan_programs(Plan *p);
void plan_free(Plan *p);
/* Stage s's arena (p->arena[s]) and its breakdown in p->part.cost[s], from its laid-out program. */
void plan_stage_memory(Plan *p, int s);
/* The compute resources the schedule's simulation shares among the ranks: the host's cores over the
 * threads of each rank (--threads), at least 1; 0 when each rank has its own (cluster figures). */
int plan_core_groups(const Plan *p);
/* Stage s's memory limit: the smaller of --mem-limit and its rank's mem in --devices; 0 = none. */
double plan_stage_limit(const Plan *p, int s);
/* The step's predicted time and bubble under the spread of action times the
 * node costs measured (schedule_jitter; nothing without one).  After the
 * memory plan, which settles the lists.  0, or -1 with err_set. */
int plan_jitter(Plan *p);
/* Bytes the convolution library holds beside the arena for compute nodes [i, j) (0 under --conv gemm). */
double plan_lib_bytes(const Plan *p, int i, int j);
/* PipeFB (pipefb.c): chooses the forward ranks (or takes --fb-split), cuts
 * the forward and the backward chains, and schedules them; 0 or -1 with err_set. */
int pipefb_plan(Plan *p);
/* PipeFB's price of a rank holding compute nodes [i, j) in role ROLE_FWD or ROLE_BWD: its arena (memoised). */
double plan_price_role(Plan *p, int role, int i, int j);
/* The stash and weight messages between the programs of a pipefb plan. */
int pipefb_links(Plan *p, struct StageProg *progs, FbPlan *fb, Pool *pool);
/* Tied weights (a parameter several compute nodes read): the reading nodes'
 * positions k in compute order into ks (room for p->nreaders[t]); returns
 * how many.  *same_kind: two of them are the same op (two LayerNorms, two
 * Convs), the mark of an exporter that merged equal initializers. */
int plan_tie_readers(const Plan *p, int t, int *ks, int *same_kind);
/* freeze.c: the first N layers' weights become constants (-1 with err_set on a bad FILE); the
 * parameterised layers' positions into layers (room for N), their count; the backward's costs as
 * frozen weights leave them (bwdi / bwdw: measured seconds, or NULL). */
int freeze_apply(Plan *p);
int freeze_layers(const Plan *p, int *layers);
int freeze_layer_of(const Plan *p, int t);
void freeze_costs(Plan *p, double *bwd_flops, double *bwdi, double *bwdw);
/* Per tensor: whether its gradient is needed (a trained weight, or computed from one); cached. */
const char *plan_needs(Plan *p);
/* Whether compute nodes [a, e) read edge q's value (the loss counts on the last stage's range). */
int plan_reads_range(const Plan *p, int q, int a, int e);
/* Edge q's route through the ranks (rbegin/rend): its maker's rank (rank 0
 * for the loader's), then, with direct sends, each rank that reads it, else
 * every rank up to the last reader's.  Rank s's neighbours on it: the rank
 * it receives the value from and the rank it sends it on to (-1: none, or s
 * not on the route); gradients go the other way. */
void plan_route(const Plan *p, int q, int s, int *from, int *to);
/* --untie (untie.c): a weight read by nodes of one kind gets a copy per reader after the first. */
int untie_merged(Graph *g);
#endif
