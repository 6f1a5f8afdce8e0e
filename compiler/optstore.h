/* optstore.h - the optimizer state leaves the arena (--offload-optimizer, optstore.c). */
#ifndef PIPECC_OPTSTORE_H
#define PIPECC_OPTSTORE_H
#include "stageprog.h"

/* The most floats of one weight's state the update streams at a time (a block; two are in flight). */
#define OPT_BLOCK_MAX 16384

/* Bytes of optimizer state stage sp keeps (momentum, Adam's moments), 0 when none. */
int64_t optstore_state_bytes(const StageProg *sp);
/* May sp's optimizer state leave its arena (--offload-optimizer given, and it has some)? */
int optstore_allowed(const Plan *p, const StageProg *sp);
/* Marks sp's state as living in the store (out 1) or the arena (0): memplan lays it out so, with the
 * update's staging blocks (opt_stage_bytes) in the temporaries' region. */
void optstore_set(StageProg *sp, int out);
/* Seconds the streamed update adds to the stage's update (update_s: its compute) at the store's
 * bandwidth bw (bytes out and back per second) and latency lat. */
double optstore_time(const StageProg *sp, double update_s, double bw, double lat);
/* Once the plan keeps sp's state in the store: its update calls stream it (k_sgd_stream,
 * k_adam_stream) through a staging buffer, laid out again by memplan. */
void optstore_finish(StageProg *sp, Pool *pool);
#endif
