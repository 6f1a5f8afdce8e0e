/* autodiff.h - each stage's forward and backward program (autodiff.c), its
 * calls appended through the operators' rules (ops/, build.c). */
#ifndef PIPECC_AUTODIFF_H
#define PIPECC_AUTODIFF_H
#include "stageprog.h"

/* Builds every stage's program; -1 with err_set (an op without a gradient rule, a weight shared across stages). */
int autodiff_build(Plan *p, StageProg *progs, Pool *pool);
/* Builds the program of stage s holding compute nodes [a, e), whatever the
 * partition says: the partitioner prices candidate stages with it (named = 0:
 * buffers get no C names, which only the emitted code needs). */
int stage_build(Plan *p, StageProg *sp, int s, int a, int e, int named, Pool *pool);
#endif
