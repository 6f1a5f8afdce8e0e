/* cuda/movement.cu - data movement on the GPU: copies, Pad, Transpose, slices along an axis (Split,
 * Concat), strided views (Slice, Expand, Tile), Cast and Gather, each with its gradient, as cpu/movement.h
 * computes them.  Every value is moved, not computed, so every result but a sum is the CPU's bits; the
 * sums (Expand's and Tile's gradients, Gather's for a repeated index) run in an order fixed by the shape
 * and, for Gather's, in the CPU's order, index position by index position.
 *
 * A strided walk (a view, a permutation) is a Geo: the output's axes, size-1 axes dropped and an axis
 * merged into the one before where the input is contiguous across them, read one thread per output
 * element.  A permutation whose last output axis reads the input with a stride goes through 32 x 32 tiles
 * in shared memory, so both sides are read and written a row at a time.  Gather's gradient sorts the
 * index positions by row (a stable radix sort: positions of one row stay in order) and sums each row's
 * positions in one thread per column. */
#include <string.h>

#include <cub/cub.cuh>

#include "common.cuh"
#include "kernels.h"

namespace {

constexpr int MAXAX = 16; /* ViewShape's axes */
constexpr int NOP = 2;    /* operands one walk carries */

/* A walk over `rank` axes of sizes dim, operand p at base[p] + sum_d idx_d * st[p][d]. */
struct Geo {
  int rank;
  int64_t dim[MAXAX];
  int64_t st[NOP][MAXAX];
  int64_t base[NOP];
};

/* Host: the walk over dims, operand p reading with strides st[p] (NULL: 0) from base[p] (NULL: 0); axes of
 * size 1 dropped and an axis merged into the one before where every operand is contiguous across both. */
Geo geo_make(int rank, const int64_t *dims, const int64_t *const st[NOP], const int64_t *base) {
  Geo g;
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

inline bool fits32(int64_t n) { return n <= 0x7fffffff; }
inline unsigned blocks_for(int64_t n) { return pr_cu_blocks(n, PR_CU_THREADS); }
#define LAUNCH(kernel, n) kernel<<<blocks_for(n), PR_CU_THREADS, 0, pr_cu_stream>>>

/* y[i] = x[operand 0's offset of i]: views and permutations. */
template <typename I>
__global__ void walk_read(const float *x, float *y, const __grid_constant__ Geo g, int64_t n) {
  PR_CU_FOR(i, n) {
    int64_t o[NOP];
    geo_at<I>(g, (I)i, o);
    y[i] = x[o[0]];
  }
}
/* dx[operand 0's offset of i] = (acc ? it : 0) + dy[i], where no two i reach one element (a permutation). */
template <typename I>
__global__ void walk_write(const float *dy, float *dx, const __grid_constant__ Geo g, int64_t n, int acc) {
  PR_CU_FOR(i, n) {
    int64_t o[NOP];
    geo_at<I>(g, (I)i, o);
    dx[o[0]] = acc ? dx[o[0]] + dy[i] : dy[i];
  }
}
void walk_read_launch(const float *x, float *y, const Geo &g, int64_t n) {
  if (fits32(n)) LAUNCH(walk_read<uint32_t>, n)(x, y, g, n);
  else LAUNCH(walk_read<int64_t>, n)(x, y, g, n);
  PR_CU_LAUNCHED();
}

/* ---- sums over the axes a view reads with stride 0 (Expand, Tile) ----
 * Operand 0: dy (the output's order); 1: dx.  One thread per element of dx that the view reads (the
 * axes of nonzero stride) sums the output elements that read it in output order; a long sum for a small
 * dx is cut into chunks of a length fixed by the shape, summed into scratch, then added in order. */
struct Red {
  Geo k, r; /* the kept axes (a thread each), the summed ones */
  int64_t nK, nR, chunk, nchunks;
};
constexpr int64_t RED_SHORT = 32, RED_WIDE = 65536, RED_THREADS = 131072, RED_MAX_CHUNKS = 1024, RED_MIN_CHUNK = 16;

Red red_make(const Geo &g) {
  Red R;
  memset(&R, 0, sizeof R);
  R.nK = R.nR = 1;
  for (int p = 0; p < NOP; p++) R.k.base[p] = g.base[p];
  for (int d = 0; d < g.rank; d++) {
    int kept = g.st[1][d] != 0;
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

/* Whether the kept axes reach distinct elements of dx (each then has one thread): by growing |stride|,
 * each stride beyond all that the smaller ones reach.  Slice, Expand and Tile always do. */
bool red_distinct(const Red &R) {
  int64_t st[MAXAX], dim[MAXAX];
  int n = R.k.rank;
  for (int d = 0; d < n; d++) st[d] = R.k.st[1][d] < 0 ? -R.k.st[1][d] : R.k.st[1][d], dim[d] = R.k.dim[d];
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

/* s plus dy over sum elements [r0, r1) from the kept offsets ko, in output order. */
__device__ float red_run(const float *dy, const Red &R, const int64_t ko[NOP], int64_t r0, int64_t r1, float s) {
  const Geo &g = R.r;
  int64_t o = ko[0], c[MAXAX], i = r0;
  for (int d = g.rank - 1; d >= 0; d--) c[d] = i % g.dim[d], i /= g.dim[d], o += c[d] * g.st[0][d];
  for (int64_t r = r0; r < r1; r++) {
    s = __fadd_rn(s, dy[o]);
    for (int d = g.rank - 1; d >= 0; d--) {
      o += g.st[0][d];
      if (++c[d] < g.dim[d]) break;
      o -= g.st[0][d] * g.dim[d];
      c[d] = 0;
    }
  }
  return s;
}
template <typename I>
__global__ void red_one(const float *dy, float *dx, const __grid_constant__ Red R) {
  PR_CU_FOR(j, R.nK) {
    int64_t ko[NOP];
    geo_at<I>(R.k, (I)j, ko);
    dx[ko[1]] = red_run(dy, R, ko, 0, R.nR, dx[ko[1]]);
  }
}
__global__ void red_part(const float *dy, float *part, const __grid_constant__ Red R) {
  PR_CU_FOR(e, R.nK * R.nchunks) {
    int64_t j = e % R.nK, c = e / R.nK, r0 = c * R.chunk, r1 = r0 + R.chunk < R.nR ? r0 + R.chunk : R.nR;
    int64_t ko[NOP];
    geo_at<uint32_t>(R.k, (uint32_t)j, ko); /* nK < RED_WIDE here */
    part[e] = red_run(dy, R, ko, r0, r1, 0.0f);
  }
}
__global__ void red_fin(const float *part, float *dx, const __grid_constant__ Red R) {
  PR_CU_FOR(j, R.nK) {
    int64_t ko[NOP];
    geo_at<uint32_t>(R.k, (uint32_t)j, ko);
    float s = dx[ko[1]];
    for (int64_t c = 0; c < R.nchunks; c++) s = __fadd_rn(s, part[c * R.nK + j]);
    dx[ko[1]] = s;
  }
}
/* Any other view: one thread, the output in order, as the CPU. */
__global__ void red_serial(const float *dy, float *dx, const __grid_constant__ Geo g, int64_t n) {
  if (blockIdx.x || threadIdx.x) return;
  for (int64_t i = 0; i < n; i++) {
    int64_t o[NOP];
    geo_at<int64_t>(g, i, o);
    dx[o[1]] = __fadd_rn(dx[o[1]], dy[i]);
  }
}

/* ---- Transpose: 32 x 32 tiles where the output's last axis reads the input with a stride ---- */
constexpr int TILE = 32, TILE_ROWS = 8;
/* The output's axis q reads the input contiguously (stride 1, output stride oq), its last axis L with
 * stride sl; the other axes (batch) with input strides bin, output strides bout. */
struct PermTile {
  int nb;
  int64_t bdim[MAXAX], bin[MAXAX], bout[MAXAX];
  int64_t Q, L, sl, oq, tq, tl, ntiles;
};
/* grad = 0: y (output side) from x (input side); grad = 1: dx (input side) = (acc ? dx : 0) + dy (output side). */
__global__ void perm_tiled(const float *src, float *dst, const __grid_constant__ PermTile t, int grad, int acc) {
  __shared__ float tile[TILE][TILE + 1];
  int tx = threadIdx.x, ty = threadIdx.y;
  for (int64_t b = blockIdx.x; b < t.ntiles; b += gridDim.x) {
    int64_t l0 = b % t.tl * TILE, rest = b / t.tl, q0 = rest % t.tq * TILE, r = rest / t.tq, ib = 0, ob = 0;
    for (int d = t.nb - 1; d >= 0; d--) {
      int64_t c = r % t.bdim[d];
      r /= t.bdim[d], ib += c * t.bin[d], ob += c * t.bout[d];
    }
    if (!grad) {
      for (int j = ty; j < TILE; j += TILE_ROWS) { /* along q: the input's rows */
        int64_t q = q0 + tx, l = l0 + j;
        if (q < t.Q && l < t.L) tile[j][tx] = src[ib + q + l * t.sl];
      }
      __syncthreads();
      for (int j = ty; j < TILE; j += TILE_ROWS) { /* along l: the output's rows */
        int64_t l = l0 + tx, q = q0 + j;
        if (q < t.Q && l < t.L) dst[ob + q * t.oq + l] = tile[tx][j];
      }
    } else {
      for (int j = ty; j < TILE; j += TILE_ROWS) {
        int64_t l = l0 + tx, q = q0 + j;
        if (q < t.Q && l < t.L) tile[j][tx] = src[ob + q * t.oq + l];
      }
      __syncthreads();
      for (int j = ty; j < TILE; j += TILE_ROWS) {
        int64_t q = q0 + tx, l = l0 + j;
        if (q < t.Q && l < t.L) {
          float *p = dst + ib + q + l * t.sl;
          *p = acc ? *p + tile[tx][j] : tile[tx][j];
        }
      }
    }
    __syncthreads(); /* the tile is read before the next one is written */
  }
}

/* The tiled plan of a permutation's walk g, where it has one (false: rows are read contiguously). */
bool perm_tile_plan(const Geo &g, PermTile *t) {
  int r = g.rank, last = r - 1, q = -1;
  if (r < 2 || g.st[0][last] == 1) return false;
  for (int d = 0; d < last; d++)
    if (g.st[0][d] == 1) q = d;
  if (q < 0) return false;
  int64_t ost[MAXAX];
  contiguous(r, g.dim, ost);
  memset(t, 0, sizeof *t);
  t->Q = g.dim[q], t->L = g.dim[last], t->sl = g.st[0][last], t->oq = ost[q];
  for (int d = 0; d < last; d++)
    if (d != q) t->bdim[t->nb] = g.dim[d], t->bin[t->nb] = g.st[0][d], t->bout[t->nb] = ost[d], t->nb++;
  t->tq = (t->Q + TILE - 1) / TILE, t->tl = (t->L + TILE - 1) / TILE, t->ntiles = t->tq * t->tl;
  for (int d = 0; d < t->nb; d++) t->ntiles *= t->bdim[d];
  return true;
}

void perm_run(const float *src, float *dst, const PermShape *s, int grad, int acc) {
  if (s->n <= 0) return;
  const int64_t *st[NOP] = {s->st, NULL};
  Geo g = geo_make(s->rank, s->out, st, NULL);
  PermTile t;
  if (perm_tile_plan(g, &t)) {
    perm_tiled<<<pr_cu_blocks(t.ntiles, 1), dim3(TILE, TILE_ROWS), 0, pr_cu_stream>>>(src, dst, t, grad, acc);
  } else if (!grad) {
    walk_read_launch(src, dst, g, s->n);
    return;
  } else if (fits32(s->n)) {
    LAUNCH(walk_write<uint32_t>, s->n)(src, dst, g, s->n, acc);
  } else {
    LAUNCH(walk_write<int64_t>, s->n)(src, dst, g, s->n, acc);
  }
  PR_CU_LAUNCHED();
}

/* ---- elementwise moves ---- */
__global__ void add_into(const float *x, float *y, int64_t n) {
  PR_CU_FOR(i, n) y[i] = y[i] + x[i];
}

__global__ void pad_kernel(const float *x, float *y, const __grid_constant__ PadShape s, int64_t ny) {
  PR_CU_FOR(i, ny) {
    int64_t r = i, off = 0, ist = 1;
    bool inside = true;
    for (int d = s.rank - 1; d >= 0; d--) {
      int64_t c = r % s.out[d] - s.begin[d];
      r /= s.out[d];
      inside = inside && c >= 0 && c < s.in[d];
      off += c * ist, ist *= s.in[d];
    }
    y[i] = inside ? x[off] : s.value;
  }
}
/* pad_offset of cpu/movement.h: the offset in y of x's element i. */
__global__ void pad_grad_kernel(const float *dy, float *dx, const __grid_constant__ PadShape s, int64_t nx, int acc) {
  PR_CU_FOR(i, nx) {
    int64_t r = i, off = 0, stride = 1;
    for (int d = s.rank - 1; d >= 0; d--) {
      off += (r % s.in[d] + s.begin[d]) * stride;
      r /= s.in[d], stride *= s.out[d];
    }
    dx[i] = acc ? dx[i] + dy[off] : dy[off];
  }
}

/* [outer, axis, inner]: the slice [start, start + len) of the axis against a [outer, len, inner] block.
 * mode 0: block = slice (take); 1: slice += block (take's gradient); 2: slice = block (put);
 * 3: block = slice, 4: block += slice (put's gradient). */
template <typename I>
__global__ void slice_kernel(const float *src, float *dst, I outer, I axis, I inner, I start, I len, int mode) {
  I n = len * inner;
  PR_CU_FOR(e, (int64_t)outer * n) {
    I o = (I)e / n, k = (I)e - o * n;
    int64_t at = ((int64_t)o * axis + start) * inner + k;
    switch (mode) {
    case 0: case 3: dst[e] = src[at]; break;
    case 1: dst[at] = dst[at] + src[e]; break;
    case 2: dst[at] = src[e]; break;
    default: dst[e] = dst[e] + src[at];
    }
  }
}
void slice_run(const float *src, float *dst, int64_t outer, int64_t axis, int64_t inner, int64_t start, int64_t len, int mode) {
  int64_t n = outer * len * inner;
  if (n <= 0) return;
  if (fits32(outer * axis * inner) && fits32(n))
    LAUNCH(slice_kernel<uint32_t>, n)(src, dst, (uint32_t)outer, (uint32_t)axis, (uint32_t)inner, (uint32_t)start, (uint32_t)len, mode);
  else
    LAUNCH(slice_kernel<int64_t>, n)(src, dst, outer, axis, inner, start, len, mode);
  PR_CU_LAUNCHED();
}

/* ---- casts ---- */
__global__ void cast_i64_f32(const int64_t *x, float *y, int64_t n) {
  PR_CU_FOR(i, n) y[i] = (float)x[i];
}
__global__ void cast_i32_f32(const int32_t *x, float *y, int64_t n) {
  PR_CU_FOR(i, n) y[i] = (float)x[i];
}
__global__ void cast_bool_f32(const uint8_t *x, float *y, int64_t n) {
  PR_CU_FOR(i, n) y[i] = x[i] ? 1.0f : 0.0f;
}
/* pr_half_to_float, built from the bits (no arithmetic on a NaN, whose bits a GPU may change): the CPU's
 * NaN is 0x7fc00000 with the half's sign. */
__global__ void cast_f16_f32(const uint16_t *x, float *y, int64_t n) {
  PR_CU_FOR(i, n) {
    uint32_t h = x[i], e = h >> 10 & 0x1f, m = h & 0x3ff, bits;
    if (e == 0) bits = __float_as_uint((float)m * 0x1p-24f); /* exact: m < 2^10 */
    else if (e == 31) bits = m ? 0x7fc00000u : 0x7f800000u;
    else bits = (e + 112) << 23 | m << 13;
    y[i] = __uint_as_float(bits | (h >> 15) << 31);
  }
}
__global__ void cast_f32_i64(const float *x, int64_t *y, int64_t n) {
  PR_CU_FOR(i, n) {
    float v = x[i];
    y[i] = v >= -0x1p63f && v < 0x1p63f ? (int64_t)v : INT64_MIN;
  }
}

/* ---- Gather on axis 0 ----
 * An index outside [-rows, rows) is recorded (PrCuFault, common.cuh: the run stops at the device layer's
 * next wait) and touches nothing: the forward writes 0 for it, the gradient sorts it past every row and
 * adds it nowhere. */
struct GatherWhere {
  PrCuFault *fault;
  const char *node;
  int64_t step, mb;
};
__device__ inline int64_t gather_row(const int64_t *idx, int64_t i, int64_t rows, const GatherWhere &w, int what, bool report) {
  int64_t v = idx[i];
  if (v >= -rows && v < rows) return v < 0 ? v + rows : v;
  if (report) pr_cu_record_fault(w.fault, w.node, what, i, v, rows, w.step, w.mb);
  return -1;
}
__global__ void gather_kernel(const float *table, const int64_t *idx, float *y, int64_t n, int64_t rows, int64_t width, GatherWhere w) {
  PR_CU_FOR(e, n * width) {
    int64_t i = e / width, k = e - i * width, r = gather_row(idx, i, rows, w, PR_CU_FAULT_GATHER, k == 0);
    y[e] = r < 0 ? 0.0f : table[r * width + k];
  }
}
/* The sort's keys (the rows; rows itself for a bad index, which sorts last) and values (the positions). */
__global__ void gather_keys(const int64_t *idx, uint32_t *key, int32_t *pos, int64_t n, int64_t rows, GatherWhere w) {
  PR_CU_FOR(i, n) {
    int64_t r = gather_row(idx, i, rows, w, PR_CU_FAULT_GATHER_GRAD, true);
    key[i] = (uint32_t)(r < 0 ? rows : r), pos[i] = (int32_t)i;
  }
}
/* Column k of each row's first sorted position: the row's dy rows added in position order, as the CPU. */
__global__ void gather_sum(const uint32_t *key, const int32_t *pos, const float *dy, float *dt, int64_t n, int64_t rows, int64_t width) {
  PR_CU_FOR(e, n * width) {
    int64_t p = e / width, k = e - p * width;
    uint32_t r = key[p];
    if ((int64_t)r >= rows || (p > 0 && key[p - 1] == r)) continue;
    float *out = dt + (int64_t)r * width + k, s = *out;
    for (int64_t q = p; q < n && key[q] == r; q++) s = __fadd_rn(s, dy[(int64_t)pos[q] * width + k]);
    *out = s;
  }
}

inline int64_t align256(int64_t b) { return (b + 255) & ~(int64_t)255; }

} // namespace

/* ---- the kernels ---- */

extern "C" void kc_copy(const float *x, float *y, int64_t n) {
  if (x != y && n > 0) PR_CU(cudaMemcpyAsync(y, x, sizeof(float) * (size_t)n, cudaMemcpyDeviceToDevice, pr_cu_stream));
}

extern "C" void kc_copy_grad(const float *dy, float *dx, int64_t n, int acc) {
  if (n <= 0) return;
  if (acc) {
    LAUNCH(add_into, n)(dy, dx, n);
    PR_CU_LAUNCHED();
  } else if (dy != dx) {
    PR_CU(cudaMemcpyAsync(dx, dy, sizeof(float) * (size_t)n, cudaMemcpyDeviceToDevice, pr_cu_stream));
  }
}

extern "C" void kc_zero(float *x, int64_t n) {
  if (n > 0) PR_CU(cudaMemsetAsync(x, 0, sizeof(float) * (size_t)n, pr_cu_stream));
}

extern "C" void kc_pad(const float *x, float *y, const PadShape *s) {
  int64_t ny = 1;
  for (int d = 0; d < s->rank; d++) ny *= s->out[d];
  if (ny <= 0) return;
  LAUNCH(pad_kernel, ny)(x, y, *s, ny);
  PR_CU_LAUNCHED();
}

extern "C" void kc_pad_grad(const float *dy, float *dx, const PadShape *s, int acc) {
  int64_t nx = 1;
  for (int d = 0; d < s->rank; d++) nx *= s->in[d];
  if (nx <= 0) return;
  LAUNCH(pad_grad_kernel, nx)(dy, dx, *s, nx, acc);
  PR_CU_LAUNCHED();
}

extern "C" void kc_transpose(const float *x, float *y, const PermShape *s) { perm_run(x, y, s, 0, 0); }
extern "C" void kc_transpose_grad(const float *dy, float *dx, const PermShape *s, int acc) { perm_run(dy, dx, s, 1, acc); }

extern "C" void kc_take(const float *x, float *y, int64_t outer, int64_t axis, int64_t inner, int64_t start, int64_t len) {
  slice_run(x, y, outer, axis, inner, start, len, 0);
}
extern "C" void kc_take_grad(const float *dy, float *dx, int64_t outer, int64_t axis, int64_t inner, int64_t start, int64_t len) {
  slice_run(dy, dx, outer, axis, inner, start, len, 1);
}
extern "C" void kc_put(const float *x, float *y, int64_t outer, int64_t axis, int64_t inner, int64_t start, int64_t len) {
  slice_run(x, y, outer, axis, inner, start, len, 2);
}
extern "C" void kc_put_grad(const float *dy, float *dx, int64_t outer, int64_t axis, int64_t inner, int64_t start, int64_t len,
                            int acc) {
  slice_run(dy, dx, outer, axis, inner, start, len, acc ? 4 : 3);
}

extern "C" void kc_view(const float *x, float *y, const ViewShape *s) {
  if (s->n <= 0) return;
  const int64_t *st[NOP] = {s->st, NULL};
  int64_t base[NOP] = {s->base, 0};
  walk_read_launch(x, y, geo_make(s->rank, s->out, st, base), s->n);
}

/* dx = (acc ? dx : 0) + dy summed where each output element read it. */
extern "C" void kc_view_grad(const float *dy, float *dx, const ViewShape *s, int acc) {
  if (!acc && s->nx > 0) PR_CU(cudaMemsetAsync(dx, 0, sizeof(float) * (size_t)s->nx, pr_cu_stream));
  if (s->n <= 0) return;
  int64_t cy[MAXAX], base[NOP] = {0, s->base};
  contiguous(s->rank, s->out, cy);
  const int64_t *st[NOP] = {cy, s->st};
  Geo g = geo_make(s->rank, s->out, st, base);
  Red R = red_make(g);
  if (!red_distinct(R)) {
    red_serial<<<1, 1, 0, pr_cu_stream>>>(dy, dx, g, s->n);
  } else if (R.nchunks <= 1 && fits32(R.nK)) {
    LAUNCH(red_one<uint32_t>, R.nK)(dy, dx, R);
  } else if (R.nchunks <= 1) {
    LAUNCH(red_one<int64_t>, R.nK)(dy, dx, R);
  } else {
    float *part = (float *)pr_cu_scratch((int64_t)sizeof(float) * R.nK * R.nchunks);
    LAUNCH(red_part, R.nK * R.nchunks)(dy, part, R);
    PR_CU_LAUNCHED();
    LAUNCH(red_fin, R.nK)(part, dx, R);
  }
  PR_CU_LAUNCHED();
}

extern "C" void kc_cast_i64_f32(const int64_t *x, float *y, int64_t n) {
  if (n <= 0) return;
  LAUNCH(cast_i64_f32, n)(x, y, n);
  PR_CU_LAUNCHED();
}
extern "C" void kc_cast_f32_i64(const float *x, int64_t *y, int64_t n) {
  if (n <= 0) return;
  LAUNCH(cast_f32_i64, n)(x, y, n);
  PR_CU_LAUNCHED();
}
extern "C" void kc_cast_i32_f32(const void *x, float *y, int64_t n) {
  if (n <= 0) return;
  LAUNCH(cast_i32_f32, n)((const int32_t *)x, y, n);
  PR_CU_LAUNCHED();
}
extern "C" void kc_cast_bool_f32(const void *x, float *y, int64_t n) {
  if (n <= 0) return;
  LAUNCH(cast_bool_f32, n)((const uint8_t *)x, y, n);
  PR_CU_LAUNCHED();
}
extern "C" void kc_cast_f16_f32(const void *x, float *y, int64_t n) {
  if (n <= 0) return;
  LAUNCH(cast_f16_f32, n)((const uint16_t *)x, y, n);
  PR_CU_LAUNCHED();
}

/* Where a bad index is reported from: the node, and the step and micro-batch the launch belongs to. */
static GatherWhere gather_where(const char *node) { return GatherWhere{pr_cu_fault_dev(), node, pr_rand.step, pr_rand.mb}; }

extern "C" void kc_gather(const float *table, const int64_t *idx, float *y, int64_t n, int64_t rows, int64_t width, const char *node) {
  if (n <= 0 || width <= 0) return;
  LAUNCH(gather_kernel, n * width)(table, idx, y, n, rows, width, gather_where(node));
  PR_CU_LAUNCHED();
}

/* dtable += dy's rows at their indices, each row's in position order (the caller zeroes dtable first). */
extern "C" void kc_gather_grad(const int64_t *idx, const float *dy, float *dtable, int64_t n, int64_t rows, int64_t width,
                               const char *node) {
  if (n <= 0 || width <= 0) return;
  int bits = 1; /* the keys' bits: 0 .. rows, rows itself the bad indices' */
  while (bits < 32 && ((int64_t)1 << bits) <= rows) bits++;
  size_t temp = 0;
  PR_CU(cub::DeviceRadixSort::SortPairs(NULL, temp, (const uint32_t *)NULL, (uint32_t *)NULL, (const int32_t *)NULL, (int32_t *)NULL,
                                        (int)n, 0, bits, pr_cu_stream));
  int64_t kb = align256((int64_t)sizeof(uint32_t) * n), pb = align256((int64_t)sizeof(int32_t) * n);
  char *w = (char *)pr_cu_scratch(2 * kb + 2 * pb + (int64_t)temp);
  uint32_t *key = (uint32_t *)w, *skey = (uint32_t *)(w + kb);
  int32_t *pos = (int32_t *)(w + 2 * kb), *spos = (int32_t *)(w + 2 * kb + pb);
  void *tmp = w + 2 * kb + 2 * pb;
  LAUNCH(gather_keys, n)(idx, key, pos, n, rows, gather_where(node));
  PR_CU_LAUNCHED();
  PR_CU(cub::DeviceRadixSort::SortPairs(tmp, temp, key, skey, pos, spos, (int)n, 0, bits, pr_cu_stream));
  LAUNCH(gather_sum, n * width)(skey, spos, dy, dtable, n, rows, width);
  PR_CU_LAUNCHED();
}
