/* cuda/pool.h - MaxPool and AveragePool (1-D, 2-D, 3-D) on the GPU: kc_* for runtime/cpu/pool.h's k_*,
 * the same arguments (buffers in device memory, the PoolShape a host struct). */
#ifndef PIPERUN_CUDA_POOL_H
#define PIPERUN_CUDA_POOL_H
#include "../shapes.h"

void kc_maxpool(const float *x, float *y, const PoolShape *s);
void kc_maxpool_grad(const float *x, const float *dy, float *dx, const PoolShape *s, int acc);
void kc_avgpool(const float *x, float *y, const PoolShape *s);
void kc_avgpool_grad(const float *dy, float *dx, const PoolShape *s, int acc);
#endif
