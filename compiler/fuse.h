/* fuse.h - adjacent nodes made one call (fuse.c). */
#ifndef PIPECC_FUSE_H
#define PIPECC_FUSE_H
#include "ir.h"

/* After infer_and_fold: makes one node of each BatchNormalization and the Relu that alone reads it,
 * each decomposed LayerNorm or GELU chain, and each MatMul by a matrix with the Add of its bias.
 * Returns how many nodes the fused ones absorbed. */
int fuse_graph(Graph *g);
#endif
