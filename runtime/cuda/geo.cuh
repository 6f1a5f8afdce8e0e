/* cuda/geo.cuh - the strided walk that binary.cu (broadcasts) and movement.cu (views, permutations)
 * share, and the sums over the axes an operand is read with stride 0 on (their gradients).
 *
 * A walk (GeoN<MAXAX, NOP>) goes over the output's axes in row-major order, NOP operands each reading
 * with its own stride along each axis (0 on a broadcast axis); the host drops axes of size 1 and merges
 * an axis into the one before where every operand is contiguous across the two, so the kernels' index
 * arithmetic is as short as the shape allows.  MAXAX: the most axes a shape has; NOP: the operands one
 * walk carries (binary.cu: 8 and 3, movement.cu: 16 and 2).
 *
 * A sum into operand dsel (RedN) splits the walk into the axes dsel is read along (one thread per element
 * of it) and those it is not (the sum, walked in output order); its terms come from a functor t, t(o, v)
 * the term at the operands' offsets o in v, or false where there is none.  Where that sum is long and
 * the operand small, the walk is cut into chunks of a length fixed by the shape, each summed by its own
 * thread into scratch, and one thread per element adds the chunks in order.  No atomics: the same shape
 * gives the same order every run.  Included by one .cu each: everything is in its unnamed namespace. */
#ifndef PIPERUN_CUDA_GEO_CUH
#define PIPERUN_CUDA_GEO_CUH
#include <string.h>

#include "common.cuh"

namespace {

/* A walk over `rank` axes of sizes dim, operand p at base[p] + sum_d idx_d * st[p][d]. */
template <int MAXAX, int NOP> struct GeoN {
  static constexpr int nop = NOP; /* for geo_make */
  int rank;
  int64_t dim[MAXAX];
  int64_t st[NOP][MAXAX];
  int64_t base[NOP];
};

/* Host: the walk G over dims, operand p reading with strides st[p] (NULL: 0 on every axis) from base[p]
 * (base NULL: 0); axes of size 1 dropped and an axis merged into the one before where every operand is
 * contiguous across the two (the output's order of elements is kept). */
template <typename G> G geo_make(int rank, const int64_t *dims, const int64_t *const st[G::nop], const int64_t *base) {
  constexpr int NOP = G::nop;
  G g;
  memset(&g, 0, sizeof g);
  for (int p = 0; p < NOP; p++) g.base[p] = base ? base[p] : 0;
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
inline void contiguous(int rank, const int64_t *dims, int64_t *st) {
  int64_t s = 1;
  for (int d = rank - 1; d >= 0; d--) st[d] = s, s *= dims[d];
}

/* Device: the operands' offsets at element i of the walk (I: the index type, 32 bits where it fits). */
template <typename I, int MAXAX, int NOP>
__device__ __forceinline__ void geo_at(const GeoN<MAXAX, NOP> &g, I i, int64_t o[NOP]) {
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

/* ---- sums over the axes an operand is read with stride 0 on ---- */

/* The walk split for a sum into operand `dsel`: k, the axes it is read along (one thread per element of
 * it), r, the axes it is not (the sum, walked in output order); the sum cut into nchunks chunks of
 * `chunk` elements. */
template <int MAXAX, int NOP> struct RedN {
  GeoN<MAXAX, NOP> k, r;
  int64_t nK, nR, chunk, nchunks;
  int dsel;
};

/* Sums shorter than this, or gradients with this many elements, run in one pass. */
constexpr int64_t RED_SHORT = 32, RED_WIDE = 65536, RED_THREADS = 131072, RED_MAX_CHUNKS = 1024, RED_MIN_CHUNK = 16;

template <int MAXAX, int NOP> RedN<MAXAX, NOP> red_make(const GeoN<MAXAX, NOP> &g, int dsel) {
  RedN<MAXAX, NOP> R;
  memset(&R, 0, sizeof R);
  R.dsel = dsel, R.nK = R.nR = 1;
  for (int p = 0; p < NOP; p++) R.k.base[p] = g.base[p];
  for (int d = 0; d < g.rank; d++) {
    int kept = g.st[dsel][d] != 0;
    GeoN<MAXAX, NOP> &t = kept ? R.k : R.r;
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
 * growing |stride|, each stride beyond all that the smaller ones reach.  A broadcast operand always is,
 * as are Slice's, Expand's and Tile's dx. */
template <int MAXAX, int NOP> bool red_distinct(const RedN<MAXAX, NOP> &R) {
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

/* s plus t's terms of sum elements [r0, r1) from the kept offsets ko, in output order. */
template <typename T, int MAXAX, int NOP>
__device__ float red_run(const T &t, const RedN<MAXAX, NOP> &R, const int64_t ko[NOP], int64_t r0, int64_t r1, float s) {
  const GeoN<MAXAX, NOP> &g = R.r;
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
template <typename I, typename T, int MAXAX, int NOP>
__global__ void red_one(T t, float *d, const __grid_constant__ RedN<MAXAX, NOP> R, int acc) {
  PR_CU_FOR(j, R.nK) {
    int64_t ko[NOP];
    geo_at<I>(R.k, (I)j, ko);
    float *dp = d + ko[R.dsel];
    *dp = red_run(t, R, ko, 0, R.nR, acc ? *dp : 0.0f);
  }
}
/* Two passes: chunk c of element j into part[c * nK + j], then the chunks in order. */
template <typename T, int MAXAX, int NOP>
__global__ void red_part(T t, float *part, const __grid_constant__ RedN<MAXAX, NOP> R) {
  PR_CU_FOR(e, R.nK * R.nchunks) {
    int64_t j = e % R.nK, c = e / R.nK, r0 = c * R.chunk, r1 = r0 + R.chunk < R.nR ? r0 + R.chunk : R.nR;
    int64_t ko[NOP];
    geo_at<uint32_t>(R.k, (uint32_t)j, ko); /* nK < RED_WIDE here */
    part[e] = red_run(t, R, ko, r0, r1, 0.0f);
  }
}
template <int MAXAX, int NOP>
__global__ void red_fin(const float *part, float *d, const __grid_constant__ RedN<MAXAX, NOP> R, int acc) {
  PR_CU_FOR(j, R.nK) {
    int64_t ko[NOP];
    geo_at<uint32_t>(R.k, (uint32_t)j, ko);
    float *dp = d + ko[R.dsel], s = acc ? *dp : 0.0f;
    for (int64_t c = 0; c < R.nchunks; c++) s = __fadd_rn(s, part[c * R.nK + j]);
    *dp = s;
  }
}
/* Any other mapping (no broadcast makes one, nor Slice, Expand or Tile): one thread, the output in order,
 * as the CPU. */
template <typename T, int MAXAX, int NOP>
__global__ void red_serial(T t, float *d, const __grid_constant__ GeoN<MAXAX, NOP> g, int dsel, int64_t n) {
  if (blockIdx.x || threadIdx.x) return;
  for (int64_t i = 0; i < n; i++) {
    int64_t o[NOP];
    float v;
    geo_at<int64_t>(g, i, o);
    if (t(o, v)) d[o[dsel]] = __fadd_rn(d[o[dsel]], v);
  }
}

/* d (nd elements) = (acc ? d : 0) + the sum of t's terms over the walk g (ny elements) into operand dsel. */
template <typename T, int MAXAX, int NOP>
void red_launch(const T &t, float *d, const GeoN<MAXAX, NOP> &g, int dsel, int64_t nd, int64_t ny, int acc) {
  if (ny <= 0) {
    if (!acc && nd > 0) PR_CU(cudaMemsetAsync(d, 0, sizeof(float) * (size_t)nd, pr_cu_stream));
    return;
  }
  RedN<MAXAX, NOP> R = red_make(g, dsel);
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

} // namespace
#endif
