/* bind.h - the graph's inputs bound to the micro-batch, and the empty-tensor check (bind.c). */
#ifndef PIPECC_BIND_H
#define PIPECC_BIND_H
#include "plan.h"

/* Gives every graph input its static shape: the batch axis becomes the
 * micro-batch size (p->batch, p->mb_size and the micro-batch count set);
 * any other symbolic axis is an error.  0, or -1 with err_set. */
int bind_inputs(Plan *p);
/* A run-time tensor with a zero-sized axis: -1 with err_set naming the node. */
int check_nonempty(Graph *g);
#endif
