/* cuda/loss.cu - the losses the stage programs end in, on the GPU: softmax cross-entropy and MSE against
 * one-hot labels (cpu/loss.h's k_* kernels, the same arguments; the labels are device memory).
 *
 * A warp per row up to 1024 classes (8 rows to a block), else a block of 256 threads (1024 for long
 * rows when the rows are few): the row's maximum and sum of exponentials over a fixed tree (each thread
 * summing the classes lane, lane + T, ... in order, then warp shuffles, then the warps' totals through
 * shared memory; rows.cuh), dlogits written element-wise with the CPU's float expressions, and the row's loss
 * (in double) to scratch.  One block then adds the rows' losses in a fixed tree, in double, and the total
 * comes back to the host: the one wait on the stream, since the caller takes the loss as a return value.
 * Every sum's order depends on the shape alone, so the loss and dlogits are the same bits on every run.
 *
 * Labels outside [0, classes): the CPU's cross-entropy reads z[label] out of bounds; here the row's loss
 * is NaN (which the runtime's NaN check reports) and its dlogits the softmax alone, times scale.  MSE
 * compares k == label, so such a row's target is all zeros, as on the CPU. */
#include "common.cuh"
#include "kernels.h"
#include "rows.cuh"

#include <math.h>

#define L_MUL(a, b) __fmul_rn((a), (b))
#define L_SUB(a, b) __fsub_rn((a), (b))

namespace {

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
  const float mx = row_max<TPR>(z, classes, lane, sh);
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
