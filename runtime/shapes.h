/* shapes.h - the constant structs and op codes a stage program hands its kernels, shared by every
 * device's kernels (runtime/cpu/ and runtime/cuda/): the compiler fills them, a kernel reads them.
 * Plain C, so nvcc compiles it as well as clang.  Each group is its kernel family's (the family's
 * header holds the kernels). */
#ifndef PIPERUN_SHAPES_H
#define PIPERUN_SHAPES_H
#include <stdint.h>

/* ---- binary ---- */
/* BIN_ADD = 0, BIN_SUB, BIN_MUL, BIN_DIV, BIN_POW, BIN_MAX, BIN_MIN (runtime/opcodes.def, which the compiler reads too) */
enum {
#define BIN_OP(name, value) name = value,
#include "opcodes.def"
};
enum { BIN_MUL_SELF = 100 }; /* kernels.h's own: pow with the exponent 2 */
typedef struct BcastShape {
  int rank;
  int64_t out[8];      /* output dims */
  int64_t sa[8], sb[8]; /* strides of a and b in output coordinates (0 on broadcast axes) */
  int64_t na, nb, ny;  /* element counts */
} BcastShape;
typedef struct WhereShape {
  int rank;
  int64_t out[8], sc[8], sx[8], sy[8];
  int64_t nx, ny, nout;
} WhereShape;
/* CMP_EQUAL = 0, CMP_LESS, CMP_GREATER (runtime/opcodes.def) */
enum {
#define CMP_OP(name, value) name = value,
#include "opcodes.def"
};

/* ---- conv ---- */
typedef struct ConvShape {
  int n, c, d, h, w;            /* input [n, c, d, h, w] */
  int m, kd, kh, kw, group;     /* weight [m, c/group, kd, kh, kw] */
  int od, oh, ow;               /* output */
  int sd, sh, sw, pd, ph, pw;   /* strides, begin pads */
  int dd, dh, dw;               /* dilations */
  int lib;                      /* 1: the compiler chose oneDNN for it (conv_dnnl.c, in a build with PR_DNNL) */
  int64_t lib_work;             /* bytes of the workspace (col) the compiler gave it */
} ConvShape;

/* ---- dropout ---- */
typedef struct RandCtx {
  uint64_t seed; /* the run's --seed: Philox's key */
  int64_t step;  /* the optimizer step being run, from 0 (the counter keeps its low 32 bits) */
  int64_t mb;    /* the micro-batch of the action being run */
} RandCtx;

/* ---- what a kernel tells the runtime ----
 * Input a kernel cannot compute on, which ONNX calls an error: a Gather index outside its table of `rows`
 * rows (`index`, at position `at` of the indices).  An index that comes from the data (a Cast of an input,
 * an ArgMax) is known only at run time, and reading or adding outside the table would corrupt another
 * buffer or crash.  Stops the run naming `node` (the call's 'n' argument, kernels.def), `what` ran, the
 * stage, and the step and micro-batch in `when`: the CPU's kernels pass pr_rand, the action running; a
 * GPU's are found later (device.h, pr_dev_check) and pass what pr_rand was at their launch.  In
 * runtime/fail.c; a test program defines its own. */
void pr_bad_index(const char *node, const char *what, int64_t at, int64_t index, int64_t rows, const RandCtx *when)
    __attribute__((noreturn, cold));
/* piperun.h's (the step loop sets it before every action), declared here for the kernels that say where they are. */
extern RandCtx pr_rand;

/* ---- gemm ---- */
typedef struct MatMulShape {
  int64_t batch;          /* output batch count */
  int64_t M, N, K;
  int nb;                 /* batch rank */
  int64_t bdims[6], sa[6], sb[6]; /* output batch dims; A/B matrix strides per batch axis (0 = broadcast) */
  int b_shared;           /* B is one matrix for every batch: fold the batch into M */
} MatMulShape;

/* ---- movement ---- */
typedef struct PadShape {
  int rank;
  int64_t in[8], out[8], begin[8];
  float value;
} PadShape;
typedef struct PermShape {
  int rank;
  int64_t out[8];   /* output dims */
  int64_t st[8];    /* input stride along each output axis */
  int64_t n;
} PermShape;
typedef struct ViewShape {
  int rank;
  int64_t out[16]; /* output dims */
  int64_t st[16];  /* input stride along each output axis */
  int64_t base;    /* input offset of output element 0 */
  int64_t n, nx;   /* output and input element counts */
} ViewShape;

/* ---- norm ---- */
typedef struct BnShape {
  int64_t n, c, sp;   /* [n, c, sp] */
  float eps;
  double momentum;    /* ONNX momentum: running = running * momentum + batch * (1 - momentum), in double as PyTorch */
  int relu;           /* a Relu fused after it (compiler/fuse.c): y = relu(bn(x)), and dy is masked by y */
  int training;       /* last: stash.c's stash_bn_training reads it there */
} BnShape;

/* ---- optim ---- */
/* The run's optimizer hyper-parameters at the step being taken (the runtime's pr_opt, set before each
 * UPDATE): the generated update calls read them, since run.sh may change them and the learning rate
 * follows its schedule.  step counts from 0. */
typedef struct OptCtx {
  float lr, momentum, weight_decay, beta1, beta2, eps;
  int64_t step;
  /* pipecc --zero 1 (runtime/replica.c): the weight-gradient region's first float, and this replica's shard of
   * it, [shard_lo, shard_hi) floats from there; the shard kernels update those elements only. */
  const float *grad_base;
  int64_t shard_lo, shard_hi;
} OptCtx;

/* ---- pool ---- */
typedef struct PoolShape {
  int n, c, d, h, w, od, oh, ow;
  int kd, kh, kw, sd, sh, sw, pd, ph, pw, dd, dh, dw;
  int ed, eh, ew;        /* end pads: count_include_pad counts a window only up to them */
  int count_include_pad; /* AveragePool */
} PoolShape;

/* ---- reduce ---- */
typedef struct ReduceShape {
  int rank;
  int64_t in[8];
  int mask;        /* reduced axes */
  int64_t n, nout;
  float scale;     /* 1/count for the mean, 1 for the sum */
} ReduceShape;

/* ---- rnn ---- */
typedef struct RnnShape {
  int64_t T, B, in, H; /* steps, batch, input size, hidden size */
  int layout;         /* 0: X [T,B,in], Y [T,D,B,H], Y_h [D,B,H]; 1: X [B,T,in], Y [B,T,D,H], Y_h [B,D,H] */
  int lbr;            /* GRU's linear_before_reset */
  int D;              /* directions: 1, or 2 (bidirectional: forward, then reverse) */
  int rev;            /* the direction being run visits the steps in reverse */
} RnnShape;

/* ---- activation ---- */
/* UN_NEG = 0, UN_EXP, UN_LOG, UN_ABS, UN_RECIPROCAL, UN_CLIP, UN_HARDSIGMOID, UN_HARDSWISH (runtime/opcodes.def) */
enum {
#define UN_OP(name, value) name = value,
#include "opcodes.def"
};

#endif
