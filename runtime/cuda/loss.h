/* cuda/loss.h - the losses the stage programs end in, on the GPU: softmax cross-entropy and MSE against
 * one-hot labels.  The same arguments as cpu/loss.h's k_* kernels (labels, logits and dlogits in device
 * memory); the returned loss sum comes back to the host, so these two wait for the stream. */
#ifndef PIPERUN_CUDA_LOSS_H
#define PIPERUN_CUDA_LOSS_H

double kc_softmax_xent(const float *logits, const int64_t *labels, float *dlogits, int64_t rows, int classes, float scale);
double kc_mse_loss(const float *logits, const int64_t *labels, float *dlogits, int64_t rows, int classes, float scale);
#endif
