/* cpu/loss.h - the losses the stage programs end in.
 * Part of the CPU kernels; runtime/kernels.h includes every family (the conventions are there). */
#ifndef PIPERUN_CPU_LOSS_H
#define PIPERUN_CPU_LOSS_H
#include "common.h"
/* ---- the loss ---- */
/* Softmax cross-entropy over `rows` rows of `classes` logits with integer
 * labels.  Returns the SUM of the rows' losses (the caller divides); writes
 * dlogits = (softmax - onehot) * scale. */
static inline double k_softmax_xent(const float *logits, const int64_t *labels, float *dlogits, int64_t rows, int classes,
                                    float scale) {
  double total = 0;
  for (int64_t r = 0; r < rows; r++) {
    const float *z = logits + r * classes;
    float mx = z[0];
    for (int k = 1; k < classes; k++) mx = z[k] > mx ? z[k] : mx;
    float sum = 0;
    for (int k = 0; k < classes; k++) sum += expf(z[k] - mx);
    float lse = mx + logf(sum);
    total += (double)(lse - z[labels[r]]);
    for (int k = 0; k < classes; k++) {
      float p = expf(z[k] - lse);
      dlogits[r * classes + k] = (p - (k == labels[r] ? 1.0f : 0.0f)) * scale;
    }
  }
  return total;
}

/* Mean squared error against the one-hot encoding of integer labels (PyTorch's
 * F.mse_loss(logits, one_hot(labels)), mean over every element).  Returns the
 * sum over this micro-batch's elements; dlogits = 2 (z - t) * scale. */
static inline double k_mse_onehot(const float *logits, const int64_t *labels, float *dlogits, int64_t rows, int classes, float scale) {
  double total = 0;
  for (int64_t r = 0; r < rows; r++)
    for (int k = 0; k < classes; k++) {
      float d = logits[r * classes + k] - (k == labels[r] ? 1.0f : 0.0f);
      total += (double)d * d;
      dlogits[r * classes + k] = 2.0f * d * scale;
    }
  return total;
}
/* The stage program's MSE loss: k_mse_onehot's sum over the classes' mean (the runtime divides by the rows). */
static inline double k_mse_loss(const float *logits, const int64_t *labels, float *dlogits, int64_t rows, int classes, float scale) {
  return k_mse_onehot(logits, labels, dlogits, rows, classes, scale) / classes;
}
#endif
