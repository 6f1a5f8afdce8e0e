/* replica.h - data-parallel replicas of the pipeline (pipecc --replicas R, replica.c). */
#ifndef PIPECC_REPLICA_H
#define PIPECC_REPLICA_H
#include "plan.h"
#include "stageprog.h"

/* A bucket's target size: big enough that a message's latency is small beside its bytes, small enough
 * that the first buckets' exchange starts early in the last backward. */
#define REPLICA_BUCKET_BYTES (512 * 1024)

/* Rank lists for R > 1 replicas: REDUCE before each rank's last weight-gradient action (B or W), REDUCE_WAIT
 * before its UPDATE; sc->replicas records R (0 when R is 1, and the lists are left alone). */
void replica_actions(Schedule *sc, int replicas, Pool *pool);
/* StageCost.reduce and reduce_total of stages c[0 .. n) (from their mem_grads) for p's replicas and machine. */
void replica_costs(const Plan *p, StageCost *c, int n);
/* Stage sp's buckets (sp->buckets) over its laid-out gradient region, and the k_grad_ready call after the
 * backward call that finishes each.  Nothing when p has one replica. */
void replica_buckets(const Plan *p, StageProg *sp, Pool *pool);
/* --zero 1: the stage's optimizer state for one replica's shard, one buffer per state slot (momentum; Adam's
 * two moments), made where the per-weight state would have been (autodiff.c): sp->zero_state[0..slots). */
void replica_zero_state(const Plan *p, StageProg *sp, int slots, Pool *pool);
#endif
