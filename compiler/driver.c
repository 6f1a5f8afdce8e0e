/* driver.c - the compiler's pipeline, in order.  Each pass is a file of its
 * own; this one only runs them one after another and stops at the first
 * error:
 *
 *   load (onnx_load.c)  bind the inputs (bind.c)  infer + fold (shape.c, fold.c)
 *   untie (untie.c)  fuse (fuse.c)  freeze (freeze.c)  costs (cost.c, profile.c, kcache.c)
 *   partition (cut.c, price.c; pipefb.c)  schedule (schedule.c)
 *   stage programs (autodiff.c, memplan.c)  memory plan (stash.c)  jitter
 *   the arena guard  listing (listing.c)  emit (emit.c)  commit (outdir.c)
 *
 * A plan that does not fit with one convolution implementation is made
 * again with the next (ops/conv.c, conv_impl_choices). */
#include "driver.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "autodiff.h"
#include "bind.h"
#include "chunkcut.h"
#include "chunks.h"
#include "cut.h"
#include "edges.h"
#include "emit.h"
#include "freeze.h"
#include "fuse.h"
#include "kcache.h"
#include "layout.h"
#include "listing.h"
#include "memplan.h"
#include "onnx_load.h"
#include "ops.h"
#include "ops/conv.h"
#include "ops/loss.h"
#include "outdir.h"
#include "pipefb.h"
#include "planq.h"
#include "price.h"
#include "opcost.h"
#include "replica.h"
#include "profile.h"
#include "rtpath.h"
#include "spec.h"
#include "stash.h"
#include "untie.h"

/* ---- the plan: load to schedule ---- */

int plan_build(Plan *p, const Options *o) {
  memset(p, 0, sizeof *p);
  p->opt = *o;
  if (onnx_load_file(o->model, &p->g)) return -1;
  p->g.conv_impl = o->conv_impl;
  return plan_from_graph(p);
}

/* --constant NAME[,NAME...]: initializers that are constants, never trained (ops.c, mark_params).  A value that
 * names an initializer whole is taken whole, so a name holding a comma can be given in a flag of its own. */
static int declare_constants(Plan *p) {
  Graph *g = &p->g;
  for (int i = 0; i < p->opt.nconstants; i++) {
    const char *v = p->opt.constants[i];
    int whole = ir_find_tensor(g, v);
    if (whole >= 0 && g->t[whole].is_initializer) {
      g->t[whole].kept_const = KEPT_DECLARED;
      continue;
    }
    for (const char *s = v;; s++) {
      size_t len = strcspn(s, ",");
      if (!len) return err_set("--constant '%s': an empty name (expected NAME[,NAME...])", v);
      const char *name = pool_printf(&g->pool, "%.*s", (int)len, s);
      int t = ir_find_tensor(g, name);
      if (t < 0 || !g->t[t].is_initializer)
        return err_set("--constant '%s': %s has no initializer '%s'%s", v, g->path, name,
                       t < 0 ? "" : g->t[t].is_input ? " (it is a graph input)" : " (it is computed by a node)");
      g->t[t].kept_const = KEPT_DECLARED;
      s += len;
      if (!*s) break;
    }
  }
  return 0;
}

/* Bind, infer + fold, untie, fuse: the graph as it will run, and its compute nodes. */
static int pass_graph(Plan *p) {
  Graph *g = &p->g;
  if (declare_constants(p) || bind_inputs(p)) return -1;
  if (infer_and_fold(g)) {
    /* Name the file too: the node alone may not say which model. */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", err_msg());
    err_clear();
    return err_set("%s: %s", g->path, msg);
  }
  if (check_nonempty(g)) return -1;
  /* A training program's output must pair with the labels (--dump-shapes only shows shapes, whatever they are). */
  if (!p->opt.forward_only && !p->opt.dump_shapes && loss_check_output(p)) return -1;
  if (p->opt.untie && untie_merged(g)) return -1;
  if (!p->opt.no_fuse) p->nfused = fuse_graph(g);
  p->node = pool_alloc(&g->pool, sizeof(int) * (size_t)g->nn);
  for (int j = 0; j < g->nn; j++)
    if (!g->n[j].folded) p->node[p->N++] = j;
    else if (!g->n[j].fused) p->nfolded++;
  if (!p->N) return err_set("%s: every node is a constant; there is nothing to train", g->path);
  return 0;
}

/* Each compute node's cost (p->cost), and the partitioner's per-node arrays (arr[0..5]). */
static void node_costs(Plan *p, double *arr[6]) {
  Graph *g = &p->g;
  NodeCost *all = pool_alloc(&g->pool, sizeof(NodeCost) * (size_t)g->nn);
  cost_nodes(g, all);
  p->cost = pool_alloc(&g->pool, sizeof(NodeCost) * (size_t)p->N);
  for (int k = 0; k < 6; k++) arr[k] = pool_alloc(&g->pool, sizeof(double) * (size_t)p->N);
  for (int k = 0; k < p->N; k++) {
    NodeCost *c = &p->cost[k];
    *c = all[p->node[k]];
    arr[0][k] = c->fwd_flops, arr[1][k] = c->bwd_flops, arr[2][k] = c->traffic_bytes;
    arr[3][k] = c->param_bytes, arr[4][k] = c->stash_bytes, arr[5][k] = c->work_bytes;
    p->params += c->param_count;
  }
}

/* The partitioner's problem: the per-node arrays, the values between nodes, the machine. */
static void set_problem(Plan *p, double *arr[6]) {
  const Options *o = &p->opt;
  const char *opt = o->optimizer ? o->optimizer : "sgd";
  p->opt_slots = !strcmp(opt, "sgd") ? (o->momentum > 0 ? 1 : 0) : 2;
  PartProblem *pr = &p->prob;
  pr->N = p->N;
  pr->fwd_flops = arr[0], pr->bwd_flops = arr[1], pr->traffic = arr[2];
  pr->param_bytes = arr[3], pr->stash_bytes = arr[4], pr->work_bytes = arr[5];
  pr->edges = p->edges, pr->nedges = p->nedges;
  /* Direct sends: a value goes only to the ranks that read it (pipefb's chains relay, and so do the stages
   * of chunked schedules, each with its neighbours only). */
  p->direct = !o->relay && o->schedule != SCHED_PIPEFB && !sched_chunked(o->schedule);
  if (p->direct) pr->gaps = p->gaps, pr->ngaps = p->ngaps;
  pr->nstages = o->nstages, pr->microbatches = p->opt.microbatches, pr->schedule = o->schedule;
  pr->opt_state_per_param = p->opt_slots;
  pr->zero_share = p->opt.zero && p->opt.replicas > 1 ? 1.0 / p->opt.replicas : 1; /* --zero 1: a replica keeps 1/R of the state */
  pr->reduce_share = p->opt.replicas > 1 ? (double)(p->opt.replicas - 1) / p->opt.replicas : 0;
  pr->machine = &p->machine;
  /* --chunks V: a rank's V stages share its limit; each is cut to its share (plan_stage_limit), the joined
   * arena checked whole (stash.c). */
  pr->mem_limit = o->chunks > 1 ? o->mem_limit / o->chunks : o->mem_limit;
}

/* --costs FILE: the measured node times replace the FLOP model's, and join the kernel cache. */
static int measured_costs(Plan *p) {
  Graph *g = &p->g;
  PartProblem *pr = &p->prob;
  Costs *c = p->costs = pool_alloc(&g->pool, sizeof *c);
  if (costs_load(c, p->opt.costs, p, &g->pool)) return -1;
  /* Convolutions timed through oneDNN say nothing of im2col + GEMM (a plan under a memory limit
   * may fall back to it), nor the other way: theirs come from the FLOP model. */
  c->conv_mismatch = conv_costs_mismatch(c->conv, g);
  for (int q = 0; q < p->N && c->conv_mismatch; q++)
    if (conv_by_impl(g, &g->n[p->node[q]]))
      kcache_flop_node(pr, q, c->rate, p->machine.memcpy_bw, &c->fwd[q], &c->bwd_input[q], &c->bwd_weight[q]);
  pr->fwd_s = c->fwd, pr->bwdi_s = c->bwd_input, pr->bwdw_s = c->bwd_weight;
  pr->time_rate = c->rate, pr->load_s = c->load, pr->loss_s = c->loss, pr->update_per_byte = c->update_per_param / 4;
  kcache_merge(p, c); /* the profile's times, under each node's shape key, for later plans */
  return 0;
}

/* --chunks V: the ranks' figures spread over the stages they run (machine_spread). */
static void spread_machine(Plan *p) {
  const Options *o = &p->opt;
  Schedule map = {.nstages = o->nranks, .nchunks = o->chunks, .kind = o->schedule};
  int *rank_of = pool_alloc(&p->g.pool, sizeof(int) * (size_t)o->nstages);
  for (int s = 0; s < o->nstages; s++) rank_of[s] = sched_rank_of(&map, s);
  machine_spread(&p->machine, rank_of, o->nstages, o->chunks);
}

/* Freeze, costs: the frozen layers, each node's cost, the values between nodes, the machine and
 * the times (measured, cached or from FLOPs). */
static int pass_costs(Plan *p) {
  const Options *o = &p->opt;
  Graph *g = &p->g;
  if (freeze_apply(p)) return -1; /* the layers; with --frozen, the first N frozen */
  if (machine_load(&p->machine, opt_ranks(o), o->devices, &g->pool)) return -1;
  /* --conv auto: each convolution through the implementation the op probe measured faster for its shape
   * (opcost.c), before anything sizes its workspace. */
  if (!o->devices && !o->forward_only) opcost_choose_convs(p);
  double *arr[6];
  node_costs(p, arr);
  plan_edges(p);
  if (o->nstages > p->N && o->chunks > 1)
    return err_set("-n %d with --chunks %d is %d stages, more than the compute nodes in %s (%d after constant folding): each stage "
                   "needs at least one (use fewer ranks or chunks)", o->nranks, o->chunks, o->nstages, g->path, p->N);
  if (o->nstages > p->N)
    return err_set("-n %d is larger than the number of compute nodes in %s (%d after constant folding): each stage needs "
                   "at least one", o->nstages, g->path, p->N);
  if (o->replicas > 1 && machine_load(&p->rmachine, opt_ranks(o) * o->replicas, o->devices, &g->pool)) return -1;
  if (o->chunks > 1) spread_machine(p);
  /* --threads T on this machine's probe: GEMM, which most of the FLOPs are, splits over T cores about
   * evenly, so the FLOP model takes T times the one-core rate (a --devices file gives each rank's own
   * rate; the kernel cache's times at T threads, pipecc-probe --kernels --threads T, replace it). */
  if (o->threads > 1 && !o->devices)
    for (int r = 0; r < p->machine.nranks; r++) p->machine.dev[r].flops *= o->threads;
  /* oneDNN's scratch memory is in each convolution's workspace (conv.c); its code and descriptors are
   * beside the arena, and a memory limit counts them (plan_lib_bytes). */
  p->conv_note = conv_note(g, p->node, p->N, o->conv_fallback);
  set_problem(p, arr);
  if (o->costs) {
    if (measured_costs(p)) return -1;
  } else {
    kcache_apply(p, &p->prob); /* nodes the kernel cache has times for (kcache.c); nothing changes when it has none */
  }
  /* Frozen layers: backwards that no longer run, weight gradients no longer made. */
  if (o->frozen) freeze_costs(p, arr[1], p->costs ? p->costs->bwd_input : NULL, p->costs ? p->costs->bwd_weight : NULL);
  return 0;
}

/* The schedule of kind o->schedule for the stages' costs c (unit times or the cut's). */
static int build_schedule(Plan *p, Schedule *sc, const StageCost *c) {
  const Options *o = &p->opt;
  if (o->schedule == SCHED_ASYNC) return schedule_build_async(sc, o->nstages, p->opt.microbatches, o->staleness, c, &p->g.pool);
  if (sched_chunked(o->schedule)) return schedule_build_chunked(sc, o->schedule, o->nranks, o->chunks, p->opt.microbatches, c, &p->g.pool);
  schedule_build(sc, o->schedule, o->nstages, p->opt.microbatches, o->forward_only, c, &p->g.pool);
  return 0;
}

/* --chunks V: the partitioner's refusal of a memory limit spoke of stages, each cut to 1/V of its rank's
 * limit; said of the ranks, whose figure the user gives. */
static int chunked_no_fit(Plan *p) {
  const Options *o = &p->opt;
  if (strncmp(err_msg(), "no partition into", 17) || !(p->part.max_time > 0)) return -1;
  double need = p->part.max_time * o->chunks;
  err_clear();
  return err_set("no partition into %d stages (%d per rank, --chunks) fits the memory limit: each stage may take 1/%d of its "
                 "rank's %s, and the leanest plan's fullest stage needs %.0f bytes (%s): raise --mem-limit to at least %.0fK, or "
                 "use fewer --chunks, fewer micro-batches or --schedule 1f1b", o->nstages, o->chunks, o->chunks,
                 fmt_bytes(o->mem_limit > 0 ? o->mem_limit : p->machine.dev[0].mem_bytes * o->chunks), ceil(p->part.max_time),
                 fmt_bytes(p->part.max_time), ceil(need / 1024));
}

/* Partition: the cuts, priced with the ring sizes of the unit-time lists, and each rank's nodes. */
static int pass_partition(Plan *p) {
  const Options *o = &p->opt;
  Graph *g = &p->g;
  if (o->zero && o->replicas > 1)
    for (int t = 0; t < g->nt; t++)
      if (g->t[t].is_param && p->nreaders[t] > 1)
        return err_set("--zero 1: weight '%s' is read by %d nodes (tied); the sharded update does not sum a tied weight's parts yet "
                       "(use --zero 0, or --untie if an exporter merged them)", g->t[t].name, p->nreaders[t]);
  if (o->schedule == SCHED_ASYNC)
    for (int t = 0; t < g->nt; t++)
      if (g->t[t].is_param && p->nreaders[t] > 1)
        return err_set("--schedule async: weight '%s' is read by %d nodes (tied); async does not version tied weights yet "
                       "(use 1f1b, or --untie if an exporter merged them)", g->t[t].name, p->nreaders[t]);
  /* Ring sizes come from the order of each rank's actions, not from times:
   * the unit-time lists (the listing's table) give them before the cuts. */
  StageCost *unit = pool_alloc(&g->pool, sizeof(StageCost) * (size_t)o->nstages);
  for (int s = 0; s < o->nstages; s++) {
    unit[s].fwd = 1, unit[s].bwd = sched_splits(o->schedule) ? 2 : 1, unit[s].bwd_w = unit[s].bwd / 2;
  }
  if (build_schedule(p, &p->slots, unit)) return -1;
  p->unit = unit;
  if (cut_plan(p, &p->prob)) return o->chunks > 1 ? chunked_no_fit(p) : -1;
  if (chunks_balance(p)) return -1;
  p->rbegin = pool_alloc(&g->pool, sizeof(int) * (size_t)o->nstages);
  p->rend = pool_alloc(&g->pool, sizeof(int) * (size_t)o->nstages);
  p->role = pool_alloc(&g->pool, sizeof(int) * (size_t)o->nstages);
  for (int s = 0; s < o->nstages; s++) p->rbegin[s] = p->part.start[s], p->rend[s] = p->part.start[s + 1], p->role[s] = ROLE_BOTH;
  return 0;
}

/* Schedule: the step's lists for the cut's times, timed (and pinned to cores), then checked. */
static int pass_schedule(Plan *p) {
  const Options *o = &p->opt;
  if (build_schedule(p, &p->sched, p->part.cost)) return -1;
  replica_costs(p, p->part.cost, o->nstages);
  replica_actions(&p->sched, o->replicas, &p->g.pool);
  p->sched.cores = plan_core_groups(p);
  /* --replicas R on a host of fewer cores than R x threads: each replica computes on a fraction of a core. */
  int tr = (o->threads > 1 ? o->threads : 1) * o->replicas, cores = p->machine.cores;
  p->sched.share = o->replicas > 1 && cores > 0 && tr > cores ? (double)tr / cores : 1;
  if (p->direct) plan_route_peers(p, &p->sched);
  /* A rank of several threads is not pinned to one core (the runtime pins only single-threaded ranks). */
  if (!schedule_time(&p->sched, p->part.cost) && o->threads <= 1) schedule_pin(&p->sched, p->part.cost, &p->g.pool);
  err_clear(); /* a stall is reported by schedule_validate, with names */
  if (schedule_validate(&p->sched)) return -1;
  for (int s = 0; s < o->nstages; s++)
    if (p->sched.nslots[s] != p->slots.nslots[s] || p->sched.ngslots[s] != p->slots.ngslots[s] || p->sched.nwslots[s] != p->slots.nwslots[s])
      return err_set("internal error: stage %d's ring sizes depend on its times (%d/%d slots, %d/%d gslots, %d/%d wslots with unit times)", s,
                     p->sched.nslots[s], p->slots.nslots[s], p->sched.ngslots[s], p->slots.ngslots[s], p->sched.nwslots[s], p->slots.nwslots[s]);
  return 0;
}

int plan_from_graph(Plan *p) {
  if (pass_graph(p) || pass_costs(p)) return -1;
  if (p->opt.schedule == SCHED_PIPEFB) return pipefb_plan(p); /* its own cuts and lists (pipefb.c) */
  if (pass_partition(p) || pass_schedule(p)) return -1;
  return 0;
}

/* ---- the stage programs and their memory ---- */

/* Async keeps older copies of the weights region for the steps that
 * compute on them; state a forward updates there (BatchNorm's running
 * statistics) would be updated in a copy and lost.  Refused. */
static int forward_writes_state(Plan *p, const StageProg *sp) {
  for (int i = 0; i < sp->nfwd; i++)
    for (int w = 0; w < sp->fwd[i].nwrites; w++) {
      const Buffer *b = &sp->bufs[sp->fwd[i].writes[w]];
      if (b->kind == BUF_RING || b->kind == BUF_GRING || b->kind == BUF_TEMP || b->kind == BUF_LABELS || b->offset >= sp->weights_bytes) continue;
      int node = sp->fwd[i].node;
      return err_set("--schedule async: node '%s' (%s) updates state in its forward ('%s', such as BatchNorm's running statistics); "
                     "async does not version such state yet (use 1f1b, or export the model in eval mode)",
                     node >= 0 ? p->g.n[node].name : "?", node >= 0 ? p->g.n[node].op : "?", b->tensor >= 0 ? p->g.t[b->tensor].name : b->name);
    }
  return 0;
}

/* --chunks V: each rank's stages joined into the program it runs (chunks.c), laid out as one arena. */
static int rank_programs(Plan *p) {
  int n = opt_ranks(&p->opt);
  p->rprogs = pool_alloc(&p->g.pool, sizeof(StageProg) * (size_t)n);
  p->rarena = pool_alloc(&p->g.pool, sizeof(int64_t) * (size_t)n);
  for (int r = 0; r < n; r++) {
    if (chunks_join(p, p->progs, r, &p->rprogs[r], &p->g.pool)) return -1;
    const StageProg *j = &p->rprogs[r];
    memplan_as(p, &p->rprogs[r], (RingSizes){j->nslots, j->nslots, j->ngslots, j->nwslots}, ROLE_BOTH);
    p->rarena[r] = p->rprogs[r].arena_bytes;
  }
  return 0;
}

int plan_programs(Plan *p) {
  int n = p->opt.nstages;
  StageProg *progs = pool_alloc(&p->g.pool, sizeof(StageProg) * (size_t)n);
  if (autodiff_build(p, progs, &p->g.pool)) {
    if (!p->opt.plan_only) return -1;
    if (!p->mem_note) p->mem_note = pool_printf(&p->g.pool, "estimate: no stage program (%s)", err_msg());
    err_clear();
    return 0;
  }
  p->progs = progs;
  if (p->fb && pipefb_links(p, progs, p->fb, &p->g.pool)) return -1;
  p->arena = pool_alloc(&p->g.pool, sizeof(int64_t) * (size_t)n);
  int moved = 0;
  for (int s = 0; s < n; s++) {
    memplan(p, &progs[s], sched_rings(&p->sched, s));
    /* zb1, zbv: the lists follow the layout the stage chose (the table's too, which plan.json pairs with them) */
    if (p->sched.hold && p->sched.hold[s] != progs[s].hold) {
      schedule_hold(&p->sched, s, progs[s].hold), schedule_hold(&p->slots, s, progs[s].hold);
      moved = 1;
    }
    plan_stage_memory(p, s);
    if (p->opt.schedule == SCHED_ASYNC && forward_writes_state(p, &progs[s])) return -1;
  }
  if (moved) {
    schedule_time(&p->slots, p->unit), schedule_time(&p->sched, p->part.cost);
    err_clear(); /* a stall is reported by schedule_validate, with names */
    if (schedule_validate(&p->sched)) return -1;
  }
  p->mem_note = NULL;
  return p->opt.chunks > 1 ? rank_programs(p) : 0;
}

/* Draws of the step simulation under the measured spread of action times (schedule_jitter): 64 put
 * the mean step within ~0.3% of a 4096-draw mean on the sample GPT at n = 2. */
enum { PLAN_JITTER_DRAWS = 64 };

int plan_jitter(Plan *p) {
  double cv = p->costs ? p->costs->jitter : 0;
  /* Pinned ranks: the listing gives the unpinned estimate beside, for the lists as they now are. */
  if (p->sched.core_of) {
    int *pin = p->sched.core_of;
    p->sched.core_of = NULL;
    int rc = schedule_time(&p->sched, p->part.cost);
    p->sched.step_unpinned = rc ? 0 : p->sched.step_time;
    p->sched.core_of = pin;
    if (rc || schedule_time(&p->sched, p->part.cost)) return -1;
  }
  /* Nothing measured: the figures stand.  pipefb's lists are simulated with costs of their own (pipefb.c). */
  if (cv <= 0 || p->sched.fb) return 0;
  return schedule_jitter(&p->sched, p->part.cost, cv, PLAN_JITTER_DRAWS);
}

void plan_free(Plan *p) {
  price_memo_free(p->memo);
  ir_free(&p->g);
}

/* ---- the command: plan, lay out, write ---- */

/* Returned by the steps below when the plan is to be made again with the next convolution
 * implementation (the plan freed). */
enum { RETRY = -1 };

/* A plan that failed under a memory limit with oneDNN's convolutions, whose code and descriptors
 * count against the limit (plan_lib_bytes), is made again with the next implementation (im2col +
 * GEMM, which holds nothing beside the arena): slower, but it may fit.  1 when that retry is due
 * (more: there is a next one) and p is freed. */
static int retry_due(Plan *p, int more) {
  if (!more || !p->N || plan_lib_bytes(p, 0, p->N) <= 0 || !plan_limited(p)) return 0;
  err_clear();
  plan_free(p);
  return 1;
}

/* A weight nodes of one kind share (several LayerNorms, Convs) is what an
 * exporter's merging of equal initializers looks like: pipecc trains it as
 * one tied weight, which is what the file says but rarely what was meant. */
static void warn_ties(const Plan *p) {
  const Graph *g = &p->g;
  int *ks = malloc(sizeof(int) * (size_t)(p->N + 1));
  for (int t = 0; ks && t < g->nt; t++) {
    int same;
    if (!g->t[t].is_param || p->nreaders[t] < 2 || (plan_tie_readers(p, t, ks, &same), !same)) continue;
    err_clear();
    err_set("%s: weight '%s' is read by %d nodes, some of the same kind ('%s' %s, '%s' %s): they share one weight and "
            "train it as one (an exporter merging equal initializers does this); if they should not, re-export with "
            "training=torch.onnx.TrainingMode.TRAINING or do_constant_folding=False, or compile with --untie",
            g->path, g->t[t].name, p->nreaders[t], g->n[p->node[ks[0]]].name, g->n[p->node[ks[0]]].op,
            g->n[p->node[ks[1]]].name, g->n[p->node[ks[1]]].op);
    fprintf(stderr, "pipecc: warning: %s\n", err_msg());
    err_clear();
  }
  free(ks);
}

/* A non-finite initializer a gradient reaches is kept a constant (ops.c, mark_params): a causal mask's -inf is
 * meant so, a NaN rarely.  Either way the user hears which, and --constant (which means so) silences it. */
static void warn_nonfinite(const Plan *p) {
  const Graph *g = &p->g;
  for (int t = 0; t < g->nt; t++) {
    if (g->t[t].kept_const != KEPT_NONFINITE) continue;
    int64_t i = const_first_nonfinite(&g->t[t]);
    double v = const_f64(&g->t[t], i);
    err_clear();
    err_set("%s: initializer '%s' %s holds %s (element %lld): not finite, so it is a constant, never trained (--constant "
            "declares it so and silences this)", g->path, g->t[t].name, shape_str(&g->t[t]), v != v ? "NaN" : v > 0 ? "+inf" : "-inf",
            (long long)i);
    fprintf(stderr, "pipecc: warning: %s\n", err_msg());
    err_clear();
  }
}

static void dump_shapes(const Plan *p) {
  const Graph *g = &p->g;
  for (int i = 0; i < g->nt; i++) {
    const Tensor *t = &g->t[i];
    if (t->rank < 0 || strstr(t->name, "::")) continue; /* attribute-internal tensors */
    printf("%s\t%s\t", t->name, dtype_name(t->dtype));
    for (int d = 0; d < t->rank; d++) printf("%s%lld", d ? "," : "", (long long)t->dims[d]);
    printf("\t%s\n", t->data ? "const" : "run");
  }
}

/* The partitioner priced every stage by this arena; this only guards that promise.  0, or 2. */
static int arena_guard(const Plan *p) {
  for (int r = 0; p->rarena && r < opt_ranks(&p->opt); r++) {
    double lim = plan_rank_limit(p, r);
    if (lim > 0 && (double)p->rarena[r] > lim)
      return report_error("%s: internal error: rank %d's arena needs %lld bytes (%s), over the memory limit of %s", p->opt.model, r,
                          (long long)p->rarena[r], fmt_bytes((double)p->rarena[r]), fmt_bytes(lim));
  }
  for (int s = 0; p->arena && s < p->opt.nstages; s++) {
    double lim = plan_stage_limit(p, s);
    if (lim > 0 && (double)p->arena[s] > lim)
      return report_error("%s: internal error: stage %d's arena needs %lld bytes (%s), over the memory limit of %s",
                          p->opt.model, s, (long long)p->arena[s], fmt_bytes((double)p->arena[s]), fmt_bytes(lim));
  }
  return 0;
}

/* Stage programs (first: the listing states their arenas), the memory plan (stages over the limit
 * keep, offload or recompute their stash), the jitter, the arena guard and the stage specs.  0, 2 or RETRY. */
enum { SIDE_PROGRAMS = 1, SIDE_MEMORY, SIDE_JITTER };

/* The stage programs, the memory plan and the jitter (compile, and --schedule auto's candidates): 0,
 * or the SIDE_* that failed, with err set. */
static int stage_side(Plan *p) {
  if (plan_programs(p)) return SIDE_PROGRAMS;
  if (p->progs && stash_plan(p)) return SIDE_MEMORY;
  return plan_jitter(p) ? SIDE_JITTER : 0;
}

static int pass_programs(Plan *p, int more) {
  const char *model = p->opt.model;
  int side = stage_side(p);
  if (side && side != SIDE_JITTER && retry_due(p, more)) return RETRY;
  if (side == SIDE_PROGRAMS) return report_error("%s: %s (--plan-only writes the plan and listing alone)", model, err_msg());
  if (side) return report_error("%s: %s", model, err_msg());
  int rc = arena_guard(p);
  for (int s = 0; !rc && p->progs && s < p->opt.nstages; s++) replica_buckets(p, &p->progs[s], &p->g.pool);
  /* What each stage's program states, decided once: the renderers print it, plan.json states its messages. */
  if (!rc) spec_all(p);
  return rc;
}

/* Listing, emit, commit: DIR written as a whole or not at all.  0, or 2. */
static int pass_write(Plan *p) {
  StageProg *progs = p->opt.plan_only ? NULL : p->progs;
  Buf text = {0}, json = {0}, svg = {0};
  listing_text(p, &text), listing_json(p, &json), listing_timeline(p, &svg);
  OutDir d = {0};
  int rc = 0;
  if (outdir_begin(&d, p->opt.outdir) || outdir_write(&d, "schedule.txt", text.s, text.len) ||
      outdir_write(&d, "plan.json", json.s, json.len) || outdir_write(&d, "timeline.svg", svg.s, svg.len) ||
      (progs && emit_all(p, progs, &d)) || outdir_commit(&d)) {
    report_error("%s", err_msg());
    outdir_abort(&d);
    rc = 2;
  } else if (p->opt.listing) {
    fwrite(text.s, 1, text.len, stdout);
  }
  buf_free(&text);
  buf_free(&json);
  buf_free(&svg);
  return rc;
}

/* One compile with o's convolution implementation: 0, 2, or RETRY when the next one is due. */
static int compile(const Options *o, int more) {
  Plan p;
  if (plan_build(&p, o)) {
    if (retry_due(&p, more)) return RETRY;
    report_error("%s", err_msg());
    plan_free(&p);
    return 2;
  }
  warn_ties(&p);
  warn_nonfinite(&p);
  int rc = 0;
  if (o->dump_shapes) dump_shapes(&p);
  else if ((rc = pass_programs(&p, more)) == 0) rc = pass_write(&p);
  if (rc != RETRY) plan_free(&p);
  return rc;
}

/* ---- --schedule auto ---- */

/* Why a chunked candidate is not planned where args.c would refuse its flags ("" when it is planned). */
static const char *chunked_unplanned(const Options *o) {
  if (o->forward_only) return "--forward-only";
  if (o->replicas > 1) return "stages of several chunks per rank are not replicated yet";
  if (o->offload != OFFLOAD_AUTO || !o->recompute) return "stages of several chunks per rank do not offload or recompute yet";
  return "";
}

/* Candidate c planned as compile() plans (stage programs, memory plan, jitter; the next convolution
 * implementation where one does not fit), written nowhere: its figures, or why it does not plan. */
void driver_candidate(Options t, SchedCand *c) {
  int choice[2], n = conv_impl_choices(t.conv_impl, choice);
  t.schedule = c->kind, t.schedule_auto = 0;
  if (c->chunks > 1) {
    const char *why = chunked_unplanned(&t);
    if (*why) {
      snprintf(c->why, sizeof c->why, "%s", why);
      return;
    }
    t.chunks = c->chunks, t.nstages = t.nranks * c->chunks;
  }
  for (int i = 0; i < n; i++) {
    t.conv_impl = choice[i], t.conv_fallback = i > 0;
    Plan p;
    int built = plan_build(&p, &t) == 0, side = built ? stage_side(&p) : 0;
    if (built && !side) {
      c->fits = 1, c->step = p.sched.step_time, c->bubble = p.sched.bubble, c->peak = -1;
      for (int s = 0; p.arena && s < opt_ranks(&t); s++) {
        int64_t a = p.rarena ? p.rarena[s] : p.arena[s];
        if (a > c->peak) c->peak = a;
      }
      plan_free(&p);
      return;
    }
    if (side != SIDE_JITTER && retry_due(&p, i + 1 < n)) continue; /* p freed */
    snprintf(c->why, sizeof c->why, "%s", err_msg());
    err_clear();
    plan_free(&p);
    return;
  }
}

/* A candidate within this of the fastest's predicted step is as fast: the one of them whose busiest
 * arena is smallest is kept (the simulation's own spread is about 0.3%, driver.c's jitter draws). */
#define AUTO_SAME_STEP 1.005

/* A candidate's refusal in a few words for the line that lists them all: its first clause, and the
 * smallest memory limit it names. */
static void short_why(const char *why, char *out, size_t len) {
  size_t n = strcspn(why, ";:(");
  if (n > 60) n = 60;
  while (n > 0 && why[n - 1] == ' ') n--;
  const char *least = strstr(why, "at least ");
  int k = least ? atoi(least + 9) : 0;
  if (k > 0 && strstr(why, "--mem-limit")) snprintf(out, len, "%.*s, needs --mem-limit %dK", (int)n, why, k);
  else snprintf(out, len, "%.*s%s", (int)n, why, why[n] && n == 60 ? "..." : "");
}

/* --schedule auto: 1f1b, gpipe, zb1, interleaved with 2, 3 and 4 chunks per rank, and zbv (two) planned in
 * turn; o->schedule (and o->chunks) become the fastest predicted that fits (as fast: the leanest), o->cands
 * says what each predicted.  0, or 2 when none plans. */
static int choose_schedule(Options *o) {
  enum { NCAND = 7 };
  static SchedCand cand[NCAND];
  /* 1f1b first: where the figures tie (one stage), the default is kept. */
  static const int kinds[NCAND] = {SCHED_1F1B, SCHED_GPIPE, SCHED_ZB1, SCHED_INTERLEAVED, SCHED_INTERLEAVED, SCHED_INTERLEAVED, SCHED_ZBV};
  static const int chunks[NCAND] = {1, 1, 1, 2, 3, 4, 2};
  int best = -1;
  for (int k = 0; k < NCAND; k++) {
    memset(&cand[k], 0, sizeof cand[k]);
    cand[k].kind = kinds[k], cand[k].chunks = chunks[k];
    driver_candidate(*o, &cand[k]);
    if (cand[k].fits && (best < 0 || cand[k].step < cand[best].step)) best = k;
  }
  if (best < 0) {
    char w[NCAND][112];
    for (int k = 0; k < NCAND; k++) short_why(cand[k].why, w[k], sizeof w[k]);
    return report_error("%s: --schedule auto: no schedule plans (1f1b: %s; gpipe: %s; zb1: %s; interleaved x2: %s; x3: %s; x4: %s; zbv: %s; "
                        "--schedule KIND alone says all)", o->model, w[0], w[1], w[2], w[3], w[4], w[5], w[6]);
  }
  int keep = best;
  for (int k = 0; k < NCAND; k++)
    if (cand[k].fits && cand[k].step <= cand[best].step * AUTO_SAME_STEP && cand[k].peak < cand[keep].peak) keep = k;
  o->schedule = kinds[keep], o->cands = cand, o->ncands = NCAND;
  if (cand[keep].chunks > 1) o->chunks = cand[keep].chunks, o->nstages = o->nranks * cand[keep].chunks;
  return 0;
}

int driver_run(Options *o) {
  /* The runtime the generated Makefile will name (rtpath.c): one that is missing, or an installed one
   * without the target's library, is said before the planning, not after it. */
  RtPath rt;
  if (!o->plan_only && !o->dump_shapes && rtpath_find(o->target, &rt)) return report_error("%s", err_msg());
  if (o->ranks && !o->dump_shapes && layout_choose(o, driver_candidate)) return 2;
  if (o->schedule_auto && !o->dump_shapes && choose_schedule(o)) return 2;
  int choice[2], n = conv_impl_choices(o->conv_impl, choice), rc = RETRY;
  for (int i = 0; i < n && rc == RETRY; i++) {
    o->conv_impl = choice[i], o->conv_fallback = i > 0;
    rc = compile(o, i + 1 < n);
  }
  return rc;
}
