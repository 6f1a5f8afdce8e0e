/* spec.h - one pipeline stage, closed: everything a renderer prints.
 *
 * spec.c builds a StageSpec from the plan and the stage's laid-out program
 * before anything is printed: the buffers with their offsets and how a
 * function reaches each copy, the functions as lists of calls (the op rules'
 * eval and recompute variants already chosen), the schedule, the message
 * tables with peers and tags, pipefb's stash and weight tables, tied
 * weights' parts, the parameters, the memory plan's blocks, the profile's
 * marks and the stage descriptor's fields.  A renderer (render.h) reads only
 * the spec: it decides nothing, so a second device is a second renderer. */
#ifndef PIPECC_SPEC_H
#define PIPECC_SPEC_H
#include "stageprog.h"

/* How a function reaches a buffer: one copy, the copy of the micro-batch's
 * ring slot, gradient slot or leaving-value slot, or (async) the weights
 * version the running step computes on. */
enum { VIEW_PLAIN, VIEW_SLOT, VIEW_GSLOT, VIEW_XSLOT, VIEW_WEIGHTS, VIEW_STORE, VIEW_WSLOT };

typedef struct SpecBuffer {
  const char *name;      /* identifier; OFF_name and SIZE_name are its offset and size */
  int64_t offset, bytes; /* copy 0, one copy */
  int is_int64;          /* int64_t elements (labels, indices), else float */
  int view;              /* VIEW_* */
  const char *what;      /* what it holds, for its comment */
  const char *leaves;    /* VIEW_XSLOT: offloaded or recomputed between forward and backward */
} SpecBuffer;

/* A call as a function runs it: the call (or its variant), then the
 * profile's mark (row, PR_PROF_* direction; row -1: none) and a poll. */
typedef struct SpecCall {
  const Call *call;
  int mark, mark_dir;
  int poll;
} SpecCall;
enum { MARK_FWD, MARK_BWD_INPUT, MARK_BWD_WEIGHT };

/* The functions a stage may have.  Forward-shaped ones take (slot, xslot),
 * backward-shaped ones (slot, xslot, gslot), the optimizer step's none. */
enum { FN_FORWARD, FN_FORWARD_EVAL, FN_RECOMPUTE, FN_BACKWARD, FN_BACKWARD_INPUT, FN_BACKWARD_WEIGHT, FN_ZERO_GRADS, FN_SUM_TIES,
       FN_UPDATE, FN_COUNT };
enum { FN_ARGS_FORWARD, FN_ARGS_BACKWARD, FN_ARGS_NONE };
typedef struct SpecFn {
  int present;
  const char *name, *doc; /* doc: the comment above it ("" for none) */
  int args;               /* FN_ARGS_* */
  int profiled;           /* starts the profile's clock */
  SpecCall *calls;
  int ncalls;
} SpecFn;

/* A value crossing a cut, as the RECV and SEND tables carry it. */
typedef struct SpecValue {
  const char *name, *shape; /* the tensor's name and "[8,1,28,28]" */
  int64_t bytes;
  int buf, gbuf;         /* buffer ids (-1: none, or not in this rank's arena) */
  int source;            /* SRC_* */
  int dtype, rank;
  const int64_t *dims;
  int xring, peer, tag;
  int chunk;             /* a rank of --chunks V: the chunk that receives or sends it */
} SpecValue;
enum { SRC_PREV, SRC_IMAGES, SRC_TOKENS };

/* pipefb: a stashed value per micro-batch, or a weight once per step. */
typedef struct SpecFbMsg {
  const char *name;      /* stash only */
  int buf;
  int64_t bytes;
  int peer, id;
} SpecFbMsg;

typedef struct SpecParam {
  const char *name;      /* the ONNX initializer */
  int buf, gbuf, m1, m2; /* -1: none */
  int64_t floats;
  const struct TiePart *parts; /* a tied weight's parts in graph order ({buf, stage}), NULL */
  int nparts;
  int layer;
  int grad_in_file;      /* --offload-optimizer: its gradient lives in the stage's file */
} SpecParam;

enum { OPT_SGD, OPT_ADAM, OPT_ADAMW };

typedef struct StageSpec {
  const StageProg *prog;  /* its shape constants and calls (the buffers are below) */
  int stage, nstages, microbatches, role; /* ROLE_* */
  int64_t mb_size, batch;
  int nslots, ngslots, threads;
  int64_t arena_bytes, weights_bytes;
  const char *model;      /* the model's path */
  const char *target;     /* the device it is rendered for (pipecc --target) */
  int precision;          /* PREC_* (pipecc --precision) */
  const char *version;    /* pipecc's */
  /* The header comment: one line each, model text unescaped (renderers escape). */
  const char *first_node, *last_node, *schedule_name;
  int node_lo, node_hi;   /* compute nodes node_lo..node_hi */
  const char **ops;       /* each compute node's op */
  int nops;
  int last_stage;
  const char *fwd_time, *bwd_time;
  /* Pinning: ranks outnumber cores (pin_cores > 0), or a rank of several threads. */
  int pin_core, pin_cores, shared_cores;
  /* async */
  int async, staleness, lookahead, nwversions;
  int64_t wversion_base, wversion_stride;
  /* The memory plan: leaving values' blocks and a peer's store. */
  int memory_plan, nxslots, nstore, offload_to, store_owner, recomputes;
  int64_t xbase, xstride, xout, store_base, store_stride;
  const char *offload_dir;
  /* --offload-optimizer: the optimizer state's file (bytes, the directory) and the update's block. */
  int64_t opt_store_bytes, opt_block, opt_stage_bytes;
  int grad_out, ngrad_pieces;
  const char *opt_dir;
  /* --replicas R > 1 (replica.c): the weight gradients' region, where the other replicas' shards land, and
   * the buckets it is summed in (replicas 1: none of it). */
  int replicas, nbuckets, zero;
  int64_t grad_lo, grad_hi, reduce_base, shard_floats;
  const Bucket *buckets;
  SpecBuffer *bufs;       /* one per program buffer, in order; unused ones have name NULL */
  int nbufs;
  char *shape_used;       /* per shape constant: some printed call names it */
  SpecFn fn[FN_COUNT];
  /* The loss on the last stage (NULL elsewhere and on pipefb's backward ranks): its call, whose comment
   * says what it computes; and for the descriptor its buffers and sizes. */
  const Call *loss;
  int loss_buf, labels_buf;
  int64_t loss_rows, loss_classes;
  /* The schedule: one step's actions, or under async step t's body. */
  const Action *actions;
  int nactions;
  SpecValue *recv, *send;
  int nrecv, nsend;
  SpecFbMsg *stash_send, *stash_recv, *wsend, *wrecv;
  int nstash_send, nstash_recv, nwsend, nwrecv;
  SpecParam *params;
  int nparams;
  /* The descriptor's fields. */
  int optimizer;          /* OPT_* */
  double lr, momentum, weight_decay, predicted_bytes, predicted_step;
  int64_t vocab;
  int forward_only, prev_rank, next_rank, loss_rank, nfrozen, nlayers, pipefb;
  /* --profile: each node's key ("index op name"), the planned rate and how convolutions run. */
  const char **prof_nodes;
  int nprof, prof_conv; /* prof_conv: conv_profile_kind's 0 none, 1 im2col, 2 oneDNN */
  double prof_rate;
  /* A rank of --chunks V (chunks.c): its chunks' functions (forward .. backward_weight of chunk c at
   * chunk_fn[c * FN_COUNT + fn], named NAME_c<c>; fn[] then holds the optimizer step's alone), each chunk's
   * stage, and a line per chunk for the header.  nchunks 0: the program of one stage. */
  int nchunks, loss_chunk;
  SpecFn *chunk_fn;
  const int *chunk_stage;
  const char **chunk_line;
} StageSpec;

/* Builds stage s's spec (allocations in pool). */
void spec_build(const Plan *p, const StageProg *progs, int s, StageSpec *out, Pool *pool);
/* Every stage's spec into p->specs, once the memory plan has settled the programs (nothing without them). */
void spec_all(Plan *p);
#endif
