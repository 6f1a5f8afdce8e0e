/* cost.h - what each node costs and what each rank can do.
 *
 * Node costs are per micro-batch: FLOPs forward and backward, parameter
 * bytes, output bytes and the bytes backward keeps (the stash).  Machine
 * figures come from a probe of this machine (machine_probe in cost.c, the
 * MPI link by bin/pipecc-probe from tools/probe_mpi.c; cached in
 * ~/.cache/pipecc/machine.txt or $PIPECC_CACHE) or from a --devices file
 * that describes each rank and link. */
#ifndef PIPECC_COST_H
#define PIPECC_COST_H
#include "ir.h"

typedef struct NodeCost {
  double fwd_flops, bwd_flops;
  double param_count, param_bytes;
  double out_bytes;   /* every output of the node */
  double stash_bytes; /* outputs that some backward needs, charged to their producer */
  double work_bytes;  /* scratch the kernel needs (im2col) */
  double traffic_bytes; /* memory the forward reads and writes, for memory-bound ops */
} NodeCost;

#define MAX_RANKS 1024

typedef struct Device {
  double flops;     /* sustained FLOP/s on this model's kernels */
  double mem_bytes; /* usable memory; 0 = unlimited */
} Device;

typedef struct Link {
  double bandwidth; /* bytes/s */
  double latency;   /* seconds per message */
} Link;

typedef struct Machine {
  int nranks;       /* how many ranks the figures describe; the last repeats */
  Device dev[MAX_RANKS];
  Link link[MAX_RANKS]; /* link[s]: between rank s and s+1 */
  double memcpy_bw;
  int cores;        /* cores the ranks share (all on one host; schedule_time); 0: each rank has a core of its own */
  const char *source; /* "probe of this machine ..., cached in PATH", "--devices FILE" */
} Machine;

/* Fills c[j] for every node of g (folded nodes cost nothing). */
void cost_nodes(Graph *g, NodeCost *c);

/* Machine figures for n ranks: from `devices_file` if given, else the cached
 * probe (running it when there is no cache).  -1 with err_set on a bad file. */
int machine_load(Machine *m, int n, const char *devices_file, Pool *pool);
/* --chunks V: the figures of n ranks (m) spread over the S = V n stages they run, rank_of[s] being stage s's
 * rank: a stage computes at its rank's rate with 1/V of its memory, and the link after stage s is the path
 * between the two ranks (its slowest bandwidth, its largest latency), or a memory copy within one rank. */
void machine_spread(Machine *m, const int *rank_of, int S, int V);
/* Parses a devices description (see docs/devices.md); exposed for tests. */
int machine_parse(Machine *m, int n, const char *text, const char *name);
/* This machine's identity as its cached probe gives it (CPU model, cores,
 * BLAS kernels): the kernel cache's section key.  NULL when the
 * machine cache is missing or not valid.  *flops: the probed rate. */
const char *machine_identity(Pool *pool, double *flops);
/* The machine cache's path: $PIPECC_CACHE, else ~/.cache/pipecc/machine.txt. */
const char *machine_cache_path(char *buf, size_t len);
/* A cache file beside the machine cache: $ENV_NAME if set (NULL when it is "off"), else NAME.txt in the machine
 * cache's directory (kernels.txt, ops.txt). */
const char *cache_beside(const char *env_name, const char *name, char *buf, size_t len);
/* Runs the probe now: GEMM rate through OpenBLAS, memcpy bandwidth, cores. */
void machine_probe(Machine *m);
#endif
