/* cuda/binary.cu - broadcasting ops of two or three inputs on the GPU: Add .. Min (kc_binary) and their
 * gradients, Where, the comparisons and Not, as cpu/binary.h and broadcast.c compute them.
 *
 * A broadcast is a walk over the output's axes, each operand reading with its stride along each (0 on a
 * broadcast axis).  The host merges axes where every operand is contiguous across them and drops axes
 * of size 1 (a Geo), so the kernels' index arithmetic is as short as the shape allows; a forward kernel
 * is one thread per output element.
 *
 * A gradient sums over the axes its operand is broadcast on.  Those axes are split from the others (a
 * Red): one thread per element of the gradient walks the output elements that map to it in output order
 * (the CPU's order, but for the CPU's eight lanes along a summed last axis).  Where that sum is long and
 * the gradient small (a bias over a batch of rows), the walk is cut into chunks of a length fixed by the
 * shape, each summed by its own thread into scratch, and one thread per element adds the chunks in
 * order.  No atomics: the same shape gives the same order every run. */
#include <string.h>

#include "common.cuh"
#include "kernels.h"

namespace {

constexpr int MAXAX = 8; /* BcastShape and WhereShape have rank 8 at most */
constexpr int NOP = 3;   /* operands one walk carries */

/* A walk over `rank` axes of sizes dim, operand p at base[p] + sum_d idx_d * st[p][d]. */
struct Geo {
  int rank;
  int64_t dim[MAXAX];
  int64_t st[NOP][MAXAX];
  int64_t base[NOP];
};

/* Host: the walk over dims, operand p reading with strides st[p] (NULL: 0 on every axis); axes of size 1
 * dropped and an axis merged into the one before where every operand is contiguous across the two (the
 * output's order of elements is kept). */
Geo geo_make(int rank, const int64_t *dims, const int64_t *const st[NOP]) {
  Geo g;
  memset(&g, 0, sizeof g);
  int r = 0;
  for (int i = 0; i < rank; i++) {
    if (dims[i] == 1) continue;
    int64_t s[NOP];
    for (int p = 0; p < NOP; p++) s[p] = st[p] ? st[p][i] : 0;
    bool merge = r > 0;
    for (int p = 0; p < NOP && merge; p++) merge = g.st[p][r - 1] == s[p] * dims[i];
    if (merge) {
      g.dim[r - 1] *= dims[i];
      for (int p = 0; p < NOP; p++) g.st[p][r - 1] = s[p];
      continue;
    }
    g.dim[r] = dims[i];
    for (int p = 0; p < NOP; p++) g.st[p][r] = s[p];
    r++;
  }
  g.rank = r;
  return g;
}

/* Row-major strides of dims (the output's own). */
void contiguous(int rank, const int64_t *dims, int64_t *st) {
  int64_t s = 1;
  for (int d = rank - 1; d >= 0; d--) st[d] = s, s *= dims[d];
}

/* Device: the operands' offsets at element i of the walk (I: the index type, 32 bits where it fits). */
template <typename I>
__device__ __forceinline__ void geo_at(const Geo &g, I i, int64_t o[NOP]) {
  for (int p = 0; p < NOP; p++) o[p] = g.base[p];
  for (int d = g.rank - 1; d > 0; d--) {
    I n = (I)g.dim[d], q = i / n, c = i - q * n;
    for (int p = 0; p < NOP; p++) o[p] += (int64_t)c * g.st[p][d];
    i = q;
  }
  if (g.rank > 0)
    for (int p = 0; p < NOP; p++) o[p] += (int64_t)i * g.st[p][0];
}

/* 32-bit index arithmetic where the walk's elements fit. */
inline bool fits32(int64_t n) { return n <= 0x7fffffff; }

/* ---- sums over broadcast axes ---- */

/* The walk split for a sum into operand `dsel`: k, the axes it is not broadcast on (one thread per
 * element of it), r, the axes it is (the sum, walked in output order); the sum cut into nchunks chunks of
 * `chunk` elements. */
struct Red {
  Geo k, r;
  int64_t nK, nR, chunk, nchunks;
  int dsel;
};

/* Sums shorter than this, or gradients with this many elements, run in one pass. */
constexpr int64_t RED_SHORT = 32, RED_WIDE = 65536, RED_THREADS = 131072, RED_MAX_CHUNKS = 1024, RED_MIN_CHUNK = 16;

Red red_make(const Geo &g, int dsel) {
  Red R;
  memset(&R, 0, sizeof R);
  R.dsel = dsel, R.nK = R.nR = 1;
  for (int p = 0; p < NOP; p++) R.k.base[p] = g.base[p];
  for (int d = 0; d < g.rank; d++) {
    int kept = g.st[dsel][d] != 0;
    Geo &t = kept ? R.k : R.r;
    t.dim[t.rank] = g.dim[d];
    for (int p = 0; p < NOP; p++) t.st[p][t.rank] = g.st[p][d];
    t.rank++;
    (kept ? R.nK : R.nR) *= g.dim[d];
  }
  int64_t nc = 1;
  if (R.nR > RED_SHORT && R.nK < RED_WIDE) {
    nc = (RED_THREADS + R.nK - 1) / R.nK;
    int64_t most = (R.nR + RED_MIN_CHUNK - 1) / RED_MIN_CHUNK;
    if (nc > most) nc = most;
    if (nc > RED_MAX_CHUNKS) nc = RED_MAX_CHUNKS;
    if (nc < 1) nc = 1;
  }
  R.chunk = (R.nR + nc - 1) / nc;
  R.nchunks = (R.nR + R.chunk - 1) / R.chunk;
  return R;
}

/* Whether the kept axes reach distinct elements of operand dsel (each then has one thread): the axes by
 * growing |stride|, each stride beyond all that the smaller ones reach.  A broadcast operand always is. */
bool red_distinct(const Red &R) {
  int64_t st[MAXAX], dim[MAXAX];
  int n = R.k.rank;
  for (int d = 0; d < n; d++) st[d] = R.k.st[R.dsel][d] < 0 ? -R.k.st[R.dsel][d] : R.k.st[R.dsel][d], dim[d] = R.k.dim[d];
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && st[j] < st[j - 1]; j--) {
      int64_t t = st[j];
      st[j] = st[j - 1], st[j - 1] = t, t = dim[j], dim[j] = dim[j - 1], dim[j - 1] = t;
    }
  int64_t reach = 0;
  for (int d = 0; d < n; d++) {
    if (st[d] <= reach) return false;
    reach += st[d] * (dim[d] - 1);
  }
  return true;
}

/* s plus the terms of sum elements [r0, r1) from the kept offsets ko, in output order. */
template <typename T>
__device__ float red_run(const T &t, const Red &R, const int64_t ko[NOP], int64_t r0, int64_t r1, float s) {
  const Geo &g = R.r;
  int64_t o[NOP], c[MAXAX], i = r0;
  for (int p = 0; p < NOP; p++) o[p] = ko[p];
  for (int d = g.rank - 1; d >= 0; d--) {
    c[d] = i % g.dim[d], i /= g.dim[d];
    for (int p = 0; p < NOP; p++) o[p] += c[d] * g.st[p][d];
  }
  for (int64_t r = r0; r < r1; r++) {
    float v;
    if (t(o, v)) s = __fadd_rn(s, v);
    for (int d = g.rank - 1; d >= 0; d--) {
      for (int p = 0; p < NOP; p++) o[p] += g.st[p][d];
      if (++c[d] < g.dim[d]) break;
      for (int p = 0; p < NOP; p++) o[p] -= g.st[p][d] * g.dim[d];
      c[d] = 0;
    }
  }
  return s;
}

/* One pass: a thread per element of the gradient, the whole sum (I: the kept axes' index type). */
template <typename I, typename T>
__global__ void red_one(T t, float *d, const __grid_constant__ Red R, int acc) {
  PR_CU_FOR(j, R.nK) {
    int64_t ko[NOP];
    geo_at<I>(R.k, (I)j, ko);
    float *dp = d + ko[R.dsel];
    *dp = red_run(t, R, ko, 0, R.nR, acc ? *dp : 0.0f);
  }
}
/* Two passes: chunk c of element j into part[c * nK + j], then the chunks in order. */
template <typename T>
__global__ void red_part(T t, float *part, const __grid_constant__ Red R) {
  PR_CU_FOR(e, R.nK * R.nchunks) {
    int64_t j = e % R.nK, c = e / R.nK, r0 = c * R.chunk, r1 = r0 + R.chunk < R.nR ? r0 + R.chunk : R.nR;
    int64_t ko[NOP];
    geo_at<uint32_t>(R.k, (uint32_t)j, ko); /* nK < RED_WIDE here */
    part[e] = red_run(t, R, ko, r0, r1, 0.0f);
  }
}
__global__ void red_fin(const float *part, float *d, const __grid_constant__ Red R, int acc) {
  PR_CU_FOR(j, R.nK) {
    int64_t ko[NOP];
    geo_at<uint32_t>(R.k, (uint32_t)j, ko);
    float *dp = d + ko[R.dsel], s = acc ? *dp : 0.0f;
    for (int64_t c = 0; c < R.nchunks; c++) s = __fadd_rn(s, part[c * R.nK + j]);
    *dp = s;
  }
}
/* Any other mapping (none of these kernels makes one): one thread, the output in order, as the CPU. */
template <typename T>
__global__ void red_serial(T t, float *d, const __grid_constant__ Geo g, int dsel, int64_t n) {
  if (blockIdx.x || threadIdx.x) return;
  for (int64_t i = 0; i < n; i++) {
    int64_t o[NOP];
    float v;
    geo_at<int64_t>(g, i, o);
    if (t(o, v)) d[o[dsel]] = __fadd_rn(d[o[dsel]], v);
  }
}

/* d (nd elements) = (acc ? d : 0) + the sum of t's terms over the walk g (ny elements) into operand dsel. */
template <typename T>
void red_launch(const T &t, float *d, const Geo &g, int dsel, int64_t nd, int64_t ny, int acc) {
  if (ny <= 0) {
    if (!acc && nd > 0) PR_CU(cudaMemsetAsync(d, 0, sizeof(float) * (size_t)nd, pr_cu_stream));
    return;
  }
  Red R = red_make(g, dsel);
  if (!red_distinct(R)) {
    if (!acc) PR_CU(cudaMemsetAsync(d, 0, sizeof(float) * (size_t)nd, pr_cu_stream));
    red_serial<<<1, 1, 0, pr_cu_stream>>>(t, d, g, dsel, ny);
    PR_CU_LAUNCHED();
    return;
  }
  if (!acc && R.nK != nd) { /* elements no output reaches stay 0 */
    PR_CU(cudaMemsetAsync(d, 0, sizeof(float) * (size_t)nd, pr_cu_stream));
    acc = 1;
  }
  if (R.nchunks <= 1) {
    unsigned blocks = pr_cu_blocks(R.nK, PR_CU_THREADS);
    if (fits32(R.nK)) red_one<uint32_t><<<blocks, PR_CU_THREADS, 0, pr_cu_stream>>>(t, d, R, acc);
    else red_one<int64_t><<<blocks, PR_CU_THREADS, 0, pr_cu_stream>>>(t, d, R, acc);
    PR_CU_LAUNCHED();
    return;
  }
  float *part = (float *)pr_cu_scratch((int64_t)sizeof(float) * R.nK * R.nchunks);
  red_part<<<pr_cu_blocks(R.nK * R.nchunks, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(t, part, R);
  PR_CU_LAUNCHED();
  red_fin<<<pr_cu_blocks(R.nK, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(part, d, R, acc);
  PR_CU_LAUNCHED();
}

/* ---- the ops ---- */

/* bin_apply of cpu/binary.h; BIN_POW and BIN_MUL_SELF alike: the CPU squares where the exponent is 2. */
__device__ __forceinline__ float bin_apply(int op, float a, float b) {
  switch (op) {
  case BIN_ADD: return a + b;
  case BIN_SUB: return a - b;
  case BIN_MUL: return a * b;
  case BIN_DIV: return a / b;
  case BIN_MAX: return a > b || a != a ? a : b;
  case BIN_MIN: return a < b || a != a ? a : b;
  default: return b == 2.0f ? a * a : powf(a, b);
  }
}

/* One term of k_binary_grad's sum, the CPU's formulas.  Pow's gradient for a where the exponent is 2 is
 * 2 * a, as the CPU's (its powf(a, 1) is a). */
__device__ __forceinline__ float bin_grad(int op, int which, float A, float B, float G) {
  switch (op) {
  case BIN_ADD: return G;
  case BIN_SUB: return which ? -G : G;
  case BIN_MUL: return which ? G * A : G * B;
  case BIN_DIV: return which ? -G * A / (B * B) : G / B;
  case BIN_MAX: return which ? (B == A ? G / 2 : B < A ? 0 : G) : (A == B ? G / 2 : A < B ? 0 : G);
  case BIN_MIN: return which ? (B == A ? G / 2 : B > A ? 0 : G) : (A == B ? G / 2 : A > B ? 0 : G);
  default:
    if (which) return G * powf(A, B) * logf(A);
    return B == 2.0f ? G * 2.0f * A : G * B * powf(A, B - 1);
  }
}

/* Operands: 0 dy (the output's order), 1 a, 2 b. */
struct BinGradTerm {
  int op, which;
  const float *a, *b, *dy;
  __device__ bool operator()(const int64_t *o, float &v) const {
    float A = a ? a[o[1]] : 0.0f, B = b ? b[o[2]] : 0.0f;
    v = bin_grad(op, which, A, B, dy[o[0]]);
    return true;
  }
};

/* Operands: 0 dy, 1 the condition, 2 the gradient. */
struct WhereGradTerm {
  const uint8_t *c;
  const float *dy;
  int want;
  __device__ bool operator()(const int64_t *o, float &v) const {
    if ((c[o[1]] != 0) != want) return false;
    v = dy[o[0]];
    return true;
  }
};

template <typename I>
__global__ void binary_kernel(int op, const float *a, const float *b, float *y, const __grid_constant__ Geo g, int64_t n) {
  PR_CU_FOR(i, n) {
    int64_t o[NOP];
    geo_at<I>(g, (I)i, o);
    y[i] = bin_apply(op, a[o[0]], b[o[1]]);
  }
}

template <typename I>
__global__ void where_kernel(const uint8_t *c, const float *x, const float *y, float *out, const __grid_constant__ Geo g, int64_t n) {
  PR_CU_FOR(i, n) {
    int64_t o[NOP];
    geo_at<I>(g, (I)i, o);
    out[i] = c[o[0]] ? x[o[1]] : y[o[2]];
  }
}

template <typename I>
__global__ void compare_kernel(int op, const float *a, const float *b, uint8_t *y, const __grid_constant__ Geo g, int64_t n) {
  PR_CU_FOR(i, n) {
    int64_t o[NOP];
    geo_at<I>(g, (I)i, o);
    float u = a[o[0]], v = b[o[1]];
    y[i] = op == CMP_EQUAL ? u == v : op == CMP_LESS ? u < v : u > v;
  }
}

__global__ void not_kernel(const uint8_t *x, uint8_t *y, int64_t n) {
  PR_CU_FOR(i, n) y[i] = !x[i];
}

} // namespace

extern "C" void kc_binary(int op, const float *a, const float *b, float *y, const BcastShape *s) {
  if (s->ny <= 0) return;
  const int64_t *st[NOP] = {s->sa, s->sb, NULL};
  Geo g = geo_make(s->rank, s->out, st);
  unsigned blocks = pr_cu_blocks(s->ny, PR_CU_THREADS);
  if (fits32(s->ny)) binary_kernel<uint32_t><<<blocks, PR_CU_THREADS, 0, pr_cu_stream>>>(op, a, b, y, g, s->ny);
  else binary_kernel<int64_t><<<blocks, PR_CU_THREADS, 0, pr_cu_stream>>>(op, a, b, y, g, s->ny);
  PR_CU_LAUNCHED();
}

extern "C" void kc_binary_grad(int op, int which, const float *a, const float *b, const float *dy, float *d, const BcastShape *s,
                               int acc) {
  int64_t cy[MAXAX];
  contiguous(s->rank, s->out, cy);
  const int64_t *st[NOP] = {cy, s->sa, s->sb};
  Geo g = geo_make(s->rank, s->out, st);
  BinGradTerm t = {op, which, a, b, dy};
  red_launch(t, d, g, which ? 2 : 1, which ? s->nb : s->na, s->ny, acc);
}

extern "C" void kc_where(const uint8_t *c, const float *x, const float *y, float *out, const WhereShape *s) {
  if (s->nout <= 0) return;
  const int64_t *st[NOP] = {s->sc, s->sx, s->sy};
  Geo g = geo_make(s->rank, s->out, st);
  unsigned blocks = pr_cu_blocks(s->nout, PR_CU_THREADS);
  if (fits32(s->nout)) where_kernel<uint32_t><<<blocks, PR_CU_THREADS, 0, pr_cu_stream>>>(c, x, y, out, g, s->nout);
  else where_kernel<int64_t><<<blocks, PR_CU_THREADS, 0, pr_cu_stream>>>(c, x, y, out, g, s->nout);
  PR_CU_LAUNCHED();
}

extern "C" void kc_where_grad(const uint8_t *c, const float *dout, float *d, int which, const WhereShape *s, int acc) {
  int64_t cy[MAXAX];
  contiguous(s->rank, s->out, cy);
  const int64_t *st[NOP] = {cy, s->sc, which == 1 ? s->sx : s->sy};
  Geo g = geo_make(s->rank, s->out, st);
  WhereGradTerm t = {c, dout, which == 1};
  red_launch(t, d, g, 2, which == 1 ? s->nx : s->ny, s->nout, acc);
}

extern "C" void kc_compare(int op, const float *a, const float *b, uint8_t *y, const BcastShape *s) {
  if (s->ny <= 0) return;
  const int64_t *st[NOP] = {s->sa, s->sb, NULL};
  Geo g = geo_make(s->rank, s->out, st);
  unsigned blocks = pr_cu_blocks(s->ny, PR_CU_THREADS);
  if (fits32(s->ny)) compare_kernel<uint32_t><<<blocks, PR_CU_THREADS, 0, pr_cu_stream>>>(op, a, b, y, g, s->ny);
  else compare_kernel<int64_t><<<blocks, PR_CU_THREADS, 0, pr_cu_stream>>>(op, a, b, y, g, s->ny);
  PR_CU_LAUNCHED();
}

extern "C" void kc_not(const uint8_t *x, uint8_t *y, int64_t n) {
  if (n <= 0) return;
  not_kernel<<<pr_cu_blocks(n, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(x, y, n);
  PR_CU_LAUNCHED();
}
