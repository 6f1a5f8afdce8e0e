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

/* ---- pipecc --zero 1: one replica's shard (runtime/replica.c) ----
 *
 * Of a weight whose gradient g lies in the region from o->grad_base, the elements in [shard_lo, shard_hi):
 * updated by the same rule as the whole tensor's (elementwise, the same bits), the state read at their place
 * in the shard's state (m, v: shard_hi - shard_lo floats at most), and the new weights written over the
 * gradient, which is spent, for the other replicas to fetch from there. */
static inline int64_t shard_span(const float *g, int64_t n, const OptCtx *o, int64_t *lo, int64_t *hi) {
  int64_t at = g - o->grad_base;
  *lo = o->shard_lo > at ? o->shard_lo - at : 0;
  *hi = o->shard_hi - at < n ? o->shard_hi - at : n;
  return at + *lo - o->shard_lo; /* the span's first element's place in the shard's state */
}

static inline void k_sgd_shard(float *p, float *g, float *m, int64_t n, const OptCtx *o) {
  int64_t lo, hi, s = shard_span(g, n, o, &lo, &hi);
  if (lo >= hi) return;
  k_sgd(p + lo, g + lo, m ? m + s : NULL, hi - lo, o->lr, o->momentum, o->weight_decay, o->step == 0);
  memcpy(g + lo, p + lo, sizeof(float) * (size_t)(hi - lo));
}

static inline void k_adam_shard(float *p, float *g, float *m, float *v, int64_t n, int decoupled, const OptCtx *o) {
  int64_t lo, hi, s = shard_span(g, n, o, &lo, &hi);
  if (lo >= hi) return;
  k_adam(p + lo, g + lo, m + s, v + s, hi - lo, o->lr, o->beta1, o->beta2, o->eps, o->weight_decay, decoupled, o->step + 1);
  memcpy(g + lo, p + lo, sizeof(float) * (size_t)(hi - lo));
}

/* ---- the state (and gradients) streamed from the stage's file (pipecc --offload-optimizer; runtime/optstore.c) ----
 *
 * The weight is updated a block of `block` floats at a time, its state (and, gf >= 0, its gradient)
 * read into one of two staging blocks while the other is updated, and the state written back after:
 * the same elementwise rule on the same numbers as k_sgd_step / k_adam_step (blocks start at multiples
 * of 64 floats, so every vector lane sees what it sees in the whole-tensor loop).  `stage` holds per
 * slot [m | v | g], each `block` floats, as the weight has them; m1, m2, gf are byte offsets in the file
 * (-1: none; g then in the arena).  id: the weight's row of PARAMS (a gradient read from the file is
 * checked to be finite there, naming it). */
void pr_optstore_read(int slot, float *dst, int64_t off, int64_t n);
void pr_optstore_write(int slot, const float *src, int64_t off, int64_t n);
void pr_optstore_wait(int slot);
void pr_optstore_check(int id, const float *g, int64_t n, int64_t at);

static inline int64_t opt_block_len(int64_t b, int64_t n, int64_t block) { return n - b * block < block ? n - b * block : block; }

/* Reads block b's state and gradient into slot k's staging (each part as present). */
static inline void opt_block_read(float *stage, int parts, int k, int64_t b, int64_t n, int64_t block, const int64_t *off) {
  int64_t len = opt_block_len(b, n, block);
  for (int q = 0; q < parts; q++)
    if (off[q] >= 0) pr_optstore_read(k, stage + ((int64_t)k * parts + q) * block, off[q] + 4 * b * block, len);
}

static inline void k_sgd_stream(float *p, const float *g, float *stage, int id, int64_t m1, int64_t gf, int64_t n, int64_t block,
                                const OptCtx *o) {
  int64_t nb = (n + block - 1) / block, off[2] = {m1, gf};
  opt_block_read(stage, 2, 0, 0, n, block, off);
  for (int64_t b = 0; b < nb; b++) {
    int k = (int)(b & 1);
    float *buf = stage + 2 * k * block, *gb = buf + block;
    int64_t at = b * block, len = opt_block_len(b, n, block);
    if (b + 1 < nb) opt_block_read(stage, 2, k ^ 1, b + 1, n, block, off);
    pr_optstore_wait(k);
    if (gf >= 0) pr_optstore_check(id, gb, len, at);
    k_sgd(p + at, gf >= 0 ? gb : g + at, m1 >= 0 ? buf : NULL, len, o->lr, o->momentum, o->weight_decay, o->step == 0);
    if (m1 >= 0) pr_optstore_write(k, buf, m1 + 4 * at, len);
  }
}

static inline void k_adam_stream(float *p, const float *g, float *stage, int id, int64_t m1, int64_t m2, int64_t gf, int64_t n, int decoupled,
                                 int64_t block, const OptCtx *o) {
  int64_t nb = (n + block - 1) / block, off[3] = {m1, m2, gf};
  opt_block_read(stage, 3, 0, 0, n, block, off);
  for (int64_t b = 0; b < nb; b++) {
    int k = (int)(b & 1);
    float *m = stage + 3 * k * block, *v = m + block, *gb = v + block;
    int64_t at = b * block, len = opt_block_len(b, n, block);
    if (b + 1 < nb) opt_block_read(stage, 3, k ^ 1, b + 1, n, block, off);
    pr_optstore_wait(k);
    if (gf >= 0) pr_optstore_check(id, gb, len, at);
    k_adam(p + at, gf >= 0 ? gb : g + at, m, v, len, o->lr, o->beta1, o->beta2, o->eps, o->weight_decay, decoupled, o->step + 1);
    pr_optstore_write(k, m, m1 + 4 * at, len);
    pr_optstore_write(k, v, m2 + 4 * at, len);
  }
}

/* The backward's stored gradients (slot 0 or 1 of two staging copies): brought in before the call that
 * adds into one (zeros at a step's first backward: the runtime marks them fresh where the arena's are
 * zeroed), and written back after it. */
void k_grad_fetch(float *stage, int slot, int id, int64_t off, int64_t n);
void k_grad_wait(const float *stage, int slot);
void k_grad_put(const float *stage, int slot, int64_t off, int64_t n);
/* --replicas (runtime/replica.c): bucket `bucket` of the weight gradients is final in this backward; in the
 * step's last one (after a REDUCE) its sum over the replicas starts. */
void k_grad_ready(int bucket);
#endif
