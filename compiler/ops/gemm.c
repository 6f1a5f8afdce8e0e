/* gemm.c - matrix products: Gemm and MatMul (batched, broadcast). */
#include "ops/rule.h"

/* ---- Gemm: Y = alpha * op(A) op(B) + beta * C ---- */

static int gemm_infer(Graph *g, Node *n) {
  Tensor *a = need_in(g, n, 0), *b = need_in(g, n, 1);
  if (!a || !b) return -1;
  if (a->rank != 2 || b->rank != 2) return node_err(n, "A %s and B %s must be matrices", shape_str(a), shape_str(b));
  int ta = (int)attr_int(n, "transA", 0), tb = (int)attr_int(n, "transB", 0);
  int64_t m = ta ? a->dims[1] : a->dims[0], k = ta ? a->dims[0] : a->dims[1];
  int64_t k2 = tb ? b->dims[1] : b->dims[0], nn = tb ? b->dims[0] : b->dims[1];
  if (k != k2) return node_err(n, "inner dimensions differ: A %s%s, B %s%s", shape_str(a), ta ? "^T" : "",
                               shape_str(b), tb ? "^T" : "");
  int64_t dims[2] = {m, nn};
  Tensor *c = node_in(g, n, 2);
  if (c) {
    Tensor y = {0};
    y.rank = 2, y.dims[0] = m, y.dims[1] = nn;
    int r;
    int64_t bd[MAX_RANK];
    if (c->rank < 0 || broadcast_shape(&y, c, &r, bd) || r != 2 || bd[0] != m || bd[1] != nn)
      return node_err(n, "C %s does not broadcast to [%lld,%lld]", shape_str(c), (long long)m, (long long)nn);
  }
  set_shape(node_out(g, n, 0), a->dtype, 2, dims);
  return 0;
}

typedef struct GemmDims { int M, N, K, ta, tb, cm, cn; } GemmDims;

static GemmDims gemm_dims(Emit *e, const Node *n) {
  Tensor *A = em_t(e, n->in[0]), *Y = em_t(e, n->out[0]);
  GemmDims d = {0};
  d.ta = (int)attr_int(n, "transA", 0), d.tb = (int)attr_int(n, "transB", 0);
  d.M = (int)Y->dims[0], d.N = (int)Y->dims[1], d.K = (int)(d.ta ? A->dims[0] : A->dims[1]);
  if (n->nin > 2 && n->in[2] >= 0) {
    Tensor *C = em_t(e, n->in[2]);
    d.cm = C->rank == 2 ? (int)C->dims[0] : 1;
    d.cn = C->rank >= 1 ? (int)C->dims[C->rank - 1] : 1;
  }
  return d;
}

static int gemm_fwd(Emit *e, const Node *n, int j) {
  (void)j;
  GemmDims d = gemm_dims(e, n);
  int c = d.cm ? em_in(e, n, 2) : -1;
  CALL(e, PH_FWD, K_GEMM, n, A_BUF(em_in(e, n, 0)), A_BUF(em_in(e, n, 1)), A_BUF(c), A_BUF(em_out(e, n, 0)), A_INT(d.M),
       A_INT(d.N), A_INT(d.K), A_INT(d.ta), A_INT(d.tb), A_FLT(attr_float(n, "alpha", 1)), A_FLT(attr_float(n, "beta", 1)),
       A_INT(d.cm), A_INT(d.cn));
  return 0;
}

static int gemm_bwd(Emit *e, const Node *n, int j) {
  (void)j;
  GemmDims d = gemm_dims(e, n);
  int dy = em_dy(e, n, 0), acc;
  float alpha = attr_float(n, "alpha", 1), beta = attr_float(n, "beta", 1);
  if (em_needs(e, n, 1)) {
    int db = em_grad(e, n, 1, &acc);
    CALL(e, PH_WGRAD, K_GEMM_DB, n, A_BUF(dy), A_BUF(em_in(e, n, 0)), A_BUF(db), A_INT(d.M), A_INT(d.N), A_INT(d.K), A_INT(d.ta),
         A_INT(d.tb), A_FLT(alpha), A_INT(acc));
  }
  if (d.cm && em_needs(e, n, 2)) {
    int dc = em_grad(e, n, 2, &acc);
    CALL(e, PH_WGRAD, K_GEMM_DC, n, A_BUF(dy), A_BUF(dc), A_INT(d.M), A_INT(d.N), A_INT(d.cm), A_INT(d.cn), A_FLT(beta), A_INT(acc));
  }
  if (em_needs(e, n, 0)) {
    int dx = em_grad(e, n, 0, &acc);
    CALL(e, PH_IGRAD, K_GEMM_DA, n, A_BUF(dy), A_BUF(em_in(e, n, 1)), A_BUF(dx), A_INT(d.M), A_INT(d.N), A_INT(d.K), A_INT(d.ta),
         A_INT(d.tb), A_FLT(alpha), A_INT(acc));
  }
  return 0;
}

static double gemm_flops(Graph *g, const Node *n) {
  Tensor *a = node_in(g, n, 0);
  double k = (double)(attr_int(n, "transA", 0) ? a->dims[0] : a->dims[1]), out = rule_numel(node_out(g, n, 0));
  return 2.0 * out * k + (node_in(g, n, 2) ? out : 0);
}

/* ---- MatMul: numpy semantics, the batch dimensions broadcast ---- */

static int matmul_infer(Graph *g, Node *n) {
  Tensor *a = need_in(g, n, 0), *b = need_in(g, n, 1);
  if (!a || !b) return -1;
  if (a->rank < 1 || b->rank < 1) return node_err(n, "inputs must have rank >= 1");
  /* Promote 1-D operands as numpy does, then broadcast the batch dims. */
  Tensor A = *a, B = *b;
  if (A.rank == 1) A.rank = 2, A.dims[1] = a->dims[0], A.dims[0] = 1;
  if (B.rank == 1) B.rank = 2, B.dims[0] = b->dims[0], B.dims[1] = 1;
  if (A.dims[A.rank - 1] != B.dims[B.rank - 2])
    return node_err(n, "inner dimensions differ: %s x %s", shape_str(a), shape_str(b));
  Tensor ab = A, bb = B;
  ab.rank -= 2, bb.rank -= 2;
  int rank;
  int64_t dims[MAX_RANK];
  if (broadcast_shape(&ab, &bb, &rank, dims))
    return node_err(n, "batch dimensions of %s and %s do not broadcast", shape_str(a), shape_str(b));
  if (a->rank > 1) dims[rank++] = A.dims[A.rank - 2];
  if (b->rank > 1) dims[rank++] = B.dims[B.rank - 1];
  set_shape(node_out(g, n, 0), a->dtype, rank, dims);
  return 0;
}

static int matmul_fwd(Emit *e, const Node *n, int j) {
  Tensor *A = em_t(e, n->in[0]), *B = em_t(e, n->in[1]), *Y = em_t(e, n->out[0]);
  if (A->rank < 2 || B->rank < 2) return err_set("node '%s' (MatMul): 1-D operands do not train yet", n->name);
  int nb = Y->rank - 2, shared = B->rank == 2;
  int64_t batch = 1, sa[MAX_RANK] = {0}, sb[MAX_RANK] = {0};
  for (int i = 0; i < nb; i++) {
    batch *= Y->dims[i];
    int ia = i - (nb - (A->rank - 2)), ib = i - (nb - (B->rank - 2));
    int64_t ma = 1, mb = 1;
    for (int z = ia + 1; z < A->rank - 2; z++) ma *= A->dims[z];
    for (int z = ib + 1; z < B->rank - 2; z++) mb *= B->dims[z];
    sa[i] = ia < 0 || A->dims[ia] == 1 ? 0 : ma;
    sb[i] = ib < 0 || B->dims[ib] == 1 ? 0 : mb;
  }
  /* Folding the batch into M needs A to cover every batch index itself. */
  for (int i = 0; i < nb; i++) shared &= sa[i] != 0 || Y->dims[i] == 1;
  int mm = SHAPE(e, "MatMulShape", em_name(e, "MM_%d", j), A_INT(batch), A_INT(Y->dims[Y->rank - 2]), A_INT(Y->dims[Y->rank - 1]),
                 A_INT(A->dims[A->rank - 1]), A_INT(nb), A_INTS(Y->dims, nb > 0 ? nb : 0), A_INTS(sa, nb), A_INTS(sb, nb),
                 A_INT(shared));
  CALL(e, PH_FWD, K_MATMUL, n, A_BUF(em_in(e, n, 0)), A_BUF(em_in(e, n, 1)), A_BUF(em_out(e, n, 0)), A_CONST(mm));
  return 0;
}

static int matmul_bwd(Emit *e, const Node *n, int j) {
  int dy = em_dy(e, n, 0), mm = em_shape_ref(e, em_name(e, "MM_%d", j)), acc;
  /* B first, as PyTorch's autograd and the order every stage count shares. */
  if (em_needs(e, n, 1)) {
    int d = em_grad(e, n, 1, &acc);
    /* A weight's gradient is W work; an activation's (attention's K, V) is input-gradient work. */
    int ph = em_t(e, n->in[1])->is_param ? PH_WGRAD : PH_IGRAD;
    CALL(e, ph, K_MATMUL_DB, n, A_BUF(dy), A_BUF(em_in(e, n, 0)), A_BUF(d), A_INT(ir_numel(em_t(e, n->in[1]))), A_CONST(mm), A_INT(acc));
  }
  if (em_needs(e, n, 0)) {
    int d = em_grad(e, n, 0, &acc);
    CALL(e, PH_IGRAD, K_MATMUL_DA, n, A_BUF(dy), A_BUF(em_in(e, n, 1)), A_BUF(d), A_INT(ir_numel(em_t(e, n->in[0]))), A_CONST(mm),
         A_INT(acc));
  }
  return 0;
}

static double matmul_flops(Graph *g, const Node *n) {
  Tensor *a = node_in(g, n, 0);
  return 2.0 * rule_numel(node_out(g, n, 0)) * (double)a->dims[a->rank - 1];
}

/* ---- MatMul then the Add of a bias, fused (fuse.c): a Gemm over the folded batch ---- */
/* A [..., M, K] x B [K, N] + bias [N]: with B one matrix, the batch folds into the rows, and the
 * whole is k_gemm with C = bias broadcast over the rows (written into Y, then the GEMM adds into
 * it).  The Add's forward pass and the copy of dy its backward made are gone; the bias's gradient
 * is the column sums of dy, as Gemm's C takes it. */
typedef struct BiasDims { int M, N, K; } BiasDims;

static BiasDims mmb_dims(Emit *e, const Node *n) {
  Tensor *A = em_t(e, n->in[0]), *Y = em_t(e, n->out[0]);
  BiasDims d;
  d.K = (int)A->dims[A->rank - 1], d.N = (int)Y->dims[Y->rank - 1], d.M = (int)(ir_numel(Y) / d.N);
  return d;
}

static int mmb_fwd(Emit *e, const Node *n, int j) {
  (void)j;
  BiasDims d = mmb_dims(e, n);
  CALL(e, PH_FWD, K_GEMM, n, A_BUF(em_in(e, n, 0)), A_BUF(em_in(e, n, 1)), A_BUF(em_in(e, n, 2)), A_BUF(em_out(e, n, 0)), A_INT(d.M),
       A_INT(d.N), A_INT(d.K), A_INT(0), A_INT(0), A_FLT(1), A_FLT(1), A_INT(1), A_INT(d.N));
  return 0;
}

static int mmb_bwd(Emit *e, const Node *n, int j) {
  (void)j;
  BiasDims d = mmb_dims(e, n);
  int dy = em_dy(e, n, 0), acc;
  /* B first, then the bias, then A: MatMul's order, the Add's gradient between. */
  if (em_needs(e, n, 1)) {
    int db = em_grad(e, n, 1, &acc);
    CALL(e, em_t(e, n->in[1])->is_param ? PH_WGRAD : PH_IGRAD, K_GEMM_DB, n, A_BUF(dy), A_BUF(em_in(e, n, 0)), A_BUF(db), A_INT(d.M),
         A_INT(d.N), A_INT(d.K), A_INT(0), A_INT(0), A_FLT(1), A_INT(acc));
  }
  if (em_needs(e, n, 2)) {
    int dc = em_grad(e, n, 2, &acc);
    CALL(e, em_t(e, n->in[2])->is_param ? PH_WGRAD : PH_IGRAD, K_GEMM_DC, n, A_BUF(dy), A_BUF(dc), A_INT(d.M), A_INT(d.N), A_INT(1),
         A_INT(d.N), A_FLT(1), A_INT(acc));
  }
  if (em_needs(e, n, 0)) {
    int da = em_grad(e, n, 0, &acc);
    CALL(e, PH_IGRAD, K_GEMM_DA, n, A_BUF(dy), A_BUF(em_in(e, n, 1)), A_BUF(da), A_INT(d.M), A_INT(d.N), A_INT(d.K), A_INT(0), A_INT(0),
         A_FLT(1), A_INT(acc));
  }
  return 0;
}

static double mmb_flops(Graph *g, const Node *n) { return matmul_flops(g, n) + rule_numel(node_out(g, n, 0)); }

/* Not in the table: no model names it. */
const OpDef OP_MATMUL_BIAS = {"MatMul+Add", "gemm", matmul_infer, NULL, 7, STASH_INPUTS, mmb_flops, 1, mmb_fwd, mmb_bwd, NULL, 0, 0, 7};

const OpDef OPS_GEMM[] = {
    {"Gemm", "gemm", gemm_infer, NULL, 7, STASH_INPUTS, gemm_flops, 1, gemm_fwd, gemm_bwd, NULL, 0, 0, 7},
    {"MatMul", "gemm", matmul_infer, NULL, 3, STASH_INPUTS, matmul_flops, 1, matmul_fwd, matmul_bwd, NULL, 0, 0, 3},
    {0},
};
