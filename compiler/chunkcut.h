/* chunkcut.h - the cuts of a chunked plan balanced per rank (chunkcut.c). */
#ifndef PIPECC_CHUNKCUT_H
#define PIPECC_CHUNKCUT_H
#include "plan.h"

/* --chunks V: moves the cuts of p->part so that each rank's time, the sum of its chunks' stage times, is as
 * even as it can be (the slowest rank first, then the sum of squares), every stage within its memory.  The
 * partition's note says what moved.  0 (nothing to do is not an error). */
int chunks_balance(Plan *p);
#endif
