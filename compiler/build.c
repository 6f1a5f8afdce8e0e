/* build.c - a stage program's buffers and calls as the operators' rules
 * hand them out (ops/rule.h's em_* functions, build.h): autodiff.c builds
 * a stage by running each node's forward and backward rule on one Emit. */
#include "build.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A buffer's C identifier: its role's prefix (v_ value, d_ gradient, dW_
 * weight gradient, W_ weight, C_ constant, M1_/M2_ optimizer state, L_
 * labels, col_/dcol_ workspace) and the tensor's name with every other byte
 * made '_'.  The prefix keeps a name from the model from ever being a C
 * keyword, a kernel, a runtime field or a function the stage defines
 * ("main", "forward", "k_gemm", "offset" as L_offset...); add_buf makes it unique. */
static const char *cname(Pool *pool, const char *prefix, const char *name) {
  char *s = pool_printf(pool, "%s%s", prefix, name);
  for (char *c = s; *c; c++)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9'))) *c = '_';
  return s;
}

int build_buf(Emit *c, const char *prefix, int tensor, int kind, int64_t bytes, int dtype) {
  StageProg *sp = c->sp;
  if (sp->nbufs == sp->capbufs) {
    sp->capbufs = sp->capbufs ? 2 * sp->capbufs : 64;
    sp->bufs = pool_realloc(c->pool, sp->bufs, sizeof(Buffer) * (size_t)sp->capbufs);
  }
  Buffer *b = &sp->bufs[sp->nbufs];
  memset(b, 0, sizeof *b);
  const char *base = tensor >= 0 ? c->p->g.t[tensor].name : "work";
  b->name = c->named ? cname(c->pool, prefix, base) : prefix;
  /* Names must be unique C identifiers: add the buffer number when needed. */
  for (int i = 0; i < sp->nbufs && c->named; i++)
    if (!strcmp(sp->bufs[i].name, b->name)) {
      b->name = pool_printf(c->pool, "%s_%d", b->name, sp->nbufs);
      break;
    }
  b->tensor = tensor, b->kind = kind, b->bytes = bytes, b->dtype = dtype;
  b->first = b->last = -1;
  return sp->nbufs++;
}

static Tensor *T(Emit *c, int idx) { return &c->p->g.t[idx]; }

/* The buffer holding tensor t's value in this stage: a parameter, an
 * activation produced here or received, or a constant, which is placed in the
 * weights region with its value (BatchNorm's running statistics live there
 * too, and change as the stage trains). */
static int fb(Emit *c, int t) {
  if (c->fbuf[t] < 0 && T(c, t)->data) {
    c->fbuf[t] = build_buf(c, "C_", t, BUF_PARAM, tensor_bytes(T(c, t)), T(c, t)->dtype);
    c->sp->consts[c->sp->nconsts++] = c->fbuf[t];
  }
  return c->fbuf[t];
}

int build_is_tied(Emit *c, int t) { return T(c, t)->is_param && c->p->nreaders[t] > 1; }

/* The partial gradient of tied weight t that node `node` adds into. */
int build_partial(Emit *c, int t, int node) {
  for (int i = 0; i < c->npart; i++)
    if (c->part[i].t == t && c->part[i].node == node) return c->part[i].buf;
  if (c->npart == c->cappart) {
    c->cappart = c->cappart ? 2 * c->cappart : 8;
    c->part = pool_realloc(c->pool, c->part, sizeof *c->part * (size_t)c->cappart);
  }
  int b = build_buf(c, "dP_", t, BUF_PGRAD, tensor_bytes(T(c, t)), DT_FLOAT);
  c->sp->bufs[b].is_grad = 1;
  c->part[c->npart++] = (struct Partial){t, node, b};
  return b;
}

/* Gradient buffer for input tensor t of graph node `node` (-1: none), and whether to add. */
int build_grad_target(Emit *c, int t, int *acc, int node) {
  Tensor *x = T(c, t);
  if (node >= 0 && build_is_tied(c, t)) { /* summed over micro-batches, like any weight gradient */
    *acc = 1;
    return build_partial(c, t, node);
  }
  if (c->gbuf[t] < 0) {
    if (x->is_param) c->gbuf[t] = build_buf(c, "dW_", t, BUF_PGRAD, tensor_bytes(x), DT_FLOAT);
    else c->gbuf[t] = build_buf(c, "d_", t, BUF_TEMP, tensor_bytes(x), DT_FLOAT);
    c->sp->bufs[c->gbuf[t]].is_grad = 1;
  }
  /* Weight gradients always add: they are zeroed once per step and summed over micro-batches. */
  *acc = x->is_param ? 1 : c->gcount[t] > 0;
  c->gcount[t]++;
  return c->gbuf[t];
}

static int out_buf(Emit *c, int t) {
  if (c->fbuf[t] < 0) c->fbuf[t] = build_buf(c, "v_", t, BUF_TEMP, tensor_bytes(T(c, t)), T(c, t)->dtype);
  return c->fbuf[t];
}

/* ---- what operator rules see (ops/rule.h) ---- */

Graph *em_graph(Emit *e) { return &e->p->g; }
Tensor *em_t(Emit *e, int tensor) { return T(e, tensor); }
int em_in(Emit *e, const Node *n, int k) { return k < n->nin && n->in[k] >= 0 ? fb(e, n->in[k]) : -1; }
int em_out(Emit *e, const Node *n, int k) { return out_buf(e, n->out[k]); }
int em_used(Emit *e, const Node *n, int k) {
  return k < n->nout && n->out[k] >= 0 && (T(e, n->out[k])->is_output || T(e, n->out[k])->nuses);
}
int em_work(Emit *e, const char *prefix, int tensor, int64_t bytes) {
  int b = build_buf(e, prefix, tensor, BUF_TEMP, bytes, DT_FLOAT);
  e->sp->bufs[b].is_workspace = 1;
  return b;
}
int em_split_wgrad(Emit *e) { return sched_splits(e->p->opt.schedule) && !e->p->opt.forward_only; }
int em_training(Emit *e) { return !e->p->opt.forward_only; }
int em_needs(Emit *e, const Node *n, int k) { return k < n->nin && n->in[k] >= 0 && e->needs[n->in[k]]; }
int em_grad(Emit *e, const Node *n, int k, int *acc) { return build_grad_target(e, n->in[k], acc, (int)(n - e->p->g.n)); }
int em_grad_add(Emit *e, const Node *n, int k) {
  int acc, node = (int)(n - e->p->g.n), b = build_grad_target(e, n->in[k], &acc, node);
  if (!acc) /* an activation's gradient (a scale computed at run time): its first contribution must not add to garbage */
    call_add(e->sp, e->pool, PH_IGRAD, K_ZERO, node, "its first contribution, and the kernel below adds",
             (Arg[]){A_BUF(b), A_INT(ir_numel(T(e, n->in[k])))}, 2);
  return b;
}
int em_dy(Emit *e, const Node *n, int k) {
  int t = k < n->nout ? n->out[k] : -1;
  return t >= 0 && e->gbuf[t] >= 0 && e->gcount[t] ? e->gbuf[t] : -1;
}
int em_shape(Emit *e, const char *type, const char *name, const Arg *fields, int nfields) {
  return shape_add(e->sp, e->pool, type, name, fields, nfields);
}
int em_shape_ref(Emit *e, const char *name) {
  int id = shape_find(e->sp, name);
  if (id < 0) {
    fprintf(stderr, "pipecc: internal error: backward rule refers to shape constant %s, which its forward rule did not define\n", name);
    abort();
  }
  return id;
}
void em_call(Emit *e, int phase, int kernel, const Node *n, const Arg *args, int nargs) {
  /* A fused node's call says what it runs (fuse.c): "/bn1/BatchNormalization (BatchNormalization+Relu)". */
  const char *comment = n->fusion ? pool_printf(e->pool, "%s (%s)", n->name, n->fusion) : n->name;
  Call *k = call_add(e->sp, e->pool, phase, kernel, (int)(n - e->p->g.n), comment, args, nargs);
  /* W work may only produce weight gradients: a call that also writes the
   * gradient of an activation (a Gemm whose B is computed) is input-gradient
   * work, which the next I action upstream needs. */
  for (int w = 0; w < k->nwrites && k->phase == PH_WGRAD; w++) {
    const Buffer *b = &e->sp->bufs[k->writes[w]];
    if (b->is_grad && b->kind != BUF_PGRAD) k->phase = PH_IGRAD;
  }
}
void em_variant(Emit *e, int which, int kernel, const Arg *args, int nargs) {
  if (!e->sp->nfwd) abort();
  call_variant(e->sp, e->pool, &e->sp->fwd[e->sp->nfwd - 1], which, kernel, args, nargs);
}
const char *em_name(Emit *e, const char *fmt, int j) { return pool_printf(e->pool, fmt, j); }

