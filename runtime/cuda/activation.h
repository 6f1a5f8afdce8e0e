/* cuda/activation.h - element-wise activations and unary maths on the GPU: Relu, Tanh, Sigmoid, Erf, Sqrt,
 * Gelu, LeakyRelu, kc_unary (Neg, Exp, Log, Abs, Reciprocal, Clip, HardSigmoid, HardSwish) and their
 * gradients.  The same arguments as cpu/activation.h's k_* kernels, every buffer in device memory. */
#ifndef PIPERUN_CUDA_ACTIVATION_H
#define PIPERUN_CUDA_ACTIVATION_H

void kc_relu(const float *x, float *y, int64_t n);
void kc_relu_grad(const float *y, const float *dy, float *dx, int64_t n, int acc);
void kc_tanh(const float *x, float *y, int64_t n);
void kc_tanh_grad(const float *y, const float *dy, float *dx, int64_t n, int acc);
void kc_sigmoid(const float *x, float *y, int64_t n);
void kc_sigmoid_grad(const float *y, const float *dy, float *dx, int64_t n, int acc);
void kc_erf(const float *x, float *y, int64_t n);
void kc_erf_grad(const float *x, const float *dy, float *dx, int64_t n, int acc);
void kc_sqrt(const float *x, float *y, int64_t n);
void kc_sqrt_grad(const float *y, const float *dy, float *dx, int64_t n, int acc);
/* tanh_approx: 0 the erf form, 1 the tanh form (ONNX Gelu's approximate="tanh"). */
void kc_gelu(const float *x, float *y, int64_t n, int tanh_approx);
void kc_gelu_grad(const float *x, const float *dy, float *dx, int64_t n, int tanh_approx, int acc);
void kc_leakyrelu(const float *x, float *y, int64_t n, float alpha);
void kc_leakyrelu_grad(const float *x, const float *dy, float *dx, int64_t n, float alpha, int acc);
/* op: UN_* (opcodes.def); a, b: Clip's bounds or HardSigmoid's alpha, beta.  The gradient reads x or y
 * (either may be NULL where its op does not need it, as on the CPU). */
void kc_unary(int op, const float *x, float *y, int64_t n, float a, float b);
void kc_unary_grad(int op, const float *x, const float *y, const float *dy, float *dx, int64_t n, float a, float b, int acc);
#endif
