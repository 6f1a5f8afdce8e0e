/* optstore.c - the weights' side leaves the arena: --offload-optimizer file:DIR.
 *
 * SGD's momentum and Adam's two moments are read and written once a step, by
 * the update, and by nothing else; between updates they only take room.  A
 * stage that does not fit --mem-limit can keep them in a file of its own
 * (the store) instead.  The update then streams each weight's state through
 * two staging blocks of OPT_BLOCK_MAX floats at most: while block b is
 * updated, block b + 1 is read and block b - 1 written back (runtime/optstore.c,
 * io_uring requests like the activations' file).  The update kernels are
 * elementwise, so updating a weight block by block computes the same bits as
 * updating it whole.  The staging blocks live in the temporaries' region: no
 * forward or backward temporary is alive during the update.
 *
 * The weight gradients can follow (mode OPTSTORE_GRADS).  A gradient is summed
 * over a step's micro-batches by the one backward call that writes it; in the
 * store, each backward brings the gradient into one of two staging copies just
 * before that call (the next weight's is read meanwhile), and writes it back
 * after: the call adds into the same numbers as in the arena, so the sums are
 * the same bits.  A step's first backward starts from zeros instead of reading
 * (the runtime marks every stored gradient fresh where the arena's are
 * zeroed), and the update streams the gradient with the state.  Only a weight
 * that one call writes, alone, qualifies: a tied weight's parts and a call that
 * writes several gradients (an LSTM's) stay in the arena.
 *
 * Whether a stage's state (and gradients) leave is the memory plan's choice
 * (stash.c): it tries each over-limit stage without, with the state, and with
 * both, and keeps the fastest plan that fits, the update and the backward
 * lengthened by the copies their compute does not hide (optstore_time). */
#include <stdlib.h>
#include <string.h>

#include "optstore.h"

static int has_state(const StageProg *sp, int i) { return sp->pgrad[i] >= 0 && sp->opt1 && sp->opt1[i] >= 0; }

int64_t optstore_state_bytes(const StageProg *sp) {
  int64_t n = 0;
  for (int i = 0; i < sp->nparams; i++) {
    if (!has_state(sp, i)) continue;
    n += sp->bufs[sp->opt1[i]].bytes;
    if (sp->opt2[i] >= 0) n += sp->bufs[sp->opt2[i]].bytes;
  }
  return n;
}

/* Does call k write buffer id? */
static int writes(const Call *k, int id) {
  for (int q = 0; q < k->nwrites; q++)
    if (k->writes[q] == id) return 1;
  return 0;
}

/* The one backward call that writes weight i's gradient, and no other gradient; -1 otherwise (tied,
 * none, several). */
static int grad_writer(const StageProg *sp, int i) {
  int g = sp->pgrad[i], at = -1;
  if (g < 0 || (sp->nparts && sp->nparts[i])) return -1;
  for (int j = 0; j < sp->nbwd; j++) {
    if (!writes(&sp->bwd[j], g)) continue;
    if (at >= 0) return -1;
    at = j;
    for (int q = 0; q < sp->bwd[j].nwrites; q++)
      if (sp->bwd[j].writes[q] != g && sp->bufs[sp->bwd[j].writes[q]].kind == BUF_PGRAD) return -1;
  }
  for (int j = 0; j < sp->nfwd && at >= 0; j++)
    for (int q = 0; q < sp->fwd[j].nreads; q++)
      if (sp->fwd[j].reads[q] == g) return -1;
  return at;
}

int optstore_grad_ok(const StageProg *sp, int i) { return grad_writer(sp, i) >= 0; }

int64_t optstore_grad_bytes(const StageProg *sp) {
  int64_t n = 0;
  for (int i = 0; i < sp->nparams; i++)
    if (optstore_grad_ok(sp, i)) n += sp->bufs[sp->pgrad[i]].bytes;
  return n;
}

/* Rows of a band of weight i's gradient when its writer is a Gemm's dB with more rows than a band (*cols: its
 * columns); 0 when it comes whole. */
static int band_rows(const StageProg *sp, int i, int64_t *cols) {
  int j = grad_writer(sp, i);
  if (j < 0 || sp->bwd[j].kernel != K_GEMM_DB) return 0;
  const Arg *a = sp->bwd[j].args;
  int64_t rows = a[7].i ? a[4].i : a[5].i;
  *cols = a[7].i ? a[5].i : a[4].i;
  return rows > GRAD_BAND_ROWS ? GRAD_BAND_ROWS : 0;
}

/* The bytes of the largest piece of weight i's gradient the backward brings in at once. */
static int64_t piece_bytes(const StageProg *sp, int i, int banded) {
  int64_t cols = 0;
  int r = banded ? band_rows(sp, i, &cols) : 0;
  return r ? (int64_t)r * cols * 4 : sp->bufs[sp->pgrad[i]].bytes;
}

int optstore_modes(const Plan *p, const StageProg *sp) {
  if (p->opt.opt_offload == OPTOFF_NONE || p->opt.forward_only) return 0;
  int bands = 0;
  for (int i = 0; i < sp->nparams; i++) {
    int64_t cols;
    bands |= optstore_grad_ok(sp, i) && band_rows(sp, i, &cols);
  }
  return bands ? OPTSTORE_BANDS : optstore_grad_bytes(sp) > 0 ? OPTSTORE_GRADS : optstore_state_bytes(sp) > 0 ? OPTSTORE_STATE : 0;
}

/* Floats per block: the largest weight, rounded up to 64 floats (whole vectors of every width), at most
 * OPT_BLOCK_MAX. */
static int64_t block_floats(const StageProg *sp) {
  int64_t most = 0;
  for (int i = 0; i < sp->nparams; i++)
    if (has_state(sp, i) || (sp->grad_out && optstore_grad_ok(sp, i))) {
      int64_t n = sp->bufs[sp->params[i]].bytes / 4;
      if (n > most) most = n;
    }
  most = (most + 63) / 64 * 64;
  return most < OPT_BLOCK_MAX ? most : OPT_BLOCK_MAX;
}

static int64_t align64(int64_t x) { return (x + 63) / 64 * 64; }

void optstore_set(StageProg *sp, int mode) {
  int64_t state = optstore_state_bytes(sp), grads = optstore_grad_bytes(sp);
  sp->opt_out = mode >= OPTSTORE_STATE && (state > 0 || (mode >= OPTSTORE_GRADS && grads > 0));
  sp->grad_out = mode >= OPTSTORE_GRADS && grads > 0;
  sp->grad_banded = sp->grad_out && mode >= OPTSTORE_BANDS;
  int nst = 0;
  int64_t most = 0;
  for (int i = 0; i < sp->nparams; i++) nst = has_state(sp, i) ? (sp->opt2[i] >= 0 ? 2 : nst > 1 ? nst : 1) : nst;
  sp->opt_block = sp->opt_out ? block_floats(sp) : 0;
  /* Per slot the kernels' [m | g] (SGD) or [m | v | g] (Adam) blocks, whichever parts a weight has (cpu/optim.h). */
  sp->opt_stage_bytes = sp->opt_out ? 2 * (int64_t)(nst == 2 ? 3 : 2) * sp->opt_block * 4 : 0;
  for (int i = 0; i < sp->nparams; i++)
    if (sp->grad_out && optstore_grad_ok(sp, i) && piece_bytes(sp, i, sp->grad_banded) > most) most = piece_bytes(sp, i, sp->grad_banded);
  sp->grad_stage_bytes = sp->grad_out ? 2 * align64(most) : 0;
  for (int b = 0; b < sp->nbufs; b++) sp->bufs[b].in_store = 0;
  for (int i = 0; i < sp->nparams; i++) {
    if (sp->opt_out && has_state(sp, i)) {
      sp->bufs[sp->opt1[i]].in_store = 1;
      if (sp->opt2[i] >= 0) sp->bufs[sp->opt2[i]].in_store = 1;
    }
    if (sp->grad_out && optstore_grad_ok(sp, i)) sp->bufs[sp->pgrad[i]].in_store = 1;
  }
}

double optstore_time(const StageProg *sp, double update_s, double bw, double lat) {
  if (!sp->opt_out) return 0;
  double bytes = (double)optstore_state_bytes(sp), weights = 0;
  for (int i = 0; i < sp->nparams; i++)
    if (has_state(sp, i) || (sp->grad_out && sp->bufs[sp->pgrad[i]].in_store)) weights++;
  if (sp->grad_out) bytes += (double)optstore_grad_bytes(sp) / 2; /* the update reads the gradients, writes nothing back */
  double t = 2 * bytes / bw;
  /* Each weight's first block is read before its update starts, and its last written after. */
  double first = weights * (2 * lat + (double)sp->opt_stage_bytes / 2 / bw);
  return (t > update_s ? t - update_s : 0) + first;
}

double optstore_bwd_time(const StageProg *sp, double bwd_s, double bw, double lat) {
  if (!sp->grad_out) return 0;
  double t = 2 * (double)optstore_grad_bytes(sp) / bw; /* read and written back, once per micro-batch */
  int pieces = 0;
  for (int i = 0; i < sp->nparams; i++)
    if (optstore_grad_ok(sp, i)) pieces += (int)((sp->bufs[sp->pgrad[i]].bytes + piece_bytes(sp, i, sp->grad_banded) - 1) / piece_bytes(sp, i, sp->grad_banded));
  /* Each piece's copies (and their latency) run beside the calls before it: only what exceeds the backward's compute
   * shows, and the first piece's read and the last one's write, which nothing hides. */
  t += 2 * lat * pieces;
  double edges = 2 * lat + (double)sp->grad_stage_bytes / bw;
  return (t > bwd_s ? t - bwd_s : 0) + edges;
}

/* A buffer appended to sp. */
static int param_of_buf(const StageProg *sp, int buf) {
  for (int q = 0; q < sp->nparams; q++)
    if (sp->params[q] == buf) return q;
  return -1;
}

/* The update's calls: each weight with state or a stored gradient streams them. */
static void finish_update(StageProg *sp, Pool *pool) {
  int stage = buf_add(sp, pool, "OPT_STAGING", BUF_OPTSTAGE, sp->opt_stage_bytes);
  for (int k = 0; k < sp->nstep; k++) {
    Call *c = &sp->step[k];
    if (c->phase != PH_UPDATE || (c->kernel != K_SGD_STEP && c->kernel != K_ADAM_STEP)) continue;
    int i = param_of_buf(sp, c->args[0].buf);
    int gin = i >= 0 && sp->bufs[sp->pgrad[i]].in_store;
    if (i < 0 || (!has_state(sp, i) && !gin)) continue;
    int64_t n = sp->bufs[sp->params[i]].bytes / 4, gf = gin ? sp->bufs[sp->pgrad[i]].offset : -1;
    int64_t m1 = has_state(sp, i) ? sp->bufs[sp->opt1[i]].offset : -1;
    int g = gin ? -1 : sp->pgrad[i];
    if (c->kernel == K_SGD_STEP)
      *c = *call_new(sp, pool, PH_UPDATE, K_SGD_STREAM, c->node, c->comment,
                     (Arg[]){A_BUF(sp->params[i]), A_BUF(g), A_BUF(stage), A_INT(i), A_INT(m1), A_INT(gf), A_INT(n), A_INT(sp->opt_block),
                             A_SYM("&pr_opt")}, 9);
    else
      *c = *call_new(sp, pool, PH_UPDATE, K_ADAM_STREAM, c->node, c->comment,
                     (Arg[]){A_BUF(sp->params[i]), A_BUF(g), A_BUF(stage), A_INT(i), A_INT(m1), A_INT(sp->bufs[sp->opt2[i]].offset),
                             A_INT(gf), A_INT(n), c->args[5], A_INT(sp->opt_block), A_SYM("&pr_opt")}, 11);
  }
}

/* The zeroing of the stored gradients goes: the runtime marks them fresh instead (a step's first backward
 * starts from zeros without reading). */
static void drop_zeroing(StageProg *sp) {
  int n = 0;
  for (int k = 0; k < sp->nstep; k++) {
    const Call *c = &sp->step[k];
    if (c->phase == PH_ZERO && c->kernel == K_ZERO && c->args[0].kind == ARG_BUF && sp->bufs[c->args[0].buf].in_store) continue;
    sp->step[n++] = *c;
  }
  sp->nstep = n;
}

/* Replaces buffer `from` by `to` in call c's arguments (its accesses follow). */
static void retarget(StageProg *sp, Pool *pool, Call *c, int from, int to) {
  Arg *args = pool_alloc(pool, sizeof(Arg) * (size_t)(c->nargs + 1));
  memcpy(args, c->args, sizeof(Arg) * (size_t)c->nargs);
  for (int a = 0; a < c->nargs; a++) {
    if (args[a].kind == ARG_NULL) args[a] = A_BUF(-1); /* as it was given: call_new makes it NULL again */
    if (args[a].kind == ARG_BUF && args[a].buf == from) args[a].buf = to;
  }
  Call *eval = c->eval, *rc = c->recompute;
  *c = *call_new(sp, pool, c->phase, c->kernel, c->node, c->comment, args, c->nargs);
  c->eval = eval, c->recompute = rc;
}

static Call glue(StageProg *sp, Pool *pool, int kernel, const char *comment, const Arg *args, int nargs) {
  return *call_new(sp, pool, PH_WGRAD, kernel, -1, comment, args, nargs);
}

/* A piece the backward brings in: rows [r0, r1) of weight i's gradient, written by backward call j (r1 0: all of it). */
typedef struct Piece {
  int j, i, r0, r1;
  int64_t off, floats;
} Piece;

/* The stored gradients' pieces in the order their writers run (out NULL: only counted). */
static int pieces_of(const StageProg *sp, Piece *out) {
  int n = 0, *wr = malloc(sizeof(int) * (size_t)(sp->nparams + 1)); /* each stored gradient's writer, found once */
  if (!wr) abort();
  for (int i = 0; i < sp->nparams; i++) wr[i] = sp->pgrad[i] >= 0 && sp->bufs[sp->pgrad[i]].in_store ? grad_writer(sp, i) : -1;
  for (int j = 0; j < sp->nbwd; j++)
    for (int i = 0; i < sp->nparams; i++) {
      if (wr[i] != j) continue;
      const Buffer *g = &sp->bufs[sp->pgrad[i]];
      int64_t cols = 0;
      int band = sp->grad_banded ? band_rows(sp, i, &cols) : 0;
      if (!band) {
        if (out) out[n] = (Piece){j, i, 0, 0, g->offset, g->bytes / 4};
        n++;
        continue;
      }
      int64_t rows = g->bytes / 4 / cols;
      for (int64_t r = 0; r < rows; r += band, n++) {
        int64_t r1 = r + band < rows ? r + band : rows;
        if (out) out[n] = (Piece){j, i, (int)r, (int)r1, g->offset + r * cols * 4, (r1 - r) * cols};
      }
    }
  free(wr);
  return n;
}

/* Piece t's writer, on staging copy gs: the whole call retargeted, or its rows alone (k_gemm_dB_rows). */
static Call piece_call(StageProg *sp, Pool *pool, const Piece *pc, int gs) {
  Call c = sp->bwd[pc->j];
  if (!pc->r1) {
    retarget(sp, pool, &c, sp->pgrad[pc->i], gs);
    return c;
  }
  const Arg *a = c.args;
  return *call_new(sp, pool, c.phase, K_GEMM_DB_ROWS, c.node, pool_printf(pool, "%s, rows %d..%d", c.comment, pc->r0, pc->r1 - 1),
                   (Arg[]){a[0], a[1], A_BUF(gs), a[3], a[4], a[5], a[6], a[7], a[8], a[9], A_INT(pc->r0), A_INT(pc->r1)}, 12);
}

static Call fetch_call(StageProg *sp, Pool *pool, const Piece *pc, int gs, int slot, int id) {
  const Buffer *gb = &sp->bufs[sp->pgrad[pc->i]];
  const char *what = pc->r1 ? pool_printf(pool, "rows %d..%d of the gradient of '%s'", pc->r0, pc->r1 - 1, gb->name)
                            : pool_printf(pool, "the gradient of '%s'", gb->name);
  return glue(sp, pool, K_GRAD_FETCH, pool_printf(pool, "bring %s from the file", what),
              (Arg[]){A_BUF(gs), A_INT(slot), A_INT(id), A_INT(pc->off), A_INT(pc->floats)}, 5);
}

/* The backward's calls: each stored gradient's writer works on a staging copy of the gradient (or of each of
 * its bands in turn), fetched one piece ahead and written back after it; the backward ends when the last copy
 * is back.  The pieces' writers keep their places among the other calls, in their order. */
static void finish_backward(StageProg *sp, Pool *pool) {
  int half = (int)(sp->grad_stage_bytes / 2);
  int gs[2] = {buf_add(sp, pool, "GRAD_STAGING_0", BUF_GSTAGE, half), buf_add(sp, pool, "GRAD_STAGING_1", BUF_GSTAGE, half)};
  Piece *pc = malloc(sizeof(Piece) * (size_t)(pieces_of(sp, NULL) + 1));
  if (!pc) abort();
  int np = pieces_of(sp, pc), t = 0;
  sp->ngrad_units = np;
  Call *out = pool_alloc(pool, sizeof(Call) * (size_t)(sp->nbwd + 4 * np + 4));
  int n = 0;
  if (np) out[n++] = fetch_call(sp, pool, &pc[0], gs[0], 0, 0);
  for (int j = 0; j < sp->nbwd; j++) {
    if (t >= np || pc[t].j != j) {
      out[n++] = sp->bwd[j];
      continue;
    }
    for (; t < np && pc[t].j == j; t++) {
      int slot = t & 1;
      out[n++] = glue(sp, pool, K_GRAD_WAIT, "its gradient is here", (Arg[]){A_BUF(gs[slot]), A_INT(slot)}, 2);
      if (t + 1 < np) out[n++] = fetch_call(sp, pool, &pc[t + 1], gs[slot ^ 1], slot ^ 1, t + 1);
      out[n++] = piece_call(sp, pool, &pc[t], gs[slot]);
      out[n++] = glue(sp, pool, K_GRAD_PUT, "back to the file",
                      (Arg[]){A_BUF(gs[slot]), A_INT(slot), A_INT(pc[t].off), A_INT(pc[t].floats)}, 4);
    }
  }
  for (int slot = 0; slot < 2 && np; slot++)
    out[n++] = glue(sp, pool, K_GRAD_WAIT, "the last gradients are back in the file", (Arg[]){A_BUF(gs[slot]), A_INT(slot)}, 2);
  sp->bwd = out, sp->nbwd = sp->capbwd = n;
  free(pc);
}

void optstore_finish(StageProg *sp, Pool *pool) {
  if (!sp->opt_out) return;
  if (sp->grad_out) finish_backward(sp, pool), drop_zeroing(sp);
  finish_update(sp, pool);
}
