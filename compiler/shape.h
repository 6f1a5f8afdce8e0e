/* shape.h - helpers the operators' shape rules share (compiler/ops/).
 *
 * The rules themselves live with their operators; this file keeps what many of
 * them need: reading inputs that must be known, numpy broadcasting, axes,
 * int lists that moved from attributes to inputs across opsets, and the
 * window arithmetic (strides, dilations, pads, auto_pad) of Conv and the pools. */
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

void set_shape(Tensor *t, int dtype, int rank, const int64_t *dims);
void copy_shape(Tensor *dst, const Tensor *src);
/* Input k, present and with a known shape; NULL after node_err() otherwise. */
Tensor *need_in(Graph *g, Node *n, int k);
/* The same, and its value must be a compile-time constant (`what` names it in the error). */
Tensor *need_const(Graph *g, Node *n, int k, const char *what);
/* Output 0 = inputs [first, first + count) broadcast together, of element type out_dtype. */
int broadcast_outputs(Graph *g, Node *n, int first, int count, int out_dtype);
/* The shape rule of every op whose output is its input's shape and type. */
int infer_same(Graph *g, Node *n);

/* Spatial attributes shared by Conv and the pools. */
typedef struct Window {
  int nsp;
  int64_t k[MAX_RANK], s[MAX_RANK], d[MAX_RANK], pb[MAX_RANK], pe[MAX_RANK];
} Window;
/* Fills w from strides, dilations and pads or auto_pad for kernel sizes `kernel`. */
int window_attrs(const Node *n, const Tensor *x, const int64_t *kernel, Window *w);
/* The spatial output sizes (floor, or ceil as PyTorch and ONNX define ceil_mode). */
int window_out(const Node *n, const Tensor *x, const Window *w, int ceil_mode, int64_t *out);

/* A window as the run-time kernels take it (ConvShape, PoolShape): three
 * spatial slots, depth, height, width.  A 1-D or 2-D window fills the last
 * slots and the ones before are unit (size 1, stride 1, pad 0), so one kernel
 * serves every rank and a 2-D one loops exactly as before. */
#define WIN_SLOTS 3
typedef struct WinSlots {
  int64_t in[WIN_SLOTS], out[WIN_SLOTS], k[WIN_SLOTS], s[WIN_SLOTS], pb[WIN_SLOTS], pe[WIN_SLOTS], d[WIN_SLOTS];
} WinSlots;
/* Fills ws from w, input x and output y; -1 after node_err() for more than 3 spatial dims. */
int window_slots(const Node *n, const Window *w, const Tensor *x, const Tensor *y, WinSlots *ws);
#endif
