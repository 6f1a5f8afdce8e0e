/* edges.h - the values between compute nodes (edges.c). */
#ifndef PIPECC_EDGES_H
#define PIPECC_EDGES_H
#include "plan.h"

/* For the current node order: the values that flow between compute nodes
 * (or from the loader, or to the loss) as p->edges, each tensor's first and
 * last reader and reader count, each edge's readers and the gaps a stage may
 * skip (p->ereaders, p->gaps). */
void plan_edges(Plan *p);
#endif
