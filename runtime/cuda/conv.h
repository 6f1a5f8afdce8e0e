/* cuda/conv.h - convolution (1-D, 2-D, 3-D, groups, strides, pads, dilations) on the GPU: im2col + cuBLAS
 * GEMM (conv.cu), kc_<name> for each k_<name> of cpu/conv.h with the same arguments and semantics.  The
 * `col` workspace the compiler sizes for the CPU is not used: the columns of many images at once live in
 * pr_cu_scratch. */
#ifndef PIPERUN_CUDA_CONV_H
#define PIPERUN_CUDA_CONV_H
#include "../shapes.h"
void kc_conv(const float *x, const float *w, const float *b, float *y, float *col, const ConvShape *s);
void kc_conv_grad(const float *x, const float *w, const float *dy, float *dx, float *dw, float *db, float *col,
                  const ConvShape *s, int acc_x, int acc_w);
#endif
