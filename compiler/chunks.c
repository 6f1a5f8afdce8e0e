/* chunks.c - a rank's stages as one program, for the schedules that run several stages (chunks) on each
 * rank (--schedule interleaved, zbv; schedule.h's sched_stage says which).
 *
 * Each stage is first built as a program of its own (autodiff.c), exactly as if it had a rank: the same
 * calls, crossings and sums as every other plan of the model, so the trained bits stay -n 1's.  This pass
 * joins a rank's stages into one program: one arena with one weights region (the weights file, the
 * checkpoints and --save see a rank as they always did), one parameter list, one optimizer step.  Each
 * buffer, call and crossing keeps the chunk it came from: the renderer prints a forward and a backward per
 * chunk, the runtime runs the one an action names, and a chunk's rings have its own ring size (memplan.c).
 * Temporaries of different chunks share memory, since an action runs one chunk's calls.  Buffers of chunk
 * c > 0 are renamed c<c>_NAME and shape constants C<c>_NAME: two stages may name a temporary alike. */
#include "chunks.h"

#include <string.h>

typedef struct Join {
  StageProg *o;
  Pool *pool;
  int *bbase, *sbase; /* per chunk: its first buffer and shape constant in the joined program */
} Join;

static int *remap_ids(const int *ids, int n, int base, Pool *pool) {
  int *out = pool_alloc(pool, sizeof(int) * (size_t)(n + 1));
  for (int i = 0; i < n; i++) out[i] = ids[i] >= 0 ? ids[i] + base : ids[i];
  return out;
}

/* A copy of call k of chunk c, its buffers and shape constants renumbered (variants too). */
static Call *join_call(const Join *j, const Call *k, int c) {
  Call *x = pool_alloc(j->pool, sizeof *x);
  *x = *k;
  x->chunk = c;
  x->args = pool_alloc(j->pool, sizeof(Arg) * (size_t)(k->nargs + 1));
  for (int a = 0; a < k->nargs; a++) {
    x->args[a] = k->args[a];
    if (k->args[a].kind == ARG_BUF && k->args[a].buf >= 0) x->args[a].buf += j->bbase[c];
    if (k->args[a].kind == ARG_CONST) x->args[a].i += j->sbase[c];
  }
  x->reads = remap_ids(k->reads, k->nreads, j->bbase[c], j->pool);
  x->writes = remap_ids(k->writes, k->nwrites, j->bbase[c], j->pool);
  if (k->eval) x->eval = join_call(j, k->eval, c);
  if (k->recompute) x->recompute = join_call(j, k->recompute, c);
  return x;
}

/* Appends chunk c's calls of list `from` (n of them, phase `phase` or any when -1) to `to`. */
static void join_calls(const Join *j, Call *to, int *nto, const Call *from, int n, int c, int phase) {
  for (int i = 0; i < n; i++)
    if (phase < 0 || from[i].phase == phase) to[(*nto)++] = *join_call(j, &from[i], c);
}

static void join_buffers(Join *j, const StageProg *sp, int c) {
  StageProg *o = j->o;
  for (int i = 0; i < sp->nbufs; i++) {
    Buffer *b = &o->bufs[o->nbufs++];
    *b = sp->bufs[i];
    b->chunk = c;
    if (b->copy_of) b->copy_of += j->bbase[c]; /* 1 + the value it copies, in the joined numbering */
    if (c) b->name = pool_printf(j->pool, "c%d_%s", c, sp->bufs[i].name);
  }
  for (int i = 0; i < sp->nshapes; i++) {
    ShapeConst *x = &o->shapes[o->nshapes++];
    *x = sp->shapes[i];
    if (c) x->name = pool_printf(j->pool, "C%d_%s", c, sp->shapes[i].name);
  }
}

static void join_crossings(Join *j, const StageProg *sp, int c) {
  StageProg *o = j->o;
  int base = j->bbase[c];
  for (int i = 0; i < sp->nrecv; i++) {
    Crossing *x = &o->recv[o->nrecv++];
    *x = sp->recv[i], x->chunk = c, x->buf += base;
    if (x->gbuf >= 0) x->gbuf += base;
  }
  for (int i = 0; i < sp->nsend; i++) {
    Crossing *x = &o->send[o->nsend++];
    *x = sp->send[i], x->chunk = c, x->buf += base;
    if (x->gbuf >= 0) x->gbuf += base;
  }
}

/* A weight two of the rank's stages read would be two copies in one arena, each updated with a sum that
 * the runtime exchanges between ranks: not joined yet. */
static int check_shared_weight(const Plan *p, const StageProg *const *sps, int nc, int r) {
  for (int c = 1; c < nc; c++)
    for (int i = 0; i < sps[c]->nparams; i++)
      for (int d = 0; d < c; d++)
        for (int k = 0; k < sps[d]->nparams; k++) {
          int t = sps[c]->bufs[sps[c]->params[i]].tensor;
          if (t == sps[d]->bufs[sps[d]->params[k]].tensor)
            return err_set("weight '%s' is read by stages %d and %d, which both run on rank %d (--chunks): a rank does not hold "
                           "a weight for two of its stages yet (try another -n, or --schedule 1f1b)",
                           p->g.t[t].name, sps[d]->stage, sps[c]->stage, r);
        }
  return 0;
}

/* A tied weight's parts name the rank that computes each (the runtime exchanges them between ranks). */
static void join_params(Join *j, const Schedule *sc, const StageProg *sp, int c) {
  StageProg *o = j->o;
  int base = j->bbase[c];
  for (int i = 0; i < sp->nparams; i++) {
    int k = o->nparams++;
    o->params[k] = sp->params[i] + base;
    o->pgrad[k] = sp->pgrad[i] >= 0 ? sp->pgrad[i] + base : -1;
    o->opt1[k] = sp->opt1[i] >= 0 ? sp->opt1[i] + base : -1;
    o->opt2[k] = sp->opt2[i] >= 0 ? sp->opt2[i] + base : -1;
    o->nparts[k] = sp->nparts ? sp->nparts[i] : 0;
    o->parts[k] = NULL;
    if (!o->nparts[k]) continue;
    o->parts[k] = pool_alloc(j->pool, sizeof(struct TiePart) * (size_t)o->nparts[k]);
    for (int q = 0; q < o->nparts[k]; q++) {
      o->parts[k][q] = sp->parts[i][q], o->parts[k][q].buf += base;
      o->parts[k][q].stage = sched_rank_of(sc, sp->parts[i][q].stage);
    }
  }
  for (int i = 0; i < sp->nconsts; i++) o->consts[o->nconsts++] = sp->consts[i] + base;
}

/* The loss, from the chunk of the last stage. */
static void join_loss(Join *j, const StageProg *sp, int c) {
  StageProg *o = j->o;
  int base = j->bbase[c];
  o->loss = join_call(j, sp->loss, c);
  o->loss_chunk = c;
  o->loss_buf = sp->loss_buf + base, o->dloss_buf = sp->dloss_buf + base, o->labels_buf = sp->labels_buf + base;
  o->loss_rows = sp->loss_rows, o->loss_classes = sp->loss_classes;
}

/* Room for the sum of the chunks' lists. */
static void join_alloc(Join *j, const StageProg *const *sps, int nc) {
  StageProg *o = j->o;
  int nb = 0, ns = 0, nf = 0, nbw = 0, nst = 0, nr = 0, nsd = 0, np = 0, nk = 0;
  for (int c = 0; c < nc; c++) {
    const StageProg *sp = sps[c];
    nb += sp->nbufs, ns += sp->nshapes, nf += sp->nfwd, nbw += sp->nbwd, nst += sp->nstep;
    nr += sp->nrecv, nsd += sp->nsend, np += sp->nparams, nk += sp->nconsts;
  }
  Pool *pl = j->pool;
  o->bufs = pool_alloc(pl, sizeof(Buffer) * (size_t)(nb + 1)), o->capbufs = nb + 1;
  o->shapes = pool_alloc(pl, sizeof(ShapeConst) * (size_t)(ns + 1)), o->capshapes = ns + 1;
  o->fwd = pool_alloc(pl, sizeof(Call) * (size_t)(nf + 1)), o->capfwd = nf + 1;
  o->bwd = pool_alloc(pl, sizeof(Call) * (size_t)(nbw + 1)), o->capbwd = nbw + 1;
  o->step = pool_alloc(pl, sizeof(Call) * (size_t)(nst + 1)), o->capstep = nst + 1;
  o->recv = pool_alloc(pl, sizeof(Crossing) * (size_t)(nr + 1));
  o->send = pool_alloc(pl, sizeof(Crossing) * (size_t)(nsd + 1));
  o->params = pool_alloc(pl, sizeof(int) * (size_t)(np + 1));
  o->pgrad = pool_alloc(pl, sizeof(int) * (size_t)(np + 1));
  o->opt1 = pool_alloc(pl, sizeof(int) * (size_t)(np + 1));
  o->opt2 = pool_alloc(pl, sizeof(int) * (size_t)(np + 1));
  o->parts = pool_alloc(pl, sizeof(struct TiePart *) * (size_t)(np + 1));
  o->nparts = pool_alloc(pl, sizeof(int) * (size_t)(np + 1));
  o->consts = pool_alloc(pl, sizeof(int) * (size_t)(nk + 1));
  o->cstage = pool_alloc(pl, sizeof(int) * (size_t)nc);
  o->cslots = pool_alloc(pl, sizeof(int) * (size_t)nc);
  o->cgslots = pool_alloc(pl, sizeof(int) * (size_t)nc);
  o->cwslots = pool_alloc(pl, sizeof(int) * (size_t)nc);
  o->chold = pool_alloc(pl, sizeof(int) * (size_t)nc);
  j->bbase = pool_alloc(pl, sizeof(int) * (size_t)nc);
  j->sbase = pool_alloc(pl, sizeof(int) * (size_t)nc);
  for (int c = 1; c < nc; c++) j->bbase[c] = j->bbase[c - 1] + sps[c - 1]->nbufs, j->sbase[c] = j->sbase[c - 1] + sps[c - 1]->nshapes;
}

int chunks_join(const Plan *p, const StageProg *progs, int r, StageProg *o, Pool *pool) {
  const Schedule *sc = &p->sched;
  int nc = sc->nchunks;
  const StageProg *sps[64];
  for (int c = 0; c < nc; c++) sps[c] = &progs[sched_stage(sc, r, c)];
  if (check_shared_weight(p, sps, nc, r)) return -1;
  memset(o, 0, sizeof *o);
  Join j = {o, pool, NULL, NULL};
  join_alloc(&j, sps, nc);
  o->stage = r, o->nchunks = nc, o->loss_chunk = -1;
  o->loss_buf = o->dloss_buf = o->labels_buf = -1;
  for (int c = 0; c < nc; c++) {
    const StageProg *sp = sps[c];
    int s = sched_stage(sc, r, c);
    o->cstage[c] = s, o->cslots[c] = sc->nslots[s], o->cgslots[c] = sc->ngslots[s], o->cwslots[c] = sc->nwslots[s];
    o->chold[c] = sp->hold;
    o->nslots = o->nslots > o->cslots[c] ? o->nslots : o->cslots[c];
    o->ngslots = o->ngslots > o->cgslots[c] ? o->ngslots : o->cgslots[c];
    o->nwslots = o->nwslots > o->cwslots[c] ? o->nwslots : o->cwslots[c];
    join_buffers(&j, sp, c);
    join_calls(&j, o->fwd, &o->nfwd, sp->fwd, sp->nfwd, c, -1);
    join_calls(&j, o->bwd, &o->nbwd, sp->bwd, sp->nbwd, c, -1);
    join_crossings(&j, sp, c);
    join_params(&j, sc, sp, c);
    if (sp->loss) join_loss(&j, sp, c);
    o->poll |= sp->poll;
  }
  /* The optimizer step's calls phase by phase: every chunk's zeroing, then the ties, then the updates. */
  for (int ph = PH_ZERO; ph <= PH_UPDATE; ph++)
    for (int c = 0; c < nc; c++) join_calls(&j, o->step, &o->nstep, sps[c]->step, sps[c]->nstep, c, ph);
  return 0;
}
