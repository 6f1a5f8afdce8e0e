/* memplan.c - one arena per stage, every buffer at an offset fixed here.
 *
 * Layout: weights | older weight versions (async) | weight gradients | optimizer state | rings (one copy per
 * slot of the schedule; zb1's and zbv's late values one per wslot) | gradient rings (one per gslot) | labels | the
 * leaving values (one block per xslot: offloaded, then recomputed; stash.c) |
 * a peer's store | temporaries (and, under --offload-optimizer, the update's staging blocks at their start;
 * the optimizer state itself then lives in a file, each buffer's offset its place there).
 * Temporaries live within one forward or backward action; two of them share
 * memory when their lifetimes (first and last call that touches them) do not
 * overlap - greedy first fit, largest first. */
#include <stdlib.h>
#include <string.h>

#include "memplan.h"

#define ALIGN 64
static int64_t up(int64_t x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }

int64_t replica_shard_floats(int R, const StageProg *sp) {
  int64_t n = 0;
  for (int i = 0; i < sp->nbufs; i++)
    if (sp->bufs[i].kind == BUF_PGRAD && !sp->bufs[i].unused && !sp->bufs[i].in_store) n += up(sp->bufs[i].bytes) / 4;
  int64_t sh = (n + R - 1) / (R > 0 ? R : 1);
  return (sh + REPLICA_SHARD_ALIGN - 1) / REPLICA_SHARD_ALIGN * REPLICA_SHARD_ALIGN;
}

static void touch(StageProg *sp, const Call *k, int when) {
  for (int r = 0; r < k->nreads + k->nwrites; r++) {
    int id = r < k->nreads ? k->reads[r] : k->writes[r - k->nreads];
    Buffer *b = &sp->bufs[id];
    if (b->first < 0 || when < b->first) b->first = when;
    if (when > b->last) b->last = when;
  }
}

static int by_size(const void *a, const void *b, void *ctx) {
  const Buffer *bufs = ctx;
  int64_t x = bufs[*(const int *)a].bytes, y = bufs[*(const int *)b].bytes;
  return x < y ? 1 : x > y ? -1 : *(const int *)a - *(const int *)b;
}


int call_is_weight(const StageProg *sp, const Call *k) {
  (void)sp;
  return k->phase == PH_WGRAD;
}

int buf_at_cut(const StageProg *sp, int id) {
  for (int i = 0; i < sp->nrecv; i++)
    if (sp->recv[i].buf == id) return 1;
  for (int i = 0; i < sp->nsend; i++)
    if (sp->send[i].buf == id) return 1;
  return id == sp->loss_buf || id == sp->dloss_buf;
}

/* zb1 and zbv run a micro-batch's W calls after its I calls, with other
 * micro-batches in between, and a micro-batch's forward ring copy is free
 * after its I (schedule.c).  What a W call reads must last until W:
 * - a temporary an I call writes (the output gradient W multiplies by) gets
 *   a gradient ring copy per gslot, which a micro-batch holds until its W;
 * - a kept forward value (W's input activation) is a late value: a copy per
 *   wslot, which a micro-batch holds from its F to its W (the late ring).
 * A value that crosses a cut stays in the forward ring, where its messages
 * put it; autodiff.c copies one that W reads during I (split_copies), into
 * a temporary of the first kind.  A value that leaves (offloaded,
 * recomputed) is in its xslot until W.
 * That is the late layout.  In the hold layout W reads the forward ring,
 * held until W as 1f1b holds it until B: the temporaries of the first kind
 * get a forward ring copy per slot, nothing is late, and a copy for W is
 * laid out on the value it copies.  A stage program lays out both and
 * keeps the smaller (memplan_as); in a rank of chunks each chunk keeps its
 * stage's (chold). */
static int holds(const StageProg *sp, const Buffer *b) { return sp->nchunks ? sp->chold[b->chunk] : sp->hold; }

static void mark_late(StageProg *sp) {
  char *by_i = calloc((size_t)sp->nbufs + 1, 1); /* written by an input-gradient call */
  if (!by_i) abort();
  for (int j = 0; j < sp->nbwd; j++)
    for (int w = 0; w < sp->bwd[j].nwrites && !call_is_weight(sp, &sp->bwd[j]); w++) by_i[sp->bwd[j].writes[w]] = 1;
  for (int i = 0; i < sp->nbwd; i++)
    for (int r = 0; r < sp->bwd[i].nreads && call_is_weight(sp, &sp->bwd[i]); r++) {
      int id = sp->bwd[i].reads[r];
      Buffer *b = &sp->bufs[id];
      if (b->kind == BUF_TEMP && by_i[id]) {
        const Buffer *of = b->copy_of ? &sp->bufs[b->copy_of - 1] : NULL;
        b->split_kept = 1;
        b->kind = holds(sp, b) ? (of ? of->kind : BUF_RING) : BUF_GRING;
        if (of && holds(sp, b)) b->fate = of->fate; /* the value itself: in its ring, or its xslot */
      }
      if (b->kind == BUF_RING && b->fate == FATE_KEEP && !buf_at_cut(sp, id) && !holds(sp, b)) b->late = 1;
    }
  free(by_i);
}

/* The hold layout: a copy for W is the value it copies (the same offset, view and fate). */
static int aliased(const StageProg *sp, const Buffer *b) { return b->copy_of && b->split_kept && holds(sp, b); }

/* A gradient ring that holds a gradient crossing a cut (received, or sent back). */
static int is_cut_gradient(const StageProg *sp, int id) {
  for (int i = 0; i < sp->nrecv; i++)
    if (sp->recv[i].gbuf == id) return 1;
  for (int i = 0; i < sp->nsend; i++)
    if (sp->send[i].gbuf == id) return 1;
  return 0;
}

/* Where a buffer's bytes are counted in the stage's memory breakdown: what waits for a backward (W's output
 * gradients under zb1 and zbv too) is kept for backward; the cuts' values and gradients are crossing values. */
static int64_t *share_of(StageProg *sp, int id) {
  switch (sp->bufs[id].kind) {
  case BUF_PGRAD: return &sp->mem_grads;
  case BUF_OPT: return &sp->mem_opt;
  case BUF_RING: return buf_at_cut(sp, id) ? &sp->mem_cross : &sp->mem_stash;
  case BUF_GRING: return is_cut_gradient(sp, id) ? &sp->mem_cross : &sp->mem_stash;
  default: return &sp->mem_cross; /* labels */
  }
}

/* PipeFB: a forward rank lays out only what its forwards touch (and what
 * crosses to the next rank or the loss writes), a backward rank only what
 * its backwards touch; the rest is marked unused. */
static void role_filter(StageProg *sp, int role) {
  enum { BWD = 1000000 };
  for (int i = 0; i < sp->nbufs; i++) {
    Buffer *b = &sp->bufs[i];
    int by_fwd = b->first >= 0 && b->first < BWD, by_bwd = b->last >= BWD;
    int loss = i == sp->loss_buf || i == sp->dloss_buf || b->kind == BUF_LABELS;
    b->unused = 0;
    if (role == ROLE_FWD)
      b->unused = b->kind == BUF_PGRAD || b->kind == BUF_OPT || b->kind == BUF_GRING ||
                  ((b->kind == BUF_TEMP || b->kind == BUF_RING) && !by_fwd && !loss && !buf_at_cut(sp, i));
    else if (role == ROLE_BWD)
      b->unused = b->kind == BUF_LABELS || ((b->kind == BUF_TEMP || b->kind == BUF_RING) && b->first >= 0 && !by_bwd &&
                                            i != sp->dloss_buf);
    if (b->unused) b->offset = -1;
  }
}

/* A buffer's copies: a ring's one per slot, a late value's one per wslot, a gradient ring's one per gslot
 * (in a rank program of chunks, its chunk's ring size), else one. */
static int copies_of(const StageProg *sp, const Buffer *b) {
  if (b->kind == BUF_RING && b->late) return sp->nchunks ? sp->cwslots[b->chunk] : sp->nwslots;
  if (b->kind == BUF_RING) return sp->nchunks ? sp->cslots[b->chunk] : sp->nslots;
  if (b->kind == BUF_GRING) return sp->nchunks ? sp->cgslots[b->chunk] : sp->ngslots;
  return 1;
}

void memplan(Plan *p, StageProg *sp, RingSizes r) { memplan_as(p, sp, r, p->fb && p->role ? p->role[sp->stage] : ROLE_BOTH); }

/* A placed temporary's bytes [lo, hi). */
typedef struct Span {
  int64_t lo, hi;
} Span;
static int by_start(const void *a, const void *b) {
  const Span *x = a, *y = b;
  return (x->lo > y->lo) - (x->lo < y->lo);
}

/* --replicas R: after the weight gradients [grad_lo, off), room for the other R - 1 replicas' copies of
 * this rank's shard of them (replica.c): the region's end. */
static int64_t place_reduce(const Plan *p, StageProg *sp, int64_t off) {
  int R = p->opt.replicas;
  sp->grad_hi = off;
  sp->reduce_base = off, sp->reduce_bytes = 0;
  if (R <= 1 || off == sp->grad_lo) return off;
  int64_t shard = replica_shard_floats(R, sp);
  if (shard * R < (off - sp->grad_lo) / 4) abort(); /* replica_shard_floats counts the region as laid out here */
  sp->reduce_bytes = up((R - 1) * shard * 4);
  sp->mem_grads += sp->reduce_bytes;
  return off + sp->reduce_bytes;
}

/* One layout: sp->hold (or, in a rank of chunks, each chunk's chold) says which. */
static void lay_out(Plan *p, StageProg *sp, RingSizes r, int role) {
  int hold = sp->nchunks ? 0 : sp->hold;
  sp->nslots = hold ? r.hslots : r.slots;
  sp->ngslots = r.gslots;
  sp->nwslots = hold ? 0 : r.wslots;
  sp->mem_weights = sp->mem_grads = sp->mem_opt = sp->mem_stash = sp->mem_cross = sp->mem_temps = 0;
  sp->mem_leaving = sp->mem_store = 0;
  for (int i = 0; i < sp->nbufs; i++) {
    Buffer *b = &sp->bufs[i];
    b->first = b->last = -1, b->late = 0;
    if (b->split_kept) b->kind = BUF_TEMP, b->split_kept = 0, b->fate = b->copy_of ? FATE_KEEP : b->fate;
  }
  if (sched_splits(p->opt.schedule)) mark_late(sp);
  for (int i = 0; i < sp->nfwd; i++) touch(sp, &sp->fwd[i], i);
  for (int i = 0; i < sp->nbwd; i++) touch(sp, &sp->bwd[i], 1000000 + i);
  if (role != ROLE_BOTH) role_filter(sp, role);
  int64_t off = 0;
  static const int order[] = {BUF_PARAM, BUF_PGRAD, BUF_OPT, BUF_RING, BUF_GRING, BUF_LABELS};
  for (size_t o = 0; o < sizeof order / sizeof order[0]; o++) {
    if (order[o] == BUF_PGRAD) sp->grad_lo = off;
    for (int i = 0; i < sp->nbufs; i++) {
      Buffer *b = &sp->bufs[i];
      if (b->kind != order[o] || (b->kind == BUF_RING && b->fate != FATE_KEEP) || b->unused || aliased(sp, b)) continue;
      if (b->in_store) continue; /* in the stage's file (below) */
      b->offset = off;
      int copies = copies_of(sp, b);
      if (b->kind == BUF_PARAM) {
        off += b->bytes;
        continue;
      }
      int64_t next = up(off + b->bytes * copies);
      *share_of(sp, i) += next - off;
      off = next;
    }
    if (order[o] == BUF_PARAM) {
      sp->weights_bytes = off, off = up(off), sp->mem_weights = off;
      /* async: the older weight versions, right after the newest. */
      sp->nwversions = p->opt.schedule == SCHED_ASYNC && off > 0 ? p->opt.staleness : 0;
      sp->poll = p->opt.poll;
      sp->wversion_base = off, sp->wversion_stride = off;
      sp->mem_versions = sp->wversion_stride * sp->nwversions;
      off += sp->mem_versions;
    }
    if (order[o] == BUF_PGRAD) off = place_reduce(p, sp, off);
  }
  /* --offload-optimizer: the state's place in the store, in the same order. */
  sp->opt_store_bytes = 0;
  for (int i = 0; i < sp->nbufs; i++)
    if (sp->bufs[i].in_store && !sp->bufs[i].unused)
      sp->bufs[i].offset = sp->opt_store_bytes, sp->opt_store_bytes = up(sp->opt_store_bytes + sp->bufs[i].bytes);
  /* The leaving values: one block per xslot, the offloaded ones first so
   * that an OFFLOAD is one contiguous copy (then the recomputed ones, then
   * the cut's values in flight). */
  sp->xbase = off, sp->xout = sp->xstride = 0;
  for (int f = FATE_OFFLOAD; f <= FATE_TRANSIT; f++) {
    for (int i = 0; i < sp->nbufs; i++) {
      Buffer *b = &sp->bufs[i];
      if (b->kind != BUF_RING || b->fate != f || aliased(sp, b)) continue;
      b->offset = sp->xbase + sp->xstride;
      sp->xstride = up(sp->xstride + b->bytes);
    }
    if (f == FATE_OFFLOAD) sp->xout = sp->xstride;
  }
  if (!sp->xstride) sp->nxslots = 0;
  off += sp->xstride * sp->nxslots;
  sp->mem_leaving = sp->xstride * sp->nxslots;
  sp->store_base = off;
  off += sp->store_stride * sp->nstore;
  sp->mem_store = sp->store_stride * sp->nstore;
  /* Temporaries by first fit, largest first: each at the lowest offset from `base` where it meets no
   * placed temporary alive at the same time.  Those are swept by offset (a gap before the next one
   * that fits ends the sweep), so a stage of many short-lived temporaries is planned in about
   * n log n, not the n^2 passes of moving past each in turn. */
  /* The backward's two staging copies of the stored gradients first: alive through every backward. */
  int64_t base0 = off, gs = 0;
  for (int i = 0; i < sp->nbufs; i++)
    if (sp->bufs[i].kind == BUF_GSTAGE) sp->bufs[i].offset = off + gs, gs += up(sp->bufs[i].bytes);
  if (sp->grad_out && gs < sp->grad_stage_bytes) gs = sp->grad_stage_bytes; /* planning: not made yet */
  off += gs;
  sp->mem_grads += gs;
  int64_t base = off, end = off;
  int *idx = malloc(sizeof(int) * (size_t)sp->nbufs), nt = 0;
  Span *live = malloc(sizeof(Span) * (size_t)(sp->nbufs ? sp->nbufs : 1));
  if (!idx || !live) abort();
  for (int i = 0; i < sp->nbufs; i++)
    if (sp->bufs[i].kind == BUF_TEMP && !sp->bufs[i].unused) idx[nt++] = i;
  qsort_r(idx, (size_t)nt, sizeof(int), by_size, sp->bufs);
  for (int a = 0; a < nt; a++) {
    Buffer *b = &sp->bufs[idx[a]];
    if (b->first < 0) b->first = b->last = -2; /* never touched: still give it room */
    int nl = 0;
    for (int q = 0; q < a; q++) {
      const Buffer *o = &sp->bufs[idx[q]];
      if (!(b->last < o->first || o->last < b->first)) live[nl++] = (Span){o->offset, o->offset + up(o->bytes)};
    }
    qsort(live, (size_t)nl, sizeof *live, by_start);
    int64_t at = base, size = up(b->bytes);
    for (int k = 0; k < nl && live[k].lo < at + size; k++)
      if (live[k].hi > at) at = live[k].hi;
    b->offset = at;
    if (at + size > end) end = at + size;
  }
  free(live);
  free(idx);
  /* The update's staging blocks: at the region's start, since no temporary is alive during the update. */
  for (int i = 0; i < sp->nbufs; i++)
    if (sp->bufs[i].kind == BUF_OPTSTAGE) sp->bufs[i].offset = base0;
  if (sp->opt_out && base0 + up(sp->opt_stage_bytes) > end) end = base0 + up(sp->opt_stage_bytes);
  sp->arena_bytes = end;
  sp->mem_temps = end - base;
  for (int i = 0; i < sp->nbufs; i++)
    if (aliased(sp, &sp->bufs[i])) sp->bufs[i].offset = sp->bufs[sp->bufs[i].copy_of - 1].offset;
}

/* Whether the program has anything the two layouts place differently: a value a W call reads. */
static int reads_late(const StageProg *sp) {
  for (int i = 0; i < sp->nbwd; i++)
    if (call_is_weight(sp, &sp->bwd[i]) && sp->bwd[i].nreads) return 1;
  return 0;
}

void memplan_keep(Plan *p, StageProg *sp, RingSizes r) { lay_out(p, sp, r, p->fb && p->role ? p->role[sp->stage] : ROLE_BOTH); }

void memplan_as(Plan *p, StageProg *sp, RingSizes r, int role) {
  /* zb1, zbv: the hold layout and the late one, the smaller kept (the hold one when they tie: its copies for W
   * copy nothing).  The late one, the smaller wherever a stage stashes much, is laid out second, so that it
   * usually stands as laid out (this runs for every stage the partitioner prices).  A rank of chunks keeps
   * each chunk's stage's. */
  if (!sched_splits(p->opt.schedule) || sp->nchunks || !reads_late(sp) || p->opt.split_layout != SPLIT_AUTO) {
    sp->hold = sched_splits(p->opt.schedule) && !sp->nchunks && p->opt.split_layout == SPLIT_HOLD;
    lay_out(p, sp, r, role);
    return;
  }
  sp->hold = 1;
  lay_out(p, sp, r, role);
  int64_t hold = sp->arena_bytes;
  sp->hold = 0;
  lay_out(p, sp, r, role);
  if (sp->arena_bytes < hold) return;
  sp->hold = 1;
  lay_out(p, sp, r, role);
}
