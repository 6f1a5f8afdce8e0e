/* render_c.c - the C renderer: a StageSpec as stage_<k>.c for the CPU.
 *
 * The file is meant to be read: a header comment says what the stage holds,
 * buffers are named constants (offset, size), each op is one call, and the
 * schedule is a table.  Everything printed comes from the spec. */
#include <stdlib.h>
#include <string.h>

#include "ctext.h"
#include "render.h"
#include "templates.h"

/* The C expression for buffer id inside a function: its macro, with the copy it uses. */
static void buf_expr(Buf *o, const StageSpec *s, int id) {
  const SpecBuffer *b = &s->bufs[id];
  static const char *const copy[] = {[VIEW_SLOT] = "(slot)", [VIEW_GSLOT] = "(gslot)", [VIEW_XSLOT] = "(xslot)", [VIEW_WSLOT] = "(wslot)"};
  buf_printf(o, "%s%s", b->name, b->view == VIEW_PLAIN || b->view == VIEW_WEIGHTS ? "" : copy[b->view]);
}

static void int_list(Buf *o, const int64_t *v, int64_t n) {
  buf_printf(o, "{");
  for (int64_t i = 0; i < n; i++) buf_printf(o, "%s%lld", i ? ", " : "", (long long)v[i]);
  buf_printf(o, "}");
}

/* One argument of a call (or field of a shape constant) as C. */
static void render_arg(Buf *o, const StageSpec *s, const Arg *a, char code) {
  switch (a->kind) {
  case ARG_BUF:
    if (code == 'u') buf_printf(o, "(const uint8_t *)");
    if (code == 'M' || code == 'U') buf_printf(o, "(uint8_t *)");
    buf_expr(o, s, a->buf);
    break;
  case ARG_NULL: buf_printf(o, "NULL"); break;
  case ARG_INT: buf_printf(o, "%lld", (long long)a->i); break;
  case ARG_FLOAT: put_float(o, a->f); break;
  case ARG_DOUBLE: buf_printf(o, "%.17g", a->d); break;
  case ARG_CONST: buf_printf(o, "&%s", s->prog->shapes[a->i].name); break;
  case ARG_SYM: buf_printf(o, "%s", a->sym); break;
  case ARG_STR:
    buf_printf(o, "\"");
    put_cstring(o, a->sym);
    buf_printf(o, "\"");
    break;
  case ARG_INTS: int_list(o, a->ints, a->i); break;
  }
}

/* The dialect being printed (render_c_stage sets it for the stage's whole rendering). */
static const CDialect *D;

/* A call: one statement. */
static void render_call(Buf *o, const StageSpec *s, const Call *k) {
  const KernelSig *sig = &KERNELS[k->kernel];
  buf_printf(o, "%s%s(", D->kernel_prefix, sig->name + 2);
  for (int a = 0; a < k->nargs; a++) {
    if (a) buf_printf(o, ", ");
    render_arg(o, s, &k->args[a], sig->sig[a]);
  }
  buf_printf(o, ");");
}

static void render_shapes(Buf *o, const StageSpec *s) {
  for (int i = 0; i < s->prog->nshapes; i++) {
    const ShapeConst *c = &s->prog->shapes[i];
    if (!s->shape_used[i]) continue;
    buf_printf(o, "static const %s %s = {", c->type, c->name);
    for (int f = 0; f < c->nfields; f++) {
      if (f) buf_printf(o, ", ");
      render_arg(o, s, &c->fields[f], 0);
    }
    buf_printf(o, "};\n");
  }
}

static void render_calls(Buf *o, const StageSpec *s, const SpecCall *calls, int lo, int hi) {
  static const char *const dirs[] = {"PR_PROF_FWD", "PR_PROF_BWD_INPUT", "PR_PROF_BWD_WEIGHT"};
  for (int i = lo; i < hi; i++) {
    const SpecCall *c = &calls[i];
    buf_printf(o, "  /* ");
    put_comment(o, c->call->comment ? c->call->comment : "");
    buf_printf(o, " */\n  ");
    render_call(o, s, c->call);
    buf_printf(o, "\n");
    if (c->mark >= 0) buf_printf(o, "  PR_PROF(%d, %s);\n", c->mark, dirs[c->mark_dir]);
    if (c->poll) buf_printf(o, "  pr_poll();\n");
  }
}

/* A long function is cut into parts of at most PART_CALLS calls, each its own function that clang may
 * not inline back: its optimiser's time grows faster than linearly with a function's size, and one
 * function of a thousand calls (densenet121's forward) was most of a 170 s build.  The parts run in
 * order, so the arithmetic is the same. */
enum { PART_CALLS = 96 };

static void render_fn(Buf *o, const StageSpec *s, const SpecFn *f) {
  /* Every forward and backward takes each ring's copy: under zb1 and zbv the forward writes the late
   * values that I and W read through wslot (memplan.c), and the gradient slot is -1 where unused. */
  static const char *const params_of[] = {"int slot, int xslot, int gslot, int wslot", "int slot, int xslot, int gslot, int wslot", "void"};
  static const char *const args_of[] = {"slot, xslot, gslot, wslot", "slot, xslot, gslot, wslot", ""};
  static const char *const voids_of[] = {"  (void)slot, (void)xslot, (void)gslot, (void)wslot;\n", "  (void)slot, (void)xslot, (void)gslot, (void)wslot;\n", ""};
  const char *params = params_of[f->args], *args = args_of[f->args], *voids = voids_of[f->args];
  const char *start = f->profiled ? "  PR_PROF_START();\n" : "";
  if (*f->doc) buf_printf(o, "\n/* %s */", f->doc);
  if (f->ncalls <= PART_CALLS) {
    buf_printf(o, "\nstatic void %s(%s) {\n%s%s", f->name, params, voids, start);
    render_calls(o, s, f->calls, 0, f->ncalls);
    buf_printf(o, "}\n");
    return;
  }
  int parts = (f->ncalls + PART_CALLS - 1) / PART_CALLS;
  for (int part = 0; part < parts; part++) {
    int lo = part * PART_CALLS, hi = part == parts - 1 ? f->ncalls : lo + PART_CALLS;
    buf_printf(o, "\n/* %s, part %d of %d. */\nstatic __attribute__((noinline)) void %s_part%d(%s) {\n%s", f->name, part + 1,
               parts, f->name, part + 1, params, voids);
    render_calls(o, s, f->calls, lo, hi);
    buf_printf(o, "}\n");
  }
  buf_printf(o, "\nstatic void %s(%s) {\n%s", f->name, params, start);
  for (int part = 0; part < parts; part++) buf_printf(o, "  %s_part%d(%s);\n", f->name, part + 1, args);
  buf_printf(o, "}\n");
}

/* A buffer's arena offset in a table: its macro, or -1 for none (or one this rank does not hold). */
static void put_off(Buf *o, const StageSpec *s, int id) {
  if (id < 0 || !s->bufs[id].name) buf_printf(o, "-1");
  else buf_printf(o, "OFF_%s", s->bufs[id].name);
}

/* The header's first lines: the stage, or a rank of chunks and each chunk's stage. */
static void render_what(Buf *o, const StageSpec *s) {
  static const char *const role[] = {"", ", pipefb forward rank: only their forwards", ", pipefb backward rank: only their backwards"};
  if (s->nchunks) {
    buf_printf(o, "Rank %d of %d (MPI rank %d), %d chunks, each a stage of its own:", s->stage, s->nstages, s->stage, s->nchunks);
    for (int c = 0; c < s->nchunks; c++) {
      buf_printf(o, "\n *   ");
      put_comment(o, s->chunk_line[c]);
    }
    return;
  }
  buf_printf(o, "Stage %d of %d (MPI rank %d)%s: nodes %d..%d, ", s->stage, s->nstages, s->stage, role[s->role], s->node_lo, s->node_hi);
  put_comment(o, s->first_node);
  buf_printf(o, " .. ");
  put_comment(o, s->last_node);
}

static void render_header(Buf *o, const StageSpec *s) {
  buf_printf(o, "/* Generated by pipecc %s from ", s->version);
  put_comment(o, s->model);
  buf_printf(o, " - do not edit; regenerate instead.\n *\n * ");
  render_what(o, s);
  buf_printf(o, "\n * Ops:");
  for (int i = 0; i < s->nops; i++) buf_printf(o, "%s %s", i ? "," : "", s->ops[i]);
  buf_printf(o, "\n * Receives:");
  if (!s->nrecv) buf_printf(o, " nothing");
  for (int i = 0; i < s->nrecv; i++) {
    buf_printf(o, "%s ", i ? "," : "");
    put_comment(o, s->recv[i].name);
    buf_printf(o, " %s%s", s->recv[i].shape, s->recv[i].source != SRC_PREV ? " (data loader)" : "");
  }
  buf_printf(o, "\n * Sends:");
  if (!s->nsend) buf_printf(o, " %s", s->last_stage ? "its logits to the loss" : "nothing");
  for (int i = 0; i < s->nsend; i++) {
    buf_printf(o, "%s ", i ? "," : "");
    put_comment(o, s->send[i].name);
    buf_printf(o, " %s", s->send[i].shape);
  }
  buf_printf(o, "\n * Schedule %s, %d micro-batches of %lld; predicted %s forward + %s backward per micro-batch.\n", s->schedule_name,
             s->microbatches, (long long)s->mb_size, s->fwd_time, s->bwd_time);
  buf_printf(o, " * Arena: %lld bytes (weights %lld), %d copies of each value in flight, %d of each gradient.\n */\n",
             (long long)s->arena_bytes, (long long)s->weights_bytes, s->nslots, s->ngslots);
}

/* --replicas: the region summed over the replicas and its buckets. */
static void render_replicas(Buf *o, const StageSpec *s) {
  buf_printf(o, "/* --replicas: REPLICAS copies of this stage run side by side, each on BATCH / MICROBATCHES x REPLICAS of\n"
                " * the batch.  Before the update, the weight gradients [GRAD_LO, GRAD_HI) are summed over them in replica\n"
                " * order: cut into REPLICAS shards, each summed by its owner, the other replicas' copies of this rank's\n"
                " * shard landing from REDUCE_BASE.  A bucket's exchange starts in the step's last backward, at the\n"
                " * k_grad_ready call after the last call that writes its gradients. */\n");
  if (s->zero)
    buf_printf(o, "/* --zero 1: this replica keeps the optimizer state of its shard of the region only (ZERO_M1, ZERO_M2: SHARD_FLOATS\n"
                  " * each), updates the weights' elements there, and the new weights travel in the gradients' places. */\n");
  buf_printf(o, "enum { REPLICAS = %d, NBUCKETS = %d };\n#define GRAD_LO %lldLL\n#define GRAD_HI %lldLL\n#define REDUCE_BASE %lldLL\n"
                "#define SHARD_FLOATS %lldLL\n\n", s->replicas, s->nbuckets, (long long)s->grad_lo, (long long)s->grad_hi,
             (long long)s->reduce_base, (long long)s->shard_floats);
  if (!s->nbuckets) return;
  buf_printf(o, "/* The buckets, in the order the backward finishes them: {first byte, end byte} of the arena. */\n"
                "static const PrBucket BUCKETS[NBUCKETS] = {\n");
  for (int b = 0; b < s->nbuckets; b++)
    buf_printf(o, "    {%lldLL, %lldLL},\n", (long long)s->buckets[b].lo, (long long)s->buckets[b].hi);
  buf_printf(o, "};\n\n");
}

static void render_constants(Buf *o, const StageSpec *s) {
  buf_printf(o, "#include \"piperun.h\"\n%s\n", D->includes);
  buf_printf(o, "enum { STAGE = %d, NSTAGES = %d, MICROBATCHES = %d, MB_SIZE = %lld, BATCH = %lld, NSLOTS = %d, NGSLOTS = %d };\n",
             s->stage, s->nstages, s->microbatches, (long long)s->mb_size, (long long)s->batch, s->nslots, s->ngslots);
  buf_printf(o, "#define ARENA_BYTES %lldLL\n#define WEIGHTS_BYTES %lldLL\n", (long long)s->arena_bytes, (long long)s->weights_bytes);
  buf_printf(o, "enum { THREADS = %d }; /* this rank computes on THREADS threads (pipecc --threads) */\n", s->threads);
  if (s->shared_cores)
    buf_printf(o, "/* %d ranks share %d cores: this one runs on core PIN_CORE, beside ranks the plan chose (schedule_pin) */\n"
                  "enum { PIN_CORE = %d, PIN_CORES = %d };\n\n", s->nstages, s->shared_cores, s->pin_core, s->pin_cores);
  else if (s->threads > 1)
    buf_printf(o, "enum { PIN_CORE = 0, PIN_CORES = 0 }; /* a rank of several threads: not pinned */\n\n");
  else
    buf_printf(o, "enum { PIN_CORE = 0, PIN_CORES = 0 }; /* a core per rank: not pinned */\n\n");
  if (s->async) {
    buf_printf(o, "/* async: step t computes on the weights of step t - STALENESS (the first STALENESS steps on the\n"
                  " * initial ones) and updates the newest.  The weights region holds the newest; NWVERSIONS older\n"
                  " * copies of it follow (WVERSION_BYTES each, from WVERSION_BASE): version v is copy v %% NWVERSIONS.\n"
                  " * The runtime points pr_weights at the version of each F and B. */\n");
    buf_printf(o, "enum { STALENESS = %d, LOOKAHEAD = %d, NWVERSIONS = %d };\n#define WVERSION_BASE %lldLL\n#define WVERSION_BYTES %lldLL\n\n",
               s->staleness, s->lookahead, s->nwversions, (long long)s->wversion_base, (long long)s->wversion_stride);
  }
  if (s->memory_plan) {
    buf_printf(o, "/* The memory plan: values that leave between a micro-batch's forward and its backward live in\n"
                  " * NXSLOTS copies of one block (XSLOT_BYTES each, from XSLOT_BASE); an OFFLOAD copies out its first\n"
                  " * XOUT_BYTES.  A peer's offloaded values are held in NSTORE store slots of STORE_BYTES. */\n");
    buf_printf(o, "enum { NXSLOTS = %d, NSTORE = %d };\n#define XSLOT_BASE %lldLL\n#define XSLOT_BYTES %lldLL\n#define XOUT_BYTES %lldLL\n"
                  "#define STORE_BASE %lldLL\n#define STORE_BYTES %lldLL\n\n", s->nxslots, s->nstore, (long long)s->xbase,
               (long long)s->xstride, (long long)s->xout, (long long)s->store_base, (long long)s->store_stride);
  }
  if (s->opt_store_bytes) {
    buf_printf(o, "/* --offload-optimizer: the optimizer state%s lives in a file of OPT_STORE_BYTES in %s (each one's OFF_\n"
                  " * is its place there), not in the arena.  The update streams each weight's through two staging blocks\n"
                  " * of OPT_BLOCK floats per part (OPT_STAGING, in the temporaries' region): block b + 1 is read and b - 1\n"
                  " * written back while b is updated.%s */\n", s->grad_out ? " and the gradients" : "", *s->opt_dir ? s->opt_dir : ".",
               s->grad_out ? "\n * Each backward brings a gradient into GRAD_STAGING_0 or _1 before the call that adds into it\n"
                             " * (the next one's is read meanwhile) and writes it back after (k_grad_fetch, k_grad_put)." : "");
    buf_printf(o, "#define OPT_STORE_BYTES %lldLL\nenum { OPT_BLOCK = %lld };\n\n", (long long)s->opt_store_bytes, (long long)s->opt_block);
  }
  if (s->replicas > 1) render_replicas(o, s);
}

static void render_buffers(Buf *o, const StageSpec *s) {
  buf_printf(o, "/* Buffers: arena offset and size of one copy. */\n");
  for (int i = 0; i < s->nbufs; i++) {
    const SpecBuffer *b = &s->bufs[i];
    const char *ct = b->is_int64 ? "int64_t" : "float";
    if (!b->name) continue;
    if (b->view != VIEW_STORE)
      buf_printf(o, "#define OFF_%s %lldLL\n#define SIZE_%s %lldLL /* %s */\n", b->name, (long long)b->offset, b->name, (long long)b->bytes,
                 b->what);
    if (b->view == VIEW_STORE) {
      buf_printf(o, "#define OFF_%s %lldLL /* its place in the optimizer state's file (not the arena) */\n", b->name,
                 (long long)b->offset);
      continue;
    }
    if (b->view == VIEW_XSLOT)
      buf_printf(o, "#define %s(k) ((%s *)(arena + OFF_%s + (int64_t)(k) * XSLOT_BYTES)) /* %s */\n", b->name, ct, b->name, b->leaves);
    else if (b->view == VIEW_SLOT || b->view == VIEW_GSLOT || b->view == VIEW_WSLOT)
      buf_printf(o, "#define %s(k) ((%s *)(arena + OFF_%s + (int64_t)(k) * SIZE_%s))\n", b->name, ct, b->name, b->name);
    else if (b->view == VIEW_WEIGHTS)
      buf_printf(o, "#define %s ((%s *)(pr_weights + OFF_%s)) /* the version this micro-batch's step computes on */\n", b->name, ct, b->name);
    else
      buf_printf(o, "#define %s ((%s *)(arena + OFF_%s))\n", b->name, ct, b->name);
  }
  buf_printf(o, "\n%s\n", D->arena);
}

static void render_profile_nodes(Buf *o, const StageSpec *s) {
  buf_printf(o, "\n/* pipecc --profile: the nodes PR_PROF marks, as \"index op name\" (run.sh --profile FILE). */\n"
                "static const char *const PROFILE_NODES[] = {\n");
  for (int i = 0; i < s->nprof; i++) {
    buf_printf(o, "    \"");
    put_cstring(o, s->prof_nodes[i]);
    buf_printf(o, "\",\n");
  }
  buf_printf(o, "};\n");
}

static void render_loss(Buf *o, const StageSpec *s) {
  /* The loss's comment is pipecc's own text (numbers, no model names), several lines as it wrote them. */
  buf_printf(o, "/* %s */\nstatic double loss(int slot, const int64_t *labels) {\n  return ", s->loss->comment);
  render_call(o, s, s->loss);
  buf_printf(o, "\n}\n\n");
}

static void render_schedule(Buf *o, const StageSpec *s) {
  if (s->async)
    buf_printf(o, "/* The schedule: this stage's actions for step t, run for t = -LOOKAHEAD .. steps-1: {kind, micro-batch,\n"
                  " * slot, gslot, wslot, xslot, peer, chunk}.  Micro-batch k is the run's micro-batch t * MICROBATCHES + k (k >= MICROBATCHES:\n"
                  " * a later step's), skipped when outside the run: the first steps fill the pipeline, the last drain it.\n"
                  " * Rings are indexed by the run's micro-batch modulo NSLOTS / NGSLOTS (the slots shown are step 0's). */\n"
                  "static const PrAction SCHEDULE[] = {");
  else if (s->nchunks)
    buf_printf(o, "/* The schedule: this rank's actions for one optimizer step, in order: {kind, micro-batch, slot, gslot,\n"
                  " * wslot, xslot, peer, chunk}; a slot is one of its chunk's ring copies (wslot: zbv's late values; xslot\n"
                  " * and peer: -1, unused). */\n"
                  "static const PrAction SCHEDULE[] = {");
  else
    buf_printf(o, "/* The schedule: this stage's actions for one optimizer step, in order: {kind, micro-batch, slot, gslot,\n"
                  " * wslot, xslot, peer, chunk} (wslot: zb1's late values, what W reads of the forward; xslot and peer: the\n"
                  " * memory plan's; -1 when unused; chunk 0: a rank runs one stage). */\n"
                  "static const PrAction SCHEDULE[] = {");
  for (int k = 0; k < s->nactions; k++) {
    const Action *ac = &s->actions[k];
    buf_printf(o, "%s{PR_%s, %d, %d, %d, %d, %d, %d", !k ? "\n    " : k % 4 ? ", " : ",\n    ", action_kind_name(ac->kind), ac->mb,
               ac->slot, ac->gslot, ac->wslot, ac->xslot, ac->peer);
    buf_printf(o, ", %d}", ac->chunk);
  }
  buf_printf(o, "\n};\n\n");
}

/* The RECV (recv = 1) or SEND table. */
static void value_table(Buf *o, const StageSpec *s, const SpecValue *v, int n, int recv, const char *name) {
  static const char *const src[] = {"PR_FROM_PREV", "PR_FROM_IMAGES", "PR_FROM_TOKENS"};
  if (!n) return;
  buf_printf(o, "/* {name, bytes, offset, gradient offset, source, dtype, rank, dims, xring, %s rank, tag: its number among the\n"
                " * values between the two ranks, chunk: the one that %s it%s} */\n", recv ? "from" : "to", recv ? "receives" : "sends",
             s->nchunks ? "; its own rank: a local copy, not a message" : "");
  buf_printf(o, "static const PrValue %s[] = {\n", name);
  for (int i = 0; i < n; i++) {
    buf_printf(o, "    {\"");
    put_cstring(o, v[i].name);
    buf_printf(o, "\", %lld, ", (long long)v[i].bytes);
    put_off(o, s, v[i].buf);
    buf_printf(o, ", ");
    put_off(o, s, v[i].gbuf);
    buf_printf(o, ", %s, %d, %d, {", src[v[i].source], v[i].dtype, v[i].rank);
    for (int d = 0; d < v[i].rank; d++) buf_printf(o, "%s%lld", d ? ", " : "", (long long)v[i].dims[d]);
    buf_printf(o, "}, %d, %d, %d", v[i].xring, v[i].peer, v[i].tag);
    buf_printf(o, ", %d},\n", v[i].chunk);
  }
  buf_printf(o, "};\n");
}

/* PipeFB's tables: the stashed values this rank sends or receives each micro-batch, and the weights it
 * sends after the update or receives. */
static void fb_table(Buf *o, const StageSpec *s, const SpecFbMsg *m, int n, int weight, int sent, const char *name) {
  if (!n) return;
  if (weight)
    buf_printf(o, "/* Weights %s (pipefb): {offset, floats, rank, id}. */\nstatic const PrWeight %s[] = {\n",
               sent ? "sent after the update to the forward ranks that read them" : "received from the backward ranks that update them", name);
  else
    buf_printf(o, "/* Stashed values, per micro-batch, %s (pipefb): {name, bytes, offset of ring copy 0, rank, id}. */\n"
                  "static const PrStash %s[] = {\n", sent ? "sent to the backward ranks that read them" : "received from the forward ranks", name);
  for (int i = 0; i < n; i++) {
    buf_printf(o, "    {");
    if (weight) {
      put_off(o, s, m[i].buf);
      buf_printf(o, ", %lld, %d, %d},\n", (long long)(m[i].bytes / 4), m[i].peer, m[i].id);
    } else {
      buf_printf(o, "\"");
      put_cstring(o, m[i].name);
      buf_printf(o, "\", %lld, ", (long long)m[i].bytes);
      put_off(o, s, m[i].buf);
      buf_printf(o, ", %d, %d},\n", m[i].peer, m[i].id);
    }
  }
  buf_printf(o, "};\n");
}

static void render_params(Buf *o, const StageSpec *s) {
  for (int i = 0; i < s->nparams; i++) {
    const SpecParam *q = &s->params[i];
    if (!q->nparts) continue;
    buf_printf(o, "/* '");
    put_comment(o, q->name);
    buf_printf(o, "' is tied: its gradient is the sum of each reading node's part, in graph order, on every stage\n"
                  " * that holds it; parts computed elsewhere arrive at the update.  {offset, stage that computes it} */\n"
                  "static const PrPart PARTS_%s[] = {", s->bufs[q->buf].name);
    for (int j = 0; j < q->nparts; j++) buf_printf(o, "%s{OFF_%s, %d}", j ? ", " : "", s->bufs[q->parts[j].buf].name, q->parts[j].stage);
    buf_printf(o, "};\n\n");
  }
  if (!s->nparams) return;
  buf_printf(o, "/* {name, floats, offset, gradient, optimizer slots, tied parts, layer: its parameterised layer from 0, gradient in\n"
                " * the file (--offload-optimizer: then the gradient's offset is its place there)} */\n"
                "static const PrParam PARAMS[] = {\n");
  for (int i = 0; i < s->nparams; i++) {
    const SpecParam *q = &s->params[i];
    buf_printf(o, "    {\"");
    put_cstring(o, q->name);
    buf_printf(o, "\", %lld, OFF_%s, ", (long long)q->floats, s->bufs[q->buf].name);
    put_off(o, s, q->gbuf);
    buf_printf(o, ", ");
    put_off(o, s, q->m1);
    buf_printf(o, ", ");
    put_off(o, s, q->m2);
    if (q->nparts) buf_printf(o, ", PARTS_%s, %d", s->bufs[q->buf].name, q->nparts);
    else buf_printf(o, ", NULL, 0");
    buf_printf(o, ", %d, %d},%s\n", q->layer, q->grad_in_file, q->grad_in_file ? " /* its gradient in the file */" : "");
  }
  buf_printf(o, "};\n\n");
}

/* A rank of chunks: each chunk's stage, functions, values (its rows of RECV and SEND) and whether the loss
 * follows its forward. */
static void render_chunks(Buf *o, const StageSpec *s) {
  buf_printf(o, "/* This rank's chunks: {stage, forward, eval forward, backward, input-gradient half, weight-gradient half,\n"
                " * first and end row of RECV, of SEND, the loss follows its forward} */\nstatic const PrChunk CHUNKS[] = {\n");
  for (int c = 0; c < s->nchunks; c++) {
    const SpecFn *f = &s->chunk_fn[c * FN_COUNT];
    int r0 = 0, r1 = 0, s0 = 0, s1 = 0;
    for (int i = 0; i < s->nrecv; i++) r0 += s->recv[i].chunk < c, r1 += s->recv[i].chunk <= c;
    for (int i = 0; i < s->nsend; i++) s0 += s->send[i].chunk < c, s1 += s->send[i].chunk <= c;
    buf_printf(o, "    {%d, %s, %s, %s, %s, %s, %d, %d, %d, %d, %d},\n", s->chunk_stage[c], f[FN_FORWARD].name,
               f[FN_FORWARD_EVAL].present ? f[FN_FORWARD_EVAL].name : "NULL", f[FN_BACKWARD].name,
               f[FN_BACKWARD_INPUT].present ? f[FN_BACKWARD_INPUT].name : "NULL",
               f[FN_BACKWARD_WEIGHT].present ? f[FN_BACKWARD_WEIGHT].name : "NULL", r0, r1, s0, s1, c == s->loss_chunk);
  }
  buf_printf(o, "};\n\n");
}

/* The descriptor's optional fields, each group a string of ".field = value," for the template. */
static const char *memory_fields(const StageSpec *s, Pool *tp) {
  const char *opt = "";
  if (s->opt_store_bytes) {
    Buf d = {0};
    buf_printf(&d, "%s", "");
    put_cstring(&d, s->opt_dir);
    opt = pool_printf(tp, "\n    .opt_store_bytes = OPT_STORE_BYTES, .opt_dir = \"%s\", .ngrad_pieces = %d,", d.s, s->ngrad_pieces);
    buf_free(&d);
  }
  if (!s->memory_plan) return opt;
  Buf dir = {0};
  buf_printf(&dir, "%s", "");
  put_cstring(&dir, s->offload_dir);
  const char *f = pool_printf(tp, "\n    .nxslots = NXSLOTS, .xslot_base = XSLOT_BASE, .xslot_bytes = XSLOT_BYTES, .xout_bytes = XOUT_BYTES,"
                                  "\n    .offload_to = %d, .offload_dir = \"%s\", .nstore = NSTORE, .store_base = STORE_BASE, .store_bytes = STORE_BYTES,"
                                  " .store_owner = %d, .recompute = %s,%s",
                              s->offload_to, dir.s, s->store_owner, s->recomputes ? "recompute" : "NULL", opt);
  buf_free(&dir);
  return f;
}

static const char *chain_fields(const StageSpec *s, Pool *tp) {
  static const char *const role[] = {"PR_ROLE_BOTH", "PR_ROLE_FWD", "PR_ROLE_BWD"};
  const char *fb = !s->pipefb ? ""
      : pool_printf(tp, "\n    .stash_send = %s, .nstash_send = %d, .stash_recv = %s, .nstash_recv = %d,"
                        " .wsend = %s, .nwsend = %d, .wrecv = %s, .nwrecv = %d,",
                    s->nstash_send ? "STASH_SEND" : "NULL", s->nstash_send, s->nstash_recv ? "STASH_RECV" : "NULL", s->nstash_recv,
                    s->nwsend ? "WSEND" : "NULL", s->nwsend, s->nwrecv ? "WRECV" : "NULL", s->nwrecv);
  const char *chunks = !s->nchunks ? "" : pool_printf(tp, "\n    .chunks = CHUNKS, .nchunks = %d,", s->nchunks);
  const char *rep = s->replicas <= 1 ? ""
      : pool_printf(tp, "\n    .replicas = REPLICAS, .buckets = %s, .nbuckets = NBUCKETS, .grad_lo = GRAD_LO, .grad_hi = GRAD_HI, .reduce_base = REDUCE_BASE,"
                        "\n    .shard_floats = SHARD_FLOATS, .zero = %d,", s->nbuckets ? "BUCKETS" : "NULL", s->zero);
  return pool_printf(tp, "\n    .role = %s, .prev_rank = %d, .next_rank = %d, .loss_rank = %d, .nfrozen = %d, .nlayers = %d,%s%s%s", role[s->role],
                     s->prev_rank, s->next_rank, s->loss_rank, s->nfrozen, s->nlayers, fb, chunks, rep);
}

static const char *fn_or_null(const StageSpec *s, int fn) { return s->fn[fn].present ? s->fn[fn].name : "NULL"; }

static void render_descriptor(Buf *o, const StageSpec *s) {
  static const char *const opt[] = {"PR_SGD", "PR_ADAM", "PR_ADAMW"};
  static const char *const conv[] = {"PR_CONV_NONE", "PR_CONV_IM2COL", "PR_CONV_ONEDNN"};
  Pool tp = {0};
  const char *loss_fields = !s->loss ? ""
      : pool_printf(&tp, "\n    .loss_rows = %lld, .loss_classes = %lld, .labels_offset = OFF_%s, .logits_offset = OFF_%s, .logits_bytes = SIZE_%s,",
                    (long long)s->loss_rows, (long long)s->loss_classes, s->bufs[s->labels_buf].name, s->bufs[s->loss_buf].name,
                    s->bufs[s->loss_buf].name);
  Buf model = {0}; /* the path, as the body of a C string */
  buf_printf(&model, "%s", ""); /* not NULL for an empty path */
  put_cstring(&model, s->model);
  static const char *const prec[] = {"PR_PREC_FP32", "PR_PREC_TF32", "PR_PREC_BF16"};
  const char *keys[] = {"ARENA_FIELDS", "MODEL", "NACTIONS", "RECV", "NRECV", "SEND", "NSEND", "PARAMS", "NPARAMS", "LOSS", "LOSS_FIELDS",
                        "OPTIMIZER", "LR", "MOMENTUM", "WEIGHT_DECAY", "VOCAB", "PREDICTED_BYTES", "PREDICTED_STEP",
                        "FORWARD_ONLY", "BACKWARD_INPUT", "BACKWARD_WEIGHT", "MEMORY_FIELDS", "PROFILE_FIELDS", "FORWARD",
                        "BACKWARD", "CHAIN_FIELDS", "ASYNC_FIELDS", "FORWARD_EVAL", "ZERO_GRADS", "SUM_TIES", "UPDATE"};
  const char *vals[] = {
      pool_printf(&tp, D->arena_fields, prec[s->precision]), model.s, pool_printf(&tp, "%d", s->nactions), s->nrecv ? "RECV" : "NULL", pool_printf(&tp, "%d", s->nrecv),
      s->nsend ? "SEND" : "NULL", pool_printf(&tp, "%d", s->nsend), s->nparams ? "PARAMS" : "NULL", pool_printf(&tp, "%d", s->nparams),
      !s->loss ? "NULL" : "loss", loss_fields, opt[s->optimizer], pool_printf(&tp, "%.9g", s->lr),
      pool_printf(&tp, "%.9g", s->momentum), pool_printf(&tp, "%.9g", s->weight_decay), pool_printf(&tp, "%lld", (long long)s->vocab),
      pool_printf(&tp, "%.0f", s->predicted_bytes), pool_printf(&tp, "%.9g", s->predicted_step), s->forward_only ? "1" : "0",
      fn_or_null(s, FN_BACKWARD_INPUT), fn_or_null(s, FN_BACKWARD_WEIGHT), memory_fields(s, &tp),
      !s->prof_nodes ? "" : pool_printf(&tp, "\n    .prof_nodes = PROFILE_NODES, .nprof = %d, .prof_rate = %.6g, .prof_conv = %s,", s->nprof,
                                        s->prof_rate, conv[s->prof_conv]),
      fn_or_null(s, FN_FORWARD), fn_or_null(s, FN_BACKWARD), chain_fields(s, &tp),
      !s->async ? "" : pool_printf(&tp, "\n    .staleness = STALENESS, .lookahead = LOOKAHEAD, .nwversions = %s, .wversion_base = %s, .wversion_bytes = %s,",
                                   s->nwversions ? "NWVERSIONS" : "0", s->nwversions ? "WVERSION_BASE" : "0", s->nwversions ? "WVERSION_BYTES" : "0"),
      fn_or_null(s, FN_FORWARD_EVAL), fn_or_null(s, FN_ZERO_GRADS), fn_or_null(s, FN_SUM_TIES), fn_or_null(s, FN_UPDATE)};
  tmpl_fill(o, TMPL_STAGE_MAIN, keys, vals, (int)(sizeof keys / sizeof keys[0]));
  pool_free(&tp);
  buf_free(&model);
}

void render_c_stage(const StageSpec *s, Buf *o, const CDialect *d) {
  D = d;
  render_header(o, s);
  render_constants(o, s);
  render_buffers(o, s);
  render_shapes(o, s);
  if (s->prof_nodes) render_profile_nodes(o, s);
  for (int i = 0; s->chunk_fn && i < s->nchunks * FN_COUNT; i++)
    if (s->chunk_fn[i].present) render_fn(o, s, &s->chunk_fn[i]);
  for (int fn = 0; fn < FN_COUNT; fn++)
    if (s->fn[fn].present) render_fn(o, s, &s->fn[fn]);
  buf_printf(o, "\n");
  if (s->loss) render_loss(o, s);
  render_schedule(o, s);
  value_table(o, s, s->recv, s->nrecv, 1, "RECV");
  value_table(o, s, s->send, s->nsend, 0, "SEND");
  fb_table(o, s, s->stash_send, s->nstash_send, 0, 1, "STASH_SEND");
  fb_table(o, s, s->stash_recv, s->nstash_recv, 0, 0, "STASH_RECV");
  fb_table(o, s, s->wsend, s->nwsend, 1, 1, "WSEND");
  fb_table(o, s, s->wrecv, s->nwrecv, 1, 0, "WRECV");
  render_params(o, s);
  if (s->nchunks) render_chunks(o, s);
  render_descriptor(o, s);
}

/* The CPU: the arena is the program's own memory, the calls are runtime/kernels.h's. */
static const CDialect C_CPU = {
    .kernel_prefix = "k_",
    .includes = "",
    /* In .lbss, which the linker puts after every other static variable (the runtime's and the libraries'
     * .bss): an arena over 2 GiB, reached by the stage's -mcmodel=medium code (templates/Makefile.in), then
     * leaves them within the 32-bit reach of their own small-model code.  In .bss the sample LeNet at
     * -n 1 --batch 16384 (2.4 GiB) failed to link.  (GCC puts large data there itself under -mcmodel=medium.) */
    .arena = "#ifdef __clang__\n#pragma clang section bss = \".lbss\"\n#endif\n"
             "static unsigned char arena[ARENA_BYTES] __attribute__((aligned(64)));\n"
             "#ifdef __clang__\n#pragma clang section bss = \"\"\n#endif\n",
    .arena_fields = ".arena = arena",
};
static void render_stage(const StageSpec *s, Buf *o) { render_c_stage(s, o, &C_CPU); }

const Renderer RENDER_C = {.target = "cpu", .stage_file = "stage_%d.c", .stage = render_stage};
