/* fold.c - what the operators' compile-time evaluators share.
 *
 * PyTorch exports shape arithmetic (Shape -> Gather -> Unsqueeze -> Concat ->
 * Reshape) and masks (Range, Trilu, Equal, Where) as graph nodes.  With every
 * shape static they are constants; the op table's fold rules evaluate them
 * (ops.c decides when), and these helpers are what those rules have in common. */
#include "fold.h"

#include <string.h>

void fold_alloc(Graph *g, Tensor *o) { o->data = pool_alloc(&g->pool, (size_t)tensor_bytes(o)); }

/* Row-major strides of t, with broadcast dims (size 1, or missing) at stride 0
 * when t is read as a tensor of rank r with dims `to`. */
void bcast_strides(const Tensor *t, int r, int64_t *st) {
  int64_t s = 1;
  for (int i = r - 1; i >= 0; i--) {
    int ti = i - (r - t->rank);
    if (ti < 0 || t->dims[ti] == 1) st[i] = 0;
    else st[i] = s;
    if (ti >= 0) s *= t->dims[ti];
  }
}

/* Offset in a broadcast input for linear index `lin` of the output. */
int64_t bcast_offset(int64_t lin, const Tensor *o, const int64_t *st) {
  int64_t off = 0;
  for (int i = o->rank - 1; i >= 0; i--) {
    int64_t d = o->dims[i] ? o->dims[i] : 1;
    off += (lin % d) * st[i];
    lin /= d;
  }
  return off;
}

void row_strides(const Tensor *t, int64_t *st) {
  int64_t s = 1;
  for (int i = t->rank - 1; i >= 0; i--) st[i] = s, s *= t->dims[i];
}

/* Copies a strided view: out[idx] = x[base + sum idx[i]*st[i]]. */
void gather_view(const Tensor *x, Tensor *o, int64_t base, const int64_t *st) {
  int64_t m = ir_numel(o), esz = dtype_size(o->dtype);
  for (int64_t lin = 0; lin < m; lin++) {
    int64_t rem = lin, off = base;
    for (int i = o->rank - 1; i >= 0; i--) {
      off += (rem % o->dims[i]) * st[i];
      rem /= o->dims[i];
    }
    memcpy((char *)o->data + lin * esz, (const char *)x->data + off * esz, (size_t)esz);
  }
}

/* Reshape-like ops: the bytes do not change, only the shape. */
int fold_copy(Graph *g, Node *n) {
  Tensor *x = node_in(g, n, 0), *o = node_out(g, n, 0);
  fold_alloc(g, o);
  memcpy(o->data, x->data, (size_t)tensor_bytes(o));
  return 0;
}
