/* shape.h - shape rules, one per operator (used through the op table). */
#ifndef PIPECC_SHAPE_H
#define PIPECC_SHAPE_H
#include "ir.h"

int node_err(const Node *n, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Numpy multidirectional broadcasting of a and b into out; -1 if incompatible. */
int broadcast_shape(const Tensor *a, const Tensor *b, int *rank, int64_t *dims);
/* Normalises an axis against rank (negative counts from the end); -1 if out of range. */
int norm_axis(int64_t axis, int rank);
/* Reads the int list of attribute `name` (old opsets) or constant input k (new). */
int ints_from_attr_or_input(Graph *g, Node *n, const char *name, int k, int64_t *out, int max, int *count);

#define X(op) int infer_##op(Graph *g, Node *n);
#include "shape_ops.def"
#undef X

/* Shared with fold.c, which evaluates what these rules describe. */
void slice_bounds(int64_t dim, int64_t start, int64_t end, int64_t step, int64_t *s, int64_t *count);
int slice_params(Graph *g, Node *n, const Tensor *x, int64_t *start, int64_t *step, int64_t *dims);
int reduce_axes(Graph *g, Node *n, const Tensor *x, int *mask);
int pad_params(Graph *g, Node *n, const Tensor *x, int64_t *begin, int64_t *end, float *value);
#endif
