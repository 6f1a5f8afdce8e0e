/* ir.h - the static-shaped graph every pass of pipecc works on.
 *
 * Tensors and nodes live in flat arrays and refer to each other by index.
 * Nodes are kept in topological order.  A tensor with `data` set is a
 * compile-time constant (an initializer or the result of constant folding);
 * a trainable parameter is a finite float32 initializer that a gradient
 * reaches, unless --constant names it (ops.c, mark_params). */
#ifndef PIPECC_IR_H
#define PIPECC_IR_H
#include <stdint.h>

#include "util.h"

#define MAX_RANK 8

/* Element types, numbered as ONNX's TensorProto.DataType. */
enum {
  DT_UNDEFINED = 0, DT_FLOAT = 1, DT_UINT8 = 2, DT_INT8 = 3, DT_UINT16 = 4,
  DT_INT16 = 5, DT_INT32 = 6, DT_INT64 = 7, DT_STRING = 8, DT_BOOL = 9,
  DT_FLOAT16 = 10, DT_DOUBLE = 11, DT_UINT32 = 12, DT_UINT64 = 13,
};

typedef struct Tensor {
  const char *name;
  int dtype;
  int rank;            /* -1 while unknown */
  int64_t dims[MAX_RANK];
  void *data;          /* constant value, dtype layout, row-major; NULL if computed at run time */
  int producer;        /* node index, or -1 for graph inputs and constants */
  int is_initializer;
  int is_param;        /* trainable: updated by the optimizer */
  int kept_const;      /* KEPT_*: why a float32 initializer a gradient reaches is a constant, not a weight */
  int is_input;        /* a graph input fed by the data loader */
  int is_output;
  int nuses;           /* consumers among live nodes */
  int declared_rank;   /* shape from the model's value_info / inputs / outputs, for checks */
  int64_t declared_dims[MAX_RANK];
  const char *declared_params[MAX_RANK]; /* symbolic dims ("batch"), NULL if none */
} Tensor;

/* Tensor.kept_const: --constant named it (a buffer, such as a registered causal mask); it holds NaN or an
 * infinity (a mask's -inf), which no weight can (ops.c, mark_params); --frozen froze its layer (freeze.c). */
enum { KEPT_NONE = 0, KEPT_DECLARED = 1, KEPT_NONFINITE = 2, KEPT_FROZEN = 3 };

enum { ATTR_FLOAT = 1, ATTR_INT = 2, ATTR_STRING = 3, ATTR_TENSOR = 4, ATTR_FLOATS = 6,
       ATTR_INTS = 7, ATTR_STRINGS = 8 };

typedef struct Attr {
  const char *name;
  int type;
  float f;
  int64_t i;
  const char *s;
  int64_t *ints;
  float *floats;
  const char **strs;   /* ATTR_STRINGS */
  int n;               /* length of ints/floats/strs */
  int tensor;          /* ATTR_TENSOR: index of a constant tensor */
} Attr;

typedef struct Node {
  const char *name;
  const char *op;
  int *in, nin;        /* tensor indices; -1 for an omitted optional input */
  int *out, nout;
  Attr *attrs;
  int nattrs;
  int folded;          /* evaluated at compile time; no longer part of the program */
  int fused;           /* absorbed into the node that feeds it (fuse.c); folded is set too, so no pass runs it */
  const char *fusion;  /* what this node runs since fuse.c gave it other nodes' work ("BatchNormalization+Relu"), or NULL */
  const struct OpDef *def; /* its row of the operator table (set by infer_and_fold) */
  int conv_gemm;       /* a convolution that --conv auto runs as im2col + GEMM: measured faster here (opcost.c) */
} Node;

typedef struct Graph {
  Pool pool;
  const char *path;    /* the model file, for messages */
  int64_t opset;       /* default-domain opset version */
  Tensor *t;
  int nt, capt;
  Node *n;
  int nn, capn;
  int *inputs, ninputs;    /* graph inputs that are not initializers */
  int *outputs, noutputs;
  int64_t batch;       /* the batch size the model was declared with (0 if symbolic) */
  const char *batch_param; /* name of the symbolic batch dim, e.g. "batch" */
  int *hash;           /* open-addressing table name -> tensor index (-1 empty) */
  int hcap;
  /* The unpacked model: initializers' data point into it rather than being
   * copied, so a large model is held once.  Freed by ir_free. */
  void *proto;
  void (*proto_free)(void *);
  /* --untie (untie.c): tensor `copy` is a copy of initializer `from` that node `node` now reads. */
  struct Untied { int from, copy, node; } *untied;
  int nuntied, capuntied;
  int conv_impl;       /* --conv: CONV_AUTO, CONV_GEMM or CONV_DNNL (ops/conv.c) */
} Graph;

/* How convolutions run (--conv): the rule in ops/conv.c, im2col + GEMM everywhere, or oneDNN everywhere
 * it can (in a build of the stages with oneDNN; without it every convolution is im2col + GEMM). */
enum { CONV_AUTO = 0, CONV_GEMM = 1, CONV_DNNL = 2 };

/* Construction. */
int ir_add_tensor(Graph *g, const char *name);   /* new tensor (names need not be unique here) */
int ir_find_tensor(const Graph *g, const char *name); /* -1 if absent */
int ir_add_node(Graph *g, const char *name, const char *op);
void ir_free(Graph *g);

/* Shapes and sizes. */
int64_t ir_numel(const Tensor *t);
int dtype_size(int dtype);
const char *dtype_name(int dtype);
int dtype_is_float(int dtype);
int64_t tensor_bytes(const Tensor *t);
const char *shape_str(const Tensor *t); /* "[8,1,28,28]" in a rotating static buffer */

/* Attributes; the default is returned when the attribute is absent. */
const Attr *node_attr(const Node *n, const char *name);
int64_t attr_int(const Node *n, const char *name, int64_t def);
float attr_float(const Node *n, const char *name, float def);
const char *attr_str(const Node *n, const char *name, const char *def);
/* Copies up to max ints into out; returns the count, or -1 if absent. */
int attr_ints(const Node *n, const char *name, int64_t *out, int max);

/* Reading a constant tensor's elements whatever its dtype. */
double const_f64(const Tensor *t, int64_t i);
int64_t const_i64(const Tensor *t, int64_t i);
void const_set_f64(Tensor *t, int64_t i, double v);
void const_set_i64(Tensor *t, int64_t i, int64_t v);
/* The index of a float constant's first NaN or infinite element; -1 when every one is finite (or t is not float). */
int64_t const_first_nonfinite(const Tensor *t);

/* A node's input tensor k, or NULL if it is absent/omitted. */
Tensor *node_in(Graph *g, const Node *n, int k);
Tensor *node_out(Graph *g, const Node *n, int k);

#endif
