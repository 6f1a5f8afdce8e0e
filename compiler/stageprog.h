/* stageprog.h - one pipeline stage as a program: its buffers, its forward
 * and backward calls, and what it receives and sends.
 *
 * autodiff.c builds it from the plan (forward calls per op, gradient calls
 * per op in reverse), memplan.c gives every buffer its arena offset, and
 * emit.c prints it as C. */
#ifndef PIPECC_STAGEPROG_H
#define PIPECC_STAGEPROG_H
#include "plan.h"

enum {
  BUF_PARAM,  /* a trained weight (weights blob) */
  BUF_PGRAD,  /* its gradient, summed over the micro-batches of a step */
  BUF_OPT,    /* optimizer state (momentum, Adam moments) */
  BUF_RING,   /* one copy per in-flight micro-batch: received values, sent values, stashed activations */
  BUF_GRING,  /* one copy per gradient slot of the schedule: gradients received from the next stage or sent to the previous */
  BUF_TEMP,   /* lives within one forward or backward action; shares memory by lifetime */
  BUF_LABELS, /* int64 labels of one micro-batch (last stage) */
  BUF_GSTAGE, /* --offload-optimizer: one of the backward's two staging copies of the gradients kept in the file (optstore.c),
               * at the temporaries' region start */
  BUF_OPTSTAGE, /* --offload-optimizer: the update's staging blocks for the state it streams (optstore.c); in the
                 * temporaries' region, which no forward or backward temporary holds during the update */
};

typedef struct Buffer {
  const char *name;     /* C identifier used in the generated code */
  int tensor;           /* IR tensor it holds (or the gradient of), -1 for workspace */
  int kind, dtype;
  int is_grad;
  int is_workspace;     /* scratch of one kernel (im2col columns), not a tensor's value */
  int64_t bytes;        /* one copy */
  int64_t offset;       /* arena offset of copy 0 */
  int first, last;      /* BUF_TEMP: first/last call index that touches it (fwd: 0.., bwd: 10000..) */
  int fate;             /* BUF_RING kept for backward: FATE_* (stash.c) */
  int unused;           /* not in this rank's arena: pipefb runs only this program's forward or only its backward */
  int chunk;            /* a rank program of --chunks V (chunks.c): the chunk whose program it came from (0 otherwise) */
  int in_store;         /* --offload-optimizer (optstore.c): optimizer state or a gradient kept in the stage's file; offset is
                         * its place there */
  int late;             /* zb1, zbv: a kept BUF_RING value the W half reads, laid out in the late ring (a copy per
                         * wslot, held from F to W) so that the forward ring copy is free after I (memplan.c) */
  int split_kept;       /* zb1, zbv: a temporary memplan keeps for W (its kind is BUF_TEMP again before each layout) */
  int copy_of;          /* zb1, zbv: 1 + the value at a cut this buffer copies for W during I (autodiff.c split_copies);
                         * in the hold layout it is that value itself (the same bytes: the copy does nothing) */
} Buffer;

/* What happens to a stashed activation between a micro-batch's forward and
 * its backward (stash.c decides, memplan.c lays out).  A kept one has a ring
 * copy per slot; the others live in the stage's xslot copies (few), and
 * leave when a micro-batch waits for its backward behind other forwards:
 * copied out and prefetched back, or recomputed from what stays.  A value
 * crossing a cut that the backward does not read (FATE_TRANSIT, "in flight")
 * lives in the xslot only from its RECV (or the forward that makes it) until
 * the forward that reads it is done or its SEND has completed. */
enum { FATE_KEEP, FATE_OFFLOAD, FATE_RECOMPUTE, FATE_TRANSIT };

/* The kernels a call can name (kernels.def). */
enum {
#define KERNEL(id, name, sig) id,
#include "kernels.def"
#undef KERNEL
  K_NKERNELS
};
typedef struct KernelSig {
  const char *name; /* C function */
  const char *sig;  /* one letter per argument, see kernels.def */
} KernelSig;
extern const KernelSig KERNELS[K_NKERNELS];

/* A typed argument of a call. */
enum { ARG_BUF, ARG_NULL, ARG_INT, ARG_FLOAT, ARG_CONST, ARG_SYM, ARG_INTS, ARG_DOUBLE, ARG_STR };
typedef struct Arg {
  int kind;
  int buf;              /* ARG_BUF: buffer id (a negative id becomes ARG_NULL where the signature allows it) */
  int64_t i;            /* ARG_INT; ARG_CONST: shape constant id */
  float f;              /* ARG_FLOAT */
  double d;             /* ARG_DOUBLE (shape constant fields only) */
  const char *sym;      /* ARG_SYM; ARG_STR: the text, printed as an escaped string literal (a node's name) */
  const int64_t *ints;  /* ARG_INTS (shape constant fields only): i values */
} Arg;
#define A_BUF(b) ((Arg){.kind = ARG_BUF, .buf = (b)})
#define A_INT(v) ((Arg){.kind = ARG_INT, .i = (int64_t)(v)})
#define A_FLT(v) ((Arg){.kind = ARG_FLOAT, .f = (float)(v)})
#define A_DBL(v) ((Arg){.kind = ARG_DOUBLE, .d = (double)(v)})
#define A_CONST(id) ((Arg){.kind = ARG_CONST, .i = (id)})
#define A_SYM(s) ((Arg){.kind = ARG_SYM, .sym = (s)})
#define A_STR(s) ((Arg){.kind = ARG_STR, .sym = (s)})
#define A_INTS(p, n) ((Arg){.kind = ARG_INTS, .ints = (p), .i = (n)})

/* What part of a step a call belongs to.  The backward is split so that
 * schedules can run the input gradient (I) and the weight gradient (W) of a
 * micro-batch at different times. */
enum { PH_FWD, PH_IGRAD, PH_WGRAD,
       /* The optimizer step's calls (update.c): a step's weight gradients zeroed before its first
        * backward, a tied weight's parts summed once they are all here, one update per weight. */
       PH_ZERO, PH_TIES, PH_UPDATE };

/* One kernel call: data, not text.  reads/writes are derived from the
 * kernel's signature (call_add), never kept by hand. */
typedef struct Call {
  int kernel;           /* K_* */
  Arg *args;
  int nargs;
  int phase;            /* PH_* */
  int node;             /* graph node it computes (-1: glue such as zeroing a gradient) */
  const char *comment;
  int *reads, nreads;   /* buffer ids, each once */
  int *writes, nwrites;
  /* A forward call's variants, made by its op rule (NULL: the call itself): in the eval forward
   * (run.sh --val: a training BatchNorm on its running statistics, a Dropout that keeps everything) and
   * in a RECOMPUTE (a training BatchNorm leaving its running statistics, which the forward moved). */
  struct Call *eval, *recompute;
  int chunk;            /* a rank program of --chunks V: the chunk (stage of the rank) whose function runs it */
} Call;

/* A constant struct a kernel takes by address (ConvShape CONV_12 = {...}),
 * printed at file scope: its C type, name and fields (ints, floats, int arrays). */
typedef struct ShapeConst {
  const char *type, *name;
  Arg *fields;
  int nfields;
} ShapeConst;

/* A value crossing one of the stage's cuts. */
typedef struct Crossing {
  int tensor;
  int buf;              /* its forward buffer (BUF_RING) */
  int gbuf;             /* its gradient buffer (BUF_GRING), -1 if no gradient travels */
  int from_loader;      /* stage 0's data input */
  int chunk;            /* a rank program of --chunks V: the chunk that receives or sends it */
} Crossing;

/* --replicas (replica.c): a bucket of the weight-gradient region, bytes [lo, hi) of the arena, final after
 * backward call `ready` (-1: before the backward's first). */
typedef struct Bucket {
  int64_t lo, hi;
  int ready;
} Bucket;
typedef struct StageProg {
  int stage;
  Buffer *bufs;
  int nbufs, capbufs;
  Call *fwd, *bwd;
  int nfwd, nbwd, capfwd, capbwd;
  Call *step;           /* the optimizer step's calls (PH_ZERO, PH_TIES, PH_UPDATE, in that order) */
  Call *loss;           /* the last stage: the loss over a micro-batch's logits (ops/loss.c), NULL elsewhere */
  int nstep, capstep;
  ShapeConst *shapes;
  int nshapes, capshapes;
  Crossing *recv, *send;
  int nrecv, nsend;
  int *params, nparams; /* BUF_PARAM buffer ids, in ONNX initializer order */
  int *consts, nconsts; /* constants and state in the weights region: folded values, BatchNorm running statistics */
  int *pgrad, *opt1, *opt2; /* per param: gradient, optimizer slots (-1 if none) */
  /* A weight several nodes read (a tied embedding and output head, an
   * initializer an exporter de-duplicated) gets one partial gradient per
   * reading node, summed over the micro-batches, and its gradient is their
   * sum in graph order, taken at the update by every stage that holds a copy:
   * the same sums in the same order whatever the partition.  Per param: its
   * parts in graph order (NULL / 0 for a weight one node reads). */
  struct TiePart { int buf, stage, node; } **parts; /* stage: who computes it; -1 while pricing a candidate stage */
  int *nparts;
  int nslots, ngslots;  /* ring and gradient ring copies (the schedule's simulation) */
  int nwslots;          /* zb1, zbv: late-value ring copies (a micro-batch's from its F to its W; memplan.c) */
  int hold;             /* zb1, zbv: the memory plan's layout: 1 W reads the forward ring (held until W), 0 the late values */
  /* The memory plan (stash.c): values whose fate is not KEEP live in nxslots
   * copies of one block, xstride bytes apart from xbase; its first xout bytes
   * are what an OFFLOAD copies out (the offloaded values, contiguous), the
   * rest the recomputed ones.  A stage holding a peer's offloaded values has
   * nstore slots of store_stride bytes at store_base. */
  int nxslots, nstore;
  int64_t xbase, xstride, xout, store_base, store_stride;
  char *recompute;      /* per forward call: re-run by RECOMPUTE (NULL: none) */
  int64_t mem_leaving, mem_store; /* of arena_bytes: the xslot copies, the peer's store */
  int loss_buf, dloss_buf, labels_buf; /* last stage: logits, their gradient, labels */
  int64_t loss_rows, loss_classes;
  int64_t arena_bytes, weights_bytes;
  /* async: K older copies of the weights region [0, weights_bytes), each
   * wversion_stride bytes apart from wversion_base (the steps a rank still
   * computes on; the region itself holds the newest). */
  int nwversions;
  int poll;             /* pipecc --progress poll: pr_poll() between nodes */
  int64_t wversion_base, wversion_stride, mem_versions;
  /* The arena by what it holds (memplan); they add up to arena_bytes:
   * weights region (weights, constants, state; aligned), weight gradients,
   * optimizer state, rings of activations kept for backward, rings of values
   * crossing a cut (received, sent, the loss's logits and their gradient)
   * with the gradient rings and labels, and the temporaries' shared region. */
  int64_t mem_weights, mem_grads, mem_opt, mem_stash, mem_cross, mem_temps;
  /* --offload-optimizer (optstore.c): the optimizer state lives in a file of opt_store_bytes (each BUF_OPT
   * buffer's offset is its place there), streamed by the update through opt_stage_bytes of staging
   * blocks of opt_block floats per state. */
  int opt_out;
  int64_t opt_block, opt_stage_bytes, opt_store_bytes;
  /* ... and the gradients of the weights optstore_grad_ok allows, accumulated over the micro-batches in the same file:
   * each backward brings one weight's gradient at a time into one of two staging copies of grad_stage_bytes / 2. */
  int grad_out, grad_banded; /* banded: a Gemm's weight gradient comes in bands of GRAD_BAND_ROWS rows */
  int64_t grad_stage_bytes;
  int ngrad_units;      /* the pieces the backward brings in (a gradient or a band), each fresh at a step's start */
  /* A rank program of --chunks V (chunks.c): its chunks' stages, each chunk's ring and gradient ring
   * sizes (a ring copy count is its chunk's), and the chunk the loss follows (-1: none).  nchunks 0:
   * a stage's own program. */
  int nchunks, loss_chunk;
  int *cstage, *cslots, *cgslots, *cwslots, *chold;
  /* --replicas R (replica.c, memplan.c): the weight gradients' region [grad_lo, grad_hi) of the arena, summed
   * over the replicas in buckets; the other replicas' copies of this rank's shard land in (R - 1) shards from
   * reduce_base (reduce_bytes in all, counted in mem_grads). */
  int64_t grad_lo, grad_hi, reduce_base, reduce_bytes;
  Bucket *buckets;
  int nbuckets;
  /* --zero 1 (replica.c): the optimizer state of this replica's shard of the region, shard_floats per slot
   * (zero_state[k], -1 none); the per-weight state (opt1, opt2) is then -1. */
  int zero, zero_state[2];
  int64_t shard_floats;
} StageProg;

/* Appends a call to the forward (PH_FWD) or backward list, checking the
 * arguments against the kernel's signature and deriving its accesses. */
Call *call_add(StageProg *sp, Pool *pool, int phase, int kernel, int node, const char *comment, const Arg *args, int nargs);
/* A float buffer of no tensor (a kernel's staging, a shard's state) named `name`, of kind BUF_*: its id. */
int buf_add(StageProg *sp, Pool *pool, const char *name, int kind, int64_t bytes);
/* A call of no list (the loss), checked like call_add. */
Call *call_new(StageProg *sp, Pool *pool, int phase, int kernel, int node, const char *comment, const Arg *args, int nargs);
/* Attaches a variant (VAR_*) to forward call `of`, checked like call_add; its accesses must be among the call's. */
enum { VAR_EVAL, VAR_RECOMPUTE };
void call_variant(StageProg *sp, Pool *pool, Call *of, int which, int kernel, const Arg *args, int nargs);
/* Adds a shape constant; returns its id. */
int shape_add(StageProg *sp, Pool *pool, const char *type, const char *name, const Arg *fields, int nfields);
/* Id of the shape constant called `name`, or -1. */
int shape_find(const StageProg *sp, const char *name);

#endif
