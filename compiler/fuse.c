/* fuse.c - adjacent nodes made one call, where nothing else sees what passes between them.
 *
 * BatchNormalization then Relu (every torchvision ResNet block starts so): when the Relu is the
 * only reader of the normalization's output and that output is not a graph output, the pair becomes
 * one node, OP_BATCHNORM_RELU (ops/norm.c).  Its forward applies the Relu as it writes, and its
 * backward masks dy by the output as it reads it, so the activation between them is never written
 * or read again: one pass over it less each way (and one value less to hold).  The expressions and
 * their order are the separate kernels', so the bits are too (tests/test_parity_models.py compares a
 * fused plan with `--no-fuse`).  The Relu stays in the graph, folded and marked fused, so node
 * indices and names do not move; the pair keeps the normalization's name.
 *
 * MatMul then a bias: fuse_matmul_bias below.
 *
 * Decomposed LayerNormalization and GELU.  An exporter without those ops (torch.onnx below opset 17,
 * or 20 for Gelu) writes them as chains of elementwise and reduction nodes:
 *   LayerNorm  ReduceMean(x) -> Sub(x, .) -> Pow(., 2) -> ReduceMean -> Add(., eps) -> Sqrt
 *              -> Div(sub, .) -> Mul(., scale) -> Add(., bias)          (9 nodes, 7 passes each way)
 *   GELU       Div(x, sqrt 2) -> Erf -> Add(., 1) -> Mul(x, .) -> Mul(., 0.5)           (5 nodes)
 * Each chain that matches exactly (the constants, the trailing reduced axes kept, every value in
 * between read by the chain alone) becomes the one ONNX op it spells: LayerNormalization(x, scale,
 * bias, epsilon) or Gelu(x), whose kernels take one pass forward and one or two back, and stash x
 * alone.  Unlike BN+Relu this changes rounding (the fused op computes the same function in another
 * order, as PyTorch's own fused kernels do), so `--no-fuse` gives other bits; every plan of one
 * model fuses alike, so -n 1 and -n 4 stay identical.  The fused node takes the chain's last slot
 * (its inputs are all made by then) and its first node's name. */
#include <math.h>
#include <string.h>

#include "fuse.h"
#include "ops.h"
#include "shape.h"

extern const OpDef OP_BATCHNORM_RELU, OP_MATMUL_BIAS;

static int graph_output(const Graph *g, int t) {
  for (int i = 0; i < g->noutputs; i++)
    if (g->outputs[i] == t) return 1;
  return 0;
}

static int same_shape(const Tensor *a, const Tensor *b) {
  return a->rank == b->rank && !memcmp(a->dims, b->dims, sizeof(int64_t) * (size_t)a->rank);
}

/* The one live node after j that reads tensor t, or -1. */
static int only_reader(const Graph *g, int j, int t) {
  if (t < 0 || g->t[t].nuses != 1 || graph_output(g, t)) return -1;
  for (int i = j + 1; i < g->nn; i++) {
    if (g->n[i].folded) continue;
    for (int q = 0; q < g->n[i].nin; q++)
      if (g->n[i].in[q] == t) return i;
  }
  return -1;
}

/* Node j's one output read by a Relu alone (and not a graph output): the Relu is absorbed, node j
 * writes its output and runs `def` from now on. */
static int absorb_relu(Graph *g, int j, const OpDef *def) {
  Node *n = &g->n[j];
  if (n->nout < 1 || n->out[0] < 0) return 0;
  int t = n->out[0], r = only_reader(g, j, t);
  if (r < 0) return 0;
  Node *relu = &g->n[r];
  if (strcmp(relu->def->name, "Relu") || relu->nin != 1 || relu->nout != 1 || relu->out[0] < 0) return 0;
  int y = relu->out[0];
  n->out[0] = y, g->t[y].producer = j;
  g->t[t].producer = -1, g->t[t].nuses = 0; /* nothing makes or reads it now */
  n->def = def, n->op = def->name, n->fusion = def->name;
  relu->folded = relu->fused = 1;
  return 1;
}

static int fuse_bn_relu(Graph *g, int j) {
  return !strcmp(g->n[j].def->name, "BatchNormalization") && absorb_relu(g, j, &OP_BATCHNORM_RELU);
}

/* ---- matching a chain ---- */

typedef struct Chain {
  Graph *g;
  int node[16], n; /* the chain's nodes, in graph order */
} Chain;

/* Node j, when it is live and runs op `op` with one output; appended to the chain. */
static Node *take(Chain *c, int j, const char *op) {
  if (j < 0 || c->n == 16) return NULL;
  Node *n = &c->g->n[j];
  if (n->folded || !n->def || strcmp(n->def->name, op) || n->nout != 1 || n->out[0] < 0) return NULL;
  c->node[c->n++] = j;
  return n;
}

/* The node that alone reads the output of the chain's last node. */
static int next(const Chain *c) {
  int j = c->node[c->n - 1];
  return only_reader(c->g, j, c->g->n[j].out[0]);
}

/* Whether t is a compile-time scalar float constant; its value in *v. */
static int scalar(const Graph *g, int t, double *v) {
  if (t < 0) return 0;
  const Tensor *x = &g->t[t];
  if (!x->data || x->is_param || !dtype_is_float(x->dtype) || ir_numel(x) != 1) return 0;
  *v = const_f64(x, 0);
  return 1;
}

/* A scalar float constant equal to v (to a relative 1e-6: exporters round sqrt 2 their own way). */
static int is_const(const Graph *g, int t, double v) {
  double a;
  return scalar(g, t, &a) && fabs(a - v) <= 1e-6 * fabs(v);
}

/* The other input of binary node n, given one of them (-1 if n does not read `one` exactly once). */
static int other(const Node *n, int one) {
  if (n->nin != 2) return -1;
  if (n->in[0] == one && n->in[1] != one) return n->in[1];
  if (n->in[1] == one && n->in[0] != one) return n->in[0];
  return -1;
}

/* Rewrites the chain as one node in its last slot, reading ins[0..nin) and writing the last node's
 * output, named after its first node; the others are folded and marked fused. */
static void collapse(Chain *c, const OpDef *def, const char *fusion, const int *ins, int nin, Attr *attrs, int nattrs) {
  Graph *g = c->g;
  Node *last = &g->n[c->node[c->n - 1]];
  for (int k = 0; k < c->n - 1; k++) {
    Node *m = &g->n[c->node[k]];
    g->t[m->out[0]].producer = -1;
    m->folded = m->fused = 1;
  }
  last->name = g->n[c->node[0]].name;
  last->def = def, last->op = def->name, last->fusion = fusion;
  last->in = pool_alloc(&g->pool, sizeof(int) * (size_t)nin);
  memcpy(last->in, ins, sizeof(int) * (size_t)nin);
  last->nin = nin;
  last->attrs = attrs, last->nattrs = nattrs;
}

/* The trailing axes a ReduceMean keeps (keepdims=1) and averages over: their count, or 0. */
static int trailing_mean(Graph *g, Node *n, const Tensor *x) {
  int64_t axes[MAX_RANK];
  int c;
  if (attr_int(n, "keepdims", 1) != 1 || ints_from_attr_or_input(g, n, "axes", 1, axes, MAX_RANK, &c)) {
    err_clear();
    return 0;
  }
  if (c <= 0 || c > x->rank) return 0;
  int mask = 0;
  for (int i = 0; i < c; i++) {
    int64_t a = axes[i] < 0 ? axes[i] + x->rank : axes[i];
    if (a < 0 || a >= x->rank) return 0;
    mask |= 1 << a;
  }
  return mask == ((1 << x->rank) - (1 << (x->rank - c))) ? c : 0;
}

static Attr *attrs_new(Graph *g, int n) {
  Attr *a = pool_alloc(&g->pool, sizeof(Attr) * (size_t)n);
  memset(a, 0, sizeof(Attr) * (size_t)n);
  return a;
}

/* ReduceMean(x) Sub(x, mean) Pow(d, 2) ReduceMean Add(eps) Sqrt Div(d, sd) Mul(scale) Add(bias). */
static int fuse_layernorm(Graph *g, int j) {
  Chain c = {g, {0}, 0};
  Node *r1 = take(&c, j, "ReduceMean");
  if (!r1 || r1->in[0] < 0) return 0;
  int x = r1->in[0];
  const Tensor *X = &g->t[x];
  int k = X->dtype == DT_FLOAT ? trailing_mean(g, r1, X) : 0;
  if (!k) return 0;
  Node *sub = take(&c, next(&c), "Sub");
  if (!sub || sub->nin != 2 || sub->in[0] != x || sub->in[1] != r1->out[0]) return 0;
  int d = sub->out[0];
  /* d feeds Pow and Div, nothing else. */
  if (g->t[d].nuses != 2 || graph_output(g, d)) return 0;
  int pj = -1, dj = -1;
  for (int i = c.node[1] + 1; i < g->nn; i++)
    if (!g->n[i].folded && g->n[i].nin == 2 && g->n[i].in[0] == d) {
      if (!strcmp(g->n[i].def->name, "Pow")) pj = i;
      if (!strcmp(g->n[i].def->name, "Div")) dj = i;
    }
  Node *pw = take(&c, pj, "Pow");
  if (!pw || !is_const(g, pw->in[1], 2.0)) return 0;
  Node *r2 = take(&c, next(&c), "ReduceMean");
  if (!r2 || trailing_mean(g, r2, &g->t[pw->out[0]]) != k) return 0;
  Node *ad = take(&c, next(&c), "Add");
  double eps;
  if (!ad || !scalar(g, other(ad, r2->out[0]), &eps) || !(eps >= 0)) return 0;
  Node *sq = take(&c, next(&c), "Sqrt");
  if (!sq) return 0;
  Node *dv = take(&c, next(&c), "Div");
  if (!dv || c.node[c.n - 1] != dj || dv->in[1] != sq->out[0]) return 0;
  Node *mu = take(&c, next(&c), "Mul");
  Node *ab = mu ? take(&c, next(&c), "Add") : NULL;
  if (!ab) return 0; /* no scale or no bias: not LayerNormalization's form */
  int s = other(mu, dv->out[0]), b = other(ab, mu->out[0]);
  int64_t cols = 1;
  for (int i = X->rank - k; i < X->rank; i++) cols *= X->dims[i];
  /* The scale and bias: float, one value per normalised element, and the output x's shape. */
  for (int t = 0; t < 2; t++) {
    int v = t ? b : s;
    if (v < 0 || v == x || g->t[v].dtype != DT_FLOAT || ir_numel(&g->t[v]) != cols || g->t[v].rank > k) return 0;
  }
  if (!same_shape(&g->t[ab->out[0]], X) || g->t[ab->out[0]].dtype != DT_FLOAT) return 0;
  Attr *a = attrs_new(g, 2);
  a[0] = (Attr){.name = "axis", .type = ATTR_INT, .i = X->rank - k};
  a[1] = (Attr){.name = "epsilon", .type = ATTR_FLOAT, .f = (float)eps};
  int ins[3] = {x, s, b};
  collapse(&c, op_find("LayerNormalization"), "ReduceMean..Add as LayerNormalization", ins, 3, a, 2);
  return c.n - 1;
}

/* Div(x, sqrt 2) Erf Add(1) Mul(x, .) Mul(0.5): PyTorch's exact GELU as torch.onnx writes it. */
static int fuse_gelu(Graph *g, int j) {
  Chain c = {g, {0}, 0};
  Node *dv = take(&c, j, "Div");
  if (!dv || dv->nin != 2 || dv->in[0] < 0 || !is_const(g, dv->in[1], sqrt(2.0))) return 0;
  int x = dv->in[0];
  if (g->t[x].dtype != DT_FLOAT) return 0;
  Node *erf = take(&c, next(&c), "Erf");
  Node *one = erf ? take(&c, next(&c), "Add") : NULL;
  if (!one || !is_const(g, other(one, erf->out[0]), 1.0)) return 0;
  Node *mx = take(&c, next(&c), "Mul");
  if (!mx || other(mx, one->out[0]) != x) return 0;
  Node *half = take(&c, next(&c), "Mul");
  if (!half || !is_const(g, other(half, mx->out[0]), 0.5)) return 0;
  if (!same_shape(&g->t[half->out[0]], &g->t[x])) return 0;
  int ins[1] = {x};
  collapse(&c, op_find("Gelu"), "Div..Mul as Gelu", ins, 1, NULL, 0);
  return c.n - 1;
}

/* MatMul(a, B) then Add(., bias) (either order), B one matrix [K, N] and the bias [N]: a Gemm over
 * the rows of a with the bias as C (OP_MATMUL_BIAS, ops/gemm.c).  Every nn.Linear on a 3-D input
 * exports so. */
static int fuse_matmul_bias(Graph *g, int j) {
  Chain c = {g, {0}, 0};
  Node *mm = take(&c, j, "MatMul");
  if (!mm || mm->nin != 2 || mm->in[0] < 0 || mm->in[1] < 0) return 0;
  const Tensor *A = &g->t[mm->in[0]], *B = &g->t[mm->in[1]], *Y = &g->t[mm->out[0]];
  if (A->rank < 2 || B->rank != 2 || A->dtype != DT_FLOAT || B->dtype != DT_FLOAT) return 0;
  Node *ad = take(&c, next(&c), "Add");
  int b = ad ? other(ad, mm->out[0]) : -1;
  if (b < 0 || b == mm->in[0] || b == mm->in[1]) return 0;
  const Tensor *bias = &g->t[b];
  if (bias->dtype != DT_FLOAT || bias->rank != 1 || bias->dims[0] != Y->dims[Y->rank - 1]) return 0;
  if (!same_shape(&g->t[ad->out[0]], Y)) return 0;
  int ins[3] = {mm->in[0], mm->in[1], b};
  collapse(&c, &OP_MATMUL_BIAS, OP_MATMUL_BIAS.name, ins, 3, NULL, 0);
  return 1;
}

int fuse_graph(Graph *g) {
  int fused = 0;
  for (int j = 0; j < g->nn; j++) {
    if (g->n[j].folded || !g->n[j].def) continue;
    int f = fuse_bn_relu(g, j);
    if (!f) f = fuse_layernorm(g, j);
    if (!f) f = fuse_gelu(g, j);
    if (!f) f = fuse_matmul_bias(g, j);
    if (f > 0) count_uses(g); /* the chain's values are read no more */
    fused += f;
  }
  return fused;
}
