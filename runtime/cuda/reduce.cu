/* cuda/reduce.cu - reductions on the GPU: ReduceMean / ReduceSum, ReduceMax, ArgMax and the gradients
 * (cpu/reduce.h's k_* kernels, the same arguments).
 *
 * The input's axes are first put in a canonical form on the host: axes of size 1 dropped, neighbours
 * that are both reduced or both kept merged, so [n, c, h, w] over {h, w} is [n*c, h*w] and the
 * reduced elements of an output are an index r over the reduced axes, read in the input's order.
 *   - The innermost axis reduced (a norm's mean, a global pool): a warp or a block per output, each
 *     thread summing the elements r = lane, lane + T, ... of the output in order, then a fixed tree
 *     (warp shuffles, then the warps' totals through shared memory; rows.cuh).
 *   - The innermost axis kept (a sum over the batch): a thread per output, its loop over r in order,
 *     neighbouring threads reading neighbouring addresses.
 * Where the outputs are few and each is long, the r of an output are cut into P chunks (P fixed by the
 * shape), each summed as above into scratch, and a last kernel adds an output's P partial sums in order.
 * Every sum's order depends on the shape alone, so a call gives the same bits on every run.
 * ReduceMax combines in the same trees (a NaN wins, as on the CPU); ArgMax's tree compares (value,
 * index) pairs by the CPU's rule (a NaN above every number, ties to the first index, or the last with
 * select_last_index), which picks the same index whatever the order. */
#include "common.cuh"
#include "kernels.h"
#include "rows.cuh"

#include <string.h>

namespace {

/* k_reduce_max's step: a larger element or a NaN replaces the running value. */
struct MaxNan {
  __device__ float id() const { return -INFINITY; }
  __device__ float operator()(float a, float b) const { return b > a || b != b ? b : a; }
};

/* ---- the canonical axes ---- */
struct Geo {
  int nd;            /* axes after dropping 1s and merging, outer to inner */
  int64_t sz[8];     /* their sizes */
  int64_t ost[8];    /* the output's stride along each (0 for a reduced axis) */
  int nk, nr;        /* kept and reduced axes, outer to inner: sizes and input strides */
  int64_t ksz[8], kst[8], rsz[8], rst[8];
  int64_t nout, inner; /* outputs, elements per output */
  int last_red;      /* the innermost axis is reduced */
};

static Geo geo_of(const ReduceShape *s) {
  Geo g;
  memset(&g, 0, sizeof g);
  int red[8] = {0};
  for (int d = 0; d < s->rank && d < 8; d++) {
    if (s->in[d] == 1) continue;
    int r = s->mask >> d & 1;
    if (g.nd > 0 && red[g.nd - 1] == r) g.sz[g.nd - 1] *= s->in[d];
    else g.sz[g.nd] = s->in[d], red[g.nd] = r, g.nd++;
  }
  int64_t st[8], in = 1, out = 1;
  for (int d = g.nd - 1; d >= 0; d--) {
    st[d] = in, in *= g.sz[d];
    g.ost[d] = red[d] ? 0 : out;
    if (!red[d]) out *= g.sz[d];
  }
  g.nout = 1, g.inner = 1;
  for (int d = 0; d < g.nd; d++)
    if (red[d]) g.rsz[g.nr] = g.sz[d], g.rst[g.nr++] = st[d], g.inner *= g.sz[d];
    else g.ksz[g.nk] = g.sz[d], g.kst[g.nk++] = st[d], g.nout *= g.sz[d];
  g.last_red = g.nd > 0 && red[g.nd - 1];
  return g;
}

/* The input offset of index idx of a row-major walk over nd axes of sizes sz and strides st. */
__device__ __forceinline__ int64_t walk_offset(int64_t idx, int nd, const int64_t *sz, const int64_t *st) {
  if (nd == 0) return 0;
  if (nd == 1) return idx * st[0];
  int64_t off = 0;
#pragma unroll
  for (int d = 7; d >= 0; d--)
    if (d < nd) {
      int64_t c = idx % sz[d];
      idx /= sz[d];
      off += c * st[d];
    }
  return off;
}
/* The output element input element i goes to (cpu/reduce.h's reduce_at). */
__device__ __forceinline__ int64_t out_index(int64_t i, const Geo &g) {
  if (g.nr == 0) return i;
  if (g.nk == 0) return 0;
  if (g.nd == 2) return g.last_red ? i / g.sz[1] : i % g.sz[1];
  int64_t o = 0;
#pragma unroll
  for (int d = 7; d >= 0; d--)
    if (d < g.nd) {
      int64_t c = i % g.sz[d];
      i /= g.sz[d];
      o += c * g.ost[d];
    }
  return o;
}

/* What a reduction reads at an input offset for output o. */
struct LoadX {
  const float *x;
  __device__ float operator()(int64_t, int64_t off) const { return x[off]; }
};
/* k_reduce_max_grad's count: 1 where the element equals its output's max. */
struct LoadEq {
  const float *x, *y;
  __device__ float operator()(int64_t o, int64_t off) const { return x[off] == y[o] ? 1.0f : 0.0f; }
};

/* The innermost axis reduced: a group of TPR threads per (output, chunk); chunk p of P covers r in
 * [p L, p L + L).  With P = 1 the result goes to y (times scale when SCALE), else to part[o P + p]. */
template <int TPR, bool SCALE, typename Op, typename Load>
__global__ void red_rows(Geo g, Load ld, Op op, int64_t P, int64_t L, float *part, float *y, float scale) {
  __shared__ float sh[33];
  int64_t grp;
  int lane;
  if (!row_of<TPR>(g.nout * P, &grp, &lane)) return;
  const int64_t o = grp / P, p = grp % P, base = walk_offset(o, g.nk, g.ksz, g.kst);
  const int64_t lo = p * L, hi = lo + L < g.inner ? lo + L : g.inner;
  float acc = op.id();
  for (int64_t r = lo + lane; r < hi; r += TPR) acc = op(acc, ld(o, base + walk_offset(r, g.nr, g.rsz, g.rst)));
  acc = group_reduce<TPR>(acc, op, sh);
  if (lane == 0) {
    if (P == 1) y[o] = SCALE ? acc * scale : acc;
    else part[grp] = acc;
  }
}
/* The innermost axis kept: a thread per (output, chunk), t = p nout + o, r in order; the partial
 * result to part[p nout + o]. */
template <bool SCALE, typename Op, typename Load>
__global__ void red_cols(Geo g, Load ld, Op op, int64_t P, int64_t L, float *part, float *y, float scale) {
  PR_CU_FOR(t, g.nout * P) {
    const int64_t o = t % g.nout, p = t / g.nout, base = walk_offset(o, g.nk, g.ksz, g.kst);
    const int64_t lo = p * L, hi = lo + L < g.inner ? lo + L : g.inner;
    float acc = op.id();
    for (int64_t r = lo; r < hi; r++) acc = op(acc, ld(o, base + walk_offset(r, g.nr, g.rsz, g.rst)));
    if (P == 1) y[o] = SCALE ? acc * scale : acc;
    else part[t] = acc;
  }
}
/* An output's P partial results combined in chunk order: part[o ostr + p pstr]. */
template <bool SCALE, typename Op>
__global__ void red_finish(const float *part, float *y, int64_t nout, int64_t P, int64_t ostr, int64_t pstr, Op op, float scale) {
  PR_CU_FOR(o, nout) {
    float acc = op.id();
    for (int64_t p = 0; p < P; p++) acc = op(acc, part[o * ostr + p * pstr]);
    y[o] = SCALE ? acc * scale : acc;
  }
}

/* y[o] = op over output o's elements (ld's values), times scale when SCALE. */
template <bool SCALE, typename Op, typename Load> void reduce_run(const Geo &g, Load ld, Op op, float *y, float scale) {
  if (g.nout <= 0 || g.inner <= 0) return;
  int64_t P = 1;
  if (g.last_red) {
    if (g.nout < 264 && g.inner > 65536) {
      int64_t a = (g.inner + 32767) / 32768, b = (528 + g.nout - 1) / g.nout;
      P = a < b ? a : b;
    }
  } else if (g.nout < 65536 && g.inner > 64) {
    int64_t a = (g.inner + 63) / 64, b = (131072 + g.nout - 1) / g.nout;
    P = a < b ? a : b;
  }
  const int64_t L = (g.inner + P - 1) / P;
  float *part = P > 1 ? (float *)pr_cu_scratch(g.nout * P * (int64_t)sizeof(float)) : nullptr;
  if (g.last_red) {
    const int tpr = row_tpr(g.nout * P, L);
    const unsigned blocks = row_blocks(g.nout * P, tpr);
    if (tpr == 32) red_rows<32, SCALE><<<blocks, row_threads(32), 0, pr_cu_stream>>>(g, ld, op, P, L, part, y, scale);
    else if (tpr == 256) red_rows<256, SCALE><<<blocks, 256, 0, pr_cu_stream>>>(g, ld, op, P, L, part, y, scale);
    else red_rows<1024, SCALE><<<blocks, 1024, 0, pr_cu_stream>>>(g, ld, op, P, L, part, y, scale);
    PR_CU_LAUNCHED();
    if (P > 1) {
      red_finish<SCALE><<<pr_cu_blocks(g.nout, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(part, y, g.nout, P, P, 1, op, scale);
      PR_CU_LAUNCHED();
    }
  } else {
    red_cols<SCALE><<<pr_cu_blocks(g.nout * P, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(g, ld, op, P, L, part, y, scale);
    PR_CU_LAUNCHED();
    if (P > 1) {
      red_finish<SCALE><<<pr_cu_blocks(g.nout, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(part, y, g.nout, P, 1, g.nout, op,
                                                                                                    scale);
      PR_CU_LAUNCHED();
    }
  }
}

__global__ void reduce_grad_k(const float *dy, float *dx, Geo g, int64_t n, float scale, int acc) {
  PR_CU_FOR(i, n) {
    float v = dy[out_index(i, g)] * scale;
    dx[i] = acc ? dx[i] + v : v;
  }
}
__global__ void reduce_max_grad_k(const float *x, const float *y, const float *dy, float *dx, const float *cnt, Geo g, int64_t n, int acc) {
  PR_CU_FOR(i, n) {
    int64_t o = out_index(i, g);
    float v = dy[o] / cnt[o] * (x[i] == y[o] ? 1.0f : 0.0f);
    dx[i] = acc ? dx[i] + v : v;
  }
}

/* ---- ArgMax ---- */
struct ArgPair {
  float v;
  int64_t i;
};
__device__ __forceinline__ ArgPair shfl_down(ArgPair a, int off) {
  a.v = __shfl_down_sync(0xffffffffu, a.v, off);
  a.i = __shfl_down_sync(0xffffffffu, a.i, off);
  return a;
}
__device__ __forceinline__ ArgPair shfl0(ArgPair a) {
  a.v = __shfl_sync(0xffffffffu, a.v, 0);
  a.i = __shfl_sync(0xffffffffu, a.i, 0);
  return a;
}
/* k_argmax's order: a NaN above every number, equal values (and NaNs among themselves) ordered by the
 * index, the first winning, or the last with select_last_index.  The identity loses to every element. */
struct ArgBest {
  int last;
  __device__ ArgPair id() const { return ArgPair{-INFINITY, last ? (int64_t)-1 : INT64_MAX}; }
  __device__ ArgPair operator()(ArgPair a, ArgPair b) const {
    int an = a.v != a.v, bn = b.v != b.v, later = last ? b.i > a.i : b.i < a.i, better;
    if (an || bn) better = an && bn ? later : bn;
    else better = b.v > a.v || (b.v == a.v && later);
    return better ? b : a;
  }
};
/* inner == 1: a group per row of `axis` elements. */
template <int TPR> __global__ void argmax_rows(const float *x, int64_t *y, int64_t rows, int64_t axis, ArgBest op) {
  __shared__ ArgPair sh[33];
  int64_t row;
  int lane;
  if (!row_of<TPR>(rows, &row, &lane)) return;
  const float *p = x + row * axis;
  ArgPair best = op.id();
  for (int64_t j = lane; j < axis; j += TPR) best = op(best, ArgPair{p[j], j});
  best = group_reduce<TPR>(best, op, sh);
  if (lane == 0) y[row] = best.i;
}
/* inner > 1: a thread per output, the CPU's loop. */
__global__ void argmax_cols(const float *x, int64_t *y, int64_t outer, int64_t axis, int64_t inner, int last) {
  PR_CU_FOR(t, outer * inner) {
    const int64_t o = t / inner, k = t % inner;
    const float *p = x + o * axis * inner + k;
    int64_t at = 0;
    float best = p[0];
    for (int64_t j = 1; j < axis; j++) {
      float v = p[j * inner];
      int vn = v != v, bn = best != best;
      int better = vn ? !bn || last : !bn && (v > best || (last && v == best));
      if (better) at = j, best = v;
    }
    y[t] = at;
  }
}

} // namespace

extern "C" void kc_reduce(const float *x, float *y, const ReduceShape *s) {
  reduce_run<true>(geo_of(s), LoadX{x}, Sum<float>{}, y, s->scale);
}

extern "C" void kc_reduce_grad(const float *dy, float *dx, const ReduceShape *s, int acc) {
  if (s->n <= 0) return;
  reduce_grad_k<<<pr_cu_blocks(s->n, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(dy, dx, geo_of(s), s->n, s->scale, acc);
  PR_CU_LAUNCHED();
}

extern "C" void kc_reduce_max(const float *x, float *y, const ReduceShape *s) {
  reduce_run<false>(geo_of(s), LoadX{x}, MaxNan{}, y, 1.0f);
}

extern "C" void kc_reduce_max_grad(const float *x, const float *y, const float *dy, float *dx, float *cnt, const ReduceShape *s, int acc) {
  if (s->n <= 0) return;
  const Geo g = geo_of(s);
  reduce_run<false>(g, LoadEq{x, y}, Sum<float>{}, cnt, 1.0f); /* counts: whole numbers, exact in any order */
  reduce_max_grad_k<<<pr_cu_blocks(s->n, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(x, y, dy, dx, cnt, g, s->n, acc);
  PR_CU_LAUNCHED();
}

extern "C" void kc_argmax(const float *x, int64_t *y, int64_t outer, int64_t axis, int64_t inner, int last) {
  if (outer <= 0 || inner <= 0 || axis <= 0) return;
  if (inner == 1) {
    const ArgBest op{last};
    ROWS_LAUNCH(argmax_rows, outer, axis, x, y, outer, axis, op);
  } else {
    argmax_cols<<<pr_cu_blocks(outer * inner, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(x, y, outer, axis, inner, last);
    PR_CU_LAUNCHED();
  }
}
