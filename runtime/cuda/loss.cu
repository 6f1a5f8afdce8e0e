/* cuda/loss.cu - the losses the stage programs end in, on the GPU: softmax cross-entropy and MSE against
 * one-hot labels (cpu/loss.h's k_* kernels, the same arguments; the labels are device memory).
 *
 * A warp per row up to 1024 classes (8 rows to a block), else a block of 256 threads (1024 for long
 * rows when the rows are few): the row's maximum and sum of exponentials over a fixed tree (each thread
 * summing the classes lane, lane + T, ... in order, then warp shuffles, then the warps' totals through
 * shared memory), dlogits written element-wise with the CPU's float expressions, and the row's loss
 * (in double) to scratch.  One block then adds the rows' losses in a fixed tree, in double, and the total
 * comes back to the host: the one wait on the stream, since the caller takes the loss as a return value.
 * Every sum's order depends on the shape alone, so the loss and dlogits are the same bits on every run.
 *
 * Labels outside [0, classes): the CPU's cross-entropy reads z[label] out of bounds; here the row's loss
 * is NaN (which the runtime's NaN check reports) and its dlogits the softmax alone, times scale.  MSE
 * compares k == label, so such a row's target is all zeros, as on the CPU. */
#include "common.cuh"
#include "kernels.h"

#include <math.h>

#define L_MUL(a, b) __fmul_rn((a), (b))
#define L_SUB(a, b) __fsub_rn((a), (b))

namespace {

/* ---- a fixed-shape tree over the threads that share one row ---- */
__device__ __forceinline__ float shfl_down(float v, int off) { return __shfl_down_sync(0xffffffffu, v, off); }
__device__ __forceinline__ double shfl_down(double v, int off) { return __shfl_down_sync(0xffffffffu, v, off); }
__device__ __forceinline__ float shfl0(float v) { return __shfl_sync(0xffffffffu, v, 0); }
__device__ __forceinline__ double shfl0(double v) { return __shfl_sync(0xffffffffu, v, 0); }

template <typename T> struct Sum {
  __device__ T id() const { return T(0); }
  __device__ T operator()(T a, T b) const { return a + b; }
};
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

static int row_tpr(int64_t rows, int64_t cols) { return cols <= 1024 ? 32 : cols > 8192 && rows < 512 ? 1024 : 256; }
static unsigned row_blocks(int64_t rows, int tpr) { return (unsigned)(tpr == 32 ? (rows + 7) / 8 : rows); }
template <int TPR> __device__ __forceinline__ bool row_of(int64_t rows, int64_t *row, int *lane) {
  *row = TPR == 32 ? (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32 : (int64_t)blockIdx.x;
  *lane = TPR == 32 ? (int)(threadIdx.x & 31) : (int)threadIdx.x;
  return *row < rows;
}
#define ROWS_LAUNCH(kernel, rows, cols, ...)                                                                      \
  do {                                                                                                           \
    const int tpr_ = row_tpr((rows), (cols));                                                                    \
    const unsigned blocks_ = row_blocks((rows), tpr_);                                                           \
    if (tpr_ == 32) kernel<32><<<blocks_, 256, 0, pr_cu_stream>>>(__VA_ARGS__);                                 \
    else if (tpr_ == 256) kernel<256><<<blocks_, 256, 0, pr_cu_stream>>>(__VA_ARGS__);                          \
    else kernel<1024><<<blocks_, 1024, 0, pr_cu_stream>>>(__VA_ARGS__);                                          \
    PR_CU_LAUNCHED();                                                                                            \
  } while (0)

/* k_softmax_xent's row: lse = max + log(sum exp(z - max)), loss lse - z[label], dlogits (exp(z - lse) -
 * onehot) * scale. */
template <int TPR>
__global__ void xent_k(const float *logits, const int64_t *labels, float *dlogits, double *rowloss, int64_t rows, int classes, float scale) {
  __shared__ float sh[33];
  int64_t row;
  int lane;
  if (!row_of<TPR>(rows, &row, &lane)) return;
  const float *z = logits + row * classes;
  float *d = dlogits + row * classes;
  float mx = -INFINITY; /* a NaN in the row makes its sum NaN, whatever the maximum */
  for (int k = lane; k < classes; k += TPR) mx = z[k] > mx ? z[k] : mx;
  mx = group_reduce<TPR>(mx, Max{}, sh);
  float sum = 0;
  for (int k = lane; k < classes; k += TPR) sum += expf(z[k] - mx);
  sum = group_reduce<TPR>(sum, Sum<float>{}, sh);
  const float lse = mx + logf(sum);
  const int64_t label = labels[row];
  const int ok = label >= 0 && label < classes;
  if (lane == 0) rowloss[row] = ok ? (double)(lse - z[label]) : (double)NAN;
  for (int k = lane; k < classes; k += TPR) {
    float p = expf(z[k] - lse);
    d[k] = L_MUL(L_SUB(p, k == label ? 1.0f : 0.0f), scale);
  }
}
/* k_mse_onehot's row: the sum of (z - onehot)^2 in double, dlogits 2 (z - onehot) scale. */
template <int TPR>
__global__ void mse_k(const float *logits, const int64_t *labels, float *dlogits, double *rowloss, int64_t rows, int classes, float scale) {
  __shared__ double sh[33];
  int64_t row;
  int lane;
  if (!row_of<TPR>(rows, &row, &lane)) return;
  const float *z = logits + row * classes;
  float *dl = dlogits + row * classes;
  const int64_t label = labels[row];
  double s = 0;
  for (int k = lane; k < classes; k += TPR) {
    float d = z[k] - (k == label ? 1.0f : 0.0f);
    s += (double)d * d;
    dl[k] = L_MUL(L_MUL(2.0f, d), scale);
  }
  s = group_reduce<TPR>(s, Sum<double>{}, sh);
  if (lane == 0) rowloss[row] = s;
}
/* The rows' losses added by one block of 1024 in a fixed tree: total[0]. */
__global__ void total_k(const double *rowloss, int64_t rows, double *total) {
  __shared__ double sh[33];
  double s = 0;
  for (int64_t r = threadIdx.x; r < rows; r += 1024) s += rowloss[r];
  s = group_reduce<1024>(s, Sum<double>{}, sh);
  if (threadIdx.x == 0) total[0] = s;
}

/* The loss's pinned host word, and the rows' losses in scratch: the total to the host, after a wait. */
static double *host_total;
static double loss_total(const double *rowloss, int64_t rows, double *total) {
  total_k<<<1, 1024, 0, pr_cu_stream>>>(rowloss, rows, total);
  PR_CU_LAUNCHED();
  if (!host_total) PR_CU(cudaMallocHost((void **)&host_total, sizeof(double)));
  PR_CU(cudaMemcpyAsync(host_total, total, sizeof(double), cudaMemcpyDeviceToHost, pr_cu_stream));
  PR_CU(cudaStreamSynchronize(pr_cu_stream));
  return *host_total;
}

} // namespace

extern "C" double kc_softmax_xent(const float *logits, const int64_t *labels, float *dlogits, int64_t rows, int classes, float scale) {
  if (rows <= 0) return 0;
  double *rowloss = (double *)pr_cu_scratch((rows + 1) * (int64_t)sizeof(double));
  ROWS_LAUNCH(xent_k, rows, classes, logits, labels, dlogits, rowloss, rows, classes, scale);
  return loss_total(rowloss, rows, rowloss + rows);
}

extern "C" double kc_mse_loss(const float *logits, const int64_t *labels, float *dlogits, int64_t rows, int classes, float scale) {
  if (rows <= 0) return 0;
  double *rowloss = (double *)pr_cu_scratch((rows + 1) * (int64_t)sizeof(double));
  ROWS_LAUNCH(mse_k, rows, classes, logits, labels, dlogits, rowloss, rows, classes, scale);
  return loss_total(rowloss, rows, rowloss + rows) / classes;
}
