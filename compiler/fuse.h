/* fuse.h - adjacent nodes made one call (fuse.c). */
#ifndef PIPECC_FUSE_H
#define PIPECC_FUSE_H
#include "ir.h"

/* After infer_and_fold: folds each Relu that alone reads a BatchNormalization's output into that
 * node.  Returns how many nodes it absorbed. */
int fuse_graph(Graph *g);
#endif
