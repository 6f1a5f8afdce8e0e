/* cuda/dropout.cu - Dropout on the GPU: the masks of cpu/dropout.h bit for bit.  Element e = mb * n + i of
 * Dropout node `node` in step `step` reads lane e % 4 of Philox4x32-10(counter = {e / 4 (64 bits), node,
 * step}, key = seed) (cpu/dropout.h says why), so one thread per counter block: it draws the block once
 * and writes the (up to) four elements of the micro-batch that fall in it.  The products are single
 * IEEE multiplies and adds (no fused multiply-add), so y, dx and the mask are the CPU's bits.  x and y (dy
 * and dx) may be the same buffer: each element is read and written by one thread. */
#include "common.cuh"
#include "kernels.h"

/* A product and a sum rounded each on its own, as the CPU's. */
#ifdef __CUDA_ARCH__
#define D_MUL(a, b) __fmul_rn((a), (b))
#define D_ADD(a, b) __fadd_rn((a), (b))
#else
#define D_MUL(a, b) ((a) * (b))
#define D_ADD(a, b) ((a) + (b))
#endif

namespace {

/* Ten rounds of Philox4x32 on ctr, in place: cpu/dropout.h's k_philox4x32_10, line for line. */
__host__ __device__ __forceinline__ void philox4x32_10(uint32_t ctr[4], uint32_t k0, uint32_t k1) {
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

/* What a call's threads share, made on the host from the RandCtx as the CPU kernel makes it. */
struct Drop {
  uint32_t k0, k1;   /* the key: the seed's low and high words */
  uint32_t node;     /* the counter's third word: the node's low 32 bits */
  uint32_t step;     /* the fourth: the step's low 32 bits */
  uint64_t e0;       /* the micro-batch's first element in the step: (uint64_t)(mb * n) */
  uint64_t thr;      /* kept when the draw >= thr; 0: keep all, no draws */
  float scale;       /* 1 / (1 - ratio) in float, 0 when ratio >= 1 */
};

/* cpu/dropout.h's k_dropout_threshold and k_dropout_scale. */
Drop drop_make(int64_t n, float ratio, int64_t node, const RandCtx *rc) {
  Drop d;
  d.k0 = (uint32_t)rc->seed, d.k1 = (uint32_t)(rc->seed >> 32);
  d.node = (uint32_t)node, d.step = (uint32_t)rc->step;
  d.e0 = (uint64_t)(rc->mb * n);
  d.thr = ratio >= 1 ? (uint64_t)1 << 32 : ratio <= 0 ? 0 : (uint64_t)((double)ratio * 4294967296.0);
  d.scale = ratio >= 1 ? 0.0f : 1.0f / (float)(1.0 - (double)ratio);
  return d;
}

/* The factors of the step's elements 4 * block .. 4 * block + 3: scale where kept, 0 where dropped. */
__host__ __device__ __forceinline__ void drop_factors(const Drop &d, uint64_t block, float f[4]) {
  if (!d.thr) { /* ratio 0 keeps all: no draws, as the CPU */
    f[0] = f[1] = f[2] = f[3] = d.scale;
    return;
  }
  uint32_t c[4] = {(uint32_t)block, (uint32_t)(block >> 32), d.node, d.step};
  philox4x32_10(c, d.k0, d.k1);
  for (int l = 0; l < 4; l++) f[l] = c[l] >= d.thr ? d.scale : 0.0f;
}

/* Counter block b0 + t of the micro-batch: fn(i, its factor) for its elements i in [0, n), at most four. */
template <typename F> __host__ __device__ __forceinline__ void drop_each(const Drop &d, int64_t t, int64_t n, F fn) {
  uint64_t block = d.e0 / 4 + (uint64_t)t;
  float f[4];
  drop_factors(d, block, f);
  for (int l = 0; l < 4; l++) {
    uint64_t e = block * 4 + (uint64_t)l;
    if (e < d.e0) continue;
    int64_t i = (int64_t)(e - d.e0);
    if (i >= n) break;
    fn(i, f[l]);
  }
}
__host__ __device__ __forceinline__ void drop_block(const Drop &d, int64_t t, const float *x, float *y, uint8_t *mask, int64_t n) {
  drop_each(d, t, n, [&](int64_t i, float f) {
    y[i] = D_MUL(x[i], f);
    if (mask) mask[i] = f != 0;
  });
}
__host__ __device__ __forceinline__ void drop_grad_block(const Drop &d, int64_t t, const float *dy, float *dx, int64_t n, int acc) {
  drop_each(d, t, n, [&](int64_t i, float f) {
    float g = D_MUL(dy[i], f);
    dx[i] = acc ? D_ADD(dx[i], g) : g;
  });
}
/* The counter blocks the micro-batch's n elements touch. */
__host__ __device__ __forceinline__ int64_t drop_nblocks(const Drop &d, int64_t n) {
  return (int64_t)((d.e0 + (uint64_t)n - 1) / 4 - d.e0 / 4 + 1);
}

__global__ void dropout_kernel(const float *x, float *y, uint8_t *mask, int64_t n, int64_t nblocks, Drop d) {
  PR_CU_FOR(t, nblocks) drop_block(d, t, x, y, mask, n);
}
__global__ void dropout_grad_kernel(const float *dy, float *dx, int64_t n, int64_t nblocks, Drop d, int acc) {
  PR_CU_FOR(t, nblocks) drop_grad_block(d, t, dy, dx, n, acc);
}

} // namespace

extern "C" void kc_dropout(const float *x, float *y, uint8_t *mask, int64_t n, float ratio, int64_t node, const RandCtx *rc) {
  if (n <= 0) return;
  Drop d = drop_make(n, ratio, node, rc);
  int64_t nb = drop_nblocks(d, n);
  dropout_kernel<<<pr_cu_blocks(nb, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(x, y, mask, n, nb, d);
  PR_CU_LAUNCHED();
}

extern "C" void kc_dropout_grad(const float *dy, float *dx, int64_t n, float ratio, int64_t node, const RandCtx *rc, int acc) {
  if (n <= 0) return;
  Drop d = drop_make(n, ratio, node, rc);
  int64_t nb = drop_nblocks(d, n);
  dropout_grad_kernel<<<pr_cu_blocks(nb, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(dy, dx, n, nb, d, acc);
  PR_CU_LAUNCHED();
}
