/* conv.c - 1-D, 2-D and 3-D convolution (strides, pads or auto_pad, dilations, groups) by im2col + GEMM,
 * or by oneDNN's convolutions where the rule below picks them (runtime/conv_dnnl.c). */
#include "ops/conv.h"

#include "ops/rule.h"

static int64_t conv_workspace(Graph *g, const Node *n);

/* Whether a convolution runs through oneDNN.  Measured here (docs/kernels.md): oneDNN's blocked-layout
 * convolutions, reorders in and out included, take 0.4-0.7x the time of im2col + SGEMM per sample on
 * the sample ResNet's shapes (3x3 and 1x1, 16-64 channels), and LeNet's 5x5 convolutions of 1-16
 * channels still gain (its step's CPU time 5.4 -> 4.2 ms).  Not every shape does, so under auto the op
 * probe's grid decides per convolution (opcost.c, opcost_choose_convs: Node.conv_gemm), by its shape
 * on this machine; without a probe (--devices, PIPECC_OPS_CACHE=off) auto takes oneDNN for every
 * convolution.  Those of one point run as a GEMM over the one tap that does any work
 * (conv_is_point, runtime/kernels.h) whatever --conv says. */
static int conv_lib(Graph *g, const Node *n) { return conv_uses_lib(g, n); }

int conv_node(const Node *n) { return !strcmp(n->op, "Conv"); }

const char *conv_impl_name(const Graph *g) {
  if (g->conv_impl == CONV_GEMM) return "im2col";
  for (int j = 0; j < g->nn; j++)
    if (!g->n[j].folded && g->n[j].conv_gemm) return "mixed";
  return "onednn";
}

int conv_profile_kind(const Graph *g, const int *node, int n) {
  for (int k = 0; k < n; k++)
    if (conv_node(&g->n[node[k]])) return g->conv_impl == CONV_GEMM ? 1 : 2;
  return 0;
}

int conv_is_point(const Graph *g, const Node *n) {
  if (!conv_node(n) || n->nin < 1 || n->nout < 1 || n->in[0] < 0 || n->out[0] < 0) return 0;
  const Tensor *x = &g->t[n->in[0]], *y = &g->t[n->out[0]];
  if (x->rank < 3 || y->rank != x->rank) return 0;
  for (int i = 2; i < x->rank; i++)
    if (x->dims[i] != 1 || y->dims[i] != 1) return 0;
  return 1;
}

const char *conv_cache_key(const Graph *g, const Node *n) {
  return !conv_node(n) ? NULL : conv_is_point(g, n) ? "point" : conv_uses_lib(g, n) ? "onednn" : "im2col";
}

int conv_by_impl(const Graph *g, const Node *n) { return conv_node(n) && !conv_is_point(g, n); }

int conv_uses_lib(const Graph *g, const Node *n) {
  return conv_by_impl(g, n) && g->conv_impl != CONV_GEMM && !(g->conv_impl == CONV_AUTO && n->conv_gemm);
}

/* oneDNN's convolutions hold their code and descriptors outside the arena (conv_dnnl.c; their scratch
 * memory is in the arena): 70 KiB a convolution measured on the sample ResNet (its -n 1 run's overhead
 * against --conv gemm), allowed 96 KiB. */
enum { DNNL_CONV_BYTES = 96 << 10 };

double conv_beside_bytes(const Graph *g, const Node *n) { return conv_uses_lib(g, n) ? DNNL_CONV_BYTES : 0; }

/* Under --conv auto with some convolutions chosen for im2col + GEMM: how many of each, and the first
 * few of those by name. */
static const char *conv_mixed_note(const Graph *g, const int *node, int N, int lib, int gemm) {
  Pool *pool = (Pool *)&g->pool;
  const char *names = "";
  int shown = 0;
  for (int k = 0; k < N && shown < 4; k++) {
    const Node *n = &g->n[node[k]];
    if (conv_by_impl(g, n) && !conv_uses_lib(g, n))
      names = pool_printf(pool, "%s%s%s", names, shown++ ? ", " : "", n->name && *n->name ? n->name : "(unnamed)");
  }
  return pool_printf(pool, "--conv auto, by the op probe's times on this machine: %d through oneDNN, %d as im2col + GEMM (%s%s), "
                           "each measured faster for its shape; oneDNN's scratch memory in the arena, code and descriptors "
                           "beside it, 96 KiB a convolution, counted against a memory limit", lib - gemm, gemm, names, gemm > shown ? ", ..." : "");
}

const char *conv_note(const Graph *g, const int *node, int N, int fallback) {
  int lib = 0, gemm = 0;
  for (int k = 0; k < N; k++) {
    lib += conv_by_impl(g, &g->n[node[k]]);
    gemm += conv_by_impl(g, &g->n[node[k]]) && !conv_uses_lib(g, &g->n[node[k]]);
  }
  if (lib && gemm && g->conv_impl == CONV_AUTO) return conv_mixed_note(g, node, N, lib, gemm);
  if (lib && g->conv_impl != CONV_GEMM)
    return "oneDNN: scratch memory in the arena; code and descriptors beside it, 96 KiB a convolution, "
           "counted against a memory limit";
  if (lib && fallback) return "im2col + GEMM: no plan fits the memory limit with oneDNN's 96 KiB a convolution beside the arena";
  return NULL;
}

int conv_costs_mismatch(int profiled, const Graph *g) { return profiled && profiled != (g->conv_impl == CONV_GEMM ? 1 : 2); }

int conv_impl_choices(int conv_impl, int *out) {
  out[0] = conv_impl;
  if (conv_impl != CONV_AUTO) return 1;
  out[1] = CONV_GEMM;
  return 2;
}

/* How many kernel taps land on the one input point (0 or 1; runtime/kernels.h conv_point_tap). */
static int conv_point_taps(Graph *g, const Node *n) {
  Tensor *X = node_in(g, n, 0), *W = node_in(g, n, 1);
  Window win;
  if (window_attrs(n, X, W->dims + 2, &win)) return 1;
  for (int i = 0; i < win.nsp; i++)
    if (win.pb[i] % win.d[i] || win.pb[i] / win.d[i] >= win.k[i]) return 0;
  return 1;
}

static int64_t pad16(int64_t v) { return (v + 15) / 16 * 16; }

/* What oneDNN's call needs at most (conv_dnnl.c): blocked copies of an input-sized, an output-sized
 * and a weight-sized tensor, channels padded to 16 (its AVX-512 blocking; AVX2's 8 needs less), each
 * aligned to 64 bytes, then the primitives' scratch memory.  Measured (PIPERUN_DNNL_SIZES=1): the 3x3
 * and 5x5 kernels need none, a strided 1x1 copies one image's strided input to unit stride,
 * output-plane x padded input channels floats plus 128 bytes; that much is allowed for every
 * convolution.  A primitive that wants more runs as im2col + GEMM, saying so. */
static int64_t conv_lib_bytes(Graph *g, const Node *n) {
  Tensor *X = node_in(g, n, 0), *W = node_in(g, n, 1), *Y = node_out(g, n, 0);
  int64_t group = attr_int(n, "group", 1), xs = X->dims[0] * pad16(X->dims[1]), ys = Y->dims[0] * pad16(Y->dims[1]),
          ws = group * pad16(W->dims[0] / group) * pad16(W->dims[1]), scratch = pad16(X->dims[1]);
  for (int i = 2; i < X->rank; i++) xs *= X->dims[i], ys *= Y->dims[i], ws *= W->dims[i], scratch *= Y->dims[i];
  return 4 * (xs + ys + ws + scratch) + 4 * 64 + 128;
}

static int conv_infer(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, 0), *wt = need_in(g, n, 1);
  if (!x || !wt) return -1;
  if (x->rank < 3) return node_err(n, "input %s needs rank >= 3 (N, C, spatial...)", shape_str(x));
  if (wt->rank != x->rank) return node_err(n, "weight %s and input %s ranks differ", shape_str(wt), shape_str(x));
  int64_t group = attr_int(n, "group", 1);
  if (group < 1 || x->dims[1] % group || wt->dims[0] % group)
    return node_err(n, "group %lld does not divide channels (%lld in, %lld out)", (long long)group,
                    (long long)x->dims[1], (long long)wt->dims[0]);
  if (wt->dims[1] * group != x->dims[1])
    return node_err(n, "weight %s expects %lld input channels, input %s has %lld", shape_str(wt),
                    (long long)(wt->dims[1] * group), shape_str(x), (long long)x->dims[1]);
  int64_t kernel[MAX_RANK];
  int c = attr_ints(n, "kernel_shape", kernel, MAX_RANK);
  for (int i = 0; i < x->rank - 2; i++)
    if (c < 0) kernel[i] = wt->dims[i + 2];
    else if (c != x->rank - 2 || kernel[i] != wt->dims[i + 2])
      return node_err(n, "kernel_shape does not match weight %s", shape_str(wt));
  Tensor *b = node_in(g, n, 2);
  if (b && (b->rank != 1 || b->dims[0] != wt->dims[0]))
    return node_err(n, "bias %s must be [%lld]", shape_str(b), (long long)wt->dims[0]);
  Window w;
  int64_t dims[MAX_RANK] = {x->dims[0], wt->dims[0]};
  if (window_attrs(n, x, kernel, &w) || window_out(n, x, &w, 0, dims + 2)) return -1;
  set_shape(node_out(g, n, 0), x->dtype, x->rank, dims);
  return 0;
}

static int conv_fwd(Emit *e, const Node *n, int j) {
  Tensor *X = em_t(e, n->in[0]), *W = em_t(e, n->in[1]), *Y = em_t(e, n->out[0]);
  Window win;
  WinSlots ws; /* pads resolved here from auto_pad and the static shapes */
  if (window_attrs(n, X, W->dims + 2, &win) || window_slots(n, &win, X, Y, &ws)) return -1;
  int x = em_in(e, n, 0), w = em_in(e, n, 1), b = em_in(e, n, 2), y = em_out(e, n, 0);
  int col = em_work(e, "col_", n->out[0], conv_workspace(em_graph(e), n));
  int cs = SHAPE(e, "ConvShape", em_name(e, "CONV_%d", j), A_INT(X->dims[0]), A_INT(X->dims[1]), A_INT(ws.in[0]),
                 A_INT(ws.in[1]), A_INT(ws.in[2]), A_INT(W->dims[0]), A_INT(ws.k[0]), A_INT(ws.k[1]), A_INT(ws.k[2]),
                 A_INT(attr_int(n, "group", 1)), A_INT(ws.out[0]), A_INT(ws.out[1]), A_INT(ws.out[2]), A_INT(ws.s[0]),
                 A_INT(ws.s[1]), A_INT(ws.s[2]), A_INT(ws.pb[0]), A_INT(ws.pb[1]), A_INT(ws.pb[2]), A_INT(ws.d[0]),
                 A_INT(ws.d[1]), A_INT(ws.d[2]), A_INT(conv_lib(em_graph(e), n)),
                 A_INT(conv_workspace(em_graph(e), n)));
  CALL(e, PH_FWD, K_CONV, n, A_BUF(x), A_BUF(w), A_BUF(b), A_BUF(y), A_BUF(col), A_CONST(cs));
  return 0;
}

static int conv_bwd(Emit *e, const Node *n, int j) {
  int x = em_in(e, n, 0), w = em_in(e, n, 1), dy = em_dy(e, n, 0), cs = em_shape_ref(e, em_name(e, "CONV_%d", j)), acc;
  int col = em_work(e, "dcol_", n->out[0], conv_workspace(em_graph(e), n));
  if (em_needs(e, n, 1)) {
    int dw = em_grad_add(e, n, 1), db = n->nin > 2 && n->in[2] >= 0 && em_needs(e, n, 2) ? em_grad_add(e, n, 2) : -1;
    CALL(e, PH_WGRAD, K_CONV_GRAD, n, A_BUF(x), A_BUF(w), A_BUF(dy), A_BUF(-1), A_BUF(dw), A_BUF(db), A_BUF(col), A_CONST(cs),
         A_INT(0), A_INT(1));
  }
  if (em_needs(e, n, 0)) {
    int dx = em_grad(e, n, 0, &acc);
    CALL(e, PH_IGRAD, K_CONV_GRAD, n, A_BUF(x), A_BUF(w), A_BUF(dy), A_BUF(dx), A_BUF(-1), A_BUF(-1), A_BUF(col), A_CONST(cs),
         A_INT(acc), A_INT(1));
  }
  return 0;
}

/* A convolution of one point does the arithmetic of its one tap (or none: the bias alone). */
static double conv_flops(Graph *g, const Node *n) {
  Tensor *w = node_in(g, n, 1);
  double out = rule_numel(node_out(g, n, 0)), k = 1;
  for (int i = 1; i < w->rank; i++) k *= (double)w->dims[i];
  if (conv_is_point(g, n)) k = conv_point_taps(g, n) * (double)w->dims[1];
  return 2.0 * out * k + (node_in(g, n, 2) ? out : 0);
}

/* The im2col columns of one sample and group: [C/group * kernel size, output spatial size] floats;
 * for oneDNN, what its call needs if that is more (the columns stay the fallback); for a convolution
 * of one point, its tap's weights, [M/group, C/group] floats. */
static int64_t conv_workspace(Graph *g, const Node *n) {
  Tensor *W = node_in(g, n, 1), *Y = node_out(g, n, 0);
  int64_t bytes = 4 * W->dims[1];
  if (conv_is_point(g, n)) return 4 * W->dims[1] * (W->dims[0] / attr_int(n, "group", 1));
  for (int i = 2; i < W->rank; i++) bytes *= W->dims[i] * Y->dims[i];
  if (conv_lib(g, n) && conv_lib_bytes(g, n) > bytes) bytes = conv_lib_bytes(g, n);
  return bytes;
}

const OpDef OPS_CONV[] = {
    {"Conv", "conv", conv_infer, NULL, 7, STASH_INPUTS, conv_flops, 1, conv_fwd, conv_bwd, conv_workspace, 0, 0, 7},
    {0},
};
