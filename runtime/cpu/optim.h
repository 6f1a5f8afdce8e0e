/* cpu/optim.h - the optimizers' updates: SGD, Adam(W).
 * Part of the CPU kernels; runtime/kernels.h includes every family (the conventions are there). */
#ifndef PIPERUN_CPU_OPTIM_H
#define PIPERUN_CPU_OPTIM_H
#include "common.h"
/* ---- optimizers (PyTorch's update rules, step by step) ---- */
/* The flags are tested once per call, not per element, so each loop vectorises; every element gets the
 * same expressions as in one loop with the tests inside. */
static inline void k_sgd(float *p, const float *g, float *buf, int64_t n, float lr, float momentum, float wd, int first) {
  if (wd == 0 && momentum == 0) {
    for (int64_t i = 0; i < n; i++) p[i] = p[i] + (-lr) * g[i];
    return;
  }
  if (momentum == 0) {
    for (int64_t i = 0; i < n; i++) {
      float d = g[i];
      d = d + wd * p[i];
      p[i] = p[i] + (-lr) * d;
    }
    return;
  }
  for (int64_t i = 0; i < n; i++) {
    float d = g[i];
    if (wd != 0) d = d + wd * p[i];
    buf[i] = first ? d : buf[i] * momentum + d;
    d = buf[i];
    p[i] = p[i] + (-lr) * d;
  }
}

/* Adam (decoupled = 0) and AdamW (decoupled = 1); step counts from 1. */
static inline void k_adam(float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1, float beta2, float eps,
                          float wd, int decoupled, int64_t step) {
  double bc1 = 1 - pow(beta1, (double)step), bc2 = 1 - pow(beta2, (double)step);
  float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
  for (int64_t i = 0; i < n; i++) {
    float grad = g[i];
    if (decoupled) p[i] = p[i] * (1 - lr * wd);
    else if (wd != 0) grad = grad + wd * p[i];
    m[i] = m[i] * beta1 + grad * (1 - beta1);
    v[i] = v[i] * beta2 + grad * grad * (1 - beta2);
    float denom = sqrtf(v[i]) / bc2_sqrt + eps;
    p[i] = p[i] + (-step_size) * (m[i] / denom);
  }
}

/* One weight's update, as the stage program's update() calls it. */
static inline void k_sgd_step(float *p, const float *g, float *buf, int64_t n, const OptCtx *o) {
  k_sgd(p, g, buf, n, o->lr, o->momentum, o->weight_decay, o->step == 0);
}
static inline void k_adam_step(float *p, const float *g, float *m, float *v, int64_t n, int decoupled, const OptCtx *o) {
  k_adam(p, g, m, v, n, o->lr, o->beta1, o->beta2, o->eps, o->weight_decay, decoupled, o->step + 1);
}
#endif
