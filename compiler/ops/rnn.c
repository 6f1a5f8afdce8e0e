/* rnn.c - recurrent layers: LSTM and GRU (one layer; forward, reverse or
 * bidirectional), trained through time.  One kernel call runs the whole sequence; backward
 * runs the forward again into its workspace (the gates of every step) and
 * then the steps in reverse, so nothing but the node's inputs is kept per
 * micro-batch in flight. */
#include "ops/rule.h"

enum { RNN_LSTM = 1, RNN_GRU }; /* OpDef.code */

/* Inputs: X, W, R, B, sequence_lens, initial_h, initial_c (LSTM), P (LSTM). */
enum { IN_X, IN_W, IN_R, IN_B, IN_SEQ, IN_H0, IN_C0, IN_P };

static int ngates(const Node *n) { return n->def->code == RNN_LSTM ? 4 : 3; }

static int has_in(const Node *n, int k) { return k < n->nin && n->in[k] >= 0; }

/* direction: 0 forward, 1 reverse, 2 bidirectional; -1 anything else. */
static int rnn_direction(const Node *n) {
  const char *dir = attr_str(n, "direction", "forward");
  return !strcmp(dir, "forward") ? 0 : !strcmp(dir, "reverse") ? 1 : !strcmp(dir, "bidirectional") ? 2 : -1;
}

/* The activations ONNX defaults to (torch's): anything else is refused. */
static int default_acts(const Node *n) {
  const Attr *a = node_attr(n, "activations");
  if (!a) return 1;
  static const char *const lstm[] = {"Sigmoid", "Tanh", "Tanh"}, *const gru[] = {"Sigmoid", "Tanh"};
  const char *const *want = n->def->code == RNN_LSTM ? lstm : gru;
  int count = n->def->code == RNN_LSTM ? 3 : 2;
  if (a->n != count) return 0;
  for (int i = 0; i < count; i++)
    if (!a->strs || !a->strs[i] || strcmp(a->strs[i], want[i])) return 0;
  return 1;
}

/* What pipecc's kernels do not run, named; 0 when the node is supported. */
static int rnn_refuse(Graph *g, Node *n) {
  if (rnn_direction(n) < 0)
    return node_err(n, "direction '%s' is not forward, reverse or bidirectional", attr_str(n, "direction", ""));
  if (!default_acts(n)) return node_err(n, "activations other than the default (Sigmoid, Tanh%s) are not supported",
                                        n->def->code == RNN_LSTM ? ", Tanh" : "");
  if (node_attr(n, "clip")) return node_err(n, "clip is not supported");
  if (attr_int(n, "input_forget", 0)) return node_err(n, "input_forget = 1 is not supported");
  if (n->def->code == RNN_LSTM && has_in(n, IN_P)) return node_err(n, "peepholes (input P) are not supported");
  if (has_in(n, IN_SEQ)) return node_err(n, "sequence_lens is not supported (every sequence must run all steps)");
  (void)g;
  return 0;
}

static int rnn_infer(Graph *g, Node *n) {
  Tensor *x = need_in(g, n, IN_X), *w = need_in(g, n, IN_W), *r = need_in(g, n, IN_R);
  if (!x || !w || !r) return -1;
  if (rnn_refuse(g, n)) return -1;
  int layout = (int)attr_int(n, "layout", 0), G = ngates(n), D = rnn_direction(n) == 2 ? 2 : 1;
  if (layout != 0 && layout != 1) return node_err(n, "layout %d is not 0 or 1", layout);
  if (x->rank != 3) return node_err(n, "X %s must have rank 3", shape_str(x));
  int64_t T = x->dims[layout ? 1 : 0], B = x->dims[layout ? 0 : 1], I = x->dims[2];
  int64_t H = attr_int(n, "hidden_size", r->rank == 3 ? r->dims[2] : 0);
  if (H <= 0) return node_err(n, "hidden_size must be positive");
  if (w->rank != 3 || w->dims[0] != D || w->dims[1] != G * H || w->dims[2] != I)
    return node_err(n, "W %s must be [%d,%lld,%lld]", shape_str(w), D, (long long)(G * H), (long long)I);
  if (r->rank != 3 || r->dims[0] != D || r->dims[1] != G * H || r->dims[2] != H)
    return node_err(n, "R %s must be [%d,%lld,%lld]", shape_str(r), D, (long long)(G * H), (long long)H);
  Tensor *b = node_in(g, n, IN_B);
  if (b && (b->rank != 2 || b->dims[0] != D || b->dims[1] != 2 * G * H))
    return node_err(n, "B %s must be [%d,%lld]", shape_str(b), D, (long long)(2 * G * H));
  for (int k = IN_H0; k <= (n->def->code == RNN_LSTM ? IN_C0 : IN_H0); k++) {
    Tensor *s = node_in(g, n, k);
    int64_t want[3] = {layout ? B : D, layout ? D : B, H};
    if (s && (s->rank != 3 || memcmp(s->dims, want, sizeof want)))
      return node_err(n, "%s %s must be [%lld,%lld,%lld]", k == IN_H0 ? "initial_h" : "initial_c", shape_str(s),
                      (long long)want[0], (long long)want[1], (long long)want[2]);
  }
  int64_t y[4] = {T, D, B, H}, yb[4] = {B, T, D, H}, st[3] = {D, B, H}, stb[3] = {B, D, H};
  if (n->nout > 0 && n->out[0] >= 0) set_shape(node_out(g, n, 0), x->dtype, 4, layout ? yb : y);
  for (int k = 1; k < n->nout && k < (n->def->code == RNN_LSTM ? 3 : 2); k++)
    if (n->out[k] >= 0) set_shape(node_out(g, n, k), x->dtype, 3, layout ? stb : st);
  return 0;
}

/* The shape constant of node j, defined by its forward rule. */
static int rnn_shape(Emit *e, const Node *n, int j) {
  Tensor *X = em_t(e, n->in[IN_X]), *R = em_t(e, n->in[IN_R]);
  int layout = (int)attr_int(n, "layout", 0);
  return SHAPE(e, "RnnShape", em_name(e, "RNN_%d", j), A_INT(X->dims[layout ? 1 : 0]), A_INT(X->dims[layout ? 0 : 1]),
               A_INT(X->dims[2]), A_INT(R->dims[2]), A_INT(layout), A_INT(attr_int(n, "linear_before_reset", 0)),
               A_INT(rnn_direction(n) == 2 ? 2 : 1), A_INT(rnn_direction(n) == 1));
}

static int64_t rnn_bytes(Graph *g, const Node *n, int grad) {
  Tensor *X = node_in(g, n, IN_X), *R = node_in(g, n, IN_R);
  int64_t T = X->dims[0], B = X->dims[1], H = R->dims[2]; /* T * B is the same in either layout */
  int64_t floats = n->def->code == RNN_LSTM ? T * B * 6 * H + (grad ? T * B * 4 * H + 2 * B * H : 0)
                                            : T * B * 8 * H + (grad ? T * B * 6 * H + 2 * B * H : 0);
  return floats * (int64_t)sizeof(float);
}

/* The forward and backward workspaces (the recurrence's gates and states), kept within one call. */
static int64_t rnn_workspace(Graph *g, const Node *n) { return rnn_bytes(g, n, 1); }

static int rnn_fwd(Emit *e, const Node *n, int j) {
  int shape = rnn_shape(e, n, j), lstm = n->def->code == RNN_LSTM;
  int work = em_work(e, "rnn_", n->out[0] >= 0 ? n->out[0] : n->out[1], rnn_bytes(em_graph(e), n, 0));
  int y = em_used(e, n, 0) ? em_out(e, n, 0) : -1, yh = em_used(e, n, 1) ? em_out(e, n, 1) : -1;
  if (lstm) {
    int yc = em_used(e, n, 2) ? em_out(e, n, 2) : -1;
    CALL(e, PH_FWD, K_LSTM, n, A_BUF(em_in(e, n, IN_X)), A_BUF(em_in(e, n, IN_W)), A_BUF(em_in(e, n, IN_R)), A_BUF(em_in(e, n, IN_B)),
         A_BUF(em_in(e, n, IN_H0)), A_BUF(em_in(e, n, IN_C0)), A_BUF(y), A_BUF(yh), A_BUF(yc), A_BUF(work), A_CONST(shape));
  } else {
    CALL(e, PH_FWD, K_GRU, n, A_BUF(em_in(e, n, IN_X)), A_BUF(em_in(e, n, IN_W)), A_BUF(em_in(e, n, IN_R)), A_BUF(em_in(e, n, IN_B)),
         A_BUF(em_in(e, n, IN_H0)), A_BUF(y), A_BUF(yh), A_BUF(work), A_CONST(shape));
  }
  return 0;
}

/* A gradient buffer for input k, or -1 when none is needed: added into (the
 * kernel adds; em_grad_add zeroes an activation's first contribution). */
static int rnn_grad(Emit *e, const Node *n, int k) { return has_in(n, k) && em_needs(e, n, k) ? em_grad_add(e, n, k) : -1; }

/* The gradient of the initial state k is weight work when the state is a
 * trained weight, input-gradient work otherwise. */
static int rnn_state_is_weight(Emit *e, const Node *n, int k) { return has_in(n, k) && em_t(e, n->in[k])->is_param; }

/* One backward call computes every gradient from one pass through time; when
 * W work runs apart (zb1) it is two calls, each with the same pass, the first
 * for dX (and an activation initial state's), the second for dW, dR, dB (and
 * a trained initial state's), so the sums and the weights do not change. */
static int rnn_bwd(Emit *e, const Node *n, int j) {
  int accx = 0, shape = em_shape_ref(e, em_name(e, "RNN_%d", j)), lstm = n->def->code == RNN_LSTM;
  int g[7] = {-1, -1, -1, -1, -1, -1, -1}; /* per input: its gradient buffer */
  for (int k = IN_W; k <= IN_C0; k++)
    if (k != IN_SEQ && (k != IN_C0 || lstm)) g[k] = rnn_grad(e, n, k);
  g[IN_X] = em_needs(e, n, IN_X) ? em_grad(e, n, IN_X, &accx) : -1;
  int wpart[7] = {0, 1, 1, 1, 0, rnn_state_is_weight(e, n, IN_H0), rnn_state_is_weight(e, n, IN_C0)};
  int has[2] = {0, 0};
  for (int k = 0; k < 7; k++) has[wpart[k]] |= g[k] >= 0;
  int apart = em_split_wgrad(e) && has[0] && has[1];
  int dys[3];
  for (int k = 0; k < 3; k++) dys[k] = k < n->nout && (k < 2 || lstm) ? em_dy(e, n, k) : -1;
  for (int half = 0; half <= apart; half++) {
    int w[7];
    for (int k = 0; k < 7; k++) w[k] = apart && wpart[k] != half ? -1 : g[k];
    int work = em_work(e, "drnn_", n->in[IN_X], rnn_bytes(em_graph(e), n, 1));
    int ph = apart && half == 1 ? PH_WGRAD : has[0] ? PH_IGRAD : PH_WGRAD;
    if (lstm)
      CALL(e, ph, K_LSTM_GRAD, n, A_BUF(em_in(e, n, IN_X)), A_BUF(em_in(e, n, IN_W)), A_BUF(em_in(e, n, IN_R)),
           A_BUF(em_in(e, n, IN_B)), A_BUF(em_in(e, n, IN_H0)), A_BUF(em_in(e, n, IN_C0)), A_BUF(dys[0]), A_BUF(dys[1]),
           A_BUF(dys[2]), A_BUF(w[IN_X]), A_BUF(w[IN_W]), A_BUF(w[IN_R]), A_BUF(w[IN_B]), A_BUF(w[IN_H0]), A_BUF(w[IN_C0]),
           A_BUF(work), A_CONST(shape), A_INT(accx));
    else
      CALL(e, ph, K_GRU_GRAD, n, A_BUF(em_in(e, n, IN_X)), A_BUF(em_in(e, n, IN_W)), A_BUF(em_in(e, n, IN_R)),
           A_BUF(em_in(e, n, IN_B)), A_BUF(em_in(e, n, IN_H0)), A_BUF(dys[0]), A_BUF(dys[1]), A_BUF(w[IN_X]), A_BUF(w[IN_W]),
           A_BUF(w[IN_R]), A_BUF(w[IN_B]), A_BUF(w[IN_H0]), A_BUF(work), A_CONST(shape), A_INT(accx));
  }
  return 0;
}

/* Per step and direction: the input and recurrent products (2 * rows * G*H * (I + H)), the gate arithmetic. */
static double rnn_flops(Graph *g, const Node *n) {
  Tensor *X = node_in(g, n, IN_X), *R = node_in(g, n, IN_R);
  double rows = (double)(X->dims[0] * X->dims[1]), H = (double)R->dims[2], I = (double)X->dims[2], G = ngates(n);
  return (double)R->dims[0] * (2 * rows * G * H * (I + H) + 10 * rows * H); /* per direction */
}

const OpDef OPS_RNN[] = {
    {"LSTM", "rnn", rnn_infer, NULL, 0x6F, STASH_INPUTS, rnn_flops, 1, rnn_fwd, rnn_bwd, rnn_workspace, RNN_LSTM, OPF_FIRST_OUTPUT_OPTIONAL, 0xEF},
    {"GRU", "rnn", rnn_infer, NULL, 0x2F, STASH_INPUTS, rnn_flops, 1, rnn_fwd, rnn_bwd, rnn_workspace, RNN_GRU, OPF_FIRST_OUTPUT_OPTIONAL, 0x2F},
    {0},
};
