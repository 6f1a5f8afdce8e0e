/* cuda/rows.cuh - the fixed-shape row reduction that reduce.cu, norm.cu and loss.cu share: TPR threads
 * per row, each combining the elements lane, lane + TPR, ... of its row in order, then a fixed tree (warp
 * shuffles, then the warps' totals through shared memory), so every sum's order depends on the shape
 * alone.  TPR is 32 (a warp per row, 8 rows to a block of 256) for rows up to 1024 elements, else the
 * whole block: 256 threads, or 1024 for long rows when the rows are few.
 * Included by one .cu each: everything is in its unnamed namespace. */
#ifndef PIPERUN_CUDA_ROWS_CUH
#define PIPERUN_CUDA_ROWS_CUH
#include <math.h>

#include "common.cuh"

namespace {

/* A warp's shuffles (a .cu adds overloads for its own types, found by argument-dependent lookup). */
__device__ __forceinline__ float shfl_down(float v, int off) { return __shfl_down_sync(0xffffffffu, v, off); }
__device__ __forceinline__ double shfl_down(double v, int off) { return __shfl_down_sync(0xffffffffu, v, off); }
__device__ __forceinline__ float shfl0(float v) { return __shfl_sync(0xffffffffu, v, 0); }
__device__ __forceinline__ double shfl0(double v) { return __shfl_sync(0xffffffffu, v, 0); }

/* The trees' operations: id() the identity, operator() one step. */
template <typename T> struct Sum {
  __device__ T id() const { return T(0); }
  __device__ T operator()(T a, T b) const { return a + b; }
};
/* b where it is larger than a (a row's maximum; reduce.cu's MaxNan is ReduceMax's, where a NaN wins). */
struct Max {
  __device__ float id() const { return -INFINITY; }
  __device__ float operator()(float a, float b) const { return b > a ? b : a; }
};

template <typename T, typename Op> __device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = op(v, shfl_down(v, off));
  return v; /* lane 0's is the warp's */
}
/* The group's total, the same bits in every thread of the group.  sh: 33 Ts of shared memory.
 * TPR: 32 (a warp, its own row) or the whole block (256, 1024). */
template <int TPR, typename T, typename Op> __device__ __forceinline__ T group_reduce(T v, Op op, T *sh) {
  v = warp_reduce(v, op);
  if (TPR == 32) return shfl0(v);
  constexpr int NW = TPR / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads(); /* the previous call's readers of sh are done */
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < NW ? sh[lane] : op.id();
    v = warp_reduce(v, op);
    if (lane == 0) sh[NW] = v;
  }
  __syncthreads();
  return sh[NW];
}
template <int TPR, typename T> __device__ __forceinline__ T group_sum(T v, T *sh) { return group_reduce<TPR>(v, Sum<T>{}, sh); }
/* The maximum of a row a[0, n) (lane: this thread's in the group; N: the index type), the same in every
 * thread of the group.  A NaN in the row makes its sum NaN, whatever the maximum. */
template <int TPR, typename N> __device__ __forceinline__ float row_max(const float *a, N n, int lane, float *sh) {
  float mx = -INFINITY;
  for (N k = lane; k < n; k += TPR) mx = a[k] > mx ? a[k] : mx;
  return group_reduce<TPR>(mx, Max{}, sh);
}

/* Rows: the threads per row for `rows` rows of `cols` elements, the blocks and the block size. */
inline int row_tpr(int64_t rows, int64_t cols) { return cols <= 1024 ? 32 : cols > 8192 && rows < 512 ? 1024 : 256; }
inline unsigned row_blocks(int64_t rows, int tpr) { return (unsigned)(tpr == 32 ? (rows + 7) / 8 : rows); }
inline int row_threads(int tpr) { return tpr == 32 ? 256 : tpr; }
/* The row of this thread's group and its lane in it; false past the last row (a whole warp, and only
 * where TPR is 32). */
template <int TPR> __device__ __forceinline__ bool row_of(int64_t rows, int64_t *row, int *lane) {
  *row = TPR == 32 ? (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32 : (int64_t)blockIdx.x;
  *lane = TPR == 32 ? (int)(threadIdx.x & 31) : (int)threadIdx.x;
  return *row < rows;
}
/* Launches kernel<TPR> over `rows` rows of `cols`. */
#define ROWS_LAUNCH(kernel, rows, cols, ...)                                                                      \
  do {                                                                                                           \
    const int tpr_ = row_tpr((rows), (cols));                                                                    \
    const unsigned blocks_ = row_blocks((rows), tpr_);                                                           \
    if (tpr_ == 32) kernel<32><<<blocks_, 256, 0, pr_cu_stream>>>(__VA_ARGS__);                                 \
    else if (tpr_ == 256) kernel<256><<<blocks_, 256, 0, pr_cu_stream>>>(__VA_ARGS__);                          \
    else kernel<1024><<<blocks_, 1024, 0, pr_cu_stream>>>(__VA_ARGS__);                                          \
    PR_CU_LAUNCHED();                                                                                            \
  } while (0)

} // namespace
#endif
