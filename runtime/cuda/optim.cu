/* cuda/optim.cu - the optimizers' updates on the GPU: SGD (momentum, weight decay), Adam and AdamW.  One
 * grid-stride loop over the weight's elements; each element gets cpu/optim.h's expressions in the same
 * order, every product, sum, quotient and square root rounded on its own (IEEE, never a fused
 * multiply-add), and Adam's bias corrections computed on the host in double exactly as the CPU computes
 * them, so the weights and the optimizer's slots are the CPU's bits.  The hyper-parameters are copied
 * from the host's OptCtx into the launch. */
#include <math.h>

#include "common.cuh"
#include "kernels.h"

/* Each operation rounded on its own, as the CPU's. */
#ifdef __CUDA_ARCH__
#define O_MUL(a, b) __fmul_rn((a), (b))
#define O_ADD(a, b) __fadd_rn((a), (b))
#define O_SUB(a, b) __fsub_rn((a), (b))
#define O_DIV(a, b) __fdiv_rn((a), (b))
#define O_SQRT(a) __fsqrt_rn(a)
#else
#define O_MUL(a, b) ((a) * (b))
#define O_ADD(a, b) ((a) + (b))
#define O_SUB(a, b) ((a) - (b))
#define O_DIV(a, b) ((a) / (b))
#define O_SQRT(a) sqrtf(a)
#endif

namespace {

struct Sgd {
  float lr, momentum, wd;
  int first; /* the first step: the momentum buffer starts at the gradient */
};
/* cpu/optim.h's k_sgd: its three loops are one here, the tests taken per element (the same expressions:
 * no momentum and no weight decay is p + (-lr) g; weight decay is added only when it is not 0). */
__host__ __device__ __forceinline__ void sgd_elem(const Sgd &s, float *p, const float *g, float *buf, int64_t i) {
  float d = g[i];
  if (s.wd != 0) d = O_ADD(d, O_MUL(s.wd, p[i]));
  if (s.momentum != 0) {
    float b = s.first ? d : O_ADD(O_MUL(buf[i], s.momentum), d);
    buf[i] = b;
    d = b;
  }
  p[i] = O_ADD(p[i], O_MUL(-s.lr, d));
}
__global__ void sgd_kernel(float *__restrict__ p, const float *__restrict__ g, float *__restrict__ buf, int64_t n, Sgd s) {
  PR_CU_FOR(i, n) sgd_elem(s, p, g, buf, i);
}

struct Adam {
  float lr, beta1, beta2, eps, wd;
  float step_size, bc2_sqrt; /* (float)(lr / bc1), (float)sqrt(bc2), bc1 and bc2 in double on the host */
  int decoupled;
};
/* cpu/optim.h's k_adam, element i. */
__host__ __device__ __forceinline__ void adam_elem(const Adam &a, float *p, const float *g, float *m, float *v, int64_t i) {
  float grad = g[i];
  if (a.decoupled) p[i] = O_MUL(p[i], O_SUB(1.0f, O_MUL(a.lr, a.wd)));
  else if (a.wd != 0) grad = O_ADD(grad, O_MUL(a.wd, p[i]));
  float mi = O_ADD(O_MUL(m[i], a.beta1), O_MUL(grad, O_SUB(1.0f, a.beta1)));
  float vi = O_ADD(O_MUL(v[i], a.beta2), O_MUL(O_MUL(grad, grad), O_SUB(1.0f, a.beta2)));
  m[i] = mi;
  v[i] = vi;
  float denom = O_ADD(O_DIV(O_SQRT(vi), a.bc2_sqrt), a.eps);
  p[i] = O_ADD(p[i], O_MUL(-a.step_size, O_DIV(mi, denom)));
}
__global__ void adam_kernel(float *__restrict__ p, const float *__restrict__ g, float *__restrict__ m, float *__restrict__ v,
                            int64_t n, Adam a) {
  PR_CU_FOR(i, n) adam_elem(a, p, g, m, v, i);
}

/* The host's half of cpu/optim.h's k_adam_step / k_adam: step counts from 1; pow and sqrt in double. */
Adam adam_make(const OptCtx *o, int decoupled) {
  Adam a;
  a.lr = o->lr, a.beta1 = o->beta1, a.beta2 = o->beta2, a.eps = o->eps, a.wd = o->weight_decay;
  a.decoupled = decoupled;
  int64_t step = o->step + 1;
  double bc1 = 1 - pow((double)a.beta1, (double)step), bc2 = 1 - pow((double)a.beta2, (double)step);
  a.step_size = (float)((double)a.lr / bc1);
  a.bc2_sqrt = (float)sqrt(bc2);
  return a;
}

} // namespace

extern "C" void kc_sgd_step(float *p, const float *g, float *buf, int64_t n, const OptCtx *o) {
  if (n <= 0) return;
  Sgd s = {o->lr, o->momentum, o->weight_decay, o->step == 0};
  sgd_kernel<<<pr_cu_blocks(n, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(p, g, buf, n, s);
  PR_CU_LAUNCHED();
}

extern "C" void kc_adam_step(float *p, const float *g, float *m, float *v, int64_t n, int decoupled, const OptCtx *o) {
  if (n <= 0) return;
  Adam a = adam_make(o, decoupled);
  adam_kernel<<<pr_cu_blocks(n, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(p, g, m, v, n, a);
  PR_CU_LAUNCHED();
}
