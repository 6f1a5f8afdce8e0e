/* optstore.c - the optimizer state leaves the arena: --offload-optimizer file:DIR.
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
 * Whether a stage's state leaves is the memory plan's choice (stash.c): it
 * tries each over-limit stage with and without, and keeps the faster plan that
 * fits, the update's predicted time lengthened by the copies that the update's
 * compute does not hide (optstore_time). */
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

int optstore_allowed(const Plan *p, const StageProg *sp) {
  return p->opt.opt_offload != OPTOFF_NONE && !p->opt.forward_only && optstore_state_bytes(sp) > 0;
}

/* Floats per block: the largest weight's state, rounded up to 64 floats (a cache line of each of 4 SIMD
 * lanes' widths), at most OPT_BLOCK_MAX. */
static int64_t block_floats(const StageProg *sp, int *nstates) {
  int64_t most = 0;
  *nstates = 1;
  for (int i = 0; i < sp->nparams; i++) {
    if (!has_state(sp, i)) continue;
    int64_t n = sp->bufs[sp->params[i]].bytes / 4;
    if (n > most) most = n;
    if (sp->opt2[i] >= 0) *nstates = 2;
  }
  most = (most + 63) / 64 * 64;
  return most < OPT_BLOCK_MAX ? most : OPT_BLOCK_MAX;
}

void optstore_set(StageProg *sp, int out) {
  int nst;
  sp->opt_out = out && optstore_state_bytes(sp) > 0;
  sp->opt_block = sp->opt_out ? block_floats(sp, &nst) : 0;
  sp->opt_stage_bytes = sp->opt_out ? 2 * (int64_t)nst * sp->opt_block * 4 : 0;
}

double optstore_time(const StageProg *sp, double update_s, double bw, double lat) {
  if (!sp->opt_out) return 0;
  double bytes = (double)optstore_state_bytes(sp), t = 2 * bytes / bw, first = 0;
  int weights = 0;
  for (int i = 0; i < sp->nparams; i++) weights += has_state(sp, i);
  /* Each weight's first block is read before its update starts, and its last written after. */
  first = weights * (2 * lat + 2.0 * (double)sp->opt_stage_bytes / 2 / bw);
  return (t > update_s ? t - update_s : 0) + first;
}

/* A buffer appended to sp (its name unique among sp's). */
static int add_buf(StageProg *sp, Pool *pool, const char *name, int kind, int64_t bytes) {
  if (sp->nbufs == sp->capbufs) {
    sp->capbufs = sp->capbufs ? 2 * sp->capbufs : 64;
    sp->bufs = pool_realloc(pool, sp->bufs, sizeof(Buffer) * (size_t)sp->capbufs);
  }
  Buffer *b = &sp->bufs[sp->nbufs];
  memset(b, 0, sizeof *b);
  b->name = name, b->tensor = -1, b->kind = kind, b->bytes = bytes, b->dtype = DT_FLOAT;
  b->first = b->last = -1, b->offset = -1;
  return sp->nbufs++;
}

void optstore_finish(StageProg *sp, Pool *pool) {
  if (!sp->opt_out) return;
  int stage = add_buf(sp, pool, "OPT_STAGING", BUF_OPTSTAGE, sp->opt_stage_bytes);
  for (int k = 0; k < sp->nstep; k++) {
    Call *c = &sp->step[k];
    if (c->phase != PH_UPDATE || (c->kernel != K_SGD_STEP && c->kernel != K_ADAM_STEP)) continue;
    int i = -1;
    for (int q = 0; q < sp->nparams && i < 0; q++)
      if (sp->params[q] == c->args[0].buf) i = q;
    if (i < 0 || !has_state(sp, i)) continue;
    int64_t n = sp->bufs[sp->params[i]].bytes / 4;
    /* The state's arguments become its offsets in the store (memplan: the buffers' offsets there). */
    if (c->kernel == K_SGD_STEP)
      *c = *call_new(sp, pool, PH_UPDATE, K_SGD_STREAM, c->node, c->comment,
                     (Arg[]){A_BUF(sp->params[i]), A_BUF(sp->pgrad[i]), A_BUF(stage), A_INT(sp->bufs[sp->opt1[i]].offset), A_INT(n),
                             A_INT(sp->opt_block), A_SYM("&pr_opt")}, 7);
    else
      *c = *call_new(sp, pool, PH_UPDATE, K_ADAM_STREAM, c->node, c->comment,
                     (Arg[]){A_BUF(sp->params[i]), A_BUF(sp->pgrad[i]), A_BUF(stage), A_INT(sp->bufs[sp->opt1[i]].offset),
                             A_INT(sp->bufs[sp->opt2[i]].offset), A_INT(n), c->args[5], A_INT(sp->opt_block), A_SYM("&pr_opt")}, 9);
  }
}
