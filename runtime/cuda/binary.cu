/* cuda/binary.cu - broadcasting ops of two or three inputs on the GPU: Add .. Min (kc_binary) and their
 * gradients, Where, the comparisons and Not, as cpu/binary.h and broadcast.c compute them.
 *
 * A broadcast is a walk over the output's axes, each operand reading with its stride along each (0 on a
 * broadcast axis).  The host merges axes where every operand is contiguous across them and drops axes
 * of size 1 (a Geo, geo.cuh), so the kernels' index arithmetic is as short as the shape allows; a
 * forward kernel is one thread per output element.
 *
 * A gradient sums over the axes its operand is broadcast on.  Those axes are split from the others (a
 * Red, geo.cuh): one thread per element of the gradient walks the output elements that map to it in
 * output order (the CPU's order, but for the CPU's eight lanes along a summed last axis).  Where that sum
 * is long and the gradient small (a bias over a batch of rows), the walk is cut into chunks of a length
 * fixed by the shape, each summed by its own thread into scratch, and one thread per element adds the
 * chunks in order.  No atomics: the same shape gives the same order every run. */
#include "common.cuh"
#include "geo.cuh"
#include "kernels.h"

namespace {

constexpr int MAXAX = 8; /* BcastShape and WhereShape have rank 8 at most */
constexpr int NOP = 3;   /* operands one walk carries */
using Geo = GeoN<MAXAX, NOP>;

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
  Geo g = geo_make<Geo>(s->rank, s->out, st, NULL);
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
  Geo g = geo_make<Geo>(s->rank, s->out, st, NULL);
  BinGradTerm t = {op, which, a, b, dy};
  red_launch(t, d, g, which ? 2 : 1, which ? s->nb : s->na, s->ny, acc);
}

extern "C" void kc_where(const uint8_t *c, const float *x, const float *y, float *out, const WhereShape *s) {
  if (s->nout <= 0) return;
  const int64_t *st[NOP] = {s->sc, s->sx, s->sy};
  Geo g = geo_make<Geo>(s->rank, s->out, st, NULL);
  unsigned blocks = pr_cu_blocks(s->nout, PR_CU_THREADS);
  if (fits32(s->nout)) where_kernel<uint32_t><<<blocks, PR_CU_THREADS, 0, pr_cu_stream>>>(c, x, y, out, g, s->nout);
  else where_kernel<int64_t><<<blocks, PR_CU_THREADS, 0, pr_cu_stream>>>(c, x, y, out, g, s->nout);
  PR_CU_LAUNCHED();
}

extern "C" void kc_where_grad(const uint8_t *c, const float *dout, float *d, int which, const WhereShape *s, int acc) {
  int64_t cy[MAXAX];
  contiguous(s->rank, s->out, cy);
  const int64_t *st[NOP] = {cy, s->sc, which == 1 ? s->sx : s->sy};
  Geo g = geo_make<Geo>(s->rank, s->out, st, NULL);
  WhereGradTerm t = {c, dout, which == 1};
  red_launch(t, d, g, 2, which == 1 ? s->nx : s->ny, s->nout, acc);
}

extern "C" void kc_compare(int op, const float *a, const float *b, uint8_t *y, const BcastShape *s) {
  if (s->ny <= 0) return;
  const int64_t *st[NOP] = {s->sa, s->sb, NULL};
  Geo g = geo_make<Geo>(s->rank, s->out, st, NULL);
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
