/* cuda/norm.h - normalizations over rows or channels on the GPU: BatchNormalization, Softmax,
 * LayerNormalization.  The same arguments as cpu/norm.h's k_* kernels, every buffer in device memory,
 * the BnShape a host struct. */
#ifndef PIPERUN_CUDA_NORM_H
#define PIPERUN_CUDA_NORM_H
#include "../shapes.h"

/* rmean, rvar: NULL in a recomputation (training, the running statistics left as they are). */
void kc_batchnorm(const float *x, const float *gamma, const float *beta, float *rmean, float *rvar, float *y, const BnShape *s);
/* y (the fused Relu's output), dx, dgamma, dbeta may be NULL; dgamma and dbeta add, dx per acc_x. */
void kc_batchnorm_grad(const float *x, const float *gamma, const float *rmean, const float *rvar, const float *dy, const float *y,
                       float *dx, float *dgamma, float *dbeta, const BnShape *s, int acc_x);
void kc_softmax(const float *x, float *y, int64_t rows, int64_t cols, int log);
void kc_softmax_grad(const float *y, const float *dy, float *dx, int64_t rows, int64_t cols, int log, int acc);
/* bias may be NULL. */
void kc_layernorm(const float *x, const float *scale, const float *bias, float *y, int64_t rows, int64_t cols, float eps);
/* mean_out, inv_out may be NULL. */
void kc_layernorm_stats(const float *x, float *mean_out, float *inv_out, int64_t rows, int64_t cols, float eps);
/* dx, dscale, dbias may be NULL; dscale and dbias add, dx per acc. */
void kc_layernorm_grad(const float *x, const float *scale, const float *dy, float *dx, float *dscale, float *dbias, int64_t rows,
                       int64_t cols, float eps, int acc);
#endif
