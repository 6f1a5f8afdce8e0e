/* cuda/optim.h - the optimizers' updates on the GPU: SGD (momentum, weight decay), Adam and AdamW, the
 * same arithmetic as cpu/optim.h's, element by element.  o: a host pointer (the runtime's pr_opt). */
#ifndef PIPERUN_CUDA_OPTIM_H
#define PIPERUN_CUDA_OPTIM_H
#include "../shapes.h"

/* buf: the momentum buffer, NULL-able when o->momentum is 0. */
void kc_sgd_step(float *p, const float *g, float *buf, int64_t n, const OptCtx *o);
/* decoupled: 0 Adam (L2 weight decay added to the gradient), 1 AdamW. */
void kc_adam_step(float *p, const float *g, float *m, float *v, int64_t n, int decoupled, const OptCtx *o);
#endif
