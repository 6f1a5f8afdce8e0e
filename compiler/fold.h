/* fold.h - what the operators' compile-time evaluators share.
 *
 * Each op's fold rule (OpDef.fold, in compiler/ops/ with the op) runs when
 * all of a node's inputs are constants; it allocates its outputs' values with
 * fold_alloc and fills them.  Values are computed in int64 for integer types
 * and double for float types, then stored in the output's own type. */
#ifndef PIPECC_FOLD_H
#define PIPECC_FOLD_H
#include "ir.h"

/* Storage for o's value, zeroed, from the graph's pool. */
void fold_alloc(Graph *g, Tensor *o);
/* Strides of t read as rank r with numpy broadcasting (0 on broadcast axes). */
void bcast_strides(const Tensor *t, int r, int64_t *st);
/* Offset in a broadcast input for linear index `lin` of the output o. */
int64_t bcast_offset(int64_t lin, const Tensor *o, const int64_t *st);
/* Row-major element strides of t. */
void row_strides(const Tensor *t, int64_t *st);
/* Copies a strided view of x into o: o[idx] = x[base + sum idx[i] * st[i]]. */
void gather_view(const Tensor *x, Tensor *o, int64_t base, const int64_t *st);
/* The fold rule of reshapes: the same bytes under the output's shape. */
int fold_copy(Graph *g, Node *n);
#endif
