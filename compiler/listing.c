/* listing.c - saying what the plan is and why.
 *
 * The text listing is for people: per stage what it holds, what it costs,
 * what it keeps in memory and what crosses its cuts, then the step's
 * predicted time and bubble and the schedule as a time-by-stage table.
 * plan.json carries the same numbers for scripts and tests. */
#include "listing.h"

#include "layout.h"

#include <stdlib.h>

#include "ops/conv.h"
#include "planq.h"
#include "profile.h"
#include "stageprog.h"
#include "spec.h"
#include "stash.h"
#include "timeline.h"

#include <math.h>
#include <string.h>

static const char *node_name(const Plan *p, int k) { return p->g.n[p->node[k]].name; }

/* Stage s that holds compute node k (under pipefb: its forward rank). */
static int stage_of(const Plan *p, int k) {
  for (int s = 0; s < p->opt.nstages; s++)
    if (p->role[s] != ROLE_BWD && p->rbegin[s] <= k && k < p->rend[s]) return s;
  return p->opt.nstages - 1;
}

/* PipeFB: what rank s sends or receives besides its chain's values. */
static void fb_text(const Plan *p, int s, Buf *b) {
  const FbPlan *fb = p->fb;
  int fwd = p->role[s] == ROLE_FWD;
  for (int w = 0; w < 2; w++) {
    const FbMsg *ms = w ? fb->w : fb->stash;
    int n = w ? fb->nw : fb->nstash, any = 0;
    for (int peer = 0; peer < p->opt.nstages; peer++) {
      double bytes = 0;
      int count = 0;
      for (int i = 0; i < n; i++) {
        /* A forward rank sends stash and receives weights; a backward rank the other way round. */
        int out = fwd != w, mine = out ? ms[i].from : ms[i].to, other = out ? ms[i].to : ms[i].from;
        if (mine == s && other == peer) bytes += (double)tensor_bytes(&p->g.t[ms[i].tensor]), count++;
      }
      if (!count) continue;
      const char *what = w ? (fwd ? "weights in" : "weights out") : (fwd ? "stash out" : "stash in");
      buf_printf(b, "  %-12s %d %s, %s %s rank %d%s\n", any ? "" : what, count, w ? (count == 1 ? "weight" : "weights") : (count == 1 ? "value" : "values"),
                 fmt_bytes(bytes), fwd == !w ? "->" : "<-", peer, w ? " after each step's update" : " per micro-batch");
      any = 1;
    }
  }
}

/* The predicted step with every action at its median time (the memory plan's own comparison). */
static double at_medians(const Plan *p) { return p->sched.jitter > 0 ? p->sched.step_time_fixed : p->sched.step_time; }

static double mean_time(const Plan *p) {
  double sum = 0;
  for (int s = 0; s < p->opt.nstages; s++) sum += p->part.cost[s].time;
  return sum / p->opt.nstages;
}

static void json_str(Buf *b, const char *s);

/* The memory plan of stage s (stash.c): each stashed value's fate. */
static const char *fate_name(int f) {
  return f == FATE_OFFLOAD ? "offloaded" : f == FATE_RECOMPUTE ? "recomputed" : f == FATE_TRANSIT ? "in flight" : "kept";
}

/* Bytes of stage s's values of fate f (one copy). */
static int64_t fate_bytes(const StageProg *sp, int f) {
  int64_t n = 0;
  for (int i = 0; i < sp->nbufs; i++)
    if (sp->bufs[i].kind == BUF_RING && sp->bufs[i].fate == f) n += sp->bufs[i].bytes;
  return n;
}

static int plan_moves(const Plan *p, int s) {
  return p->progs && p->plain_arena && (p->progs[s].nxslots || p->progs[s].nstore || p->progs[s].opt_out);
}

static const char *target_text(const Plan *p, int s, char *buf, size_t len) {
  int host = p->host_of ? p->host_of[s] : -1;
  if (!p->progs[s].xout) snprintf(buf, len, "nowhere");
  else if (!stash_offloads(p, s)) snprintf(buf, len, "nowhere: every micro-batch goes straight from its forward to its backward, so they stay in the xslot");
  else if (host >= 0) snprintf(buf, len, "rank %d's memory", host);
  else snprintf(buf, len, "the file %s/pipecc-offload-%d-PID.bin", p->opt.offload_dir ? p->opt.offload_dir : ".", s);
  return buf;
}

/* What a stage of nodes [a, e) holds beside its arena that a memory limit counts: oneDNN's code and
 * descriptors (docs/memory.md: a file offload's io_uring ring, 16-24 KiB measured, is not counted). */
static double beside_arena(const Plan *p, int a, int e) { return plan_lib_bytes(p, a, e); }

static void memory_plan_text(const Plan *p, int s, Buf *b) {
  const StageProg *sp = &p->progs[s];
  const StageCost *c = &p->part.cost[s];
  char where[512];
  if (sp->nxslots) {
    int64_t transit = fate_bytes(sp, FATE_TRANSIT);
    /* (fmt_bytes and fmt_time share 8 rotating buffers: two printfs) */
    buf_printf(b, "  memory plan  %s -> %s under the limit: %d xslot cop%s of %s (%s offloaded to %s, %s recomputed",
               fmt_bytes((double)p->plain_arena[s]), fmt_bytes((double)sp->arena_bytes), sp->nxslots, sp->nxslots == 1 ? "y" : "ies",
               fmt_bytes((double)sp->xstride), fmt_bytes((double)sp->xout), target_text(p, s, where, sizeof where),
               fmt_bytes((double)fate_bytes(sp, FATE_RECOMPUTE)));
    buf_printf(b, "%s%s); predicted per micro-batch: copy out %s, back %s, recompute %s\n", transit ? ", in flight " : "",
               transit ? fmt_bytes((double)transit) : "", fmt_time(c->xfer_out), fmt_time(c->xfer_in), fmt_time(c->recompute));
    for (int i = 0; i < sp->nbufs; i++) {
      const Buffer *x = &sp->bufs[i];
      if (x->kind != BUF_RING || x->fate == FATE_KEEP) continue;
      buf_printf(b, "               %-10s %s %s\n", fate_name(x->fate), fmt_bytes((double)x->bytes), p->g.t[x->tensor].name);
    }
  } else if (sp->nstore) {
    int owner = -1;
    for (int q = 0; p->host_of && q < p->opt.nstages; q++)
      if (p->host_of[q] == s) owner = q;
    buf_printf(b, "  memory plan  %s -> %s: holds stage %d's offloaded activations in %d store slot%s of %s\n",
               fmt_bytes((double)p->plain_arena[s]), fmt_bytes((double)sp->arena_bytes), owner, sp->nstore, sp->nstore == 1 ? "" : "s",
               fmt_bytes((double)sp->store_stride));
  }
  if (sp->nxslots && sp->nstore)
    buf_printf(b, "               and holds another stage's offloaded activations in %d store slot%s of %s\n", sp->nstore,
               sp->nstore == 1 ? "" : "s", fmt_bytes((double)sp->store_stride));
  if (sp->opt_out) {
    int64_t state = 0, grads = 0;
    for (int i = 0; i < sp->nbufs; i++)
      if (sp->bufs[i].in_store) *(sp->bufs[i].kind == BUF_PGRAD ? &grads : &state) += sp->bufs[i].bytes;
    buf_printf(b, "  %s%s -> %s: %s%s%s%s (%s) live%s in the file %s/pipecc-optstate-%d-PID.bin; the update streams "
                  "%s through %s of staging blocks (%lld floats at a time, in the temporaries' region), predicted %s more per step\n",
               sp->nxslots || sp->nstore ? "             " : "memory plan  ", fmt_bytes((double)p->plain_arena[s]),
               fmt_bytes((double)sp->arena_bytes), state ? "the optimizer state" : "", state && grads ? " and " : "",
               grads ? "the weight gradients" : "", "", fmt_bytes((double)sp->opt_store_bytes), state && !grads ? "s" : "",
               p->opt.opt_offload_dir ? p->opt.opt_offload_dir : ".", s, state && grads ? "both" : "it",
               fmt_bytes((double)sp->opt_stage_bytes), (long long)sp->opt_block, fmt_time(c->opt_stream));
    if (grads)
      buf_printf(b, "               each backward brings one weight's gradient at a time into one of two staging copies of %s "
                    "(the next one's read meanwhile) and writes it back: predicted %s more per micro-batch\n",
                 fmt_bytes((double)sp->grad_stage_bytes / 2), fmt_time(c->grad_stream));
  }
}

static void memory_plan_json(const Plan *p, int s, Buf *b) {
  const StageProg *sp = &p->progs[s];
  const StageCost *c = &p->part.cost[s];
  int owner = -1;
  for (int q = 0; p->host_of && q < p->opt.nstages; q++)
    if (p->host_of[q] == s) owner = q;
  buf_printf(b, "     \"memory_plan\": {\"plain_arena_bytes\": %lld, \"arena_bytes\": %lld, \"xslots\": %d, \"xslot_bytes\": %lld, "
                "\"offloaded_bytes\": %lld, \"offload_to\": %s, \"store_slots\": %d, \"store_bytes\": %lld, \"holds_for\": %d, "
                "\"copy_out_s\": %.9g, \"copy_in_s\": %.9g, \"recompute_s\": %.9g, \"optimizer_in_file_bytes\": %lld, "
                "\"optimizer_staging_bytes\": %lld, \"optimizer_stream_s\": %.9g, \"gradients_in_file\": %s, "
                "\"gradient_staging_bytes\": %lld, \"gradient_stream_s\": %.9g, \"values\": [",
             (long long)p->plain_arena[s], (long long)sp->arena_bytes, sp->nxslots, (long long)sp->xstride, (long long)sp->xout,
             !sp->xout || !stash_offloads(p, s) ? "null" : p->host_of && p->host_of[s] >= 0 ? pool_printf((Pool *)&p->g.pool, "%d", p->host_of[s]) : "\"file\"",
             sp->nstore, (long long)sp->store_stride, owner, c->xfer_out, c->xfer_in, c->recompute,
             (long long)(sp->opt_out ? sp->opt_store_bytes : 0), (long long)sp->opt_stage_bytes, sp->opt_out ? c->opt_stream : 0,
             sp->grad_out ? "true" : "false", (long long)sp->grad_stage_bytes, sp->grad_out ? c->grad_stream : 0);
  int first = 1;
  for (int i = 0; i < sp->nbufs; i++) {
    const Buffer *x = &sp->bufs[i];
    if (x->kind != BUF_RING || x->fate == FATE_KEEP) continue;
    buf_printf(b, "%s{\"tensor\": ", first ? "" : ", ");
    json_str(b, p->g.t[x->tensor].name);
    buf_printf(b, ", \"bytes\": %lld, \"fate\": \"%s\"}", (long long)x->bytes, fate_name(x->fate));
    first = 0;
  }
  buf_printf(b, "]},\n");
}

static void stage_text(const Plan *p, int s, Buf *b) {
  int n = p->opt.nstages;
  int a = p->rbegin[s], e = p->rend[s];
  const StageCost *c = &p->part.cost[s];
  double params = 0, ff = 0, bf = 0;
  for (int k = a; k < e; k++) params += p->cost[k].param_count, ff += p->cost[k].fwd_flops, bf += p->cost[k].bwd_flops;
  char rank[48];
  if (p->sched.nchunks > 1) snprintf(rank, sizeof rank, "rank %d, chunk %d", sched_rank_of(&p->sched, s), sched_chunk_of(&p->sched, s));
  else snprintf(rank, sizeof rank, "rank %d", s);
  buf_printf(b, "stage %d (%s%s): nodes %d..%d, %d node%s: %s .. %s\n", s, rank,
             p->role[s] == ROLE_FWD ? ", pipefb forward rank: only their forwards" : p->role[s] == ROLE_BWD ? ", pipefb backward rank: only their backwards" : "",
             a, e - 1, e - a, e - a == 1 ? "" : "s", node_name(p, a), node_name(p, e - 1));
  double pbytes = 0;
  for (int k = a; k < e; k++) pbytes += p->cost[k].param_bytes;
  buf_printf(b, "  parameters   %s (%s)\n", fmt_count(params), fmt_bytes(pbytes));
  buf_printf(b, "  FLOPs        %s forward, %s backward per micro-batch\n", fmt_count(ff), fmt_count(bf));
  buf_printf(b, "  predicted    forward %s + backward %s + communication %s = %s per micro-batch (%.2fx the mean)\n",
             fmt_time(c->fwd), fmt_time(c->bwd), fmt_time(c->comm), fmt_time(c->time), c->time / mean_time(p));
  if (p->costs && p->costs->src) {
    int hit = 0, probed = 0;
    for (int k = a; k < e; k++) hit += p->costs->src[k] == 1, probed += p->costs->src[k] == 2;
    if (p->costs->nprobed)
      buf_printf(b, "  costs        %d of %d nodes from the kernel cache, %d from the op probe, %d from the FLOP model\n", hit, e - a, probed,
                 e - a - hit - probed);
    else
      buf_printf(b, "  costs        %d of %d nodes from the kernel cache, %d from the FLOP model\n", hit, e - a, e - a - hit);
  }
  /* The memory plan's xslot copies and a peer's store are parts of the arena too (memplan.c). */
  const StageProg *mp = p->progs && !p->rprogs ? &p->progs[s] : NULL;
  const char *more = !mp || !(mp->mem_leaving + mp->mem_store) ? ""
      : pool_printf((Pool *)&p->g.pool, "%s%s%s%s", mp->mem_leaving ? " + leaving values' xslots " : "",
                    mp->mem_leaving ? fmt_bytes((double)mp->mem_leaving) : "", mp->mem_store ? " + a peer's store " : "",
                    mp->mem_store ? fmt_bytes((double)mp->mem_store) : "");
  /* zb1, zbv: the stage's layout (memplan.c): the ring held until W, or until I with what W reads as late values. */
  int hold = p->sched.hold && p->sched.hold[s];
  const char *late = !sched_splits(p->opt.schedule) || p->opt.forward_only ? ""
      : hold ? " held until W"
             : pool_printf((Pool *)&p->g.pool, " until I, %d late cop%s of what W reads", c->wcopies, c->wcopies == 1 ? "y" : "ies");
  buf_printf(b, "  memory       %s (%.0f bytes) = weights %s + grads %s + optimizer %s + %s %s + crossing values %s + "
                "temporaries %s%s (%d ring cop%s%s, %d micro-batch%s in flight)\n",
             fmt_bytes(c->mem_total), c->mem_total, fmt_bytes(c->mem_params), fmt_bytes(c->mem_grads), fmt_bytes(c->mem_opt),
             p->role[s] == ROLE_FWD ? "stash on its way to the backward ranks" : "kept for backward", fmt_bytes(c->mem_stash), fmt_bytes(c->mem_recv), fmt_bytes(c->mem_work), more, c->copies, c->copies == 1 ? "y" : "ies",
             late, c->inflight, c->inflight == 1 ? "" : "es");
  if (c->mem_versions > 0)
    buf_printf(b, "  versions     + %s: %d older cop%s of the weights region for the steps still computing on them (async)\n",
               fmt_bytes(c->mem_versions), p->sched.staleness, p->sched.staleness == 1 ? "y" : "ies");
  if (plan_moves(p, s)) memory_plan_text(p, s, b);
  if (p->fb) fb_text(p, s, b);
  for (int pass = 0; pass < 2 && p->role[s] != ROLE_BWD; pass++) {
    int cut = pass ? e : a, any = 0;
    for (int q = 0; q < p->nedges; q++) {
      const PartEdge *ed = &p->edges[q];
      if (!(ed->from < cut && cut <= ed->to)) continue;
      const Tensor *t = &p->g.t[p->edge_tensor[q]];
      /* Where the value comes from or goes to, and the rank it travels from or
       * to on its route (a relaying one, or with direct sends the next reader). */
      char peer[96];
      int end = pass ? (ed->to >= p->N ? -2 : stage_of(p, ed->to)) : (ed->from < 0 ? -1 : stage_of(p, ed->from));
      int from = pass ? s - 1 : s + 1, to = from;
      if (p->fb) from = s - 1, to = s + 1;
      else plan_route(p, q, s, &from, &to);
      int next = pass ? to : from;
      if (!p->fb && next < 0 && !(pass ? end == -2 && s == n - 1 : end == -1 && s == 0)) continue; /* skipped: not on its route */
      if (p->fb) next = pass ? s + 1 : s - 1;
      const char *who = end == -1 ? "the data loader" : end == -2 ? "the loss" : NULL;
      if (who && (next < 0 || next >= n)) snprintf(peer, sizeof peer, "%s", who);
      else if (who) snprintf(peer, sizeof peer, "%s via stage %d", who, next);
      else if (end == next) snprintf(peer, sizeof peer, "stage %d", end);
      else snprintf(peer, sizeof peer, "stage %d via stage %d", end, next);
      buf_printf(b, "  %-12s %s %s%s %s %s %s\n", any ? "" : pass ? "sends" : "receives", t->name, dtype_name(t->dtype),
                 shape_str(t), fmt_bytes(ed->bytes), pass ? "->" : "<-", peer);
      any = 1;
    }
    if (!any) buf_printf(b, "  %-12s nothing\n", pass ? "sends" : "receives");
  }
}

/* The messages stage s's program posts for one micro-batch, as its spec has them: each value with the
 * rank it comes from or goes to and its tag (its number among the values between the two ranks). */
static void spec_messages_json(const StageSpec *sp, Buf *b) {
  for (int dir = 0; dir < 2; dir++) {
    const SpecValue *v = dir ? sp->send : sp->recv;
    int n = dir ? sp->nsend : sp->nrecv;
    buf_printf(b, dir ? ", \"send\": [" : ",\n     \"messages\": {\"recv\": [");
    for (int i = 0; i < n; i++) {
      buf_printf(b, "%s{\"value\": ", i ? ", " : "");
      json_str(b, v[i].name);
      buf_printf(b, ", \"%s\": %d, \"tag\": %d, \"bytes\": %lld}", dir ? "to" : "from", v[i].peer, v[i].tag, (long long)v[i].bytes);
    }
    buf_printf(b, "]");
  }
  buf_printf(b, "}");
}

/* "stages 0 and 3": the stages rank r runs, its chunks in order. */
static void rank_stages_text(const Plan *p, int r, Buf *b) {
  int st[TL_MAX_CHUNKS], v = p->sched.nchunks < TL_MAX_CHUNKS ? p->sched.nchunks : TL_MAX_CHUNKS;
  for (int c = 0; c < v; c++) st[c] = sched_stage(&p->sched, r, c);
  buf_printf(b, "stage%s ", v == 1 ? "" : "s");
  timeline_stage_list(b, st, v);
}

/* With chunks: the table's columns are ranks, and what "@c" says and which stages each rank's chunks are. */
static void chunks_legend(const Plan *p, Buf *b) {
  int n = opt_ranks(&p->opt);
  buf_printf(b, "  a column per rank, which runs its chunks' stages: F<k>@c = F<k> of its chunk c (no @: chunk 0);");
  for (int r = 0; r < n; r++) {
    buf_printf(b, "%s rank %d runs ", r % 3 ? ";" : r ? ";\n   " : "\n   ", r);
    rank_stages_text(p, r, b);
  }
  buf_printf(b, "\n");
}

static void schedule_table(const Plan *p, Buf *b) {
  const Schedule *u = &p->slots;
  int slots = (int)lround(u->step_time), chunked = u->nchunks > 1;
  if (u->unroll > 0) /* async: the whole unrolled run, fill and drain included */
    for (int s = 0; s < u->nstages; s++)
      if (u->nact[s]) slots = (int)fmax(slots, lround(u->act[s][u->nact[s] - 1].end));
  buf_printf(b, "\nschedule (%s, %d micro-batches; one slot per unit of time, F<k>/B<k> = forward/backward of micro-batch k%s)\n",
             schedule_name(p->opt.schedule), p->opt.microbatches,
             sched_splits(p->opt.schedule) ? ", I<k>/W<k> = its input-/weight-gradient halves"
             : u->unroll > 0 ? pool_printf((Pool *)&p->g.pool, ";\n  the run's micro-batches over %d steps, k = step * %d + i; U = that rank's update", u->unroll, p->opt.microbatches) : "");
  if (chunked) chunks_legend(p, b);
  buf_printf(b, "  slot |");
  for (int s = 0; s < u->nstages; s++) buf_printf(b, chunked ? " rank %-4d|" : " stage %-3d|", s);
  buf_printf(b, "\n  -----+");
  for (int s = 0; s < u->nstages; s++) buf_printf(b, "----------+");
  buf_printf(b, "\n");
  for (int t = 0; t < slots; t++) {
    buf_printf(b, "  %4d |", t);
    for (int s = 0; s < u->nstages; s++) {
      char cell[16] = "";
      for (int k = 0; k < u->nact[s]; k++)
        if (action_is_compute(u->act[s][k].kind) && lround(u->act[s][k].start) == t) action_str(&u->act[s][k], cell, sizeof cell);
        else if (u->unroll > 0 && u->act[s][k].kind == ACT_UPDATE && lround(u->act[s][k].start) == t && !cell[0]) snprintf(cell, sizeof cell, "U");
      buf_printf(b, " %-9s|", cell);
    }
    buf_printf(b, "\n");
  }
}

/* Each rank's whole list as the runtime executes it, with its ring copies. */
static void action_lists(const Plan *p, Buf *b) {
  const Schedule *u = &p->sched;
  int async = u->unroll > 0;
  if (async)
    buf_printf(b, "\nactions per rank (step t's body, in order, run for t = -%d .. the last step; k = micro-batch t * %d + k of\n"
                  "  the run, k >= %d a later step's, skipped outside the run; [k] / {k} = forward / gradient ring slot at t = 0,\n"
                  "  the run's micro-batch modulo the ring's size)\n", u->lookahead, p->opt.microbatches, p->opt.microbatches);
  else
    buf_printf(b, "\nactions per rank (one step, in order; [k] = forward ring slot, {k} = gradient ring slot%s)\n",
               sched_splits(u->kind) ? ", <k> = late-value slot (what W reads of the forward, F to W)" : "");
  if (u->nchunks > 1) buf_printf(b, "  @c = of the rank's chunk c; each chunk has rings of its own, its stage's\n");
  for (int s = 0; s < u->nstages; s++) {
    buf_printf(b, "  rank %d (", s);
    for (int c = 0; c < (u->nchunks > 1 ? u->nchunks : 1); c++) {
      int st = sched_stage(u, s, c); /* the ring sizes are per stage: a rank's chunk has its stage's */
      if (u->nchunks > 1) buf_printf(b, "%schunk %d, stage %d: ", c ? "; " : "", c, st);
      buf_printf(b, "%d slot%s, %d gslot%s", u->nslots[st], u->nslots[st] == 1 ? "" : "s", u->ngslots[st], u->ngslots[st] == 1 ? "" : "s");
      if (u->nwslots && u->nwslots[st]) buf_printf(b, ", %d wslot%s", u->nwslots[st], u->nwslots[st] == 1 ? "" : "s");
    }
    buf_printf(b, "):");
    for (int k = 0; k < (async ? u->nbody[s] : u->nact[s]); k++) {
      const Action *a = async ? &u->body[s][k] : &u->act[s][k];
      char name[32];
      if (k % 12 == 0) buf_printf(b, "\n   ");
      buf_printf(b, " %s", action_str(a, name, sizeof name));
      if (a->slot >= 0) buf_printf(b, "[%d]", a->slot);
      if (a->gslot >= 0) buf_printf(b, "{%d}", a->gslot);
      if (a->wslot >= 0) buf_printf(b, "<%d>", a->wslot);
    }
    buf_printf(b, "\n");
  }
}

/* Weights several nodes read: where each copy lives and what it costs. */
static void tie_text(const Plan *p, Buf *b) {
  const Graph *g = &p->g;
  int *ks = malloc(sizeof(int) * (size_t)(p->N + 1)), head = 0;
  for (int t = 0; t < g->nt; t++) {
    if (!g->t[t].is_param || p->nreaders[t] < 2) continue;
    int same, nk = plan_tie_readers(p, t, ks, &same);
    if (!head++) buf_printf(b, "\ntied weights (read by several nodes: each stage holding a reader keeps a copy; every step the\n"
                               "  holders exchange each reader's part of the gradient and sum them in graph order)\n");
    buf_printf(b, "  '%s' (%s) read by %d nodes:", g->t[t].name, fmt_bytes((double)tensor_bytes(&g->t[t])), nk);
    int holders = 0, last = -1;
    for (int j = 0; j < nk; j++) {
      int s = stage_of(p, ks[j]);
      buf_printf(b, "%s '%s' (%s, stage %d)", j ? "," : "", node_name(p, ks[j]), g->n[p->node[ks[j]]].op, s);
      holders += s != last, last = s;
    }
    buf_printf(b, "\n    copies on %d stage%s", holders, holders == 1 ? "" : "s");
    if (holders > 1) buf_printf(b, "; %s of gradient parts sent per step", fmt_bytes((double)tensor_bytes(&g->t[t]) * (nk - 1) * holders / nk));
    buf_printf(b, "\n");
    if (same)
      buf_printf(b, "    warning: nodes of the same kind share it - an exporter merges initializers with equal values (torch.onnx\n"
                    "      in eval mode with constant folding), which ties weights the model meant to keep apart; re-export with\n"
                    "      training=torch.onnx.TrainingMode.TRAINING or do_constant_folding=False, or compile with --untie\n");
  }
  free(ks);
}

/* Why float initializer x is a constant rather than a trained weight (NULL: it is trained), in buf.  read: a
 * compute node reads it. */
static const char *kept_why(const Tensor *x, int read, char *buf, size_t len) {
  if (x->is_param) return NULL;
  int64_t i = x->kept_const == KEPT_NONFINITE ? const_first_nonfinite(x) : -1;
  double v = i >= 0 ? const_f64(x, i) : 0;
  if (x->kept_const == KEPT_DECLARED) snprintf(buf, len, "declared by --constant");
  else if (i >= 0) snprintf(buf, len, "holds %s at element %lld: not finite, never a weight", v != v ? "NaN" : v > 0 ? "+inf" : "-inf", (long long)i);
  else if (x->kept_const == KEPT_FROZEN) snprintf(buf, len, "frozen (--frozen)");
  else if (x->dtype != DT_FLOAT) snprintf(buf, len, "%s: pipecc trains float32 weights only", dtype_name(x->dtype));
  else if (ir_numel(x) <= 1) snprintf(buf, len, "a scalar: pipecc trains no scalars");
  else if (!read) snprintf(buf, len, "not read at run time (folded into the constants it makes, or unused)");
  else snprintf(buf, len, "no gradient reaches it");
  return buf;
}

/* Per tensor, the first and last stage holding a compute node that reads it (-1: none); free both. */
static void reader_stages(const Plan *p, int **first, int **last) {
  const Graph *g = &p->g;
  *first = malloc(sizeof(int) * (size_t)(g->nt + 1)), *last = malloc(sizeof(int) * (size_t)(g->nt + 1));
  if (!*first || !*last) abort();
  for (int t = 0; t < g->nt; t++) (*first)[t] = (*last)[t] = -1;
  for (int k = 0; k < p->N; k++) {
    const Node *nd = &g->n[p->node[k]];
    int s = stage_of(p, k);
    for (int q = 0; q < nd->nin; q++) {
      int t = nd->in[q];
      if (t < 0) continue;
      if ((*first)[t] < 0 || s < (*first)[t]) (*first)[t] = s;
      if (s > (*last)[t]) (*last)[t] = s;
    }
  }
}

/* Which initializers train and which are constants, and why: each float one, and a count of the others. */
static void initializers_text(const Plan *p, Buf *b) {
  const Graph *g = &p->g;
  int *first, *last, trained = 0, kept = 0, ints = 0;
  reader_stages(p, &first, &last);
  for (int t = 0; t < g->nt; t++)
    if (g->t[t].is_initializer) dtype_is_float(g->t[t].dtype) ? (g->t[t].is_param ? trained++ : kept++) : ints++;
  buf_printf(b, "\ninitializers: %d trained (the optimizer updates them), %d constant%s\n", trained, kept, kept == 1 ? "" : "s");
  for (int t = 0; t < g->nt; t++) {
    const Tensor *x = &g->t[t];
    if (!x->is_initializer || !dtype_is_float(x->dtype)) continue;
    char why[160];
    const char *w = kept_why(x, first[t] >= 0, why, sizeof why);
    buf_printf(b, "  %-9s '%s' %s %s", w ? "constant" : "trained", x->name, shape_str(x), dtype_name(x->dtype));
    if (first[t] >= 0 && first[t] == last[t]) buf_printf(b, ", stage %d", first[t]);
    else if (first[t] >= 0) buf_printf(b, ", stages %d..%d", first[t], last[t]);
    buf_printf(b, "%s%s\n", w ? ": " : "", w ? w : "");
  }
  if (ints) buf_printf(b, "  and %d integer initializer%s (shapes, axes, indices): constants\n", ints, ints == 1 ? "" : "s");
  free(first), free(last);
}

/* The kinds of fused node in the plan (fuse.c's Node.fusion) and how many of each, in first-seen order.
 * Returns the number of kinds. */
#define MAX_FUSION_KINDS 16
static int fusion_kinds(const Plan *p, const char **kind, int *count) {
  int nk = 0;
  for (int k = 0; k < p->N; k++) {
    const char *f = p->g.n[p->node[k]].fusion;
    if (!f) continue;
    int i = 0;
    while (i < nk && strcmp(kind[i], f)) i++;
    if (i == nk) {
      if (nk == MAX_FUSION_KINDS) continue;
      kind[nk] = f, count[nk++] = 0;
    }
    count[i]++;
  }
  return nk;
}

/* --frozen: which layers, and where the backward starts. */
/* --replicas: a stage's weight gradients (bytes) and the buckets they are summed in (0 before the programs). */
static double replica_grads(const Plan *p, int s, int *nbuckets) {
  *nbuckets = 0;
  if (p->progs && !p->rprogs) {
    *nbuckets = p->progs[s].nbuckets;
    return (double)(p->progs[s].grad_hi - p->progs[s].grad_lo);
  }
  return p->part.cost[s].mem_grads / (1 + p->prob.reduce_share);
}

/* --replicas: the layout, and each stage's sum over the replicas. */
static void replicas_text(const Plan *p, Buf *b) {
  int R = p->opt.replicas, n = p->opt.nstages;
  buf_printf(b, "  batch        %lld samples per step = %d replicas x %d micro-batches x %lld\n", (long long)p->batch, R,
             p->opt.microbatches, (long long)p->mb_size);
  buf_printf(b, "  replicas     %d replicas of the %d-stage pipeline on %d ranks (world rank k x %d + s runs stage s of replica k;\n"
                "               run.sh --hostfile H: mpirun fills each host's slots in that order, so hosts of a multiple of %d\n"
                "               slots hold whole replicas and only the sums below cross hosts);\n"
                "               each stage's weight gradients are summed over its %d ranks in replica order before the update,\n"
                "               bucket by bucket from the last backward on (REDUCE, REDUCE_WAIT):\n", R, n, n * R, n, n, R);
  if (p->opt.zero)
    buf_printf(b, "               --zero 1: the optimizer state is sharded over the replicas: each keeps and updates its 1/%d of\n"
                  "               the region's elements (ZERO_M1, ZERO_M2) and sends the new weights to the others\n", R);
  for (int s = 0; s < n; s++) {
    int nb;
    double bytes = replica_grads(p, s, &nb);
    const StageCost *c = &p->part.cost[s];
    double room = p->progs && !p->rprogs ? (double)p->progs[s].reduce_bytes : bytes * p->prob.reduce_share;
    buf_printf(b, "               stage %d: %s of gradients%s (and %s for the other replicas' copies of its shard, in its grads),\n"
                  "                 summed in %s, %s of it not hidden\n", s, fmt_bytes(bytes),
               nb ? pool_printf((Pool *)&p->g.pool, " in %d bucket%s", nb, nb == 1 ? "" : "s") : "", fmt_bytes(room),
               fmt_time(c->reduce_total), fmt_time(c->reduce));
  }
}

static void replicas_json(const Plan *p, Buf *b) {
  buf_printf(b, "  \"replicas\": %d,\n  \"replica_batch\": %lld,\n  \"replica_sums\": [", p->opt.replicas,
             (long long)(p->batch / p->opt.replicas));
  for (int s = 0; s < p->opt.nstages; s++) {
    int nb;
    double bytes = replica_grads(p, s, &nb);
    buf_printf(b, "%s{\"stage\": %d, \"gradient_bytes\": %.0f, \"buckets\": %d, \"sum_s\": %.9g, \"exposed_s\": %.9g}", s ? ", " : "", s,
               bytes, nb, p->part.cost[s].reduce_total, p->part.cost[s].reduce);
  }
  buf_printf(b, "],\n");
}

static void frozen_text(const Plan *p, Buf *b) {
  const Graph *g = &p->g;
  const char *need = plan_needs((Plan *)p);
  int first = -1; /* the first compute node with a backward */
  for (int k = 0; k < p->N && first < 0; k++)
    for (int q = 0; q < g->n[p->node[k]].nout; q++)
      if (g->n[p->node[k]].out[q] >= 0 && need[g->n[p->node[k]].out[q]]) first = k;
  buf_printf(b, "  frozen       %d of %d parameterised layers (--frozen %s)", p->nfrozen, p->nlayers, p->opt.frozen);
  if (p->nfrozen)
    buf_printf(b, ": %s .. %s; their %d weight%s are constants (no gradient, no optimizer state)", g->n[p->frozen_layers[0]].name,
               g->n[p->frozen_layers[p->nfrozen - 1]].name, p->frozen_params, p->frozen_params == 1 ? "" : "s");
  buf_printf(b, "\n");
  if (first > 0) buf_printf(b, "               no backward (nor its stash) before node %d (%s)\n", first, node_name(p, first));
}

/* The machine the plan is for: rates, link, and how ranks share its cores. */
static void machine_text(const Plan *p, Buf *b) {
  const Machine *m = &p->machine;
  int n = opt_ranks(&p->opt); /* ranks, not stages: with --chunks a rank runs several */
  buf_printf(b, "  machine      %s\n", m->source);
  buf_printf(b, "               rank 0: %.1f GFLOP/s%s; link 0: %.2f GB/s, %.1f us; memory copies %.1f GB/s\n", m->dev[0].flops / 1e9,
             m->dev[0].mem_bytes > 0 ? "" : ", memory unlimited", n > 1 ? m->link[0].bandwidth / 1e9 : 0,
             n > 1 ? m->link[0].latency * 1e6 : 0, m->memcpy_bw / 1e9);
  if (m->cores > 0 && n > m->cores && p->sched.core_of) {
    buf_printf(b, "               %d ranks share %d cores, each rank pinned to one (the runtime; run.sh --no-pin leaves them):", n,
               m->cores);
    for (int c = 0; c < m->cores; c++) {
      buf_printf(b, "%s core %d: rank", c ? ";" : "", c);
      for (int s = 0, k = 0; s < n; s++)
        if (p->sched.core_of[s] == c) buf_printf(b, "%s %d", k++ ? "," : "", s);
    }
    buf_printf(b, "\n               (the pairing whose simulated step is shortest: a core runs one action at a time)\n");
  } else if (m->cores > 0 && p->opt.threads > 1) {
    int groups = plan_core_groups(p);
    buf_printf(b, "               each rank computes on %d threads (--threads): %d ranks of %d threads on %d cores%s\n", p->opt.threads, n,
               p->opt.threads, m->cores, n > groups ? ", which they share (the step's simulation)" : "");
  } else if (m->cores > 0 && n > m->cores) {
    buf_printf(b, "               %d ranks share %d cores: ranks computing at once share them (the step's simulation)\n", n, m->cores);
  } else if (p->opt.threads > 1) {
    buf_printf(b, "               each rank computes on %d threads (--threads)\n", p->opt.threads);
  }
}

/* Where the node costs come from: a profile, the kernel cache, or the FLOP model. */
static void costs_text(const Plan *p, Buf *b) {
  if (p->costs && p->costs->path) {
    const Costs *c = p->costs;
    buf_printf(b, "  node costs   measured: --costs %s (at micro-batch %lld%s, on %.1f GFLOP/s)\n", c->path, (long long)c->profile_mb,
               c->profile_mb == p->mb_size ? "" : ", scaled linearly", c->rate / 1e9);
    if (c->conv_mismatch)
      buf_printf(b, "               its convolutions ran %s, this plan's run %s: theirs are the FLOP model's (and not merged)\n",
                 c->conv == 2 ? "through oneDNN" : "as im2col + GEMM", c->conv == 2 ? "as im2col + GEMM" : "through oneDNN");
    if (c->merged) buf_printf(b, "               merged into the kernel cache %s (%d node times)\n", c->cache_path, c->merged);
    else if (c->merge_note) buf_printf(b, "               not merged into the kernel cache: %s\n", c->merge_note);
  } else if (p->costs && p->costs->nprobed) {
    const Costs *c = p->costs;
    buf_printf(b, "  node costs   %d of %d nodes from the kernel cache%s%s, %d from the op probe's grid %s (interpolated), %d from\n"
                  "               the FLOP model; the loader, the loss and the update: %d of 3 from the cache, %d from the op\n"
                  "               probe (measure them: pipecc-probe --kernels MODEL, or --costs FILE)\n",
               c->ncached, p->N, c->cache_path ? " " : "", c->cache_path ? c->cache_path : "", c->nprobed, c->ops_path,
               p->N - c->ncached - c->nprobed, c->aux, c->aux_probed);
  } else if (p->costs) {
    const Costs *c = p->costs;
    buf_printf(b, "  node costs   %d of %d nodes from the kernel cache %s, %d from the FLOP model; the loader, the loss and\n"
                  "               the update: %d of 3 from the cache (fill it: pipecc-probe --kernels MODEL, or --costs FILE)\n",
               c->ncached, p->N, c->cache_path, p->N - c->ncached, c->aux);
  } else
    buf_printf(b, "  node costs   FLOPs over the rate above and memory traffic over memory copies (measure them: --profile, --costs)\n");
}

/* A candidate's name: its schedule's, with its chunks when it has several. */
static const char *auto_name(const SchedCand *c) {
  static char buf[4][48];
  static int k;
  char *b = buf[k++ % 4];
  if (c->chunks > 1) snprintf(b, sizeof buf[0], "%s x%d", schedule_name(c->kind), c->chunks);
  else snprintf(b, sizeof buf[0], "%s", schedule_name(c->kind));
  return b;
}

/* --schedule auto: what each schedule's plan predicted, and which was kept. */
static void auto_text(const Plan *p, Buf *b) {
  if (!p->opt.ncands) return;
  buf_printf(b, "  schedule     auto: %s, the fastest predicted step of the schedules that plan (within 0.5%%: the smallest\n"
                "               busiest arena); each planned in full:\n", schedule_name(p->opt.schedule));
  for (int k = 0; k < p->opt.ncands; k++) {
    const SchedCand *c = &p->opt.cands[k];
    if (c->fits)
      buf_printf(b, "                 %-14s %s per step, %.1f%% bubble, busiest arena %s%s\n", auto_name(c), fmt_time(c->step),
                 100 * c->bubble, c->peak >= 0 ? fmt_bytes((double)c->peak) : "(not built: --plan-only)",
                 c->kind == p->opt.schedule && (c->chunks > 1 ? c->chunks : 1) == p->opt.chunks ? "  <- kept" : "");
    else
      buf_printf(b, "                 %-14s does not plan: %.200s\n", auto_name(c), c->why);
  }
}

/* --ranks P: every layout compared, and why the kept one won. */
static void layout_text(const Plan *p, Buf *b) {
  const Options *o = &p->opt;
  if (!o->nlayouts) return;
  const LayoutCand *k = &o->layouts[o->layout_kept];
  int next = -1;
  for (int i = 0; i < o->nlayouts; i++)
    if (i != o->layout_kept && o->layouts[i].c.fits && (next < 0 || o->layouts[i].c.step < o->layouts[next].c.step)) next = i;
  buf_printf(b, "  layout       --ranks %d: %d stage%s x %d replica%s, %s; every S x R = %d planned in full, the fastest predicted\n"
                "               step that fits kept (within 0.5%%: the smallest busiest arena); all train the same batch:\n",
             o->ranks, k->stages, k->stages == 1 ? "" : "s", k->replicas, k->replicas == 1 ? "" : "s", schedule_name(k->c.kind), o->ranks);
  for (int i = 0; i < o->nlayouts; i++) {
    const LayoutCand *L = &o->layouts[i];
    char name[48];
    snprintf(name, sizeof name, "%d x %d %s%s", L->stages, L->replicas, schedule_name(L->c.kind), L->zero ? " zero" : "");
    if (L->c.fits)
      buf_printf(b, "                 %-16s %s per step, %.1f%% bubble, busiest arena %s%s\n", name, fmt_time(L->c.step), 100 * L->c.bubble,
                 L->c.peak >= 0 ? fmt_bytes((double)L->c.peak) : "(not built: --plan-only)", i == o->layout_kept ? "  <- kept" : "");
    else
      buf_printf(b, "                 %-16s does not plan: %.200s\n", name, L->c.why);
  }
  if (next >= 0)
    buf_printf(b, "               kept: predicted %.2fx the step of the next best (%d x %d %s)%s\n", k->c.step / o->layouts[next].c.step,
               o->layouts[next].stages, o->layouts[next].replicas, schedule_name(o->layouts[next].c.kind),
               k->c.step > o->layouts[next].c.step ? ", as fast within 0.5% and leaner" : "");
}

static void layout_json(const Plan *p, Buf *b) {
  const Options *o = &p->opt;
  if (!o->nlayouts) return;
  buf_printf(b, "  \"ranks\": %d,\n  \"layouts\": [", o->ranks);
  for (int i = 0; i < o->nlayouts; i++) {
    const LayoutCand *L = &o->layouts[i];
    buf_printf(b, "%s\n    {\"stages\": %d, \"replicas\": %d, \"schedule\": \"%s\", \"zero\": %d, \"plans\": %s, ", i ? "," : "", L->stages,
               L->replicas, schedule_name(L->c.kind), L->zero, L->c.fits ? "true" : "false");
    if (L->c.fits)
      buf_printf(b, "\"predicted_step_time_s\": %.9g, \"bubble\": %.6f, \"busiest_arena_bytes\": %lld, \"kept\": %s}", L->c.step, L->c.bubble,
                 (long long)L->c.peak, i == o->layout_kept ? "true" : "false");
    else {
      buf_printf(b, "\"why\": ");
      json_str(b, L->c.why);
      buf_printf(b, "}");
    }
  }
  buf_printf(b, "\n  ],\n");
}

/* plan.json's "schedule_auto": each candidate's figures, or why it did not plan. */
static void auto_json(const Plan *p, Buf *b) {
  if (!p->opt.ncands) return;
  buf_printf(b, "  \"schedule_auto\": [");
  for (int k = 0; k < p->opt.ncands; k++) {
    const SchedCand *c = &p->opt.cands[k];
    buf_printf(b, "%s\n    {\"schedule\": \"%s\", \"chunks\": %d, \"plans\": %s, ", k ? "," : "", schedule_name(c->kind), c->chunks > 1 ? c->chunks : 1,
               c->fits ? "true" : "false");
    if (c->fits)
      buf_printf(b, "\"predicted_step_time_s\": %.9g, \"bubble\": %.6f, \"busiest_arena_bytes\": %lld, \"kept\": %s}", c->step, c->bubble,
                 (long long)c->peak, c->kind == p->opt.schedule && (c->chunks > 1 ? c->chunks : 1) == p->opt.chunks ? "true" : "false");
    else {
      buf_printf(b, "\"why\": ");
      json_str(b, c->why);
      buf_printf(b, "}");
    }
  }
  buf_printf(b, "\n  ],\n");
}

/* With chunks the memory a rank has is its program's arena, its chunks' stage programs joined (chunks.c):
 * each stage's weights, gradients, optimizer state and rings side by side, one region of temporaries
 * they share, since the rank runs one chunk's action at a time. */
static void rank_memory_text(const Plan *p, Buf *b) {
  buf_printf(b, "\nmemory: each rank's arena, exactly: its static buffer ARENA_BYTES in stage_<r>.c, which holds everything its\n"
                "        chunks keep (weights, constants, gradients, optimizer state, rings, temporaries); the runtime adds only\n"
                "        its per-rank bookkeeping (MPI requests, one micro-batch of loader input) and the data set.  A rank's\n"
                "        arena is its chunks' programs joined: each stage's weights, gradients, optimizer state and rings side by\n"
                "        side, the temporaries one region they share (a rank runs one chunk's action at a time).  The stages'\n"
                "        memory above is each stage's own arena, as if it had a rank; --mem-limit is decided against the ranks'.\n");
  for (int r = 0; r < opt_ranks(&p->opt); r++) {
    const StageProg *sp = &p->rprogs[r];
    int64_t rest = sp->arena_bytes - (sp->mem_weights + sp->mem_grads + sp->mem_opt + sp->mem_stash + sp->mem_cross + sp->mem_temps);
    buf_printf(b, "  rank %d (", r);
    rank_stages_text(p, r, b);
    buf_printf(b, "): %s (%lld bytes) = weights %s + grads %s + optimizer %s + kept for backward %s + crossing values %s + temporaries %s",
               fmt_bytes((double)sp->arena_bytes), (long long)sp->arena_bytes, fmt_bytes((double)sp->mem_weights),
               fmt_bytes((double)sp->mem_grads), fmt_bytes((double)sp->mem_opt), fmt_bytes((double)sp->mem_stash),
               fmt_bytes((double)sp->mem_cross), fmt_bytes((double)sp->mem_temps));
    if (rest) buf_printf(b, " + other %s", fmt_bytes((double)rest)); /* weight versions, leaving values, a peer's store */
    buf_printf(b, "\n");
  }
}

/* The bubble a balanced pipeline of this schedule leaves: (p-1)/(m+p-1) over p stages; interleaved over n
 * ranks of V chunks (n-1)/(V m + n-1), its fill and drain a chunk's time; zbv has no formula here: the
 * unit-time lists' own (every forward and backward half one unit). */
static double ideal_bubble(const Plan *p) {
  int n = opt_ranks(&p->opt), m = p->opt.microbatches, v = p->sched.nchunks;
  if (v > 1 && p->opt.schedule == SCHED_ZBV) return p->slots.bubble;
  if (v > 1) return (double)(n - 1) / (double)(v * m + n - 1);
  return schedule_ideal_bubble(p->opt.nstages, m);
}

/* The step: predicted time, bubble, imbalance, and why the cuts are where they are. */
static void step_text(const Plan *p, Buf *b) {
  int n = p->opt.nstages;
  double mx = 0, mn = INFINITY;
  int slow = 0;
  for (int s = 0; s < n; s++) {
    if (p->part.cost[s].time > mx) mx = p->part.cost[s].time, slow = s;
    mn = fmin(mn, p->part.cost[s].time);
  }
  buf_printf(b, "\nstep\n");
  if (p->plain_arena && p->plain_step > 0 && fabs(p->sched.step_time - p->plain_step) > 1e-12)
    buf_printf(b, "  memory plan  %s per step without it, %s with it (%+.1f%%): the copies and recomputation that compute does not hide\n",
               fmt_time(p->plain_step), fmt_time(at_medians(p)), 100 * (at_medians(p) / p->plain_step - 1));
  buf_printf(b, "  predicted    %s per step, %.1f samples/s\n", fmt_time(p->sched.step_time), (double)p->batch / p->sched.step_time);
  auto_text(p, b);
  layout_text(p, b);
  if (p->sched.core_of && p->sched.step_unpinned > 0)
    buf_printf(b, "               with ranks pinned as above; unpinned (run.sh --no-pin), about %s (the ranks computing at once share "
                  "the cores)\n", fmt_time(p->sched.step_unpinned));
  if (p->sched.jitter > 0)
    buf_printf(b, "               the mean of %d simulations with each action's time drawn around its median, spread %.1f%% as\n"
                  "               measured; %s per step and %.1f%% bubble with every action at its median\n",
               p->sched.jitter_draws, 100 * p->sched.jitter, fmt_time(p->sched.step_time_fixed), 100 * p->sched.bubble_fixed);
  if (p->sched.unroll > 0) {
    buf_printf(b, "  bubble       %.1f%% predicted in the steady state; the pipeline fills and drains once per run (%s), not every\n"
                  "               step (a synchronous balanced pipeline pays (p-1)/(m+p-1) = %.1f%% each step)\n",
               100 * p->sched.bubble, fmt_time(p->sched.fill_drain), 100 * schedule_ideal_bubble(n, p->opt.microbatches));
    buf_printf(b, "  staleness    %d: step t computes its forwards and backwards on the weights of step t-%d (the first %d steps on\n"
                  "               the initial ones) and its gradient updates the newest; each stage keeps %d older cop%s of its\n"
                  "               weights; the first stage runs forwards up to %d step%s ahead of its update\n",
               p->sched.staleness, p->sched.staleness, p->sched.staleness, p->sched.staleness, p->sched.staleness == 1 ? "y" : "ies",
               p->sched.lookahead, p->sched.lookahead == 1 ? "" : "s");
  } else if (p->sched.nchunks > 1 && p->opt.schedule == SCHED_ZBV) {
    buf_printf(b, "  bubble       %.1f%% predicted (with every forward and backward half one unit of time, the lists below\n"
                  "               leave %.1f%% idle)\n", 100 * p->sched.bubble, 100 * ideal_bubble(p));
  } else if (p->sched.nchunks > 1) {
    buf_printf(b, "  bubble       %.1f%% predicted (a balanced interleaved pipeline of n = %d ranks, V = %d chunks each:\n"
                  "               (n-1)/(V m + n-1) = %.1f%%)\n", 100 * p->sched.bubble, opt_ranks(&p->opt), p->sched.nchunks, 100 * ideal_bubble(p));
  } else {
    buf_printf(b, "  bubble       %.1f%% predicted (a balanced pipeline: (p-1)/(m+p-1) = %.1f%%)\n", 100 * p->sched.bubble,
               100 * schedule_ideal_bubble(n, p->opt.microbatches));
  }
  buf_printf(b, "  imbalance    slowest stage %d at %s per micro-batch; max/mean %.3f, max/min %.3f\n", slow, fmt_time(mx),
             mx / mean_time(p), mn > 0 ? mx / mn : 1.0);
  if (p->fb)
    buf_printf(b, "  why          %d forward rank%s and %d backward: the forward chain's cuts minimise the slowest forward rank's\n"
                  "               time (its forwards and messages), the backward chain's the slowest backward rank's, each within\n"
                  "               its rank's memory (two ring copies); of the splits tried%s, this one's simulated step is the shortest\n",
               p->fb->links.nf, p->fb->links.nf == 1 ? "" : "s", n - p->fb->links.nf, " (1 to n - 1, or --fb-split's)");
  else
    buf_printf(b, "  why          the cut points minimise the slowest stage's time (compute on its rank + sending and receiving\n"
                  "               every value that crosses its cuts), within each rank's memory under %s; among equally fast\n"
                  "               plans the most even one is kept\n", schedule_name(p->opt.schedule));
}

void listing_text(const Plan *p, Buf *b) {
  const Graph *g = &p->g;
  int n = p->opt.nstages;
  buf_printf(b, "pipecc plan: %s\n", g->path);
  buf_printf(b, "  model        opset %lld, %d nodes (%d folded at compile time, %d fused into another, %d compute), %s parameters\n",
             (long long)g->opset, g->nn, p->nfolded, p->nfused, p->N, fmt_count(p->params));
  {
    const char *kind[MAX_FUSION_KINDS];
    int count[MAX_FUSION_KINDS], nk = fusion_kinds(p, kind, count);
    for (int i = 0; i < nk; i++)
      buf_printf(b, "%s%d x %s%s", i ? "; " : "  fused        ", count[i], kind[i], i == nk - 1 ? " (--no-fuse: apart)\n" : "");
  }
  if (p->opt.replicas > 1) replicas_text(p, b);
  else
    buf_printf(b, "  batch        %lld samples per step = %d micro-batches x %lld\n", (long long)p->batch, p->opt.microbatches,
               (long long)p->mb_size);
  buf_printf(b, "  schedule     %s over %d stage%s%s, optimizer %s (%.0f state slot%s per parameter)\n",
             schedule_name(p->opt.schedule), n, n == 1 ? "" : "s",
             p->sched.nchunks > 1 ? pool_printf((Pool *)&p->g.pool, " on %d ranks (%d chunks each)", opt_ranks(&p->opt), p->sched.nchunks) : "",
             p->opt.optimizer ? p->opt.optimizer : "sgd", p->opt_slots, p->opt_slots == 1 ? "" : "s");
  if (p->opt.frozen) frozen_text(p, b);
  machine_text(p, b);
  costs_text(p, b);
  if (p->opt.mem_limit > 0) buf_printf(b, "  mem limit    %s per rank\n", fmt_bytes(p->opt.mem_limit));
  if (p->conv_note) buf_printf(b, "  convolution  %s\n", p->conv_note);
  if (p->part_note) buf_printf(b, "  partition    %s\n", p->part_note);
  if (p->part.blocks)
    buf_printf(b, "  partition    %d nodes: over %d blocks of about equal work first, then exactly within two blocks of each cut "
                  "(the exact DP would price about %.0f stages); optimal among the cuts in those windows\n",
               p->N, p->part.blocks, 0.5 * n * (double)p->N * p->N);
  if (p->part.budget_spent)
    buf_printf(b, "  partition    past its bound on building stage programs, a candidate fitted the memory limit by its estimate "
                  "(an upper bound); the chosen stages were checked by their arenas\n");
  buf_printf(b, "\n");
  for (int s = 0; s < n; s++) stage_text(p, s, b);
  tie_text(p, b);
  initializers_text(p, b);
  if (p->mem_note)
    buf_printf(b, "\nmemory: %s; the partitioner's upper bound, not the arena\n", p->mem_note);
  else if (p->rprogs)
    rank_memory_text(p, b);
  else
    buf_printf(b, "\nmemory: each stage's arena, exactly: its static buffer ARENA_BYTES in stage_<k>.c, which holds everything\n"
                  "        the stage keeps (weights, constants, gradients, optimizer state, rings, temporaries); the runtime adds\n"
                  "        only its per-rank bookkeeping (MPI requests, one micro-batch of loader input) and the data set.  The\n"
                  "        partitioner priced each candidate stage by the same arena, and --mem-limit is decided against it.\n");
  step_text(p, b);
  schedule_table(p, b);
  action_lists(p, b);
}

static void json_str(Buf *b, const char *s) {
  buf_printf(b, "\"");
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') buf_printf(b, "\\%c", c);
    else if (c < 0x20) buf_printf(b, "\\u%04x", c);
    else buf_printf(b, "%c", c);
  }
  buf_printf(b, "\"");
}

static void json_shape(Buf *b, const Tensor *t) {
  buf_printf(b, "[");
  for (int i = 0; i < t->rank; i++) buf_printf(b, "%s%lld", i ? "," : "", (long long)t->dims[i]);
  buf_printf(b, "]");
}

static void json_edges(const Plan *p, Buf *b, int cut) {
  int first = 1;
  buf_printf(b, "[");
  for (int q = 0; q < p->nedges; q++) {
    const PartEdge *ed = &p->edges[q];
    int crosses = ed->from < cut && cut <= ed->to;
    if (!crosses) continue;
    const Tensor *t = &p->g.t[p->edge_tensor[q]];
    buf_printf(b, "%s{\"name\":", first ? "" : ",");
    json_str(b, t->name);
    buf_printf(b, ",\"dtype\":\"%s\",\"shape\":", dtype_name(t->dtype));
    json_shape(b, t);
    buf_printf(b, ",\"bytes\":%.0f,\"producer_stage\":%d,\"last_consumer_stage\":%d}", ed->bytes,
               ed->from < 0 ? -1 : stage_of(p, ed->from), ed->to >= p->N ? p->opt.nstages : stage_of(p, ed->to));
    first = 0;
  }
  buf_printf(b, "]");
}

/* plan.json's machine: where its figures come from, the cores and pinning, the costs' source, each rank and link. */
static void machine_json(const Plan *p, Buf *b) {
  int n = p->opt.nstages;
  buf_printf(b, "  \"mem_limit_bytes\": %.0f,\n  \"machine\": {\"source\": ", p->opt.mem_limit);
  json_str(b, p->machine.source);
  buf_printf(b, ", \"memcpy_bandwidth\": %.6g, \"cores\": %d, \"threads_per_rank\": %d, \"pinned_core\": ", p->machine.memcpy_bw,
             p->machine.cores, p->opt.threads > 1 ? p->opt.threads : 1);
  if (p->sched.core_of) {
    buf_printf(b, "[");
    for (int r = 0; r < opt_ranks(&p->opt); r++) buf_printf(b, "%s%d", r ? ", " : "", p->sched.core_of[r]); /* per rank */
    buf_printf(b, "]");
  } else {
    buf_printf(b, "null");
  }
  buf_printf(b, ", \"costs\": ");
  if (p->costs && p->costs->path) json_str(b, p->costs->path);
  else buf_printf(b, "null");
  if (p->costs && p->costs->src) {
    buf_printf(b, ", \"kernel_cache\": {\"path\": ");
    if (p->costs->cache_path) json_str(b, p->costs->cache_path);
    else buf_printf(b, "null");
    buf_printf(b, ", \"nodes_from_cache\": %d, \"nodes_from_flops\": %d, \"aux_from_cache\": %d}", p->costs->ncached,
               p->N - p->costs->ncached - p->costs->nprobed, p->costs->aux);
    if (p->costs->nprobed) {
      buf_printf(b, ", \"op_probe\": {\"path\": ");
      json_str(b, p->costs->ops_path);
      buf_printf(b, ", \"nodes_from_probe\": %d, \"aux_from_probe\": %d}", p->costs->nprobed, p->costs->aux_probed);
    }
  } else if (p->costs && p->costs->merged) {
    buf_printf(b, ", \"kernel_cache_merged\": {\"path\": ");
    json_str(b, p->costs->cache_path);
    buf_printf(b, ", \"entries\": %d}", p->costs->merged);
  }
  buf_printf(b, ", \"ranks\": [");
  for (int s = 0; s < n; s++) buf_printf(b, "%s{\"flops\": %.6g, \"mem_bytes\": %.0f}", s ? ", " : "", p->machine.dev[s].flops, p->machine.dev[s].mem_bytes);
  buf_printf(b, "], \"links\": [");
  for (int s = 0; s + 1 < n; s++)
    buf_printf(b, "%s{\"bandwidth\": %.6g, \"latency\": %.6g}", s ? ", " : "", p->machine.link[s].bandwidth, p->machine.link[s].latency);
  buf_printf(b, "]},\n");
}

/* plan.json's tied weights: each with its readers and their stages; returns how many. */
static int ties_json(const Plan *p, Buf *b) {
  int *ks = malloc(sizeof(int) * (size_t)(p->N + 1)), nties = 0;
  for (int t = 0; t < p->g.nt; t++) {
    if (!p->g.t[t].is_param || p->nreaders[t] < 2) continue;
    int same, nk = plan_tie_readers(p, t, ks, &same);
    buf_printf(b, "%s\n    {\"weight\": ", nties++ ? "," : "");
    json_str(b, p->g.t[t].name);
    buf_printf(b, ", \"bytes\": %lld, \"same_kind\": %s, \"readers\": [", (long long)tensor_bytes(&p->g.t[t]), same ? "true" : "false");
    for (int j = 0; j < nk; j++) {
      buf_printf(b, "%s{\"node\": ", j ? ", " : "");
      json_str(b, node_name(p, ks[j]));
      buf_printf(b, ", \"op\": ");
      json_str(b, p->g.n[p->node[ks[j]]].op);
      buf_printf(b, ", \"stage\": %d}", stage_of(p, ks[j]));
    }
    buf_printf(b, "]}");
  }
  free(ks);
  return nties;
}

/* plan.json's initializers: each float one, trained or a constant and why (null when trained). */
static void initializers_json(const Plan *p, Buf *b) {
  const Graph *g = &p->g;
  int *first, *last, n = 0;
  reader_stages(p, &first, &last);
  buf_printf(b, "  \"initializers\": [");
  for (int t = 0; t < g->nt; t++) {
    const Tensor *x = &g->t[t];
    if (!x->is_initializer || !dtype_is_float(x->dtype)) continue;
    char why[160];
    const char *w = kept_why(x, first[t] >= 0, why, sizeof why);
    buf_printf(b, "%s\n    {\"name\": ", n++ ? "," : "");
    json_str(b, x->name);
    buf_printf(b, ", \"dtype\": \"%s\", \"shape\": ", dtype_name(x->dtype));
    json_shape(b, x);
    buf_printf(b, ", \"trained\": %s, \"why\": ", w ? "false" : "true");
    if (w) json_str(b, w);
    else buf_printf(b, "null");
    buf_printf(b, ", \"first_stage\": %d, \"last_stage\": %d}", first[t], last[t]);
  }
  buf_printf(b, "%s],\n", n ? "\n  " : "");
  free(first), free(last);
}

static void actions_json(const Plan *p, int r, int ch, Buf *b);

/* plan.json's stage s: its nodes, costs, memory, messages and actions. */
static void stage_json(const Plan *p, int s, Buf *b) {
  const StageCost *c = &p->part.cost[s];
  int a = p->rbegin[s], e = p->rend[s];
  double params = 0, ff = 0, bf = 0;
  for (int k = a; k < e; k++) params += p->cost[k].param_count, ff += p->cost[k].fwd_flops, bf += p->cost[k].bwd_flops;
  buf_printf(b, "    {\"stage\": %d, \"role\": \"%s\", \"node_begin\": %d, \"node_end\": %d, \"first_node\": ", s,
             p->role[s] == ROLE_FWD ? "forward" : p->role[s] == ROLE_BWD ? "backward" : "both", a, e);
  json_str(b, node_name(p, a));
  buf_printf(b, ", \"last_node\": ");
  json_str(b, node_name(p, e - 1));
  buf_printf(b, ",\n     \"nodes\": [");
  for (int k = a; k < e; k++) {
    if (k > a) buf_printf(b, ", ");
    json_str(b, node_name(p, k));
  }
  buf_printf(b, "],\n     \"parameters\": %.0f, \"fwd_flops\": %.0f, \"bwd_flops\": %.0f,\n", params, ff, bf);
  buf_printf(b, "     \"fwd_time_s\": %.9g, \"bwd_time_s\": %.9g, \"comm_time_s\": %.9g, \"time_s\": %.9g,\n", c->fwd, c->bwd, c->comm, c->time);
  if (p->costs && p->costs->src) {
    int hit = 0, probed = 0;
    for (int k = a; k < e; k++) hit += p->costs->src[k] == 1, probed += p->costs->src[k] == 2;
    buf_printf(b, "     \"costs_from_cache\": %d, \"costs_from_flops\": %d,%s\n", hit, e - a - hit - probed,
               probed ? pool_printf((Pool *)&p->g.pool, " \"costs_from_probe\": %d,", probed) : "");
  }
  buf_printf(b, "     \"memory\": {\"params\": %.0f, \"grads\": %.0f, \"optimizer\": %.0f, \"stash\": %.0f, \"received\": %.0f, "
                "\"workspace\": %.0f, \"total\": %.0f, \"inflight\": %d, \"copies\": %d, \"estimate\": %.0f, \"exact\": %s},\n",
             c->mem_params, c->mem_grads, c->mem_opt, c->mem_stash, c->mem_recv, c->mem_work, c->mem_total, c->inflight, c->copies,
             c->mem_estimate, p->mem_note ? "false" : "true");
  if (p->arena) buf_printf(b, "     \"arena_bytes\": %lld, \"beside_arena_bytes\": %.0f,\n", (long long)p->arena[s], beside_arena(p, a, e));
  if (c->mem_versions > 0) buf_printf(b, "     \"weight_versions_bytes\": %.0f,\n", c->mem_versions);
  if (sched_splits(p->opt.schedule) && p->sched.hold && p->progs)
    buf_printf(b, "     \"split_layout\": \"%s\", \"late_copies\": %d,\n", p->sched.hold[s] ? "hold" : "late", c->wcopies);
  if (p->progs && p->plain_arena) memory_plan_json(p, s, b);
  buf_printf(b, "     \"recv\": ");
  json_edges(p, b, a);
  buf_printf(b, ",\n     \"send\": ");
  json_edges(p, b, e);
  if (p->specs && !p->rprogs) spec_messages_json(&p->specs[s], b);
  /* With chunks a stage's actions are its rank's of its chunk (the rank's whole list: plan.json's "ranks"). */
  int r = sched_rank_of(&p->sched, s), ch = sched_chunk_of(&p->sched, s);
  if (p->sched.nchunks > 1) buf_printf(b, ",\n     \"rank\": %d, \"chunk\": %d", r, ch);
  buf_printf(b, ",\n     \"nslots\": %d, \"ngslots\": %d, \"nwslots\": %d,\n     \"actions\": [", p->sched.nslots[s], p->sched.ngslots[s],
             p->sched.nwslots ? p->sched.nwslots[s] : 0);
  actions_json(p, r, p->sched.nchunks > 1 ? ch : -1, b);
}

/* Rank r's actions (of chunk ch only; -1: all), with their predicted and unit-time starts and slots. */
static void actions_json(const Plan *p, int r, int ch, Buf *b) {
  int first = 1;
  for (int k = 0; k < p->sched.nact[r]; k++) {
    const Action *ac = &p->sched.act[r][k];
    if (ch >= 0 && ac->chunk != ch && ac->kind != ACT_UPDATE) continue;
    char name[32];
    buf_printf(b, "%s{\"op\": \"%s\", \"kind\": \"%s\", \"mb\": %d, \"start_s\": %.9g, \"end_s\": %.9g, \"slot\": %ld, "
                  "\"ring_slot\": %d, \"grad_slot\": %d}", first ? "" : ",\n       ", action_str(ac, name, sizeof name),
               action_kind_name(ac->kind), ac->mb, ac->start, ac->end,
               p->slots.nact[r] == p->sched.nact[r] ? lround(p->slots.act[r][k].start) : -1L, ac->slot, ac->gslot);
    first = 0;
    if (ac->wslot >= 0) b->len--, buf_printf(b, ", \"late_slot\": %d}", ac->wslot);
    if (ac->xslot >= 0) b->len--, buf_printf(b, ", \"xslot\": %d, \"peer\": %d}", ac->xslot, ac->peer);
    if (p->sched.nchunks > 1) b->len--, buf_printf(b, ", \"chunk\": %d, \"stage\": %d}", ac->chunk, ac->kind == ACT_UPDATE ? -1 : sched_stage(&p->sched, r, ac->chunk));
  }
}

/* plan.json's ranks with chunks: each rank's stages, arena, messages and whole action list. */
static void ranks_json(const Plan *p, Buf *b) {
  int n = opt_ranks(&p->opt);
  buf_printf(b, "  \"chunks\": %d,\n  \"ranks\": [\n", p->opt.chunks);
  for (int r = 0; r < n; r++) {
    const StageProg *sp = p->rprogs ? &p->rprogs[r] : NULL;
    buf_printf(b, "    {\"rank\": %d, \"stages\": [", r);
    for (int c = 0; c < p->sched.nchunks; c++) buf_printf(b, "%s%d", c ? ", " : "", sched_stage(&p->sched, r, c));
    buf_printf(b, "], \"busy_s\": %.9g", p->sched.busy ? p->sched.busy[r] : 0);
    if (sp)
      buf_printf(b, ", \"arena_bytes\": %lld, \"weights_bytes\": %lld,\n     \"memory\": {\"weights\": %lld, \"grads\": %lld, \"optimizer\": %lld, "
                    "\"stash\": %lld, \"crossing\": %lld, \"temporaries\": %lld}", (long long)sp->arena_bytes, (long long)sp->weights_bytes,
                 (long long)sp->mem_weights, (long long)sp->mem_grads, (long long)sp->mem_opt, (long long)sp->mem_stash,
                 (long long)sp->mem_cross, (long long)sp->mem_temps);
    if (p->specs) spec_messages_json(&p->specs[r], b);
    buf_printf(b, ",\n     \"actions\": [");
    actions_json(p, r, -1, b);
    buf_printf(b, "]}%s\n", r + 1 < n ? "," : "");
  }
  buf_printf(b, "  ],\n");
}

void listing_json(const Plan *p, Buf *b) {
  int n = p->opt.nstages;
  buf_printf(b, "{\n  \"model\": ");
  json_str(b, p->g.path);
  buf_printf(b, ",\n  \"opset\": %lld,\n  \"nodes\": %d,\n  \"folded_nodes\": %d,\n  \"fused_nodes\": %d,\n  \"compute_nodes\": %d,\n  \"parameters\": %.0f,\n",
             (long long)p->g.opset, p->g.nn, p->nfolded, p->nfused, p->N, p->params);
  {
    const char *kind[MAX_FUSION_KINDS];
    int count[MAX_FUSION_KINDS], nk = fusion_kinds(p, kind, count);
    buf_printf(b, "  \"fusions\": [");
    for (int i = 0; i < nk; i++) {
      buf_printf(b, "%s{\"runs\": ", i ? ", " : "");
      json_str(b, kind[i]);
      buf_printf(b, ", \"nodes\": %d}", count[i]);
    }
    buf_printf(b, "],\n");
  }
  if (p->fb) buf_printf(b, "  \"fb_split\": %d,\n", p->fb->links.nf);
  if (p->opt.frozen) buf_printf(b, "  \"frozen_layers\": %d,\n  \"layers\": %d,\n", p->nfrozen, p->nlayers);
  if (p->sched.unroll > 0)
    buf_printf(b, "  \"staleness\": %d,\n  \"lookahead\": %d,\n  \"fill_drain_s\": %.9g,\n", p->sched.staleness, p->sched.lookahead,
               p->sched.fill_drain);
  buf_printf(b, "  \"partition\": \"%s\",\n  \"partition_note\": ", p->opt.partition == PARTITION_CHAIN ? "chain" : "dag");
  if (p->part_note) json_str(b, p->part_note);
  else buf_printf(b, "null");
  buf_printf(b, ",\n  \"partition_blocks\": %d,\n  \"chain_max_stage_time_s\": %.9g,\n", p->part.blocks, p->chain_time);
  if (p->opt.replicas > 1) replicas_json(p, b);
  buf_printf(b, "  \"batch\": %lld,\n  \"microbatches\": %d,\n  \"microbatch_size\": %lld,\n  \"schedule\": \"%s\",\n  \"stages\": %d,\n",
             (long long)p->batch, p->opt.microbatches, (long long)p->mb_size, schedule_name(p->opt.schedule), n);
  buf_printf(b, "  \"optimizer\": \"%s\",\n  \"optimizer_slots_per_param\": %.0f,\n", p->opt.optimizer ? p->opt.optimizer : "sgd", p->opt_slots);
  auto_json(p, b);
  layout_json(p, b);
  buf_printf(b, "  \"convolutions\": \"%s\",\n", conv_impl_name(&p->g));
  machine_json(p, b);
  buf_printf(b, "  \"predicted_step_time_s\": %.9g,\n  \"bubble\": %.6f,\n  \"ideal_bubble\": %.6f,\n  \"max_stage_time_s\": %.9g,\n",
             p->sched.step_time, p->sched.bubble, ideal_bubble(p), p->part.max_time);
  buf_printf(b, "  \"jitter\": %.6f,\n  \"step_time_at_medians_s\": %.9g,\n  \"bubble_at_medians\": %.6f,\n", p->sched.jitter,
             at_medians(p), p->sched.jitter > 0 ? p->sched.bubble_fixed : p->sched.bubble);
  buf_printf(b, "  \"imbalance\": %.6f,\n  \"ties\": [", p->part.max_time / mean_time(p));
  int nties = ties_json(p, b);
  buf_printf(b, "%s],\n", nties ? "\n  " : "");
  initializers_json(p, b);
  if (p->sched.nchunks > 1) ranks_json(p, b);
  buf_printf(b, "  \"stage_plans\": [\n");
  for (int s = 0; s < n; s++) {
    stage_json(p, s, b);
    buf_printf(b, "]}%s\n", s + 1 < n ? "," : "");
  }
  buf_printf(b, "  ]\n}\n");
}

/* ACT_F .. ACT_RECV_WEIGHTS and TL_F .. TL_RECV_WEIGHTS name the same kinds in the same order.  A transfer's span is
 * the copy itself, from its post to its predicted completion. */
void listing_timeline(const Plan *p, Buf *b) {
  const Schedule *sc = &p->sched;
  int n = 0;
  for (int s = 0; s < sc->nstages; s++) n += sc->nact[s];
  TlSpan *spans = calloc((size_t)(n ? n : 1), sizeof *spans);
  if (!spans) abort();
  int k = 0, chunked = sc->nchunks > 1;
  for (int s = 0; s < sc->nstages; s++)
    for (int i = 0; i < sc->nact[s]; i++) {
      const Action *a = &sc->act[s][i];
      /* With chunks an UPDATE is the whole rank's: no chunk, no stage. */
      int whole = chunked && a->kind == ACT_UPDATE, ch = whole ? -1 : a->chunk;
      spans[k++] = (TlSpan){s, a->kind - ACT_F + TL_F, a->mb, 0, a->start, a->end, ch, whole ? -1 : sched_stage(sc, s, ch)};
    }
  char title[512], stages[64] = "";
  if (chunked) snprintf(stages, sizeof stages, " on %d ranks", sc->nstages);
  snprintf(title, sizeof title, "%s: planned step, %s, %d stages%s, %d micro-batches, predicted %s, bubble %.0f%%", p->g.path,
           schedule_name(p->opt.schedule), sched_nvstages(sc), stages, sc->m, fmt_time(sc->step_time), 100 * sc->bubble);
  timeline_svg(b, spans, k, sc->nstages, title);
  free(spans);
}
