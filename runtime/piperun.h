/* piperun.h - libpiperun: what a generated stage program hands the runtime.
 *
 * The compiler decides everything static - buffer offsets, the schedule,
 * what crosses each cut - and writes it into a PrStage.  pr_main runs it:
 * MPI set-up, data, the step loop that executes the schedule's action list
 * (compute, message posts, the update) with the slots the compiler chose,
 * logging, checkpoints, the trace. */
#ifndef PIPERUN_H
#define PIPERUN_H
#include <stdint.h>

#include "kernels.h"
#include "profile.h"

/* What an action does: PR_F, PR_SEND, ... (actions.def, where each kind's meaning is written). */
#include "actions.h"

typedef struct PrAction {
  int kind;  /* PR_* (actions.def) */
  int mb;    /* micro-batch, -1 for UPDATE */
  int slot;  /* ring copy of the forward values, -1 if unused */
  int gslot; /* gradient ring copy, -1 if unused */
  int wslot; /* zb1, zbv: copy of the late values (what W reads of the forward), -1 if unused */
  int xslot; /* copy of the leaving values (HOLD/RETURN: store slot), -1 if unused */
  int peer;  /* OFFLOAD/PREFETCH: the rank holding the data, -1 the file; HOLD/RETURN: the owner */
  int chunk; /* pipecc --chunks: which of the rank's chunks (PrStage.chunks) it runs; 0 otherwise */
} PrAction;

enum { PR_FROM_PREV = 0, PR_FROM_IMAGES = 1, PR_FROM_TOKENS = 2 };

/* A value that crosses a cut, per micro-batch. */
typedef struct PrValue {
  const char *name;
  int64_t bytes;
  int64_t offset;      /* ring copy 0 in the arena; copy k at offset + k * bytes */
  int64_t goffset;     /* its gradient's ring (ngslots copies), -1 if no gradient travels */
  int source;          /* receives: PR_FROM_* */
  int dtype;           /* ONNX element type: 1 float32, 7 int64 */
  int rank;
  int64_t dims[8];
  int xring;           /* received into the xslot block (it leaves between forward and backward) */
  int peer;            /* the rank it comes from (RECV) or goes to (SEND), its gradient the other way; -1: the loader or the loss */
  int tag;             /* its number among the values between this rank and that peer, in both ranks' tables */
  int chunk;           /* pipecc --chunks: the chunk that receives (RECV) or sends (SEND) it; peer == this rank: a local copy */
} PrValue;

/* One reading node's part of a tied weight's gradient. */
typedef struct PrPart {
  int64_t offset;      /* in this stage's arena: computed here, or received into */
  int stage;           /* the stage that computes it */
} PrPart;

/* pipecc --replicas: a bucket of the weight gradients, bytes [lo, hi) of the arena (runtime/replica.c). */
typedef struct PrBucket {
  int64_t lo, hi;
} PrBucket;

typedef struct PrParam {
  const char *name;    /* the ONNX initializer */
  int64_t count;       /* floats */
  int64_t offset, goffset, m1offset, m2offset; /* -1 when absent */
  /* A weight several nodes read (tied): each node's partial gradient, in graph
   * order; the gradient (goffset) is their sum in that order, formed at the
   * update on every stage that holds the weight.  NULL / 0 otherwise. */
  const PrPart *parts;
  int nparts;
  int layer;           /* its parameterised layer (its first reader), from 0 in the loaded order, frozen ones counted */
  int grad_in_file;    /* pipecc --offload-optimizer: goffset is the gradient's place in the stage's file (PrStage.opt_store_bytes) */
} PrParam;

enum { PR_SGD = 0, PR_ADAM = 1, PR_ADAMW = 2 };

/* What a rank runs: forwards and backwards, or under pipefb only one of them. */
enum { PR_ROLE_BOTH = 0, PR_ROLE_FWD = 1, PR_ROLE_BWD = 2 };

/* PipeFB: a stashed value, per micro-batch, between the forward rank that
 * computes it and the backward rank that reads it (id: the same on both). */
typedef struct PrStash {
  const char *name;
  int64_t bytes;
  int64_t offset;      /* ring copy 0; copy k at offset + k * bytes */
  int peer;            /* the backward rank it goes to, or the forward rank it comes from */
  int id;
} PrStash;

/* PipeFB: a weight, from the backward rank that updates it to a forward rank that reads it. */
typedef struct PrWeight {
  int64_t offset, count; /* floats */
  int peer, id;
} PrWeight;

/* pipecc --chunks V (--schedule interleaved, zbv): a rank runs V stages of the model, its chunks.  Each
 * has its forward and backward functions and its rows [recv_lo, recv_hi) of RECV and [send_lo, send_hi)
 * of SEND; its ring slots are its own (an action's slot is one of its chunk's).  A value between two
 * chunks of one rank is copied, not sent. */
typedef struct PrChunk {
  int stage;                   /* the model's stage it is */
  void (*forward)(int slot, int xslot, int gslot, int wslot);
  void (*forward_eval)(int slot, int xslot, int gslot, int wslot);
  void (*backward)(int slot, int xslot, int gslot, int wslot);
  void (*backward_input)(int slot, int xslot, int gslot, int wslot);
  void (*backward_weight)(int slot, int xslot, int gslot, int wslot);
  int recv_lo, recv_hi, send_lo, send_hi;
  int loss;                    /* the loss follows its forward (it is the last stage) */
} PrChunk;

typedef struct PrStage {
  int stage, nstages, microbatches, mb_size, batch, nslots, ngslots;
  const char *model;           /* for messages */
  unsigned char *arena;
  int64_t arena_bytes, weights_bytes;
  const PrAction *actions;
  int nactions;
  const PrValue *recv, *send;
  int nrecv, nsend;
  const PrParam *params;
  int nparams;
  void (*forward)(int slot, int xslot, int gslot, int wslot);
  void (*forward_eval)(int slot, int xslot, int gslot, int wslot);  /* run.sh --val: the eval forward where it differs (training BatchNorm, Dropout); else NULL */
  void (*backward)(int slot, int xslot, int gslot, int wslot);
  void (*backward_input)(int slot, int xslot, int gslot, int wslot);  /* zb1: the I and W halves of backward; NULL otherwise */
  void (*backward_weight)(int slot, int xslot, int gslot, int wslot);
  /* The optimizer step (compiler/update.c): zero the weight gradients before a step's first backward;
   * sum each tied weight's parts once the runtime has exchanged them; update every weight with
   * pr_opt's hyper-parameters.  NULL where the program has none (a pipefb forward rank, inference). */
  void (*zero_grads)(void);
  void (*sum_ties)(void);
  void (*update)(void);
  /* last stage: loss over the logits of one micro-batch; returns the sum over rows */
  double (*loss)(int slot, const int64_t *labels);
  int64_t loss_rows, loss_classes; /* per micro-batch */
  int64_t labels_offset;
  int64_t logits_offset, logits_bytes; /* last stage: the loss's logits (ring copy k at offset + k * bytes) */
  /* optimizer chosen at compile time; hyper-parameters can be overridden at run time */
  int optimizer;
  float lr, momentum, weight_decay, beta1, beta2, eps;
  int64_t vocab;               /* token models: ids must be below it */
  double predicted_bytes;      /* the planner's memory estimate for this stage */
  double predicted_step_s;     /* the planner's predicted step time */
  int pin_core, pin_cores;     /* more ranks than cores: pin to the pin_core-th of pin_cores CPUs (pin_cores 0: unpinned) */
  int threads;                 /* pipecc --threads: the threads this rank computes on (OpenBLAS, oneDNN, par.h); 0 is 1 */
  int forward_only;            /* an inference program: pr_main runs pr_eval */
  /* The memory plan (compiler/stash.c); all 0 when nothing leaves. */
  int nxslots;                 /* copies of the leaving values' block */
  int64_t xslot_base, xslot_bytes, xout_bytes; /* the block: copy k at base + k * bytes; OFFLOAD copies its first xout_bytes */
  int offload_to;              /* the peer rank holding them, -1 the file in offload_dir, -2 none */
  const char *offload_dir;
  int nstore;                  /* store slots for the peer rank store_owner's offloaded values */
  int64_t store_base, store_bytes;
  int store_owner;
  void (*recompute)(int slot, int xslot, int gslot, int wslot); /* NULL if nothing is recomputed */
  /* pipecc --offload-optimizer: the optimizer state lives in a file of opt_store_bytes in opt_dir (0: in
   * the arena); each parameter's m1offset and m2offset are its places there. */
  int64_t opt_store_bytes;
  const char *opt_dir;
  int ngrad_pieces;            /* ... the pieces of gradients its backward brings in (k_grad_fetch's ids) */
  /* pipecc --profile: "K OP NAME" of each node the forward and backward mark
   * (PR_PROF(i, dir), i indexing this table); NULL / 0 otherwise.  rate: the
   * FLOP/s the compiling pipecc planned with, written into the profile.
   * conv: how the stage's convolutions run (PR_CONV_*), which the profile
   * says: their times hold for that implementation only. */
  const char *const *prof_nodes;
  int nprof;
  double prof_rate;
  int prof_conv;
  /* Its chain: forward values come from prev_rank and go to next_rank,
   * gradients the other way (-1 at an end); the loss rank logs and sums up. */
  int role;                    /* PR_ROLE_* */
  int prev_rank, next_rank, loss_rank;
  const PrStash *stash_send, *stash_recv; /* pipefb: per micro-batch */
  int nstash_send, nstash_recv;
  const PrWeight *wsend, *wrecv;          /* pipefb: once per step */
  int nwsend, nwrecv;
  /* async (compiler/schedasync.c): `actions` is step t's body, run for t =
   * -lookahead .. steps-1; micro-batch k there is the run's t * microbatches
   * + k, skipped outside the run; rings are indexed by it modulo their
   * size.  Step t's F and B compute on the weights of step max(0, t -
   * staleness): the newest (the weights region, which UPDATE changes) or
   * one of nwversions older copies of the region (version v at
   * wversion_base + (v % nwversions) * wversion_bytes).  0: synchronous. */
  int staleness, lookahead, nwversions;
  int nfrozen;                 /* pipecc --frozen: the parameterised layers frozen in this program (run.sh --freeze-at) */
  int nlayers;                 /* the model's parameterised layers, frozen ones counted (--freeze auto's gradient norms) */
  int64_t wversion_base, wversion_bytes;
  /* pipecc --target cuda: where the program's calls find the arena (its `arena` pointer, which the
   * runtime points at the device's copy before the first call; `arena` above is then the host image)
   * and the precision its products run in (PR_PREC_*, cuda/precision.h).  NULL and 0 on the CPU. */
  unsigned char **dev_arena;
  int precision;
  const PrChunk *chunks;       /* pipecc --chunks: this rank's chunks (NULL, 0: one stage, the functions above) */
  int nchunks;
  /* pipecc --replicas R (runtime/replica.c): R copies of the pipeline (world rank = replica x nstages +
   * stage), `batch` being one replica's share; the weight gradients [grad_lo, grad_hi) summed over them in
   * buckets, the other replicas' copies of this rank's shard landing from reduce_base.  0 or 1: one. */
  int replicas;
  const PrBucket *buckets;
  int nbuckets;
  int64_t grad_lo, grad_hi, reduce_base;
  int64_t shard_floats;        /* one replica's shard of the region (the last one shorter) */
  int zero;                    /* pipecc --zero 1: each replica keeps and updates its shard's optimizer state only */
} PrStage;

/* The weights region the running F or B computes on: the arena's own, or
 * under async an older version's copy.  Generated async programs address
 * their weights through it. */
extern unsigned char *pr_weights;
/* pipecc --progress poll: called between nodes; tests the requests in flight so MPI moves them during compute. */
void pr_poll(void);

/* What the random kernels (Dropout) key their numbers by, besides the node:
 * the run's --seed, and the step and micro-batch of the action running.
 * pr_main sets step and mb before every F, B, I and W action; generated
 * calls name it as a symbol argument (k_dropout(..., &pr_rand)), so the
 * kernel reads it at run time while the call stays data in the compiler.
 * An inference program (pr_eval) runs step 0, micro-batch 0, seed 1. */
extern RandCtx pr_rand;
/* The optimizer's hyper-parameters and step for the update() being run (set at each UPDATE). */
extern OptCtx pr_opt;

/* Inference: reads each input from DIR/input_<k>.pb (ONNX TensorProto, in
 * graph-input order), runs forward once, writes each output raw to
 * OUT/<k>.bin in the order of st->send.  Used by the conformance tests. */
int pr_eval(int argc, char **argv, const PrStage *st);
/* The stage's directory (weights/ is in it): PIPERUN_DIR, else the one the program is in. */
const char *pr_stage_dir(void);

int pr_main(int argc, char **argv, const PrStage *st);
/* "F", "SEND_GRAD", ... */
const char *pr_kind_name(int kind);
/* Collective: every stage's weights go to stage 0, which writes `path` - the
 * original model (dir/model.onnx) with its initializers replaced. */
void pr_save_onnx(const PrStage *st, const char *path, const char *dir);
/* Collective, before step 1: the manifest pr_save_onnx reads (dir/weights/manifest.txt) against
 * dir/model.onnx and every stage's weights size; 0, or -1 with msg on stage 0 (the others return 0). */
int pr_check_manifest(const PrStage *st, const char *dir, char *msg, size_t len);
#endif
