/* kcache.h - the kernel-time cache: measured node times keyed by shape.
 *
 * A profile (run.sh --profile, docs/cost.md) times each node of one model.
 * The cache keeps those times under a key that any model's node with the
 * same work shares: the op, its attributes, the dtypes and shapes of its
 * inputs and outputs at the micro-batch size, and which of them carry a
 * gradient.  `pipecc --costs FILE` merges the profile into the cache (when
 * it was measured on this machine at the plan's micro-batch size); a plan
 * without --costs and without --devices costs each node found there from
 * it and every other node from FLOPs.  `pipecc-probe --kernels MODEL`
 * profiles a model and merges it in one command.
 *
 * The file (PIPECC_KERNEL_CACHE, else kernels.txt beside the machine cache;
 * "off" disables it) is text:
 *     pipecc-kernels 1
 *     machine ID              the machine probe's identity: the entries below are its
 *     k FWD BWD_INPUT BWD_WEIGHT KEY
 * Sections of other machines are kept but never used.  Every line is
 * checked; a bad line is ignored with one warning naming FILE:LINE (its
 * node is costed from FLOPs), never an error.  Writes are atomic (a
 * temporary file renamed over it, under a lock). */
#ifndef PIPECC_KCACHE_H
#define PIPECC_KCACHE_H
#include "profile.h"

struct Plan;
struct PartProblem;
/* Without --costs: fills p->costs from the cache where it has at least one
 * of p's nodes (the rest from the FLOP model), and points the problem at
 * it.  Nothing changes when the cache has none of them. */
void kcache_apply(struct Plan *p, struct PartProblem *pr);
/* With --costs: merges c's times into the cache under each node's key, if
 * the profile was taken on this machine at the plan's micro-batch size.
 * Sets c->merged (entries written) and c->merge_note (why not, or NULL). */
void kcache_merge(struct Plan *p, Costs *c);
/* The FLOP model's seconds for compute node q at `rate` FLOP/s and mbw
 * bytes/s of memory copies: a node no measurement covers. */
void kcache_flop_node(const struct PartProblem *pr, int q, double rate, double mbw, double *fwd, double *bwd_input, double *bwd_weight);
/* The cache's path (NULL when disabled), into buf. */
const char *kcache_path(char *buf, size_t len);
#endif
