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
  int64_t batch;
  double mem_limit, lr, momentum, weight_decay;
} Options;

typedef struct Plan {
  Options opt;
  Graph g;
  int N;             /* live compute nodes */
  int *node;         /* node[k]: graph index of the k-th compute node */
  NodeCost *cost;    /* per compute node */
  PartEdge *edges;
  int *edge_tensor;  /* tensor index of each edge */
  int nedges;
  int64_t batch, mb_size;
  int nfolded;
  double params, opt_slots;
  Machine machine;
  PartProblem prob;
  Partition part;
  Schedule sched, slots; /* predicted timing, and the unit-time table */
  int64_t *arena;    /* per stage, once the stage programs are laid out (NULL before) */
} Plan;

/* Loads, infers, costs, partitions and schedules.  -1 with err_set on failure. */
int plan_build(Plan *p, const Options *o);
void plan_free(Plan *p);
#endif
