/* cuda/movement.h - data movement on the GPU: copies, Pad, Transpose, slices along an axis (Split, Concat),
 * strided views (Slice, Expand, Tile), Cast and Gather, each with its gradient; the CPU's are
 * cpu/movement.h.  Part of the GPU kernels (cuda/kernels.h; movement.cu). */
#ifndef PIPERUN_CUDA_MOVEMENT_H
#define PIPERUN_CUDA_MOVEMENT_H
#include "../shapes.h"

void kc_copy(const float *x, float *y, int64_t n);
void kc_copy_i64(const int64_t *x, int64_t *y, int64_t n);
void kc_copy_grad(const float *dy, float *dx, int64_t n, int acc);
void kc_zero(float *x, int64_t n);
void kc_pad(const float *x, float *y, const PadShape *s);
void kc_pad_grad(const float *dy, float *dx, const PadShape *s, int acc);
void kc_transpose(const float *x, float *y, const PermShape *s);
void kc_transpose_grad(const float *dy, float *dx, const PermShape *s, int acc);
void kc_take(const float *x, float *y, int64_t outer, int64_t axis, int64_t inner, int64_t start, int64_t len);
void kc_take_grad(const float *dy, float *dx, int64_t outer, int64_t axis, int64_t inner, int64_t start, int64_t len);
void kc_put(const float *x, float *y, int64_t outer, int64_t axis, int64_t inner, int64_t start, int64_t len);
void kc_put_grad(const float *dy, float *dx, int64_t outer, int64_t axis, int64_t inner, int64_t start, int64_t len, int acc);
void kc_view(const float *x, float *y, const ViewShape *s);
void kc_view_grad(const float *dy, float *dx, const ViewShape *s, int acc);
void kc_cast_i64_f32(const int64_t *x, float *y, int64_t n);
void kc_cast_f32_i64(const float *x, int64_t *y, int64_t n);
void kc_cast_i32_f32(const void *x, float *y, int64_t n);
void kc_cast_bool_f32(const void *x, float *y, int64_t n);
void kc_cast_f16_f32(const void *x, float *y, int64_t n);
/* An index outside [-rows, rows) stops the run naming node at the device layer's next wait (common.cuh, PrCuFault). */
void kc_gather(const float *table, const int64_t *idx, float *y, int64_t n, int64_t rows, int64_t width, const char *node);
void kc_gather_grad(const int64_t *idx, const float *dy, float *dtable, int64_t n, int64_t rows, int64_t width, const char *node);
#endif
