/* cpu/dropout.h - Dropout and its counter-based generator (Philox).
 * Part of the CPU kernels; runtime/kernels.h includes every family (the conventions are there). */
#ifndef PIPERUN_CPU_DROPOUT_H
#define PIPERUN_CPU_DROPOUT_H
#include "common.h"
/* ---- Dropout: masks from a counter-based generator ----
 *
 * Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as
 * easy as 1, 2, 3", SC 2011; Random123's reference): a keyed bijection of a
 * 128-bit counter, so any element's random number is computed from where it
 * is - no stream state to carry between actions, ranks or micro-batches.
 * Element e of Dropout node `node` (its index in the ONNX graph, fixed at
 * compile time) in step `step` reads lane e % 4 of
 *   philox(counter = {e / 4 (64 bits), node, step}, key = the run's --seed),
 * where e = mb * n + i counts across the step's micro-batches (so a
 * batch-major tensor gets the same mask for any --microbatches too).  Where a
 * micro-batch runs (-n, schedule, rank) does not enter: masks are identical.
 * PyTorch's own stream is not reproduced (README.md says why). */

/* Ten rounds of Philox4x32 on ctr, in place (Random123's philox4x32_R(10, ...)). */
static inline void k_philox4x32_10(uint32_t ctr[4], uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 10; r++) {
    if (r) k0 += 0x9E3779B9u, k1 += 0xBB67AE85u; /* the key schedule: bumped before rounds 2..10 */
    uint64_t p0 = (uint64_t)0xD2511F53u * ctr[0], p1 = (uint64_t)0xCD9E8D57u * ctr[2];
    uint32_t c1 = ctr[1], c3 = ctr[3];
    ctr[0] = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
    ctr[1] = (uint32_t)p1;
    ctr[2] = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    ctr[3] = (uint32_t)p0;
  }
}

/* An element is kept when its 32-bit draw is at least ratio * 2^32: P(keep) = 1 - ratio. */
static inline uint64_t k_dropout_threshold(float ratio) {
  return ratio >= 1 ? (uint64_t)1 << 32 : ratio <= 0 ? 0 : (uint64_t)((double)ratio * 4294967296.0);
}
/* PyTorch's CPU dropout multiplies by a noise tensor holding 1 / (1 - p) computed in float. */
static inline float k_dropout_scale(float ratio) { return ratio >= 1 ? 0.0f : 1.0f / (float)(1.0 - (double)ratio); }

/* The factors of the step's elements 4 * block .. 4 * block + 3: scale where kept, 0 where dropped. */
static inline void k_dropout_block(const RandCtx *rc, int64_t node, uint64_t block, uint64_t thr, float scale, float f[4]) {
  uint32_t c[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)node, (uint32_t)rc->step};
  k_philox4x32_10(c, (uint32_t)rc->seed, (uint32_t)(rc->seed >> 32));
  for (int l = 0; l < 4; l++) f[l] = c[l] >= thr ? scale : 0.0f;
}

/* y = x * mask * 1/(1 - ratio) over one micro-batch's n values (mask: NULL, or the kept flags as bytes).
 * A dropped element is x * 0, not 0, as PyTorch's x * noise (NaN stays NaN). */
static inline void k_dropout(const float *x, float *y, uint8_t *mask, int64_t n, float ratio, int64_t node, const RandCtx *rc) {
  uint64_t thr = k_dropout_threshold(ratio);
  float scale = k_dropout_scale(ratio), f[4] = {scale, scale, scale, scale};
  uint64_t e0 = (uint64_t)(rc->mb * n);
  for (int64_t i = 0; i < n; i++) {
    uint64_t e = e0 + (uint64_t)i;
    if (thr && (i == 0 || e % 4 == 0)) k_dropout_block(rc, node, e / 4, thr, scale, f); /* ratio 0 keeps all: no draws */
    y[i] = x[i] * f[e % 4];
    if (mask) mask[i] = f[e % 4] != 0;
  }
}

/* dx = dy * mask * 1/(1 - ratio).  The mask is drawn again rather than kept:
 * a stashed byte mask costs n bytes per micro-batch in flight on every
 * Dropout (1F1B keeps up to n_stages micro-batches, GPipe all of them), while
 * a redraw is one Philox call per 4 elements, small beside the matrix
 * products around a Dropout, and needs no memory at all. */
static inline void k_dropout_grad(const float *dy, float *dx, int64_t n, float ratio, int64_t node, const RandCtx *rc, int acc) {
  uint64_t thr = k_dropout_threshold(ratio);
  float scale = k_dropout_scale(ratio), f[4] = {scale, scale, scale, scale};
  uint64_t e0 = (uint64_t)(rc->mb * n);
  for (int64_t i = 0; i < n; i++) {
    uint64_t e = e0 + (uint64_t)i;
    if (thr && (i == 0 || e % 4 == 0)) k_dropout_block(rc, node, e / 4, thr, scale, f);
    float g = dy[i] * f[e % 4];
    dx[i] = acc ? dx[i] + g : g;
  }
}
#endif
