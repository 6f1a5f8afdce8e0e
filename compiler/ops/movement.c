/* movement.c - ops that move data without arithmetic: the reshapes (Reshape,
 * Flatten, Squeeze, Unsqueeze, Identity), Transpose, Split, Concat, Pad,
 * Gather (embeddings), and Slice, Cast, Expand, Dropout (compile time only). */
#include "ops/rule.h"

/* ---- reshapes: the same bytes under a new shape ---- */

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
  return infer_Concat(g, n);
}

/* ---- Pad (constant mode) ---- */

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

/* ---- Gather on axis 0 of a float table by int64 ids (embeddings) ---- */

static int gather_fwd(Emit *e, const Node *n, int j) {
  (void)j;
  Tensor *D = em_t(e, n->in[0]), *I = em_t(e, n->in[1]);
  if (attr_int(n, "axis", 0) != 0 || D->dtype != DT_FLOAT || I->dtype != DT_INT64)
    return err_set("node '%s' (Gather): only float tables indexed by int64 on axis 0 (embeddings) train so far", n->name);
  CALL(e, PH_FWD, K_GATHER, n, A_BUF(em_in(e, n, 0)), A_BUF(em_in(e, n, 1)), A_BUF(em_out(e, n, 0)), A_INT(ir_numel(I)),
       A_INT(D->dims[0]), A_INT(ir_numel(D) / D->dims[0]));
  return 0;
}
static int gather_bwd(Emit *e, const Node *n, int j) {
  (void)j;
  if (!em_needs(e, n, 0)) return 0;
  Tensor *D = em_t(e, n->in[0]), *I = em_t(e, n->in[1]);
  int ib = em_in(e, n, 1), acc, d = em_grad(e, n, 0, &acc), dy = em_dy(e, n, 0);
  int ph = D->is_param ? PH_WGRAD : PH_IGRAD;
  if (!acc) CALL(e, ph, K_ZERO, n, A_BUF(d), A_INT(ir_numel(D)));
  CALL(e, ph, K_GATHER_GRAD, n, A_BUF(ib), A_BUF(dy), A_BUF(d), A_INT(ir_numel(I)), A_INT(D->dims[0]), A_INT(ir_numel(D) / D->dims[0]));
  return 0;
}

#define RESHAPE(name, infer) {name, "movement", infer, fold_Copy, 1, STASH_NONE, NULL, 0, copy_fwd, copy_bwd, NULL}
const OpDef OPS_MOVEMENT[] = {
    RESHAPE("Reshape", infer_Reshape),
    RESHAPE("Flatten", infer_Flatten),
    RESHAPE("Squeeze", infer_Squeeze),
    RESHAPE("Unsqueeze", infer_Unsqueeze),
    {"Identity", "movement", infer_Unary, fold_Unary, 1, STASH_NONE, NULL, 0, copy_fwd, copy_bwd, NULL},
    {"Transpose", "movement", infer_Transpose, fold_Transpose, 1, STASH_NONE, NULL, 0, transpose_fwd, transpose_bwd, NULL},
    {"Split", "movement", infer_Split, fold_Split, 1, STASH_NONE, NULL, 0, split_fwd, split_bwd, NULL},
    {"Concat", "movement", concat_check, fold_Concat, 0xffffffffu, STASH_NONE, NULL, 0, concat_fwd, concat_bwd, NULL},
    {"Pad", "movement", infer_Pad, NULL, 1, STASH_NONE, NULL, 0, pad_fwd, pad_bwd, NULL},
    {"Gather", "movement", infer_Gather, fold_Gather, 1, STASH_INPUTS, NULL, 0, gather_fwd, gather_bwd, NULL},
    /* Shape rules and folding, no run-time kernels yet. */
    {"Slice", "movement", infer_Slice, fold_Slice, 1, STASH_NONE, NULL, 0, NULL, NULL, NULL},
    {"Cast", "movement", infer_Cast, fold_Cast, 1, STASH_NONE, NULL, 0, NULL, NULL, NULL},
    {"Expand", "movement", infer_Expand, fold_Expand, 1, STASH_NONE, NULL, 0, NULL, NULL, NULL},
    {"Dropout", "movement", infer_Dropout, NULL, 1, STASH_OUTPUT, NULL, 0, NULL, NULL, NULL},
    {0},
};
