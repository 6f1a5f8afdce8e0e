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

/* ---- the state streamed from its file (pipecc --offload-optimizer; runtime/optstore.c) ----
 *
 * The weight is updated a block of `block` floats at a time, its state read into one of two staging
 * blocks while the other is updated, and written back after: the same elementwise rule on the same
 * numbers as k_sgd_step / k_adam_step (blocks start at multiples of 64 floats, so every vector lane
 * sees what it sees in the whole-tensor loop).  `stage` holds both blocks of each state: [m | v] per
 * block; the state's places in the file are byte offsets m1, m2. */
void pr_optstore_read(int slot, float *dst, int64_t off, int64_t n);
void pr_optstore_write(int slot, const float *src, int64_t off, int64_t n);
void pr_optstore_wait(int slot);

static inline int64_t opt_block_len(int64_t b, int64_t n, int64_t block) { return n - b * block < block ? n - b * block : block; }

static inline void k_sgd_stream(float *p, const float *g, float *stage, int64_t m1, int64_t n, int64_t block, const OptCtx *o) {
  int64_t nb = (n + block - 1) / block;
  pr_optstore_read(0, stage, m1, opt_block_len(0, n, block));
  for (int64_t b = 0; b < nb; b++) {
    int k = (int)(b & 1);
    float *buf = stage + k * block;
    int64_t at = b * block, len = opt_block_len(b, n, block);
    if (b + 1 < nb) pr_optstore_read(k ^ 1, stage + (k ^ 1) * block, m1 + 4 * (at + block), opt_block_len(b + 1, n, block));
    pr_optstore_wait(k);
    k_sgd(p + at, g + at, buf, len, o->lr, o->momentum, o->weight_decay, o->step == 0);
    pr_optstore_write(k, buf, m1 + 4 * at, len);
  }
}

static inline void k_adam_stream(float *p, const float *g, float *stage, int64_t m1, int64_t m2, int64_t n, int decoupled, int64_t block,
                                 const OptCtx *o) {
  int64_t nb = (n + block - 1) / block;
  pr_optstore_read(0, stage, m1, opt_block_len(0, n, block));
  pr_optstore_read(0, stage + block, m2, opt_block_len(0, n, block));
  for (int64_t b = 0; b < nb; b++) {
    int k = (int)(b & 1);
    float *m = stage + 2 * k * block, *v = m + block;
    int64_t at = b * block, len = opt_block_len(b, n, block);
    if (b + 1 < nb) {
      float *m_next = stage + 2 * (k ^ 1) * block;
      pr_optstore_read(k ^ 1, m_next, m1 + 4 * (at + block), opt_block_len(b + 1, n, block));
      pr_optstore_read(k ^ 1, m_next + block, m2 + 4 * (at + block), opt_block_len(b + 1, n, block));
    }
    pr_optstore_wait(k);
    k_adam(p + at, g + at, m, v, len, o->lr, o->beta1, o->beta2, o->eps, o->weight_decay, decoupled, o->step + 1);
    pr_optstore_write(k, m, m1 + 4 * at, len);
    pr_optstore_write(k, v, m2 + 4 * at, len);
  }
}
#endif
