/* cuda/movement.cu - data movement on the GPU: copies, Pad, Transpose, slices along an axis (Split,
 * Concat), strided views (Slice, Expand, Tile), Cast and Gather, each with its gradient, as cpu/movement.h
 * computes them.  Every value is moved, not computed, so every result but a sum is the CPU's bits; the
 * sums (Expand's and Tile's gradients, Gather's for a repeated index) run in an order fixed by the shape
 * and, for Gather's, in the CPU's order, index position by index position.
 *
 * A strided walk (a view, a permutation) is a Geo (geo.cuh, shared with binary.cu): the output's axes,
 * size-1 axes dropped and an axis merged into the one before where the input is contiguous across them,
 * read one thread per output element; a view's gradient sums with geo.cuh's red_launch.  A permutation
 * whose last output axis reads the input with a stride goes through 32 x 32 tiles in shared memory, so
 * both sides are read and written a row at a time.  Gather's gradient sorts the index positions by row
 * (a stable radix sort: positions of one row stay in order) and sums each row's positions in one thread
 * per column. */
#include <string.h>

#include <cub/cub.cuh>

#include "common.cuh"
#include "geo.cuh"
#include "kernels.h"

namespace {

constexpr int MAXAX = 16; /* ViewShape's axes */
constexpr int NOP = 2;    /* operands one walk carries */
using Geo = GeoN<MAXAX, NOP>;

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

/* ---- sums over the axes a view reads with stride 0 (Expand, Tile): geo.cuh's red_launch ----
 * Operand 0: dy (the output's order); 1: dx.  One thread per element of dx that the view reads (the
 * axes of nonzero stride) sums the output elements that read it in output order; a long sum for a small
 * dx is cut into chunks of a length fixed by the shape, summed into scratch, then added in order. */
struct ViewGradTerm {
  const float *dy;
  __device__ bool operator()(const int64_t *o, float &v) const {
    v = dy[o[0]];
    return true;
  }
};

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
  Geo g = geo_make<Geo>(s->rank, s->out, st, NULL);
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

extern "C" void kc_copy_i64(const int64_t *x, int64_t *y, int64_t n) {
  if (x != y && n > 0) PR_CU(cudaMemcpyAsync(y, x, sizeof(int64_t) * (size_t)n, cudaMemcpyDeviceToDevice, pr_cu_stream));
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
  walk_read_launch(x, y, geo_make<Geo>(s->rank, s->out, st, base), s->n);
}

/* dx = (acc ? dx : 0) + dy summed where each output element read it. */
extern "C" void kc_view_grad(const float *dy, float *dx, const ViewShape *s, int acc) {
  if (!acc && s->nx > 0) PR_CU(cudaMemsetAsync(dx, 0, sizeof(float) * (size_t)s->nx, pr_cu_stream));
  if (s->n <= 0) return;
  int64_t cy[MAXAX], base[NOP] = {0, s->base};
  contiguous(s->rank, s->out, cy);
  const int64_t *st[NOP] = {cy, s->st};
  Geo g = geo_make<Geo>(s->rank, s->out, st, base);
  red_launch(ViewGradTerm{dy}, dx, g, 1, s->nx, s->n, 1); /* acc: dx is zeroed above where !acc */
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
