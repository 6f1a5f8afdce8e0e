/* schedule.h - each rank's ordered list of actions for one optimizer step
 * (compute, messages, the update), the ring slots they use, a validator
 * that runs all lists together under MPI's blocking rules, and the
 * predicted timing. */
#ifndef PIPECC_SCHEDULE_H
#define PIPECC_SCHEDULE_H
#include "partition.h"

/* The action kinds, ACT_F, ACT_SEND, ...: runtime/actions.def, shared with the runtime (PR_*) and the
 * timelines (TL_*), which says what each does. */
enum {
#define ACTION(name, legend, meaning) ACT_##name,
#include "../runtime/actions.def"
#undef ACTION
  ACT_NKINDS
};

/* A stage's ring sizes for its memory plan (memplan.c).  Under a split backward (zb1, zbv) the stage
 * program picks one of two layouts, and the lists then follow it (Schedule.hold):
 * - late: the forward ring copy is free after I, and what W reads of the forward is a late value, a copy
 *   per wslot held from F to W: `slots` forward copies, `wslots` late copies;
 * - hold: W reads the forward ring, whose copy is held until W: `hslots` forward copies, no late ring.
 * Without a split, slots = hslots and wslots = 0. */
typedef struct RingSizes {
  int slots, hslots, gslots, wslots;
} RingSizes;

typedef struct Action {
  int kind;          /* ACT_* */
  int mb;            /* micro-batch, -1 for UPDATE */
  int slot;          /* ring copy of mb's forward values, -1 if the action does not touch them */
  int gslot;         /* gradient ring copy, -1 if the action does not touch it */
  int wslot;         /* zb1, zbv: copy of mb's late values (kept forward values a W reads: memplan.c), -1 if none */
  int xslot;         /* copy of mb's leaving values (stash.c; HOLD/RETURN: store slot), -1 if none */
  int peer;          /* OFFLOAD/PREFETCH: the rank holding the data (-1: the file); HOLD/RETURN: its owner */
  int chunk;         /* which of the rank's stages (chunks) it belongs to: 0 unless sc->nchunks > 1 */
  double start, end; /* predicted seconds from the step's start */
} Action;

/* PipeFB's links: ranks 0..nf-1 run forwards, nf..n-1 backwards; each
 * list names ranks. */
typedef struct FbLinks {
  int nf;
  int *prev, *next;               /* per rank: the rank before and after it in its chain (-1 at an end) */
  int **stash_to, *nstash_to;     /* forward rank: the backward ranks its stashed values go to */
  int **stash_from, *nstash_from; /* backward rank: the forward ranks they come from */
  int **w_from, *nw_from;         /* forward rank: the backward ranks its weights come from */
  int **w_to, *nw_to;             /* backward rank: the forward ranks it sends weights to */
} FbLinks;

typedef struct Schedule {
  int nstages, m, kind, forward_only; /* nstages: the ranks, one action list each */
  /* Virtual stages: with nchunks = V > 1 the model is cut into S = n V
   * stages and rank r runs V of them, its chunks (sched_stage says which);
   * 0 or 1: a stage per rank.  The per-stage arrays below then have S
   * entries indexed by stage (with one chunk, stage = rank). */
  int nchunks;
  Action **act;      /* act[s][k]: rank s's k-th action */
  int *nact;         /* actions per rank */
  int *nslots;       /* forward ring copies per stage: the most slots live at once */
  int *ngslots;      /* gradient ring copies per stage */
  int *nwslots;      /* late-value ring copies per stage (split lists: F to W; 0 otherwise) */
  int *hold;         /* split lists, per stage: 1 if W holds the forward ring copy (the hold layout), 0 for the late
                      * values (NULL: 0); the stage program's memory plan chooses (memplan.c), the lists follow */
  RingSizes *rings;  /* per stage: the ring sizes of both layouts for the lists as they stand */
  int *nxslots;      /* copies of the leaving values per stage (0: the stage offloads and recomputes nothing) */
  int *nstore;       /* store slots per stage for a peer's offloaded values (0: it holds none) */
  double step_time;  /* predicted makespan of one step */
  double bubble;     /* 1 - mean busy / makespan (docs/cost.md, "The bubble") */
  double jitter;     /* schedule_jitter: the actions' measured relative spread (0: not applied) */
  int jitter_draws;  /* ... over how many simulations the step time and bubble are the means */
  double step_time_fixed, bubble_fixed; /* ... and the figures with every action at its median time */
  double *busy;      /* per rank (over its chunks): compute time (F, B, I, W, RECOMPUTE, UPDATE, at unshared speed; not message time) */
  int cores;         /* cores the ranks share (schedule_time); 0: a core per rank */
  int *core_of;      /* with more ranks than cores: the core each rank is pinned to (schedule_pin); NULL: unpinned */
  double step_unpinned; /* pinned lists: their step unpinned (the mean-field model; plan_jitter), else 0 */
  const FbLinks *fb; /* pipefb: who sends what to whom (NULL for the other schedules) */
  /* Direct sends (plan_route): per rank, the ranks its forward values come
   * from (its F waits for their SENDs; its gradients go back to them) and
   * go to (its B waits for their SEND_GRADs).  NULL: the neighbours. */
  int **src, *nsrc, **dst, *ndst;
  /* async (schedasync.c): the lists above are what the ranks run over
   * `unroll` steps (global micro-batches 0 .. unroll*m-1, an UPDATE per
   * step), so the validator and the simulation see the step boundary.  The
   * program runs body[s] once per step t: an action of micro-batch mb there
   * is global micro-batch t*m + mb (mb >= m: a later step's), skipped when
   * that is before the first or after the last step's; rings are indexed by
   * the global micro-batch modulo their size. */
  int staleness;     /* K: step t computes on the weights W_max(0, t-K) (0: synchronous) */
  int unroll;        /* steps in act[] (0: one, the synchronous lists) */
  int replicas;      /* --replicas R > 1: each rank's list sums its gradients over the replicas (REDUCE, REDUCE_WAIT) */
  double share;      /* > 1: the replicas outnumber the host's cores (x threads), and compute takes this much longer */
  int lookahead;     /* L: body actions reach micro-batches of up to L steps later */
  Action **body;     /* per rank: one step's actions */
  int *nbody;
  double fill_drain; /* predicted seconds a run spends filling and draining the pipeline, once */
} Schedule;


/* Micro-batches the lists of sc name: m, or m * unroll for async. */
static inline int sched_mbs(const struct Schedule *sc) { return sc->m * (sc->unroll > 0 ? sc->unroll : 1); }

/* Virtual stages: S = n V of them over the n ranks.  Interleaved deals
 * them round-robin (rank r's chunk c is stage c n + r); ZB-V folds them
 * into a V (chunk 0 runs down the ranks, chunk 1 back up: rank r holds
 * stages r and 2n-1-r, so rank 0 has the first and the last, rank n-1 the
 * two in the middle).  With one chunk, stage = rank. */
static inline int sched_nvstages(const struct Schedule *sc) { return sc->nstages * (sc->nchunks > 1 ? sc->nchunks : 1); }
static inline int sched_stage(const struct Schedule *sc, int rank, int chunk) {
  int n = sc->nstages;
  if (sc->nchunks <= 1) return rank;
  return sc->kind == SCHED_ZBV && chunk % 2 ? (chunk + 1) * n - 1 - rank : chunk * n + rank;
}
static inline int sched_chunk_of(const struct Schedule *sc, int stage) { return sc->nchunks <= 1 ? 0 : stage / sc->nstages; }
static inline int sched_rank_of(const struct Schedule *sc, int stage) {
  int n = sc->nstages, j = stage % n;
  if (sc->nchunks <= 1) return stage;
  return sc->kind == SCHED_ZBV && (stage / n) % 2 ? n - 1 - j : j;
}

/* Builds each rank's action list, assigns slots and predicts its timing from
 * each stage's per-micro-batch forward, backward (bwd_w of it the weight
 * gradient) and communication time. */
void schedule_build(Schedule *sc, int kind, int nstages, int m, int forward_only, const StageCost *cost, Pool *pool);
/* Virtual stages (schedchunk.c): SCHED_INTERLEAVED (V >= 2 chunks, m a
 * multiple of the n ranks) or SCHED_ZBV (V = 2) over nranks ranks; cost has
 * n V entries, one per stage.  Builds, assigns slots per chunk and times
 * the lists.  0, or -1 with err_set for a refusal. */
int schedule_build_chunked(Schedule *sc, int kind, int nranks, int nchunks, int m, const StageCost *cost, Pool *pool);
/* Empty links for n ranks, nf of them forward ones: each chain's prev/next
 * filled in, no stash or weight links yet (room for n of each per rank). */
void fb_links_init(FbLinks *L, int n, int nf, Pool *pool);
/* PipeFB's lists (pipefb.c decides the links): a forward rank runs F for
 * every micro-batch, sending its values on and its stash to the backward
 * ranks, then receives the new weights; a backward rank runs B for every
 * micro-batch, then UPDATE and sends the weights back.  Two ring slots each. */
void schedule_build_pipefb(Schedule *sc, const FbLinks *fb, int n, int m, const StageCost *cost, Pool *pool);
/* Asynchronous 1F1B (schedasync.c): one step's body per rank that never
 * drains, unrolled for checking; weights of staleness K.  0, or -1 with
 * err_set naming the smallest number of micro-batches that honours K. */
int schedule_build_async(Schedule *sc, int nstages, int m, int staleness, const StageCost *cost, Pool *pool);
/* The async checks beyond the lists' own: each compute action's weight
 * version exists (at most K older than the newest), and the steps are a
 * consistent cut (every rank can stop between two steps, as a checkpoint does). */
int schedule_validate_async(const Schedule *sc);
/* After a simulation of async lists: step_time and bubble of the steady
 * state (between two UPDATEs in the middle), fill_drain the rest. */
void schedule_async_period(Schedule *sc);
/* The compute order c (n actions) with its messages interleaved, into out;
 * the UPDATE appended last when final_update (async orders carry their own);
 * late: zb1's late layout (the forward copy free after I) places the receives. */
int schedule_add_messages(Action *out, const Action *c, int n, int s, int p, int m, int fwd_only, int final_update, int late);
/* The same for rank r of a chunked schedule (sc's nstages, nchunks, kind
 * and m): each chunk's messages as its stage needs them, and a receive
 * from a stage on the same rank posted before the send that copies into it. */
int schedule_add_messages_chunked(const Schedule *sc, int r, Action *out, const Action *c, int n);
/* Runs every rank's list together: complete and consistent lists, matching
 * sends and receives, no deadlock, no slot taken while still live.  0, or -1
 * with err_set naming the ranks and actions. */
int schedule_validate(const Schedule *sc);
/* Re-derives slot/gslot/wslot assignments and ring sizes of an edited list (tests); chunked: each chunk's
 * ring.  Each stage's rings follow sc->hold; sc->rings gets both layouts' sizes. */
void schedule_assign_slots(Schedule *sc, int s);
/* Stage st's ring sizes, both layouts (a stage's memory plan chooses; schedule_hold makes the lists follow). */
RingSizes sched_rings(const Schedule *sc, int st);
/* Rank r's list with its messages placed for its stages in layout `hold` (zb1, zbv), into out (nact[r] actions);
 * the list itself stays as it is. */
void schedule_placed(const Schedule *sc, int r, int hold, Action *out);
/* Fresh split lists (zb1, zbv) of rank s: its stages' ring sizes in both layouts, each with the receives
 * placed for it (sc->rings; the lists stay as they are). */
void schedule_ring_sizes(Schedule *sc, int s);
/* Stage st's layout (1: W holds the forward ring copy): when it changes, its rank's messages are placed
 * again for it and its slots assigned (the caller times the lists again). */
void schedule_hold(Schedule *sc, int st, int hold);
/* Predicted timing of the lists as they stand; -1 with err_set if they stall. */
int schedule_time(Schedule *sc, const StageCost *cost);
/* More ranks than cores on one host: chooses the core each rank is pinned
 * to (sc->core_of, from pool), the assignment whose simulated step is
 * shortest, and leaves the lists timed with it.  Does nothing (0) when every
 * rank has a core.  -1 with err_set if the lists stall. */
int schedule_pin(Schedule *sc, const StageCost *cost, Pool *pool);
/* Actions whose times spread (relative standard deviation cv, measured by
 * a profile) make ranks wait for the slower side of every exchange, which
 * a simulation of the medians does not see: the step time and bubble
 * become the means over `draws` simulations with each compute action's
 * time drawn around its median (a fixed seed: the same plan every time);
 * the actions keep their median timing.  Not for async or oversubscribed
 * lists (left as they are).  -1 with err_set if a draw stalls. */
int schedule_jitter(Schedule *sc, const StageCost *cost, double cv, int draws);
/* The analytic bubble of a balanced pipeline: (p - 1) / (m + p - 1). */
double schedule_ideal_bubble(int nstages, int m);
const char *schedule_name(int kind);
const char *action_kind_name(int kind);
/* An action of kind and mb, with no slots and no peer. */
Action action_make(int kind, int mb);
/* "F3", "SEND_GRAD5", "UPDATE"; an action of chunk c > 0: "F3@1" */
const char *action_str(const Action *a, char *buf, size_t len);
static inline int action_is_compute(int kind) { return kind == ACT_F || kind == ACT_B || kind == ACT_I || kind == ACT_W; }
#endif
