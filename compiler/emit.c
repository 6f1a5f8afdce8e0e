/* emit.c - writing the generated directory: stage_<k>.c, weights, the
 * Makefile and run.sh.
 *
 * A stage file is meant to be read: a header comment says what the stage
 * holds, buffers are named constants (offset, size), each op is one call,
 * and the schedule is a table. */
#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "emit.h"

#include "freeze.h"
#include "memplan.h"
#include "onnx_load.h"
#include "ops/conv.h"
#include "ops/norm.h"
#include "outdir.h"
#include "pipefb.h"
#include "planq.h"
#include "profile.h"
#include "stageprog.h"
#include "stash.h"
#include "templates.h"


static const char *kind_name(int k) {
  switch (k) {
  case BUF_PARAM: return "weight";
  case BUF_PGRAD: return "weight gradient";
  case BUF_OPT: return "optimizer state";
  case BUF_RING: return "one copy per micro-batch in flight";
  case BUF_GRING: return "gradient, one copy per gradient slot";
  case BUF_LABELS: return "labels";
  default: return "temporary";
  }
}

/* A workspace's comment, by the prefix its op's rule named it with (em_work). */
static const char *work_what(const Buffer *b) {
  return strncmp(b->name, "rnn_", 4) && strncmp(b->name, "drnn_", 5)
             ? "workspace of one kernel (im2col columns)"
             : "workspace of one kernel (a recurrent layer's gates and states at every step)";
}

/* What a buffer holds, for its comment: the tensor's shape and its role.
 * Labels are one int64 per loss row, whatever shape the logits have. */
static const char *buf_what(const Graph *g, const Buffer *b) {
  static char s[256];
  if (b->is_workspace) return work_what(b);
  if (b->kind == BUF_LABELS) snprintf(s, sizeof s, "[%lld] int64, labels", (long long)(b->bytes / 8));
  else if (b->tensor >= 0) snprintf(s, sizeof s, "%s, %s", shape_str(&g->t[b->tensor]), kind_name(b->kind));
  else snprintf(s, sizeof s, "%s", kind_name(b->kind));
  return s;
}

/* Text from the model (a node or tensor name, the file's path) inside a C
 * comment: a name holding the end of a comment or a newline would otherwise
 * put its own code into the stage program.  Unprintable bytes become \xNN. */
static void put_comment(Buf *o, const char *s) {
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    if (*c == '*' && c[1] == '/') buf_printf(o, "*\\/"), c++;
    else if (*c == '/' && c[1] == '*') buf_printf(o, "/\\*"), c++;
    else if (*c < 0x20 || *c >= 0x7f || *c == '\\') buf_printf(o, "\\x%02x", *c);
    else buf_printf(o, "%c", *c);
  }
}

/* The same text as the body of a C string literal: quotes, backslashes and
 * '?' (trigraphs) escaped, other unprintable bytes as 3-digit octal. */
static void put_cstring(Buf *o, const char *s) {
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    if (*c == '"' || *c == '\\' || *c == '?') buf_printf(o, "\\%c", *c);
    else if (*c < 0x20 || *c >= 0x7f) buf_printf(o, "\\%03o", *c);
    else buf_printf(o, "%c", *c);
  }
}

/* The C expression for buffer b inside the forward/backward functions:
 * its macro, with the copy it uses. */
static void buf_expr(Buf *o, const StageProg *sp, int id) {
  const Buffer *b = &sp->bufs[id];
  if (b->kind == BUF_RING && b->fate != FATE_KEEP) buf_printf(o, "%s(xslot)", b->name);
  else if (b->kind == BUF_RING) buf_printf(o, "%s(slot)", b->name);
  else if (b->kind == BUF_GRING) buf_printf(o, "%s(gslot)", b->name);
  else buf_printf(o, "%s", b->name);
}

static const char *ctype(const Buffer *b) { return b->dtype == DT_INT64 || b->kind == BUF_LABELS ? "int64_t" : "float"; }

/* A float as a valid C literal that reads back as the same float: 1.0f, 0.05f, 1e-05f. */
static void float_lit(Buf *o, float v) {
  char num[64];
  if (isinf(v) || isnan(v)) { /* printf's "inf" is no C literal; math.h's macros are (Clip's open bounds) */
    buf_printf(o, "%s", isnan(v) ? "NAN" : v > 0 ? "INFINITY" : "-INFINITY");
    return;
  }
  snprintf(num, sizeof num, "%.9g", v);
  buf_printf(o, "%s%sf", num, strpbrk(num, ".eEni") ? "" : ".0");
}

static void int_list(Buf *o, const int64_t *v, int64_t n) {
  buf_printf(o, "{");
  for (int64_t i = 0; i < n; i++) buf_printf(o, "%s%lld", i ? ", " : "", (long long)v[i]);
  buf_printf(o, "}");
}

/* One argument of a call (or field of a shape constant) as C. */
static void render_arg(Buf *o, const StageProg *sp, const Arg *a, char code) {
  switch (a->kind) {
  case ARG_BUF:
    if (code == 'u') buf_printf(o, "(const uint8_t *)");
    if (code == 'M' || code == 'U') buf_printf(o, "(uint8_t *)");
    buf_expr(o, sp, a->buf);
    break;
  case ARG_NULL: buf_printf(o, "NULL"); break;
  case ARG_INT: buf_printf(o, "%lld", (long long)a->i); break;
  case ARG_FLOAT: float_lit(o, a->f); break;
  case ARG_DOUBLE: buf_printf(o, "%.17g", a->d); break;
  case ARG_CONST: buf_printf(o, "&%s", sp->shapes[a->i].name); break;
  case ARG_SYM: buf_printf(o, "%s", a->sym); break;
  case ARG_INTS: int_list(o, a->ints, a->i); break;
  }
}

/* The C renderer of a call: one statement.  (A CUDA renderer would print a
 * launch of the same kernel with the same arguments.) */
static void render_call(Buf *o, const StageProg *sp, const Call *k) {
  const KernelSig *sig = &KERNELS[k->kernel];
  buf_printf(o, "%s(", sig->name);
  for (int a = 0; a < k->nargs; a++) {
    if (a) buf_printf(o, ", ");
    render_arg(o, sp, &k->args[a], sig->sig[a]);
  }
  buf_printf(o, ");");
}

static void render_shape(Buf *o, const StageProg *sp, const ShapeConst *c) {
  buf_printf(o, "static const %s %s = {", c->type, c->name);
  for (int i = 0; i < c->nfields; i++) {
    if (i) buf_printf(o, ", ");
    render_arg(o, sp, &c->fields[i], 0);
  }
  buf_printf(o, "};\n");
}

/* which: 0 every call, 1 the input-gradient (I) calls, 2 the weight-gradient (W) calls,
 * 3 the forward calls a RECOMPUTE re-runs (a training BatchNorm without its
 * running statistics: the forward already moved them), 4 the eval forward
 * (run.sh --val: a training BatchNorm on its running statistics, which stay
 * as they are, and Dropout keeping everything). */
/* Under --profile, `local` maps a graph node to its row of PROFILE_NODES (else NULL): after the
 * last call of a node (and direction) comes its mark, so glue such as zeroing a gradient is
 * charged to the node after it. */
static int emitted(const StageProg *sp, const Call *k, int i, int which) {
  if (which == 3) return sp->recompute[i];
  if (which == 4) return 1;
  return !(which == 1 || which == 2) || (which == 2) == call_is_weight(sp, k);
}

static void emit_mark(Buf *o, const StageProg *sp, const Call *calls, int n, int which, const int *local, int i) {
  if (!local || which == 3 || calls[i].node < 0 || local[calls[i].node] < 0) return;
  int dir = calls[i].phase == PH_FWD ? 0 : call_is_weight(sp, &calls[i]) ? 2 : 1, j = i + 1;
  while (j < n && !emitted(sp, &calls[j], j, which)) j++;
  if (j < n && calls[j].node == calls[i].node && (calls[j].phase == PH_FWD ? 0 : call_is_weight(sp, &calls[j]) ? 2 : 1) == dir) return;
  buf_printf(o, "  PR_PROF(%d, %s);\n", local[calls[i].node], dir == 0 ? "PR_PROF_FWD" : dir == 1 ? "PR_PROF_BWD_INPUT" : "PR_PROF_BWD_WEIGHT");
}

/* pipecc --progress poll: after the last call of each node, pr_poll() lets MPI move the messages in flight. */
static void emit_poll(Buf *o, const StageProg *sp, const Call *calls, int n, int which, int i) {
  if (which >= 3 || !sp->poll) return;
  int j = i + 1;
  while (j < n && !emitted(sp, &calls[j], j, which)) j++;
  if (j < n && calls[j].node == calls[i].node) return;
  buf_printf(o, "  pr_poll();\n");
}

/* A forward call the eval forward makes otherwise: a training-mode BatchNorm or a Dropout that drops. */
static int eval_differs(const StageProg *sp, const Call *k) {
  return stash_bn_training(sp, k) || (k->kernel == K_DROPOUT && k->args[4].f != 0);
}

/* The eval twin of a training BatchNorm's shape constant (render_eval_shapes defines it). */
static const char *eval_shape_name(const StageProg *sp, const Call *k) {
  static char name[160];
  snprintf(name, sizeof name, "&%s_EVAL", sp->shapes[k->args[6].i].name);
  return name;
}

/* The eval forward's shape constants: each training BatchNorm's, with training = 0. */
static void render_eval_shapes(Buf *o, const StageProg *sp) {
  char *done = calloc((size_t)sp->nshapes + 1, 1);
  if (!done) abort();
  for (int i = 0; i < sp->nfwd; i++) {
    const Call *k = &sp->fwd[i];
    if (!stash_bn_training(sp, k) || done[k->args[6].i]) continue;
    done[k->args[6].i] = 1;
    ShapeConst c = sp->shapes[k->args[6].i];
    Arg f[16];
    memcpy(f, c.fields, sizeof(Arg) * (size_t)c.nfields);
    f[c.nfields - 1].i = 0;
    c.fields = f;
    Buf name = {0};
    buf_printf(&name, "%s_EVAL", c.name);
    c.name = name.s;
    render_shape(o, sp, &c);
    buf_free(&name);
  }
  free(done);
}

static int has_eval_forward(const StageProg *sp) {
  for (int i = 0; i < sp->nfwd; i++)
    if (eval_differs(sp, &sp->fwd[i])) return 1;
  return 0;
}

static void emit_calls_range(Buf *o, const StageProg *sp, const Call *calls, int n, int lo, int hi, int which, const int *local) {
  for (int i = lo; i < hi; i++) {
    if (!emitted(sp, &calls[i], i, which)) continue;
    buf_printf(o, "  /* ");
    put_comment(o, calls[i].comment ? calls[i].comment : "");
    buf_printf(o, " */\n  ");
    if (which == 3 && stash_bn_training(sp, &calls[i])) {
      Call k = calls[i];
      Arg args[16];
      memcpy(args, k.args, sizeof(Arg) * (size_t)k.nargs);
      args[3] = args[4] = (Arg){.kind = ARG_NULL};
      k.args = args;
      render_call(o, sp, &k);
    } else if (which == 4 && eval_differs(sp, &calls[i])) {
      Call k = calls[i];
      Arg args[16];
      memcpy(args, k.args, sizeof(Arg) * (size_t)k.nargs);
      if (k.kernel == K_DROPOUT) args[4] = (Arg){.kind = ARG_FLOAT, .f = 0}; /* ratio 0 keeps every element, unscaled */
      else args[6] = (Arg){.kind = ARG_SYM, .sym = eval_shape_name(sp, &calls[i])};
      k.args = args;
      render_call(o, sp, &k);
    } else {
      render_call(o, sp, &calls[i]);
    }
    buf_printf(o, "\n");
    emit_mark(o, sp, calls, n, which, local, i);
    emit_poll(o, sp, calls, n, which, i);
  }
}

/* A long function is cut into parts of at most PART_CALLS calls, each its own function that clang may
 * not inline back: its optimiser's time grows faster than linearly with a function's size, and one
 * function of a thousand calls (densenet121's forward) was most of a 170 s build.  The parts run in
 * order, so the arithmetic is the same. */
enum { PART_CALLS = 96 };

/* Emits `static void NAME(PARAMS) { ... }` running calls[0..n) (those `which` selects). */
static void emit_fn(Buf *o, const StageProg *sp, const char *name, const char *params, const char *args, const Call *calls, int n,
                    int which, const int *local) {
  char voids[128] = "(void)"; /* "(void)slot, (void)xslot" */
  for (const char *a = args; *a && strlen(voids) + 8 < sizeof voids; a++) {
    size_t l = strlen(voids);
    if (*a == ' ') memcpy(voids + l, " (void)", 8);
    else voids[l] = *a, voids[l + 1] = 0;
  }
  int count = 0;
  for (int i = 0; i < n; i++) count += emitted(sp, &calls[i], i, which);
  const char *start = local && which != 3 ? "  PR_PROF_START();\n" : "";
  if (count <= PART_CALLS) {
    buf_printf(o, "\nstatic void %s(%s) {\n  %s;\n%s", name, params, voids, start);
    emit_calls_range(o, sp, calls, n, 0, n, which, local);
    buf_printf(o, "}\n");
    return;
  }
  int parts = (count + PART_CALLS - 1) / PART_CALLS, lo = 0;
  for (int part = 0; part < parts; part++) {
    int hi = lo, k = 0;
    while (hi < n && (k < PART_CALLS || !emitted(sp, &calls[hi], hi, which)))
      k += emitted(sp, &calls[hi], hi, which), hi++;
    if (part == parts - 1) hi = n;
    buf_printf(o, "\n/* %s, part %d of %d. */\nstatic __attribute__((noinline)) void %s_part%d(%s) {\n  %s;\n", name,
               part + 1, parts, name, part + 1, params, voids);
    emit_calls_range(o, sp, calls, n, lo, hi, which, local);
    buf_printf(o, "}\n");
    lo = hi;
  }
  buf_printf(o, "\nstatic void %s(%s) {\n%s", name, params, start);
  for (int part = 0; part < parts; part++) buf_printf(o, "  %s_part%d(%s);\n", name, part + 1, args);
  buf_printf(o, "}\n");
}

/* A buffer's arena offset in a table: its macro, or -1 for none (or one this rank does not hold). */
static void put_off(Buf *o, const StageProg *sp, int id) {
  if (id < 0 || sp->bufs[id].unused) buf_printf(o, "-1");
  else buf_printf(o, "OFF_%s", sp->bufs[id].name);
}

/* The rank value x comes from (recv) or goes to on its route; -1 for the loader's and the loss's.
 * edge_of: each tensor's edge (-1 for none), so that a stage's table costs O(values), not O(values x edges). */
static int value_peer(const Plan *p, const StageProg *sp, const Crossing *x, int recv, const int *edge_of) {
  int s = sp->stage, q = edge_of[x->tensor];
  if (x->from_loader) return -1;
  if (p->fb) return recv ? p->fb->links.prev[s] : p->fb->links.next[s];
  if (q < 0) return -1;
  int from, to;
  plan_route(p, q, s, &from, &to);
  return recv ? from : to;
}

static void value_table(Buf *o, const Plan *p, const StageProg *sp, const Crossing *xs, int n, const char *name) {
  if (!n) return;
  int recv = !strcmp(name, "RECV"), *peer = malloc(sizeof(int) * (size_t)n), *edge_of = malloc(sizeof(int) * (size_t)(p->g.nt + 1));
  if (!peer || !edge_of) abort();
  for (int t = 0; t < p->g.nt; t++) edge_of[t] = -1;
  for (int q = p->nedges - 1; q >= 0; q--) edge_of[p->edge_tensor[q]] = q; /* the first edge of a tensor, as the scan found */
  for (int i = 0; i < n; i++) peer[i] = value_peer(p, sp, &xs[i], recv, edge_of);
  free(edge_of);
  buf_printf(o, "/* {name, bytes, offset, gradient offset, source, dtype, rank, dims, xring, %s rank, tag: its number among the\n"
                " * values between the two ranks} */\n", recv ? "from" : "to");
  buf_printf(o, "static const PrValue %s[] = {\n", name);
  for (int i = 0; i < n; i++) {
    int tag = 0;
    for (int j = 0; j < i; j++) tag += peer[j] == peer[i];
    const Tensor *t = &p->g.t[xs[i].tensor];
    const Buffer *b = &sp->bufs[xs[i].buf];
    buf_printf(o, "    {\"");
    put_cstring(o, t->name);
    buf_printf(o, "\", %lld, ", (long long)tensor_bytes(t));
    put_off(o, sp, xs[i].buf);
    buf_printf(o, ", ");
    put_off(o, sp, xs[i].gbuf);
    buf_printf(o, ", ");
    buf_printf(o, "%s, %d, %d, {", !xs[i].from_loader ? "PR_FROM_PREV" : t->dtype == DT_FLOAT ? "PR_FROM_IMAGES" : "PR_FROM_TOKENS",
               t->dtype, t->rank);
    for (int d = 0; d < t->rank; d++) buf_printf(o, "%s%lld", d ? ", " : "", (long long)t->dims[d]);
    buf_printf(o, "}, %d, %d, %d},\n", b->kind == BUF_RING && b->fate != FATE_KEEP, peer[i], tag);
  }
  buf_printf(o, "};\n");
  free(peer);
}

/* PipeFB's tables: the stashed values this rank sends or receives each
 * micro-batch, and the weights it sends after the update or receives. */
static void fb_table(Buf *o, const Plan *p, const StageProg *sp, const FbMsg *ms, int n, int weight, int mine_from, const char *name,
                     int *count) {
  const FbPlan *fb = p->fb;
  int s = sp->stage;
  for (int i = 0; i < n; i++) {
    const FbMsg *m = &ms[i];
    if ((mine_from ? m->from : m->to) != s) continue;
    int b = pipefb_buf(sp, m, weight);
    if (!*count) {
      if (weight)
        buf_printf(o, "/* Weights %s (pipefb): {offset, floats, rank, id}. */\nstatic const PrWeight %s[] = {\n",
                   mine_from ? "sent after the update to the forward ranks that read them" : "received from the backward ranks that update them", name);
      else
        buf_printf(o, "/* Stashed values, per micro-batch, %s (pipefb): {name, bytes, offset of ring copy 0, rank, id}. */\n"
                      "static const PrStash %s[] = {\n", mine_from ? "sent to the backward ranks that read them" : "received from the forward ranks", name);
    }
    (*count)++;
    if (weight) {
      buf_printf(o, "    {");
      put_off(o, sp, b);
      buf_printf(o, ", %lld, %d, %d},\n", (long long)(sp->bufs[b].bytes / 4), mine_from ? m->to : m->from, m->id);
    } else {
      buf_printf(o, "    {\"");
      put_cstring(o, m->dloss ? "(the logits' gradient)" : p->g.t[m->tensor].name);
      buf_printf(o, "\", %lld, ", (long long)sp->bufs[b].bytes);
      put_off(o, sp, b);
      buf_printf(o, ", %d, %d},\n", mine_from ? m->to : m->from, m->id);
    }
  }
  if (*count) buf_printf(o, "};\n");
  (void)fb;
}

static void fb_tables(Buf *o, const Plan *p, const StageProg *sp, int *nss, int *nsr, int *nws, int *nwr) {
  const FbPlan *fb = p->fb;
  fb_table(o, p, sp, fb->stash, fb->nstash, 0, 1, "STASH_SEND", nss);
  fb_table(o, p, sp, fb->stash, fb->nstash, 0, 0, "STASH_RECV", nsr);
  fb_table(o, p, sp, fb->w, fb->nw, 1, 1, "WSEND", nws);
  fb_table(o, p, sp, fb->w, fb->nw, 1, 0, "WRECV", nwr);
}

/* How compute nodes [a, e)'s convolutions run, for the profile to say (PR_CONV_* in runtime/profile.h). */
static const char *stage_conv(const Plan *p, int a, int e) {
  for (int k = a; k < e; k++)
    if (ir_is_conv(&p->g.n[p->node[k]])) return p->g.conv_impl == CONV_GEMM ? "PR_CONV_IM2COL" : "PR_CONV_ONEDNN";
  return "PR_CONV_NONE";
}

static void stage_source(const Plan *p, const StageProg *sp, int64_t vocab, Buf *o) {
  const Graph *g = &p->g;
  int s = sp->stage, n = p->opt.nstages, a = p->rbegin[s], e = p->rend[s], role = p->role[s];
  const StageCost *c = &p->part.cost[s];
  buf_printf(o, "/* Generated by pipecc %s from ", PIPECC_VERSION);
  put_comment(o, g->path);
  buf_printf(o, " - do not edit; regenerate instead.\n *\n * Stage %d of %d (MPI rank %d)%s: nodes %d..%d, ", s, n, s,
             role == ROLE_FWD ? ", pipefb forward rank: only their forwards" : role == ROLE_BWD ? ", pipefb backward rank: only their backwards" : "",
             a, e - 1);
  put_comment(o, g->n[p->node[a]].name);
  buf_printf(o, " .. ");
  put_comment(o, g->n[p->node[e - 1]].name);
  buf_printf(o, "\n");
  buf_printf(o, " * Ops:");
  for (int k = a; k < e; k++) buf_printf(o, "%s %s", k > a ? "," : "", g->n[p->node[k]].op);
  buf_printf(o, "\n * Receives:");
  if (!sp->nrecv) buf_printf(o, " nothing");
  for (int i = 0; i < sp->nrecv; i++) {
    buf_printf(o, "%s ", i ? "," : "");
    put_comment(o, g->t[sp->recv[i].tensor].name);
    buf_printf(o, " %s%s", shape_str(&g->t[sp->recv[i].tensor]), sp->recv[i].from_loader ? " (data loader)" : "");
  }
  buf_printf(o, "\n * Sends:");
  if (!sp->nsend) buf_printf(o, " %s", s == n - 1 ? "its logits to the loss" : "nothing");
  for (int i = 0; i < sp->nsend; i++) {
    buf_printf(o, "%s ", i ? "," : "");
    put_comment(o, g->t[sp->send[i].tensor].name);
    buf_printf(o, " %s", shape_str(&g->t[sp->send[i].tensor]));
  }
  buf_printf(o, "\n * Schedule %s, %d micro-batches of %lld; predicted %s forward + %s backward per micro-batch.\n",
             schedule_name(p->opt.schedule), p->opt.microbatches, (long long)p->mb_size, fmt_time(c->fwd), fmt_time(c->bwd));
  buf_printf(o, " * Arena: %lld bytes (weights %lld), %d copies of each value in flight, %d of each gradient.\n */\n",
             (long long)sp->arena_bytes, (long long)sp->weights_bytes, sp->nslots, sp->ngslots);
  buf_printf(o, "#include \"piperun.h\"\n\n");
  buf_printf(o, "enum { STAGE = %d, NSTAGES = %d, MICROBATCHES = %d, MB_SIZE = %lld, BATCH = %lld, NSLOTS = %d, NGSLOTS = %d };\n",
             s, n, p->opt.microbatches, (long long)p->mb_size, (long long)p->batch, sp->nslots, sp->ngslots);
  buf_printf(o, "#define ARENA_BYTES %lldLL\n#define WEIGHTS_BYTES %lldLL\n", (long long)sp->arena_bytes, (long long)sp->weights_bytes);
  buf_printf(o, "enum { THREADS = %d }; /* this rank computes on THREADS threads (pipecc --threads) */\n", p->opt.threads > 1 ? p->opt.threads : 1);
  if (p->sched.core_of)
    buf_printf(o, "/* %d ranks share %d cores: this one runs on core PIN_CORE, beside ranks the plan chose (schedule_pin) */\n"
                  "enum { PIN_CORE = %d, PIN_CORES = %d };\n\n", n, p->sched.cores, p->sched.core_of[s], p->sched.cores);
  else if (p->opt.threads > 1)
    buf_printf(o, "enum { PIN_CORE = 0, PIN_CORES = 0 }; /* a rank of several threads: not pinned */\n\n");
  else
    buf_printf(o, "enum { PIN_CORE = 0, PIN_CORES = 0 }; /* a core per rank: not pinned */\n\n");
  if (p->sched.unroll > 0) {
    buf_printf(o, "/* async: step t computes on the weights of step t - STALENESS (the first STALENESS steps on the\n"
                  " * initial ones) and updates the newest.  The weights region holds the newest; NWVERSIONS older\n"
                  " * copies of it follow (WVERSION_BYTES each, from WVERSION_BASE): version v is copy v %% NWVERSIONS.\n"
                  " * The runtime points pr_weights at the version of each F and B. */\n");
    buf_printf(o, "enum { STALENESS = %d, LOOKAHEAD = %d, NWVERSIONS = %d };\n#define WVERSION_BASE %lldLL\n#define WVERSION_BYTES %lldLL\n\n",
               p->sched.staleness, p->sched.lookahead, sp->nwversions, (long long)sp->wversion_base, (long long)sp->wversion_stride);
  }
  if (sp->nxslots || sp->nstore) {
    buf_printf(o, "/* The memory plan: values that leave between a micro-batch's forward and its backward live in\n"
                  " * NXSLOTS copies of one block (XSLOT_BYTES each, from XSLOT_BASE); an OFFLOAD copies out its first\n"
                  " * XOUT_BYTES.  A peer's offloaded values are held in NSTORE store slots of STORE_BYTES. */\n");
    buf_printf(o, "enum { NXSLOTS = %d, NSTORE = %d };\n#define XSLOT_BASE %lldLL\n#define XSLOT_BYTES %lldLL\n#define XOUT_BYTES %lldLL\n"
                  "#define STORE_BASE %lldLL\n#define STORE_BYTES %lldLL\n\n", sp->nxslots, sp->nstore, (long long)sp->xbase,
               (long long)sp->xstride, (long long)sp->xout, (long long)sp->store_base, (long long)sp->store_stride);
  }
  buf_printf(o, "/* Buffers: arena offset and size of one copy. */\n");
  for (int i = 0; i < sp->nbufs; i++) {
    const Buffer *b = &sp->bufs[i];
    if (b->unused) continue; /* pipefb: the other half of the program */
    buf_printf(o, "#define OFF_%s %lldLL\n#define SIZE_%s %lldLL /* %s */\n", b->name, (long long)b->offset, b->name,
               (long long)b->bytes, buf_what(g, b));
    if (b->kind == BUF_RING && b->fate != FATE_KEEP)
      buf_printf(o, "#define %s(k) ((%s *)(arena + OFF_%s + (int64_t)(k) * XSLOT_BYTES)) /* %s */\n", b->name, ctype(b), b->name,
                 b->fate == FATE_OFFLOAD ? "offloaded between its forward and backward" : "recomputed before its backward");
    else if (b->kind == BUF_RING || b->kind == BUF_GRING)
      buf_printf(o, "#define %s(k) ((%s *)(arena + OFF_%s + (int64_t)(k) * SIZE_%s))\n", b->name, ctype(b), b->name, b->name);
    else if (sp->nwversions && b->offset < sp->weights_bytes && b->kind != BUF_RING && b->kind != BUF_GRING)
      buf_printf(o, "#define %s ((%s *)(pr_weights + OFF_%s)) /* the version this micro-batch's step computes on */\n", b->name,
                 ctype(b), b->name);
    else
      buf_printf(o, "#define %s ((%s *)(arena + OFF_%s))\n", b->name, ctype(b), b->name);
  }
  buf_printf(o, "\nstatic unsigned char arena[ARENA_BYTES] __attribute__((aligned(64)));\n\n");
  for (int i = 0; i < sp->nshapes; i++) render_shape(o, sp, &sp->shapes[i]);
  int *local = NULL;
  if (p->opt.profile) {
    /* run.sh --profile writes each node's time under this key (profile.c reads it back). */
    local = malloc(sizeof(int) * (size_t)(g->nn + 1));
    if (!local) abort();
    for (int j = 0; j < g->nn; j++) local[j] = -1;
    buf_printf(o, "\n/* pipecc --profile: the nodes PR_PROF marks, as \"index op name\" (run.sh --profile FILE). */\n"
                  "static const char *const PROFILE_NODES[] = {\n");
    for (int k = a; k < e; k++) {
      char key[PROFILE_KEY_MAX];
      profile_key(g, p->node[k], key, sizeof key);
      local[p->node[k]] = k - a;
      buf_printf(o, "    \"");
      put_cstring(o, key);
      buf_printf(o, "\",\n");
    }
    buf_printf(o, "};\n");
  }
  if (role != ROLE_BWD) {
    buf_printf(o, "\n/* The forward of the micro-batch in ring slot `slot` (unused by a stage that reads only weights and constants). */");
    emit_fn(o, sp, "forward", "int slot, int xslot", "slot, xslot", sp->fwd, sp->nfwd, 0, local);
  }
  int eval_fwd = role != ROLE_BWD && has_eval_forward(sp);
  if (eval_fwd) {
    buf_printf(o, "\n/* The eval forward (run.sh --val): training-mode BatchNorm normalises with its running statistics and\n"
                  " * leaves them as they are; Dropout keeps every element. */\n");
    render_eval_shapes(o, sp);
    emit_fn(o, sp, "forward_eval", "int slot, int xslot", "slot, xslot", sp->fwd, sp->nfwd, 4, NULL);
  }
  if (sp->recompute) {
    buf_printf(o, "\n/* RECOMPUTE: the forward calls that make the recomputed values again, from what stayed. */");
    emit_fn(o, sp, "recompute", "int slot, int xslot", "slot, xslot", sp->fwd, sp->nfwd, 3, NULL);
  }
  int split = p->opt.schedule == SCHED_ZB1;
  static const char *const fn[] = {"backward", "backward_input", "backward_weight"};
  static const char *const what[] = {"", "/* The input-gradient half (zb1's I): everything but the weight gradients. */\n",
                                     "/* The weight-gradient half (zb1's W), run later for the same slots. */\n"};
  for (int which = 0; role != ROLE_FWD && which <= (split ? 2 : 0); which++) {
    if (*what[which]) buf_printf(o, "\n%.*s", (int)strlen(what[which]) - 1, what[which]);
    emit_fn(o, sp, fn[which], "int slot, int xslot, int gslot", "slot, xslot, gslot", sp->bwd, sp->nbwd, which, local);
  }
  buf_printf(o, "\n");
  free(local);
  if (sp->loss_buf >= 0 && role != ROLE_BWD) {
    int64_t rows = sp->loss_rows * p->opt.microbatches;
    if (p->opt.loss_mse)
      buf_printf(o, "/* Mean squared error against one-hot labels, mean over the %lld x %lld outputs of the whole batch\n"
                    " * (the runtime divides the returned sum by rows x classes). */\n", (long long)rows, (long long)sp->loss_classes);
    else
      buf_printf(o, "/* Softmax cross-entropy, mean over the %lld rows of the whole batch. */\n", (long long)rows);
    buf_printf(o, "static double loss(int slot, const int64_t *labels) {\n  return %s(", p->opt.loss_mse ? "k_mse_onehot" : "k_softmax_xent");
    buf_expr(o, sp, sp->loss_buf);
    buf_printf(o, ", labels, ");
    buf_expr(o, sp, sp->dloss_buf);
    if (p->opt.loss_mse)
      buf_printf(o, ", %lld, %lld, 1.0f / %lld) / %lld;\n}\n\n", (long long)sp->loss_rows, (long long)sp->loss_classes,
                 (long long)(rows * sp->loss_classes), (long long)sp->loss_classes);
    else
      buf_printf(o, ", %lld, %lld, 1.0f / %lld);\n}\n\n", (long long)sp->loss_rows, (long long)sp->loss_classes, (long long)rows);
  }
  int mem = sp->nxslots || sp->nstore;
  int async = p->sched.unroll > 0, nact = async ? p->sched.nbody[s] : p->sched.nact[s];
  const Action *acts = async ? p->sched.body[s] : p->sched.act[s];
  if (async)
    buf_printf(o, "/* The schedule: this stage's actions for step t, run for t = -LOOKAHEAD .. steps-1: {kind, micro-batch,\n"
                  " * slot, gslot, xslot, peer}.  Micro-batch k is the run's micro-batch t * MICROBATCHES + k (k >= MICROBATCHES:\n"
                  " * a later step's), skipped when outside the run: the first steps fill the pipeline, the last drain it.\n"
                  " * Rings are indexed by the run's micro-batch modulo NSLOTS / NGSLOTS (the slots shown are step 0's). */\n"
                  "static const PrAction SCHEDULE[] = {");
  else
    buf_printf(o, "/* The schedule: this stage's actions for one optimizer step, in order: {kind, micro-batch, slot, gslot,\n"
                  " * xslot, peer} (xslot and peer: the memory plan's, -1 when unused). */\n"
                  "static const PrAction SCHEDULE[] = {");
  for (int k = 0; k < nact; k++) {
    const Action *ac = &acts[k];
    buf_printf(o, "%s{PR_%s, %d, %d, %d, %d, %d}", !k ? "\n    " : k % 4 ? ", " : ",\n    ", action_kind_name(ac->kind), ac->mb, ac->slot,
               ac->gslot, ac->xslot, ac->peer);
  }
  buf_printf(o, "\n};\n\n");
  value_table(o, p, sp, sp->recv, sp->nrecv, "RECV");
  value_table(o, p, sp, sp->send, sp->nsend, "SEND");
  int nss = 0, nsr = 0, nws = 0, nwr = 0;
  if (p->fb) fb_tables(o, p, sp, &nss, &nsr, &nws, &nwr);
  for (int i = 0; i < sp->nparams; i++) {
    if (!sp->nparts || !sp->nparts[i]) continue;
    const Buffer *b = &sp->bufs[sp->params[i]];
    buf_printf(o, "/* '");
    put_comment(o, g->t[b->tensor].name);
    buf_printf(o, "' is tied: its gradient is the sum of each reading node's part, in graph order, on every stage\n"
                  " * that holds it; parts computed elsewhere arrive at the update.  {offset, stage that computes it} */\n"
                  "static const PrPart PARTS_%s[] = {", b->name);
    for (int j = 0; j < sp->nparts[i]; j++)
      buf_printf(o, "%s{OFF_%s, %d}", j ? ", " : "", sp->bufs[sp->parts[i][j].buf].name, sp->parts[i][j].stage);
    buf_printf(o, "};\n\n");
  }
  if (sp->nparams) {
    buf_printf(o, "/* {name, floats, offset, gradient, optimizer slots, tied parts, layer: its parameterised layer from 0} */\n"
                  "static const PrParam PARAMS[] = {\n");
    for (int i = 0; i < sp->nparams; i++) {
      const Buffer *b = &sp->bufs[sp->params[i]];
      buf_printf(o, "    {\"");
      put_cstring(o, g->t[b->tensor].name);
      buf_printf(o, "\", %lld, OFF_%s, ", (long long)(b->bytes / 4), b->name);
      put_off(o, sp, sp->pgrad[i]);
      buf_printf(o, ", ");
      put_off(o, sp, sp->opt1[i]);
      buf_printf(o, ", ");
      put_off(o, sp, sp->opt2[i]);
      if (sp->nparts && sp->nparts[i]) buf_printf(o, ", PARTS_%s, %d", b->name, sp->nparts[i]);
      else buf_printf(o, ", NULL, 0");
      buf_printf(o, ", %d},\n", freeze_layer_of(p, b->tensor));
    }
    buf_printf(o, "};\n\n");
  }
  const char *optname = p->opt.optimizer ? p->opt.optimizer : "sgd";
  Pool tp = {0};
  const char *loss_fields = sp->loss_buf >= 0 && role != ROLE_BWD
      ? pool_printf(&tp, "\n    .loss_rows = %lld, .loss_classes = %lld, .labels_offset = OFF_%s, .logits_offset = OFF_%s, .logits_bytes = SIZE_%s,",
                    (long long)sp->loss_rows, (long long)sp->loss_classes, sp->bufs[sp->labels_buf].name, sp->bufs[sp->loss_buf].name,
                    sp->bufs[sp->loss_buf].name)
      : "";
  Buf model = {0}; /* the path, as the body of a C string */
  buf_printf(&model, "%s", ""); /* not NULL for an empty path */
  put_cstring(&model, g->path);
  const char *keys[] = {"MODEL", "NACTIONS", "RECV", "NRECV", "SEND", "NSEND", "PARAMS", "NPARAMS", "LOSS", "LOSS_FIELDS",
                        "OPTIMIZER", "LR", "MOMENTUM", "WEIGHT_DECAY", "VOCAB", "PREDICTED_BYTES", "PREDICTED_STEP",
                        "FORWARD_ONLY", "BACKWARD_INPUT", "BACKWARD_WEIGHT", "MEMORY_FIELDS", "PROFILE_FIELDS", "FORWARD",
                        "BACKWARD", "CHAIN_FIELDS", "ASYNC_FIELDS", "FORWARD_EVAL"};
  const char *memf = "";
  if (mem) {
    int host = p->host_of ? p->host_of[s] : -1, owner = -1;
    for (int q = 0; p->host_of && q < n; q++)
      if (p->host_of[q] == s) owner = q;
    Buf dir = {0};
    buf_printf(&dir, "%s", "");
    if (p->opt.offload_dir) put_cstring(&dir, p->opt.offload_dir);
    memf = pool_printf(&tp, "\n    .nxslots = NXSLOTS, .xslot_base = XSLOT_BASE, .xslot_bytes = XSLOT_BYTES, .xout_bytes = XOUT_BYTES,"
                            "\n    .offload_to = %d, .offload_dir = \"%s\", .nstore = NSTORE, .store_base = STORE_BASE, .store_bytes = STORE_BYTES,"
                            " .store_owner = %d, .recompute = %s,",
                       sp->xout && stash_offloads(p, s) ? host : -2, dir.s, owner, sp->recompute ? "recompute" : "NULL");
    buf_free(&dir);
  }
  const char *vals[] = {
      model.s, pool_printf(&tp, "%d", nact), sp->nrecv ? "RECV" : "NULL", pool_printf(&tp, "%d", sp->nrecv),
      sp->nsend ? "SEND" : "NULL", pool_printf(&tp, "%d", sp->nsend), sp->nparams ? "PARAMS" : "NULL",
      pool_printf(&tp, "%d", sp->nparams), sp->loss_buf >= 0 && role != ROLE_BWD ? "loss" : "NULL", loss_fields,
      !strcmp(optname, "sgd") ? "PR_SGD" : !strcmp(optname, "adam") ? "PR_ADAM" : "PR_ADAMW",
      pool_printf(&tp, "%.9g", p->opt.have_lr ? p->opt.lr : !strcmp(optname, "sgd") ? 0.01 : 0.001),
      pool_printf(&tp, "%.9g", p->opt.momentum), pool_printf(&tp, "%.9g", p->opt.weight_decay),
      pool_printf(&tp, "%lld", (long long)vocab), pool_printf(&tp, "%.0f", c->mem_total),
      pool_printf(&tp, "%.9g", p->sched.step_time), p->opt.forward_only ? "1" : "0", split ? "backward_input" : "NULL",
      split ? "backward_weight" : "NULL", memf,
      p->opt.profile ? pool_printf(&tp, "\n    .prof_nodes = PROFILE_NODES, .nprof = %d, .prof_rate = %.6g, .prof_conv = %s,", e - a,
                                   p->machine.dev[s].flops, stage_conv(p, a, e)) : "",
      role == ROLE_BWD ? "NULL" : "forward", role == ROLE_FWD ? "NULL" : "backward",
      pool_printf(&tp, "\n    .role = %s, .prev_rank = %d, .next_rank = %d, .loss_rank = %d, .nfrozen = %d, .nlayers = %d,%s", role == ROLE_FWD ? "PR_ROLE_FWD" : role == ROLE_BWD ? "PR_ROLE_BWD" : "PR_ROLE_BOTH",
                  p->fb ? p->fb->links.prev[s] : s - 1, p->fb ? p->fb->links.next[s] : s + 1 < n ? s + 1 : -1,
                  p->fb ? p->fb->links.nf - 1 : n - 1, p->nfrozen, p->nlayers,
                  !p->fb ? "" : pool_printf(&tp, "\n    .stash_send = %s, .nstash_send = %d, .stash_recv = %s, .nstash_recv = %d,"
                                                  " .wsend = %s, .nwsend = %d, .wrecv = %s, .nwrecv = %d,",
                                            nss ? "STASH_SEND" : "NULL", nss, nsr ? "STASH_RECV" : "NULL", nsr,
                                            nws ? "WSEND" : "NULL", nws, nwr ? "WRECV" : "NULL", nwr)),
      !async ? "" : pool_printf(&tp, "\n    .staleness = STALENESS, .lookahead = LOOKAHEAD, .nwversions = %s, .wversion_base = %s, .wversion_bytes = %s,",
                                sp->nwversions ? "NWVERSIONS" : "0", sp->nwversions ? "WVERSION_BASE" : "0", sp->nwversions ? "WVERSION_BYTES" : "0"),
      eval_fwd ? "forward_eval" : "NULL"};
  tmpl_fill(o, TMPL_STAGE_MAIN, keys, vals, (int)(sizeof keys / sizeof keys[0]));
  pool_free(&tp);
  buf_free(&model);
}

/* s as one word of a bash script: single-quoted, each ' as '\''. */
static void shell_word(Buf *o, const char *s) {
  buf_printf(o, "'");
  for (; *s; s++)
    if (*s == '\'') buf_printf(o, "'\\''");
    else buf_printf(o, "%c", *s);
  buf_printf(o, "'");
}

/* Path of `to` relative to directory `from` (both made absolute). */
static void relpath(const char *from, const char *to, char *out, size_t len) {
  char a[PATH_MAX], b[PATH_MAX];
  if (!realpath(from, a) || !realpath(to, b)) {
    size_t k = strlen(to) < len - 1 ? strlen(to) : len - 1;
    memcpy(out, to, k);
    out[k] = 0;
    return;
  }
  size_t i = 0, common = 0;
  while (a[i] && a[i] == b[i]) {
    if (a[i] == '/') common = i;
    i++;
  }
  if (!a[i] && (b[i] == '/' || !b[i])) common = i;
  else if (!b[i] && a[i] == '/') common = i;
  out[0] = 0;
  for (const char *p = a + common; *p; p++)
    if (*p == '/') strncat(out, "../", len - strlen(out) - 1);
  const char *rest = b + common + (b[common] == '/');
  strncat(out, *rest ? rest : ".", len - strlen(out) - 1);
}

static const char *runtime_dir(char *buf, size_t len) {
  const char *env = getenv("PIPECC_RUNTIME");
  if (env && *env) return env;
  char exe[PATH_MAX - 16];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return "runtime";
  exe[n] = 0;
  char *slash = strrchr(exe, '/');
  if (slash) *slash = 0;
  snprintf(buf, len, "%s/../runtime", exe);
  return buf;
}

void emit_stage(const Plan *p, const StageProg *progs, int s, Buf *o) {
  stage_source(p, &progs[s], progs[p->opt.nstages - 1].loss_classes, o);
}

int emit_all(Plan *p, StageProg *progs, OutDir *d) {
  int n = p->opt.nstages;
  for (int s = 0; s < n; s++) {
    Buf src = {0};
    emit_stage(p, progs, s, &src);
    char name[64];
    snprintf(name, sizeof name, "stage_%d.c", s);
    int rc = outdir_write(d, name, src.s, src.len);
    buf_free(&src);
    if (rc) return -1;
    /* Weights: the stage's parameters, in order, as raw float32. */
    char *w = calloc(1, (size_t)progs[s].weights_bytes + 1);
    for (int i = 0; i < progs[s].nbufs; i++) {
      const Buffer *b = &progs[s].bufs[i];
      if (b->kind == BUF_PARAM) memcpy(w + b->offset, p->g.t[b->tensor].data, (size_t)b->bytes);
    }
    snprintf(name, sizeof name, "weights/stage_%d.bin", s);
    rc = outdir_write(d, name, w, (size_t)progs[s].weights_bytes);
    free(w);
    if (rc) return -1;
  }
  /* Which stage holds which initializer, for --save. */
  Buf man = {0};
  char *strip = calloc((size_t)p->g.nt + 1, 1); /* the initializers weights/ holds: model.onnx keeps no copy */
  if (!strip) abort();
  buf_printf(&man, "# stage byte_offset float_count initializer (%%XX for a space, '%%', or a byte outside ASCII 0x21..0x7e)\n");
  for (int s = 0; s < n; s++)
    for (int i = 0; i < progs[s].nbufs; i++) {
      const Buffer *b = &progs[s].bufs[i];
      const Tensor *t = b->tensor >= 0 ? &p->g.t[b->tensor] : NULL;
      /* Trained weights and float state that is an initializer (running statistics). */
      if (b->kind == BUF_PARAM && t->is_initializer && t->dtype == DT_FLOAT && p->role[s] != ROLE_BWD)
      {
        buf_printf(&man, "%d %lld %lld ", s, (long long)b->offset, (long long)(b->bytes / 4));
        strip[b->tensor] = 1;
        for (const unsigned char *c = (const unsigned char *)t->name; *c; c++)
          buf_printf(&man, *c <= 0x20 || *c >= 0x7f || *c == '%' ? "%%%02X" : "%c", *c);
        buf_printf(&man, "\n");
      }
    }
  int rc0 = outdir_write(d, "weights/manifest.txt", man.s, man.len);
  buf_free(&man);
  if (rc0) return free(strip), -1;
  /* model.onnx: the graph --save writes the trained model from (with --untie's copies, so that it
   * writes each one back), without the data of what weights/ holds: the weights are on disk once. */
  uint8_t *bytes;
  size_t blen;
  int prc = onnx_pack_model(&p->g, strip, &bytes, &blen);
  free(strip);
  if (prc) return -1;
  int wrc = outdir_write(d, "model.onnx", (const char *)bytes, blen);
  free(bytes);
  if (wrc) return -1;
  char rbuf[PATH_MAX + 16], rel[PATH_MAX];
  const char *rt = runtime_dir(rbuf, sizeof rbuf);
  /* The final directory does not exist yet: resolve against its parent. */
  char parent[sizeof d->final];
  memcpy(parent, d->final, sizeof parent);
  char *slash = strrchr(parent, '/');
  if (slash) *slash = 0;
  else strcpy(parent, ".");
  relpath(parent, rt, rel, sizeof rel);
  /* make passes PIPERUN to the shell unquoted (and '%' is its pattern
   * character): a space or a shell character in the path from the output to
   * the runtime would split it or run as a command.  The Makefile names no
   * other path outside DIR, so DIR's own path may hold anything. */
  for (const unsigned char *c = (const unsigned char *)rel; *c; c++)
    if (!(isalnum(*c) || strchr("/._+-", *c) || *c >= 0x80))
      return err_set("-o %s: the generated Makefile reaches pipecc's runtime by the path %s, and '%c' in it would "
                     "break make's commands; install pipecc (or set PIPECC_RUNTIME) where the path has no spaces or "
                     "shell characters", d->final, rel, *c);
  /* The model's path goes into comments of run.sh and the Makefile: one line, escaped. */
  Buf model = {0};
  put_comment(&model, p->g.path);
  Buf stages = {0}, mpmd = {0};
  for (int s = 0; s < n; s++) {
    buf_printf(&stages, " stage_%d", s);
    buf_printf(&mpmd, " %s-n 1 \"$here/stage_%d\" ${prog[@]+\"${prog[@]}\"}", s ? ": " : "", s);
  }
  char nst[16];
  snprintf(nst, sizeof nst, "%d", n);
  /* For a freeze event's re-plan: this pipecc, the directory it ran in (both relative to DIR, so
   * that the directory can move with its tree) and its flags, each as one shell word. */
  Buf bin = {0}, args = {0}, cwd = {0};
  char exe[PATH_MAX], here[PATH_MAX], r1[PATH_MAX], r2[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[len > 0 ? len : 0] = 0;
  relpath(parent, len > 0 ? exe : "pipecc", r1, sizeof r1);
  relpath(parent, getcwd(here, sizeof here) ? here : ".", r2, sizeof r2);
  shell_word(&bin, r1), shell_word(&cwd, r2);
  buf_printf(&args, "%s", "");
  for (int i = 0; i < p->opt.nargs; i++) {
    if (i) buf_printf(&args, " ");
    shell_word(&args, p->opt.args[i]);
  }
  const char *keys[] = {"NSTAGES", "MODEL", "RUNTIME", "STAGE_LIST", "MPMD", "PIPECC_BIN", "PIPECC_ARGS", "PLAN_CWD", "THREADS"};
  char threads[16];
  snprintf(threads, sizeof threads, "%d", p->opt.threads > 1 ? p->opt.threads : 1);
  const char *vals[] = {nst, model.s, rel, stages.s, mpmd.s, bin.s, args.s, cwd.s, threads};
  Buf mk = {0}, sh = {0};
  tmpl_fill(&mk, TMPL_MAKEFILE, keys, vals, 9);
  tmpl_fill(&sh, TMPL_RUN_SH, keys, vals, 9);
  int rc = outdir_write(d, "Makefile", mk.s, mk.len) || outdir_write(d, "run.sh", sh.s, sh.len) ? -1 : 0;
  buf_free(&mk), buf_free(&sh), buf_free(&stages), buf_free(&mpmd), buf_free(&model), buf_free(&bin), buf_free(&args), buf_free(&cwd);
  if (rc) return -1;
  return outdir_chmod(d, "run.sh", 0755);
}
