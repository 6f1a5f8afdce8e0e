/* probe_ops.c - pipecc-opprobe: times the runtime's own kernels on a grid of shapes, once per machine.
 *
 *   pipecc-opprobe [--quick] [--cold] [--raw]
 *
 * pipecc runs it (compiler/opcost.c) when its op cache has no section for this machine, and keeps what
 * it prints.  It calls the kernels the stage programs call (runtime/kernels.h, gemm.c, conv_dnnl.c,
 * broadcast.c), built with the stage programs' flags, on one thread, with OpenBLAS's kernels and
 * oneDNN's thread count pinned as a stage pins them.  Each line it prints is one measured shape:
 *
 *     o FAMILY X1 X2 X3 X4 FWD BWD_INPUT BWD_WEIGHT
 *
 * seconds of the forward, the backward's input-gradient call and its weight-gradient call, the best of
 * a few repeats after a warm-up call, held to the machine's quick spells (print_points; --raw: as
 * timed).  Families and their coordinates (unused ones are 1):
 *   conv@onednn, conv@im2col      CIN COUT K P   a KxK convolution, stride 1, padded to keep its size
 *                                                 (P = 4: of stride 2 over 2x2 images), P = batch x
 *                                                 output pixels
 *   dwconv@onednn, dwconv@im2col  C K Q N        depthwise (group = C): N images of Q output pixels (1: of
 *                                                 stride 2 over 2x2 images)
 *   pointconv                     N CIN COUT K   a convolution of one point (k_conv_point) on N images
 *   gemm                          M N K 1        Y[M,N] = X[M,K] W[N,K]^T (nn.Linear's Gemm); M from 4
 *   relu gelu unary binary softmax layernorm maxpool avgpool copy
 *                                 ELEMS 1 1 1    a memory-bound kernel over ELEMS floats (the larger of
 *                                                 its input and output); maxpool ELEMS K 1 1, its window
 *                                                 KxK (2 or 3), stride 2
 *   batchnorm                     SP C N 1       N images (8) of C channels of SP points
 *   sgd sgdm adam                 ELEMS TOTAL 1 1  one weight's optimizer update (k_sgd_step without and with
 *                                                 momentum, k_adam_step, after the gradient's finite check), as
 *                                                 the stage program's update() calls it, in a model of TOTAL
 *                                                 trained floats; FWD only
 *   xent                          ELEMS CLASSES 1 1  the loss: k_softmax_xent over ELEMS logits; FWD only
 *   stream                        BYTES 1 1 1    the memory's rate over a working set of BYTES; FWD only
 *   far@conv@onednn, far@conv@im2col, far@pointconv, far@gemm
 *                                 BYTES 1 1 1    what each part costs more with BYTES of weights in no cache
 * Then `done SECONDS`: the probe's own time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "blas_core.h"
#include "kernels.h"

RandCtx pr_rand = {1, 0, 0};
void pr_bad_index(const char *node, const char *what, int64_t at, int64_t index, int64_t rows, const RandCtx *when) {
  (void)when;
  fprintf(stderr, "pipecc-opprobe: %s %s: index %lld at %lld of %lld rows\n", node, what, (long long)index, (long long)at, (long long)rows);
  exit(3);
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* With --cold: written before each timed call, untimed, so that the kernel's operands are outside the
 * caches.  Not the default: on bench/costprobe.py's models it made the predictions 1.2-1.8x the
 * measured steps (a model's small weights and activations stay in the caches between micro-batches),
 * against 0.85-1.0x warm. */
enum { FLUSH_FLOATS = 2 << 20 };
static float *flush;
static int flush_caches;

/* Eight buffers of floats, each large enough for any shape below; the last, a convolution's workspace,
 * larger. */
enum { NBUF = 8 };
static float *buf[NBUF];
static int reps = 3;

static void buffers(size_t floats, size_t work_floats) {
  for (int i = 0; i < NBUF; i++) {
    size_t n = i == NBUF - 1 ? work_floats : floats;
    buf[i] = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    if (!buf[i]) exit(1);
    if (!flush && !(flush = calloc(FLUSH_FLOATS, sizeof(float)))) exit(1);
    for (size_t k = 0; k < n; k++) buf[i][k] = (float)((k * 2654435761u + (unsigned)i * 97u) % 1000u) * 1e-3f + (i == 6 ? 0.5f : -0.5f);
  }
}

/* One kernel call to time: which part (0 forward, 1 input gradient, 2 weight gradient) of what. */
typedef void (*Call)(const void *arg, int part);

/* The best of `reps` timed calls after one warm-up (oneDNN makes its primitives at the first); of up to
 * 4 * reps when they are short (under 0.3 ms): on a loaded machine a short call's best of 3 still
 * measured up to 2x its quiet time, and more tries cost little. */
static int dless(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The best of at least lo and at most hi timed calls after one warm-up: more than lo only while the best is
 * short (under 0.3 ms).  Before each, when wipe is not NULL, its n floats are written (untimed). */
static double best_of(Call f, const void *arg, int part, float *wipe, size_t n, int lo, int hi) {
  f(arg, part);
  double best = 1e30;
  for (int r = 0; r < lo || (r < hi && best < 3e-4); r++) {
    for (size_t k = 0; wipe && k < n; k += 16) wipe[k] += 1.0f;
    double t0 = now();
    f(arg, part);
    double t = now() - t0;
    if (t < best) best = t;
  }
  return best;
}

static double timed(Call f, const void *arg, int part) { return best_of(f, arg, part, flush_caches ? flush : NULL, FLUSH_FLOATS, reps, 4 * reps); }

/* A shared VM runs at two speeds, in spells of a second or more (other guests: bench/costprobe.py saw one
 * program's steps at 48 ms in one run and 72-77 ms in the next).  So that one spell does not set one corner of
 * the grid, a fixed reference call (a GEMM of 64 x 256 x 256) is timed right before each point, and each
 * point is scaled to the machine's quick spells: by the reference's 10th percentile over the probe over its
 * time at that point (never up).  The lines are printed at the end, scaled. */
enum { MAX_POINTS = 4096 };
typedef struct Point {
  char fam[24];
  double x[4], t[3], ref;
} Point;
static Point *points;
static int npoints, normalize = 1;

static void ref_call(const void *arg, int part);

static double reference(void) { return best_of(ref_call, NULL, 0, NULL, 0, 5, 5); }

/* One measured point, with the reference's time right before it. */
static void record(const char *fam, const double x[4], const double t[3], double ref) {
  if (!points && !(points = calloc(MAX_POINTS, sizeof *points))) exit(1);
  if (npoints == MAX_POINTS) exit(1);
  Point *pt = &points[npoints++];
  snprintf(pt->fam, sizeof pt->fam, "%s", fam);
  memcpy(pt->x, x, sizeof pt->x), memcpy(pt->t, t, sizeof pt->t);
  pt->ref = ref;
}

static void emit(const char *fam, double x1, double x2, double x3, double x4, Call f, const void *arg, int parts) {
  double t[3] = {0, 0, 0}, ref = reference();
  for (int p = 0; p < 3; p++)
    if (parts & (1 << p)) t[p] = timed(f, arg, p);
  record(fam, (double[4]){x1, x2, x3, x4}, t, ref);
}

static void print_points(void) {
  double *r = malloc(sizeof(double) * (size_t)(npoints + 1)), quick;
  if (!r) exit(1);
  for (int i = 0; i < npoints; i++) r[i] = points[i].ref;
  qsort(r, (size_t)npoints, sizeof *r, dless);
  quick = npoints ? r[npoints / 10] : 0;
  for (int i = 0; i < npoints; i++) {
    const Point *pt = &points[i];
    double k = normalize && pt->ref > quick ? quick / pt->ref : 1;
    printf("o %s %.0f %.0f %.0f %.0f %.4g %.4g %.4g\n", pt->fam, pt->x[0], pt->x[1], pt->x[2], pt->x[3], pt->t[0] * k, pt->t[1] * k, pt->t[2] * k);
  }
  printf("reference %.4g %.4g %.4g\n", r[0], quick, npoints ? r[npoints / 2] : 0);
  free(r);
}

/* ---- convolutions ---- */

static void conv_call(const void *arg, int part) {
  const ConvShape *s = arg;
  float *col = buf[7];
  if (part == 0) k_conv(buf[0], buf[1], buf[2], buf[3], col, s);
  else if (part == 1) k_conv_grad(buf[0], buf[1], buf[3], buf[4], NULL, NULL, col, s, 0, 1);
  else k_conv_grad(buf[0], buf[1], buf[3], NULL, buf[5], buf[6], col, s, 0, 1);
}

static int64_t pad16(int64_t v) { return (v + 15) / 16 * 16; }

/* A KxK convolution of N images of HxW, C in, M out, `group` groups, stride 1, size kept; lib: oneDNN.
 * Its workspace as the compiler sizes it (ops/conv.c). */
static ConvShape *conv_shape(int n, int c, int m, int k, int hw, int group, int lib) {
  ConvShape *s = calloc(1, sizeof *s); /* kept: oneDNN keys its primitives by this address */
  if (!s) exit(1);
  /* hw -1: one output pixel, of stride 2 over 2x2 images (a depthwise convolution at stride 1 over one
   * pixel is a convolution of one point, k_conv_point); else stride 1, the size kept */
  int in = hw < 0 ? 2 : hw, st = hw < 0 ? 2 : 1;
  hw = hw < 0 ? 1 : hw;
  *s = (ConvShape){.n = n, .c = c, .d = 1, .h = in, .w = in, .m = m, .kd = 1, .kh = k, .kw = k, .group = group,
                   .od = 1, .oh = hw, .ow = hw, .sd = 1, .sh = st, .sw = st, .pd = 0, .ph = k / 2, .pw = k / 2,
                   .dd = 1, .dh = 1, .dw = 1, .lib = lib};
  int64_t sp = (int64_t)in * in, cols = (int64_t)(c / group) * k * k * sp * 4;
  int64_t xs = n * pad16(c) * sp, ys = n * pad16(m) * sp, ws = group * pad16(m / group) * pad16(c / group) * k * k;
  int64_t pin = (int64_t)(in + 2 * (k / 2)) * (in + 2 * (k / 2)); /* the padded input oneDNN may copy */
  int64_t libb = 4 * (xs + ys + ws + pad16(c) * sp + n * pad16(c) * pin) + 4 * 64 + 128;
  s->lib_work = lib && libb > cols ? libb : cols;
  return s;
}

static void conv_grid(int quick) {
  /* One input channel (LeNet's first convolution on MNIST: held at 3's time it was 1.8x its own).  Output
   * sizes down to one pixel (of stride 2 over 2x2 images: ResNet's last stage at 32x32) and 4x4:
   * at a few pixels an image oneDNN's time is far from its work's, and interpolating over the gap from
   * 2x2 to 8x8 missed ResNet-18's middle stages by 1.3-1.5x. */
  static const int cin[] = {1, 3, 16, 64, 256}, cout[] = {16, 64, 256}, ks[] = {1, 3, 5}, hws[] = {-1, 2, 4, 8, 32};
  const int nimg = 4;
  for (int lib = 1; lib >= 0; lib--)
    for (int a = 0; a < 5; a++)
      for (int b = 0; b < 3; b++)
        for (int kk = 0; kk < 3; kk++)
          for (int h = 0; h < 5; h++) {
            if (quick && (a % 2 == 0 || b % 2 || kk == 2 || h % 2 == 0)) continue;
            ConvShape *s = conv_shape(nimg, cin[a], cout[b], ks[kk], hws[h], 1, lib);
            double px = hws[h] < 0 ? 1 : (double)hws[h] * hws[h];
            emit(lib ? "conv@onednn" : "conv@im2col", cin[a], cout[b], ks[kk], nimg * px, conv_call, s, 7);
          }
  /* Depthwise by pixels per image and images apart: oneDNN's weight gradient costs about as much per image
   * and channel at 2x2 (and at one pixel of stride 2 from 2x2) as at 8x8, 16x its work; 4x4 is already cheap.
   * Measured at 4 images: 8 cost twice that (above the grid the time grows with the work). */
  static const int dc[] = {16, 64, 256, 1024}, dk[] = {3, 5}, dhw[] = {1, 2, 4, 8, 32};
  for (int lib = 1; lib >= 0; lib--)
    for (int a = 0; a < 4; a++)
      for (int kk = 0; kk < 2; kk++)
        for (int h = 0; h < 5; h++) {
          if (quick && (a % 3 || kk || h % 2)) continue;
          ConvShape *s = conv_shape(nimg, dc[a], dc[a], dk[kk], dhw[h] == 1 ? -1 : dhw[h], dc[a], lib);
          emit(lib ? "dwconv@onednn" : "dwconv@im2col", dc[a], dk[kk], (double)dhw[h] * dhw[h], nimg, conv_call, s, 7);
        }
}

/* Convolutions of one point (k_conv_point: its tap's weights packed, then a GEMM per group): N images,
 * C in, M out, KxK taps. */
static void point_grid(int quick) {
  /* 512: 3x3 weights of 512 x 512 (ResNet's last layers at 1x1) outgrow the caches, a step the grid from
   * 128 to 1024 missed by 2x */
  static const int ns[] = {8, 64}, cs[] = {1, 16, 128, 512, 1024}, ks[] = {1, 3}; /* 1: a depthwise one's groups */
  for (int a = 0; a < 2; a++)
    for (int b = 0; b < 5; b++)
      for (int c = 0; c < 5; c++)
        for (int kk = 0; kk < 2; kk++) {
          if ((quick && (b % 2 || c % 2)) || (int64_t)cs[b] * cs[c] * ks[kk] * ks[kk] > (1 << 22)) continue;
          ConvShape *s = conv_shape(ns[a], cs[b], cs[c], ks[kk], 1, 1, 0);
          s->lib_work = (int64_t)cs[b] * cs[c] * 4;
          emit("pointconv", ns[a], cs[b], cs[c], ks[kk], conv_call, s, 7);
        }
}

/* ---- GEMMs ---- */

typedef struct G {
  int M, N, K;
} G;

static void gemm_call(const void *arg, int part) {
  const G *g = arg;
  if (part == 0) k_gemm(buf[0], buf[1], NULL, buf[3], g->M, g->N, g->K, 0, 1, 1.0f, 0.0f, 1, 1);
  else if (part == 1) k_gemm_dA(buf[3], buf[1], buf[4], g->M, g->N, g->K, 0, 1, 1.0f, 0);
  else k_gemm_dB(buf[3], buf[0], buf[5], g->M, g->N, g->K, 0, 1, 1.0f, 1);
}

/* M from 4: a micro-batch of 8 rows costs about half of 16's (MLP's layers), which holding the time below
 * the grid's first value missed. */
static void ref_call(const void *arg, int part) {
  static const G ref = {64, 256, 256};
  (void)arg;
  gemm_call(&ref, part);
}

static void gemm_grid(int quick) {
  static const int d[] = {16, 64, 256, 1024}, dm[] = {4, 8, 16, 64, 256, 1024};
  for (int a = 0; a < 6; a++)
    for (int b = 0; b < 4; b++)
      for (int c = 0; c < 4; c++) {
        if (quick && ((a != 2 && a != 5) || b % 3 || c % 3)) continue;
        G g = {dm[a], d[b], d[c]};
        emit("gemm", g.M, g.N, g.K, 1, gemm_call, &g, 7);
      }
}

/* ---- memory-bound kernels, by elements ---- */

typedef struct Mem {
  int kind, size; /* size: which of the grid's element counts (the pools' constant shapes) */
  int k;          /* a max pool's window: 2 (2x2, stride 2: LeNet's) or 3 (3x3, stride 2: ResNet's) */
  int64_t c;      /* BatchNorm's channels (8 images of c channels) */
  int64_t n;      /* elements */
  BcastShape bs;
  PermShape ps;
  BnShape bn;
} Mem;

enum { M_RELU, M_GELU, M_BINARY, M_SOFTMAX, M_LAYERNORM, M_BATCHNORM, M_MAXPOOL, M_AVGPOOL, M_COPY, M_UNARY, NMEM };
static const char *const mem_name[NMEM] = {"relu", "gelu", "binary", "softmax", "layernorm", "batchnorm", "maxpool", "avgpool", "copy", "unary"};

/* A max pool's input: which tap of a window wins decides its gradient's branches, and on a model's
 * activations that is a coin toss where on buffers' regular values the branch predictor learns it (the
 * gradient of squeezenet1_1's first pool ran 230 us on those, 580 us in the model, 710 us on these):
 * random values past a ReLU. */
static float *pool_x;

static void pool_input(size_t n) {
  uint64_t h = 88172645463325252ull;
  if (!(pool_x = aligned_alloc(64, n * sizeof(float)))) exit(1);
  for (size_t i = 0; i < n; i++) {
    h ^= h << 13, h ^= h >> 7, h ^= h << 17;
    float v = (float)(h >> 40) / (float)(1 << 24) - 0.5f;
    pool_x[i] = v > 0 ? v : 0;
  }
}

/* Pools of 64 channels of HWxHW, as constants: the stage programs' shapes are, and the pool kernels
 * are inlined and specialised on them (at run-time shapes they ran 5-10x slower).  3x3 stride 2
 * max pooling (ResNet's), and global average pooling. */
#define POOLS(X) X(0, 8) X(1, 22) X(2, 64) X(3, 181)
#define POOL_FN(i, hw)                                                                                                            \
  static const PoolShape MAXP_##i = {1, 64, 1, hw, hw, 1, (hw - 1) / 2 + 1, (hw - 1) / 2 + 1, 1, 3, 3, 1, 2, 2, 0, 1, 1, 1, 1, 1, 0, 1, 1, 0}; \
  static const PoolShape MAXP2_##i = {1, 64, 1, hw, hw, 1, hw / 2, hw / 2, 1, 2, 2, 1, 2, 2, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0};                \
  static const PoolShape GAP_##i = {1, 64, 1, hw, hw, 1, 1, 1, 1, hw, hw, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0};                      \
  static void pool_##i(int avg, int two, int part) {                                                                               \
    if (avg) part ? k_avgpool_grad(buf[2], buf[4], &GAP_##i, 0) : k_avgpool(buf[0], buf[3], &GAP_##i);                           \
    else if (two) part ? k_maxpool_grad(pool_x, buf[2], buf[4], &MAXP2_##i, 0) : k_maxpool(pool_x, buf[3], &MAXP2_##i);          \
    else part ? k_maxpool_grad(pool_x, buf[2], buf[4], &MAXP_##i, 0) : k_maxpool(pool_x, buf[3], &MAXP_##i);                      \
  }
POOLS(POOL_FN)
#define POOL_CASE(i, hw) case i: pool_##i(avg, two, part); break;
static void pool_call(int size, int avg, int two, int part) {
  switch (size) { POOLS(POOL_CASE) }
}

static void mem_call(const void *arg, int part) {
  const Mem *m = arg;
  float **b = buf;
  int64_t rows = m->n / 256;
  switch (m->kind) {
  case M_RELU: part ? k_relu_grad(b[3], b[2], b[4], m->n, 0) : k_relu(b[0], b[3], m->n); break;
  case M_GELU: part ? k_gelu_grad(b[0], b[2], b[4], m->n, 0, 0) : k_gelu(b[0], b[3], m->n, 0); break;
  case M_BINARY: part ? k_binary_grad(BIN_ADD, 0, b[0], b[1], b[2], b[4], &m->bs, 0) : k_binary(BIN_ADD, b[0], b[1], b[3], &m->bs); break;
  case M_SOFTMAX: part ? k_softmax_grad(b[3], b[2], b[4], rows, 256, 0, 0) : k_softmax(b[0], b[3], rows, 256, 0); break;
  case M_LAYERNORM:
    if (part) k_layernorm_grad(b[0], b[1], b[2], b[4], b[5], b[6], rows, 256, 1e-5f, 1);
    else k_layernorm(b[0], b[1], b[1] + 256, b[3], rows, 256, 1e-5f);
    break;
  case M_BATCHNORM:
    if (part) k_batchnorm_grad(b[0], b[1], b[5], b[6], b[2], NULL, b[4], b[5] + 1024, b[6] + 1024, &m->bn, 0);
    else k_batchnorm(b[0], b[1], b[1] + 1024, b[5], b[6], b[3], &m->bn);
    break;
  case M_UNARY: part ? k_unary_grad(UN_CLIP, b[0], b[3], b[2], b[4], m->n, 0.0f, 6.0f, 0) : k_unary(UN_CLIP, b[0], b[3], m->n, 0.0f, 6.0f); break;
  case M_MAXPOOL: case M_AVGPOOL: pool_call(m->size, m->kind == M_AVGPOOL, m->k == 2, part); break;
  default: part ? k_transpose_grad(b[2], b[4], &m->ps, 0) : k_transpose(b[0], b[3], &m->ps); break;
  }
}

/* The shapes of a memory kernel over n floats: 64 channels for BatchNorm, rows of 256 for the row
 * kernels, and for copies attention's head split, [16, n/1024, 64] to [n/1024, 16, 64]. */
static void mem_shapes(Mem *m) {
  int64_t n = m->n;
  m->bs = (BcastShape){.rank = 1, .out = {n}, .sa = {1}, .sb = {1}, .na = n, .nb = n, .ny = n};
  m->ps = (PermShape){.rank = 3, .out = {n / 1024, 16, 64}, .st = {64, n / 16, 1}, .n = n};
  m->bn = (BnShape){.n = 8, .c = m->c, .sp = m->c ? n / 8 / m->c : 1, .eps = 1e-5f, .momentum = 0.9, .relu = 0, .training = 1};
}

static void mem_grid(int quick) {
  static const int64_t ns[] = {1 << 12, 1 << 15, 1 << 18, 1 << 21};
  pool_input((size_t)1 << 22);
  for (int k = 0; k < NMEM; k++)
    for (int i = 0; i < 4 && k != M_BATCHNORM; i++) {
      if (quick && i % 3) continue;
      Mem m = {.kind = k, .size = i, .n = ns[i]};
      mem_shapes(&m);
      static const int pool_hw[] = {8, 22, 64, 181}; /* the pools' input: 64 channels of HWxHW */
      double elems = k == M_MAXPOOL || k == M_AVGPOOL ? 64.0 * pool_hw[i] * pool_hw[i] : (double)m.n;
      for (m.k = 2; m.k <= (k == M_MAXPOOL ? 3 : 2); m.k++)
        emit(mem_name[k], elems, k == M_MAXPOOL ? m.k : 1, 1, 1, mem_call, &m, 3);
    }
  /* BatchNorm loops over channels and images: by points per channel and image (from one: a 1x1 feature
   * map, where each channel's loop costs most per element), channels, and 8 images. */
  static const int64_t bsp[] = {1, 4, 16, 64, 256}, bc[] = {16, 64, 256, 1024};
  for (int i = 0; i < 5; i++)
    for (int j = 0; j < 4; j++) {
      if (quick && (i % 2 || j % 3)) continue;
      Mem m = {.kind = M_BATCHNORM, .n = 8 * bc[j] * bsp[i], .c = bc[j]};
      mem_shapes(&m);
      emit(mem_name[M_BATCHNORM], (double)bsp[i], (double)bc[j], 8, 1, mem_call, &m, 3);
    }
}

/* ---- the step's other work: the optimizer's update, the loss ---- */

/* The finite check the runtime makes of every gradient before the update (runtime/optim.c check_finite:
 * cpu/device.c's pass over the exponent bits), which the profile's `update` time includes. */
static int64_t nonfinite(const float *x, int64_t n) {
  const uint32_t *b = (const uint32_t *)x;
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; i++) bad |= (b[i] & 0x7f800000u) == 0x7f800000u;
  return bad ? 0 : -1;
}

/* A model's update: weights of n floats, one after another over arrays of `total` (the weights, their
 * gradients and the optimizer's slots), each gradient checked first, then each weight updated, as
 * optimizer_step and the stage program's update() do; times divided by total / n.  Large models stream
 * their weights from memory, small ones find them in the caches: the time per float depends on both. */
typedef struct Step {
  int kind; /* 0 sgd, 1 sgd with momentum, 2 adam; 3 the loss */
  int64_t n, total, classes;
  float *p, *g, *m, *v;
  OptCtx o;
  int64_t *labels;
} Step;

static volatile int64_t step_sink;

static void step_call(const void *arg, int part) {
  const Step *s = arg;
  (void)part;
  if (s->kind == 3) {
    step_sink += (int64_t)k_softmax_xent(buf[0], s->labels, buf[3], s->n / s->classes, (int)s->classes, 1.0f / 64);
    return;
  }
  for (int64_t at = 0; at + s->n <= s->total; at += s->n) step_sink += nonfinite(s->g + at, s->n);
  for (int64_t at = 0; at + s->n <= s->total; at += s->n)
    if (s->kind == 2) k_adam_step(s->p + at, s->g + at, s->m + at, s->v + at, s->n, 0, &s->o);
    else k_sgd_step(s->p + at, s->g + at, s->m + at, s->n, &s->o);
}

static float *step_array(int64_t n, float v) {
  float *a = aligned_alloc(64, (size_t)n * sizeof(float));
  if (!a) exit(1);
  for (int64_t i = 0; i < n; i++) a[i] = v * (float)(i % 7 + 1);
  return a;
}

/*   sgd sgdm adam   ELEMS TOTAL 1 1   a weight of ELEMS floats in a model of TOTAL trained floats (from a
 *                                     bias's 1K to a 3x3 512-channel convolution's 2.4M, in models of 256K
 *                                     to 16M floats) */
static void update_grid(int quick) {
  static const char *const name[3] = {"sgd", "sgdm", "adam"};
  static const int64_t ns[] = {1 << 10, 1 << 14, 1 << 18, 1 << 21}, tot[] = {1 << 18, 1 << 21, 1 << 24};
  const int64_t big = tot[2];
  float *p = step_array(big, 1e-3f), *g = step_array(big, 1e-4f), *m = step_array(big, 1e-5f), *v = step_array(big, 1e-8f);
  for (int k = 0; k < 3; k++)
    for (int j = 0; j < 3; j++)
      for (int i = 0; i < 4; i++) {
        if (ns[i] > tot[j] || (quick && (i % 2 || j == 1))) continue;
        Step s = {.kind = k, .n = ns[i], .total = tot[j], .p = p, .g = g, .m = m, .v = v,
                  .o = {.lr = 1e-6f, .momentum = k == 1 ? 0.9f : 0, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .step = 5}};
        double ref = reference(), t = timed(step_call, &s, 0) / (double)(tot[j] / ns[i]);
        record(name[k], (double[4]){(double)ns[i], (double)tot[j], 1, 1}, (double[3]){t, 0, 0}, ref);
      }
  free(p), free(g), free(m), free(v);
}

/*   xent            ELEMS CLASSES 1 1  the loss, k_softmax_xent over ELEMS logits: a classifier's 10 classes,
 *                                      256, a vocabulary's 32K */
static void loss_grid(int quick) {
  static const int64_t xn[] = {1 << 6, 1 << 9, 1 << 12, 1 << 15, 1 << 18}, xc[] = {10, 256, 32768};
  int64_t *labels = calloc((size_t)(1 << 18) / 10 + 1, sizeof(int64_t));
  if (!labels) exit(1);
  for (int i = 0; i < (1 << 18) / 10 + 1; i++) labels[i] = i % 10;
  for (int i = 0; i < 5; i++)
    for (int c = 0; c < 3; c++) {
      if ((quick && i % 2) || xn[i] < xc[c]) continue;
      /* the coordinate is the nominal count (one axis value per size), the call over its whole rows */
      Step s = {.kind = 3, .n = xn[i] / xc[c] * xc[c], .classes = xc[c], .labels = labels};
      emit("xent", (double)xn[i], (double)xc[c], 1, 1, step_call, &s, 1);
    }
  free(labels);
}

/* ---- weights from far memory ---- */

/* A stage whose working set outgrows the caches reads each weight from memory at every call: on this VM
 * ResNet-18's 3x3 512-channel convolutions of one point ran 0.9-1.1 ms in the model against 0.55 ms
 * here with the weights warm.  far@FAMILY: for a few shapes of large weights, what each part costs more
 * after FAR_BYTES have been written (the weights are then in no cache), by the weight's bytes: seconds of
 * the forward, input-gradient and weight-gradient parts over the warm ones.  compiler/opcost.c charges it
 * per byte of a node's weights, in the share a stage's working set lies past the caches. */
enum { FAR_BYTES = 512 << 20 };
static float *far_flush;

static double timed_far(Call f, const void *arg, int part) { return best_of(f, arg, part, far_flush, FAR_BYTES / sizeof(float), 3, 3); }

static void far_point(const char *fam, double wbytes, Call f, const void *arg) {
  double warm[3], d[3], ref = reference();
  for (int p = 0; p < 3; p++) warm[p] = timed(f, arg, p), d[p] = timed_far(f, arg, p) - warm[p], d[p] = d[p] > 0 ? d[p] : 0;
  char name[24];
  snprintf(name, sizeof name, "far@%s", fam);
  record(name, (double[4]){wbytes, 1, 1, 1}, d, ref);
}

static void far_grid(int quick) {
  if (!(far_flush = calloc(FAR_BYTES / sizeof(float), sizeof(float)))) exit(1);
  /* 256 -> 256 and 512 channels of 3x3 and 5x5 at one pixel (ResNet's last stages): 2.4-6.6 MB */
  static const int cc[][3] = {{128, 256, 3}, {256, 256, 3}, {256, 256, 5}};
  for (int lib = 1; lib >= 0; lib--)
    for (int i = quick ? 1 : 0; i < 3; i++) {
      ConvShape *s = conv_shape(4, cc[i][0], cc[i][1], cc[i][2], -1, 1, lib);
      far_point(lib ? "conv@onednn" : "conv@im2col", 4.0 * cc[i][0] * cc[i][1] * cc[i][2] * cc[i][2], conv_call, s);
    }
  static const int pc[][2] = {{512, 1}, {256, 3}, {512, 3}};
  for (int i = quick ? 2 : 0; i < 3; i++) {
    ConvShape *s = conv_shape(8, pc[i][0], pc[i][0], pc[i][1], 1, 1, 0);
    s->lib_work = (int64_t)pc[i][0] * pc[i][0] * 4;
    far_point("pointconv", 4.0 * pc[i][0] * pc[i][0] * pc[i][1] * pc[i][1], conv_call, s);
  }
  static const int gm[][2] = {{256, 1024}, {1024, 1024}};
  for (int i = quick ? 1 : 0; i < 2; i++) {
    G g = {8, gm[i][0], gm[i][1]};
    far_point("gemm", 4.0 * gm[i][0] * gm[i][1], gemm_call, &g);
  }
  free(far_flush);
}

/*   stream    BYTES 1 1 1   the memory's rate over a working set of BYTES (256 KiB to 256 MiB): a += s b over
 *                           two arrays of BYTES / 2, FWD the seconds of BYTES of traffic (3 x 4 bytes an
 *                           element).  Where a stage's weights, gradients and stash live between their uses
 *                           (compiler/opcost.c: the update and the gradients' zeroing) */
static float *stream_a, *stream_b;
static int64_t stream_n;

static void stream_call(const void *arg, int part) {
  (void)arg, (void)part;
  for (int64_t i = 0; i < stream_n; i++) stream_a[i] += 0.5f * stream_b[i];
  __asm__ volatile("" : : "r"(stream_a) : "memory");
}

static void stream_grid(int quick) {
  for (int64_t bytes = 256 << 10; bytes <= (int64_t)256 << 20; bytes *= quick ? 16 : 4) {
    stream_n = bytes / 8;
    stream_a = aligned_alloc(64, (size_t)bytes / 2), stream_b = aligned_alloc(64, (size_t)bytes / 2);
    if (!stream_a || !stream_b) exit(1);
    for (int64_t i = 0; i < stream_n; i++) stream_a[i] = 1, stream_b[i] = 1e-3f;
    double ref = reference(), t = timed(stream_call, NULL, 0);
    record("stream", (double[4]){(double)bytes, 1, 1, 1}, (double[3]){t * (double)bytes / (12.0 * (double)stream_n), 0, 0}, ref);
    free(stream_a), free(stream_b);
  }
}

int main(int argc, char **argv) {
  /* As a stage program runs: its OpenBLAS kernels pinned, oneDNN on one OpenMP thread (prmain.c). */
  const char *omp = getenv("OMP_NUM_THREADS");
  if ((!omp || strcmp(omp, "1")) && !setenv("OMP_NUM_THREADS", "1", 1)) execv("/proc/self/exe", argv);
  blas_core_pin(argv, NULL);
  int quick = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) quick = 1;
    else if (!strcmp(argv[i], "--cold")) flush_caches = 1;
    else if (!strcmp(argv[i], "--raw")) normalize = 0;
    else return fprintf(stderr, "usage: pipecc-opprobe [--quick] [--cold] [--raw]\n"), 2;
  }
  if (quick) reps = 1;
  double t0 = now();
#ifdef PR_DNNL
  pr_conv_lib_init(getenv("OPENBLAS_CORETYPE"), 1);
#endif
  /* The largest: a 5x5 256-channel weight, 2^21 elements; im2col's columns of a 256-channel 5x5 image of
   * 32x32 (oneDNN's blocked copies need less). */
  buffers((size_t)1 << 22, (size_t)256 * 25 * 32 * 32 + 4096);
  gemm_grid(quick);
  mem_grid(quick);
  conv_grid(quick);
  point_grid(quick);
  update_grid(quick);
  loss_grid(quick);
  stream_grid(quick);
  far_grid(quick);
  print_points();
  printf("done %.2f\n", now() - t0);
  return 0;
}
