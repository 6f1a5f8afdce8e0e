/* cut.h - the stages' cuts (cut.c). */
#ifndef PIPECC_CUT_H
#define PIPECC_CUT_H
#include "plan.h"

/* Cuts the compute nodes into p->part's stages: with --partition dag (and
 * more than one stage) the downset DP's order is tried beside the loaded
 * one, each priced by its stages' arenas, and the faster kept (p->node and
 * every per-node array reordered to it); p->part_note says which.  0, or -1
 * with err_set when no cut fits. */
int cut_plan(Plan *p, PartProblem *pr);
#endif
