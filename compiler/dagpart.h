/* dagpart.h - the partition over the graph's downsets rather than over one
 * topological order.
 *
 * A downset is a set of compute nodes closed under predecessors.  A plan of
 * n stages is a chain of downsets {} = D_0 < D_1 < ... < D_n = all nodes,
 * stage s holding D_{s+1} \ D_s; every such chain is a set of contiguous
 * ranges of some topological order (D_1's nodes, then D_2 \ D_1's, ...), so
 * the result is that order and its cuts, and the rest of the compiler keeps
 * working on ranges.  The objective is partition.c's (the slowest stage's
 * time, each stage's memory estimate within its rank's limit): a stage's
 * cost depends only on the sums over its two downsets and on what crosses
 * each (part_cost_sums), so a transition costs O(1).
 *
 * The problem is stated over plain numbers, like partition.h's, so tests
 * can check it against brute force over every convex assignment. */
#ifndef PIPECC_DAGPART_H
#define PIPECC_DAGPART_H
#include "partition.h"

/* Downsets enumerated before the graph is coarsened, then given up on: the
 * transitions grow with their square (about 0.2 s at 5000 on a 2-core VM,
 * 2-4 s at 17000). */
enum { DAG_MAX_STATES = 5000 };

typedef struct DagProblem {
  /* Per-node figures, the values (edges: from = the producer, -1 the loader;
   * to = N when the loss reads it), stages, machine and memory limit, with
   * nodes numbered in a topological order.  stage_mem is not used: a stage
   * here is a set, and the arena is built for ranges (the caller prices the
   * ranges of the order found, partition_solve). */
  const PartProblem *p;
  /* Who reads each value: use_node[u] reads edges[use_edge[u]].  These
   * readers, not the edges' last reader, make the DAG. */
  const int *use_edge, *use_node;
  int nuse;
  /* More precedences: node keep_a[q] stays before keep_b[q] (a < b).  The
   * compiler keeps the readers of one value in their order, so that the
   * gradient contributions are summed in the same order on every plan. */
  const int *keep_a, *keep_b;
  int nkeep;
  int max_states; /* 0: DAG_MAX_STATES */
} DagProblem;

typedef struct DagResult {
  int ok;          /* 0: even with chains contracted the graph has more than max_states downsets (or fewer units
                      than stages); nothing else is set */
  int coarse;      /* the downsets are of the graph with its chains contracted (a chain's nodes stay in one stage) */
  int states;      /* downsets enumerated */
  int *order;      /* N: order[q] = the node placed q-th; each stage's nodes in their original order */
  int *start;      /* nstages + 1 cuts in that order */
  double max_time; /* the slowest stage's time; INFINITY when no chain fits the memory limits */
} DagResult;

/* 0, or -1 with err_set on a bad problem (more stages than nodes). */
int dagpart_solve(const DagProblem *d, DagResult *out, Pool *pool);
#endif
