/* ops/norm.h - what the passes ask about normalisations (ops/norm.c). */
#ifndef PIPECC_OPS_NORM_H
#define PIPECC_OPS_NORM_H
#include "stageprog.h"

/* The call is a BatchNorm in training mode: it updates its running statistics as it runs, and a
 * recomputation (stash.c) passes NULL for them.  (Named stash_ as emit.c and stash.c call it; it
 * lives with the op, whose shape constant's last field says training.) */
int stash_bn_training(const StageProg *sp, const Call *k);
#endif
