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
};

typedef struct Buffer {
  const char *name;     /* C identifier used in the generated code */
  int tensor;           /* IR tensor it holds (or the gradient of), -1 for workspace */
  int kind, dtype;
  int is_grad;
  int64_t bytes;        /* one copy */
  int64_t offset;       /* arena offset of copy 0 */
  int first, last;      /* BUF_TEMP: first/last call index that touches it (fwd: 0.., bwd: 10000..) */
} Buffer;

typedef struct Call {
  char *text;           /* the C statement, with buffers as @<id>@ */
  int reads[12], nreads;
  int writes[6], nwrites;
  const char *comment;
  char *decl;           /* a constant the call uses (ConvShape ...), printed at file scope */
} Call;

/* A value crossing one of the stage's cuts. */
typedef struct Crossing {
  int tensor;
  int buf;              /* its forward buffer (BUF_RING) */
  int gbuf;             /* its gradient buffer (BUF_GRING), -1 if no gradient travels */
  int from_loader;      /* stage 0's data input */
} Crossing;

typedef struct StageProg {
  int stage;
  Buffer *bufs;
  int nbufs, capbufs;
  Call *fwd, *bwd;
  int nfwd, nbwd, capfwd, capbwd;
  Crossing *recv, *send;
  int nrecv, nsend;
  int *params, nparams; /* BUF_PARAM buffer ids, in ONNX initializer order */
  int *consts, nconsts; /* constants and state in the weights region: folded values, BatchNorm running statistics */
  int *pgrad, *opt1, *opt2; /* per param: gradient, optimizer slots (-1 if none) */
  int nslots, ngslots;  /* ring and gradient ring copies (the schedule's simulation) */
  int loss_buf, dloss_buf, labels_buf; /* last stage: logits, their gradient, labels */
  int64_t loss_rows, loss_classes;
  int64_t arena_bytes, weights_bytes;
} StageProg;

/* Builds every stage's program; -1 with err_set (an op without a gradient rule, a weight shared across stages). */
int autodiff_build(Plan *p, StageProg *progs, Pool *pool);
/* Lays out each stage's arena (under zb1, first keeps what I passes to W in rings). */
void memplan(Plan *p, StageProg *sp);
/* A backward call that only adds into weight gradients (besides its own
 * scratch workspace): zb1 runs it in W, after the input-gradient calls. */
int call_is_weight(const StageProg *sp, const Call *k);
/* Writes DIR's sources; -1 with err_set. */
struct OutDir;
int emit_all(Plan *p, StageProg *progs, struct OutDir *d);
#endif
