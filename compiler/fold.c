/* fold.c - constant folding: evaluating nodes whose inputs are all known.
 *
 * PyTorch exports shape arithmetic (Shape -> Gather -> Unsqueeze -> Concat ->
 * Reshape) and masks (Range, Trilu, Equal, Where) as graph nodes.  With every
 * shape static they are constants, and evaluating them here removes them from
 * the training program.  Values are computed in int64 for integer types and
 * double for float types, then stored in the output's own type. */
#include "fold.h"

#include <math.h>
#include <string.h>

#include "shape.h"

static void alloc_out(Graph *g, Tensor *o) { o->data = pool_alloc(&g->pool, (size_t)tensor_bytes(o)); }

/* Row-major strides of t, with broadcast dims (size 1, or missing) at stride 0
 * when t is read as a tensor of rank r with dims `to`. */
static void bcast_strides(const Tensor *t, int r, int64_t *st) {
  int64_t s = 1;
  for (int i = r - 1; i >= 0; i--) {
    int ti = i - (r - t->rank);
    if (ti < 0 || t->dims[ti] == 1) st[i] = 0;
    else st[i] = s;
    if (ti >= 0) s *= t->dims[ti];
  }
}

/* Offset in a broadcast input for linear index `lin` of the output. */
static int64_t bcast_offset(int64_t lin, const Tensor *o, const int64_t *st) {
  int64_t off = 0;
  for (int i = o->rank - 1; i >= 0; i--) {
    int64_t d = o->dims[i] ? o->dims[i] : 1;
    off += (lin % d) * st[i];
    lin /= d;
  }
  return off;
}

static double unary_f(const char *op, double x) {
  if (!strcmp(op, "Sqrt")) return sqrt(x);
  if (!strcmp(op, "Neg")) return -x;
  if (!strcmp(op, "Relu")) return x > 0 ? x : 0;
  if (!strcmp(op, "Exp")) return exp(x);
  if (!strcmp(op, "Log")) return log(x);
  if (!strcmp(op, "Abs")) return fabs(x);
  if (!strcmp(op, "Erf")) return erf(x);
  if (!strcmp(op, "Tanh")) return tanh(x);
  if (!strcmp(op, "Sigmoid")) return 1 / (1 + exp(-x));
  if (!strcmp(op, "Reciprocal")) return 1 / x;
  if (!strcmp(op, "Not")) return x == 0;
  if (!strcmp(op, "Floor")) return floor(x);
  if (!strcmp(op, "Ceil")) return ceil(x);
  return x; /* Identity, Cast */
}

int fold_Unary(Graph *g, Node *n) {
  Tensor *x = node_in(g, n, 0), *o = node_out(g, n, 0);
  alloc_out(g, o);
  int64_t m = ir_numel(o);
  int intpath = !dtype_is_float(x->dtype) && !dtype_is_float(o->dtype) && strcmp(n->op, "Sqrt");
  for (int64_t i = 0; i < m; i++) {
    if (intpath) {
      int64_t v = const_i64(x, i);
      if (!strcmp(n->op, "Neg")) v = -v;
      else if (!strcmp(n->op, "Abs")) v = v < 0 ? -v : v;
      else if (!strcmp(n->op, "Not")) v = !v;
      else if (!strcmp(n->op, "Relu")) v = v > 0 ? v : 0;
      const_set_i64(o, i, v);
    } else {
      const_set_f64(o, i, unary_f(n->op, const_f64(x, i)));
    }
  }
  return 0;
}

static int64_t binary_i(Node *n, const char *op, int64_t a, int64_t b, int *err) {
  if (!strcmp(op, "Add")) return (int64_t)((uint64_t)a + (uint64_t)b);
  if (!strcmp(op, "Sub")) return (int64_t)((uint64_t)a - (uint64_t)b);
  if (!strcmp(op, "Mul")) return (int64_t)((uint64_t)a * (uint64_t)b);
  if (!strcmp(op, "Div") || !strcmp(op, "Mod")) {
    if (b == 0 || (a == INT64_MIN && b == -1)) {
      *err = node_err(n, "integer division by zero at compile time");
      return 0;
    }
    return op[0] == 'D' ? a / b : a % b;
  }
  if (!strcmp(op, "Pow")) {
    int64_t r = 1;
    for (int64_t k = 0; k < b && k < 64; k++) r *= a;
    return r;
  }
  if (!strcmp(op, "Equal")) return a == b;
  if (!strcmp(op, "Less")) return a < b;
  if (!strcmp(op, "Greater")) return a > b;
  if (!strcmp(op, "LessOrEqual")) return a <= b;
  if (!strcmp(op, "GreaterOrEqual")) return a >= b;
  if (!strcmp(op, "And")) return a && b;
  if (!strcmp(op, "Or")) return a || b;
  if (!strcmp(op, "Max")) return a > b ? a : b;
  if (!strcmp(op, "Min")) return a < b ? a : b;
  return 0;
}

static double binary_f(const char *op, double a, double b) {
  if (!strcmp(op, "Add")) return a + b;
  if (!strcmp(op, "Sub")) return a - b;
  if (!strcmp(op, "Mul")) return a * b;
  if (!strcmp(op, "Div")) return a / b;
  if (!strcmp(op, "Pow")) return pow(a, b);
  if (!strcmp(op, "Equal")) return a == b;
  if (!strcmp(op, "Less")) return a < b;
  if (!strcmp(op, "Greater")) return a > b;
  if (!strcmp(op, "LessOrEqual")) return a <= b;
  if (!strcmp(op, "GreaterOrEqual")) return a >= b;
  if (!strcmp(op, "And")) return a && b;
  if (!strcmp(op, "Or")) return a || b;
  if (!strcmp(op, "Max")) return a > b ? a : b;
  if (!strcmp(op, "Min")) return a < b ? a : b;
  if (!strcmp(op, "Mod")) return fmod(a, b);
  return 0;
}

int fold_Binary(Graph *g, Node *n) {
  Tensor *a = node_in(g, n, 0), *b = node_in(g, n, 1), *o = node_out(g, n, 0);
  alloc_out(g, o);
  int64_t sa[MAX_RANK], sb[MAX_RANK], m = ir_numel(o);
  bcast_strides(a, o->rank, sa);
  bcast_strides(b, o->rank, sb);
  int intpath = !dtype_is_float(a->dtype) && !dtype_is_float(b->dtype), err = 0;
  for (int64_t i = 0; i < m && !err; i++) {
    int64_t ia = bcast_offset(i, o, sa), ib = bcast_offset(i, o, sb);
    if (intpath) const_set_i64(o, i, binary_i(n, n->op, const_i64(a, ia), const_i64(b, ib), &err));
    else const_set_f64(o, i, binary_f(n->op, const_f64(a, ia), const_f64(b, ib)));
  }
  return err;
}

int fold_Where(Graph *g, Node *n) {
  Tensor *c = node_in(g, n, 0), *x = node_in(g, n, 1), *y = node_in(g, n, 2), *o = node_out(g, n, 0);
  alloc_out(g, o);
  int64_t sc[MAX_RANK], sx[MAX_RANK], sy[MAX_RANK], m = ir_numel(o), esz = dtype_size(o->dtype);
  bcast_strides(c, o->rank, sc);
  bcast_strides(x, o->rank, sx);
  bcast_strides(y, o->rank, sy);
  for (int64_t i = 0; i < m; i++) {
    int pick = const_i64(c, bcast_offset(i, o, sc)) != 0;
    const Tensor *src = pick ? x : y;
    int64_t off = bcast_offset(i, o, pick ? sx : sy);
    memcpy((char *)o->data + i * esz, (const char *)src->data + off * esz, (size_t)esz);
  }
  return 0;
}

/* Reshape-like ops: the bytes do not change, only the shape. */
int fold_Copy(Graph *g, Node *n) {
  Tensor *x = node_in(g, n, 0), *o = node_out(g, n, 0);
  alloc_out(g, o);
  memcpy(o->data, x->data, (size_t)tensor_bytes(o));
  return 0;
}

int fold_Cast(Graph *g, Node *n) {
  Tensor *x = node_in(g, n, 0), *o = node_out(g, n, 0);
  alloc_out(g, o);
  for (int64_t i = 0; i < ir_numel(o); i++)
    if (dtype_is_float(x->dtype)) const_set_f64(o, i, const_f64(x, i));
    else const_set_i64(o, i, const_i64(x, i));
  return 0;
}

/* Copies a strided view: out[idx] = x[base + sum idx[i]*st[i]]. */
static void gather_view(const Tensor *x, Tensor *o, int64_t base, const int64_t *st) {
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

static void row_strides(const Tensor *t, int64_t *st) {
  int64_t s = 1;
  for (int i = t->rank - 1; i >= 0; i--) st[i] = s, s *= t->dims[i];
}

int fold_Transpose(Graph *g, Node *n) {
  Tensor *x = node_in(g, n, 0), *o = node_out(g, n, 0);
  alloc_out(g, o);
  int64_t perm[MAX_RANK], xs[MAX_RANK], st[MAX_RANK];
  if (attr_ints(n, "perm", perm, MAX_RANK) < 0)
    for (int i = 0; i < x->rank; i++) perm[i] = x->rank - 1 - i;
  row_strides(x, xs);
  for (int i = 0; i < o->rank; i++) st[i] = xs[perm[i]];
  gather_view(x, o, 0, st);
  return 0;
}

int fold_Slice(Graph *g, Node *n) {
  Tensor *x = node_in(g, n, 0), *o = node_out(g, n, 0);
  alloc_out(g, o);
  int64_t start[MAX_RANK], step[MAX_RANK], dims[MAX_RANK], xs[MAX_RANK], st[MAX_RANK], base = 0;
  if (slice_params(g, n, x, start, step, dims)) return -1;
  row_strides(x, xs);
  for (int i = 0; i < x->rank; i++) base += start[i] * xs[i], st[i] = step[i] * xs[i];
  if (ir_numel(o)) gather_view(x, o, base, st);
  return 0;
}

int fold_Gather(Graph *g, Node *n) {
  Tensor *x = node_in(g, n, 0), *idx = node_in(g, n, 1), *o = node_out(g, n, 0);
  alloc_out(g, o);
  int a = norm_axis(attr_int(n, "axis", 0), x->rank);
  int64_t outer = 1, inner = 1, ni = ir_numel(idx), esz = dtype_size(x->dtype);
  for (int i = 0; i < a; i++) outer *= x->dims[i];
  for (int i = a + 1; i < x->rank; i++) inner *= x->dims[i];
  for (int64_t p = 0; p < outer; p++)
    for (int64_t j = 0; j < ni; j++) {
      int64_t v = const_i64(idx, j);
      if (v < 0) v += x->dims[a];
      memcpy((char *)o->data + ((p * ni + j) * inner) * esz,
             (const char *)x->data + ((p * x->dims[a] + v) * inner) * esz, (size_t)(inner * esz));
    }
  return 0;
}

int fold_Concat(Graph *g, Node *n) {
  Tensor *o = node_out(g, n, 0);
  alloc_out(g, o);
  int a = norm_axis(attr_int(n, "axis", 0), o->rank);
  int64_t outer = 1, inner = 1, esz = dtype_size(o->dtype), at = 0;
  for (int i = 0; i < a; i++) outer *= o->dims[i];
  for (int i = a + 1; i < o->rank; i++) inner *= o->dims[i];
  for (int k = 0; k < n->nin; k++) {
    Tensor *x = node_in(g, n, k);
    int64_t chunk = x->dims[a] * inner * esz;
    for (int64_t p = 0; p < outer; p++)
      memcpy((char *)o->data + (p * o->dims[a] * inner) * esz + at, (const char *)x->data + p * chunk, (size_t)chunk);
    at += chunk;
  }
  return 0;
}

int fold_Split(Graph *g, Node *n) {
  Tensor *x = node_in(g, n, 0);
  int a = norm_axis(attr_int(n, "axis", 0), x->rank);
  int64_t outer = 1, inner = 1, esz = dtype_size(x->dtype), at = 0;
  for (int i = 0; i < a; i++) outer *= x->dims[i];
  for (int i = a + 1; i < x->rank; i++) inner *= x->dims[i];
  for (int k = 0; k < n->nout; k++) {
    Tensor *o = node_out(g, n, k);
    if (!o) continue;
    alloc_out(g, o);
    int64_t chunk = o->dims[a] * inner * esz;
    for (int64_t p = 0; p < outer; p++)
      memcpy((char *)o->data + p * chunk, (const char *)x->data + (p * x->dims[a] * inner) * esz + at, (size_t)chunk);
    at += chunk;
  }
  return 0;
}

int fold_Expand(Graph *g, Node *n) {
  Tensor *x = node_in(g, n, 0), *o = node_out(g, n, 0);
  alloc_out(g, o);
  int64_t st[MAX_RANK];
  bcast_strides(x, o->rank, st);
  gather_view(x, o, 0, st);
  return 0;
}

int fold_Trilu(Graph *g, Node *n) {
  Tensor *x = node_in(g, n, 0), *o = node_out(g, n, 0), *kt = node_in(g, n, 1);
  if (x->rank < 2) return node_err(n, "input must have rank >= 2");
  alloc_out(g, o);
  int64_t k = kt ? const_i64(kt, 0) : 0, upper = attr_int(n, "upper", 1);
  int64_t rows = x->dims[x->rank - 2], cols = x->dims[x->rank - 1], esz = dtype_size(x->dtype);
  for (int64_t i = 0; i < ir_numel(o); i++) {
    int64_t c = i % cols, r = (i / cols) % rows;
    int keep = upper ? c - r >= k : c - r <= k;
    if (keep) memcpy((char *)o->data + i * esz, (const char *)x->data + i * esz, (size_t)esz);
  }
  return 0;
}

int fold_Shape(Graph *g, Node *n) {
  Tensor *x = node_in(g, n, 0), *o = node_out(g, n, 0);
  alloc_out(g, o);
  int64_t start = attr_int(n, "start", 0);
  if (start < 0) start += x->rank;
  if (start < 0) start = 0;
  for (int64_t i = 0; i < o->dims[0]; i++) const_set_i64(o, i, x->dims[start + i]);
  return 0;
}

int fold_Size(Graph *g, Node *n) {
  Tensor *o = node_out(g, n, 0);
  alloc_out(g, o);
  const_set_i64(o, 0, ir_numel(node_in(g, n, 0)));
  return 0;
}

int fold_Constant(Graph *g, Node *n) {
  Tensor *o = node_out(g, n, 0);
  const Attr *a = &n->attrs[0];
  alloc_out(g, o);
  if (a->type == ATTR_TENSOR) memcpy(o->data, g->t[a->tensor].data, (size_t)tensor_bytes(o));
  else if (a->type == ATTR_FLOAT) const_set_f64(o, 0, a->f);
  else if (a->type == ATTR_INT) const_set_i64(o, 0, a->i);
  else
    for (int i = 0; i < a->n; i++)
      if (a->type == ATTR_FLOATS) const_set_f64(o, i, a->floats[i]);
      else const_set_i64(o, i, a->ints[i]);
  return 0;
}

int fold_ConstantOfShape(Graph *g, Node *n) {
  Tensor *o = node_out(g, n, 0);
  alloc_out(g, o);
  const Attr *v = node_attr(n, "value");
  if (!v || v->type != ATTR_TENSOR) return 0; /* zeros */
  Tensor *val = &g->t[v->tensor];
  if (ir_numel(val) != 1) return node_err(n, "value must hold one element");
  int64_t esz = dtype_size(o->dtype);
  for (int64_t i = 0; i < ir_numel(o); i++) memcpy((char *)o->data + i * esz, val->data, (size_t)esz);
  return 0;
}

int fold_Range(Graph *g, Node *n) {
  Tensor *a = node_in(g, n, 0), *d = node_in(g, n, 2), *o = node_out(g, n, 0);
  alloc_out(g, o);
  for (int64_t i = 0; i < o->dims[0]; i++)
    if (dtype_is_float(o->dtype)) const_set_f64(o, i, const_f64(a, 0) + (double)i * const_f64(d, 0));
    else const_set_i64(o, i, const_i64(a, 0) + i * const_i64(d, 0));
  return 0;
}

int fold_Reduce(Graph *g, Node *n) {
  Tensor *x = node_in(g, n, 0), *o = node_out(g, n, 0);
  alloc_out(g, o);
  int mask;
  if (reduce_axes(g, n, x, &mask)) return -1;
  int64_t m = ir_numel(x), count = 1, xs[MAX_RANK];
  for (int i = 0; i < x->rank; i++)
    if (mask >> i & 1) count *= x->dims[i];
  /* Output index of each input element: drop the reduced coordinates. */
  row_strides(x, xs);
  double *acc = pool_alloc(&g->pool, (size_t)ir_numel(o) * sizeof(double) + 1);
  for (int64_t lin = 0; lin < m; lin++) {
    int64_t out = 0, rem = lin;
    for (int i = 0; i < x->rank; i++) {
      int64_t c = rem / xs[i];
      rem %= xs[i];
      if (!(mask >> i & 1)) out = out * x->dims[i] + c;
    }
    acc[out] += const_f64(x, lin);
  }
  int mean = !strcmp(n->op, "ReduceMean");
  for (int64_t i = 0; i < ir_numel(o); i++) const_set_f64(o, i, mean ? acc[i] / (double)count : acc[i]);
  return 0;
}
