/* kcheck.h - what the GPU kernel checks share (tests/gpu/kernels.c, one k_<family>.c per kernel family):
 * random inputs, copies to and from the GPU, the error measure and the report.
 *
 * Each check runs a CPU kernel (runtime/kernels.h, k_*) and its GPU kernel (runtime/cuda/kernels.h,
 * kc_*) on the same random inputs and reports the relative error of the GPU's result:
 *   max_i |gpu_i - cpu_i| / max(max_i |cpu_i|, 1e-30)
 * (the largest difference against the result's scale, so an element near zero does not dominate), and,
 * for results that must match exactly (masks, indices, copies), whether every bit is the same
 * (kc_report_exact).  The bar is 1e-5 (fp32, TF32 off). */
#ifndef KCHECK_H
#define KCHECK_H
#include <stdint.h>

#define KC_TOL 1e-5

/* Host arrays of n floats, uniform in [lo, hi), from a fixed seed (the same run after run). */
float *kc_rand(int64_t n, float lo, float hi);
float *kc_zeros(int64_t n);
/* Device copies: of n floats (or bytes) from the host, back to the host; a device array of n zeros. */
float *kc_up(const float *h, int64_t n);
void *kc_up_bytes(const void *h, int64_t bytes);
float *kc_dev_zeros(int64_t n);
void kc_down(float *h, const float *d, int64_t n);
void kc_down_bytes(void *h, const void *d, int64_t bytes);
void kc_free(void *d);
/* The GPU's result (device, n floats) against the CPU's (host): the relative error above. */
double kc_err(const float *dev, const float *cpu, int64_t n);
/* Records one case of `kernel` (its k_ name) on `shape` (a few words): the error, or (exact) whether the
 * bits were the same (err 0 when they were, 1 when not).  Prints one line per case. */
void kc_report(const char *kernel, const char *shape, double err);
void kc_report_exact(const char *kernel, const char *shape, const void *dev, const void *cpu, int64_t bytes);
/* kc_report_exact for n floats, where a NaN matches any NaN: a GPU's arithmetic makes the canonical NaN
 * (0x7fffffff) where the CPU's keeps its operand's payload; the value is the same, only the payload differs. */
void kc_report_same_floats(const char *kernel, const char *shape, const float *dev, const float *cpu, int64_t n);

/* One per family, each in its own file (k_<family>.c): checks every kernel of the family on several
 * shapes, odd sizes and broadcasting among them. */
void check_gemm(void);
void check_conv(void);
void check_pool(void);
void check_activation(void);
void check_binary(void);
void check_movement(void);
void check_reduce(void);
void check_norm(void);
void check_loss(void);
void check_dropout(void);
void check_optim(void);
void check_rnn(void);
#endif
