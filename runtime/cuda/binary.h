/* cuda/binary.h - broadcasting ops of two or three inputs on the GPU: Add .. Min and their gradients
 * (kc_binary, kc_binary_grad), Where, the comparisons and Not; the CPU's are cpu/binary.h and broadcast.c.
 * Part of the GPU kernels (cuda/kernels.h; binary.cu). */
#ifndef PIPERUN_CUDA_BINARY_H
#define PIPERUN_CUDA_BINARY_H
#include "../shapes.h"

void kc_binary(int op, const float *a, const float *b, float *y, const BcastShape *s);
void kc_binary_grad(int op, int which, const float *a, const float *b, const float *dy, float *d, const BcastShape *s, int acc);
void kc_where(const uint8_t *c, const float *x, const float *y, float *out, const WhereShape *s);
void kc_where_grad(const uint8_t *c, const float *dout, float *d, int which, const WhereShape *s, int acc);
void kc_compare(int op, const float *a, const float *b, uint8_t *y, const BcastShape *s);
void kc_not(const uint8_t *x, uint8_t *y, int64_t n);
#endif
