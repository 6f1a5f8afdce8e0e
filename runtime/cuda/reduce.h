/* cuda/reduce.h - reductions on the GPU: ReduceMean / ReduceSum, ReduceMax, ArgMax and the gradients.
 * The same arguments as cpu/reduce.h's k_* kernels, every buffer in device memory, the ReduceShape a
 * host struct. */
#ifndef PIPERUN_CUDA_REDUCE_H
#define PIPERUN_CUDA_REDUCE_H
#include "../shapes.h"

void kc_reduce(const float *x, float *y, const ReduceShape *s);
void kc_reduce_grad(const float *dy, float *dx, const ReduceShape *s, int acc);
void kc_reduce_max(const float *x, float *y, const ReduceShape *s);
/* cnt: nout floats of device scratch; left holding each output's count of elements equal to its max. */
void kc_reduce_max_grad(const float *x, const float *y, const float *dy, float *dx, float *cnt, const ReduceShape *s, int acc);
void kc_argmax(const float *x, int64_t *y, int64_t outer, int64_t axis, int64_t inner, int last);
#endif
