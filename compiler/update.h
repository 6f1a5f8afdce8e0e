/* update.h - the optimizer step as calls of the stage program (update.c). */
#ifndef PIPECC_UPDATE_H
#define PIPECC_UPDATE_H
#include "stageprog.h"

/* Appends stage sp's step calls: zeroing its weight gradients (and the tied parts it computes),
 * summing each tied weight's parts in graph order, and one optimizer update per weight. */
void update_calls(const Plan *p, StageProg *sp, Pool *pool);
#endif
