/* cuda/dropout.h - Dropout on the GPU: the same Philox4x32-10 masks as cpu/dropout.h, bit for bit (the
 * same counter layout, keyed by the host's RandCtx, passed by value), the gradient redrawing them. */
#ifndef PIPERUN_CUDA_DROPOUT_H
#define PIPERUN_CUDA_DROPOUT_H
#include "../shapes.h"

/* y = x * mask / (1 - ratio); mask (bytes, kept = 1) may be NULL; rc: a host pointer. */
void kc_dropout(const float *x, float *y, uint8_t *mask, int64_t n, float ratio, int64_t node, const RandCtx *rc);
void kc_dropout_grad(const float *dy, float *dx, int64_t n, float ratio, int64_t node, const RandCtx *rc, int acc);
#endif
