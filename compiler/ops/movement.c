/* movement.c - ops that move data without arithmetic: the reshapes (Reshape,
 * Flatten, Squeeze, Unsqueeze, Identity), Transpose, Split, Concat, Pad,
 * Gather (embeddings), the strided views Slice, Expand and Tile, Cast, and
 * Dropout (a mask times its input). */
#include "ops/rule.h"

/* ---- reshapes: the same bytes under a new shape (folded by fold_copy) ---- */

static int reshape_infer(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0), *s = need_const(g, n, 1, "the target shape");
  if (!x || !s) return -1;
  int64_t r = ir_numel(s), dims[MAX_RANK], known = 1;
  if (s->rank != 1 || r > MAX_RANK) return node_err(n, "the target shape must be a 1-D list of at most %d values", MAX_RANK);
  int allowzero = (int)attr_int(n, "allowzero", 0), infer_at = -1;
  for (int64_t i = 0; i < r; i++) {
    int64_t d = const_i64(s, i);
    if (d == 0 && !allowzero) {
      if (i >= x->rank) return node_err(n, "target dim %lld is 0 (copy) but the input has rank %d", (long long)i, x->rank);
      d = x->dims[i];
    }
    if (d == -1) {
      if (infer_at >= 0) return node_err(n, "the target shape has more than one -1");
      infer_at = (int)i;
      continue;
    }
    if (d < 0) return node_err(n, "target dim %lld is negative (%lld)", (long long)i, (long long)d);
    if (d > 0 && known > INT64_MAX / d) return node_err(n, "the target shape is too large");
    dims[i] = d;
    known *= d;
  }
  int64_t total = ir_numel(x);
  if (infer_at >= 0) {
    if (known == 0 || total % known)
      return node_err(n, "cannot reshape %s (%lld elements) to the target shape: %lld is not a multiple of %lld%s",
                      shape_str(x), (long long)total, (long long)total, (long long)known,
                      " (the batch size may be baked into this node's constant shape)");
    dims[infer_at] = total / known;
  } else if (known != total) {
    return node_err(n, "cannot reshape %s (%lld elements) to a shape of %lld elements; the model pins the batch "
                    "size here (export it with a dynamic batch axis, or use the batch it was exported with)",
                    shape_str(x), (long long)total, (long long)known);
  }
  set_shape(node_out(g, n, 0), x->dtype, (int)r, dims);
  return 0;
}

static int flatten_infer(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0);
  if (!x) return -1;
  int64_t axis = attr_int(n, "axis", 1);
  if (axis < 0) axis += x->rank;
  if (axis < 0 || axis > x->rank) return node_err(n, "axis %lld is out of range for %s", (long long)axis, shape_str(x));
  int64_t dims[2] = {1, 1};
  for (int i = 0; i < x->rank; i++) dims[i >= axis] *= x->dims[i];
  set_shape(node_out(g, n, 0), x->dtype, 2, dims);
  return 0;
}

static int squeeze_infer(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0);
  if (!x) return -1;
  int64_t axes[MAX_RANK], dims[MAX_RANK];
  int c, drop = 0, r = 0;
  if (ints_from_attr_or_input(g, n, "axes", 1, axes, MAX_RANK, &c)) return -1;
  for (int i = 0; i < c; i++) {
    int a = norm_axis(axes[i], x->rank);
    if (a < 0) return node_err(n, "axis %lld is out of range for %s", (long long)axes[i], shape_str(x));
    if (x->dims[a] != 1) return node_err(n, "cannot squeeze axis %d of %s: it is not 1", a, shape_str(x));
    drop |= 1 << a;
  }
  for (int i = 0; i < x->rank; i++)
    if (c < 0 ? x->dims[i] != 1 : !(drop >> i & 1)) dims[r++] = x->dims[i];
  set_shape(node_out(g, n, 0), x->dtype, r, dims);
  return 0;
}

static int unsqueeze_infer(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0);
  if (!x) return -1;
  int64_t axes[MAX_RANK], dims[MAX_RANK];
  int c, add = 0;
  if (ints_from_attr_or_input(g, n, "axes", 1, axes, MAX_RANK, &c)) return -1;
  if (c < 1) return node_err(n, "axes is required");
  int r = x->rank + c;
  if (r > MAX_RANK) return node_err(n, "the result would have rank %d (max %d)", r, MAX_RANK);
  for (int i = 0; i < c; i++) {
    int a = norm_axis(axes[i], r);
    if (a < 0 || (add >> a & 1)) return node_err(n, "axis %lld is out of range or repeated", (long long)axes[i]);
    add |= 1 << a;
  }
  for (int i = 0, j = 0; i < r; i++) dims[i] = (add >> i & 1) ? 1 : x->dims[j++];
  set_shape(node_out(g, n, 0), x->dtype, r, dims);
  return 0;
}

static int copy_fwd(Emit *e, const Node *n, int j) {
  (void)j;
  CALL(e, PH_FWD, K_COPY, n, A_BUF(em_in(e, n, 0)), A_BUF(em_out(e, n, 0)), A_INT(ir_numel(em_t(e, n->out[0]))));
  return 0;
}
static int copy_bwd(Emit *e, const Node *n, int j) {
  (void)j;
  if (!em_needs(e, n, 0)) return 0;
  int acc, dx = em_grad(e, n, 0, &acc);
  CALL(e, PH_IGRAD, K_COPY_GRAD, n, A_BUF(em_dy(e, n, 0)), A_BUF(dx), A_INT(ir_numel(em_t(e, n->out[0]))), A_INT(acc));
  return 0;
}

/* ---- Transpose ---- */

static int transpose_infer(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0);
  if (!x) return -1;
  int64_t perm[MAX_RANK], dims[MAX_RANK];
  int c = attr_ints(n, "perm", perm, MAX_RANK);
  if (c < 0)
    for (int i = 0; i < x->rank; i++) perm[i] = x->rank - 1 - i;
  else if (c != x->rank)
    return node_err(n, "perm has %d entries for input %s", c, shape_str(x));
  int seen = 0;
  for (int i = 0; i < x->rank; i++) {
    if (perm[i] < 0 || perm[i] >= x->rank || (seen >> perm[i] & 1)) return node_err(n, "perm is not a permutation");
    seen |= 1 << perm[i];
    dims[i] = x->dims[perm[i]];
  }
  set_shape(node_out(g, n, 0), x->dtype, x->rank, dims);
  return 0;
}

static int transpose_fold(Graph *g, Node *n) {
  Tensor *x = node_in(g, n, 0), *o = node_out(g, n, 0);
  fold_alloc(g, o);
  int64_t perm[MAX_RANK], xs[MAX_RANK], st[MAX_RANK];
  if (attr_ints(n, "perm", perm, MAX_RANK) < 0)
    for (int i = 0; i < x->rank; i++) perm[i] = x->rank - 1 - i;
  row_strides(x, xs);
  for (int i = 0; i < o->rank; i++) st[i] = xs[perm[i]];
  gather_view(x, o, 0, st);
  return 0;
}

static int transpose_fwd(Emit *e, const Node *n, int j) {
  Tensor *X = em_t(e, n->in[0]), *Y = em_t(e, n->out[0]);
  int64_t perm[MAX_RANK], xs[MAX_RANK], st[MAX_RANK], s2 = 1;
  if (attr_ints(n, "perm", perm, MAX_RANK) < 0)
    for (int i = 0; i < X->rank; i++) perm[i] = X->rank - 1 - i;
  for (int i = X->rank - 1; i >= 0; i--) xs[i] = s2, s2 *= X->dims[i];
  for (int i = 0; i < X->rank; i++) st[i] = xs[perm[i]];
  int ps = SHAPE(e, "PermShape", em_name(e, "PERM_%d", j), A_INT(Y->rank), A_INTS(Y->dims, Y->rank), A_INTS(st, Y->rank),
                 A_INT(ir_numel(Y)));
  CALL(e, PH_FWD, K_TRANSPOSE, n, A_BUF(em_in(e, n, 0)), A_BUF(em_out(e, n, 0)), A_CONST(ps));
  return 0;
}
static int transpose_bwd(Emit *e, const Node *n, int j) {
  if (!em_needs(e, n, 0)) return 0;
  int acc, dx = em_grad(e, n, 0, &acc);
  CALL(e, PH_IGRAD, K_TRANSPOSE_GRAD, n, A_BUF(em_dy(e, n, 0)), A_BUF(dx), A_CONST(em_shape_ref(e, em_name(e, "PERM_%d", j))),
       A_INT(acc));
  return 0;
}

/* ---- Split and Concat: slices along one axis, [outer, axis, inner] ---- */

static int split_infer(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0);
  if (!x) return -1;
  int a = norm_axis(attr_int(n, "axis", 0), x->rank);
  if (a < 0) return node_err(n, "axis is out of range for %s", shape_str(x));
  int64_t split[64];
  int c;
  if (ints_from_attr_or_input(g, n, "split", 1, split, 64, &c)) return -1;
  if (c < 0) {
    /* Equal parts; the last one smaller when the size does not divide (opset 18). */
    int64_t parts = n->nout, size = (x->dims[a] + parts - 1) / parts;
    if (parts > 64) return node_err(n, "too many outputs");
    for (int i = 0; i < parts; i++) {
      int64_t left = x->dims[a] - i * size;
      split[i] = left < size ? (left < 0 ? 0 : left) : size;
    }
    if (x->dims[a] % parts && !node_attr(n, "num_outputs"))
      return node_err(n, "axis %d of size %lld does not split into %d equal parts", a, (long long)x->dims[a], n->nout);
    c = n->nout;
  }
  if (c != n->nout) return node_err(n, "split lists %d sizes for %d outputs", c, n->nout);
  int64_t sum = 0;
  for (int i = 0; i < c; i++) {
    if (split[i] < 0 || split[i] > x->dims[a]) return node_err(n, "split size %lld is out of range", (long long)split[i]);
    sum += split[i];
  }
  if (sum != x->dims[a]) return node_err(n, "split sizes add up to %lld, not %lld", (long long)sum, (long long)x->dims[a]);
  for (int i = 0; i < c; i++) {
    Tensor *o = node_out(g, n, i);
    if (!o) continue;
    copy_shape(o, x);
    o->dims[a] = split[i];
  }
  return 0;
}

static int split_fold(Graph *g, Node *n) {
  Tensor *x = node_in(g, n, 0);
  int a = norm_axis(attr_int(n, "axis", 0), x->rank);
  int64_t outer = 1, inner = 1, esz = dtype_size(x->dtype), at = 0;
  for (int i = 0; i < a; i++) outer *= x->dims[i];
  for (int i = a + 1; i < x->rank; i++) inner *= x->dims[i];
  for (int k = 0; k < n->nout; k++) {
    Tensor *o = node_out(g, n, k);
    if (!o) continue;
    fold_alloc(g, o);
    int64_t chunk = o->dims[a] * inner * esz;
    for (int64_t p = 0; p < outer; p++)
      memcpy((char *)o->data + p * chunk, (const char *)x->data + (p * x->dims[a] * inner) * esz + at, (size_t)chunk);
    at += chunk;
  }
  return 0;
}

static int concat_infer(Graph *g, Node *n) {
  Tensor *x0 = need_in(g, n, 0);
  if (!x0) return -1;
  int a = norm_axis(attr_int(n, "axis", 0), x0->rank);
  if (a < 0) return node_err(n, "axis is out of range for %s", shape_str(x0));
  int64_t dims[MAX_RANK];
  memcpy(dims, x0->dims, sizeof dims);
  dims[a] = 0;
  for (int k = 0; k < n->nin; k++) {
    Tensor *x = need_in(g, n, k);
    if (!x) return -1;
    if (x->rank != x0->rank || x->dtype != x0->dtype)
      return node_err(n, "input %d %s %s does not match input 0 %s %s", k, dtype_name(x->dtype), shape_str(x),
                      dtype_name(x0->dtype), shape_str(x0));
    for (int i = 0; i < x->rank; i++)
      if (i != a && x->dims[i] != x0->dims[i])
        return node_err(n, "input %d %s differs from %s outside axis %d", k, shape_str(x), shape_str(x0), a);
    dims[a] += x->dims[a];
  }
  set_shape(node_out(g, n, 0), x0->dtype, x0->rank, dims);
  return 0;
}

static int concat_fold(Graph *g, Node *n) {
  Tensor *o = node_out(g, n, 0);
  fold_alloc(g, o);
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

static int split_axis(Emit *e, const Node *n, int64_t *outer, int64_t *inner) {
  Tensor *X = em_t(e, n->in[0]);
  int a = (int)attr_int(n, "axis", 0);
  if (a < 0) a += X->rank;
  rule_around(X, a, outer, inner);
  return a;
}

static int split_fwd(Emit *e, const Node *n, int j) {
  (void)j;
  Tensor *X = em_t(e, n->in[0]);
  int64_t outer, inner, at = 0;
  int a = split_axis(e, n, &outer, &inner), x = em_in(e, n, 0);
  for (int q = 0; q < n->nout; q++) {
    if (n->out[q] < 0) continue;
    int64_t len = em_t(e, n->out[q])->dims[a];
    CALL(e, PH_FWD, K_TAKE, n, A_BUF(x), A_BUF(em_out(e, n, q)), A_INT(outer), A_INT(X->dims[a]), A_INT(inner), A_INT(at), A_INT(len));
    at += len;
  }
  return 0;
}
static int split_bwd(Emit *e, const Node *n, int j) {
  (void)j;
  if (!em_needs(e, n, 0)) return 0;
  Tensor *X = em_t(e, n->in[0]);
  int64_t outer, inner, at = 0;
  int a = split_axis(e, n, &outer, &inner), acc, dx = em_grad(e, n, 0, &acc);
  if (!acc) CALL(e, PH_IGRAD, K_ZERO, n, A_BUF(dx), A_INT(ir_numel(X)));
  /* Each output's gradient adds into its slice; outputs no gradient reached stay zero. */
  for (int q = 0; q < n->nout; q++) {
    if (n->out[q] < 0) continue;
    int64_t len = em_t(e, n->out[q])->dims[a];
    int g = em_dy(e, n, q);
    if (g >= 0)
      CALL(e, PH_IGRAD, K_TAKE_GRAD, n, A_BUF(g), A_BUF(dx), A_INT(outer), A_INT(X->dims[a]), A_INT(inner), A_INT(at), A_INT(len));
    at += len;
  }
  return 0;
}

static int concat_axis(Emit *e, const Node *n, int64_t *outer, int64_t *inner) {
  Tensor *Y = em_t(e, n->out[0]);
  int a = (int)attr_int(n, "axis", 0);
  if (a < 0) a += Y->rank;
  rule_around(Y, a, outer, inner);
  return a;
}

static int concat_fwd(Emit *e, const Node *n, int j) {
  (void)j;
  Tensor *Y = em_t(e, n->out[0]);
  if (Y->dtype != DT_FLOAT) return err_set("node '%s' (Concat): only float values are concatenated at run time", n->name);
  int64_t outer, inner, at = 0;
  int a = concat_axis(e, n, &outer, &inner), y = em_out(e, n, 0);
  for (int q = 0; q < n->nin; q++) {
    if (n->in[q] < 0) continue;
    int64_t len = em_t(e, n->in[q])->dims[a];
    if (len) CALL(e, PH_FWD, K_PUT, n, A_BUF(em_in(e, n, q)), A_BUF(y), A_INT(outer), A_INT(Y->dims[a]), A_INT(inner), A_INT(at), A_INT(len));
    at += len;
  }
  return 0;
}
static int concat_bwd(Emit *e, const Node *n, int j) {
  (void)j;
  Tensor *Y = em_t(e, n->out[0]);
  int64_t outer, inner, at = 0;
  int a = concat_axis(e, n, &outer, &inner), dy = em_dy(e, n, 0);
  int64_t start[64];
  for (int q = 0; q < n->nin && q < 64; q++) start[q] = at, at += n->in[q] >= 0 ? em_t(e, n->in[q])->dims[a] : 0;
  /* Reverse input order, as the other rules. */
  for (int q = n->nin - 1; q >= 0; q--) {
    if (!em_needs(e, n, q)) continue;
    int64_t len = em_t(e, n->in[q])->dims[a];
    int acc, d = em_grad(e, n, q, &acc);
    int ph = em_t(e, n->in[q])->is_param ? PH_WGRAD : PH_IGRAD;
    CALL(e, ph, K_PUT_GRAD, n, A_BUF(dy), A_BUF(d), A_INT(outer), A_INT(Y->dims[a]), A_INT(inner), A_INT(start[q]), A_INT(len), A_INT(acc));
  }
  return 0;
}

static int concat_check(Graph *g, Node *n) {
  if (n->nin > 64) return err_set("node '%s' (Concat): %d inputs; at most 64 are supported", n->name, n->nin);
  return concat_infer(g, n);
}

/* ---- Pad (constant mode): pads from an attribute before opset 11, a constant input after ---- */

static int pad_params(Graph *g, Node *n, const Tensor *x, int64_t *begin, int64_t *end, float *value) {
  const char *mode = attr_str(n, "mode", "constant");
  if (strcmp(mode, "constant")) return node_err(n, "mode '%s' is not supported (only constant)", mode);
  int64_t pads[2 * MAX_RANK];
  int c;
  if (g->opset < 11) {
    c = attr_ints(n, "pads", pads, 2 * MAX_RANK);
    *value = attr_float(n, "value", 0);
  } else {
    if (!need_const(g, n, 1, "pads")) return -1;
    if (n->nin > 3 && n->in[3] >= 0) return node_err(n, "the axes input is not supported");
    if (ints_from_attr_or_input(g, n, "", 1, pads, 2 * MAX_RANK, &c)) return -1;
    Tensor *v = node_in(g, n, 2);
    if (v && !v->data) return node_err(n, "constant_value must be a compile-time constant");
    *value = v && ir_numel(v) ? (float)const_f64(v, 0) : 0;
  }
  if (c != 2 * x->rank) return node_err(n, "pads has %d values for rank %d", c, x->rank);
  for (int i = 0; i < x->rank; i++) {
    begin[i] = pads[i], end[i] = pads[i + x->rank];
    if (begin[i] < 0 || end[i] < 0) return node_err(n, "negative pads (cropping) are not supported");
  }
  return 0;
}

static int pad_infer(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0);
  if (!x) return -1;
  int64_t b[MAX_RANK], e[MAX_RANK], dims[MAX_RANK];
  float v;
  if (pad_params(g, n, x, b, e, &v)) return -1;
  for (int i = 0; i < x->rank; i++) dims[i] = x->dims[i] + b[i] + e[i];
  set_shape(node_out(g, n, 0), x->dtype, x->rank, dims);
  return 0;
}

static int pad_fwd(Emit *e, const Node *n, int j) {
  Tensor *X = em_t(e, n->in[0]), *Y = em_t(e, n->out[0]);
  int64_t b[MAX_RANK], end[MAX_RANK];
  float v;
  if (pad_params(em_graph(e), (Node *)n, X, b, end, &v)) return -1;
  int ps = SHAPE(e, "PadShape", em_name(e, "PAD_%d", j), A_INT(X->rank), A_INTS(X->dims, X->rank), A_INTS(Y->dims, X->rank),
                 A_INTS(b, X->rank), A_FLT(v));
  CALL(e, PH_FWD, K_PAD, n, A_BUF(em_in(e, n, 0)), A_BUF(em_out(e, n, 0)), A_CONST(ps));
  return 0;
}
static int pad_bwd(Emit *e, const Node *n, int j) {
  if (!em_needs(e, n, 0)) return 0;
  int acc, dx = em_grad(e, n, 0, &acc);
  CALL(e, PH_IGRAD, K_PAD_GRAD, n, A_BUF(em_dy(e, n, 0)), A_BUF(dx), A_CONST(em_shape_ref(e, em_name(e, "PAD_%d", j))), A_INT(acc));
  return 0;
}

/* ---- Gather: any axis at compile time; on axis 0 of a float table by int64
 * ids (embeddings) at run time ---- */

static int gather_infer(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0), *idx = need_in(g, n, 1);
  if (!x || !idx) return -1;
  if (idx->dtype != DT_INT64 && idx->dtype != DT_INT32) return node_err(n, "indices must be int32 or int64");
  int a = norm_axis(attr_int(n, "axis", 0), x->rank);
  if (a < 0) return node_err(n, "axis is out of range for %s", shape_str(x));
  int r = x->rank - 1 + idx->rank;
  if (r > MAX_RANK) return node_err(n, "the result would have rank %d", r);
  int64_t dims[MAX_RANK];
  int k = 0;
  for (int i = 0; i < a; i++) dims[k++] = x->dims[i];
  for (int i = 0; i < idx->rank; i++) dims[k++] = idx->dims[i];
  for (int i = a + 1; i < x->rank; i++) dims[k++] = x->dims[i];
  if (idx->data)
    for (int64_t i = 0; i < ir_numel(idx); i++) {
      int64_t v = const_i64(idx, i);
      if (v < -x->dims[a] || v >= x->dims[a])
        return node_err(n, "index %lld is out of range for axis %d of size %lld", (long long)v, a, (long long)x->dims[a]);
    }
  set_shape(node_out(g, n, 0), x->dtype, r, dims);
  return 0;
}

static int gather_fold(Graph *g, Node *n) {
  Tensor *x = node_in(g, n, 0), *idx = node_in(g, n, 1), *o = node_out(g, n, 0);
  fold_alloc(g, o);
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

static int gather_fwd(Emit *e, const Node *n, int j) {
  (void)j;
  Tensor *D = em_t(e, n->in[0]), *I = em_t(e, n->in[1]);
  if (attr_int(n, "axis", 0) != 0 || D->dtype != DT_FLOAT || I->dtype != DT_INT64)
    return err_set("node '%s' (Gather): only float tables indexed by int64 on axis 0 (embeddings) train so far", n->name);
  CALL(e, PH_FWD, K_GATHER, n, A_BUF(em_in(e, n, 0)), A_BUF(em_in(e, n, 1)), A_BUF(em_out(e, n, 0)), A_INT(ir_numel(I)),
       A_INT(D->dims[0]), A_INT(ir_numel(D) / D->dims[0]), A_STR(n->name));
  return 0;
}
static int gather_bwd(Emit *e, const Node *n, int j) {
  (void)j;
  if (!em_needs(e, n, 0)) return 0;
  Tensor *D = em_t(e, n->in[0]), *I = em_t(e, n->in[1]);
  int ib = em_in(e, n, 1), acc, d = em_grad(e, n, 0, &acc), dy = em_dy(e, n, 0);
  int ph = D->is_param ? PH_WGRAD : PH_IGRAD;
  if (!acc) CALL(e, ph, K_ZERO, n, A_BUF(d), A_INT(ir_numel(D)));
  CALL(e, ph, K_GATHER_GRAD, n, A_BUF(ib), A_BUF(dy), A_BUF(d), A_INT(ir_numel(I)), A_INT(D->dims[0]), A_INT(ir_numel(D) / D->dims[0]),
       A_STR(n->name));
  return 0;
}

/* ---- strided views: Slice, Expand, Tile (k_view / k_view_grad) ---- */

/* Drops axes of size 1 and merges an axis into the next where the input is
 * contiguous across them, so the kernel's rows are as long as they can be.
 * Keeps at least one axis (a scalar is one element of stride 0). */
static int view_compact(int rank, int64_t *out, int64_t *st) {
  int r = 0;
  for (int i = 0; i < rank; i++) {
    if (out[i] == 1) continue;
    if (r > 0 && st[r - 1] == st[i] * out[i]) {
      out[r - 1] *= out[i], st[r - 1] = st[i];
      continue;
    }
    out[r] = out[i], st[r] = st[i], r++;
  }
  if (!r) out[0] = 1, st[0] = 0, r = 1;
  return r;
}

/* The forward call of a view of input 0: output dims `out`, input strides
 * `st` (rank axes), input offset `base`; its shape constant is VIEW_<j>. */
static int view_fwd(Emit *e, const Node *n, int j, int rank, int64_t *out, int64_t *st, int64_t base) {
  Tensor *X = em_t(e, n->in[0]), *Y = em_t(e, n->out[0]);
  if (X->dtype != DT_FLOAT)
    return err_set("node '%s' (%s): only float values are moved at run time (this input is %s)", n->name, n->op, dtype_name(X->dtype));
  rank = view_compact(rank, out, st);
  int vs = SHAPE(e, "ViewShape", em_name(e, "VIEW_%d", j), A_INT(rank), A_INTS(out, rank), A_INTS(st, rank), A_INT(base),
                 A_INT(ir_numel(Y)), A_INT(ir_numel(X)));
  CALL(e, PH_FWD, K_VIEW, n, A_BUF(em_in(e, n, 0)), A_BUF(em_out(e, n, 0)), A_CONST(vs));
  return 0;
}
/* Every view's gradient: dy added back where each output element came from. */
static int view_bwd(Emit *e, const Node *n, int j) {
  if (!em_needs(e, n, 0)) return 0;
  int acc, dx = em_grad(e, n, 0, &acc);
  int ph = em_t(e, n->in[0])->is_param ? PH_WGRAD : PH_IGRAD;
  CALL(e, ph, K_VIEW_GRAD, n, A_BUF(em_dy(e, n, 0)), A_BUF(dx), A_CONST(em_shape_ref(e, em_name(e, "VIEW_%d", j))), A_INT(acc));
  return 0;
}

/* Clamps ONNX Slice bounds for one axis exactly as the spec does. */
static void slice_bounds(int64_t dim, int64_t start, int64_t end, int64_t step, int64_t *s, int64_t *count) {
  if (start < 0) start += dim;
  if (end < 0) end += dim;
  if (step > 0) {
    start = start < 0 ? 0 : start > dim ? dim : start;
    end = end < 0 ? 0 : end > dim ? dim : end;
    *count = end > start ? (end - start - 1) / step + 1 : 0;
  } else {
    start = start < 0 ? -1 : start > dim - 1 ? dim - 1 : start;
    end = end < -1 ? -1 : end > dim - 1 ? dim - 1 : end;
    if (step == INT64_MIN) step = -INT64_MAX;
    *count = start > end ? (start - end - 1) / -step + 1 : 0;
  }
  *s = start;
}

static int slice_params(Graph *g, Node *n, const Tensor *x, int64_t *start, int64_t *step, int64_t *dims) {
  int64_t st[MAX_RANK], en[MAX_RANK], ax[MAX_RANK], sp[MAX_RANK];
  int cs, ce, ca, cp;
  if (g->opset < 10) {
    cs = attr_ints(n, "starts", st, MAX_RANK), ce = attr_ints(n, "ends", en, MAX_RANK);
    ca = attr_ints(n, "axes", ax, MAX_RANK), cp = -1;
  } else {
    if (!need_const(g, n, 1, "starts") || !need_const(g, n, 2, "ends")) return -1;
    if (ints_from_attr_or_input(g, n, "", 1, st, MAX_RANK, &cs) || ints_from_attr_or_input(g, n, "", 2, en, MAX_RANK, &ce) ||
        ints_from_attr_or_input(g, n, "", 3, ax, MAX_RANK, &ca) || ints_from_attr_or_input(g, n, "", 4, sp, MAX_RANK, &cp))
      return -1;
  }
  if (cs < 0 || cs != ce) return node_err(n, "starts and ends must have the same length");
  if (ca >= 0 && ca != cs) return node_err(n, "axes must have as many entries as starts");
  if (cp >= 0 && cp != cs) return node_err(n, "steps must have as many entries as starts");
  for (int i = 0; i < x->rank; i++) start[i] = 0, step[i] = 1, dims[i] = x->dims[i];
  int seen = 0;
  for (int i = 0; i < cs; i++) {
    int a = norm_axis(ca >= 0 ? ax[i] : i, x->rank);
    if (a < 0 || (seen >> a & 1)) return node_err(n, "slice axis %lld is out of range or repeated", (long long)(ca >= 0 ? ax[i] : i));
    seen |= 1 << a;
    step[a] = cp >= 0 ? sp[i] : 1;
    if (step[a] == 0) return node_err(n, "a slice step is 0");
    slice_bounds(x->dims[a], st[i], en[i], step[a], &start[a], &dims[a]);
  }
  return 0;
}

static int slice_infer(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0);
  if (!x) return -1;
  int64_t start[MAX_RANK], step[MAX_RANK], dims[MAX_RANK];
  if (slice_params(g, n, x, start, step, dims)) return -1;
  set_shape(node_out(g, n, 0), x->dtype, x->rank, dims);
  return 0;
}

static int slice_fold(Graph *g, Node *n) {
  Tensor *x = node_in(g, n, 0), *o = node_out(g, n, 0);
  fold_alloc(g, o);
  int64_t start[MAX_RANK], step[MAX_RANK], dims[MAX_RANK], xs[MAX_RANK], st[MAX_RANK], base = 0;
  if (slice_params(g, n, x, start, step, dims)) return -1;
  row_strides(x, xs);
  for (int i = 0; i < x->rank; i++) base += start[i] * xs[i], st[i] = step[i] * xs[i];
  if (ir_numel(o)) gather_view(x, o, base, st);
  return 0;
}

static int slice_fwd(Emit *e, const Node *n, int j) {
  Tensor *X = em_t(e, n->in[0]);
  int64_t start[MAX_RANK], step[MAX_RANK], dims[MAX_RANK], st[MAX_RANK], base = 0;
  if (slice_params(em_graph(e), (Node *)n, X, start, step, dims)) return -1;
  row_strides(X, st);
  for (int i = 0; i < X->rank; i++) base += start[i] * st[i], st[i] *= step[i];
  return view_fwd(e, n, j, X->rank, dims, st, base);
}

static int cast_infer(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0);
  if (!x) return -1;
  int64_t to = attr_int(n, "to", 0);
  if (!dtype_size((int)to)) return node_err(n, "cast to element type %lld is not supported", (long long)to);
  copy_shape(node_out(g, n, 0), x);
  node_out(g, n, 0)->dtype = (int)to;
  return 0;
}

static int cast_fold(Graph *g, Node *n) {
  Tensor *x = node_in(g, n, 0), *o = node_out(g, n, 0);
  fold_alloc(g, o);
  for (int64_t i = 0; i < ir_numel(o); i++)
    if (dtype_is_float(x->dtype)) const_set_f64(o, i, const_f64(x, i));
    else const_set_i64(o, i, const_i64(x, i));
  return 0;
}

/* The casts that run: training values are float32 or int64 (the loader's
 * images and token ids, and what Cast makes of them); an inference program
 * also reads bool, int32 and float16 inputs.  Any other cast only folds. */
static const struct {
  int from, to, kernel;
} RUN_CASTS[] = {
    {DT_FLOAT, DT_FLOAT, K_COPY},           {DT_INT64, DT_FLOAT, K_CAST_I64_F32}, {DT_FLOAT, DT_INT64, K_CAST_F32_I64},
    {DT_INT32, DT_FLOAT, K_CAST_I32_F32},   {DT_BOOL, DT_FLOAT, K_CAST_BOOL_F32}, {DT_FLOAT16, DT_FLOAT, K_CAST_F16_F32},
};

static int cast_fwd(Emit *e, const Node *n, int j) {
  (void)j;
  Tensor *X = em_t(e, n->in[0]), *Y = em_t(e, n->out[0]);
  for (size_t k = 0; k < sizeof RUN_CASTS / sizeof RUN_CASTS[0]; k++)
    if (RUN_CASTS[k].from == X->dtype && RUN_CASTS[k].to == Y->dtype) {
      CALL(e, PH_FWD, RUN_CASTS[k].kernel, n, A_BUF(em_in(e, n, 0)), A_BUF(em_out(e, n, 0)), A_INT(ir_numel(Y)));
      return 0;
    }
  return err_set("node '%s' (Cast): a cast from %s to %s runs only at compile time (at run time: float32 <-> int64, "
                 "float32 -> float32, and bool, int32 or float16 -> float32)", n->name, dtype_name(X->dtype), dtype_name(Y->dtype));
}

static int expand_infer(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0), *s = need_const(g, n, 1, "the shape");
  if (!x || !s) return -1;
  Tensor target = {0};
  target.rank = (int)ir_numel(s);
  if (s->rank != 1 || target.rank > MAX_RANK) return node_err(n, "the shape must be 1-D with at most %d values", MAX_RANK);
  for (int i = 0; i < target.rank; i++) target.dims[i] = const_i64(s, i);
  int r;
  int64_t dims[MAX_RANK];
  if (broadcast_shape(x, &target, &r, dims)) return node_err(n, "%s does not expand to %s", shape_str(x), shape_str(&target));
  set_shape(node_out(g, n, 0), x->dtype, r, dims);
  return 0;
}

static int expand_fold(Graph *g, Node *n) {
  Tensor *x = node_in(g, n, 0), *o = node_out(g, n, 0);
  fold_alloc(g, o);
  int64_t st[MAX_RANK];
  bcast_strides(x, o->rank, st);
  gather_view(x, o, 0, st);
  return 0;
}

static int expand_fwd(Emit *e, const Node *n, int j) {
  Tensor *X = em_t(e, n->in[0]), *Y = em_t(e, n->out[0]);
  int64_t dims[MAX_RANK], st[MAX_RANK];
  memcpy(dims, Y->dims, sizeof dims);
  bcast_strides(X, Y->rank, st);
  return view_fwd(e, n, j, Y->rank, dims, st, 0);
}

/* ---- Tile: y = x repeated repeats[i] times along each axis i ---- */

static int tile_repeats(Graph *g, Node *n, const Tensor *x, int64_t *reps) {
  if (!need_const(g, n, 1, "repeats")) return -1;
  int c;
  if (ints_from_attr_or_input(g, n, "", 1, reps, MAX_RANK, &c)) return -1;
  if (c != x->rank) return node_err(n, "repeats has %d values for input %s of rank %d", c, shape_str(x), x->rank);
  for (int i = 0; i < c; i++)
    if (reps[i] < 0) return node_err(n, "repeats[%d] is negative (%lld)", i, (long long)reps[i]);
  return 0;
}

static int tile_infer(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0);
  if (!x) return -1;
  int64_t reps[MAX_RANK], dims[MAX_RANK];
  if (tile_repeats(g, n, x, reps)) return -1;
  for (int i = 0; i < x->rank; i++) {
    if (reps[i] && x->dims[i] > INT64_MAX / reps[i]) return node_err(n, "the result is too large");
    dims[i] = x->dims[i] * reps[i];
  }
  set_shape(node_out(g, n, 0), x->dtype, x->rank, dims);
  return 0;
}

/* x read as [r0, d0, r1, d1, ...]: a repeat axis has stride 0. */
static int tile_view(const Tensor *x, const int64_t *reps, int64_t *out, int64_t *st) {
  int64_t xs[MAX_RANK];
  int r = 0;
  row_strides(x, xs);
  for (int i = 0; i < x->rank; i++) {
    out[r] = reps[i], st[r++] = 0;
    out[r] = x->dims[i], st[r++] = xs[i];
  }
  return r;
}

static int tile_fold(Graph *g, Node *n) {
  Tensor *x = node_in(g, n, 0), *o = node_out(g, n, 0);
  fold_alloc(g, o);
  int64_t reps[MAX_RANK], out[2 * MAX_RANK], st[2 * MAX_RANK], esz = dtype_size(x->dtype);
  if (tile_repeats(g, n, x, reps)) return -1;
  int r = tile_view(x, reps, out, st);
  for (int64_t i = 0; i < ir_numel(o); i++) {
    int64_t off = 0, rest = i;
    for (int d = r - 1; d >= 0; d--) off += (rest % out[d]) * st[d], rest /= out[d];
    memcpy((char *)o->data + i * esz, (const char *)x->data + off * esz, (size_t)esz);
  }
  return 0;
}

static int tile_fwd(Emit *e, const Node *n, int j) {
  Tensor *X = em_t(e, n->in[0]);
  int64_t reps[MAX_RANK], out[2 * MAX_RANK], st[2 * MAX_RANK];
  if (tile_repeats(em_graph(e), (Node *)n, X, reps)) return -1;
  return view_fwd(e, n, j, tile_view(X, reps, out, st), out, st, 0);
}

/* ---- Dropout: drops at run time in training (kernels.h draws the masks) ---- */

/* When a Dropout drops.  From opset 12 ONNX says it with a training_mode
 * input (false when absent): torch exports nn.Dropout in training mode with
 * training_mode = true, and in eval mode no node at all.  Before 12 there is
 * no flag: the op drops while training and copies in inference, so a
 * training program drops and an inference one (--forward-only) copies. */
enum { DROP_NEVER, DROP_ALWAYS, DROP_WHEN_TRAINING };

/* Reads ratio and the mode; infer has checked that they are constants.  The
 * optional seed attribute is not read: masks are keyed by the run's --seed. */
static int dropout_params(Graph *g, const Node *n, float *ratio) {
  if (g->opset < 12) {
    *ratio = attr_float(n, "ratio", 0.5f);
    return DROP_WHEN_TRAINING;
  }
  Tensor *r = node_in(g, n, 1), *t = node_in(g, n, 2);
  *ratio = r ? (float)const_f64(r, 0) : 0.5f;
  return t && const_i64(t, 0) ? DROP_ALWAYS : DROP_NEVER;
}

static int dropout_infer(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0);
  if (!x) return -1;
  if (g->opset >= 12)
    for (int k = 1; k <= 2; k++) {
      Tensor *c = node_in(g, n, k);
      if (c && !need_const(g, n, k, k == 1 ? "the ratio" : "training_mode")) return -1;
      if (c && ir_numel(c) != 1) return node_err(n, "%s must be a single value, not %s", k == 1 ? "the ratio" : "training_mode", shape_str(c));
    }
  float ratio;
  dropout_params(g, n, &ratio);
  if (!(ratio >= 0 && ratio <= 1)) return node_err(n, "the ratio %g is outside [0, 1]", (double)ratio);
  copy_shape(node_out(g, n, 0), x);
  Tensor *m = node_out(g, n, 1);
  if (m) copy_shape(m, x), m->dtype = DT_BOOL;
  return 0;
}

/* The ratio this node drops with in this program: 0 when it copies. */
static float dropout_ratio(Emit *e, const Node *n) {
  float ratio;
  int mode = dropout_params(em_graph(e), n, &ratio);
  return mode == DROP_ALWAYS || (mode == DROP_WHEN_TRAINING && em_training(e)) ? ratio : 0;
}

/* A Philox draw per 4 elements and a multiply: about 8 operations an element. */
static double dropout_flops(Graph *g, const Node *n) { return 8 * rule_numel(node_out(g, n, 0)); }

/* The node's graph index j keys its masks: the same node has the same id in every partition. */
static int dropout_fwd(Emit *e, const Node *n, int j) {
  float ratio = dropout_ratio(e, n);
  int64_t count = ir_numel(em_t(e, n->out[0]));
  int mask = em_used(e, n, 1) ? em_out(e, n, 1) : -1;
  if (ratio == 0 && mask < 0) return copy_fwd(e, n, j); /* the identity: an eval-mode Dropout, or p = 0 */
  CALL(e, PH_FWD, K_DROPOUT, n, A_BUF(em_in(e, n, 0)), A_BUF(em_out(e, n, 0)), A_BUF(mask), A_INT(count), A_FLT(ratio),
       A_INT(j), A_SYM("&pr_rand"));
  /* The eval forward keeps every element, unscaled: ratio 0. */
  if (ratio != 0)
    VARIANT(e, VAR_EVAL, K_DROPOUT, A_BUF(em_in(e, n, 0)), A_BUF(em_out(e, n, 0)), A_BUF(mask), A_INT(count), A_FLT(0), A_INT(j),
            A_SYM("&pr_rand"));
  return 0;
}
static int dropout_bwd(Emit *e, const Node *n, int j) {
  float ratio = dropout_ratio(e, n);
  if (ratio == 0) return copy_bwd(e, n, j);
  if (!em_needs(e, n, 0)) return 0;
  int acc, dx = em_grad(e, n, 0, &acc);
  CALL(e, PH_IGRAD, K_DROPOUT_GRAD, n, A_BUF(em_dy(e, n, 0)), A_BUF(dx), A_INT(ir_numel(em_t(e, n->out[0]))), A_FLT(ratio),
       A_INT(j), A_SYM("&pr_rand"), A_INT(acc));
  return 0;
}

#define RESHAPE(name, infer) {name, "movement", infer, fold_copy, 1, STASH_NONE, NULL, 0, copy_fwd, copy_bwd, NULL, 0, 0, 1}
#define FOLD_ONLY(name, infer, fold, stash) {name, "movement", infer, fold, 1, stash, NULL, 0, NULL, NULL, NULL, 0, 0, 0}
const OpDef OPS_MOVEMENT[] = {
    RESHAPE("Reshape", reshape_infer),
    RESHAPE("Flatten", flatten_infer),
    RESHAPE("Squeeze", squeeze_infer),
    RESHAPE("Unsqueeze", unsqueeze_infer),
    RESHAPE("Identity", infer_same),
    {"Transpose", "movement", transpose_infer, transpose_fold, 1, STASH_NONE, NULL, 0, transpose_fwd, transpose_bwd, NULL, 0, 0, 1},
    {"Split", "movement", split_infer, split_fold, 1, STASH_NONE, NULL, 0, split_fwd, split_bwd, NULL, 0, 0, 1},
    {"Concat", "movement", concat_check, concat_fold, 0xffffffffu, STASH_NONE, NULL, 0, concat_fwd, concat_bwd, NULL, 0, 0, ~0u},
    {"Pad", "movement", pad_infer, NULL, 1, STASH_NONE, NULL, 0, pad_fwd, pad_bwd, NULL, 0, 0, 1},
    {"Gather", "movement", gather_infer, gather_fold, 1, STASH_INPUTS, NULL, 0, gather_fwd, gather_bwd, NULL, 0, 0, 1},
    {"Slice", "movement", slice_infer, slice_fold, 1, STASH_NONE, NULL, 0, slice_fwd, view_bwd, NULL, 0, OPF_READS_PART, 1},
    {"Expand", "movement", expand_infer, expand_fold, 1, STASH_NONE, NULL, 0, expand_fwd, view_bwd, NULL, 0, 0, 1},
    {"Tile", "movement", tile_infer, tile_fold, 1, STASH_NONE, NULL, 0, tile_fwd, view_bwd, NULL, 0, 0, 1},
    /* Cast's gradient is a copy: it reaches only float -> float casts (an integer carries none). */
    {"Cast", "movement", cast_infer, cast_fold, 1, STASH_NONE, NULL, 0, cast_fwd, copy_bwd, NULL, 0, 0, 0},
    /* Backward redraws the mask (k_dropout_grad says why): nothing is stashed. */
    {"Dropout", "movement", dropout_infer, NULL, 1, STASH_NONE, dropout_flops, 0, dropout_fwd, dropout_bwd, NULL, 0, 0, 1},
    {0},
};
