/* chunks.h - a rank of --chunks V as one program: its V stages' programs joined (chunks.c). */
#ifndef PIPECC_CHUNKS_H
#define PIPECC_CHUNKS_H
#include "stageprog.h"

/* Rank r's program out of the stage programs progs (one per stage, built and laid out as if each stage
 * had a rank of its own), for the schedule's chunks of r.  0, or -1 with err_set (a weight two of the
 * rank's stages both read: not joined yet). */
int chunks_join(const Plan *p, const StageProg *progs, int r, StageProg *out, Pool *pool);
#endif
