/* autodiff.c - each stage's forward and backward program.
 *
 * Forward: one kernel call per node, in order.  Backward: the nodes in
 * reverse, one call per gradient (the gradient for an op's input and the one
 * for its weights are separate calls, so schedules can later split them).
 * A tensor read by several nodes gets its gradient summed in reverse node
 * order - the first contribution writes, the rest add - and a value that
 * crosses into later stages starts from the gradient those stages send back.
 * This order is the same whatever the partition, so -n 1 and -n 4 compute
 * the same sums in the same order. */
#include <stdarg.h>
#include <string.h>

#include "ops.h"
#include "shape.h"
#include "stageprog.h"

typedef struct Ctx {
  Plan *p;
  StageProg *sp;
  Pool *pool;
  int s, a, e;        /* stage and its compute-node range */
  int *fbuf, *gbuf;   /* tensor -> forward / gradient buffer in this stage (-1) */
  int *gcount;        /* gradient contributions so far */
  const char *needs;  /* tensor needs a gradient */
  Call *cur;
} Ctx;

static const char *cname(Pool *pool, const char *prefix, const char *name) {
  char *s = pool_printf(pool, "%s%s", prefix, name);
  for (char *c = s; *c; c++)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9'))) *c = '_';
  return s;
}

static int add_buf(Ctx *c, const char *prefix, int tensor, int kind, int64_t bytes, int dtype) {
  StageProg *sp = c->sp;
  if (sp->nbufs == sp->capbufs) {
    sp->capbufs = sp->capbufs ? 2 * sp->capbufs : 64;
    sp->bufs = pool_realloc(c->pool, sp->bufs, sizeof(Buffer) * (size_t)sp->capbufs);
  }
  Buffer *b = &sp->bufs[sp->nbufs];
  memset(b, 0, sizeof *b);
  const char *base = tensor >= 0 ? c->p->g.t[tensor].name : "work";
  b->name = cname(c->pool, prefix, base);
  /* Names must be unique C identifiers: add the buffer number when needed. */
  for (int i = 0; i < sp->nbufs; i++)
    if (!strcmp(sp->bufs[i].name, b->name)) {
      b->name = pool_printf(c->pool, "%s_%d", b->name, sp->nbufs);
      break;
    }
  b->tensor = tensor, b->kind = kind, b->bytes = bytes, b->dtype = dtype;
  b->first = b->last = -1;
  return sp->nbufs++;
}

static Call *new_call(Ctx *c, int bwd, const char *comment) {
  StageProg *sp = c->sp;
  Call **list = bwd ? &sp->bwd : &sp->fwd;
  int *n = bwd ? &sp->nbwd : &sp->nfwd, *cap = bwd ? &sp->capbwd : &sp->capfwd;
  if (*n == *cap) {
    *cap = *cap ? 2 * *cap : 64;
    *list = pool_realloc(c->pool, *list, sizeof(Call) * (size_t)*cap);
  }
  Call *k = &(*list)[(*n)++];
  memset(k, 0, sizeof *k);
  k->comment = comment;
  c->cur = k;
  return k;
}

static void rd(Call *k, int b) {
  if (b >= 0 && k->nreads < 12) k->reads[k->nreads++] = b;
}
static void wr(Call *k, int b) {
  if (b >= 0 && k->nwrites < 6) k->writes[k->nwrites++] = b;
}

/* The current call's C statement, and a file-scope constant it uses. */
static void text(Ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void text(Ctx *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  c->cur->text = pool_vprintf(c->pool, fmt, ap);
  va_end(ap);
}

static void decl(Ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void decl(Ctx *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  c->cur->decl = pool_vprintf(c->pool, fmt, ap);
  va_end(ap);
}

static Tensor *T(Ctx *c, int idx) { return &c->p->g.t[idx]; }

/* A float as a valid C literal: 1.0f, 0.05f, 1e-05f. */
static const char *flit(Ctx *c, float v) {
  char num[64];
  snprintf(num, sizeof num, "%.9g", v);
  int plain = !strpbrk(num, ".eEni");
  return pool_printf(c->pool, "%s%sf", num, plain ? ".0" : "");
}

/* The buffer holding tensor t's value in this stage: a parameter, an
 * activation produced here or received, or a constant, which is placed in the
 * weights region with its value (BatchNorm's running statistics live there
 * too, and change as the stage trains). */
static int fb(Ctx *c, int t) {
  if (c->fbuf[t] < 0 && T(c, t)->data) {
    c->fbuf[t] = add_buf(c, "C_", t, BUF_PARAM, tensor_bytes(T(c, t)), T(c, t)->dtype);
    c->sp->consts[c->sp->nconsts++] = c->fbuf[t];
  }
  return c->fbuf[t];
}

/* Gradient buffer for input tensor t of a node, and whether to add. */
static int grad_target(Ctx *c, int t, int *acc) {
  Tensor *x = T(c, t);
  if (c->gbuf[t] < 0) {
    if (x->is_param) c->gbuf[t] = add_buf(c, "dW_", t, BUF_PGRAD, tensor_bytes(x), DT_FLOAT);
    else c->gbuf[t] = add_buf(c, "d_", t, BUF_TEMP, tensor_bytes(x), DT_FLOAT);
    c->sp->bufs[c->gbuf[t]].is_grad = 1;
  }
  /* Weight gradients always add: they are zeroed once per step and summed over micro-batches. */
  *acc = x->is_param ? 1 : c->gcount[t] > 0;
  c->gcount[t]++;
  return c->gbuf[t];
}

static int out_buf(Ctx *c, int t) {
  if (c->fbuf[t] < 0) c->fbuf[t] = add_buf(c, "", t, BUF_TEMP, tensor_bytes(T(c, t)), T(c, t)->dtype);
  return c->fbuf[t];
}

static int64_t numel(Ctx *c, int t) { return ir_numel(T(c, t)); }

static void ints(Buf *b, const int64_t *v, int n) {
  buf_printf(b, "{");
  for (int i = 0; i < n; i++) buf_printf(b, "%s%lld", i ? ", " : "", (long long)v[i]);
  buf_printf(b, "}");
}

/* [outer, axis, inner] sizes of t around axis a. */
static void around(const Tensor *t, int a, int64_t *outer, int64_t *inner) {
  *outer = *inner = 1;
  for (int i = 0; i < a; i++) *outer *= t->dims[i];
  for (int i = a + 1; i < t->rank; i++) *inner *= t->dims[i];
}

/* ---- rules: forward and backward per op ---- */

static void gemm_dims(Ctx *c, Node *n, int *M, int *N, int *K, int *ta, int *tb, int *cm, int *cn) {
  Tensor *A = T(c, n->in[0]), *Y = T(c, n->out[0]);
  *ta = (int)attr_int(n, "transA", 0), *tb = (int)attr_int(n, "transB", 0);
  *M = (int)Y->dims[0], *N = (int)Y->dims[1], *K = (int)(*ta ? A->dims[0] : A->dims[1]);
  *cm = *cn = 0;
  if (n->nin > 2 && n->in[2] >= 0) {
    Tensor *C = T(c, n->in[2]);
    *cm = C->rank == 2 ? (int)C->dims[0] : 1;
    *cn = C->rank >= 1 ? (int)C->dims[C->rank - 1] : 1;
  }
}

static int fwd_rule(Ctx *c, Node *n, int j) {
  const char *op = n->op;
  int y = out_buf(c, n->out[0]);
  Call *k = new_call(c, 0, n->name);
  int x = fb(c, n->in[0]);
  rd(k, x), wr(k, y);
  if (!strcmp(op, "Gemm")) {
    int M, N, K, ta, tb, cm, cn;
    gemm_dims(c, n, &M, &N, &K, &ta, &tb, &cm, &cn);
    int b = fb(c, n->in[1]), cc = cm ? fb(c, n->in[2]) : -1;
    rd(k, b), rd(k, cc);
    text(c, "k_gemm(@%d@, @%d@, %s%s%s, @%d@, %d, %d, %d, %d, %d, %s, %s, %d, %d);", x, b, cm ? "@" : "NULL",
         cm ? pool_printf(c->pool, "%d", cc) : "", cm ? "@" : "", y, M, N, K, ta, tb, flit(c, attr_float(n, "alpha", 1)),
         flit(c, attr_float(n, "beta", 1)), cm, cn);
  } else if (!strcmp(op, "Relu") || !strcmp(op, "Tanh") || !strcmp(op, "Sigmoid")) {
    const char *fn = op[0] == 'R' ? "k_relu" : op[0] == 'T' ? "k_tanh" : "k_sigmoid";
    text(c, "%s(@%d@, @%d@, %lld);", fn, x, y, (long long)numel(c, n->out[0]));
  } else if (!strcmp(op, "Flatten") || !strcmp(op, "Reshape") || !strcmp(op, "Identity") || !strcmp(op, "Squeeze") ||
             !strcmp(op, "Unsqueeze")) {
    text(c, "k_copy(@%d@, @%d@, %lld);", x, y, (long long)numel(c, n->out[0]));
  } else if (!strcmp(op, "Conv")) {
    Tensor *X = T(c, n->in[0]), *W = T(c, n->in[1]), *Y = T(c, n->out[0]);
    if (X->rank != 4) return err_set("node '%s' (Conv): only 2-D convolution trains so far", n->name);
    int64_t pads[4] = {0, 0, 0, 0}, st[2] = {1, 1}, dl[2] = {1, 1};
    attr_ints(n, "pads", pads, 4), attr_ints(n, "strides", st, 2), attr_ints(n, "dilations", dl, 2);
    if (strcmp(attr_str(n, "auto_pad", "NOTSET"), "NOTSET"))
      return err_set("node '%s' (Conv): auto_pad does not train yet; export with explicit pads", n->name);
    int w = fb(c, n->in[1]), b = n->nin > 2 && n->in[2] >= 0 ? fb(c, n->in[2]) : -1;
    int64_t kk = W->dims[1] * W->dims[2] * W->dims[3], sp = Y->dims[2] * Y->dims[3];
    int col = add_buf(c, "col_", n->out[0], BUF_TEMP, 4 * kk * sp, DT_FLOAT);
    rd(k, w), rd(k, b), wr(k, col);
    decl(c, "static const ConvShape CONV_%d = {%lld, %lld, %lld, %lld, %lld, %lld, %lld, %lld, %lld, %lld, %lld, %lld, %lld, %lld, %lld, %lld};",
         j, (long long)X->dims[0], (long long)X->dims[1], (long long)X->dims[2], (long long)X->dims[3], (long long)W->dims[0],
         (long long)W->dims[2], (long long)W->dims[3], (long long)attr_int(n, "group", 1), (long long)Y->dims[2],
         (long long)Y->dims[3], (long long)st[0], (long long)st[1], (long long)pads[0], (long long)pads[1], (long long)dl[0],
         (long long)dl[1]);
    text(c, "k_conv(@%d@, @%d@, %s, @%d@, @%d@, &CONV_%d);", x, w, b >= 0 ? pool_printf(c->pool, "@%d@", b) : "NULL", y, col, j);
  } else if (!strcmp(op, "MaxPool") || !strcmp(op, "AveragePool") || !strcmp(op, "GlobalAveragePool")) {
    Tensor *X = T(c, n->in[0]), *Y = T(c, n->out[0]);
    if (X->rank != 4) return err_set("node '%s' (%s): only 2-D pooling trains so far", n->name, op);
    int64_t ks[2] = {X->dims[2], X->dims[3]}, pads[4] = {0, 0, 0, 0}, st[2] = {1, 1}, dl[2] = {1, 1};
    if (op[0] != 'G') {
      attr_ints(n, "kernel_shape", ks, 2), attr_ints(n, "pads", pads, 4), attr_ints(n, "strides", st, 2);
      attr_ints(n, "dilations", dl, 2);
      if (strcmp(attr_str(n, "auto_pad", "NOTSET"), "NOTSET"))
        return err_set("node '%s' (%s): auto_pad does not train yet; export with explicit pads", n->name, op);
    }
    decl(c, "static const PoolShape POOL_%d = {%lld, %lld, %lld, %lld, %lld, %lld, %lld, %lld, %lld, %lld, %lld, %lld, %lld, %lld, %lld};",
         j, (long long)X->dims[0], (long long)X->dims[1], (long long)X->dims[2], (long long)X->dims[3], (long long)Y->dims[2],
         (long long)Y->dims[3], (long long)ks[0], (long long)ks[1], (long long)st[0], (long long)st[1], (long long)pads[0],
         (long long)pads[1], (long long)dl[0], (long long)dl[1], (long long)attr_int(n, "count_include_pad", 0));
    text(c, "%s(@%d@, @%d@, &POOL_%d);", op[0] == 'M' ? "k_maxpool" : "k_avgpool", x, y, j);
  } else if (!strcmp(op, "BatchNormalization")) {
    Tensor *X = T(c, n->in[0]);
    int training = c->p->g.opset >= 14 ? (int)attr_int(n, "training_mode", 0) : n->nout > 1;
    int64_t sp = X->rank > 2 ? ir_numel(X) / (X->dims[0] * X->dims[1]) : 1;
    int gm = fb(c, n->in[1]), bt = fb(c, n->in[2]), rm = fb(c, n->in[3]), rv = fb(c, n->in[4]);
    rd(k, gm), rd(k, bt), rd(k, rm), rd(k, rv), wr(k, rm), wr(k, rv);
    decl(c, "static const BnShape BN_%d = {%lld, %lld, %lld, %s, %s, %d};", j, (long long)X->dims[0], (long long)X->dims[1],
         (long long)sp, flit(c, attr_float(n, "epsilon", 1e-5f)), flit(c, attr_float(n, "momentum", 0.9f)), training);
    Buf t = {0};
    buf_printf(&t, "k_batchnorm(@%d@, @%d@, @%d@, @%d@, @%d@, @%d@, &BN_%d);", x, gm, bt, rm, rv, y, j);
    /* Training mode's other outputs are the updated running statistics. */
    for (int q = 1; q < 3 && q < n->nout; q++)
      if (n->out[q] >= 0 && (T(c, n->out[q])->is_output || T(c, n->out[q])->nuses)) {
        int o = out_buf(c, n->out[q]);
        wr(k, o);
        buf_printf(&t, "\n  k_copy(@%d@, @%d@, %lld);", q == 1 ? rm : rv, o, (long long)X->dims[1]);
      }
    text(c, "%s", t.s);
    buf_free(&t);
  } else if (!strcmp(op, "Add") || !strcmp(op, "Sub") || !strcmp(op, "Mul") || !strcmp(op, "Div") || !strcmp(op, "Pow")) {
    Tensor *A = T(c, n->in[0]), *B = T(c, n->in[1]), *Y = T(c, n->out[0]);
    if (A->dtype != DT_FLOAT || B->dtype != DT_FLOAT)
      return err_set("node '%s' (%s): only float32 arithmetic runs at training time", n->name, op);
    int b = fb(c, n->in[1]);
    x = fb(c, n->in[0]);
    rd(k, x), rd(k, b);
    Buf d = {0};
    buf_printf(&d, "static const BcastShape BIN_%d = {%d, {", j, Y->rank);
    for (int pass = 0; pass < 3; pass++) {
      const Tensor *src = pass == 1 ? A : B;
      for (int i = 0; i < Y->rank; i++) {
        int64_t v = Y->dims[i];
        if (pass) { /* stride of src along output axis i */
          int si = i - (Y->rank - src->rank);
          int64_t st = 1;
          for (int q = si + 1; q < src->rank; q++) st *= src->dims[q];
          v = si < 0 || src->dims[si] == 1 ? 0 : st;
        }
        buf_printf(&d, "%s%lld", i ? ", " : "", (long long)v);
      }
      buf_printf(&d, "}, {");
    }
    d.len -= 3;
    buf_printf(&d, ", %lld, %lld, %lld};", (long long)ir_numel(A), (long long)ir_numel(B), (long long)ir_numel(Y));
    decl(c, "%s", d.s);
    buf_free(&d);
    text(c, "k_binary(BIN_%s, @%d@, @%d@, @%d@, &BIN_%d);", !strcmp(op, "Add") ? "ADD" : !strcmp(op, "Sub") ? "SUB" :
         !strcmp(op, "Mul") ? "MUL" : !strcmp(op, "Div") ? "DIV" : "POW", x, b, y, j);
  } else if (!strcmp(op, "Erf") || !strcmp(op, "Sqrt")) {
    text(c, "k_%s(@%d@, @%d@, %lld);", op[0] == 'E' ? "erf" : "sqrt", x, y, (long long)numel(c, n->out[0]));
  } else if (!strcmp(op, "Where")) {
    Tensor *C = T(c, n->in[0]), *X = T(c, n->in[1]), *Yv = T(c, n->in[2]), *O = T(c, n->out[0]);
    if (X->dtype != DT_FLOAT) return err_set("node '%s' (Where): only float values run at training time", n->name);
    int cb = fb(c, n->in[0]), xb = fb(c, n->in[1]), yb = fb(c, n->in[2]);
    rd(k, cb), rd(k, xb), rd(k, yb);
    Buf d = {0};
    buf_printf(&d, "static const WhereShape WHERE_%d = {%d, ", j, O->rank);
    ints(&d, O->dims, O->rank);
    const Tensor *srcs[3] = {C, X, Yv};
    for (int q = 0; q < 3; q++) {
      int64_t st[MAX_RANK];
      for (int i = 0; i < O->rank; i++) {
        int si = i - (O->rank - srcs[q]->rank);
        int64_t m = 1;
        for (int z = si + 1; z < srcs[q]->rank; z++) m *= srcs[q]->dims[z];
        st[i] = si < 0 || srcs[q]->dims[si] == 1 ? 0 : m;
      }
      buf_printf(&d, ", ");
      ints(&d, st, O->rank);
    }
    buf_printf(&d, ", %lld, %lld, %lld};", (long long)ir_numel(X), (long long)ir_numel(Yv), (long long)ir_numel(O));
    decl(c, "%s", d.s);
    buf_free(&d);
    text(c, "k_where((const uint8_t *)@%d@, @%d@, @%d@, @%d@, &WHERE_%d);", cb, xb, yb, y, j);
  } else if (!strcmp(op, "MatMul")) {
    Tensor *A = T(c, n->in[0]), *B = T(c, n->in[1]), *Y = T(c, n->out[0]);
    if (A->rank < 2 || B->rank < 2) return err_set("node '%s' (MatMul): 1-D operands do not train yet", n->name);
    int b = fb(c, n->in[1]);
    rd(k, b);
    int nb = Y->rank - 2, shared = B->rank == 2;
    int64_t batch = 1, sa[6], sb[6];
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
    Buf d = {0};
    buf_printf(&d, "static const MatMulShape MM_%d = {%lld, %lld, %lld, %lld, %d, ", j, (long long)batch, (long long)Y->dims[Y->rank - 2],
               (long long)Y->dims[Y->rank - 1], (long long)A->dims[A->rank - 1], nb);
    ints(&d, Y->dims, nb > 0 ? nb : 0);
    buf_printf(&d, ", ");
    ints(&d, sa, nb);
    buf_printf(&d, ", ");
    ints(&d, sb, nb);
    buf_printf(&d, ", %d};", shared);
    decl(c, "%s", d.s);
    buf_free(&d);
    text(c, "k_matmul(@%d@, @%d@, @%d@, &MM_%d);", x, b, y, j);
  } else if (!strcmp(op, "Transpose")) {
    Tensor *X = T(c, n->in[0]), *Y = T(c, n->out[0]);
    int64_t perm[MAX_RANK], xs[MAX_RANK], st[MAX_RANK], s2 = 1;
    if (attr_ints(n, "perm", perm, MAX_RANK) < 0)
      for (int i = 0; i < X->rank; i++) perm[i] = X->rank - 1 - i;
    for (int i = X->rank - 1; i >= 0; i--) xs[i] = s2, s2 *= X->dims[i];
    for (int i = 0; i < X->rank; i++) st[i] = xs[perm[i]];
    Buf d = {0};
    buf_printf(&d, "static const PermShape PERM_%d = {%d, ", j, Y->rank);
    ints(&d, Y->dims, Y->rank);
    buf_printf(&d, ", ");
    ints(&d, st, Y->rank);
    buf_printf(&d, ", %lld};", (long long)ir_numel(Y));
    decl(c, "%s", d.s);
    buf_free(&d);
    text(c, "k_transpose(@%d@, @%d@, &PERM_%d);", x, y, j);
  } else if (!strcmp(op, "Split")) {
    Tensor *X = T(c, n->in[0]);
    int a = (int)attr_int(n, "axis", 0);
    if (a < 0) a += X->rank;
    int64_t outer, inner, at = 0;
    around(X, a, &outer, &inner);
    Buf t = {0};
    for (int q = 0; q < n->nout; q++) {
      if (n->out[q] < 0) continue;
      int yq = out_buf(c, n->out[q]);
      wr(k, yq);
      int64_t len = T(c, n->out[q])->dims[a];
      buf_printf(&t, "%sk_take(@%d@, @%d@, %lld, %lld, %lld, %lld, %lld);", q ? "\n  " : "", x, yq, (long long)outer,
                 (long long)X->dims[a], (long long)inner, (long long)at, (long long)len);
      at += len;
    }
    text(c, "%s", t.s);
    buf_free(&t);
  } else if (!strcmp(op, "ReduceMean") || !strcmp(op, "ReduceSum")) {
    Tensor *X = T(c, n->in[0]), *Y = T(c, n->out[0]);
    int mask;
    if (reduce_axes(&c->p->g, n, X, &mask)) return -1;
    int64_t cnt = 1;
    for (int i = 0; i < X->rank; i++)
      if (mask >> i & 1) cnt *= X->dims[i];
    Buf d = {0};
    buf_printf(&d, "static const ReduceShape RED_%d = {%d, ", j, X->rank);
    ints(&d, X->dims, X->rank);
    buf_printf(&d, ", %d, %lld, %lld, %s};", mask, (long long)ir_numel(X), (long long)ir_numel(Y),
               op[6] == 'M' ? pool_printf(c->pool, "1.0f / %lld", (long long)cnt) : "1.0f");
    decl(c, "%s", d.s);
    buf_free(&d);
    text(c, "k_reduce(@%d@, @%d@, &RED_%d);", x, y, j);
  } else if (!strcmp(op, "Softmax") || !strcmp(op, "LogSoftmax")) {
    Tensor *X = T(c, n->in[0]);
    int64_t axis = attr_int(n, "axis", c->p->g.opset >= 13 ? -1 : 1);
    if (axis < 0) axis += X->rank;
    if (axis != X->rank - 1) return err_set("node '%s' (%s): only the last axis trains so far", n->name, op);
    int64_t cols = X->dims[X->rank - 1];
    text(c, "k_softmax(@%d@, @%d@, %lld, %lld, %d);", x, y, (long long)(ir_numel(X) / cols), (long long)cols, op[0] == 'L');
  } else if (!strcmp(op, "LayerNormalization")) {
    Tensor *X = T(c, n->in[0]);
    int64_t axis = attr_int(n, "axis", -1);
    if (axis < 0) axis += X->rank;
    int64_t cols = 1;
    for (int i = (int)axis; i < X->rank; i++) cols *= X->dims[i];
    Tensor *S = T(c, n->in[1]);
    if (ir_numel(S) != cols) return err_set("node '%s' (LayerNormalization): a broadcast scale does not train yet", n->name);
    int sc = fb(c, n->in[1]), bi = n->nin > 2 && n->in[2] >= 0 ? fb(c, n->in[2]) : -1;
    rd(k, sc), rd(k, bi);
    Buf t = {0};
    buf_printf(&t, "k_layernorm(@%d@, @%d@, %s, @%d@, %lld, %lld, %s);", x, sc, bi >= 0 ? pool_printf(c->pool, "@%d@", bi) : "NULL",
               y, (long long)(ir_numel(X) / cols), (long long)cols, flit(c, attr_float(n, "epsilon", 1e-5f)));
    /* The optional Mean and InvStdDev outputs, when something reads them. */
    int mo = -1, io = -1;
    if (n->nout > 1 && n->out[1] >= 0 && (T(c, n->out[1])->is_output || T(c, n->out[1])->nuses)) mo = out_buf(c, n->out[1]), wr(k, mo);
    if (n->nout > 2 && n->out[2] >= 0 && (T(c, n->out[2])->is_output || T(c, n->out[2])->nuses)) io = out_buf(c, n->out[2]), wr(k, io);
    if (mo >= 0 || io >= 0)
      buf_printf(&t, "\n  k_layernorm_stats(@%d@, %s, %s, %lld, %lld, %s);", x, mo >= 0 ? pool_printf(c->pool, "@%d@", mo) : "NULL",
                 io >= 0 ? pool_printf(c->pool, "@%d@", io) : "NULL", (long long)(ir_numel(X) / cols), (long long)cols,
                 flit(c, attr_float(n, "epsilon", 1e-5f)));
    text(c, "%s", t.s);
    buf_free(&t);
  } else if (!strcmp(op, "Gather")) {
    Tensor *D = T(c, n->in[0]), *I = T(c, n->in[1]);
    if (attr_int(n, "axis", 0) != 0 || D->dtype != DT_FLOAT || I->dtype != DT_INT64)
      return err_set("node '%s' (Gather): only float tables indexed by int64 on axis 0 (embeddings) train so far", n->name);
    int tb = fb(c, n->in[0]), ib = fb(c, n->in[1]);
    x = tb;
    rd(k, tb), rd(k, ib);
    text(c, "k_gather(@%d@, @%d@, @%d@, %lld, %lld, %lld);", tb, ib, y, (long long)ir_numel(I), (long long)D->dims[0],
         (long long)(ir_numel(D) / D->dims[0]));
  } else if (!strcmp(op, "Pad")) {
    Tensor *X = T(c, n->in[0]), *Y = T(c, n->out[0]);
    int64_t b[MAX_RANK], e[MAX_RANK];
    float v;
    if (pad_params(&c->p->g, n, X, b, e, &v)) return -1;
    Buf d = {0};
    buf_printf(&d, "static const PadShape PAD_%d = {%d, {", j, X->rank);
    for (int i = 0; i < X->rank; i++) buf_printf(&d, "%s%lld", i ? ", " : "", (long long)X->dims[i]);
    buf_printf(&d, "}, {");
    for (int i = 0; i < X->rank; i++) buf_printf(&d, "%s%lld", i ? ", " : "", (long long)Y->dims[i]);
    buf_printf(&d, "}, {");
    for (int i = 0; i < X->rank; i++) buf_printf(&d, "%s%lld", i ? ", " : "", (long long)b[i]);
    buf_printf(&d, "}, %s};", flit(c, v));
    decl(c, "%s", d.s);
    buf_free(&d);
    text(c, "k_pad(@%d@, @%d@, &PAD_%d);", x, y, j);
  } else {
    return err_set("node '%s' uses %s, which has no training kernel yet (trainable so far: Gemm, Conv, MaxPool, AveragePool, "
                   "GlobalAveragePool, BatchNormalization, LayerNormalization, MatMul, Gather, Softmax, LogSoftmax, Where, Split, Transpose, "
                   "ReduceMean, ReduceSum, Add, Sub, Mul, Div, Pow, Sqrt, Erf, Pad, Relu, Tanh, Sigmoid, Flatten, Reshape, Identity, "
                   "Squeeze, Unsqueeze)", n->name, op);
  }
  return 0;
}

static int needs(Ctx *c, Node *n, int k) { return k < n->nin && n->in[k] >= 0 && c->needs[n->in[k]]; }

static void bwd_rule(Ctx *c, Node *n, int j) {
  const char *op = n->op;
  int dy = c->gbuf[n->out[0]], x = fb(c, n->in[0]), y = fb(c, n->out[0]), acc;
  if (!strcmp(op, "Gemm")) {
    int M, N, K, ta, tb, cm, cn;
    gemm_dims(c, n, &M, &N, &K, &ta, &tb, &cm, &cn);
    int b = fb(c, n->in[1]);
    float alpha = attr_float(n, "alpha", 1), beta = attr_float(n, "beta", 1);
    if (needs(c, n, 1)) {
      int db = grad_target(c, n->in[1], &acc);
      Call *k = new_call(c, 1, n->name);
      rd(k, dy), rd(k, x), wr(k, db);
      text(c, "k_gemm_dB(@%d@, @%d@, @%d@, %d, %d, %d, %d, %d, %s, %d);", dy, x, db, M, N, K, ta, tb, flit(c, alpha), acc);
    }
    if (cm && needs(c, n, 2)) {
      int dc = grad_target(c, n->in[2], &acc);
      Call *k = new_call(c, 1, n->name);
      rd(k, dy), wr(k, dc);
      text(c, "k_gemm_dC(@%d@, @%d@, %d, %d, %d, %d, %s, %d);", dy, dc, M, N, cm, cn, flit(c, beta), acc);
    }
    if (needs(c, n, 0)) {
      int dx = grad_target(c, n->in[0], &acc);
      Call *k = new_call(c, 1, n->name);
      rd(k, dy), rd(k, b), wr(k, dx);
      text(c, "k_gemm_dA(@%d@, @%d@, @%d@, %d, %d, %d, %d, %d, %s, %d);", dy, b, dx, M, N, K, ta, tb, flit(c, alpha), acc);
    }
  } else if (!strcmp(op, "Relu") || !strcmp(op, "Tanh") || !strcmp(op, "Sigmoid")) {
    if (!needs(c, n, 0)) return;
    int dx = grad_target(c, n->in[0], &acc);
    Call *k = new_call(c, 1, n->name);
    rd(k, y), rd(k, dy), wr(k, dx);
    const char *fn = op[0] == 'R' ? "k_relu_grad" : op[0] == 'T' ? "k_tanh_grad" : "k_sigmoid_grad";
    text(c, "%s(@%d@, @%d@, @%d@, %lld, %d);", fn, y, dy, dx, (long long)numel(c, n->out[0]), acc);
  } else if (!strcmp(op, "Conv")) {
    int w = fb(c, n->in[1]), hasb = n->nin > 2 && n->in[2] >= 0;
    Tensor *W = T(c, n->in[1]), *Y = T(c, n->out[0]);
    int col = add_buf(c, "dcol_", n->out[0], BUF_TEMP, 4 * W->dims[1] * W->dims[2] * W->dims[3] * Y->dims[2] * Y->dims[3], DT_FLOAT);
    if (needs(c, n, 1)) {
      int dw = grad_target(c, n->in[1], &acc), db = hasb && needs(c, n, 2) ? grad_target(c, n->in[2], &acc) : -1;
      Call *k = new_call(c, 1, n->name);
      rd(k, x), rd(k, dy), wr(k, dw), wr(k, db), wr(k, col);
      text(c, "k_conv_grad(@%d@, @%d@, @%d@, NULL, @%d@, %s, @%d@, &CONV_%d, 0, 1);", x, w, dy, dw,
           db >= 0 ? pool_printf(c->pool, "@%d@", db) : "NULL", col, j);
    }
    if (needs(c, n, 0)) {
      int dx = grad_target(c, n->in[0], &acc);
      Call *k = new_call(c, 1, n->name);
      rd(k, x), rd(k, w), rd(k, dy), wr(k, dx), wr(k, col);
      text(c, "k_conv_grad(@%d@, @%d@, @%d@, @%d@, NULL, NULL, @%d@, &CONV_%d, %d, 1);", x, w, dy, dx, col, j, acc);
    }
  } else if (!strcmp(op, "MaxPool") || !strcmp(op, "AveragePool") || !strcmp(op, "GlobalAveragePool")) {
    if (!needs(c, n, 0)) return;
    int dx = grad_target(c, n->in[0], &acc);
    Call *k = new_call(c, 1, n->name);
    if (op[0] == 'M') {
      rd(k, x), rd(k, dy), wr(k, dx);
      text(c, "k_maxpool_grad(@%d@, @%d@, @%d@, &POOL_%d, %d);", x, dy, dx, j, acc);
    } else {
      rd(k, dy), wr(k, dx);
      text(c, "k_avgpool_grad(@%d@, @%d@, &POOL_%d, %d);", dy, dx, j, acc);
    }
  } else if (!strcmp(op, "BatchNormalization")) {
    int gm = fb(c, n->in[1]), rm = fb(c, n->in[3]), rv = fb(c, n->in[4]);
    int dg = needs(c, n, 1) ? grad_target(c, n->in[1], &acc) : -1;
    int dbt = needs(c, n, 2) ? grad_target(c, n->in[2], &acc) : -1;
    int dx = -1, accx = 0;
    if (needs(c, n, 0)) dx = grad_target(c, n->in[0], &accx);
    Call *k = new_call(c, 1, n->name);
    rd(k, x), rd(k, gm), rd(k, rm), rd(k, rv), rd(k, dy), wr(k, dx), wr(k, dg), wr(k, dbt);
    text(c, "k_batchnorm_grad(@%d@, @%d@, @%d@, @%d@, @%d@, %s, %s, %s, &BN_%d, %d);", x, gm, rm, rv, dy,
         dx >= 0 ? pool_printf(c->pool, "@%d@", dx) : "NULL", dg >= 0 ? pool_printf(c->pool, "@%d@", dg) : "NULL",
         dbt >= 0 ? pool_printf(c->pool, "@%d@", dbt) : "NULL", j, accx);
  } else if (!strcmp(op, "Add") || !strcmp(op, "Sub") || !strcmp(op, "Mul") || !strcmp(op, "Div") || !strcmp(op, "Pow")) {
    const char *code = !strcmp(op, "Add") ? "ADD" : !strcmp(op, "Sub") ? "SUB" : !strcmp(op, "Mul") ? "MUL" : !strcmp(op, "Div") ? "DIV" : "POW";
    int lin = !strcmp(op, "Add") || !strcmp(op, "Sub"), a = fb(c, n->in[0]), b = fb(c, n->in[1]);
    /* Reverse input order, as the other rules: the second input's gradient first. */
    for (int which = 1; which >= 0; which--) {
      if (!needs(c, n, which)) continue;
      int d = grad_target(c, n->in[which], &acc);
      Call *k = new_call(c, 1, n->name);
      if (!lin) rd(k, a), rd(k, b);
      rd(k, dy), wr(k, d);
      text(c, "k_binary_grad(BIN_%s, %d, %s, %s, @%d@, @%d@, &BIN_%d, %d);", code, which, lin ? "NULL" : pool_printf(c->pool, "@%d@", a),
           lin ? "NULL" : pool_printf(c->pool, "@%d@", b), dy, d, j, acc);
    }
  } else if (!strcmp(op, "Erf") || !strcmp(op, "Sqrt")) {
    if (!needs(c, n, 0)) return;
    int dx = grad_target(c, n->in[0], &acc);
    Call *k = new_call(c, 1, n->name);
    int src = op[0] == 'E' ? x : y;
    rd(k, src), rd(k, dy), wr(k, dx);
    text(c, "k_%s_grad(@%d@, @%d@, @%d@, %lld, %d);", op[0] == 'E' ? "erf" : "sqrt", src, dy, dx, (long long)numel(c, n->out[0]), acc);
  } else if (!strcmp(op, "Where")) {
    int cb = fb(c, n->in[0]);
    for (int which = 2; which >= 1; which--) {
      if (!needs(c, n, which)) continue;
      int d = grad_target(c, n->in[which], &acc);
      Call *k = new_call(c, 1, n->name);
      rd(k, cb), rd(k, dy), wr(k, d);
      text(c, "k_where_grad((const uint8_t *)@%d@, @%d@, @%d@, %d, &WHERE_%d, %d);", cb, dy, d, which, j, acc);
    }
  } else if (!strcmp(op, "MatMul")) {
    int a = fb(c, n->in[0]), b = fb(c, n->in[1]);
    if (needs(c, n, 1)) {
      int d = grad_target(c, n->in[1], &acc);
      Call *k = new_call(c, 1, n->name);
      rd(k, dy), rd(k, a), wr(k, d);
      text(c, "k_matmul_dB(@%d@, @%d@, @%d@, %lld, &MM_%d, %d);", dy, a, d, (long long)numel(c, n->in[1]), j, acc);
    }
    if (needs(c, n, 0)) {
      int d = grad_target(c, n->in[0], &acc);
      Call *k = new_call(c, 1, n->name);
      rd(k, dy), rd(k, b), wr(k, d);
      text(c, "k_matmul_dA(@%d@, @%d@, @%d@, %lld, &MM_%d, %d);", dy, b, d, (long long)numel(c, n->in[0]), j, acc);
    }
  } else if (!strcmp(op, "Transpose")) {
    if (!needs(c, n, 0)) return;
    int dx = grad_target(c, n->in[0], &acc);
    Call *k = new_call(c, 1, n->name);
    rd(k, dy), wr(k, dx);
    text(c, "k_transpose_grad(@%d@, @%d@, &PERM_%d, %d);", dy, dx, j, acc);
  } else if (!strcmp(op, "Split")) {
    if (!needs(c, n, 0)) return;
    Tensor *X = T(c, n->in[0]);
    int a = (int)attr_int(n, "axis", 0);
    if (a < 0) a += X->rank;
    int64_t outer, inner, at = 0;
    around(X, a, &outer, &inner);
    int dx = grad_target(c, n->in[0], &acc);
    if (!acc) {
      Call *k = new_call(c, 1, n->name);
      wr(k, dx);
      text(c, "k_zero(@%d@, %lld);", dx, (long long)ir_numel(X));
    }
    /* Each output's gradient adds into its slice; outputs no gradient reached stay zero. */
    for (int q = 0; q < n->nout; q++) {
      if (n->out[q] < 0) continue;
      int64_t len = T(c, n->out[q])->dims[a];
      int g = c->gbuf[n->out[q]];
      if (g >= 0 && c->gcount[n->out[q]]) {
        Call *k = new_call(c, 1, n->name);
        rd(k, g), wr(k, dx);
        text(c, "k_take_grad(@%d@, @%d@, %lld, %lld, %lld, %lld, %lld);", g, dx, (long long)outer, (long long)X->dims[a],
             (long long)inner, (long long)at, (long long)len);
      }
      at += len;
    }
  } else if (!strcmp(op, "ReduceMean") || !strcmp(op, "ReduceSum")) {
    if (!needs(c, n, 0)) return;
    int dx = grad_target(c, n->in[0], &acc);
    Call *k = new_call(c, 1, n->name);
    rd(k, dy), wr(k, dx);
    text(c, "k_reduce_grad(@%d@, @%d@, &RED_%d, %d);", dy, dx, j, acc);
  } else if (!strcmp(op, "Softmax") || !strcmp(op, "LogSoftmax")) {
    if (!needs(c, n, 0)) return;
    Tensor *X = T(c, n->in[0]);
    int64_t cols = X->dims[X->rank - 1];
    int dx = grad_target(c, n->in[0], &acc);
    Call *k = new_call(c, 1, n->name);
    rd(k, y), rd(k, dy), wr(k, dx);
    text(c, "k_softmax_grad(@%d@, @%d@, @%d@, %lld, %lld, %d, %d);", y, dy, dx, (long long)(ir_numel(X) / cols), (long long)cols,
         op[0] == 'L', acc);
  } else if (!strcmp(op, "LayerNormalization")) {
    Tensor *X = T(c, n->in[0]);
    int64_t axis = attr_int(n, "axis", -1);
    if (axis < 0) axis += X->rank;
    int64_t cols = 1;
    for (int i = (int)axis; i < X->rank; i++) cols *= X->dims[i];
    int sc = fb(c, n->in[1]), hasb = n->nin > 2 && n->in[2] >= 0;
    int ds = needs(c, n, 1) ? grad_target(c, n->in[1], &acc) : -1;
    int db = hasb && needs(c, n, 2) ? grad_target(c, n->in[2], &acc) : -1;
    int dx = -1, accx = 0;
    if (needs(c, n, 0)) dx = grad_target(c, n->in[0], &accx);
    Call *k = new_call(c, 1, n->name);
    rd(k, x), rd(k, sc), rd(k, dy), wr(k, dx), wr(k, ds), wr(k, db);
    text(c, "k_layernorm_grad(@%d@, @%d@, @%d@, %s, %s, %s, %lld, %lld, %s, %d);", x, sc, dy,
         dx >= 0 ? pool_printf(c->pool, "@%d@", dx) : "NULL", ds >= 0 ? pool_printf(c->pool, "@%d@", ds) : "NULL",
         db >= 0 ? pool_printf(c->pool, "@%d@", db) : "NULL", (long long)(ir_numel(X) / cols), (long long)cols,
         flit(c, attr_float(n, "epsilon", 1e-5f)), accx);
  } else if (!strcmp(op, "Gather")) {
    if (!needs(c, n, 0)) return;
    Tensor *D = T(c, n->in[0]), *I = T(c, n->in[1]);
    int ib = fb(c, n->in[1]);
    int d = grad_target(c, n->in[0], &acc);
    Call *k = new_call(c, 1, n->name);
    rd(k, ib), rd(k, dy), wr(k, d);
    if (!acc) {
      text(c, "k_zero(@%d@, %lld);", d, (long long)ir_numel(D));
      k = new_call(c, 1, n->name);
      rd(k, ib), rd(k, dy), wr(k, d);
    }
    text(c, "k_gather_grad(@%d@, @%d@, @%d@, %lld, %lld, %lld);", ib, dy, d, (long long)ir_numel(I), (long long)D->dims[0],
         (long long)(ir_numel(D) / D->dims[0]));
  } else if (!strcmp(op, "Pad")) {
    if (!needs(c, n, 0)) return;
    int dx = grad_target(c, n->in[0], &acc);
    Call *k = new_call(c, 1, n->name);
    rd(k, dy), wr(k, dx);
    text(c, "k_pad_grad(@%d@, @%d@, &PAD_%d, %d);", dy, dx, j, acc);
  } else { /* the reshapes */
    if (!needs(c, n, 0)) return;
    int dx = grad_target(c, n->in[0], &acc);
    Call *k = new_call(c, 1, n->name);
    rd(k, dy), wr(k, dx);
    text(c, "k_copy_grad(@%d@, @%d@, %lld, %d);", dy, dx, (long long)numel(c, n->out[0]), acc);
  }
}

/* Tensors on a path from a parameter: they need gradients. */
static char *needs_grad(Plan *p, Pool *pool) {
  Graph *g = &p->g;
  char *need = pool_alloc(pool, (size_t)g->nt);
  for (int i = 0; i < g->nt; i++) need[i] = g->t[i].is_param;
  for (int k = 0; k < p->N; k++) {
    Node *n = &g->n[p->node[k]];
    const OpDef *d = op_find(n->op);
    int any = 0;
    for (int q = 0; q < n->nin; q++)
      if (n->in[q] >= 0 && need[n->in[q]] && (d->diff_inputs >> (q < 31 ? q : 31) & 1)) any = 1;
    for (int q = 0; q < n->nout; q++)
      if (n->out[q] >= 0 && any && dtype_is_float(g->t[n->out[q]].dtype)) need[n->out[q]] = 1;
  }
  return need;
}

static int build_stage(Ctx *c) {
  Plan *p = c->p;
  Graph *g = &p->g;
  StageProg *sp = c->sp;
  int n = p->opt.nstages, last = c->s == n - 1;
  /* Parameters this stage reads, in ONNX initializer (tensor) order. */
  sp->params = pool_alloc(c->pool, sizeof(int) * (size_t)g->nt);
  sp->consts = pool_alloc(c->pool, sizeof(int) * (size_t)g->nt);
  for (int i = 0; i < g->nt; i++) {
    if (!g->t[i].is_param) continue;
    int here = 0, other = -1;
    for (int k = 0; k < p->N; k++) {
      Node *nd = &g->n[p->node[k]];
      for (int q = 0; q < nd->nin; q++)
        if (nd->in[q] == i) {
          if (k >= c->a && k < c->e) here = 1;
          else other = k;
        }
    }
    if (here && other >= 0)
      return err_set("weight '%s' is read in stage %d and by node '%s' in another stage; weights shared across stages "
                     "are not supported yet (use fewer stages)", g->t[i].name, c->s, g->n[p->node[other]].name);
    if (!here) continue;
    int b = add_buf(c, "W_", i, BUF_PARAM, tensor_bytes(&g->t[i]), DT_FLOAT);
    c->fbuf[i] = b;
    sp->params[sp->nparams++] = b;
  }
  /* What crosses the stage's cuts: received on the left, sent on the right. */
  sp->recv = pool_alloc(c->pool, sizeof(Crossing) * (size_t)(p->nedges + 1));
  sp->send = pool_alloc(c->pool, sizeof(Crossing) * (size_t)(p->nedges + 1));
  for (int q = 0; q < p->nedges; q++) {
    PartEdge *ed = &p->edges[q];
    int t = p->edge_tensor[q];
    if (ed->from < c->a && c->a <= ed->to) {
      Crossing *x = &sp->recv[sp->nrecv++];
      x->tensor = t;
      x->from_loader = ed->from < 0 && c->s == 0;
      x->buf = c->fbuf[t] = add_buf(c, "", t, BUF_RING, tensor_bytes(&g->t[t]), g->t[t].dtype);
      x->gbuf = -1;
      if (c->s > 0 && c->needs[t]) {
        x->gbuf = add_buf(c, "d_", t, BUF_GRING, tensor_bytes(&g->t[t]), DT_FLOAT);
        sp->bufs[x->gbuf].is_grad = 1;
      }
    }
  }
  for (int k = c->a; k < c->e; k++)
    if (fwd_rule(c, &g->n[p->node[k]], p->node[k])) return -1;
  for (int q = 0; q < p->nedges; q++) {
    PartEdge *ed = &p->edges[q];
    int t = p->edge_tensor[q];
    if (!(ed->from < c->e && c->e <= ed->to)) continue;
    if (last && c->p->opt.forward_only) { /* an inference program hands its outputs back */
      if (c->fbuf[t] < 0) {
        const Tensor *o = &g->t[t];
        return err_set("output '%s' of node '%s' (%s) is not computed by pipecc's kernel (only the op's main output is)", o->name,
                       o->producer >= 0 ? g->n[o->producer].name : "?", o->producer >= 0 ? g->n[o->producer].op : "?");
      }
      Crossing *x = &sp->send[sp->nsend++];
      x->tensor = t, x->buf = c->fbuf[t], x->gbuf = -1;
      sp->bufs[x->buf].kind = BUF_RING;
      continue;
    }
    if (last) { /* the graph output the loss reads */
      if (!dtype_is_float(g->t[t].dtype)) return err_set("graph output '%s' is not float; the loss needs logits", g->t[t].name);
      if (sp->loss_buf >= 0) return err_set("the model has more than one output; the loss takes one (logits)");
      Tensor *L = &g->t[t];
      if (L->rank < 2) return err_set("graph output '%s' %s must be [batch, classes] or [batch, seq, vocab]", L->name, shape_str(L));
      sp->loss_buf = c->fbuf[t];
      sp->bufs[sp->loss_buf].kind = BUF_RING;
      sp->loss_classes = L->dims[L->rank - 1];
      sp->loss_rows = ir_numel(L) / sp->loss_classes;
      sp->dloss_buf = c->gbuf[t] = add_buf(c, "d_", t, BUF_RING, tensor_bytes(L), DT_FLOAT);
      sp->bufs[sp->dloss_buf].is_grad = 1;
      c->gcount[t] = 1;
      sp->labels_buf = add_buf(c, "labels_", t, BUF_LABELS, 8 * sp->loss_rows, DT_INT64);
      continue;
    }
    Crossing *x = &sp->send[sp->nsend++];
    x->tensor = t;
    x->buf = c->fbuf[t];
    sp->bufs[x->buf].kind = BUF_RING;
    x->gbuf = -1;
    if (c->needs[t]) {
      /* Receiving the gradient is its first contribution; local readers add. */
      x->gbuf = c->gbuf[t] = add_buf(c, "d_", t, BUF_GRING, tensor_bytes(&g->t[t]), DT_FLOAT);
      sp->bufs[x->gbuf].is_grad = 1;
      c->gcount[t] = 1;
    }
  }
  if (c->p->opt.forward_only) {
    /* No training: the weights are read-only constants of the program. */
    sp->pgrad = sp->opt1 = sp->opt2 = pool_alloc(c->pool, sizeof(int) * (size_t)(sp->nparams + 1));
    for (int i = 0; i < sp->nparams; i++) sp->pgrad[i] = -1;
    return 0;
  }
  if (last && sp->loss_buf < 0) return err_set("the last stage has no graph output for the loss");
  for (int k = c->e - 1; k >= c->a; k--) {
    Node *nd = &g->n[p->node[k]];
    int reached = 0;
    for (int q = 0; q < nd->nout; q++) reached |= nd->out[q] >= 0 && c->gbuf[nd->out[q]] >= 0 && c->gcount[nd->out[q]];
    if (!reached) continue; /* no gradient reaches it */
    bwd_rule(c, nd, p->node[k]);
  }
  /* Gradients this stage sends back: received values it (or later stages) used. */
  for (int r = 0; r < sp->nrecv; r++) {
    Crossing *x = &sp->recv[r];
    if (x->gbuf < 0) continue;
    int t = x->tensor, have = c->gbuf[t];
    if (have < 0 || !c->gcount[t]) {
      Call *k = new_call(c, 1, "no gradient reaches it here");
      wr(k, x->gbuf);
      text(c, "memset(@%d@, 0, %lld);", x->gbuf, (long long)tensor_bytes(&g->t[t]));
    } else if (have != x->gbuf) {
      /* Retarget: the gradient was summed in a temporary; the ring copy is what is sent. */
      Call *k = new_call(c, 1, "to the send buffer");
      rd(k, have), wr(k, x->gbuf);
      text(c, "k_copy_grad(@%d@, @%d@, %lld, 0);", have, x->gbuf, (long long)ir_numel(&g->t[t]));
    }
  }
  /* A forward value that backward reads must survive until its micro-batch's
   * backward: one copy per micro-batch in flight. */
  for (int k = 0; k < sp->nbwd; k++)
    for (int r = 0; r < sp->bwd[k].nreads; r++) {
      Buffer *b = &sp->bufs[sp->bwd[k].reads[r]];
      if (b->kind == BUF_TEMP && !b->is_grad && b->tensor >= 0 && c->fbuf[b->tensor] == sp->bwd[k].reads[r]) b->kind = BUF_RING;
    }
  /* Gradient and optimizer buffers for every weight. */
  const char *optname = p->opt.optimizer ? p->opt.optimizer : "sgd";
  int slots = !strcmp(optname, "sgd") ? (p->opt.momentum > 0) : 2;
  sp->pgrad = pool_alloc(c->pool, sizeof(int) * (size_t)(sp->nparams + 1));
  sp->opt1 = pool_alloc(c->pool, sizeof(int) * (size_t)(sp->nparams + 1));
  sp->opt2 = pool_alloc(c->pool, sizeof(int) * (size_t)(sp->nparams + 1));
  for (int i = 0; i < sp->nparams; i++) {
    int t = sp->bufs[sp->params[i]].tensor;
    if (c->gbuf[t] < 0) {
      int acc;
      grad_target(c, t, &acc);
    }
    sp->pgrad[i] = c->gbuf[t];
    sp->opt1[i] = slots >= 1 ? add_buf(c, "M1_", t, BUF_OPT, tensor_bytes(&g->t[t]), DT_FLOAT) : -1;
    sp->opt2[i] = slots >= 2 ? add_buf(c, "M2_", t, BUF_OPT, tensor_bytes(&g->t[t]), DT_FLOAT) : -1;
  }
  return 0;
}

int autodiff_build(Plan *p, StageProg *progs, Pool *pool) {
  Graph *g = &p->g;
  const char *need = p->opt.forward_only ? pool_alloc(pool, (size_t)g->nt) : needs_grad(p, pool);
  for (int s = 0; s < p->opt.nstages; s++) {
    StageProg *sp = &progs[s];
    memset(sp, 0, sizeof *sp);
    sp->stage = s;
    sp->loss_buf = sp->dloss_buf = sp->labels_buf = -1;
    Ctx c = {p, sp, pool, s, p->part.start[s], p->part.start[s + 1], NULL, NULL, NULL, need, NULL};
    c.fbuf = pool_alloc(pool, sizeof(int) * (size_t)g->nt);
    c.gbuf = pool_alloc(pool, sizeof(int) * (size_t)g->nt);
    c.gcount = pool_alloc(pool, sizeof(int) * (size_t)g->nt);
    for (int i = 0; i < g->nt; i++) c.fbuf[i] = c.gbuf[i] = -1;
    /* Constants a node reads (folded shapes are attributes of the call; float
     * constants such as a scalar would need a buffer: not yet). */
    if (build_stage(&c)) return -1;
  }
  return 0;
}
